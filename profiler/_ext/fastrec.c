/*
 * fastrec.c -- profiler._fastrec: the Python hooks' way into libhvprof.so at
 * the cost of a C call.  Through ctypes, hvprof_record_tensor costs ~3.8 us a
 * call here (argument conversion); record() takes the same arguments as
 * Python ints with METH_FASTCALL and forwards them (~0.3 us).  It does not link
 * against the library: it finds hvprof_now and hvprof_record_tensor with
 * dlsym(RTLD_DEFAULT) (the library is loaded RTLD_GLOBAL at interpreter start
 * when profiling), on first use, and reports "absent" (-1) without it.
 *
 * Hook: the whole tensor hook of profiler.collect.tensors (its _wrap) as a C
 * callable that stands in for one of Horovod's entry points.  tensors.py stays
 * the definition: it passes the entry point's argument positions, and the
 * state the hook shares with it (configure(): the name ids and the function
 * that appends a new name to the names file, the reduction-op and dtype
 * tables and the function that fills the latter, the warning, selfcost's
 * sampling rule and its functions); its own Python hook does the same in
 * Python and is used when this module is absent or HOROVOD_PROFILE_FASTREC=0
 * (tests/test_tensor_hooks.py compares the two, record by record).  Why: a
 * hook runs once per tensor per step, inside the backward pass, where every
 * line it touches is cold: without the interpreter this one costs a fraction
 * of the Python hook (figures: docs/validation.md, "Fusion lineage and
 * what-if").  What it keeps per call is kept here, without allocating: the
 * pending handles (a table indexed by handle, read by oldest_pending) and the
 * sampling count; where PyTorch's field reader is in use (torch_fields_use(),
 * profiler/_ext/torch_fields.cc) the tensor's size, dtype and address are
 * read without calling into Python.
 *
 * The files: fastrec.c (this one: the module, the library's exports and the
 * state the hooks share), fastrec_hook.c (Hook), fastrec_step.c (StepHook),
 * fastrec.h (what they share; the per-call helpers, static inline).
 */
#include "fastrec.h"
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

now_fn now_p;
record_fn record_p;
double (*ticks_per_ns_p)(void);
static int resolved;

int resolve(void)
{
    if (!resolved) {
        now_p = (now_fn)dlsym(RTLD_DEFAULT, "hvprof_now");
        record_p = (record_fn)dlsym(RTLD_DEFAULT, "hvprof_record_tensor");
        ticks_per_ns_p = (double (*)(void))dlsym(RTLD_DEFAULT, "hvprof_ticks_per_ns");
        resolved = 1;
    }
    return now_p && record_p && ticks_per_ns_p;
}

static PyObject *fr_available(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    return PyBool_FromLong(resolve());
}

static PyObject *fr_now(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    if (!resolve()) return PyLong_FromLong(0);
    return PyLong_FromUnsignedLongLong(now_p());
}

/* record(t_start, bytes, count, name_id, root, dtype, dtype_size, redop,
 *        process_set, output_address) -> hvprof_record_tensor's result;
 * t_end is read here, after the enqueue returned. */
static PyObject *fr_record(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 10) {
        PyErr_SetString(PyExc_TypeError, "record() takes 10 arguments");
        return NULL;
    }
    if (!resolve()) return PyLong_FromLong(-1);
    uint64_t v[10];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 4 || i == 8) {
            long long s = PyLong_AsLongLong(args[i]);
            v[i] = (uint64_t)s;
        } else {
            v[i] = PyLong_AsUnsignedLongLongMask(args[i]);
        }
        if (PyErr_Occurred()) return NULL;
    }
    uint64_t t_end = now_p();
    int rc = record_p(v[0], t_end, v[1], v[2], (uint32_t)v[3], (int32_t)(int64_t)v[4],
                      (uint32_t)v[5], (uint32_t)v[6], (uint32_t)v[7], (int32_t)(int64_t)v[8],
                      v[9]);
    return PyLong_FromLong(rc);
}

/* ------------------------------------------------------------------------ */
/* The step state's exports (hooks/steps.c), for StepHook (fastrec_step.c)
 * and for profiler.collect.steps' calls outside the optimizer's hooks
 * (profiler.step, TensorFlow's hooks). */
static steps_u64_fn steps_mark_p, steps_hook_end_p;
static steps_void_fn steps_hook_begin_p;
steps_hook_fn steps_hook_p;
steps_sync_fn steps_sync_p;
int (*cpu_step_reads_p)(void); /* absent: an older library, reads on */
static int steps_resolved;

