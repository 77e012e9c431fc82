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
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_rt.h"
#include "hvprof_internal.h"
#include "nccl_common.h"

/* ------------------------------------------------------------------------ */
/* NCCL's ABI, declared here.                                                */

typedef struct hvprof_ncclComm *ncclComm_t;
typedef struct {
    char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} ncclUniqueId;
typedef struct hvprof_ncclConfig ncclConfig_t; /* only passed through */
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;

enum {
    NCCL_SUCCESS = 0,
    NCCL_SYSTEM_ERROR = 2,
    NCCL_IN_PROGRESS = 7,
    NCCL_SPLIT_NOCOLOR = -1,
};

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
#define N_OPS HVPROF_NCCL_N_OPS
static _Atomic uint64_t c_empty_groups, c_comms_late, c_nested, c_missing_real;
/* Records written by these wrappers (of hvprof_nccl_calls: both paths'). */
static _Atomic uint64_t c_wrapper_records;

static _Atomic int finished;

/* ------------------------------------------------------------------------ */
/* Finding the real NCCL.                                                    */

struct find_arg {
    const char *prefix;
    char path[256];
};

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct find_arg *a = data;
    const char *name = info->dlpi_name;
    if (!name || !*name) return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    size_t n = strlen(a->prefix);
    if (strncmp(base, a->prefix, n) != 0 || !strstr(base, ".so")) return 0;
    snprintf(a->path, sizeof a->path, "%s", name);
    return 1;
}

/* Path of a loaded object whose file name starts with prefix ("libnccl",
 * "libcuda."), or "" -- written into out. */
static int loaded_object(const char *prefix, char *out, size_t n)
{
    struct find_arg a = {prefix, ""};
    dl_iterate_phdr(find_loaded, &a);
    snprintf(out, n, "%s", a.path);
    return a.path[0] != 0;
}

static void *real_sym(const char *name, void *self)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (p && p != self) return p;
    char path[256];
    if (loaded_object("libnccl", path, sizeof path)) {
        void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
        if (h) {
            p = dlsym(h, name);
            dlclose(h); /* only drops the reference NOLOAD took */
            if (p && p != self) return p;
        }
    }
    return NULL;
}

