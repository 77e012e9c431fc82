/*
 * cuda_rt_internal.h -- what the files of device timing share:
 * cuda_rt_load.c (the CUDA runtime, found lazily, and the settings),
 * cuda_rt_pool.c (the pools of event pairs, the anchor, collection: by the
 * recording path, the helper thread and the final flush) and cuda_rt.c (the
 * per-call interface nccl.c uses, the counters' JSON, the backend).  Each
 * file uses only those before it.  Not for nccl.c: it sees cuda_rt.h.  The
 * method and its error: cuda_rt.c.
 */
#ifndef HVPROF_CUDA_RT_INTERNAL_H
#define HVPROF_CUDA_RT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cuda_rt.h"

/* ------------------------------------------------------------------------ */
/* The CUDA runtime API subset we use, declared here (no cuda_runtime.h).    */

typedef int cudaError_t;
typedef void *cudaEvent_t;
typedef void *cudaStream_t;
enum {
    CU_SUCCESS = 0,
    CU_NOT_READY = 600,                /* cudaErrorNotReady */
    CU_EVENT_DEFAULT = 0,              /* cudaEventDefault: timing enabled */
    CU_STREAM_NON_BLOCKING = 1,        /* cudaStreamNonBlocking */
    CU_CAPTURE_STATUS_NONE = 0,        /* cudaStreamCaptureStatusNone */
    CU_CAPTURE_MODE_RELAXED = 2,       /* cudaStreamCaptureModeRelaxed */
};

typedef struct cuda_api {
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *, unsigned);
    cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
    cudaError_t (*EventQuery)(cudaEvent_t);
    cudaError_t (*EventElapsedTime)(float *, cudaEvent_t, cudaEvent_t);
    cudaError_t (*EventDestroy)(cudaEvent_t);
    cudaError_t (*GetDevice)(int *);
    cudaError_t (*StreamCreateWithFlags)(cudaStream_t *, unsigned);
    /* optional */
    cudaError_t (*SetDevice)(int);
    cudaError_t (*StreamIsCapturing)(cudaStream_t, int *);
    cudaError_t (*ThreadExchangeStreamCaptureMode)(int *);
    cudaError_t (*GetLastError)(void);
    cudaError_t (*RuntimeGetVersion)(int *);
} cuda_api;

#define MAX_DEVICES 64

struct hvprof_devpair {
    cudaEvent_t ev0, ev1;
    uint32_t index;
    hvprof_record rec;        /* the device record, times filled at collection */
};

typedef struct devpool {
    int device;
    uint32_t npairs;
    hvprof_devpair *pairs;
    /* free pairs: a stack under a spin lock (a handful of instructions) */
    atomic_flag free_lock;
    _Atomic uint32_t nfree;
    uint32_t *free_stack;
    /* pending pairs in issue order: producers append under ring_lock and
     * publish tail; the collector (collect_lock) consumes from head.  At most
     * npairs entries are ever pending, so the ring never overflows. */
    atomic_flag ring_lock;
    uint32_t *ring;
    _Atomic uint64_t tail;
    _Atomic uint64_t head;
    /* anchor (collector lock) */
    cudaStream_t priv;
    cudaEvent_t anchor[2];
    int anchor_cur;           /* -1: none */
    uint64_t anchor_ticks;    /* host ticks of the anchor's device time */
    uint64_t anchor_taken;    /* host ticks when it was taken */
} devpool;

/* ------------------------------------------------------------------------ */
/* cuda_rt_load.c: the runtime and the settings.                             */

extern cuda_api cu;                   /* the runtime's entry points */
extern pthread_mutex_t load_lock;     /* loading, and creating a pool */
extern _Atomic int cuda_state;        /* 0 untried, 1 ok, -1 unavailable */
extern char cuda_path[256];
extern int cuda_version;
extern _Atomic int forked;            /* a forked child: no CUDA */

