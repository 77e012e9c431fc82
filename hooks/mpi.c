/*
 * mpi.c -- the MPI backend's lifecycle: MPI_Init/Init_thread/Finalize and
 * the call-cost calibration.  The MPI files, each calling only those below
 * it (tests/test_c_structure.py): mpi.c; mpi_wrappers.c (collectives) and
 * mpi_fortran.c (the Fortran bindings), generated from the prototype list
 * hooks/mpi_protos.py by scripts/gen_mpi_wrappers.py; mpi_p2p.c
 * (point-to-point and requests); mpi_handles.c (what a call's handles mean:
 * datatypes, ops, communicators and their stable ids); mpi_clock.c (the
 * clock sync at MPI_Init) and mpi_gather.c (rank 0's gather of the ranks'
 * files at MPI_Finalize).  What they share: mpi_internal.h.
 *
 * What a record's `bytes` means, per collective (the collective's data volume
 * in nccl-tests' sense, computed from what this rank can see locally):
 *   allreduce, iallreduce, reduce, bcast      count x type size
 *   allgather, alltoall                       per-rank count x type size x comm size
 *                                             (the receive side when MPI_IN_PLACE)
 *   gather                                    per-rank count x type size x comm size
 *   allgatherv, reduce_scatter                sum(recvcounts) x type size
 *   gatherv                                   root: sum(recvcounts) x type size;
 *                                             other ranks: their own sendcount x size
 *   alltoallv                                 sum(sendcounts) x send type size
 *                                             (recvcounts when MPI_IN_PLACE)
 *   reduce_scatter_block                      recvcount x type size x comm size
 *   barrier                                   0
 * `count` is the element count of the same volume.  On an intercommunicator
 * "comm size" above is the remote group's size (the peers; the length of the
 * counts arrays), except for reduce_scatter(_block), whose counts are per
 * rank of the local group; an intercommunicator gatherv's root (MPI_ROOT)
 * counts what it receives, the other ranks of its group (MPI_PROC_NULL) 0.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_internal.h"
/* ------------------------------------------------------------------------ */
/* Set-up and tear-down.                                                      */

static MPI_Comm prof_comm = MPI_COMM_NULL; /* private: never the application's */

static int profiling_wanted(void)
{
    return hvprof_profile_mode() != HVPROF_PROFILE_OFF;
}

static int resync_at_finalize; /* several clock domains: measure again (every rank) */
static int sync_mode;          /* 0: host leaders, 1: every rank */

/* One line for the job when ranks could not open their raw files: rank 0
 * prints the first failing rank's reason and how many ranks record nothing. */
static void report_open_failures(int rank, int size, int ok)
{
    int mine = ok ? INT_MAX : rank, first = INT_MAX, bad = ok ? 0 : 1, nbad = 0;
    PMPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, prof_comm);
    if (first == INT_MAX) return; /* every rank has its file */
    PMPI_Reduce(&bad, &nbad, 1, MPI_INT, MPI_SUM, 0, prof_comm);
    char why[768];
    snprintf(why, sizeof why, "%s", ok ? "" : hvprof_open_error());
    enum { TAG = 0x4856 };
    if (first != 0 && rank == first) PMPI_Send(why, (int)sizeof why, MPI_CHAR, 0, TAG, prof_comm);
    if (first != 0 && rank == 0)
        PMPI_Recv(why, (int)sizeof why, MPI_CHAR, first, TAG, prof_comm, MPI_STATUS_IGNORE);
    if (rank != 0) return;
    why[sizeof why - 1] = 0;
    if (nbad == size && size > 1)
        hvprof_warn("%s: profiling is off for every rank (%d)", why, size);
    else if (nbad == 1)
        hvprof_warn("%s: profiling is off for rank %d", why, first);
    else
        hvprof_warn("%s: profiling is off for %d of %d ranks (the first: rank %d)", why, nbad,
                    size, first);
}

