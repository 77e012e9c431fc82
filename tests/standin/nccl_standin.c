/*
 * nccl_standin.c -- a STAND-IN for NCCL, for tests only.
 *
 * Built by tests/test_nccl_standin.py as libnccl.so.2 (soname libnccl.so.2)
 * in a temporary directory.  It is not NCCL: nothing is communicated.  Each
 * rank behaves as if every peer held the same data (allreduce = copy,
 * allgather/reducescatter copy this rank's block, broadcast copies at the
 * root), which is all the profiler tests need.
 *
 * Each collective enqueues STANDIN_NCCL_DELAY_US microseconds of virtual work
 * on its stream through the CUDA stand-in (standin_stream_enqueue, looked up
 * at run time so this library also works in a process without the CUDA
 * stand-in); standin_nccl_set_delay_us() overrides the variable.  Calls
 * between ncclGroupStart and ncclGroupEnd are queued and launched by the
 * outermost ncclGroupEnd, as NCCL does.  ncclBcast calls ncclBroadcast and
 * ncclCommInitAll calls ncclGroupStart/End through their exported symbols, as
 * NCCL does, so the profiler's handling of NCCL-internal calls is exercised.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct ncclConfig ncclConfig_t;

enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

typedef struct standin_comm {
    int magic;
    int nranks;
    int rank;
    int device;
    ncclUniqueId id;
} standin_comm;
typedef standin_comm *ncclComm_t;

#define COMM_MAGIC 0x5354414e /* "STAN" */

static const int TYPE_SIZE[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static _Atomic int delay_override = -1;
static _Atomic uint64_t n_calls, n_group_launches;

typedef struct item {
    cudaStream_t stream;
    int64_t dur_ns;
} item;

static __thread int group_depth;
static __thread item queued[256];
static __thread int n_queued;

static int64_t delay_ns(void)
{
    int d = atomic_load(&delay_override);
    if (d < 0) {
        const char *v = getenv("STANDIN_NCCL_DELAY_US");
        d = v && *v ? atoi(v) : 0;
    }
    return (int64_t)d * 1000;
}

static void launch(cudaStream_t s, int64_t dur)
{
    static int64_t (*enqueue)(cudaStream_t, int64_t);
    static int looked;
    if (!looked) {
        void *p = dlsym(RTLD_DEFAULT, "standin_stream_enqueue");
        memcpy(&enqueue, &p, sizeof p);
        looked = 1;
    }
    if (enqueue) enqueue(s, dur);
}

static ncclResult_t work(ncclComm_t comm, ncclDataType_t dt, cudaStream_t s)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    if (dt < 0 || dt >= 12) return ncclInvalidArgument;
    atomic_fetch_add(&n_calls, 1);
    if (group_depth > 0) {
        if (n_queued < 256) queued[n_queued++] = (item){s, delay_ns()};
    } else {
        launch(s, delay_ns());
    }
    return ncclSuccess;
}

API ncclResult_t ncclGetVersion(int *v)
{
    *v = 22105; /* pretends to be 2.21.5 */
    return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error (stand-in)" : "error (stand-in)";
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "standin-%d-%ld", (int)getpid(), (long)random());
    return ncclSuccess;
}

static ncclResult_t make_comm(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                              int device)
{
    if (!out || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    standin_comm *c = calloc(1, sizeof *c);
    c->magic = COMM_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->device = device;
    if (id) c->id = *id;
    *out = c;
    return ncclSuccess;
}

static int current_device(void)
{
    static int (*get)(int *);
    void *p = dlsym(RTLD_DEFAULT, "cudaGetDevice");
    memcpy(&get, &p, sizeof p);
    int d = 0;
    if (get) get(&d);
    return d;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return make_comm(comm, nranks, &id, rank, current_device());
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                        ncclConfig_t *config)
{
    (void)config;
    return make_comm(comm, nranks, &id, rank, current_device());
}

API ncclResult_t ncclGroupStart(void);
API ncclResult_t ncclGroupEnd(void);

API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1) return ncclInvalidArgument;
    ncclGroupStart(); /* through the exported symbol, as NCCL does */
    for (int i = 0; i < ndev; i++) make_comm(&comms[i], ndev, NULL, i, devlist ? devlist[i] : i);
    return ncclGroupEnd();
}

API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               ncclConfig_t *config)
{
    (void)key;
    (void)config;
    if (!comm || comm->magic != COMM_MAGIC || !newcomm) return ncclInvalidArgument;
    if (color == -1) { /* NCCL_SPLIT_NOCOLOR */
        *newcomm = NULL;
        return ncclSuccess;
    }
    return make_comm(newcomm, 1, NULL, 0, comm->device);
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

API ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)op;
    ncclResult_t rc = work(comm, dt, stream);
    if (rc == ncclSuccess && s != r) memmove(r, s, count * TYPE_SIZE[dt]);
    return rc;
}

API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t dt,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)op;
    ncclResult_t rc = work(comm, dt, stream);
    if (rc == ncclSuccess) {
        size_t blk = recvcount * TYPE_SIZE[dt];
        const char *src = (const char *)s + (size_t)comm->rank * blk;
        if (src != r) memmove(r, src, blk);
    }
    return rc;
}

API ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t dt,
                               ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t rc = work(comm, dt, stream);
    if (rc == ncclSuccess) {
        size_t blk = sendcount * TYPE_SIZE[dt];
        for (int i = 0; i < comm->nranks; i++) {
            char *dst = (char *)r + (size_t)i * blk;
            if (dst != s) memmove(dst, s, blk);
        }
    }
    return rc;
}

API ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t dt, int root,
                               ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t rc = work(comm, dt, stream);
    if (rc == ncclSuccess && root == comm->rank && s != r) memmove(r, s, count * TYPE_SIZE[dt]);
    return rc;
}

API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, dt, root, comm, stream); /* exported symbol */
}

API ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
                            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)op;
    ncclResult_t rc = work(comm, dt, stream);
    if (rc == ncclSuccess && root == comm->rank && s != r) memmove(r, s, count * TYPE_SIZE[dt]);
    return rc;
}

API ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t dt, int peer,
                          ncclComm_t comm, cudaStream_t stream)
{
    (void)s;
    (void)count;
    (void)peer;
    return work(comm, dt, stream);
}

API ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                          cudaStream_t stream)
{
    (void)r;
    (void)count;
    (void)peer;
    return work(comm, dt, stream);
}

API ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth == 0) {
        for (int i = 0; i < n_queued; i++) launch(queued[i].stream, queued[i].dur_ns);
        if (n_queued) atomic_fetch_add(&n_group_launches, 1);
        n_queued = 0;
    }
    return ncclSuccess;
}

/* ---- stand-in controls and counters (not NCCL API) ---------------------- */
API void standin_nccl_set_delay_us(int us) { atomic_store(&delay_override, us); }
API uint64_t standin_nccl_calls(void) { return atomic_load(&n_calls); }
API uint64_t standin_nccl_group_launches(void) { return atomic_load(&n_group_launches); }
