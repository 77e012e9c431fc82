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
 *   - hvprof_dev_finish(timeout), through hvprof_nccl_finish
 *     (nccl_backend.c) at exit: from an atexit handler registered at the
 *     first NCCL communicator (after the CUDA runtime initialised, so it runs
 *     before the runtime's own teardown), and from the Python runtime /
 *     hvprof_close (the NCCL backend's finish hook) before the raw file is
 *     read.  It stops the helper thread, then polls (hvprof_dev_flush, which
 *     nccl_backend.c exports as hvprof_nccl_flush) with cudaEventQuery
 *     (sleeping 100 us between rounds) up to the timeout (default
 *     HOROVOD_PROFILE_NCCL_FLUSH_MS, 1000); pairs still pending after it are
 *     counted as `unfinished`.
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
 *
 * Files: cuda_rt_load.c finds the runtime and reads the settings;
 * cuda_rt_pool.c holds the pools, the anchor and collection (the helper
 * thread, the final flush); this file is the interface nccl.c calls per call
 * (cuda_rt.h), the counters' JSON and the backend.  What they share:
 * cuda_rt_internal.h.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "cuda_rt_internal.h"

/* counters (the others: cuda_rt_pool.c) */
static _Atomic uint64_t c_miss[HVPROF_DEV_MISS_N];
static _Atomic uint64_t c_submitted;

static const char *const MISS_NAMES[HVPROF_DEV_MISS_N] = {
    "none", "off", "no_cuda", "pool_empty", "capture", "record_error", "in_progress",
};

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
        (unsigned long long)atomic_load(&c_submitted),
        (unsigned long long)atomic_load(&c_device_records), (unsigned long long)pending);
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
