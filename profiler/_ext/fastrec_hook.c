/*
 * fastrec_hook.c -- profiler._fastrec.Hook: the tensor hook of
 * profiler.collect.tensors in C (fastrec.c says what it is and why), and the
 * table of the tensors it handed to Horovod that are still pending
 * (oldest_pending).
 */
#include "fastrec.h"
#include <structmember.h>

/* ------------------------------------------------------------------------ */
/* The tensors handed to Horovod and not yet handed back, for the hang
 * watchdog (tensors.py oldest_pending): slot = handle mod PENDING_SLOTS, the
 * handle's value, its name and when it was enqueued.  Horovod's handles
 * count up, so a slot is taken again only PENDING_SLOTS tensors later; a
 * tensor still pending after that many more were enqueued is forgotten.  No
 * allocation, no pruning: a handle Horovod handed back is found out (not in
 * its handle map) when the table is read.  Handles that are no int are not
 * kept; the value, not the int object, is kept (no object freed here). */

#define PENDING_SLOTS 8192
typedef struct {
    long long handle;
    PyObject *name;   /* NULL: free */
    uint64_t t;       /* the library's clock (ticks) at the enqueue: the record's t_start */
} pending_slot;
static pending_slot pending[PENDING_SLOTS];

static void pending_put(PyObject *handle, PyObject *name, uint64_t t)
{
    if (!PyLong_CheckExact(handle)) return;
    long long v = PyLong_AsLongLong(handle);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return;
    }
    pending_slot *s = &pending[(unsigned long long)v % PENDING_SLOTS];
    PyObject *old_n = s->name;
    s->handle = v;
    s->name = Py_NewRef(name);
    s->t = t;
    Py_XDECREF(old_n);
}

/* oldest_pending(live) -> (seconds, name) of the oldest kept handle that is
 * still in `live` (Horovod's handle map), or None; the others are dropped. */
PyObject *fr_oldest_pending(PyObject *self, PyObject *live)
{
    (void)self;
    double tpn = resolve() ? ticks_per_ns_p() : 0.0, age = -1.0;
    uint64_t now = resolve() ? now_p() : 0;
    PyObject *name = NULL;
    for (size_t i = 0; i < PENDING_SLOTS; i++) {
        pending_slot *s = &pending[i];
        if (!s->name) continue;
        PyObject *h = PyLong_FromLongLong(s->handle);
        int in = h ? PySequence_Contains(live, h) : -1;
        Py_XDECREF(h);
        if (in < 0) return NULL;
        if (!in) {
            PyObject *n = s->name;
            s->name = NULL;
            Py_DECREF(n);
        } else {
            double a = now > s->t && tpn > 0 ? (double)(now - s->t) / tpn * 1e-9 : 0.0;
            if (a > age) {
                age = a;
                name = s->name;
            }
        }
    }
    if (!name) Py_RETURN_NONE;
    return Py_BuildValue("(dO)", age, name);
}

/* ------------------------------------------------------------------------ */
/* Hook                                                                      */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig;       /* Horovod's function */
    PyObject *fname;      /* its name, for the warning */
    PyObject *prefix;     /* Horovod's operation prefix ("allreduce") */
    PyObject *tensor_key; /* "tensor" or "tensors" */
    PyObject *out_key;    /* "output" or "outputs" */
    struct name_slot *names; /* each name's base and id, by the name object's address */
    PyObject *op_obj;     /* the last reduction op given (an int), and its code */
    uint32_t op_redop;
    unsigned op_gen;
    int grouped;
    Py_ssize_t out_i, root_i, op_i, name_i, ps_i; /* positions, -1: not an argument */
} HookObject;

/* A name's base ("<prefix>.<name>") and id, found by the address of the
 * name object Horovod's caller passes (the DistributedOptimizer passes the
 * same str each step): one cold line a tensor, the base formatted once.
 * Open addressing over NAME_PROBES neighbouring slots (a model of a hundred
 * tensors in a direct-mapped table of 512 had names evicting each other every
 * step, each formatted and looked up again); past them the first slot is
 * taken over.  A slot holds its name, so an address is never mistaken for a
 * freed object's.  Only exact, non-empty str names; id -1: not known yet (a
 * grouped entry point's base has none: its tensors' names do). */
