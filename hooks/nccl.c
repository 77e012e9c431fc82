/*
 * nccl.c -- NCCL interposition.
 *
 * Every wrapper finds the real function lazily: dlsym(RTLD_NEXT), else (a
 * libnccl loaded RTLD_LOCAL, invisible to RTLD_NEXT) dlsym on the handle of a
 * libnccl found with dl_iterate_phdr.  No nccl.h: the types below are NCCL's
 * documented ABI (opaque communicator, 128-byte unique id, int-sized enums).
 * Where no NCCL exists the library loads and works; a wrapper called without
 * a real function behind it returns ncclSystemError.
 *
 * Records (hooks/hvprof_format.h):
 *   - one host record per call on the calling thread: t_start/t_end bracket
 *     the real call (the enqueue: NCCL returns before the GPU runs it),
 *     bytes = count x type size (ncclReduceScatter: recvcount x nranks, the
 *     send buffer; ncclRecv: the bytes received), dtype, redop, root or peer,
 *     comm, seq (per-communicator call number), aux = group number (0 = not
 *     in a group);
 *   - one DEVICE record per call outside groups, on the stream's track, from
 *     CUDA events before and after the call (cuda_rt.c); aux = the host
 *     record's track.  Its comm/seq/op equal the host record's.  When no
 *     device record will come (no CUDA, event pool exhausted, stream being
 *     captured, ncclInProgress), the host record carries DEVICE_PENDING;
 *   - groups: the calls between the outermost ncclGroupStart/ncclGroupEnd
 *     are recorded individually with GROUPED and aux = group number, without
 *     device records of their own (NCCL launches a group's work in
 *     ncclGroupEnd); the group is one NCCL_GROUP record (t_start = outermost
 *     ncclGroupStart, t_end = ncclGroupEnd's return, count = calls, bytes =
 *     their sum, seq = aux = group number, comm = first call's) plus one
 *     DEVICE record from events around ncclGroupEnd on the stream of the
 *     group's first call.  Empty groups (NCCL's own, e.g. inside
 *     ncclCommInitAll) are counted, not recorded.
 * NCCL calls made by NCCL itself (ncclBcast calls ncclBroadcast through its
 * exported symbol) pass through unrecorded: a per-thread nesting count.
 *
 * Communicators: id = hash of the ncclUniqueId bytes (ncclCommInitRank,
 * ncclCommInitRankConfig, ncclCommInitRankScalable: equal on every member);
 * ncclCommSplit: hash of (parent id, split number on the parent, color);
 * ncclCommInitAll: hash of (pid, call number) -- all members live in this
 * process.  A communicator first seen in a collective gets a per-process id.
 * Size and rank come from the init arguments or ncclCommCount /
 * ncclCommUserRank; the device from ncclCommCuDevice.
 *
 * NCCL's profiler-plugin path (nccl_plugin.c) sees the same calls when NCCL
 * is shared: it stays silent while a wrapper here is inside the real call on
 * the same thread (hvprof_nccl_nest, nccl_common.h), so each call is
 * recorded once.  The two paths share nccl_common.c and name nothing of
 * each other.
 *
 * A process that never calls MPI_Init (torchrun) opens its raw file at its
 * first NCCL call when HOROVOD_PROFILE is on (rank, world size and local rank
 * from the launcher's environment: hvprof_open).
 *
 * Files: nccl_lookup.c finds the real NCCL and registers communicators;
 * this file holds the wrappers and their recording path; nccl_backend.c the
 * Python side's view (hvprof_nccl_visible, hvprof_nccl_json), the end of
 * NCCL profiling (hvprof_nccl_finish) and the backend.  What they share:
 * nccl_internal.h.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "cuda_rt.h"
#include "hvprof_internal.h"
#include "nccl_common.h"
#include "nccl_internal.h"

/* ------------------------------------------------------------------------ */
/* State.                                                                    */