/* Resolve `fn`'s real pointer into the local `real` (cached per wrapper). */
#define REAL(T, fn)                                                          \
    static T cached_##fn;                                                    \
    T real = __atomic_load_n(&cached_##fn, __ATOMIC_ACQUIRE);                \
    if (HVPROF_UNLIKELY(!real)) {                                            \
        void *p_ = real_sym(#fn, (void *)&fn);                               \
        memcpy(&real, &p_, sizeof real);                                     \
        if (real) __atomic_store_n(&cached_##fn, real, __ATOMIC_RELEASE);    \
        else return missing_real(#fn);                                       \
    }

static ncclResult_t missing_real(const char *name)
{
    if (atomic_fetch_add(&c_missing_real, 1) == 0)
        hvprof_warn("%s called but no NCCL library provides it", name);
    return NCCL_SYSTEM_ERROR;
}

/* Optional NCCL queries, resolved on first use. */
typedef ncclResult_t (*comm_int_fn)(ncclComm_t, int *);
static comm_int_fn q_count, q_rank, q_device;
static _Atomic int q_done;

static void resolve_queries(void)
{
    if (atomic_load_explicit(&q_done, memory_order_acquire)) return;
    void *p;
    p = real_sym("ncclCommCount", NULL);
    memcpy(&q_count, &p, sizeof p);
    p = real_sym("ncclCommUserRank", NULL);
    memcpy(&q_rank, &p, sizeof p);
    p = real_sym("ncclCommCuDevice", NULL);
    memcpy(&q_device, &p, sizeof p);
    atomic_store_explicit(&q_done, 1, memory_order_release);
}

/* ------------------------------------------------------------------------ */
/* Activation.                                                               */

/* Is recording on?  (The first NCCL call of a process without a file opens
 * one: nccl_common.h.) */
static inline int recording(void) { return hvprof_nccl_recording(); }

/* ------------------------------------------------------------------------ */
/* Communicators.                                                            */

static const hvprof_comm_entry *comm_entry_of(uint32_t idx)
{
    hvprof_file_header *h = hvprof_header();
    if (!h || idx >= h->comm_table_capacity) return NULL;
    return (const hvprof_comm_entry *)((const char *)h + h->comm_table_offset) + idx;
}

static uint32_t comm_register(ncclComm_t c, uint64_t id, int size, int rank, int device)
{
    if (!c) return UINT32_MAX;
    resolve_queries();
    if (size <= 0 && q_count && q_count(c, &size) != NCCL_SUCCESS) size = -1;
    if (rank < 0 && q_rank && q_rank(c, &rank) != NCCL_SUCCESS) rank = -1;
    if (device < 0 && q_device && q_device(c, &device) != NCCL_SUCCESS) device = -1;
    if (device < 0) device = hvprof_cuda_current_device();
    return hvprof_nccl_comm_register((uint64_t)(uintptr_t)c, id, size, rank, device);
}

static inline uint32_t comm_index(ncclComm_t c)
{
    uint32_t idx = hvprof_comm_lookup((uint64_t)(uintptr_t)c);
    if (HVPROF_LIKELY(idx != UINT32_MAX)) return idx;
    /* Created before the file was open, or by an unwrapped call: an id
     * unique to this process (not matchable across ranks). */
    atomic_fetch_add(&c_comms_late, 1);
    uint64_t id = hvprof_mix(hvprof_mix(0x6e63636c6c617465ull, (uint64_t)getpid()),
                             (uint64_t)(uintptr_t)c);
    return comm_register(c, id, -1, -1, -1);
}

static inline int comm_device(uint32_t idx) { return hvprof_nccl_comm_device(idx); }

static inline int comm_rank(uint32_t idx)
{
    const hvprof_comm_entry *e = comm_entry_of(idx);
    return e ? e->rank : -1;
}

static inline int comm_size(uint32_t idx)
{
    const hvprof_comm_entry *e = comm_entry_of(idx);
    return e ? e->size : -1;
}

static uint64_t uid_hash(const ncclUniqueId *u, uint64_t h)
{
    for (size_t i = 0; i < sizeof u->internal; i += 8) {
        uint64_t w;
        memcpy(&w, u->internal + i, 8);
        h = hvprof_mix(h, w);
    }
    return h;
}

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
    const char *e = hvprof_setting("HOROVOD_PROFILE_NCCL_WRAPPERS");
    v = e && strcmp(e, "0") == 0;
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

/* ------------------------------------------------------------------------ */
/* Visibility and counters, for the Python side (profiler/gpu.py).           */

/* Bits: 1 = an interposable ncclAllReduce exists behind this library (NCCL
 * calls reach the wrappers); 2 = a libnccl shared object is loaded; 4 = at
 * least one NCCL call was recorded.  Evaluated at each call (cheap: a dlsym
 * and a walk of the loaded objects). */
HVPROF_EXPORT int hvprof_nccl_visible(void)
{
    char path[256];
    int v = 0;
    if (real_sym("ncclAllReduce", (void *)&ncclAllReduce)) v |= 1;
    if (loaded_object("libnccl", path, sizeof path)) v |= 2;
    for (int i = 0; i < N_OPS; i++)
        if (atomic_load(&hvprof_nccl_calls[i])) v |= 4;
    return v;
}

static const char *const OP_NAMES[N_OPS] = {
    "nccl_allreduce", "nccl_reducescatter", "nccl_allgather", "nccl_broadcast", "nccl_bcast",
    "nccl_reduce",    "nccl_send",          "nccl_recv",      "nccl_group",
};

/* Everything the Python side puts in the rank metadata ("nccl"), as one JSON
 * object.  The buffer is overwritten by the next call. */
HVPROF_EXPORT const char *hvprof_nccl_json(void)
{
    static char buf[8192];
    static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&m);
    size_t n = sizeof buf, k = 0;
#define OUT(...) k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, __VA_ARGS__)
    char nccl_path[256], driver[256];
    int vis = hvprof_nccl_visible();
    loaded_object("libnccl", nccl_path, sizeof nccl_path);
    int version = 0;
    void *gv = real_sym("ncclGetVersion", NULL);
    if (gv) {
        ncclResult_t (*fn)(int *);
        memcpy(&fn, &gv, sizeof fn);
        if (fn(&version) != NCCL_SUCCESS) version = 0;
    }
    OUT("{\"visible\": %d, \"interposable\": %s, \"nccl_loaded\": %s, \"nccl_library\": \"%s\", "
        "\"nccl_version\": %d, \"cuda_driver_loaded\": %s, \"calls\": {",
        vis, vis & 1 ? "true" : "false", vis & 2 ? "true" : "false", nccl_path, version,
        loaded_object("libcuda.so", driver, sizeof driver) ? "true" : "false");
    for (int i = 0; i < N_OPS; i++)
        OUT("%s\"%s\": %llu", i ? ", " : "", OP_NAMES[i],
            (unsigned long long)atomic_load(&hvprof_nccl_calls[i]));
    OUT("}, \"empty_groups\": %llu, \"comms\": %llu, \"comms_first_seen_in_call\": %llu, "
        "\"nested_calls\": %llu, \"missing_real\": %llu, \"finished\": %s, ",
        (unsigned long long)atomic_load(&c_empty_groups), (unsigned long long)hvprof_nccl_comms(),
        (unsigned long long)atomic_load(&c_comms_late), (unsigned long long)atomic_load(&c_nested),
        (unsigned long long)atomic_load(&c_missing_real), atomic_load(&finished) ? "true" : "false");
    if (k < n) k += hvprof_dev_json(buf + k, n - k);
    {
        /* Which path saw NCCL: "wrappers" (symbol interposition, shared
         * NCCL), "plugin" (NCCL's profiler-plugin interface, any NCCL >= 2.23,
         * static too); recorded_by: the paths that wrote records. */
        uint64_t wr = atomic_load(&c_wrapper_records), all = 0;
        for (int i = 0; i < N_OPS; i++) all += atomic_load(&hvprof_nccl_calls[i]);
        uint64_t pr = all > wr ? all - wr : 0, ps = hvprof_nccl_plugin_silent();
        int w_saw = wr > 0, p_saw = pr > 0 || ps > 0;
        OUT(", \"seen_by\": [%s%s%s], \"recorded_by\": \"%s\", \"wrapper_records\": %llu, ",
            w_saw ? "\"wrappers\"" : "", w_saw && p_saw ? ", " : "", p_saw ? "\"plugin\"" : "",
            wr && pr ? "both" : wr ? "wrappers" : pr ? "plugin" : "none",
            (unsigned long long)wr);
        if (k < n) k += hvprof_nccl_plugin_json(buf + k, n - k, pr);
    }
    OUT("}");
#undef OUT
    if (k >= n) snprintf(buf, n, "{\"error\": \"nccl json too long\"}");
    pthread_mutex_unlock(&m);
    return buf;
}

/* Write the JSON document next to the raw file (rank-R.nccl.json), through a
 * temporary file and rename: a reader never sees half of it. */
static void write_sidecar(void)
{
    char path[4096];
    if (hvprof_sidecar_path(path, sizeof path, ".nccl.json") != 0) return;
    if (hvprof_write_text(path, hvprof_nccl_json()) != 0)
        hvprof_warn("cannot write %s: NCCL visibility is not recorded", path);
}

/* Collect every pending device time (see hvprof_dev_flush in cuda_rt.h).
 * Returns the number of pairs still pending. */
HVPROF_EXPORT int hvprof_nccl_flush(int timeout_ms) { return hvprof_dev_flush(timeout_ms); }

/* The end of NCCL profiling in this process: stop the device-time helper,
 * collect pending device times (polling, up to timeout_ms; negative: the
 * default), and write raw/rank-R.nccl.json (this process's hvprof_nccl_json)
 * when the process used NCCL or CUDA.  Returns the pairs left unfinished.
 * Called at exit (atexit), by the Python runtime before it converts the raw
 * file, and by hvprof_close (MPI_Finalize, exit) through this backend's finish
 * hook.  Runs once per process: later calls return 0 at once. */
HVPROF_EXPORT int hvprof_nccl_finish(int timeout_ms)
{
    if (atomic_exchange(&finished, 1)) return 0; /* once: the first caller wins */
    hvprof_nccl_plugin_flush();
    int left = hvprof_dev_finish(timeout_ms);
    char p1[256], p2[256], p3[256];
    int used = hvprof_nccl_visible() != 0 || loaded_object("libcuda.so", p1, sizeof p1) ||
               loaded_object("libcudart", p2, sizeof p2) || loaded_object("libnccl", p3, sizeof p3);
    if (used) write_sidecar();
    return left;
}

static void nccl_exit(void) { hvprof_nccl_finish(-1); }

static void nccl_atfork_child(void)
{
    atomic_store(&finished, 1); /* a child writes no device times, no sidecar */
    nt.depth = 0;
    nt.group = 0;
}

static const hvprof_backend nccl_backend = {
    .name = "nccl",
    .library = "libnccl",
    .finish = nccl_exit,
    .atfork_child = nccl_atfork_child,
};

__attribute__((constructor)) static void nccl_ctor(void)
{
    hvprof_register_backend(&nccl_backend);
    hvprof_nccl_set_exit(nccl_exit);
}