#define NAME_SLOTS 2048
#define NAME_PROBES 4
typedef struct name_slot {
    PyObject *name, *base; /* NULL: empty */
    long id;
    unsigned gen;          /* g_gen when filled */
} name_slot;

/* The slot holding `name` (this generation's), else the one to fill: an empty
 * or stale one among the probes, else the first. */
static inline name_slot *name_slot_of(HookObject *h, PyObject *name)
{
    uintptr_t a = (uintptr_t)name;
    uint32_t i0 = (uint32_t)(((a >> 4) ^ (a >> 15)) & (NAME_SLOTS - 1));
    name_slot *free_ = NULL;
    for (uint32_t k = 0; k < NAME_PROBES; k++) {
        name_slot *s = &h->names[(i0 + k) & (NAME_SLOTS - 1)];
        if (s->name == name && s->gen == g_gen) return s;
        if (!free_ && (!s->name || s->gen != g_gen)) free_ = s;
        if (!s->name) break;
    }
    return free_ ? free_ : &h->names[i0];
}

/* The argument at position i or keyword key (borrowed), NULL when absent. */
static PyObject *arg_at(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t i,
                     PyObject *key)
{
    if (i >= 0 && i < nargs) return args[i];
    if (kwnames && key) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
            if (kw == key || PyUnicode_Compare(kw, key) == 0) return args[nargs + k];
        }
    }
    return NULL;
}

/* int(obj.method()) as a C integer (-1 with an exception set on failure). */
static long long call_int(PyObject *obj, PyObject *method)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, method);
    if (!r) return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* The name's id (tensors.py _name_id): -1 with an exception set on failure. */
static long name_id(PyObject *name)
{
    long id;
    PyObject *id_o = PyDict_GetItemWithError(g_ids, name); /* borrowed */
    if (id_o) {
        id = PyLong_AsLong(id_o);
    } else if (PyErr_Occurred()) {
        return -1;
    } else {
        PyObject *r = PyObject_CallOneArg(g_new_id, name);
        if (!r) return -1;
        id = PyLong_AsLong(r);
        Py_DECREF(r);
    }
    return id == -1 && PyErr_Occurred() ? -1 : id;
}

/* One APP_TENSOR record (tensors.py _emit).  *id: the name's id, or -1 to
 * look it up (after the fields, as the Python hook does), stored back. */
static int emit(uint64_t t0, PyObject *name, long *id, PyObject *tensor, PyObject *output,
                int32_t root, uint32_t redop, int32_t ps)
{
    long long n;
    long code = -1, size = -1;
    uint64_t ptr = 0, tptr;
    if (fast_fields(tensor, &n, &code, &size, &tptr) == 0) {
        if (output != tensor) goto fields_read;
        ptr = tptr; /* in place (allreduce_, broadcast_): the output is the tensor */
        goto address_read;
    }
    n = call_int(tensor, s_numel);
    if (n == -1 && PyErr_Occurred()) return -1;
    /* (dtype code, bytes per element) by dtype: tensors.py _dtype_info */
    PyObject *dt = PyObject_GetAttr(tensor, s_dtype);
    if (!dt) return -1;
    PyObject *info = PyDict_GetItemWithError(g_dtypes, dt); /* borrowed */
    Py_DECREF(dt);
    if (info) {
        Py_INCREF(info);
    } else if (PyErr_Occurred()) {
        return -1;
    } else if (!(info = PyObject_CallOneArg(g_dtype_info, tensor))) {
        return -1;
    }
    if (PyTuple_Check(info) && PyTuple_GET_SIZE(info) == 2) {
        code = PyLong_AsLong(PyTuple_GET_ITEM(info, 0));
        size = PyLong_AsLong(PyTuple_GET_ITEM(info, 1));
    } else {
        PyErr_SetString(PyExc_TypeError, "dtype info is not a (code, size) pair");
    }
    Py_DECREF(info);
    if (PyErr_Occurred()) return -1;
fields_read:
    if (output && output != Py_None) {
        long long n2;
        long c2, z2;
        if (fast_fields(output, &n2, &c2, &z2, &ptr) == 0) goto address_read;
        PyObject *p = PyObject_CallMethodNoArgs(output, s_data_ptr);
        if (p) {
            ptr = PyLong_AsUnsignedLongLongMask(p);
            Py_DECREF(p);
        }
        if (PyErr_Occurred()) { /* as the Python hook: no address, no error */
            PyErr_Clear();
            ptr = 0;
        }
    }
address_read:
    if (*id < 0 && (*id = name_id(name)) < 0) return -1;
    uint64_t t_end = now_p();
    record_p(t0, t_end, (uint64_t)(n * size), (uint64_t)n, (uint32_t)*id, root, (uint32_t)code,
             (uint32_t)size, redop, ps, ptr);
    g_count++;
    return 0;
}

