/*
 * cuda_rt.c -- device time for NCCL calls without synchronizing the job.
 *
 * The CUDA runtime is found lazily, at the first NCCL call that wants device
 * time: $HOROVOD_PROFILE_CUDART (a path, or "none"), else a libcudart already
 * loaded in the process (found with dl_iterate_phdr: the application's own
 * copy), else dlopen of libcudart.so.13 / .12 / .11.0 / libcudart.so.  No
 * link-time dependency: where no runtime (or no driver) exists, NCCL calls
 * still get their host record, flagged DEVICE_PENDING, and the miss is
 * counted.
 *
 * Event pairs.  Each CUDA device the job uses gets a fixed pool of event
 * pairs (HOROVOD_PROFILE_NCCL_EVENTS, default 1024), created once, on first
 * use of that device: no allocation and no event creation per call.  A call
 * takes a free pair, records ev0 on the call's stream, calls NCCL, records
 * ev1, and queues the pair in the device's pending ring (issue order).  When
 * every pair is pending the call gets no device record: its host record
 * carries DEVICE_PENDING and `pool_empty` is counted.
 *
 * Collection never synchronizes an application stream: pairs are collected
 * in issue order by whoever holds the collector lock, when cudaEventQuery on
 * ev1 says the work is done:
 *   - the recording path (trylock only: an NCCL call never waits), every 16th
 *     call or when under a quarter of the pool is free, at most 4 pairs;
 *   - a helper thread ("hvprof-devtime"), every HOROVOD_PROFILE_NCCL_POLL_MS
 *     (default 5 ms; 0 = no thread), all completed pairs;
 *   - hvprof_dev_finish(timeout), through hvprof_nccl_finish (nccl.c) at
 *     exit: from an atexit handler registered at the first NCCL
 *     communicator (after the CUDA runtime initialised, so it runs before the
 *     runtime's own teardown), and from the Python runtime / hvprof_close (the
 *     NCCL backend's finish hook) before the raw file is read.  It stops the
 *     helper thread, then polls (hvprof_dev_flush, which nccl.c exports as
 *     hvprof_nccl_flush) with cudaEventQuery (sleeping 100 us between
 *     rounds) up to the timeout (default HOROVOD_PROFILE_NCCL_FLUSH_MS,
 *     1000); pairs still pending after it are counted as `unfinished`.
 * A collected pair becomes one DEVICE record on the stream's track, written
 * on the collecting thread.  Threads that query events set their stream
 * capture mode to relaxed around it, so a CUDA graph captured by another
 * thread is never invalidated; calls on a stream that is being captured get
 * no events at all (counted as `capture`).  A failed CUDA call's error is
 * cleared with cudaGetLastError so the application never sees it.
 *
 * Host axis.  cudaEventElapsedTime(ev0, ev1) gives the device duration.  The
 * start is placed on the host tick axis through an anchor: an event recorded
 * on a private non-blocking stream of the same device at host time a and
 * polled until complete at host time b; the anchor's device time lies in
 * [a, b], and we take T0 = (a + b) / 2, error <= (b - a) / 2.  The best of
 * three tries is kept.  Then t_start = T0 + elapsed(anchor, ev0) (negative
 * when the anchor is later), t_end = t_start + elapsed(ev0, ev1).  The anchor
 * is re-taken when older than HOROVOD_PROFILE_NCCL_ANCHOR_MS (default 1000)
 * at collection time, which bounds (1) the float32 rounding of elapsed()
 * (2^-24 of the span: ~60 ns at 1 s) and (2) the drift between the GPU timer
 * and the host clock (a few ppm: a few us per second).  Total error of a
 * device start on the host axis: anchor half-bracket (reported as
 * anchor_err_ns_max, typically a few us) + event resolution (~0.5 us) +
 * drift.  Durations carry only the event resolution.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static struct {
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
} cu;

#define MAX_DEVICES 64
#define DEFAULT_PAIRS 1024
#define ANCHOR_TRIES 3

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

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int cuda_state;              /* 0 untried, 1 ok, -1 unavailable */
static char cuda_path[256];
static int cuda_version;
static _Atomic int forked;
static _Atomic(devpool *) pools[MAX_DEVICES];
static _Atomic int pool_failed[MAX_DEVICES];
static pthread_mutex_t collect_lock = PTHREAD_MUTEX_INITIALIZER;

