/*
 * core_internal.h -- what the core's files share: core.c (state, tables,
 * tracks, clock, lifecycle, exports), core_open.c (the raw file: its
 * directory, settings check, header, open), core_flush.c (chunk supply, the
 * helper thread, signals, thread exit), core_summary.c (summary mode,
 * sampling, the time window) and core_layout.c (the layout JSON).  Not for
 * backends: they see hvprof_internal.h only.
 */
#ifndef HVPROF_CORE_INTERNAL_H
#define HVPROF_CORE_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "hvprof_internal.h"

/* Process state: written under the open/close paths only. */
typedef struct {
    int fd;
    int open;                 /* raw file open (for this process, not a child) */
    int broken;               /* chunk allocation failed: drop from now on */
    int python;               /* a Python runtime converts this rank's file at exit */
    int write_errno;          /* why records were first dropped (0: never) */
    int quiet;                /* MPI ranks: rank 0 reports for the job (mpi.c) */
    char open_error[768];     /* why the last hvprof_open failed ("" if it did not) */
    pid_t pid;
    uint32_t chunk_bytes;
    uint64_t first_chunk_offset;
    hvprof_file_header *hdr;  /* mmapped header + tables */
    size_t meta_bytes;
    char dir[1024];
    char raw_path[PATH_MAX];
    pthread_mutex_t lock;     /* open/close only */
} hvprof_core_state;
extern hvprof_core_state hvprof_core;

#define MAX_BACKENDS 16
/* The registered backends (core.c), one by one: the core calls them only so. */
const hvprof_backend *backend_at(uint32_t i);
#define FOR_EACH_BACKEND(b)                                                   \
    for (uint32_t bi_ = 0; bi_ < MAX_BACKENDS; bi_++)                         \
        for (const hvprof_backend *b = backend_at(bi_); b; b = NULL)

/* core.c */
extern _Atomic int app_active;     /* application records taken (open to exit) */
extern pthread_key_t exit_key;     /* its destructor hands an exiting thread's buffer over */
#define COMM_HASH_SLOTS 4096u      /* communicator lookup: handle -> table index + 1 */
#define STREAM_HASH_SLOTS 1024u    /* stream tracks: the same scheme */
extern _Atomic uint64_t comm_keys[COMM_HASH_SLOTS];
extern _Atomic uint32_t comm_vals[COMM_HASH_SLOTS];
extern _Atomic uint64_t stream_keys[STREAM_HASH_SLOTS];
extern _Atomic uint32_t stream_vals[STREAM_HASH_SLOTS];
void calibrate_now(void);

/* core_flush.c */
/* The helper's flush period: the most a SIGKILL can lose.  Each wake-up
 * costs the job far more than the helper's own tens of microseconds of CPU
 * where ranks share cores (a 2-rank job of 1.2 ms steps lost about 3% of
 * its rate at 25 ms, under 1% at 100 or 250 ms, measured within runs:
 * benchmarks/overhead/ab_corpus.py), so the period trades loss on SIGKILL
 * against that (figures: docs/validation.md). */
extern _Atomic int flush_ms;      /* 0: no clock ticks (hvprof_set_flush_ms) */
extern int helper_started;
extern uint64_t reserved_chunks;
extern int reserve_refused;
void helper_wake(void);
void helper_start(void);
void helper_stop(void);
void helper_forget(void);
void signals_install(void);
void thread_exit(void *arg);

/* core_summary.c */
extern pthread_mutex_t sampling_lock;
void set_sampling(int on);
void window_init(void);
void window_tick(int64_t now_mono);
void agg_snapshot(void);

#endif