/* int(getattr(ps, "process_set_id", 0) or 0); 0 when that is no integer.  An
 * exact int in the instance's own dictionary (Horovod's ProcessSet sets it
 * there when the set is registered; no data descriptor of its type shadows
 * it) is read from there: one probe. */
static int32_t process_set_id(PyObject *ps)
{
    PyObject *td = _PyType_Lookup(Py_TYPE(ps), s_process_set_id); /* borrowed, cached */
    PyObject **dp = td && PyDescr_IsData(td) ? NULL : _PyObject_GetDictPtr(ps);
    if (dp && *dp && PyDict_CheckExact(*dp)) {
        PyObject *v = PyDict_GetItemWithError(*dp, s_process_set_id); /* borrowed */
        if (v && PyLong_CheckExact(v)) {
            long r = PyLong_AsLong(v);
            if (!(r == -1 && PyErr_Occurred())) return (int32_t)r;
        }
        if (PyErr_Occurred()) PyErr_Clear();
    }
    PyObject *v = PyObject_GetAttr(ps, s_process_set_id);
    if (!v) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
        return 0;
    }
    int t = PyObject_IsTrue(v);
    long r = 0;
    if (t > 0) {
        PyObject *i = PyNumber_Long(v);
        if (i) {
            r = PyLong_AsLong(i);
            Py_DECREF(i);
        }
    }
    Py_DECREF(v);
    if (PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError))
            PyErr_Clear();
        return 0;
    }
    return (int32_t)r;
}

/* "<prefix>.<name>", or "<prefix>.noname.<handle>". */
static PyObject *base_name(HookObject *h, PyObject *name, PyObject *handle)
{
    int named = name ? PyObject_IsTrue(name) : 0;
    if (named < 0) return NULL;
    if (!named) {
        PyObject *hs = PyObject_Format(handle, s_empty);
        if (!hs) return NULL;
        PyObject *b = PyUnicode_FromFormat("%U.noname.%U", h->prefix, hs);
        Py_DECREF(hs);
        return b;
    }
    PyObject *ns = PyObject_Format(name, s_empty);
    if (!ns) return NULL;
    PyObject *b = PyUnicode_FromFormat("%U.%U", h->prefix, ns);
    Py_DECREF(ns);
    return b;
}

/* The reduction op's code (tensors.REDUCE_OPS; 255: not in it), the last
 * int op of this entry point remembered. */
static int redop_of(HookObject *h, PyObject *op, uint32_t *redop)
{
    if (op == h->op_obj && h->op_gen == g_gen) {
        *redop = h->op_redop;
        return 0;
    }
    PyObject *k = PyNumber_Long(op);
    if (!k) return -1;
    PyObject *v = PyDict_GetItemWithError(g_redops, k); /* borrowed */
    Py_DECREF(k);
    if (v) {
        *redop = (uint32_t)PyLong_AsLong(v);
        if (PyErr_Occurred()) return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    } else {
        *redop = 255;
    }
    if (PyLong_CheckExact(op)) { /* an int is immutable: its code stays */
        Py_XSETREF(h->op_obj, Py_NewRef(op));
        h->op_redop = *redop;
        h->op_gen = g_gen;
    }
    return 0;
}

