/*
 * cuda_rt_pool.c -- the pools of CUDA event pairs (one per device, created
 * at its first use), the anchor that puts event times on the host tick axis,
 * and collection, in issue order, never synchronizing an application stream:
 * by the recording path (poll_dev), by the helper thread "hvprof-devtime",
 * and by the final flush (hvprof_dev_flush, hvprof_dev_finish).  The method
 * and its error: cuda_rt.c.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_rt_internal.h"

#define ANCHOR_TRIES 3

_Atomic(devpool *) pools[MAX_DEVICES];
static _Atomic int pool_failed[MAX_DEVICES];
pthread_mutex_t collect_lock = PTHREAD_MUTEX_INITIALIZER;

/* helper thread */
static _Atomic int helper_started;
static _Atomic int helper_stop;
_Atomic int helper_alive;   /* the thread runs and collects */

/* counters */
_Atomic uint64_t c_device_records, c_record_dropped, c_query_errors;
_Atomic uint64_t c_unfinished, c_by_app, c_by_helper, c_by_flush, c_anchors;
_Atomic uint64_t c_anchor_fail;
_Atomic int64_t c_anchor_err_max, c_anchor_err_last; /* ticks */

static inline int64_t hv_round(double x)
{
    return (int64_t)(x >= 0 ? x + 0.5 : x - 0.5);
}

static int helper_running(void);

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------ */
/* Pools: the anchor, collection, the helper thread.                         */

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
    atomic_fetch_add(&c_device_records, 1);
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

/* The slow half of pool_get (cuda_rt_internal.h). */
devpool *pool_get_slow(int device)
{
    if (atomic_load_explicit(&pool_failed[device], memory_order_relaxed)) return NULL;
    pthread_mutex_lock(&load_lock);
    devpool *dp = atomic_load(&pools[device]);
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
/* Collection by the recording path, and the final flush.                    */

void poll_dev(devpool *dp, uint32_t max)
{
    if (pthread_mutex_trylock(&collect_lock) != 0) return;
    int mode;
    relaxed_mode_enter(&mode);
    collect(dp, max, &c_by_app);
    relaxed_mode_leave(&mode);
    pthread_mutex_unlock(&collect_lock);
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
    if (timeout_ms < 0) timeout_ms = dev_flush_ms;
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