typedef struct nccl_tls {
    int depth;             /* ncclGroupStart depth seen on this thread */
    uint32_t group;        /* number of the current outermost group, 0 none */
    uint32_t g_calls;
    uint32_t g_comm;
    int g_device;
    int g_have_stream;
    uint64_t g_t0;
    uint64_t g_bytes;
    cudaStream_t g_stream;
} nccl_tls;

static __thread nccl_tls nt __attribute__((tls_model("initial-exec")));

static _Atomic uint32_t group_counter;
static _Atomic uint32_t initall_counter;
_Atomic uint64_t c_empty_groups, c_nested;
/* Records written by these wrappers (of hvprof_nccl_calls: both paths'). */
_Atomic uint64_t c_wrapper_records;

/* ------------------------------------------------------------------------ */
/* Activation.                                                               */

/* Is recording on?  (The first NCCL call of a process without a file opens
 * one: nccl_common.h.) */
static inline int recording(void) { return hvprof_nccl_recording(); }

/* ------------------------------------------------------------------------ */
/* The recording path.                                                       */

typedef struct call {
    uint16_t op;
    uint8_t dtype;
    uint8_t redop;
    uint32_t dtype_size;
    int32_t root;
    uint16_t flags;
    uint64_t count;
    uint64_t bytes;
    ncclComm_t comm;
    cudaStream_t stream;
    uint32_t comm_idx;
    int device;
    int miss;
    uint64_t t0;
    hvprof_devpair *pair;
} call;

static inline void call_init(call *c, uint16_t op, uint64_t count, ncclDataType_t dt,
                             ncclRedOp_t redop, int has_redop, int root, ncclComm_t comm,
                             cudaStream_t stream)
{
    c->op = op;
    if (dt >= 0 && dt < HVPROF_NCCL_N_DTYPES) {
        c->dtype = hvprof_nccl_dtypes[dt].code;
        c->dtype_size = hvprof_nccl_dtypes[dt].size;
    } else {
        c->dtype = HVPROF_DT_UNKNOWN;
        c->dtype_size = 0;
    }
    c->redop = has_redop ? hvprof_nccl_redop(redop) : HVPROF_REDOP_NONE;
    c->root = root;
    c->flags = 0;
    c->count = count;
    c->bytes = count * c->dtype_size;
    c->comm = comm;
    c->stream = stream;
    c->comm_idx = comm_index(comm);
    c->device = comm_device(c->comm_idx);
    c->miss = HVPROF_DEV_MISS_NONE;
    c->pair = NULL;
}

/* Just before the real call. */
static inline void call_begin(call *c)
{
    if (nt.depth > 0) {
        c->flags |= HVPROF_FLAG_GROUPED;
        if (!nt.g_have_stream) {
            nt.g_have_stream = 1;
            nt.g_stream = c->stream;
            nt.g_device = c->device;
            nt.g_comm = c->comm_idx;
        }
        nt.g_calls++;
        nt.g_bytes += c->bytes;
    } else {
        c->pair = hvprof_dev_begin(c->stream, &c->device, &c->miss);
    }
    c->t0 = hvprof_ticks();
}

/* The host record, through the common emit path (rec->track is then the
 * calling thread's: the device record's aux). */
static inline void write_host(hvprof_record *rec) { (void)hvprof_emit(rec); }

