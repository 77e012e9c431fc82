/* A rank that records R application records (no communication: the
 * library's own hvprof_record_app, looked up at run time), then times its
 * MPI_Finalize, where the profiler gathers the files of the ranks whose disk
 * rank 0 cannot see (hooks/mpi_gather.c).  Rank 0 prints one JSON line:
 * finalize seconds and its peak resident memory before and after.
 *
 *     gather_job R
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long hwm_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int (*record)(int, uint64_t, uint64_t, uint64_t, uint32_t) =
        (int (*)(int, uint64_t, uint64_t, uint64_t, uint32_t))dlsym(RTLD_DEFAULT,
                                                                      "hvprof_record_app");
    uint64_t (*now)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "hvprof_now");
    for (long i = 0; record && now && i < n; i++) {
        uint64_t t = now();
        record(33, t, t + 1, 1, (uint32_t)i); /* APP_MARK: no step hooks */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    long before = hwm_kb();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    MPI_Finalize();
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (rank == 0)
        printf("{\"records\": %ld, \"finalize_s\": %.6f, \"hwm_before_kb\": %ld, "
               "\"hwm_after_kb\": %ld}\n", n,
               (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9, before,
               hwm_kb());
    return 0;
}
