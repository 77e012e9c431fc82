/*
 * cuda_rt.h -- device time for NCCL calls: the CUDA runtime, resolved lazily
 * through dlopen (no link-time dependency), a fixed pool of CUDA event pairs
 * per device, collection of completed pairs without synchronizing the
 * application's streams, and the mapping of event times onto the host tick
 * axis through an anchor event.  Used by the NCCL wrappers (nccl.c,
 * nccl_lookup.c, nccl_backend.c); see cuda_rt.c for the method and its error,
 * and cuda_rt_internal.h for the files that implement it.
 */
#ifndef HVPROF_CUDA_RT_H
#define HVPROF_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

#include "hvprof_internal.h"

/* One pair of pooled events (before/after one NCCL call or group). */
typedef struct hvprof_devpair hvprof_devpair;

/* Why a call got no device record; each reason is counted. */
enum hvprof_dev_miss {
    HVPROF_DEV_MISS_NONE = 0,
    HVPROF_DEV_MISS_OFF,          /* HOROVOD_PROFILE_NCCL_DEVICE=0 */
    HVPROF_DEV_MISS_NO_CUDA,      /* no usable CUDA runtime in the process */
    HVPROF_DEV_MISS_POOL_EMPTY,   /* every pooled pair still pending */
    HVPROF_DEV_MISS_CAPTURE,      /* the stream is being captured into a graph */
    HVPROF_DEV_MISS_RECORD_ERROR, /* cudaEventRecord failed on the stream */
    HVPROF_DEV_MISS_IN_PROGRESS,  /* nonblocking communicator: ncclInProgress */
    HVPROF_DEV_MISS_N
};

/* Reserve a pair for *device (the communicator's CUDA device; -1: the
 * calling thread's current device, which is then stored in *device) and
 * record its first event on `stream`.
 * NULL when no device time can be had for this call: *miss says why (already
 * counted). */
HVPROF_HIDDEN hvprof_devpair *hvprof_dev_begin(void *stream, int *device, int *miss);

/* Record the second event of `p` on `stream`.  0, or -1 when it failed (the
 * pair is returned to the pool and the miss is counted as RECORD_ERROR). */
HVPROF_HIDDEN int hvprof_dev_end(hvprof_devpair *p, void *stream);

/* Give `p` back unused (the call failed, or returned ncclInProgress);
 * `miss` is counted. */
HVPROF_HIDDEN void hvprof_dev_cancel(hvprof_devpair *p, int miss);

/* Queue `p` for collection.  `host` is the call's host record: the device
 * record is a copy of it with the device interval, flag DEVICE, track =
 * the stream's track and aux = the host record's track. */
HVPROF_HIDDEN void hvprof_dev_submit(hvprof_devpair *p, const hvprof_record *host, void *stream);

/* Count a miss that happened before any pair was taken (e.g. no CUDA). */
HVPROF_HIDDEN void hvprof_dev_count_miss(int miss);

/* Opportunistic collection from the recording path: never blocks (trylock),
 * never synchronizes; queries at most a few events.  `device` as above. */
HVPROF_HIDDEN void hvprof_dev_poll(int device);

/* The calling thread's current CUDA device, or -1 (no runtime). */
HVPROF_HIDDEN int hvprof_cuda_current_device(void);

/* Append the device-timing counters to buf as JSON members (no braces);
 * returns the number of characters written (snprintf semantics). */
HVPROF_HIDDEN size_t hvprof_dev_json(char *buf, size_t n);

/* Collect every pending pair, waiting for each by polling cudaEventQuery (no
 * synchronize call) up to timeout_ms in all (negative: the default,
 * HOROVOD_PROFILE_NCCL_FLUSH_MS or 1000).  Returns the number of pairs still
 * pending.  nccl_backend.c exports it as hvprof_nccl_flush. */
HVPROF_HIDDEN int hvprof_dev_flush(int timeout_ms);

/* The end of device timing (exit): stop the helper thread for good (no
 * further CUDA call from it), collect what is pending (hvprof_dev_flush), and
 * count the pairs left as `unfinished`.  Returns that number.
 * hvprof_nccl_finish (nccl_backend.c) is the exit-time entry point. */
HVPROF_HIDDEN int hvprof_dev_finish(int timeout_ms);

#endif
