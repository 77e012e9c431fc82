/*
 * cudart_standin.c -- a STAND-IN for the CUDA runtime, for tests only.
 *
 * Built by tests/test_nccl_standin.py as libcudart.so.12 (soname
 * libcudart.so.12) in a temporary directory.  It is not CUDA: "device memory"
 * is host memory and a "stream" is a host structure with a virtual queue.
 *
 * Time model: each stream has busy_until (CLOCK_MONOTONIC ns).  Work enqueued
 * on a stream (standin_stream_enqueue, used by the NCCL stand-in) starts at
 * max(now, busy_until) and lasts its duration.  An event recorded on a stream
 * gets timestamp max(now, busy_until): the moment the stream "executes" it.
 * cudaEventQuery reports cudaErrorNotReady until the host clock passes that
 * timestamp; cudaEventElapsedTime is the difference of two timestamps.
 *
 * Synchronization is counted per stream (cudaStreamSynchronize,
 * cudaEventSynchronize on an event last recorded on it, cudaDeviceSynchronize
 * on its device, cudaStreamWaitEvent making it wait), so tests can assert that
 * the profiler never synchronized or delayed an application stream.  The
 * "last error" is kept per thread as CUDA does (cudaErrorNotReady from a query
 * is not sticky), so tests can assert the profiler left no error behind.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};

typedef struct standin_stream {
    int64_t busy_until;
    int device;
    int capturing;
    uint64_t syncs;
    unsigned flags;
} standin_stream;

typedef struct standin_event {
    int64_t ts;
    int recorded;
    int device;
    unsigned flags;
    standin_stream *stream;
} standin_event;

typedef standin_stream *cudaStream_t;
typedef standin_event *cudaEvent_t;

#define MAX_DEV 8
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static standin_stream legacy[MAX_DEV];
static __thread int cur_dev;
static __thread cudaError_t last_error;
static __thread int capture_mode;
static _Atomic uint64_t n_syncs, n_events_created, n_events_live, n_records, n_queries;
static _Atomic uint64_t n_mode_exchanges, n_device_syncs;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
    for (;;) {
        int64_t d = t - now_ns();
        if (d <= 0) return;
        struct timespec ts = {d / 1000000000LL, d % 1000000000LL};
        nanosleep(&ts, NULL);
    }
}

static int n_devices(void)
{
    const char *v = getenv("STANDIN_CUDA_DEVICES");
    int n = v && *v ? atoi(v) : 2;
    return n < 1 ? 1 : n > MAX_DEV ? MAX_DEV : n;
}

static cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

static standin_stream *resolve(cudaStream_t s)
{
    /* 0 (legacy default), 1 (cudaStreamLegacy), 2 (cudaStreamPerThread) */
    if ((uintptr_t)s <= 2) {
        standin_stream *l = &legacy[cur_dev];
        l->device = cur_dev;
        return l;
    }
    return s;
}

API cudaError_t cudaGetDeviceCount(int *n)
{
    *n = n_devices();
    return cudaSuccess;
}

API cudaError_t cudaGetDevice(int *d)
{
    if (!d) return fail(cudaErrorInvalidValue);
    *d = cur_dev;
    return cudaSuccess;
}

API cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= n_devices()) return fail(cudaErrorInvalidDevice);
    cur_dev = d;
    return cudaSuccess;
}

API cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = 12000;
    return cudaSuccess;
}

API cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

API cudaError_t cudaPeekAtLastError(void) { return last_error; }

API const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error (stand-in)" : "error (stand-in)";
}

API cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(2);
}

API cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    (void)kind;
    memmove(dst, src, n);
    return cudaSuccess;
}

API cudaError_t cudaMemset(void *dst, int v, size_t n)
{
    memset(dst, v, n);
    return cudaSuccess;
}

API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    standin_stream *x = calloc(1, sizeof *x);
    x->device = cur_dev;
    x->flags = flags;
    *s = x;
    return cudaSuccess;
}

API cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if ((uintptr_t)s > 2) free(s);
    return cudaSuccess;
}

API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    standin_stream *x = resolve(s);
    pthread_mutex_lock(&mu);
    int64_t t = x->busy_until;
    x->syncs++;
    pthread_mutex_unlock(&mu);
    atomic_fetch_add(&n_syncs, 1);
    sleep_until(t);
    return cudaSuccess;
}