int resolve_steps(void)
{
    if (!steps_resolved) {
        steps_mark_p = (steps_u64_fn)dlsym(RTLD_DEFAULT, "hvprof_steps_mark");
        steps_hook_end_p = (steps_u64_fn)dlsym(RTLD_DEFAULT, "hvprof_steps_hook_end");
        steps_hook_begin_p = (steps_void_fn)dlsym(RTLD_DEFAULT, "hvprof_steps_hook_begin");
        steps_hook_p = (steps_hook_fn)dlsym(RTLD_DEFAULT, "hvprof_steps_hook");
        steps_sync_p = (steps_sync_fn)dlsym(RTLD_DEFAULT, "hvprof_steps_sync");
        cpu_step_reads_p = (int (*)(void))dlsym(RTLD_DEFAULT, "hvprof_cpu_step_reads");
        steps_resolved = 1;
    }
    return steps_mark_p && steps_hook_end_p && steps_hook_begin_p && steps_hook_p
           && steps_sync_p && resolve();
}

static PyObject *fr_steps_available(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    return PyBool_FromLong(resolve_steps());
}

static int i64_args(PyObject *const *args, Py_ssize_t n, Py_ssize_t want, const char *what,
                    int64_t *v)
{
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", what, want);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = (int64_t)PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) {
            /* a tick count past 2**63 */
            PyErr_Clear();
            v[i] = (int64_t)PyLong_AsUnsignedLongLongMask(args[i]);
            if (PyErr_Occurred()) return -1;
        }
    }
    return 0;
}

static PyObject *fr_steps_mark(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    int64_t v[1];
    if (i64_args(args, n, 1, "steps_mark", v) < 0) return NULL;
    if (resolve_steps()) steps_mark_p((uint64_t)v[0]);
    Py_RETURN_NONE;
}

static PyObject *fr_steps_hook(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    int64_t v[2];
    if (i64_args(args, n, 2, "steps_hook", v) < 0) return NULL;
    if (resolve_steps()) steps_hook_p((uint64_t)v[0], v[1]);
    Py_RETURN_NONE;
}

static PyObject *fr_steps_hook_begin(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    if (resolve_steps()) steps_hook_begin_p();
    Py_RETURN_NONE;
}

static PyObject *fr_steps_hook_end(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    int64_t v[1];
    if (i64_args(args, n, 1, "steps_hook_end", v) < 0) return NULL;
    if (resolve_steps()) steps_hook_end_p((uint64_t)v[0]);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* Hook's state (the type: fastrec_hook.c)                                 */

PyObject *g_ids, *g_new_id, *g_redops, *g_dtypes, *g_dtype_info, *g_warn;
unsigned long long g_count;
/* Bumped by configure() and in a forked child (whose names start over:
 * tensors.py _after_fork): a Hook's cached ids and reduction ops are used
 * only when taken in the current generation. */
unsigned g_gen = 1;
/* selfcost's rule (profiler.collect.selfcost.sample): the first g_first
 * invocations measured, then one in g_every; g_calls counts them all */
unsigned long long g_calls, g_first = 256, g_every = 64;
PyObject *s_numel, *s_dtype, *s_data_ptr, *s_process_set_id, *s_name,
    *s_root_rank, *s_op, *s_process_set, *s_empty;

/* configure(ids, new_id, redops, dtypes, dtype_info, warn): the state a Hook
 * shares with profiler.collect.tensors (see there); called once before any
 * Hook runs. */
static PyObject *fr_configure(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 6) {
        PyErr_SetString(PyExc_TypeError, "configure() takes 6 arguments");
        return NULL;
    }
    PyObject **slots[] = {&g_ids, &g_new_id, &g_redops, &g_dtypes, &g_dtype_info, &g_warn};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    g_gen++;
    Py_RETURN_NONE;
}

/* sampling(measure_first, sample_every): selfcost's rule, as its constants
 * say (a benchmark measures every invocation with a huge measure_first). */
static PyObject *fr_sampling(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "sampling() takes 2 arguments");
        return NULL;
    }
    unsigned long long first = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long every = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (every < 1) {
        PyErr_SetString(PyExc_ValueError, "sample_every must be 1 or more");
        return NULL;
    }
    g_first = first;
    g_every = every;
    Py_RETURN_NONE;
}

/* calls(): Hook invocations so far (profiler.collect.selfcost adds them to
 * its own count) */
static PyObject *fr_calls(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    return PyLong_FromUnsignedLongLong(g_calls);
}

/* ------------------------------------------------------------------------ */
/* The hooks' own work, measured by selfcost's rule: the meter and how it is
 * read are in fastrec.h; here, the sums. */

static double g_work_ns[2]; /* [0]: Hook (tensors), [1]: StepHook */
static double g_paid_ns;