/* Everything after Horovod's function returned (tensors.py _wrap). */
static int hook_record(HookObject *h, PyObject *const *args, Py_ssize_t na, PyObject *kwnames,
                       PyObject *handle, uint64_t t0)
{
    PyObject *tensors = na ? args[0] : arg_at(args, na, kwnames, -1, h->tensor_key);
    PyObject *outputs = h->out_i >= 0 ? arg_at(args, na, kwnames, h->out_i, h->out_key) : NULL;
    PyObject *name = arg_at(args, na, kwnames, h->name_i, s_name);
    long long root = -1;
    if (h->root_i >= 0) {
        PyObject *r = arg_at(args, na, kwnames, h->root_i, s_root_rank);
        if (r) {
            PyObject *ri = PyNumber_Long(r);
            if (!ri) return -1;
            root = PyLong_AsLongLong(ri);
            Py_DECREF(ri);
            if (root == -1 && PyErr_Occurred()) return -1;
        }
    }
    uint32_t redop = 0;
    PyObject *op = h->op_i >= 0 ? arg_at(args, na, kwnames, h->op_i, s_op) : NULL;
    if (op && op != Py_None && redop_of(h, op, &redop) < 0) return -1;
    PyObject *ps_arg = arg_at(args, na, kwnames, h->ps_i, s_process_set);
    int32_t ps = (ps_arg && ps_arg != Py_None) ? process_set_id(ps_arg) : 0;
    if (PyErr_Occurred()) return -1;
    name_slot *slot = NULL;
    PyObject *base = NULL;
    long id = -1;
    if (name && h->names && PyUnicode_CheckExact(name) && PyUnicode_GET_LENGTH(name) > 0) {
        slot = name_slot_of(h, name);
        if (slot->name == name && slot->gen == g_gen) {
            base = Py_NewRef(slot->base);
            id = slot->id;
        }
    }
    if (!base) {
        if (!(base = base_name(h, name, handle))) return -1;
        if (slot) {
            Py_XSETREF(slot->name, Py_NewRef(name));
            Py_XSETREF(slot->base, Py_NewRef(base));
            slot->id = -1;
            slot->gen = g_gen;
        }
    }
    pending_put(handle, base, t0);
    int rc = 0;
    if (h->grouped && tensors && tensors != Py_None) {
        PyObject *ts_ = PySequence_Fast(tensors, "tensors is not a sequence");
        PyObject *os_ = (ts_ && outputs && outputs != Py_None)
                            ? PySequence_Fast(outputs, "outputs is not a sequence") : NULL;
        if (!ts_ || (outputs && outputs != Py_None && !os_)) {
            rc = -1;
        } else {
            Py_ssize_t n = PySequence_Fast_GET_SIZE(ts_);
            for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
                PyObject *out = NULL;
                if (os_) {
                    if (i >= PySequence_Fast_GET_SIZE(os_)) {
                        PyErr_SetString(PyExc_IndexError, "list index out of range");
                        rc = -1;
                        break;
                    }
                    out = PySequence_Fast_GET_ITEM(os_, i);
                }
                PyObject *nm = PyUnicode_FromFormat("%U_%zdof%zd", base, i + 1, n);
                if (!nm) {
                    rc = -1;
                    break;
                }
                long nid = -1;
                rc = emit(t0, nm, &nid, PySequence_Fast_GET_ITEM(ts_, i), out, -1, redop, ps);
                Py_DECREF(nm);
            }
        }
        Py_XDECREF(ts_);
        Py_XDECREF(os_);
    } else {
        int known = id >= 0;
        rc = emit(t0, base, &id, tensors ? tensors : Py_None, outputs, (int32_t)root, redop, ps);
        if (rc == 0 && slot && !known && slot->name == name) slot->id = id; /* still ours */
    }
    Py_DECREF(base);
    return rc;
}

/* A failure of the recording: the warning (once, tensors.py), never an error
 * for the application. */
static void hook_failed(HookObject *h)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *msg = PyUnicode_FromFormat("tensor record failed (%U): %S", h->fname,
                                         value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (msg) {
        PyObject *r = PyObject_CallOneArg(g_warn, msg);
        Py_XDECREF(r);
        Py_DECREF(msg);
    }
    PyErr_Clear();
}