API cudaError_t cudaStreamQuery(cudaStream_t s)
{
    standin_stream *x = resolve(s);
    pthread_mutex_lock(&mu);
    int ready = now_ns() >= x->busy_until;
    pthread_mutex_unlock(&mu);
    return ready ? cudaSuccess : cudaErrorNotReady;
}

API cudaError_t cudaDeviceSynchronize(void)
{
    /* Counted on the device's legacy stream and globally. */
    pthread_mutex_lock(&mu);
    legacy[cur_dev].syncs++;
    pthread_mutex_unlock(&mu);
    atomic_fetch_add(&n_syncs, 1);
    atomic_fetch_add(&n_device_syncs, 1);
    return cudaSuccess;
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    standin_event *x = calloc(1, sizeof *x);
    x->device = cur_dev;
    x->flags = flags;
    *e = x;
    atomic_fetch_add(&n_events_created, 1);
    atomic_fetch_add(&n_events_live, 1);
    return cudaSuccess;
}

API cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

API cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    free(e);
    atomic_fetch_sub(&n_events_live, 1);
    return cudaSuccess;
}

API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    standin_stream *x = resolve(s);
    if (x->device != e->device) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&mu);
    int64_t t = now_ns();
    e->ts = x->busy_until > t ? x->busy_until : t;
    e->recorded = 1;
    e->stream = x;
    pthread_mutex_unlock(&mu);
    atomic_fetch_add(&n_records, 1);
    return cudaSuccess;
}

API cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    atomic_fetch_add(&n_queries, 1);
    pthread_mutex_lock(&mu);
    int ready = !e->recorded || now_ns() >= e->ts;
    pthread_mutex_unlock(&mu);
    return ready ? cudaSuccess : cudaErrorNotReady; /* NotReady: not sticky */
}

API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&mu);
    int64_t t = e->recorded ? e->ts : 0;
    if (e->stream) e->stream->syncs++;
    pthread_mutex_unlock(&mu);
    atomic_fetch_add(&n_syncs, 1);
    sleep_until(t);
    return cudaSuccess;
}

API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!a || !b || !a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
    if (a->device != b->device) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&mu);
    int64_t t = now_ns();
    int ready = t >= a->ts && t >= b->ts;
    int64_t d = b->ts - a->ts;
    pthread_mutex_unlock(&mu);
    if (!ready) return fail(cudaErrorNotReady);
    *ms = (float)((double)d / 1e6);
    return cudaSuccess;
}

API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    standin_stream *x = resolve(s);
    pthread_mutex_lock(&mu);
    if (e && e->recorded && e->ts > x->busy_until) x->busy_until = e->ts;
    x->syncs++; /* a dependency added to the stream counts as interference */
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

API cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status)
{
    standin_stream *x = resolve(s);
    *status = x->capturing ? 1 : 0;
    return cudaSuccess;
}

API cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode)
{
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    atomic_fetch_add(&n_mode_exchanges, 1);
    return cudaSuccess;
}

/* ---- stand-in controls and counters (not CUDA API) ---------------------- */

/* Enqueue dur_ns of work on a stream; returns its virtual start time. */
API int64_t standin_stream_enqueue(cudaStream_t s, int64_t dur_ns)
{
    standin_stream *x = resolve(s);
    pthread_mutex_lock(&mu);
    int64_t t = now_ns();
    int64_t start = x->busy_until > t ? x->busy_until : t;
    x->busy_until = start + dur_ns;
    pthread_mutex_unlock(&mu);
    return start;
}

API uint64_t standin_stream_syncs(cudaStream_t s)
{
    standin_stream *x = resolve(s);
    pthread_mutex_lock(&mu);
    uint64_t n = x->syncs;
    pthread_mutex_unlock(&mu);
    return n;
}

API void standin_stream_set_capturing(cudaStream_t s, int on) { resolve(s)->capturing = on; }
API uint64_t standin_total_syncs(void) { return atomic_load(&n_syncs); }
API uint64_t standin_device_syncs(void) { return atomic_load(&n_device_syncs); }
API uint64_t standin_events_created(void) { return atomic_load(&n_events_created); }
API uint64_t standin_events_live(void) { return atomic_load(&n_events_live); }
API uint64_t standin_event_records(void) { return atomic_load(&n_records); }
API uint64_t standin_event_queries(void) { return atomic_load(&n_queries); }
API uint64_t standin_mode_exchanges(void) { return atomic_load(&n_mode_exchanges); }
API int64_t standin_now_ns(void) { return now_ns(); }