/* Invocation number `call` of a hook of `kind`, measured as `m`. */
void meter_account(const meter *m, int kind, unsigned long long call)
{
    long long c0 = thread_cpu_ns(), read = thread_cpu_ns() - c0;
    double tpn = ticks_per_ns_p();
    if (read < 0) read = 0;
    double by_cpu = (double)(m->cpu - m->stretches * read);
    double work = by_cpu; /* the library's clock unknown yet: the CPU alone */
    if (tpn > 0 && (double)m->ticks / tpn < by_cpu) work = (double)m->ticks / tpn;
    if (work < 0) work = 0;
    g_work_ns[kind] += work * (double)(call <= g_first ? 1 : g_every);
    g_paid_ns += (double)((2 * m->stretches + 2) * read);
}

/* work_ns() -> (tensor hooks, step hooks, clock reads): the hooks' measured
 * work so far and what measuring it cost, ns (selfcost adds them to the
 * Python hooks'). */
static PyObject *fr_work_ns(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    return Py_BuildValue("(LLL)", (long long)g_work_ns[0], (long long)g_work_ns[1],
                         (long long)g_paid_ns);
}

/* ------------------------------------------------------------------------ */
/* PyTorch's field reader (profiler/_ext/torch_fields.cc), when loaded and
 * accepted by profiler.collect.tensors: it is given only objects whose type
 * is one of torch_types, and a scalar type maps to (dtype code, bytes per
 * element) through the table tensors.py filled from its probes (code -1:
 * not in it, ask Python). */

static fields_fn torch_fields_loaded; /* the reader, once loaded */
fields_fn torch_fields_p;             /* the same, once in use (else NULL) */
PyTypeObject *torch_types[2];
int32_t st_code[SCALAR_TYPES], st_size[SCALAR_TYPES];

/* torch_fields_load(path) -> the PyTorch version it was built for; loads
 * the library (not yet used: torch_fields_use). */
static PyObject *fr_torch_fields_load(PyObject *self, PyObject *path)
{
    (void)self;
    const char *p = PyUnicode_AsUTF8(path);
    if (!p) return NULL;
    void *dl = dlopen(p, RTLD_NOW | RTLD_LOCAL); /* a second load is the same handle */
    if (!dl) {
        const char *e = dlerror();
        PyErr_SetString(PyExc_OSError, e ? e : "dlopen failed");
        return NULL;
    }
    const char *(*built)(void) = (const char *(*)(void))dlsym(dl, "hvprof_torch_built_for");
    fields_fn f = (fields_fn)dlsym(dl, "hvprof_torch_fields");
    if (!built || !f) {
        PyErr_SetString(PyExc_OSError, "not a field reader (its exports are missing)");
        return NULL;
    }
    torch_fields_loaded = f;
    return PyUnicode_FromString(built());
}

/* torch_fields_probe(tensor) -> (numel, scalar type, data address), or None
 * where the reader does not answer: what tensors.py compares with Python's
 * own answers before it lets the hook use the reader. */
static PyObject *fr_torch_fields_probe(PyObject *self, PyObject *t)
{
    (void)self;
    if (!torch_fields_loaded) {
        PyErr_SetString(PyExc_RuntimeError, "torch_fields_load() first");
        return NULL;
    }
    int64_t n;
    int32_t st;
    uint64_t ptr;
    if (torch_fields_loaded(t, &n, &st, &ptr) != 0) Py_RETURN_NONE;
    return Py_BuildValue("(LiK)", (long long)n, (int)st, (unsigned long long)ptr);
}

/* torch_fields_use(types, table): from now on the hook reads objects of
 * exactly these types (a tuple of 1-2 types) through the reader, the scalar
 * type mapping to (code, size) by table ({scalar type: (code, size)}).
 * torch_fields_use(None, None) stops it. */