/* settings, read once at load */
static int dev_on = 1;
static uint32_t pool_pairs = DEFAULT_PAIRS;
static int poll_ms = 5;
static int64_t anchor_ms = 1000;
static int flush_ms = 1000;

/* helper thread */
static _Atomic int helper_started;
static _Atomic int helper_stop;
static _Atomic int helper_alive;   /* the thread runs and collects */

/* counters */
static _Atomic uint64_t c_miss[HVPROF_DEV_MISS_N];
static _Atomic uint64_t c_submitted, c_records, c_record_dropped, c_query_errors;
static _Atomic uint64_t c_unfinished, c_by_app, c_by_helper, c_by_flush, c_anchors;
static _Atomic uint64_t c_anchor_fail;
static _Atomic int64_t c_anchor_err_max, c_anchor_err_last; /* ticks */

static const char *const MISS_NAMES[HVPROF_DEV_MISS_N] = {
    "none", "off", "no_cuda", "pool_empty", "capture", "record_error", "in_progress",
};

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

static void clear_cuda_error(void)
{
    if (cu.GetLastError) (void)cu.GetLastError();
}

static double ticks_per_ns(void)
{
    hvprof_file_header *h = hvprof_header();
    return (h && h->ticks_per_ns > 0) ? h->ticks_per_ns : 1.0;
}

static inline int64_t hv_round(double x)
{
    return (int64_t)(x >= 0 ? x + 0.5 : x - 0.5);
}

/* A setting's value (hvprof_setting) as a number in [lo, hi], else dflt. */
static long env_long(const char *v, long dflt, long lo, long hi)
{
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end) return dflt;
    return x < lo ? lo : x > hi ? hi : x;
}

static int helper_running(void);

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------ */
/* Loading the runtime.                                                      */

static int find_loaded_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    if (!name || !*name) return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcudart", 9) != 0 || !strstr(base, ".so")) return 0;
    snprintf((char *)data, sizeof cuda_path, "%s", name);
    return 1;
}

static int resolve_runtime(void *h)
{
#define REQ(f) if (!(*(void **)&cu.f = dlsym(h, "cuda" #f))) return -1
#define OPT(f) *(void **)&cu.f = dlsym(h, "cuda" #f)
    REQ(EventCreateWithFlags);
    REQ(EventRecord);
    REQ(EventQuery);
    REQ(EventElapsedTime);
    REQ(EventDestroy);
    REQ(GetDevice);
    REQ(StreamCreateWithFlags);
    OPT(SetDevice);
    OPT(StreamIsCapturing);
    OPT(ThreadExchangeStreamCaptureMode);
    OPT(GetLastError);
    OPT(RuntimeGetVersion);
#undef REQ
#undef OPT
    int dev = -1;
    if (cu.GetDevice(&dev) != CU_SUCCESS || dev < 0) {
        clear_cuda_error();
        return -1;
    }
    if (cu.RuntimeGetVersion) cu.RuntimeGetVersion(&cuda_version);
    return 0;
}

static void read_settings(void)
{
    dev_on = (int)env_long(hvprof_setting("HOROVOD_PROFILE_NCCL_DEVICE"), 1, 0, 1);
    pool_pairs = (uint32_t)env_long(hvprof_setting("HOROVOD_PROFILE_NCCL_EVENTS"), DEFAULT_PAIRS,
                                    2, 65536);
    poll_ms = (int)env_long(hvprof_setting("HOROVOD_PROFILE_NCCL_POLL_MS"), 5, 0, 10000);
    anchor_ms = env_long(hvprof_setting("HOROVOD_PROFILE_NCCL_ANCHOR_MS"), 1000, 1, 3600000);
    flush_ms = (int)env_long(hvprof_setting("HOROVOD_PROFILE_NCCL_FLUSH_MS"), 1000, 0, 600000);
}

