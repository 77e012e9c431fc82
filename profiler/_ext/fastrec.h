/*
 * fastrec.h -- what the files of profiler._fastrec share: fastrec.c (the
 * module: the library's exports, configure(), the own-work sums, PyTorch's
 * field reader), fastrec_hook.c (Hook) and fastrec_step.c (StepHook).  What
 * a hook does per call is here as static inline (the meter, the field
 * reader's answer), not a call into another file.  The symbols shared
 * between the files are hidden: the extension exports only PyInit__fastrec.
 */
#ifndef HVPROF_FASTREC_H
#define HVPROF_FASTREC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#define FR_HIDDEN __attribute__((visibility("hidden")))

/* libhvprof.so's exports, found by resolve() (fastrec.c): nonzero when
 * now_p, record_p and ticks_per_ns_p are all there. */
typedef uint64_t (*now_fn)(void);
typedef int (*record_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint32_t, int32_t, uint32_t,
                         uint32_t, uint32_t, int32_t, uint64_t);
extern FR_HIDDEN now_fn now_p;
extern FR_HIDDEN record_fn record_p;
extern FR_HIDDEN double (*ticks_per_ns_p)(void);
FR_HIDDEN int resolve(void);

/* The step state's exports (hooks/steps.c), for StepHook (fastrec_step.c)
 * and for profiler.collect.steps' calls outside the optimizer's hooks
 * (profiler.step, TensorFlow's hooks). */
typedef void (*steps_u64_fn)(uint64_t);
typedef void (*steps_void_fn)(void);
typedef void (*steps_hook_fn)(uint64_t, int64_t);
typedef void (*steps_sync_fn)(uint64_t, uint64_t, int64_t, int64_t);
extern FR_HIDDEN steps_hook_fn steps_hook_p;
extern FR_HIDDEN steps_sync_fn steps_sync_p;
extern FR_HIDDEN int (*cpu_step_reads_p)(void); /* absent: an older library, reads on */
/* resolve_steps() (fastrec.c): nonzero when the step state's exports and
 * resolve()'s are all there. */
FR_HIDDEN int resolve_steps(void);

/* The state a Hook shares with profiler.collect.tensors (fastrec.c:
 * configure(), sampling(); the interned names: PyInit__fastrec). */
extern FR_HIDDEN PyObject *g_ids, *g_new_id, *g_redops, *g_dtypes, *g_dtype_info, *g_warn;
extern FR_HIDDEN unsigned long long g_count;
extern FR_HIDDEN unsigned g_gen;
extern FR_HIDDEN unsigned long long g_calls, g_first, g_every;
extern FR_HIDDEN PyObject *s_numel, *s_dtype, *s_data_ptr, *s_process_set_id, *s_name,
    *s_root_rank, *s_op, *s_process_set, *s_empty;

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

static inline long long thread_cpu_ns(void)
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

/* Invocation number `call` of a hook of `kind`, measured as `m` (fastrec.c). */
FR_HIDDEN void meter_account(const meter *m, int kind, unsigned long long call);

/* ------------------------------------------------------------------------ */
/* PyTorch's field reader as the hook reads it (fastrec.c: loaded and put in
 * use by torch_fields_load and torch_fields_use). */
typedef int (*fields_fn)(PyObject *, int64_t *, int32_t *, uint64_t *);
extern FR_HIDDEN fields_fn torch_fields_p; /* the reader, once in use (else NULL) */
extern FR_HIDDEN PyTypeObject *torch_types[2];
#define SCALAR_TYPES 64
extern FR_HIDDEN int32_t st_code[SCALAR_TYPES], st_size[SCALAR_TYPES];

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

/* ------------------------------------------------------------------------ */
/* The types (fastrec_hook.c, fastrec_step.c) and the module function the
 * Hook's file defines (fastrec_hook.c). */
extern FR_HIDDEN PyTypeObject HookType, StepHookType;
FR_HIDDEN PyObject *fr_oldest_pending(PyObject *self, PyObject *live);

#endif
