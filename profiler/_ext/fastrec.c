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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef uint64_t (*now_fn)(void);
typedef int (*record_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint32_t, int32_t, uint32_t,
                         uint32_t, uint32_t, int32_t, uint64_t);
static now_fn now_p;
static record_fn record_p;
static double (*ticks_per_ns_p)(void);
static int resolved;

static int resolve(void)
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
/* The calling thread's schedstat, for StepHook's synchronize.  The
 * descriptor of /proc/thread-self/schedstat is kept per thread (a forked
 * child's copy is dropped: the tid it was opened for is kept beside it). */
static __thread int ss_fd = -1;
static __thread long ss_tid;

/* *run, *wait: ns on a CPU and waiting on a run queue so far, both -1 where
 * they cannot be read. */
static void self_schedstat(long long *run, long long *wait)
{
    *run = *wait = -1;
    long tid = PyThread_get_thread_native_id();
    if (ss_fd >= 0 && ss_tid != tid) {
        close(ss_fd);
        ss_fd = -1;
    }
    if (ss_fd < 0) {
        ss_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        ss_tid = tid;
    }
    if (ss_fd < 0) return;
    char buf[128];
    ssize_t k;
    do {
        k = pread(ss_fd, buf, sizeof buf - 1, 0);
    } while (k < 0 && errno == EINTR);
    if (k <= 0) return;
    buf[k] = 0;
    char *end;
    unsigned long long a = strtoull(buf, &end, 10);
    if (end == buf) return;
    char *p = end;
    unsigned long long b = strtoull(p, &end, 10);
    if (end == p) return;
    *run = (long long)a;
    *wait = (long long)b;
}

/* The step state's exports (hooks/steps.c), for StepHook below and for
 * profiler.collect.steps' calls outside the optimizer's hooks (profiler.step,
 * TensorFlow's hooks). */
typedef void (*steps_u64_fn)(uint64_t);
typedef void (*steps_void_fn)(void);
typedef void (*steps_hook_fn)(uint64_t, int64_t);
typedef void (*steps_sync_fn)(uint64_t, uint64_t, int64_t, int64_t);
static steps_u64_fn steps_mark_p, steps_hook_end_p;
static steps_void_fn steps_hook_begin_p;
static steps_hook_fn steps_hook_p;
static steps_sync_fn steps_sync_p;
static int (*cpu_step_reads_p)(void); /* absent: an older library, reads on */
static int steps_resolved;

static int resolve_steps(void)
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
/* Hook                                                                      */

static PyObject *g_ids, *g_new_id, *g_redops, *g_dtypes, *g_dtype_info, *g_warn;
static unsigned long long g_count;
/* Bumped by configure() and in a forked child (whose names start over:
 * tensors.py _after_fork): a Hook's cached ids and reduction ops are used
 * only when taken in the current generation. */
static unsigned g_gen = 1;
/* selfcost's rule (profiler.collect.selfcost.sample): the first g_first
 * invocations measured, then one in g_every; g_calls counts them all */
static unsigned long long g_calls, g_first = 256, g_every = 64;
static PyObject *s_numel, *s_dtype, *s_data_ptr, *s_process_set_id, *s_name,
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
/* The hooks' own work, measured by selfcost's rule (profiler.collect.selfcost:
 * close) in C: a measured invocation reads the library's clock and this
 * thread's CPU clock around each stretch of its own work (never around what
 * it wraps); its work is the smaller of the two, the CPU interval less the
 * reads inside it (a wait for a core is in the wall interval only).  Calling
 * back into Python for the clocks, as this did before, cost more than the
 * work it timed and was counted with it.  Sums, ns: per kind of hook, the
 * work times the invocations it stands for; apart, what the measured
 * invocations' own CPU clock reads cost. */

static double g_work_ns[2]; /* [0]: Hook (tensors), [1]: StepHook */
static double g_paid_ns;

static long long thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    uint64_t ticks, t_open; /* library clock: summed, at the open stretch */
    long long cpu, c_open;  /* thread CPU ns: summed, at the open stretch */
    int stretches;
} meter;

static inline void meter_open(meter *m)
{
    m->c_open = thread_cpu_ns();
    m->t_open = now_p();
}

static inline void meter_close(meter *m)
{
    uint64_t t = now_p();
    long long c = thread_cpu_ns();
    m->ticks += t - m->t_open;
    m->cpu += c - m->c_open;
    m->stretches++;
}

