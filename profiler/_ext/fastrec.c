/*
 * fastrec.c -- profiler._fastrec: the Python hooks' way into libhvprof.so at
 * the cost of a C call.  Through ctypes, hvprof_record_tensor costs ~3.8 us a
 * call here (argument conversion); this module takes the same arguments as
 * Python ints with METH_FASTCALL and forwards them (~0.1 us).  It does not link
 * against the library: it finds hvprof_now and hvprof_record_tensor with
 * dlsym(RTLD_DEFAULT) (the library is loaded RTLD_GLOBAL at interpreter start
 * when profiling), on first use, and reports "absent" (-1) without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>

typedef uint64_t (*now_fn)(void);
typedef int (*record_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint32_t, int32_t, uint32_t,
                         uint32_t, uint32_t, int32_t, uint64_t);
static now_fn now_p;
static record_fn record_p;
static int resolved;

static int resolve(void)
{
    if (!resolved) {
        now_p = (now_fn)dlsym(RTLD_DEFAULT, "hvprof_now");
        record_p = (record_fn)dlsym(RTLD_DEFAULT, "hvprof_record_tensor");
        resolved = 1;
    }
    return now_p && record_p;
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

static PyMethodDef methods[] = {
    {"available", fr_available, METH_NOARGS, "whether libhvprof.so's exports are loaded"},
    {"now", fr_now, METH_NOARGS, "hvprof_now(): the raw records' clock (0 when absent)"},
    {"record", (PyCFunction)(void (*)(void))fr_record, METH_FASTCALL,
     "hvprof_record_tensor with t_end read now"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastrec", "Fast calls into libhvprof.so.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastrec(void) { return PyModule_Create(&module); }