/* The profiler states its own cost: call_cost_ns in the raw file's header,
 * measured here at MPI_Init, off the hot path.  Method: blocks of CAL_ITERS
 * calls of cal_wrapped -- exactly the wrapper's fast path (the same inline
 * functions in the same order: active check, cached description, slot,
 * fill, two clock reads, flight recorder, publish; summary mode: the
 * aggregate update) around an empty non-inlined stand-in for the MPI call --
 * alternate with blocks calling the stand-in directly, as an unprofiled
 * program calls MPI; the median of CAL_PAIRS block differences, per call.
 * Everything it writes is scratch that nobody reads: a private thread state
 * whose chunk is a static array (never published, never flushed), a private
 * flight-recorder entry, a private aggregate; the communicator's call
 * counter it advances is put back.  Left out: the helper thread's copy of
 * each record to the file (its CPU time is helper_cpu_ns) and the cache
 * misses of a real chunk (the scratch slots stay warm).  About 0.3 ms. */
#define CAL_ITERS 512
#define CAL_PAIRS 15
static hvprof_record cal_slots[CAL_ITERS];
static float cal_buf[1];

__attribute__((noinline)) static int cal_stand_in(int i)
{
    int r; /* opaque to the compiler, like the MPI call it stands for */
    __asm__ volatile("" : "=r"(r) : "0"(i == -1) : "memory");
    return r;
}

