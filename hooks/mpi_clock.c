/*
 * mpi_clock.c -- this rank's clock offset to rank 0's, measured over MPI at
 * MPI_Init (and at MPI_Finalize with several hosts), on the profiler's own
 * communicator (mpi.c's prof_comm, passed in).
 *
 * Offset of this rank's CLOCK_MONOTONIC to rank 0's.  Ranks on one host
 * share CLOCK_MONOTONIC, so only one rank per host (the node leader, lowest
 * rank there) measures: rank 0 ping-pongs each leader in turn (Cristian's
 * method with the minimum-delay filter: offset = b - (a + c) / 2 for the
 * round trip with the smallest c - a, whose error is at most (c - a) / 2
 * plus the clock's read granularity), and each leader passes its result to
 * the ranks of its host.  With several hosts it runs again at MPI_Finalize:
 * the reader interpolates between the two measurements when they differ by
 * more than their error bounds (profiler.formats.clock.clock_drift_ppm).
 *
 * On a busy machine most round trips are stretched by a descheduled peer;
 * the fastest of many, spread over time, is not.  So rank 0 sends bursts of
 * SYNC_BURST pings with a pause between bursts, up to SYNC_MAX_BURSTS bursts
 * or a time budget per leader (SYNC_BUDGET_NS; with many hosts
 * SYNC_TOTAL_NS shared, at least SYNC_MIN_BUDGET_NS each), stopping early
 * once the best round trip is below SYNC_GOOD_RTT_NS (a quiet machine: a
 * few bursts) or, after more bursts, below SYNC_OK_RTT_NS.  A burst ends
 * early at a slow round trip (a peer lost its CPU), so the budget buys many
 * independent tries rather than many slow round trips.  Both sides of a
 * burst have just woken from a sleep (rank 0's pause, the leader's idle
 * wait), which the scheduler favours over CPU-bound neighbours: the burst's
 * later round trips then run with both on a CPU.  Ranks that are not
 * measuring wait without spinning (sync_wait_idle), leaving the CPUs to the
 * two that are.  Cost at rank 0: about a millisecond per host on a quiet
 * machine (SYNC_MIN_BURSTS bursts), at most max(SYNC_TOTAL_NS, hosts x
 * SYNC_MIN_BUDGET_NS) on a busy one, at MPI_Init and again at MPI_Finalize. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "mpi_internal.h"


enum {
    SYNC_TAG = 7717,      /* ping (rank 0 -> leader) and pong */
    SYNC_TAG_DONE = 7718, /* rank 0 -> leader: {offset, err, at} */
    SYNC_TAG_END = 7719,  /* rank 0 -> leader: the burst is over */
    SYNC_BURST = 16,
    SYNC_MIN_BURSTS = 4,  /* then stop at a round trip <= SYNC_GOOD_RTT_NS */
    SYNC_OK_BURSTS = 32,  /* then stop at a round trip <= SYNC_OK_RTT_NS */
    SYNC_MAX_BURSTS = 1024,
};
#define SYNC_GOOD_RTT_NS 30000LL      /* bound <= 15 us */
#define SYNC_OK_RTT_NS 60000LL        /* bound <= 30 us */
#define SYNC_BUDGET_NS 1000000000LL   /* per leader (a busy machine) ... */
#define SYNC_TOTAL_NS 4000000000LL    /* ... and for all leaders together, */
#define SYNC_MIN_BUDGET_NS 20000000LL /* but at least this per leader */
#define SYNC_SLOW_RTT_NS 50000LL      /* a round trip this slow may end a burst */
#define SYNC_PAUSE_NS 300000L         /* between bursts: 1 to 2 x this */

/* Complete a request without spinning for long: a rank waiting its turn (or
 * for its leader's result) sleeps between tests. */
static void sync_wait_idle(MPI_Request *req, MPI_Status *st)
{
    struct timespec nap = {0, 200000};
    for (int spins = 0;; spins++) {
        int done = 0;
        PMPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        if (done) return;
        if (spins >= 32) nanosleep(&nap, NULL);
    }
}

/* The clock's read granularity (ns, at least 1). */
static int64_t sync_clock_res_ns(void)
{
    struct timespec r;
    if (clock_getres(CLOCK_MONOTONIC, &r) != 0) return 1;
    int64_t ns = (int64_t)r.tv_sec * 1000000000LL + r.tv_nsec;
    return ns > 0 ? ns : 1;
}