/* Invocation number `call` of a hook of `kind`, measured as `m`. */
static void meter_account(const meter *m, int kind, unsigned long long call)
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
    double t;         /* CLOCK_MONOTONIC seconds: time.monotonic() */
} pending_slot;
static pending_slot pending[PENDING_SLOTS];

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void pending_put(PyObject *handle, PyObject *name)
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
    s->t = monotonic_s();
    Py_XDECREF(old_n);
}

/* oldest_pending(live) -> (seconds, name) of the oldest kept handle that is
 * still in `live` (Horovod's handle map), or None; the others are dropped. */
static PyObject *fr_oldest_pending(PyObject *self, PyObject *live)
{
    (void)self;
    double now = monotonic_s(), age = -1.0;
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
        } else if (now - s->t > age) {
            age = now - s->t;
            name = s->name;
        }
    }
    if (!name) Py_RETURN_NONE;
    return Py_BuildValue("(dO)", age, name);
}

/* ------------------------------------------------------------------------ */
/* PyTorch's field reader (profiler/_ext/torch_fields.cc), when loaded and
 * accepted by profiler.collect.tensors: it is given only objects whose type
 * is one of torch_types, and a scalar type maps to (dtype code, bytes per
 * element) through the table tensors.py filled from its probes (code -1:
 * not in it, ask Python). */

typedef int (*fields_fn)(PyObject *, int64_t *, int32_t *, uint64_t *);
static fields_fn torch_fields_loaded; /* the reader, once loaded */
static fields_fn torch_fields_p;      /* the same, once in use (else NULL) */
static PyTypeObject *torch_types[2];
#define SCALAR_TYPES 64
static int32_t st_code[SCALAR_TYPES], st_size[SCALAR_TYPES];

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

/* The reader's answer for a tensor of an accepted type: 0 with numel,
 * (code, size) and address; -1: ask Python. */
static inline int fast_fields(PyObject *t, long long *n, long *code, long *size, uint64_t *ptr)
{
    if (!torch_fields_p || (Py_TYPE(t) != torch_types[0] && Py_TYPE(t) != torch_types[1]))
        return -1;
    int64_t nn;
    int32_t st;
    if (torch_fields_p(t, &nn, &st, ptr) != 0 || st < 0 || st >= SCALAR_TYPES ||
        st_code[st] < 0)
        return -1;
    *n = nn;
    *code = st_code[st];
    *size = st_size[st];
    return 0;
}

static PyObject *fr_count(PyObject *self, PyObject *unused)
{
    (void)self; (void)unused;
    return PyLong_FromUnsignedLongLong(g_count);
}

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
 * Direct-mapped (a name whose slot another took is formatted again); a
 * slot holds its name, so an address is never mistaken for a freed
 * object's.  Only exact, non-empty str names; id -1: not known yet (a
 * grouped entry point's base has none: its tensors' names do). */
#define NAME_SLOTS 512
typedef struct name_slot {
    PyObject *name, *base; /* NULL: empty */
    long id;
    unsigned gen;          /* g_gen when filled */
} name_slot;