/* Just after the real call. */
static inline void call_end(call *c, ncclResult_t rc)
{
    uint64_t t1 = hvprof_ticks();
    if (c->pair) {
        if (rc == NCCL_IN_PROGRESS) {
            hvprof_dev_cancel(c->pair, HVPROF_DEV_MISS_IN_PROGRESS);
            c->pair = NULL;
            c->miss = HVPROF_DEV_MISS_IN_PROGRESS;
        } else if (rc != NCCL_SUCCESS) {
            hvprof_dev_cancel(c->pair, HVPROF_DEV_MISS_NONE); /* no work: no miss */
            c->pair = NULL;
        } else if (hvprof_dev_end(c->pair, c->stream) != 0) {
            c->pair = NULL;
            c->miss = HVPROF_DEV_MISS_RECORD_ERROR;
        }
    }
    uint16_t flags = c->flags;
    if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) flags |= HVPROF_FLAG_ERROR;
    if (c->miss != HVPROF_DEV_MISS_NONE) flags |= HVPROF_FLAG_DEVICE_PENDING;
    hvprof_record rec = {
        .t_start = c->t0,
        .t_end = t1,
        .bytes = c->bytes,
        .count = c->count,
        .seq = hvprof_comm_next_seq(c->comm_idx),
        .comm = c->comm_idx,
        .track = HVPROF_TRACK_SELF,
        .root = c->root,
        .op = c->op,
        .dtype = c->dtype,
        .redop = c->redop,
        .flags = flags,
        .rc = (int16_t)(rc > INT16_MAX ? INT16_MAX : rc < INT16_MIN ? INT16_MIN : rc),
        .dtype_size = c->dtype_size,
        .aux = (flags & HVPROF_FLAG_GROUPED) ? nt.group : 0,
    };
    write_host(&rec);
    hvprof_nccl_count(c->op);
    atomic_fetch_add_explicit(&c_wrapper_records, 1, memory_order_relaxed);
    if (c->pair) hvprof_dev_submit(c->pair, &rec, c->stream);
    if (c->device >= 0 && !(flags & HVPROF_FLAG_GROUPED)) hvprof_dev_poll(c->device);
}

/* HOROVOD_PROFILE_NCCL_WRAPPERS=0: every wrapper passes straight through
 * (NCCL is then seen only through its profiler plugin, as a statically
 * linked NCCL is: benchmarks/gpu_check.py's "plugin" path in a Python
 * process, where activation puts the library in the global scope). */
static _Atomic int w_off = -1;
static inline int wrappers_off(void)
{
    int v = atomic_load_explicit(&w_off, memory_order_relaxed);
    if (HVPROF_LIKELY(v >= 0)) return v;
    v = !hvprof_setting_int(HVS_NCCL_WRAPPERS);
    atomic_store_explicit(&w_off, v, memory_order_relaxed);
    return v;
}

/* Wrapper bodies: pass through when not recording or nested. */
#define PASS_IF_OFF(expr)                                                    \
    if (HVPROF_UNLIKELY(hvprof_nccl_nest > 0)) {                                      \
        atomic_fetch_add_explicit(&c_nested, 1, memory_order_relaxed);       \
        return expr;                                                         \
    }                                                                        \
    if (HVPROF_UNLIKELY(wrappers_off()) || !recording()) return expr;

/* This thread's flight-recorder entry when it is valid (NULL before the
 * thread's first record, or when the file it points into was replaced). */
static inline hvprof_inflight_entry *nccl_inflight(void)
{
    hvprof_tls *t = &hvprof_t;
    if (t->generation != atomic_load_explicit(&hvprof_generation, memory_order_relaxed))
        return NULL;
    return t->inflight;
}

/* The flight recorder (hvprof_inflight_begin/end, as mpi.c): the host call
 * is in the rank's file header while NCCL has it, so that a call that never
 * returns (a blocking NCCL, a communicator that hangs in enqueue) shows in
 * `profiler hang`; a call inside a group is covered by its ncclGroupEnd. */
