/*
 * nccl_app.c -- a small NCCL program for the profiler's tests, linked against
 * the NCCL and CUDA STAND-INS (tests/standin/nccl_standin.c and cudart_standin.c), run under
 * LD_PRELOAD of libhvprof.so with HOROVOD_PROFILE=1 and no MPI.
 *
 *   nccl_app all      every wrapped call, every datatype, groups, comms
 *   nccl_app pool     event pool exhaustion and collection by later calls
 *   nccl_app steps N  N allreduces of 1024 floats (torchrun-style jobs)
 *   nccl_app capture  one call on a stream being captured, one not
 *
 * Built with -DNO_CUDA it uses no CUDA at all (streams NULL, host buffers):
 * only "steps" is meaningful then.  The last line of output is one JSON
 * object with the handles and the stand-ins' counters the test checks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct standin_comm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef void *cudaStream_t;

ncclResult_t ncclGetVersion(int *);
ncclResult_t ncclGetUniqueId(ncclUniqueId *);
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, void *);
ncclResult_t ncclCommInitAll(ncclComm_t *, int, const int *);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, void *);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclCommAbort(ncclComm_t);
ncclResult_t ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclReduceScatter(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclAllGather(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclBroadcast(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclBcast(void *, size_t, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclReduce(const void *, void *, size_t, int, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclSend(const void *, size_t, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclRecv(void *, size_t, int, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
void standin_nccl_set_delay_us(int);
uint64_t standin_nccl_calls(void);

#ifndef NO_CUDA
int cudaSetDevice(int);
int cudaStreamCreate(cudaStream_t *);
int cudaStreamDestroy(cudaStream_t);
int cudaMalloc(void **, size_t);
int cudaGetLastError(void);
uint64_t standin_total_syncs(void);
uint64_t standin_stream_syncs(cudaStream_t);
uint64_t standin_events_created(void);
uint64_t standin_events_live(void);
uint64_t standin_event_queries(void);
void standin_stream_set_capturing(cudaStream_t, int);
#endif

#define CHECK(x)                                                                        \
    do {                                                                                \
        ncclResult_t r_ = (x);                                                          \
        if (r_ != 0) {                                                                  \
            fprintf(stderr, "nccl_app: %s failed: %d (line %d)\n", #x, r_, __LINE__);    \
            exit(3);                                                                    \
        }                                                                               \
    } while (0)

static int env_int(const char *n, int d)
{
    const char *v = getenv(n);
    return v && *v ? atoi(v) : d;
}

static void *dev_alloc(size_t n)
{
#ifdef NO_CUDA
    return calloc(1, n);
#else
    void *p = NULL;
    cudaMalloc(&p, n);
    memset(p, 0, n);
    return p;
#endif
}

static cudaStream_t new_stream(int device)
{
#ifdef NO_CUDA
    (void)device;
    return NULL;
#else
    cudaStream_t s;
    cudaSetDevice(device);
    cudaStream_t tmp;
    cudaStreamCreate(&tmp);
    s = tmp;
    return s;
#endif
}

static ncclUniqueId make_uid(const char *tag)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    const char *v = getenv("STANDIN_UID");
    snprintf(id.internal, sizeof id.internal, "%s/%s", v ? v : "uid", tag);
    return id;
}

/* The profiler's own counters, when it is loaded (LD_PRELOAD). */
static const char *profiler_json(void)
{
    const char *(*fn)(void);
    void *p = dlsym(RTLD_DEFAULT, "hvprof_nccl_json");
    if (!p) return "null";
    memcpy(&fn, &p, sizeof p);
    return fn();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
    int ver = 0;
    CHECK(ncclGetVersion(&ver));
    ncclUniqueId uid = make_uid("world");
    ncclComm_t comm;
    int dev0 = 0;
#ifndef NO_CUDA
    dev0 = env_int("LOCAL_RANK", 0) % 2;
    cudaSetDevice(dev0);
#endif
    CHECK(ncclCommInitRank(&comm, world, uid, rank));
    cudaStream_t s = new_stream(dev0);
    char *a = dev_alloc(1 << 20), *b = dev_alloc(1 << 20);

    if (strcmp(mode, "steps") == 0) {
        int n = argc > 2 ? atoi(argv[2]) : 10;
        for (int i = 0; i < n; i++) CHECK(ncclAllReduce(a, b, 1024, 7, 0, comm, s));
        CHECK(ncclCommDestroy(comm));
        printf("{\"comm\": \"%p\", \"stream\": \"%p\", \"profiler\": %s}\n", (void *)comm,
               (void *)s, profiler_json());
        return 0;
    }
#ifndef NO_CUDA
    if (strcmp(mode, "all") == 0) {
        /* 1. every datatype: ncclAllReduce of 1000 + dt elements */
        for (int dt = 0; dt < 12; dt++) CHECK(ncclAllReduce(a, b, 1000 + dt, dt, 0, comm, s));
        /* 2. in place, ncclMax */
        CHECK(ncclAllReduce(a, a, 7, 7, 2, comm, s));
        /* 3. each other call once */
        CHECK(ncclReduceScatter(a, b, 100, 7, 0, comm, s));
        CHECK(ncclAllGather(a, b, 50, 4, comm, s));
        CHECK(ncclBroadcast(a, b, 33, 8, 0, comm, s));
        CHECK(ncclBcast(a, 21, 1, 0, comm, s));
        CHECK(ncclReduce(a, b, 17, 2, 1, 0, comm, s));
        CHECK(ncclSend(a, 9, 6, 0, comm, s));
        CHECK(ncclRecv(b, 11, 9, 0, comm, s));
        /* 4. group A: send + recv + allreduce */
        CHECK(ncclGroupStart());
        CHECK(ncclSend(a, 5, 7, 0, comm, s));
        CHECK(ncclRecv(b, 5, 7, 0, comm, s));
        CHECK(ncclAllReduce(a, b, 64, 7, 0, comm, s));
        CHECK(ncclGroupEnd());
        /* 5. group B, nested: two allreduces of 8 doubles */
        CHECK(ncclGroupStart());
        CHECK(ncclGroupStart());
        CHECK(ncclAllReduce(a, b, 8, 8, 0, comm, s));
        CHECK(ncclGroupEnd());
        CHECK(ncclAllReduce(a, b, 8, 8, 0, comm, s));
        CHECK(ncclGroupEnd());
        /* 6. an empty group */
        CHECK(ncclGroupStart());
        CHECK(ncclGroupEnd());
        /* 7. two devices in one process: ncclCommInitAll + a group over both */
        ncclComm_t two[2];
        int devs[2] = {0, 1};
        CHECK(ncclCommInitAll(two, 2, devs));
        cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
        cudaSetDevice(dev0);
        CHECK(ncclGroupStart());
        CHECK(ncclAllReduce(a, b, 16, 7, 0, two[0], s0));
        CHECK(ncclAllReduce(a, b, 16, 7, 0, two[1], s1));
        CHECK(ncclGroupEnd());
        /* 8. split (color 0) and a call on it; a split with no color */
        ncclComm_t sub = NULL, none = (ncclComm_t)1;
        CHECK(ncclCommSplit(comm, 0, rank, &sub, NULL));
        CHECK(ncclCommSplit(comm, -1, rank, &none, NULL));
        CHECK(ncclAllReduce(a, b, 3, 0, 0, sub, s));
        /* 9. InitRankConfig, a call, abort */
        ncclComm_t cfg;
        ncclUniqueId uid2 = make_uid("config");
        CHECK(ncclCommInitRankConfig(&cfg, 1, uid2, 0, NULL));
        CHECK(ncclAllReduce(a, b, 1, 5, 0, cfg, s));
        CHECK(ncclCommAbort(cfg));
        CHECK(ncclCommDestroy(sub));
        /* 10. device time: DELAY_N allreduces of DELAY_US each, back to back,
         * then wait on the host (no synchronize) and make one more call */
        int delay = env_int("APP_DELAY_US", 3000), n = env_int("APP_DELAY_N", 10);
        standin_nccl_set_delay_us(delay);
        for (int i = 0; i < n; i++) CHECK(ncclAllReduce(a, b, 256, 7, 0, comm, s));
        standin_nccl_set_delay_us(0);
        usleep((useconds_t)(delay * n + 20000));
        CHECK(ncclAllReduce(a, b, 2, 7, 0, comm, s));
        printf("{\"comm\": \"%p\", \"two\": [\"%p\", \"%p\"], \"sub\": \"%p\", \"cfg\": \"%p\", "
               "\"none\": \"%p\", \"stream\": \"%p\", \"s0\": \"%p\", \"s1\": \"%p\", "
               "\"nccl_version\": %d, \"standin_calls\": %llu, \"syncs\": %llu, "
               "\"stream_syncs\": %llu, \"events_created\": %llu, \"events_live\": %llu, "
               "\"queries\": %llu, \"last_error\": %d, \"profiler\": %s}\n",
               (void *)comm, (void *)two[0], (void *)two[1], (void *)sub, (void *)cfg,
               (void *)none, (void *)s, (void *)s0, (void *)s1, ver,
               (unsigned long long)standin_nccl_calls(), (unsigned long long)standin_total_syncs(),
               (unsigned long long)standin_stream_syncs(s),
               (unsigned long long)standin_events_created(),
               (unsigned long long)standin_events_live(),
               (unsigned long long)standin_event_queries(), cudaGetLastError(), profiler_json());
        CHECK(ncclCommDestroy(comm));
        return 0;
    }
    if (strcmp(mode, "pool") == 0) {
        /* HOROVOD_PROFILE_NCCL_EVENTS=4, no helper thread: 10 slow calls
         * (4 get events, 6 find the pool empty), a wait, then 16 quick ones
         * whose first collects the 4 finished pairs. */
        int delay = env_int("APP_DELAY_US", 20000);
        standin_nccl_set_delay_us(delay);
        for (int i = 0; i < 10; i++) CHECK(ncclAllReduce(a, b, 128, 7, 0, comm, s));
        char mid[4096];
        snprintf(mid, sizeof mid, "%s", profiler_json());
        standin_nccl_set_delay_us(0);
        usleep((useconds_t)(delay * 10 + 20000));
        for (int i = 0; i < 16; i++) CHECK(ncclAllReduce(a, b, 64, 7, 0, comm, s));
        printf("{\"syncs\": %llu, \"events_created\": %llu, \"last_error\": %d, "
               "\"mid\": %s, \"profiler\": %s}\n",
               (unsigned long long)standin_total_syncs(),
               (unsigned long long)standin_events_created(), cudaGetLastError(), mid,
               profiler_json());
        return 0;
    }
    if (strcmp(mode, "capture") == 0) {
        standin_stream_set_capturing(s, 1);
        CHECK(ncclAllReduce(a, b, 10, 7, 0, comm, s));
        standin_stream_set_capturing(s, 0);
        CHECK(ncclAllReduce(a, b, 10, 7, 0, comm, s));
        printf("{\"syncs\": %llu, \"last_error\": %d, \"profiler\": %s}\n",
               (unsigned long long)standin_total_syncs(), cudaGetLastError(), profiler_json());
        return 0;
    }
#endif
    fprintf(stderr, "nccl_app: unknown mode %s\n", mode);
    return 2;
}
