/*
 * overhead.c -- nanoseconds the profiler adds per MPI_Allreduce.
 *
 * Run with the profiler preloaded (LD_PRELOAD=$(profiler preload)): then
 * MPI_Allreduce goes through the wrapper and PMPI_Allreduce does not, in the
 * same process, on the same buffers.  Blocks of ITERS calls alternate
 * between the two; the per-call difference of each pair of adjacent blocks
 * is one sample, and the median of the samples is reported per size.
 * Without the profiler loaded both paths are the same function, which gives
 * the noise floor of the method (also reported: run it both ways).
 *
 * Output (rank 0): one line per size: bytes, median ns/call unprofiled,
 * median ns/call profiled, median added ns/call, p25/p75 of the added ns.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef int (*allreduce_fn)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm);

static double block(allreduce_fn f, const void *s, void *r, int n, int iters)
{
    MPI_Datatype t = MPI_BYTE;
    PMPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    for (int i = 0; i < iters; i++) f(n ? s : MPI_IN_PLACE, r, n, t, MPI_BOR, MPI_COMM_WORLD);
    double t1 = now();
    /* rank 0's view is the one reported; agree on it so that both ranks
     * alternate in lockstep */
    double dt = (t1 - t0) / iters;
    PMPI_Bcast(&dt, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return dt;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rounds = argc > 1 ? atoi(argv[1]) : 30;
    const int sizes[] = {0, 8, 4096, 1 << 20};
    char *s = calloc(1 << 20, 1), *r = calloc(1 << 20, 1);
    if (rank == 0) printf("%10s %12s %12s %12s %10s %10s\n", "bytes", "base_ns", "prof_ns", "added_ns", "p25", "p75");
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int n = sizes[k];
        int iters = n >= (1 << 20) ? 50 : n >= 4096 ? 2000 : 20000;
        double *add = malloc(sizeof(double) * rounds), *base = malloc(sizeof(double) * rounds),
               *prof = malloc(sizeof(double) * rounds);
        block(PMPI_Allreduce, s, r, n, iters); /* warm-up */
        block(MPI_Allreduce, s, r, n, iters);
        for (int i = 0; i < rounds; i++) {
            /* alternate the order too, so drift does not favour one side */
            double a, b;
            if (i & 1) { b = block(MPI_Allreduce, s, r, n, iters); a = block(PMPI_Allreduce, s, r, n, iters); }
            else { a = block(PMPI_Allreduce, s, r, n, iters); b = block(MPI_Allreduce, s, r, n, iters); }
            base[i] = a; prof[i] = b; add[i] = b - a;
        }
        qsort(add, rounds, sizeof(double), cmp);
        qsort(base, rounds, sizeof(double), cmp);
        qsort(prof, rounds, sizeof(double), cmp);
        if (rank == 0)
            printf("%10d %12.1f %12.1f %12.1f %10.1f %10.1f\n", n, base[rounds / 2], prof[rounds / 2],
                   add[rounds / 2], add[rounds / 4], add[3 * rounds / 4]);
        free(add); free(base); free(prof);
    }
    MPI_Finalize();
    return 0;
}
