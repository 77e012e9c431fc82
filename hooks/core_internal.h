/*
 * core_internal.h -- what the core's files share.  Not for backends: they see
 * hvprof_internal.h only.
 *
 * The core is a stack of files; each calls only the files below it
 * (tests/test_c_structure.py fails on a circle), bottom first:
 *
 *   core_state.c    the shared state: every variable below and the globals of
 *                   hvprof_internal.h, defined there and nowhere else; the
 *                   backend registry; the state's accessors.  Calls nothing.
 *   core_clock.c    the clock: choice, calibration pairs.
 *   core_tracks.c   threads' and streams' tracks, the communicator table.
 *   core_summary.c  summary mode, sampling, the time window.
 *   core_flush.c    chunk supply, the helper thread ("hvprof-io"), signals,
 *                   thread exit.
 *   core_open.c     the raw file: directory, header, open.
 *   core.c          close, fork, exit, the functions Python calls.
 *   core_layout.c   the layout JSON (calls nothing).
 *
 * State private to one file stays static in it; a file below hands a file
 * above what it needs through a function, never a variable.
 */
#ifndef HVPROF_CORE_INTERNAL_H
#define HVPROF_CORE_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <sys/types.h>

#include "hvprof_internal.h"

/* ------------------------------------------------------------------------ */
/* core_state.c: the state.                                                  */

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

/* Application records (steps, marks) are taken from open to process exit:
 * MPI_Finalize may come first on another thread (Horovod's background thread
 * finalizes when any rank shuts Horovod down, while this rank's main thread
 * is still closing its last step). */
extern _Atomic int app_active;
/* Its destructor (core_flush.c thread_exit, set by core.c's constructor)
 * hands an exiting thread's buffer over; core_tracks.c arms it per thread. */
extern pthread_key_t exit_key;

#define MAX_BACKENDS 16
/* The registered backends, one by one: the core calls them only so. */
const hvprof_backend *backend_at(uint32_t i);
#define FOR_EACH_BACKEND(b)                                                   \
    for (uint32_t bi_ = 0; bi_ < MAX_BACKENDS; bi_++)                         \
        for (const hvprof_backend *b = backend_at(bi_); b; b = NULL)

/* ------------------------------------------------------------------------ */
/* core_clock.c                                                              */

/* HOROVOD_PROFILE_CLOCK: the TSC where it is invariant, else CLOCK_MONOTONIC
 * (before any tick is read: the constructor). */
void clock_select(void);
/* A fresh calibration pair into the header (cal1_*). */
void calibrate_now(void);

/* ------------------------------------------------------------------------ */
/* core_tracks.c                                                             */

/* A new file: forget the communicator and stream lookups of the previous one. */
void tables_reset(void);

/* ------------------------------------------------------------------------ */
/* core_summary.c                                                            */

void set_sampling(int on);
void window_init(void);
void window_tick(int64_t now_mono);
void agg_snapshot(void);
/* In a forked child: the helper may have held the sampling lock. */
void summary_atfork_child(void);

/* ------------------------------------------------------------------------ */
/* core_flush.c                                                              */

/* The helper's flush period: the most a SIGKILL can lose.  Each wake-up
 * costs the job far more than the helper's own tens of microseconds of CPU
 * where ranks share cores, so the period trades loss on SIGKILL against
 * that (figures: docs/validation.md, measured with
 * benchmarks/overhead/ab_corpus.py).  helper_set_period: the period from
 * now on (ms; 0: no clock ticks), the helper woken to take it; returns the
 * previous one. */
int helper_set_period(int ms);
/* A new file: its block reservation starts over. */
void flush_reset(void);
/* Step seq ended at t_end: the backends' helper_step hooks are told on the
 * helper thread (hvprof_backend.helper_step). */
void helper_step_post(uint32_t seq, uint64_t t_end);
void helper_start(void);
void helper_stop(void);
void helper_forget(void);
void signals_install(void);
void thread_exit(void *arg);

#endif