/* Rank 0's side for one leader: returns {offset, err, at (leader's clock)}. */
static void sync_measure_leader(MPI_Comm leaders, int r, int64_t res_ns, int64_t budget_ns,
                                int64_t out[3])
{
    int64_t best_rtt = INT64_MAX, best_off = 0, best_b = 0;
    int64_t t_start = hvprof_mono_ns();
    uint64_t seed = (uint64_t)t_start ^ ((uint64_t)r << 32);
    for (int burst = 0; burst < SYNC_MAX_BURSTS; burst++) {
        if (burst) {
            /* a pause of random length: other processes run, and the next
             * burst does not fall in step with a periodic load */
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            struct timespec pause = {0, SYNC_PAUSE_NS + (long)((seed >> 33) % SYNC_PAUSE_NS)};
            nanosleep(&pause, NULL);
        }
        for (int k = 0; k < SYNC_BURST; k++) {
            int64_t a = hvprof_mono_ns(), b = 0;
            PMPI_Send(&a, 1, MPI_INT64_T, r, SYNC_TAG, leaders);
            PMPI_Recv(&b, 1, MPI_INT64_T, r, SYNC_TAG, leaders, MPI_STATUS_IGNORE);
            int64_t c = hvprof_mono_ns();
            if (c - a < best_rtt) {
                best_rtt = c - a;
                best_off = b - (a + (c - a) / 2);
                best_b = b;
            }
            /* A slow round trip after the first (which wakes the leader):
             * a peer lost its CPU.  End the burst and try again later,
             * rather than spend the budget on more slow ones. */
            if (k > 0 && c - a > 2 * best_rtt && c - a > SYNC_SLOW_RTT_NS) break;
        }
        int64_t end = 0;
        PMPI_Send(&end, 1, MPI_INT64_T, r, SYNC_TAG_END, leaders);
        if (burst + 1 >= SYNC_MIN_BURSTS && best_rtt <= SYNC_GOOD_RTT_NS) break;
        if (burst + 1 >= SYNC_OK_BURSTS && best_rtt <= SYNC_OK_RTT_NS) break;
        if (hvprof_mono_ns() - t_start > budget_ns) break;
    }
    out[0] = best_off;
    out[1] = (best_rtt + 1) / 2 + res_ns;
    out[2] = best_b;
}

static void ping_pong_leaders(MPI_Comm leaders, clock_sync *out)
{
    int me = 0, n = 1;
    PMPI_Comm_rank(leaders, &me);
    PMPI_Comm_size(leaders, &n);
    int64_t res_ns = sync_clock_res_ns();
    if (me == 0) {
        int64_t budget = SYNC_TOTAL_NS / (n > 1 ? n - 1 : 1);
        if (budget > SYNC_BUDGET_NS) budget = SYNC_BUDGET_NS;
        if (budget < SYNC_MIN_BUDGET_NS) budget = SYNC_MIN_BUDGET_NS;
        for (int r = 1; r < n; r++) {
            int64_t res[3];
            sync_measure_leader(leaders, r, res_ns, budget, res);
            PMPI_Send(res, 3, MPI_INT64_T, r, SYNC_TAG_DONE, leaders);
        }
        *out = (clock_sync){0, 0, hvprof_mono_ns()};
        return;
    }
    /* A leader answers pings until rank 0 sends the result.  Between bursts
     * (and while waiting its turn) it sleeps, so the first ping of a burst
     * wakes it; inside a burst it waits spinning, for the fastest answer. */
    int idle = 1;
    for (;;) {
        int64_t m[3] = {0, 0, 0};
        MPI_Status st;
        if (idle) {
            MPI_Request req;
            PMPI_Irecv(m, 3, MPI_INT64_T, 0, MPI_ANY_TAG, leaders, &req);
            sync_wait_idle(&req, &st);
        } else {
            PMPI_Recv(m, 3, MPI_INT64_T, 0, MPI_ANY_TAG, leaders, &st);
        }
        if (st.MPI_TAG == SYNC_TAG_DONE) {
            /* granularity of this side's clock too */
            *out = (clock_sync){m[0], m[1] + res_ns, m[2]};
            return;
        }
        if (st.MPI_TAG == SYNC_TAG_END) {
            idle = 1;
            continue;
        }
        idle = 0;
        int64_t b = hvprof_mono_ns();
        PMPI_Send(&b, 1, MPI_INT64_T, 0, SYNC_TAG, leaders);
    }
}

/* HOROVOD_PROFILE_CLOCK_SYNC=rank: every rank measures its own offset, as if
 * each were on its own host (diagnostics; it runs the several-host path on
 * one machine).  Read once at MPI_Init: the same value on every rank. */
int mpi_sync_per_rank(void)
{
    return hvprof_setting_int(HVS_CLOCK_SYNC) == 1; /* host|rank */
}

/* Returns the number of clock domains (leaders) that took part. */
int mpi_estimate_offsets(MPI_Comm prof_comm, int rank, int per_rank, clock_sync *out)
{
    int64_t res[3] = {0, 0, hvprof_mono_ns()};
    int hosts = 1, lrank = 0;
    MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    if (per_rank || PMPI_Comm_split_type(prof_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                         &local) != MPI_SUCCESS)
        local = MPI_COMM_NULL;
    if (local != MPI_COMM_NULL) PMPI_Comm_rank(local, &lrank);
    else lrank = 0; /* no host grouping: every rank measures */
    PMPI_Comm_split(prof_comm, lrank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
    if (leaders != MPI_COMM_NULL) {
        clock_sync mine;
        PMPI_Comm_size(leaders, &hosts);
        ping_pong_leaders(leaders, &mine);
        res[0] = mine.offset;
        res[1] = mine.err;
        res[2] = mine.at;
        PMPI_Comm_free(&leaders);
    }
    if (local != MPI_COMM_NULL) {
        MPI_Request req; /* one host, one clock: `at` holds */
        PMPI_Ibcast(res, 3, MPI_INT64_T, 0, local, &req);
        sync_wait_idle(&req, NULL);
        PMPI_Comm_free(&local);
    }
    MPI_Request req;
    PMPI_Ibcast(&hosts, 1, MPI_INT, 0, prof_comm, &req);
    sync_wait_idle(&req, NULL);
    *out = (clock_sync){res[0], res[1], res[2]};
    return hosts;
}