/* 1 when the runtime is usable, -1 when not (decided once per process). */
static int cuda_load(void)
{
    int s = atomic_load_explicit(&cuda_state, memory_order_acquire);
    if (HVPROF_LIKELY(s != 0)) return s;
    pthread_mutex_lock(&load_lock);
    s = atomic_load(&cuda_state);
    if (s == 0) {
        read_settings();
        s = -1;
        const char *forced = hvprof_setting("HOROVOD_PROFILE_CUDART");
        char found[sizeof cuda_path] = "";
        if (forced && *forced) {
            if (strcmp(forced, "none") != 0) snprintf(found, sizeof found, "%s", forced);
        } else {
            dl_iterate_phdr(find_loaded_cudart, found);
        }
        static const char *const names[] = {"libcudart.so.13", "libcudart.so.12",
                                            "libcudart.so.11.0", "libcudart.so"};
        const char *cands[6];
        int nc = 0;
        if (forced && *forced) {
            if (found[0]) cands[nc++] = found;
        } else {
            if (found[0]) cands[nc++] = found;
            for (size_t i = 0; i < sizeof names / sizeof *names; i++) cands[nc++] = names[i];
        }
        for (int i = 0; i < nc; i++) {
            void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
            if (h && resolve_runtime(h) == 0) {
                snprintf(cuda_path, sizeof cuda_path, "%s", cands[i]);
                s = 1;
                break;
            }
            /* A runtime that cannot reach a device stays loaded: unloading a
             * CUDA runtime is not safe.  Try the next name. */
            memset(&cu, 0, sizeof cu);
        }
        atomic_store_explicit(&cuda_state, s, memory_order_release);
    }
    pthread_mutex_unlock(&load_lock);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Pools.                                                                    */

static uint32_t pending_of(devpool *dp)
{
    return (uint32_t)(atomic_load_explicit(&dp->tail, memory_order_acquire) -
                      atomic_load_explicit(&dp->head, memory_order_acquire));
}

static void free_push(devpool *dp, uint32_t idx)
{
    spin_lock(&dp->free_lock);
    uint32_t n = atomic_load_explicit(&dp->nfree, memory_order_relaxed);
    dp->free_stack[n] = idx;
    atomic_store_explicit(&dp->nfree, n + 1, memory_order_relaxed);
    spin_unlock(&dp->free_lock);
}

static hvprof_devpair *free_pop(devpool *dp)
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

static devpool *pool_of_pair(const hvprof_devpair *p)
{
    for (int d = 0; d < MAX_DEVICES; d++) {
        devpool *dp = atomic_load_explicit(&pools[d], memory_order_acquire);
        if (dp && p >= dp->pairs && p < dp->pairs + dp->npairs) return dp;
    }
    return NULL;
}

/* Take the anchor (collector lock held, or the pool not yet published). */
static int take_anchor(devpool *dp)
{
    int best = -1;
    uint64_t best_w = UINT64_MAX, best_mid = 0;
    double tpn = ticks_per_ns();
    uint64_t limit = (uint64_t)(20e6 * tpn); /* 20 ms per try at most */
    for (int k = 0; k < ANCHOR_TRIES; k++) {
        int e = best == 0 ? 1 : 0;
        uint64_t a = hvprof_ticks();
        if (cu.EventRecord(dp->anchor[e], dp->priv) != CU_SUCCESS) goto fail;
        for (;;) {
            cudaError_t r = cu.EventQuery(dp->anchor[e]);
            if (r == CU_SUCCESS) break;
            if (r != CU_NOT_READY) goto fail;
            if (hvprof_ticks() - a > limit) goto fail;
        }
        uint64_t b = hvprof_ticks();
        if (b - a < best_w) {
            best_w = b - a;
            best = e;
            best_mid = a + (b - a) / 2;
        }
    }
    dp->anchor_cur = best;
    dp->anchor_ticks = best_mid;
    dp->anchor_taken = hvprof_ticks();
    int64_t err = (int64_t)(best_w / 2);
    atomic_store(&c_anchor_err_last, err);
    int64_t m = atomic_load(&c_anchor_err_max);
    while (err > m && !atomic_compare_exchange_weak(&c_anchor_err_max, &m, err)) {
    }
    atomic_fetch_add(&c_anchors, 1);
    return 0;
fail:
    clear_cuda_error();
    atomic_fetch_add(&c_anchor_fail, 1);
    return -1;
}

static void relaxed_mode_enter(int *saved)
{
    *saved = CU_CAPTURE_MODE_RELAXED;
    if (cu.ThreadExchangeStreamCaptureMode &&
        cu.ThreadExchangeStreamCaptureMode(saved) != CU_SUCCESS) {
        clear_cuda_error();
        *saved = -1;
    }
}

static void relaxed_mode_leave(int *saved)
{
    if (*saved >= 0 && cu.ThreadExchangeStreamCaptureMode) cu.ThreadExchangeStreamCaptureMode(saved);
}

/* Turn one completed pair into its DEVICE record (collector lock held). */
static void write_device_record(devpool *dp, hvprof_devpair *p, int app_thread)
{
    float dur_ms = 0, off_ms = 0;
    if (cu.EventElapsedTime(&dur_ms, p->ev0, p->ev1) != CU_SUCCESS) goto error;
    double tpn = ticks_per_ns();
    /* A stale anchor is re-taken by the helper thread or the final flush; an
     * application thread takes one only when there is none, or no helper. */
    int stale = dp->anchor_cur < 0 ||
                hvprof_ticks() - dp->anchor_taken > (uint64_t)((double)anchor_ms * 1e6 * tpn);
    if (stale && (dp->anchor_cur < 0 || !app_thread || !helper_running()))
        take_anchor(dp); /* on failure the previous anchor (if any) stays */
    if (dp->anchor_cur < 0) goto error;
    if (cu.EventElapsedTime(&off_ms, dp->anchor[dp->anchor_cur], p->ev0) != CU_SUCCESS)
        goto error;
    int64_t start = (int64_t)dp->anchor_ticks + hv_round((double)off_ms * 1e6 * tpn);
    int64_t dur = hv_round((double)dur_ms * 1e6 * tpn);
    if (dur < 0) dur = 0;
    hvprof_record rec = p->rec; /* track: the stream's */
    rec.t_start = (uint64_t)start;
    rec.t_end = (uint64_t)(start + dur);
    if (hvprof_emit(&rec) != 0) {
        atomic_fetch_add(&c_record_dropped, 1);
        return;
    }
    atomic_fetch_add(&c_records, 1);
    return;
error:
    clear_cuda_error();
    atomic_fetch_add(&c_query_errors, 1);
}

/* Collect up to max completed pairs of dp in issue order (collector lock
 * held).  Returns the number collected. */
static uint32_t collect(devpool *dp, uint32_t max, _Atomic uint64_t *who)
{
    int app_thread = who == &c_by_app;
    uint32_t n = 0;
    uint64_t head = atomic_load_explicit(&dp->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&dp->tail, memory_order_acquire);
    while (head < tail && n < max) {
        hvprof_devpair *p = &dp->pairs[dp->ring[head % dp->npairs]];
        cudaError_t r = cu.EventQuery(p->ev1);
        if (r == CU_NOT_READY) break;
        if (r == CU_SUCCESS) {
            write_device_record(dp, p, app_thread);
        } else {
            clear_cuda_error();
            atomic_fetch_add(&c_query_errors, 1);
        }
        head++;
        atomic_store_explicit(&dp->head, head, memory_order_release);
        free_push(dp, p->index);
        n++;
    }
    if (n) atomic_fetch_add(who, n);
    return n;
}

static void *helper_main(void *arg)
{
    int dev = (int)(intptr_t)arg, cur = -1;
    pthread_setname_np(pthread_self(), "hvprof-devtime");
    /* Bind to a device the job uses before any other runtime call, so this
     * thread never creates a context on device 0 of a multi-GPU node. */
    if (cu.SetDevice && cu.SetDevice(dev) == CU_SUCCESS) cur = dev;
    int mode;
    relaxed_mode_enter(&mode); /* for the thread's lifetime */
    while (!atomic_load(&helper_stop)) {
        sleep_us((long)poll_ms * 1000);
        if (atomic_load(&forked)) break;
        for (int d = 0; d < MAX_DEVICES; d++) {
            devpool *dp = atomic_load_explicit(&pools[d], memory_order_acquire);
            if (!dp || pending_of(dp) == 0) continue;
            pthread_mutex_lock(&collect_lock);
            /* Checked under the lock: once hvprof_dev_finish() has taken
             * the lock, this thread makes no further CUDA call. */
            if (atomic_load(&helper_stop)) {
                pthread_mutex_unlock(&collect_lock);
                break;
            }
            if (cur != d && cu.SetDevice && cu.SetDevice(d) == CU_SUCCESS) cur = d;
            collect(dp, UINT32_MAX, &c_by_helper);
            pthread_mutex_unlock(&collect_lock);
        }
    }
    atomic_store(&helper_alive, 0);
    return NULL;
}

static int helper_running(void) { return atomic_load(&helper_alive); }

static void start_helper(int device)
{
    if (atomic_exchange(&helper_started, 1)) return;
    if (poll_ms <= 0 || atomic_load(&helper_stop)) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* the thread inherits: no signals */
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    atomic_store(&helper_alive, 1);
    if (pthread_create(&t, &attr, helper_main, (void *)(intptr_t)device) != 0) {
        atomic_store(&helper_alive, 0);
        hvprof_warn("cannot start the device-time helper thread: NCCL device times are "
                    "collected by later NCCL calls and at exit only");
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void pool_destroy(devpool *dp, uint32_t created)
{
    for (uint32_t i = 0; i < created; i++) {
        if (dp->pairs[i].ev0) cu.EventDestroy(dp->pairs[i].ev0);
        if (dp->pairs[i].ev1) cu.EventDestroy(dp->pairs[i].ev1);
    }
    for (int k = 0; k < 2; k++)
        if (dp->anchor[k]) cu.EventDestroy(dp->anchor[k]);
    clear_cuda_error();
    free(dp->pairs);
    free(dp->free_stack);
    free(dp->ring);
    free(dp);
}

static devpool *pool_create(int device)
{
    int cur = -1, switched = 0;
    if (cu.GetDevice(&cur) != CU_SUCCESS) {
        clear_cuda_error();
        return NULL;
    }
    if (cur != device) {
        if (!cu.SetDevice || cu.SetDevice(device) != CU_SUCCESS) {
            clear_cuda_error();
            return NULL;
        }
        switched = 1;
    }
    uint32_t n = pool_pairs, created = 0;
    devpool *dp = calloc(1, sizeof *dp);
    if (!dp) goto out_fail_nofree;
    dp->device = device;
    dp->npairs = n;
    dp->anchor_cur = -1;
    atomic_flag_clear(&dp->free_lock);
    atomic_flag_clear(&dp->ring_lock);
    dp->pairs = calloc(n, sizeof *dp->pairs);
    dp->free_stack = calloc(n, sizeof *dp->free_stack);
    dp->ring = calloc(n, sizeof *dp->ring);
    if (!dp->pairs || !dp->free_stack || !dp->ring) goto out_fail;
    if (cu.StreamCreateWithFlags(&dp->priv, CU_STREAM_NON_BLOCKING) != CU_SUCCESS) goto out_fail;
    if (cu.EventCreateWithFlags(&dp->anchor[0], CU_EVENT_DEFAULT) != CU_SUCCESS ||
        cu.EventCreateWithFlags(&dp->anchor[1], CU_EVENT_DEFAULT) != CU_SUCCESS)
        goto out_fail;
    for (; created < n; created++) {
        hvprof_devpair *p = &dp->pairs[created];
        p->index = created;
        if (cu.EventCreateWithFlags(&p->ev0, CU_EVENT_DEFAULT) != CU_SUCCESS ||
            cu.EventCreateWithFlags(&p->ev1, CU_EVENT_DEFAULT) != CU_SUCCESS) {
            created++;
            goto out_fail;
        }
        dp->free_stack[created] = n - 1 - created; /* pop order: 0, 1, 2 ... */
    }
    atomic_store(&dp->nfree, n);
    take_anchor(dp); /* retried at collection if it failed */
    if (switched) cu.SetDevice(cur);
    return dp;
out_fail:
    pool_destroy(dp, created);
out_fail_nofree:
    clear_cuda_error();
    if (switched) cu.SetDevice(cur);
    return NULL;
}

static devpool *pool_get(int device)
{
    if (device < 0 || device >= MAX_DEVICES) return NULL;
    devpool *dp = atomic_load_explicit(&pools[device], memory_order_acquire);
    if (HVPROF_LIKELY(dp != NULL)) return dp;
    if (atomic_load_explicit(&pool_failed[device], memory_order_relaxed)) return NULL;
    pthread_mutex_lock(&load_lock);
    dp = atomic_load(&pools[device]);
    if (!dp && !atomic_load(&pool_failed[device])) {
        dp = pool_create(device);
        if (dp) {
            atomic_store_explicit(&pools[device], dp, memory_order_release);
            start_helper(device);
        } else {
            atomic_store(&pool_failed[device], 1);
            hvprof_warn("no CUDA events for device %d: NCCL calls on it get no device time",
                        device);
        }
    }
    pthread_mutex_unlock(&load_lock);
    return dp;
}

/* ------------------------------------------------------------------------ */
/* The interface used by nccl.c.                                             */

int hvprof_cuda_current_device(void)
{
    if (cuda_load() != 1) return -1;
    int d = -1;
    if (cu.GetDevice(&d) != CU_SUCCESS) {
        clear_cuda_error();
        return -1;
    }
    return d;
}

void hvprof_dev_count_miss(int miss)
{
    if (miss > 0 && miss < HVPROF_DEV_MISS_N) atomic_fetch_add(&c_miss[miss], 1);
}

static void poll_dev(devpool *dp, uint32_t max)
{
    if (pthread_mutex_trylock(&collect_lock) != 0) return;
    int mode;
    relaxed_mode_enter(&mode);
    collect(dp, max, &c_by_app);
    relaxed_mode_leave(&mode);
    pthread_mutex_unlock(&collect_lock);
}

hvprof_devpair *hvprof_dev_begin(void *stream, int *devicep, int *miss)
{
    int device = *devicep;
    *miss = HVPROF_DEV_MISS_NONE;
    if (atomic_load_explicit(&forked, memory_order_relaxed) || cuda_load() != 1) {
        *miss = HVPROF_DEV_MISS_NO_CUDA;
        goto missed;
    }
    if (!dev_on) {
        *miss = HVPROF_DEV_MISS_OFF;
        goto missed;
    }
    if (device < 0) *devicep = device = hvprof_cuda_current_device();
    devpool *dp = pool_get(device);
    if (!dp) {
        *miss = HVPROF_DEV_MISS_NO_CUDA;
        goto missed;
    }
    if (cu.StreamIsCapturing) {
        int st = CU_CAPTURE_STATUS_NONE;
        if (cu.StreamIsCapturing(stream, &st) != CU_SUCCESS) {
            clear_cuda_error();
            st = -1;
        }
        if (st != CU_CAPTURE_STATUS_NONE) {
            *miss = HVPROF_DEV_MISS_CAPTURE;
            goto missed;
        }
    }
    hvprof_devpair *p = free_pop(dp);
    if (!p) {
        poll_dev(dp, 8); /* under pressure: make room if the head is done */
        p = free_pop(dp);
        if (!p) {
            *miss = HVPROF_DEV_MISS_POOL_EMPTY;
            goto missed;
        }
    }
    if (cu.EventRecord(p->ev0, stream) != CU_SUCCESS) {
        clear_cuda_error();
        free_push(dp, p->index);
        *miss = HVPROF_DEV_MISS_RECORD_ERROR;
        goto missed;
    }
    p->rec.aux = (uint32_t)device; /* kept until submit */
    return p;
missed:
    hvprof_dev_count_miss(*miss);
    return NULL;
}

int hvprof_dev_end(hvprof_devpair *p, void *stream)
{
    if (cu.EventRecord(p->ev1, stream) != CU_SUCCESS) {
        clear_cuda_error();
        hvprof_dev_cancel(p, HVPROF_DEV_MISS_RECORD_ERROR);
        return -1;
    }
    return 0;
}

void hvprof_dev_cancel(hvprof_devpair *p, int miss)
{
    devpool *dp = pool_of_pair(p);
    if (dp) free_push(dp, p->index);
    hvprof_dev_count_miss(miss);
}

void hvprof_dev_submit(hvprof_devpair *p, const hvprof_record *host, void *stream)
{
    int device = (int)p->rec.aux;
    devpool *dp = atomic_load_explicit(&pools[device], memory_order_acquire);
    p->rec = *host;
    p->rec.flags = (uint16_t)((host->flags & ~HVPROF_FLAG_DEVICE_PENDING) | HVPROF_FLAG_DEVICE);
    p->rec.aux = host->track;
    p->rec.track = hvprof_track_stream((uint64_t)(uintptr_t)stream, device);
    spin_lock(&dp->ring_lock);
    uint64_t t = atomic_load_explicit(&dp->tail, memory_order_relaxed);
    dp->ring[t % dp->npairs] = p->index;
    atomic_store_explicit(&dp->tail, t + 1, memory_order_release);
    spin_unlock(&dp->ring_lock);
    atomic_fetch_add_explicit(&c_submitted, 1, memory_order_relaxed);
}

void hvprof_dev_poll(int device)
{
    static __thread uint32_t calls __attribute__((tls_model("initial-exec")));
    if (device < 0 || device >= MAX_DEVICES) return;
    devpool *dp = atomic_load_explicit(&pools[device], memory_order_acquire);
    if (!dp || pending_of(dp) == 0) return;
    int pressure = atomic_load_explicit(&dp->nfree, memory_order_relaxed) < dp->npairs / 4;
    if ((++calls & 15) != 0 && !pressure) return;
    poll_dev(dp, 4);
}

int hvprof_dev_flush(int timeout_ms)
{
    if (atomic_load(&cuda_state) != 1 || atomic_load(&forked)) return 0;
    uint64_t any = 0;
    for (int d = 0; d < MAX_DEVICES; d++) {
        devpool *dp = atomic_load_explicit(&pools[d], memory_order_acquire);
        if (dp) any += pending_of(dp);
    }
    if (!any) return 0; /* nothing to collect: no CUDA call at all */
    double tpn = ticks_per_ns();
    uint64_t t0 = hvprof_ticks();
    if (timeout_ms < 0) timeout_ms = flush_ms;
    uint64_t limit = (uint64_t)((double)timeout_ms * 1e6 * tpn);
    int saved_dev = -1;
    if (cu.GetDevice(&saved_dev) != CU_SUCCESS) {
        clear_cuda_error();
        saved_dev = -1;
    }
    int cur = saved_dev, left;
    for (;;) {
        left = 0;
        pthread_mutex_lock(&collect_lock);
        int mode;
        relaxed_mode_enter(&mode);
        for (int d = 0; d < MAX_DEVICES; d++) {
            devpool *dp = atomic_load_explicit(&pools[d], memory_order_acquire);
            if (!dp || pending_of(dp) == 0) continue;
            if (cur != d && cu.SetDevice && cu.SetDevice(d) == CU_SUCCESS) cur = d;
            collect(dp, UINT32_MAX, &c_by_flush);
            left += (int)pending_of(dp);
        }
        relaxed_mode_leave(&mode);
        pthread_mutex_unlock(&collect_lock);
        if (left == 0 || hvprof_ticks() - t0 >= limit) break;
        sleep_us(100);
    }
    if (cur != saved_dev && saved_dev >= 0 && cu.SetDevice) cu.SetDevice(saved_dev);
    return left;
}

int hvprof_dev_finish(int timeout_ms)
{
    atomic_store(&helper_stop, 1);
    atomic_store(&helper_alive, 0);
    /* The helper checks the flag under the collector lock: after this
     * lock/unlock it makes no further CUDA call. */
    pthread_mutex_lock(&collect_lock);
    pthread_mutex_unlock(&collect_lock);
    int left = hvprof_dev_flush(timeout_ms);
    atomic_store(&c_unfinished, left > 0 ? (uint64_t)left : 0);
    return left;
}

size_t hvprof_dev_json(char *buf, size_t n)
{
    size_t k = 0;
#define OUT(...) k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, __VA_ARGS__)
    int s = atomic_load(&cuda_state);
    double tpn = ticks_per_ns();
    OUT("\"cuda_runtime\": \"%s\", \"cuda_state\": \"%s\", \"cuda_runtime_version\": %d, ",
        cuda_path, s == 1 ? "ok" : s < 0 ? "unavailable" : "not_loaded", cuda_version);
    OUT("\"device_timing\": %s, \"pool_pairs\": %u, \"poll_ms\": %d, \"anchor_period_ms\": %lld, ",
        dev_on ? "true" : "false", pool_pairs, poll_ms, (long long)anchor_ms);
    OUT("\"devices\": [");
    uint64_t pending = 0;
    int first = 1;
    for (int d = 0; d < MAX_DEVICES; d++) {
        devpool *dp = atomic_load(&pools[d]);
        if (!dp) continue;
        pending += pending_of(dp);
        OUT("%s%d", first ? "" : ", ", d);
        first = 0;
    }
    OUT("], \"submitted\": %llu, \"device_records\": %llu, \"pending\": %llu, ",
        (unsigned long long)atomic_load(&c_submitted), (unsigned long long)atomic_load(&c_records),
        (unsigned long long)pending);
    OUT("\"miss\": {");
    for (int i = 1; i < HVPROF_DEV_MISS_N; i++)
        OUT("%s\"%s\": %llu", i > 1 ? ", " : "", MISS_NAMES[i],
            (unsigned long long)atomic_load(&c_miss[i]));
    OUT("}, \"query_errors\": %llu, \"records_dropped\": %llu, \"unfinished\": %llu, ",
        (unsigned long long)atomic_load(&c_query_errors),
        (unsigned long long)atomic_load(&c_record_dropped),
        (unsigned long long)atomic_load(&c_unfinished));
    OUT("\"collected\": {\"calls\": %llu, \"helper\": %llu, \"flush\": %llu}, ",
        (unsigned long long)atomic_load(&c_by_app), (unsigned long long)atomic_load(&c_by_helper),
        (unsigned long long)atomic_load(&c_by_flush));
    OUT("\"anchors\": %llu, \"anchor_failures\": %llu, \"anchor_err_ns_max\": %.0f, "
        "\"anchor_err_ns_last\": %.0f, \"helper_thread\": %s",
        (unsigned long long)atomic_load(&c_anchors), (unsigned long long)atomic_load(&c_anchor_fail),
        (double)atomic_load(&c_anchor_err_max) / tpn, (double)atomic_load(&c_anchor_err_last) / tpn,
        atomic_load(&helper_alive) ? "true" : "false");
#undef OUT
    return k;
}

/* A forked child has no CUDA (the driver does not survive fork) and no helper
 * thread: it records NCCL host calls only. */
static void dev_atfork_child(void)
{
    atomic_store(&forked, 1);
    pthread_mutex_init(&collect_lock, NULL);
    pthread_mutex_init(&load_lock, NULL);
}

static const hvprof_backend cuda_backend = {
    .name = "cuda",
    .atfork_child = dev_atfork_child,
};

__attribute__((constructor)) static void cuda_rt_ctor(void)
{
    hvprof_register_backend(&cuda_backend);
}
