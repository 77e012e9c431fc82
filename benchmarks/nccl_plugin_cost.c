/*
 * nccl_plugin_cost.c -- host cost per NCCL call through the profiler-plugin
 * path, measured against the NCCL STAND-IN (tests/standin/nccl_standin.c,
 * linked in statically, as Horovod links NCCL).  Not NCCL: the figure is
 * the plugin path's own cost (4 plugin calls per collective: Group and Coll
 * start/stop, descriptors filled by the stand-in) on top of a call that does
 * nothing.  Built and run by benchmarks/nccl_plugin_cost.sh.
 *
 *   nccl_plugin_cost N    N ncclAllReduce of 1024 floats; prints the main
 *                         thread's CPU ns per call (CLOCK_THREAD_CPUTIME_ID,
 *                         steadier than wall time on a busy machine)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct standin_comm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclCommDestroy(ncclComm_t);

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    snprintf(id.internal, sizeof id.internal, "bench");
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 1, id, 0) != 0) return 3;
    static float a[1024], b[1024];
    for (long i = 0; i < n / 10; i++) ncclAllReduce(a, b, 1024, 7, 0, comm, NULL); /* warm */
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++) ncclAllReduce(a, b, 1024, 7, 0, comm, NULL);
    double t1 = cpu_ns();
    printf("%.1f\n", (t1 - t0) / (double)n);
    ncclCommDestroy(comm);
    return 0;
}