static PyObject *hook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    HookObject *h = (HookObject *)self;
    if (!g_ids || !resolve()) return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    unsigned long long call = ++g_calls;
    int measured = call <= g_first || call % g_every == 0;
    uint64_t t0 = now_p();
    PyObject *handle = PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    if (!handle) return NULL; /* Horovod's error, untouched */
    meter m = {0};
    if (measured) meter_open(&m);
    if (hook_record(h, args, PyVectorcall_NARGS(nargsf), kwnames, handle, t0) < 0) hook_failed(h);
    if (measured) {
        meter_close(&m);
        meter_account(&m, 0, call);
    }
    return handle;
}

static PyObject *hook_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static int hook_traverse(HookObject *h, visitproc visit, void *arg)
{
    Py_VISIT(h->orig);
    Py_VISIT(h->op_obj);
    return 0;
}

static int hook_clear(HookObject *h)
{
    Py_CLEAR(h->orig);
    Py_CLEAR(h->fname);
    Py_CLEAR(h->prefix);
    Py_CLEAR(h->tensor_key);
    Py_CLEAR(h->out_key);
    Py_CLEAR(h->op_obj);
    if (h->names)
        for (int i = 0; i < NAME_SLOTS; i++) {
            Py_CLEAR(h->names[i].name);
            Py_CLEAR(h->names[i].base);
        }
    return 0;
}

static void hook_dealloc(HookObject *h)
{
    PyObject_GC_UnTrack(h);
    hook_clear(h);
    PyMem_Free(h->names);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* Hook(orig, fname, prefix, grouped, out_i, root_i, op_i, name_i, ps_i):
 * positions as tensors.ENTRY_POINTS, None for an argument the entry point
 * does not take. */
static PyObject *hook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *orig, *fname, *prefix, *pos[5];
    int grouped;
    if (kwargs && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Hook() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OUUpOOOOO", &orig, &fname, &prefix, &grouped, &pos[0], &pos[1],
                          &pos[2], &pos[3], &pos[4]))
        return NULL;
    Py_ssize_t p[5];
    for (int i = 0; i < 5; i++) {
        p[i] = pos[i] == Py_None ? -1 : PyLong_AsSsize_t(pos[i]);
        if (p[i] == -1 && PyErr_Occurred()) return NULL;
    }
    HookObject *h = (HookObject *)type->tp_alloc(type, 0);
    if (!h) return NULL;
    h->vectorcall = hook_vectorcall;
    h->orig = Py_NewRef(orig);
    h->fname = Py_NewRef(fname);
    h->prefix = Py_NewRef(prefix);
    h->grouped = grouped;
    h->tensor_key = PyUnicode_FromString(grouped ? "tensors" : "tensor");
    h->out_key = PyUnicode_FromString(grouped ? "outputs" : "output");
    h->names = PyMem_Calloc(NAME_SLOTS, sizeof(name_slot)); /* NULL: not cached */
    h->out_i = p[0];
    h->root_i = p[1];
    h->op_i = p[2];
    h->name_i = p[3];
    h->ps_i = p[4];
    if (!h->tensor_key || !h->out_key) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static PyMemberDef hook_members[] = {
    {"__hvprof_wrapped__", T_OBJECT_EX, offsetof(HookObject, orig), READONLY,
     "Horovod's function"},
    {"__wrapped__", T_OBJECT_EX, offsetof(HookObject, orig), READONLY, "Horovod's function"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *hook_get_name(HookObject *h, void *closure)
{
    (void)closure;
    return Py_NewRef(h->fname);
}

static PyGetSetDef hook_getset[] = {
    {"__name__", (getter)hook_get_name, NULL, "the entry point's name", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler._fastrec.Hook",
    .tp_doc = "A tensor hook standing in for one of Horovod's entry points.",
    .tp_basicsize = sizeof(HookObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(HookObject, vectorcall),
    .tp_call = hook_call,
    .tp_new = hook_new,
    .tp_dealloc = (destructor)hook_dealloc,
    .tp_traverse = (traverseproc)hook_traverse,
    .tp_clear = (inquiry)hook_clear,
    .tp_members = hook_members,
    .tp_getset = hook_getset,
};