__attribute__((noinline)) static int cal_wrapped(hvprof_tls *t, int i, int summary)
{
    if (!ACTIVE()) return cal_stand_in(i);
    int div;
    if (!desc_hit(t, MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM) || !call_fast(t, &div))
        return cal_stand_in(i);
    if (!summary) {
        hvprof_record *r;
        if (!call_slot(t, &r)) return cal_stand_in(i);
        call_open(t, r, HVPROF_OP_MPI_ALLREDUCE, MPI_COMM_WORLD, MPI_FLOAT, 0, 0, MPI_SUM, -1, 0,
                  cal_buf);
        int rc = cal_stand_in(i);
        call_close(t, r, rc);
        return rc;
    }
    uint64_t t0;
    uint16_t fl;
    hvprof_agg_entry *a = agg_open(t, &t0, &fl, HVPROF_OP_MPI_ALLREDUCE, MPI_COMM_WORLD,
                                   MPI_FLOAT, 0, 0, MPI_SUM, -1, 0, cal_buf);
    if (!a) return cal_stand_in(i);
    int rc = cal_stand_in(i);
    agg_close(t, a, t0, fl, rc);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double calibrate_call_cost(const hvprof_file_header *h)
{
    if (!hvprof_fast_clock()) return 0; /* the general path would be timed: not calibrated */
    int summary = h->mode == HVPROF_MODE_SUMMARY;
    static hvprof_tls c; /* a stand-in thread, not hvprof_t: nothing of it is published */
    static hvprof_inflight_entry cal_inflight;
    static hvprof_agg_entry cal_agg;
    static _Atomic uint64_t cal_nrec;
    memset(&c, 0, sizeof c);
    uint32_t gen = atomic_load(&hvprof_generation);
    uint32_t epoch = atomic_load(&hvprof_handle_epoch);
    mpi_describe_slow(&c.desc, MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM, epoch);
    uint32_t ci = c.desc.ci;
    if (ci >= HVPROF_COMM_TABLE_CAPACITY || c.desc.epoch != atomic_load(&hvprof_handle_epoch))
        return 0;
    c.slots = cal_slots;
    c.nrec = &cal_nrec;
    c.capacity = CAL_ITERS;
    c.track = 0;
    c.generation = gen;
    c.inflight = &cal_inflight;
    memset(&cal_agg, 0, sizeof cal_agg);
    cal_agg.op = HVPROF_OP_MPI_ALLREDUCE;
    cal_agg.comm = ci;
    cal_agg.dtype = c.desc.dt_code;
    cal_agg.redop = c.desc.redop;
    cal_agg.calls = 1;
    c.agg = &cal_agg;
    c.agg_last = &cal_agg;
    c.agg_generation = gen;
    uint32_t seq = atomic_load_explicit(&hvprof_comm_seq[ci], memory_order_relaxed);
    double diff[CAL_PAIRS];
    int sink = 0;
    for (int p = -1; p < CAL_PAIRS; p++) { /* p = -1: warm-up */
        c.used = 0;
        int64_t a = hvprof_mono_ns();
        for (int i = 0; i < CAL_ITERS; i++) sink += cal_wrapped(&c, i, summary);
        int64_t b = hvprof_mono_ns();
        for (int i = 0; i < CAL_ITERS; i++) sink += cal_stand_in(i);
        int64_t e = hvprof_mono_ns();
        if (p >= 0) diff[p] = (double)((b - a) - (e - b)) / CAL_ITERS;
    }
    atomic_store_explicit(&hvprof_comm_seq[ci], seq, memory_order_relaxed);
    /* every call took the fast path, or this was not what the job runs */
    if (sink != 0 || c.used != (summary ? 0u : CAL_ITERS) ||
        cal_agg.calls != (summary ? 1u + (CAL_PAIRS + 1u) * CAL_ITERS : 1u))
        return 0;
    qsort(diff, CAL_PAIRS, sizeof diff[0], cmp_double);
    double med = diff[CAL_PAIRS / 2];
    return med > 0 ? med : 0;
}

static void mpi_started(uint64_t t0, int provided)
{
    if (!profiling_wanted()) return;
    int rank = 0, size = 1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    if (PMPI_Comm_dup(MPI_COMM_WORLD, &prof_comm) != MPI_SUCCESS) return;

    /* Rank 0 names the job's directory; every rank opens its file there. */
    struct { char dir[1024]; uint64_t job_id; } job;
    memset(&job, 0, sizeof job);
    if (rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        job.job_id = hvprof_mix(hvprof_mix((uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec), (uint64_t)getpid());
        const char *d = hvprof_setting_text(HVS_DIR);
        if (d) {
            snprintf(job.dir, sizeof job.dir, "%s", d);
        } else {
            hvprof_default_dir(job.dir, sizeof job.dir, job.job_id | 1u);
        }
    }
    PMPI_Bcast(&job, (int)sizeof job, MPI_BYTE, 0, prof_comm);

    hvprof_set_quiet(1); /* rank 0 reports failures for the job, once */
    int ok = hvprof_open(rank, size, -1, job.dir) == 0;
    report_open_failures(rank, size, ok);
    /* Every rank must take part in the offset exchange, even one whose file
     * could not be opened, or rank 0 would wait for it. */
    sync_mode = mpi_sync_per_rank();
    clock_sync cs;
    int hosts = mpi_estimate_offsets(prof_comm, rank, sync_mode, &cs);
    resync_at_finalize = hosts > 1;
    int64_t t0_job = hvprof_mono_ns();
    PMPI_Bcast(&t0_job, 1, MPI_INT64_T, 0, prof_comm);
    if (!ok) return;

    hvprof_file_header *h = hvprof_header();
    mpi_build_tables();
    h->job_id = job.job_id;
    h->offset_ns = cs.offset;
    h->offset_err_ns = cs.err;
    h->offset_at_ns = cs.at;
    /* 0: one host, one clock, offset 0 exactly; 1: per host; 2: per rank */
    h->offset_method = hosts > 1 ? (sync_mode ? 2 : 1) : 0;
    h->job_t0_ns = t0_job; /* rank 0's clock: the job's time zero */
    h->thread_level = provided;
    h->init_start_ticks = (int64_t)t0;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (PMPI_Get_library_version(ver, &len) == MPI_SUCCESS) {
        /* first line only, cut to the field */
        size_t k = 0;
        while (k + 1 < sizeof h->mpi_version && ver[k] && ver[k] != '\n') {
            h->mpi_version[k] = ver[k];
            k++;
        }
        h->mpi_version[k] = 0;
    }
    comm_index(MPI_COMM_WORLD); /* table entry 0: the world */
    h->call_cost_ns = calibrate_call_cost(h);

    /* Horovod's own timeline, into the profile directory, when asked for with
     * HOROVOD_PROFILE_TIMELINE=1 (rank 0 writes it; Horovod reads the variable
     * after MPI is initialized).  Off by default: it costs a quarter to a
     * third of the throughput, and the lineage comes from APP_TENSOR records. */
    if (!getenv("HOROVOD_TIMELINE") && hvprof_setting_int(HVS_TIMELINE)) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/timeline.json", job.dir);
        setenv("HOROVOD_TIMELINE", path, 0);
    }
    uint64_t t1 = hvprof_ticks();
    h->init_end_ticks = (int64_t)t1;
    __atomic_or_fetch(&h->state, HVPROF_STATE_MPI_INIT, __ATOMIC_RELEASE);
    emit(HVPROF_OP_MPI_INIT, t0, t1, MPI_COMM_WORLD, MPI_DATATYPE_NULL, 0, 0, MPI_OP_NULL, -1, 0,
         NULL, MPI_SUCCESS);
}

HVPROF_EXPORT int MPI_Init(int *argc, char ***argv)
{
    uint64_t t0 = hvprof_ticks();
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) mpi_started(t0, -1);
    return rc;
}