/* settings, read once at load */
extern int dev_on;
extern uint32_t pool_pairs;
extern int poll_ms;
extern int64_t anchor_ms;
extern int dev_flush_ms;

/* cuda_load's slow half: the first call of the process loads the runtime. */
int cuda_load_slow(void);

/* 1 when the runtime is usable, -1 when not (decided once per process). */
static inline int cuda_load(void)
{
    int s = atomic_load_explicit(&cuda_state, memory_order_acquire);
    if (HVPROF_LIKELY(s != 0)) return s;
    return cuda_load_slow();
}

/* ------------------------------------------------------------------------ */
/* cuda_rt_pool.c: the pools and their collection.                           */

extern _Atomic(devpool *) pools[MAX_DEVICES];
extern pthread_mutex_t collect_lock;
extern _Atomic int helper_alive;      /* the helper thread runs and collects */

/* counters */
extern _Atomic uint64_t c_device_records, c_record_dropped, c_query_errors;
extern _Atomic uint64_t c_unfinished, c_by_app, c_by_helper, c_by_flush, c_anchors;
extern _Atomic uint64_t c_anchor_fail;
extern _Atomic int64_t c_anchor_err_max, c_anchor_err_last; /* ticks */

/* pool_get's slow half: create device's pool, once (a failure is final). */
devpool *pool_get_slow(int device);

/* Opportunistic collection of at most max pairs of dp from the recording
 * path: trylock only, never waits. */
void poll_dev(devpool *dp, uint32_t max);

/* ------------------------------------------------------------------------ */
/* Small helpers.                                                            */

static inline void spin_lock(atomic_flag *f)
{
    while (atomic_flag_test_and_set_explicit(f, memory_order_acquire)) {
    }
}

static inline void spin_unlock(atomic_flag *f)
{
    atomic_flag_clear_explicit(f, memory_order_release);
}

static inline void clear_cuda_error(void)
{
    if (cu.GetLastError) (void)cu.GetLastError();
}

static inline double ticks_per_ns(void)
{
    hvprof_file_header *h = hvprof_header();
    return (h && h->ticks_per_ns > 0) ? h->ticks_per_ns : 1.0;
}

/* ------------------------------------------------------------------------ */
/* Pools (the per-call part).                                                */

static inline uint32_t pending_of(devpool *dp)
{
    return (uint32_t)(atomic_load_explicit(&dp->tail, memory_order_acquire) -
                      atomic_load_explicit(&dp->head, memory_order_acquire));
}

static inline void free_push(devpool *dp, uint32_t idx)
{
    spin_lock(&dp->free_lock);
    uint32_t n = atomic_load_explicit(&dp->nfree, memory_order_relaxed);
    dp->free_stack[n] = idx;
    atomic_store_explicit(&dp->nfree, n + 1, memory_order_relaxed);
    spin_unlock(&dp->free_lock);
}

static inline hvprof_devpair *free_pop(devpool *dp)
{
    hvprof_devpair *p = NULL;
    spin_lock(&dp->free_lock);
    uint32_t n = atomic_load_explicit(&dp->nfree, memory_order_relaxed);
    if (n) {
        p = &dp->pairs[dp->free_stack[n - 1]];
        atomic_store_explicit(&dp->nfree, n - 1, memory_order_relaxed);
    }
    spin_unlock(&dp->free_lock);
    return p;
}

static inline devpool *pool_of_pair(const hvprof_devpair *p)
{
    for (int d = 0; d < MAX_DEVICES; d++) {
        devpool *dp = atomic_load_explicit(&pools[d], memory_order_acquire);
        if (dp && p >= dp->pairs && p < dp->pairs + dp->npairs) return dp;
    }
    return NULL;
}

static inline devpool *pool_get(int device)
{
    if (device < 0 || device >= MAX_DEVICES) return NULL;
    devpool *dp = atomic_load_explicit(&pools[device], memory_order_acquire);
    if (HVPROF_LIKELY(dp != NULL)) return dp;
    return pool_get_slow(device);
}

#endif