static inline name_slot *name_slot_of(HookObject *h, PyObject *name)
{
    uintptr_t a = (uintptr_t)name;
    return &h->names[((a >> 4) ^ (a >> 13)) & (NAME_SLOTS - 1)];
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

/* int(getattr(ps, "process_set_id", 0) or 0); 0 when that is no integer. */
static int32_t process_set_id(PyObject *ps)
{
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
    pending_put(handle, base);
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

static PyTypeObject HookType = {
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

/* ------------------------------------------------------------------------ */
/* StepHook                                                                  */

/* StepHook(orig, kind, prepare): the DistributedOptimizer's step (kind 0) or
 * synchronize (kind 1) hook of profiler.collect.horovod_hooks in C, as a
 * method of the optimizer's class (it binds like a function).  synchronize:
 * the clock and the calling thread's schedstat on either side of Horovod's,
 * handed to the step state (hvprof_steps_sync); step: the clock as it
 * begins, and after it the step's boundary (hvprof_steps_hook: the sync
 * row, then the step record).  prepare() (profiler.collect.steps.prepare)
 * is called once, at the first invocation: it hands the library the step
 * settings and says whether profiling is on; when it is off, or the
 * library lacks the step state, the hook only calls the original.  The
 * invocations count and are measured with the tensor hooks' (selfcost's
 * rule). */
enum { STEP_HOOK_STEP = 0, STEP_HOOK_SYNC = 1 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig, *prepare, *name;
    int kind;
    int ready; /* 0: not asked yet, 1: recording, -1: only the original */
} StepHookObject;

static int step_hook_ready(StepHookObject *h)
{
    if (h->ready == 0) {
        PyObject *r = PyObject_CallNoArgs(h->prepare);
        int on = r ? PyObject_IsTrue(r) : 0;
        Py_XDECREF(r);
        PyErr_Clear();
        h->ready = on > 0 && resolve_steps() ? 1 : -1;
    }
    return h->ready > 0;
}

static PyObject *step_hook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    StepHookObject *h = (StepHookObject *)self;
    if (!step_hook_ready(h)) return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    unsigned long long call = ++g_calls;
    int measured = g_ids && (call <= g_first || call % g_every == 0);
    meter m = {0};
    if (measured) meter_open(&m);
    uint64_t t_in = now_p();
    long long run0 = -1, wait0 = -1;
    int reads = h->kind == STEP_HOOK_SYNC && (!cpu_step_reads_p || cpu_step_reads_p());
    if (reads) self_schedstat(&run0, &wait0);
    if (measured) meter_close(&m);
    PyObject *result = PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    if (!result) return NULL; /* Horovod's error, untouched */
    if (measured) meter_open(&m);
    if (h->kind == STEP_HOOK_SYNC) {
        uint64_t t_out = now_p();
        long long run1 = -1, wait1 = -1;
        if (reads) self_schedstat(&run1, &wait1);
        int ok = run0 >= 0 && wait0 >= 0 && run1 >= 0 && wait1 >= 0;
        steps_sync_p(t_in, t_out, ok ? run1 - run0 : -1, ok ? wait1 - wait0 : -1);
    } else {
        steps_hook_p(t_in, -1);
    }
    if (measured) {
        meter_close(&m);
        meter_account(&m, 1, call);
    }
    return result;
}

static PyObject *step_hook_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

/* Bound to an optimizer, as a function is. */
static PyObject *step_hook_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static int step_hook_traverse(StepHookObject *h, visitproc visit, void *arg)
{
    Py_VISIT(h->orig);
    Py_VISIT(h->prepare);
    Py_VISIT(h->name);
    return 0;
}

static int step_hook_clear(StepHookObject *h)
{
    Py_CLEAR(h->orig);
    Py_CLEAR(h->prepare);
    Py_CLEAR(h->name);
    return 0;
}

static void step_hook_dealloc(StepHookObject *h)
{
    PyObject_GC_UnTrack(h);
    step_hook_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *step_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *orig, *prepare;
    int kind;
    if (kwargs && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "StepHook() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OiO", &orig, &kind, &prepare)) return NULL;
    if (kind != STEP_HOOK_STEP && kind != STEP_HOOK_SYNC) {
        PyErr_SetString(PyExc_ValueError, "kind: 0 (step) or 1 (synchronize)");
        return NULL;
    }
    StepHookObject *h = (StepHookObject *)type->tp_alloc(type, 0);
    if (!h) return NULL;
    h->vectorcall = step_hook_vectorcall;
    h->orig = Py_NewRef(orig);
    h->prepare = Py_NewRef(prepare);
    h->kind = kind;
    h->name = PyUnicode_FromString(kind == STEP_HOOK_SYNC ? "synchronize" : "step");
    if (!h->name) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static PyMemberDef step_hook_members[] = {
    {"__hvprof_wrapped__", T_OBJECT_EX, offsetof(StepHookObject, orig), READONLY,
     "Horovod's method"},
    {"__wrapped__", T_OBJECT_EX, offsetof(StepHookObject, orig), READONLY, "Horovod's method"},
    {"__name__", T_OBJECT_EX, offsetof(StepHookObject, name), READONLY, "the method's name"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler._fastrec.StepHook",
    .tp_doc = "The DistributedOptimizer's step or synchronize hook.",
    .tp_basicsize = sizeof(StepHookObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(StepHookObject, vectorcall),
    .tp_call = step_hook_call,
    .tp_descr_get = step_hook_get,
    .tp_new = step_hook_new,
    .tp_dealloc = (destructor)step_hook_dealloc,
    .tp_traverse = (traverseproc)step_hook_traverse,
    .tp_clear = (inquiry)step_hook_clear,
    .tp_members = step_hook_members,
};

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
