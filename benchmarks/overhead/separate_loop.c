/*
 * separate_loop.c -- a user's program for benchmarks/overhead/separate.py: N
 * calls of MPI_Allreduce (MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, separate send
 * and receive buffers) in a plain loop, nothing else.  The profiler (or
 * mpiP) is not linked in: separate.py runs it with and without LD_PRELOAD.
 *
 *   separate_loop BYTES CALLS
 *
 * Timed: the loop alone, between an MPI_Barrier and the last call (the
 * slowest rank's time is reported).  Also: the CPU time over the loop of the
 * calling thread and of the process's other threads (a profiler's helper
 * thread, MPI's progress threads), averaged over ranks, and the time spent
 * in MPI_Init and MPI_Finalize (where profilers do their set-up and
 * reports).  Rank 0 prints one line:
 *
 *   RESULT loop_ns N main_cpu_ns N other_cpu_ns N init_ms N finalize_ms N
 *
 * (per call: loop_ns, main_cpu_ns, other_cpu_ns; per run: init_ms, finalize_ms).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    double t_start = now(CLOCK_MONOTONIC);
    MPI_Init(&argc, &argv);
    double t_init = now(CLOCK_MONOTONIC);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long bytes = argc > 1 ? atol(argv[1]) : 0, calls = argc > 2 ? atol(argv[2]) : 300000;
    int count = (int)(bytes / (long)sizeof(float));
    float *s = calloc((size_t)count + 1, sizeof(float)), *r = calloc((size_t)count + 1, sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    double p0 = now(CLOCK_PROCESS_CPUTIME_ID), m0 = now(CLOCK_THREAD_CPUTIME_ID);
    double t0 = now(CLOCK_MONOTONIC);
    for (long i = 0; i < calls; i++) MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t1 = now(CLOCK_MONOTONIC);
    double p1 = now(CLOCK_PROCESS_CPUTIME_ID), m1 = now(CLOCK_THREAD_CPUTIME_ID);
    double loop = t1 - t0, slowest = 0, cpu[2] = {m1 - m0, (p1 - p0) - (m1 - m0)}, sum[2] = {0, 0};
    MPI_Reduce(&loop, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(cpu, sum, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    double t_fin = now(CLOCK_MONOTONIC);
    MPI_Finalize();
    double t_end = now(CLOCK_MONOTONIC);
    if (rank == 0)
        printf("RESULT loop_ns %.3f main_cpu_ns %.3f other_cpu_ns %.3f init_ms %.3f finalize_ms %.3f\n",
               slowest / calls, sum[0] / size / calls, sum[1] / size / calls, (t_init - t_start) / 1e6,
               (t_end - t_fin) / 1e6);
    free(s);
    free(r);
    return 0;
}
