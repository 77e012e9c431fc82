/*
 * fastrec_step.c -- profiler._fastrec.StepHook: the DistributedOptimizer's
 * step and synchronize hooks of profiler.collect.horovod_hooks in C, and the
 * calling thread's schedstat they read.
 */
#include "fastrec.h"
#include <structmember.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

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

PyTypeObject StepHookType = {
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