HVPROF_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    uint64_t t0 = hvprof_ticks();
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) mpi_started(t0, provided ? *provided : -1);
    return rc;
}

HVPROF_EXPORT int MPI_Finalize(void)
{
    /* A C rank's exit work starts here, as a Python rank's does before its
     * MPI_Finalize: a launcher that ends rank 0 from now on (mpirun aborting
     * the job for another rank's non-zero exit) gets the line that names
     * `profiler merge`, not a silent death (exitmerge.c). */
    hvprof_exit_prepare();
    /* Every rank has prof_comm (duplicated at MPI_Init), whether or not its
     * file opened or recording is paused now: each takes part in the
     * reductions below, or rank 0 would wait for ever. */
    if (prof_comm != MPI_COMM_NULL) {
        hvprof_file_header *h = hvprof_header();
        if (h && ACTIVE()) {
            uint64_t t0 = hvprof_ticks();
            mpi_pending_finalize(t0); /* requests never completed */
            emit(HVPROF_OP_MPI_FINALIZE, t0, hvprof_ticks(), MPI_COMM_WORLD, MPI_DATATYPE_NULL,
                 0, 0, MPI_OP_NULL, -1, 0, NULL, MPI_SUCCESS);
            h->finalize_ticks = (int64_t)t0;
        }
        int me = 0, size = 1;
        PMPI_Comm_rank(prof_comm, &me);
        PMPI_Comm_size(prof_comm, &size);
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", h ? hvprof_dir() : "");
        if (resync_at_finalize) { /* the same decision on every rank (hosts) */
            clock_sync cs;
            mpi_estimate_offsets(prof_comm, me, sync_mode, &cs);
            if (h) {
                h->offset_end_ns = cs.offset;
                h->offset_end_err_ns = cs.err;
                h->offset_end_at_ns = cs.at;
            }
        }
        /* Drain first (the last flush may drop), then rank 0 says once what
         * the job lost, if anything. */
        if (h) hvprof_close(HVPROF_STATE_FINALIZED);
        int err = hvprof_write_errno(), worst = 0;
        unsigned long long mine[2] = {h ? (unsigned long long)h->dropped_records : 0ull,
                                      err ? 1ull : 0ull};
        unsigned long long all[2] = {0, 0};
        PMPI_Reduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, prof_comm);
        PMPI_Reduce(&err, &worst, 1, MPI_INT, MPI_MAX, 0, prof_comm);
        if (me == 0) {
            if (all[0] && all[1])
                hvprof_warn("%llu records were dropped: %llu of %d rank(s) could not write "
                            "(%s); see %s", all[0], all[1], size, strerror(worst),
                            h ? hvprof_dir() : "the profile directory");
            else if (all[0])
                hvprof_warn("%llu records were dropped: no buffer space (the writer could "
                            "not keep up, or too many requests in flight); see %s", all[0],
                            h ? hvprof_dir() : "the profile directory");
            /* trace.json: Python's exit handler, else the library's own
             * exit merge (exitmerge.c), at process exit. */
        }
        /* The files of ranks whose disk rank 0 does not see, to rank 0. */
        mpi_gather_files(prof_comm, me, size, h, dir);
        PMPI_Comm_free(&prof_comm);
        prof_comm = MPI_COMM_NULL;
    }
    return PMPI_Finalize();
}

/* ------------------------------------------------------------------------ */
/* Registration with the core: MPI_Finalize closes the file itself, so this
 * backend has no lifecycle hook; the core skips libmpi's frames (a PMPI
 * layer in between) when naming a thread's caller. */

static const hvprof_backend mpi_backend = {.name = "mpi", .library = "libmpi"};

__attribute__((constructor)) static void mpi_ctor(void)
{
    hvprof_register_backend(&mpi_backend);
}