static PyObject *fr_torch_fields_use(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "torch_fields_use() takes 2 arguments");
        return NULL;
    }
    torch_fields_p = NULL;
    if (args[0] == Py_None) Py_RETURN_NONE;
    if (!torch_fields_loaded) {
        PyErr_SetString(PyExc_RuntimeError, "torch_fields_load() first");
        return NULL;
    }
    if (!PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) < 1 ||
        PyTuple_GET_SIZE(args[0]) > 2 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "torch_fields_use(types tuple, table dict)");
        return NULL;
    }
    PyTypeObject *types[2] = {NULL, NULL};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[0]); i++) {
        PyObject *tp = PyTuple_GET_ITEM(args[0], i);
        if (!PyType_Check(tp)) {
            PyErr_SetString(PyExc_TypeError, "torch_fields_use: not a type");
            return NULL;
        }
        types[i] = (PyTypeObject *)tp;
    }
    int32_t code[SCALAR_TYPES], size[SCALAR_TYPES];
    for (int i = 0; i < SCALAR_TYPES; i++) code[i] = size[i] = -1;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(args[1], &pos, &k, &v)) {
        long st = PyLong_AsLong(k);
        long c = -1, z = -1;
        if (PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 2) {
            c = PyLong_AsLong(PyTuple_GET_ITEM(v, 0));
            z = PyLong_AsLong(PyTuple_GET_ITEM(v, 1));
        }
        if (PyErr_Occurred()) return NULL;
        if (st < 0 || st >= SCALAR_TYPES || c < 0 || z < 0) {
            PyErr_SetString(PyExc_ValueError, "torch_fields_use: a table entry out of range");
            return NULL;
        }
        code[st] = (int32_t)c;
        size[st] = (int32_t)z;
    }
    memcpy(st_code, code, sizeof code);
    memcpy(st_size, size, sizeof size);
    /* types held by the module that defines them: they outlive every Hook */
    torch_types[0] = types[0];
    torch_types[1] = types[1] ? types[1] : types[0];
    torch_fields_p = torch_fields_loaded;
    Py_RETURN_NONE;
}

static PyObject *fr_count(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    return PyLong_FromUnsignedLongLong(g_count);
}

static PyMethodDef methods[] = {
    {"available", fr_available, METH_NOARGS, "whether libhvprof.so's exports are loaded"},
    {"now", fr_now, METH_NOARGS, "hvprof_now(): the raw records' clock (0 when absent)"},
    {"record", (PyCFunction)(void (*)(void))fr_record, METH_FASTCALL,
     "hvprof_record_tensor with t_end read now"},
    {"steps_available", fr_steps_available, METH_NOARGS,
     "whether libhvprof.so's step state (hooks/steps.c) is loaded"},
    {"steps_mark", (PyCFunction)(void (*)(void))fr_steps_mark, METH_FASTCALL,
     "hvprof_steps_mark(images)"},
    {"steps_hook", (PyCFunction)(void (*)(void))fr_steps_hook, METH_FASTCALL,
     "hvprof_steps_hook(entered, images)"},
    {"steps_hook_begin", fr_steps_hook_begin, METH_NOARGS, "hvprof_steps_hook_begin()"},
    {"steps_hook_end", (PyCFunction)(void (*)(void))fr_steps_hook_end, METH_FASTCALL,
     "hvprof_steps_hook_end(images)"},
    {"configure", (PyCFunction)(void (*)(void))fr_configure, METH_FASTCALL,
     "the state Hook shares with profiler.collect.tensors"},
    {"count", fr_count, METH_NOARGS, "tensor records written by Hook objects"},
    {"calls", fr_calls, METH_NOARGS, "Hook invocations"},
    {"work_ns", fr_work_ns, METH_NOARGS,
     "(tensor hooks, step hooks, clock reads): measured work so far, ns"},
    {"sampling", (PyCFunction)(void (*)(void))fr_sampling, METH_FASTCALL,
     "(measure_first, sample_every): which Hook invocations are measured"},
    {"oldest_pending", fr_oldest_pending, METH_O,
     "(seconds, name) of the oldest handle kept that is still in the given map"},
    {"torch_fields_load", fr_torch_fields_load, METH_O,
     "load PyTorch's field reader: the version it was built for"},
    {"torch_fields_probe", fr_torch_fields_probe, METH_O,
     "(numel, scalar type, address) by the field reader, or None"},
    {"torch_fields_use", (PyCFunction)(void (*)(void))fr_torch_fields_use, METH_FASTCALL,
     "let the hook read tensors of these types through the field reader"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastrec", "Fast calls into libhvprof.so.", -1, methods,
    NULL, NULL, NULL, NULL,
};

static void fork_child(void) { g_gen++; }

PyMODINIT_FUNC PyInit__fastrec(void)
{
    static int atfork;
    if (!atfork && pthread_atfork(NULL, NULL, fork_child) == 0) atfork = 1;
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_numel, "numel"}, {&s_dtype, "dtype"},
        {&s_data_ptr, "data_ptr"}, {&s_process_set_id, "process_set_id"}, {&s_name, "name"},
        {&s_root_rank, "root_rank"}, {&s_op, "op"}, {&s_process_set, "process_set"},
        {&s_empty, ""},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!*names[i].slot && !(*names[i].slot = PyUnicode_InternFromString(names[i].text)))
            return NULL;
    if (PyType_Ready(&HookType) < 0 || PyType_Ready(&StepHookType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Hook", (PyObject *)&HookType) < 0
        || PyModule_AddObjectRef(m, "StepHook", (PyObject *)&StepHookType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