#define RECORD_CALL(c, expr)                                                 \
    do {                                                                     \
        hvprof_nccl_nest++;                                                           \
        call_begin(c);                                                       \
        hvprof_inflight_entry *inflight_ = nt.depth > 0 ? NULL : nccl_inflight(); \
        if (inflight_)                                                       \
            hvprof_inflight_begin(inflight_, (c)->op, (uint64_t)(uintptr_t)(c)->comm, \
                                  (c)->t0);                                  \
        ncclResult_t rc_ = expr;                                             \
        if (inflight_) hvprof_inflight_end(inflight_);                       \
        call_end(c, rc_);                                                    \
        hvprof_nccl_nest--;                                                           \
        return rc_;                                                          \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Collectives and point-to-point.                                           */

/* One wrapper, the same shape for every call (and the same as mpi.c's
 * MPI_WRAPPER): the function's name, its parameter list and the same names as
 * the argument list, each written once; the real function's type comes from
 * the parameter list.  The statements after them describe the call into
 * `call c` (call_init, then any adjustment) before the real call is made. */
#define NCCL_WRAPPER(NAME, PARAMS, ARGS, ...)                                \
    typedef ncclResult_t (*NAME##_fn) PARAMS;                                \
    HVPROF_EXPORT ncclResult_t NAME PARAMS                                   \
    {                                                                        \
        REAL(NAME##_fn, NAME);                                               \
        PASS_IF_OFF(real ARGS);                                              \
        call c;                                                              \
        __VA_ARGS__;                                                         \
        RECORD_CALL(&c, real ARGS);                                          \
    }

NCCL_WRAPPER(ncclAllReduce,
             (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, op, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_ALLREDUCE, count, datatype, op, 1, -1, comm, stream);
             if (sendbuff == recvbuff) c.flags |= HVPROF_FLAG_IN_PLACE)

NCCL_WRAPPER(ncclReduceScatter,
             (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, recvcount, datatype, op, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_REDUCESCATTER, recvcount, datatype, op, 1, -1, comm,
                       stream);
             int n = comm_size(c.comm_idx), r = comm_rank(c.comm_idx);
             if (n > 0) { /* the send buffer: recvcount per rank */
                 c.count = (uint64_t)recvcount * (uint64_t)n;
                 c.bytes = c.count * c.dtype_size;
             }
             if (r >= 0 && (const char *)recvbuff == (const char *)sendbuff +
                                                         (size_t)r * recvcount * c.dtype_size)
                 c.flags |= HVPROF_FLAG_IN_PLACE)

NCCL_WRAPPER(ncclAllGather,
             (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
              ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, sendcount, datatype, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_ALLGATHER, sendcount, datatype, 0, 0, -1, comm, stream);
             int r = comm_rank(c.comm_idx);
             if (r >= 0 && (const char *)sendbuff == (const char *)recvbuff +
                                                         (size_t)r * sendcount * c.dtype_size)
                 c.flags |= HVPROF_FLAG_IN_PLACE)

NCCL_WRAPPER(ncclBroadcast,
             (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
              int root, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, root, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_BROADCAST, count, datatype, 0, 0, root, comm, stream);
             if (sendbuff == recvbuff) c.flags |= HVPROF_FLAG_IN_PLACE)

NCCL_WRAPPER(ncclBcast,
             (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
              cudaStream_t stream),
             (buff, count, datatype, root, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_BCAST, count, datatype, 0, 0, root, comm, stream);
             c.flags |= HVPROF_FLAG_IN_PLACE)

NCCL_WRAPPER(ncclReduce,
             (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
              ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, op, root, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_REDUCE, count, datatype, op, 1, root, comm, stream);
             if (sendbuff == recvbuff) c.flags |= HVPROF_FLAG_IN_PLACE)

NCCL_WRAPPER(ncclSend,
             (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
              ncclComm_t comm, cudaStream_t stream),
             (sendbuff, count, datatype, peer, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_SEND, count, datatype, 0, 0, peer, comm, stream))

NCCL_WRAPPER(ncclRecv,
             (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
              cudaStream_t stream),
             (recvbuff, count, datatype, peer, comm, stream),
             call_init(&c, HVPROF_OP_NCCL_RECV, count, datatype, 0, 0, peer, comm, stream))

/* ------------------------------------------------------------------------ */
/* Groups.                                                                   */

typedef ncclResult_t (*void_fn)(void);

HVPROF_EXPORT ncclResult_t ncclGroupStart(void)
{
    REAL(void_fn, ncclGroupStart);
    if (hvprof_nccl_nest > 0 || wrappers_off()) return real();
    uint64_t t = hvprof_ticks();
    hvprof_nccl_nest++;
    ncclResult_t rc = real();
    hvprof_nccl_nest--;
    if (rc != NCCL_SUCCESS) return rc;
    if (nt.depth++ == 0) {
        nt.group = recording() ? atomic_fetch_add(&group_counter, 1) + 1 : 0;
        nt.g_t0 = t;
        nt.g_calls = 0;
        nt.g_bytes = 0;
        nt.g_have_stream = 0;
        nt.g_stream = NULL;
        nt.g_device = -1;
        nt.g_comm = UINT32_MAX;
    }
    return rc;
}

HVPROF_EXPORT ncclResult_t ncclGroupEnd(void)
{
    REAL(void_fn, ncclGroupEnd);
    if (hvprof_nccl_nest > 0 || nt.depth <= 0) return real(); /* NCCL's own, or unbalanced */
    if (nt.depth > 1) {
        hvprof_nccl_nest++;
        ncclResult_t rc = real();
        hvprof_nccl_nest--;
        nt.depth--;
        return rc;
    }
    int rec = nt.group != 0 && nt.g_calls > 0 && recording();
    hvprof_devpair *pair = NULL;
    int miss = HVPROF_DEV_MISS_NONE, device = nt.g_device;
    if (rec && nt.g_have_stream) pair = hvprof_dev_begin(nt.g_stream, &device, &miss);
    hvprof_nccl_nest++;
    ncclResult_t rc = real();
    hvprof_nccl_nest--;
    uint64_t t1 = hvprof_ticks();
    nt.depth = 0;
    if (pair) {
        if (rc == NCCL_IN_PROGRESS) {
            hvprof_dev_cancel(pair, HVPROF_DEV_MISS_IN_PROGRESS);
            pair = NULL;
            miss = HVPROF_DEV_MISS_IN_PROGRESS;
        } else if (rc != NCCL_SUCCESS) {
            hvprof_dev_cancel(pair, HVPROF_DEV_MISS_NONE);
            pair = NULL;
        } else if (hvprof_dev_end(pair, nt.g_stream) != 0) {
            pair = NULL;
            miss = HVPROF_DEV_MISS_RECORD_ERROR;
        }
    }
    if (rec) {
        uint16_t flags = 0;
        if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) flags |= HVPROF_FLAG_ERROR;
        if (miss != HVPROF_DEV_MISS_NONE) flags |= HVPROF_FLAG_DEVICE_PENDING;
        hvprof_record r = {
            .t_start = nt.g_t0,
            .t_end = t1,
            .bytes = nt.g_bytes,
            .count = nt.g_calls,
            .seq = nt.group,
            .comm = nt.g_comm,
            .track = HVPROF_TRACK_SELF,
            .root = -1,
            .op = HVPROF_OP_NCCL_GROUP,
            .dtype = HVPROF_DT_UNKNOWN,
            .redop = HVPROF_REDOP_NONE,
            .flags = flags,
            .rc = (int16_t)(rc > INT16_MAX ? INT16_MAX : rc),
            .dtype_size = 0,
            .aux = nt.group,
        };
        write_host(&r);
        hvprof_nccl_count(HVPROF_OP_NCCL_GROUP);
        atomic_fetch_add_explicit(&c_wrapper_records, 1, memory_order_relaxed);
        if (pair) hvprof_dev_submit(pair, &r, nt.g_stream);
        if (device >= 0) hvprof_dev_poll(device);
    } else if (nt.group != 0 && nt.g_calls == 0) {
        atomic_fetch_add(&c_empty_groups, 1);
    }
    nt.group = 0;
    nt.g_calls = 0;
    nt.g_have_stream = 0;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Communicator creation and destruction (no records; the comm table).       */

/* A communicator-creating wrapper, in NCCL_WRAPPER's shape: name, parameter
 * list and argument list once; the statements after them run once the real
 * call returned, with rc (its result) and on (recording was on when the call
 * was made) in scope, and register the new communicator(s). */
#define NCCL_COMM_WRAPPER(NAME, PARAMS, ARGS, ...)                           \
    typedef ncclResult_t (*NAME##_fn) PARAMS;                                \
    HVPROF_EXPORT ncclResult_t NAME PARAMS                                   \
    {                                                                        \
        REAL(NAME##_fn, NAME);                                               \
        if (hvprof_nccl_nest > 0 || wrappers_off()) return real ARGS;                 \
        int on = recording();                                                \
        hvprof_nccl_nest++;                                                           \
        ncclResult_t rc = real ARGS;                                         \
        hvprof_nccl_nest--;                                                           \
        __VA_ARGS__;                                                         \
        return rc;                                                           \
    }

/* The call made a communicator (nonblocking ones return ncclInProgress). */
#define MADE(rc) ((rc) == NCCL_SUCCESS || (rc) == NCCL_IN_PROGRESS)

NCCL_COMM_WRAPPER(ncclCommInitRank,
                  (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank),
                  (comm, nranks, commId, rank),
                  if (on && MADE(rc) && comm && *comm)
                      comm_register(*comm, uid_hash(&commId, 0x6e63636c2d756964ull), nranks,
                                    rank, -1))

NCCL_COMM_WRAPPER(ncclCommInitRankConfig,
                  (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                   ncclConfig_t *config),
                  (comm, nranks, commId, rank, config),
                  if (on && MADE(rc) && comm && *comm)
                      comm_register(*comm, uid_hash(&commId, 0x6e63636c2d756964ull), nranks,
                                    rank, -1))

NCCL_COMM_WRAPPER(ncclCommInitRankScalable,
                  (ncclComm_t *comm, int nranks, int rank, int nId, ncclUniqueId *commIds,
                   ncclConfig_t *config),
                  (comm, nranks, rank, nId, commIds, config),
                  if (on && MADE(rc) && comm && *comm) {
                      uint64_t h = 0x6e63636c2d756964ull;
                      for (int i = 0; commIds && i < nId; i++) h = uid_hash(&commIds[i], h);
                      comm_register(*comm, h, nranks, rank, -1);
                  })

NCCL_COMM_WRAPPER(ncclCommInitAll,
                  (ncclComm_t *comms, int ndev, const int *devlist),
                  (comms, ndev, devlist),
                  if (on && rc == NCCL_SUCCESS && comms) {
                      uint64_t id = hvprof_mix(hvprof_mix(0x6e63636c2d616c6cull,
                                                          (uint64_t)getpid()),
                                               atomic_fetch_add(&initall_counter, 1));
                      for (int i = 0; i < ndev; i++)
                          comm_register(comms[i], id, ndev, i, devlist ? devlist[i] : i);
                  })

NCCL_COMM_WRAPPER(ncclCommSplit,
                  (ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                   ncclConfig_t *config),
                  (comm, color, key, newcomm, config),
                  if (on && MADE(rc)) {
                      uint32_t parent = comm_index(comm);
                      const hvprof_comm_entry *pe = comm_entry_of(parent);
                      uint32_t n = hvprof_nccl_comm_next_split(parent);
                      if (color != NCCL_SPLIT_NOCOLOR && newcomm && *newcomm) {
                          uint64_t id = hvprof_mix(hvprof_mix(pe ? pe->id : 0, n),
                                                   (uint64_t)(int64_t)color);
                          comm_register(*newcomm, id, -1, -1, comm_device(parent));
                      }
                  })

typedef ncclResult_t (*comm_fn)(ncclComm_t);
HVPROF_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    REAL(comm_fn, ncclCommDestroy);
    if (hvprof_nccl_nest == 0 && comm) hvprof_comm_forget((uint64_t)(uintptr_t)comm);
    hvprof_nccl_nest++;
    ncclResult_t rc = real(comm);
    hvprof_nccl_nest--;
    return rc;
}

HVPROF_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    REAL(comm_fn, ncclCommAbort);
    if (hvprof_nccl_nest == 0 && comm) hvprof_comm_forget((uint64_t)(uintptr_t)comm);
    hvprof_nccl_nest++;
    ncclResult_t rc = real(comm);
    hvprof_nccl_nest--;
    return rc;
}

/* A forked child: no group open on the thread that forked (nccl_backend.c's
 * atfork handler). */
void nccl_groups_forget(void)
{
    nt.depth = 0;
    nt.group = 0;
}
