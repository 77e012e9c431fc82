/*
 * gloo.c -- the collectives Horovod runs over Gloo (horovodrun --gloo,
 * elastic Horovod), recorded by swapping slots of Horovod's own vtables.
 *
 * Why vtables: Gloo is compiled into Horovod's library, which is linked with
 * -Bsymbolic-functions, so no symbol of it can be interposed; but its C++
 * vtables are exported (horovod.lds: *horovod*) and every Gloo collective
 * Horovod makes goes through one of two virtual calls on its background
 * thread (horovod/common/ops/gloo_operations.cc and gloo/gloo_controller.cc,
 * v0.28.1):
 *
 *   GlooAlgorithms<T>::Allreduce / Allgather / Broadcast / Alltoall /
 *   Reducescatter -- the gloo:: collective itself, called from the Gloo ops'
 *   Execute.  One record each: exact elements (its arguments) x sizeof(T)
 *   (the template's type), the time of the Gloo call alone (no fusion-buffer
 *   copies: the same interval an MPI_Allreduce record has), kind data.
 *   GlooController::CrossRankBitwiseAnd/Or, Bcast, Barrier,
 *   AlltoallGetRecvSplits, Allgather2Ints, Recv/SendReadyTensors,
 *   Recv/SendFinalTensors -- the negotiation and set-up: kind control.
 *   Gloo{Allreduce,Allgather,Broadcast,Alltoall,Reducescatter}::Execute --
 *   no record: it notes the process set of its first entry for the records
 *   made inside it (the communicator's id).
 *
 * Arming (hvprof_gloo_arm, called by profiler.collect.horovod_hooks right
 * after Horovod's extension is imported, before hvd.init starts the
 * background thread): for each (vtable, method) pair, the slot holding the
 * address dlsym gives for the method is found in the exported vtable and
 * replaced by a wrapper (the RELRO page made writable for the store, then
 * read-only again).  Once per library, under a lock; a library without the
 * symbols (another Horovod) is said once, in one line, and left alone.  A
 * wrapper calls the original with its arguments unchanged and returns its
 * result: what the job computes is never changed.  Execute returns
 * horovod::common::Status, non-trivial, so through a hidden pointer passed
 * first (Itanium C++ ABI); its wrapper forwards it.
 *
 * Reads of Horovod's objects (their 0.28.x layout, checked for sanity
 * before use): TensorTableEntry.process_set_id (offset 84), the
 * GlooAlgorithms' GlooContext* (offset 8), its ctx shared_ptr (offset 16) and
 * gloo::Context's rank and size (offsets 8, 12); std::vector as libstdc++
 * lays it out (begin, end).  Where a read fails the sanity check, the record
 * keeps what the arguments say (size/rank -1, allgather bytes 0).
 *
 * The raw file: a process without MPI opens it at the first wrapped call
 * (rank, size and local rank from HOROVOD_RANK/SIZE/LOCAL_RANK, core.c); in
 * an elastic job, under a file number the process claims (see "Elastic").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hvprof_internal.h"

#define MAX_LIBS 4         /* Horovod libraries armed in one process (torch, TF) */
#define VTABLE_SCAN 32     /* slots searched for a method */
#define COMM_BACKEND_GLOO 2

/* ------------------------------------------------------------------------ */
/* What a wrapper needs: its original per armed library, found by the
 * object's vtable pointer (the address point, vtable + 2 words). */

typedef struct spec {
    const char *vtable;      /* mangled vtable symbol */
    const char *method;      /* mangled method symbol */
    void *wrapper;
    void *point[MAX_LIBS];   /* the vtable's address point in library i */
    void *orig[MAX_LIBS];    /* the method's address there */
} spec;

static inline void *orig_of(spec *s, const void *self)
{
    void *vp = *(void *const *)self;
    for (int i = 0; i < MAX_LIBS; i++)
        if (__atomic_load_n(&s->point[i], __ATOMIC_ACQUIRE) == vp)
            return __atomic_load_n(&s->orig[i], __ATOMIC_ACQUIRE);
    return __atomic_load_n(&s->orig[0], __ATOMIC_ACQUIRE);
}

/* ------------------------------------------------------------------------ */
/* Recording.                                                                */

static _Atomic int open_tried;
static _Atomic uint64_t c_records;
/* The process set of the Execute this thread is in, + 1 (0: none). */
static __thread int32_t cur_ps __attribute__((tls_model("initial-exec")));


/* ------------------------------------------------------------------------ */
/* Elastic Horovod (HOROVOD_ELASTIC=1, set by horovodrun for elastic jobs).
 * A worker's HOROVOD_RANK is its rank when it was started, and the driver
 * starts a replacement with the rank of the worker it replaces: named by it,
 * the new raw file would truncate the old one, and a worker removed or killed
 * would lose what it recorded.  So each process claims a file number of its
 * own: its starting rank if that file does not exist yet, else the first free
 * number from HOROVOD_SIZE up, by O_CREAT|O_EXCL (atomic on one file system,
 * so two starting workers never get the same).  A file is a process, not a
 * rank: the ranks it held, epoch by epoch, are in its epochs sidecar
 * (profiler.formats.epochs, written by profiler.collect.horovod_hooks).  The
 * directory: HOROVOD_PROFILE_DIR, else the default (hvprof_default_dir), the
 * same for every worker the driver starts. */
#define ELASTIC_MAX_FILES 100000

static int elastic_job(void)
{
    const char *v = getenv("HOROVOD_ELASTIC");
    return v && strcmp(v, "1") == 0;
}

static int mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int r = mkdir(path, 0755);
        *p = '/';
        if (r != 0 && errno != EEXIST) return -1;
    }
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* Claim this process's file number in dir (see above); -1 when none can be. */
static int elastic_claim(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/raw", dir);
    mode_t old = umask(022);
    int ok = mkdirs(path) == 0;
    umask(old);
    if (!ok) return -1;
    const char *r = getenv("HOROVOD_RANK"), *s = getenv("HOROVOD_SIZE");
    int first = r && *r ? atoi(r) : 0, size = s && *s ? atoi(s) : 1;
    if (first < 0) first = 0;
    if (size < 1) size = 1;
    for (int i = -1; i < ELASTIC_MAX_FILES; i++) {
        int n = i < 0 ? first : size + i;
        snprintf(path, sizeof path, "%s/raw/rank-%05d.hvprof", dir, n);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            close(fd);
            return n;
        }
        if (errno != EEXIST) return -1;
    }
    return -1;
}

static void open_elastic(void)
{
    char dir[1024];
    const char *d = hvprof_setting_text(HVS_DIR);
    if (d) {
        snprintf(dir, sizeof dir, "%s", d);
    } else {
        hvprof_default_dir(dir, sizeof dir, 0);
    }
    int n = elastic_claim(dir);
    if (n < 0) {
        hvprof_warn("warning: elastic job: no file number could be claimed in %s/raw (%s); "
                    "recording off in this worker", dir, strerror(errno));
        return;
    }
    hvprof_open(n, -1, -1, dir);
}

/* Recording on?  A process without a file (no MPI_Init: horovodrun --gloo)
 * opens one at its first Gloo call. */
static inline int recording(void)
{
    if (HVPROF_LIKELY(atomic_load_explicit(&hvprof_active, memory_order_relaxed))) return 1;
    if (atomic_load_explicit(&open_tried, memory_order_relaxed) || atomic_exchange(&open_tried, 1))
        return 0;
    if (!hvprof_header() && hvprof_profile_mode() != HVPROF_PROFILE_OFF) {
        if (elastic_job()) open_elastic();
        else hvprof_open(-1, -1, -1, NULL);
    }
    return atomic_load(&hvprof_active);
}

/* Horovod re-initialized in this process (an elastic reset: hvd.shutdown,
 * then hvd.init; called by profiler.collect.horovod_hooks before hvd.init).
 * The new gloo contexts and controller may sit at the addresses of the old
 * ones: the epoch is mixed into their communicator handles, so that the new
 * epoch's communicators are registered afresh (their size, rank, and call
 * numbers from 0, as on the workers that start in that epoch). */
static _Atomic uint64_t gloo_epoch;
static _Atomic uint32_t n_controllers;

HVPROF_EXPORT void hvprof_gloo_epoch_begin(void)
{
    atomic_fetch_add(&gloo_epoch, 1);
    atomic_store(&n_controllers, 0);
}

static inline uint64_t epoch_handle(const void *p)
{
    return hvprof_mix((uint64_t)(uintptr_t)p, atomic_load_explicit(&gloo_epoch,
                                                                   memory_order_relaxed));
}

typedef struct call {
    uint64_t t0;
    hvprof_inflight_entry *inflight;
    uint64_t comm_handle;
} call;

static inline void call_begin(call *c, uint16_t op, uint64_t comm_handle)
{
    (void)hvprof_track_self();
    hvprof_tls *t = &hvprof_t;
    c->inflight = t->generation == atomic_load_explicit(&hvprof_generation, memory_order_relaxed)
                      ? t->inflight : NULL;
    c->comm_handle = comm_handle;
    c->t0 = hvprof_ticks();
    if (c->inflight) hvprof_inflight_begin(c->inflight, op, comm_handle, c->t0);
}

static inline void call_end(call *c, uint32_t ci, uint16_t op, uint64_t bytes, uint64_t count,
                            int32_t root, uint8_t dtype, uint32_t dtype_size, uint8_t redop,
                            uint32_t aux)
{
    uint64_t t1 = hvprof_ticks();
    if (c->inflight) hvprof_inflight_end(c->inflight);
    uint32_t seq = hvprof_comm_next_seq(ci);
    if (HVPROF_UNLIKELY(atomic_load_explicit(&hvprof_divert, memory_order_relaxed))) {
        hvprof_divert_call(op, ci, bytes, dtype, redop, 0, 0, c->t0, t1);
        return;
    }
    hvprof_record rec = {
        .t_start = c->t0, .t_end = t1, .bytes = bytes, .count = count, .seq = seq,
        .comm = ci, .track = HVPROF_TRACK_SELF, .root = root, .op = op, .dtype = dtype,
        .redop = redop, .flags = 0, .rc = 0, .dtype_size = dtype_size, .aux = aux,
    };
    if (hvprof_emit(&rec) == 0) atomic_fetch_add_explicit(&c_records, 1, memory_order_relaxed);
}

/* ------------------------------------------------------------------------ */
/* Communicators: a process set's GlooContext (data), a controller (control). */

/* gloo::Context's rank and size through GlooAlgorithms<T>::gloo_context_
 * (0.28.x layouts, see the top); 0, or -1 when they do not look right. */
static int context_rank_size(const void *algos, const void **gctx_out, int *rank, int *size)
{
    const void *gctx = *(const void *const *)((const char *)algos + 8);
    *gctx_out = gctx;
    *rank = *size = -1;
    if (!gctx) return -1;
    const char *ctx = *(const char *const *)((const char *)gctx + 16);
    if (!ctx) return -1;
    int r = *(const int *)(ctx + 8), s = *(const int *)(ctx + 12);
    if (s < 1 || s > (1 << 24) || r < 0 || r >= s) return -1;
    *rank = r;
    *size = s;
    return 0;
}

static uint32_t data_comm(const void *algos, int *rank, int *size)
{
    const void *gctx;
    context_rank_size(algos, &gctx, rank, size);
    uint64_t handle = epoch_handle(gctx);
    uint32_t ci = hvprof_comm_lookup(handle);
    if (HVPROF_LIKELY(ci != UINT32_MAX)) return ci;
    int32_t ps = cur_ps - 1; /* -1: outside an Execute (not Horovod's op path) */
    uint64_t id = hvprof_mix(hvprof_mix(0x676c6f6f64617461ull, (uint64_t)(int64_t)ps),
                             (uint64_t)(int64_t)*size);
    if (ps < 0) id = hvprof_mix(id, handle); /* unknown set: not matched across ranks */
    char name[32];
    if (ps == 0) snprintf(name, sizeof name, "gloo");
    else snprintf(name, sizeof name, "gloo:ps%d", (int)ps);
    return hvprof_comm_register(handle, id, *size, *rank, ps == 0 ? 0 : -1, COMM_BACKEND_GLOO,
                                name);
}

/* A controller's communicator: its id from the order controllers make their
 * first call in this process (the global set's first on every rank). */
static uint32_t control_comm(const void *self)
{
    uint64_t handle = epoch_handle(self);
    uint32_t ci = hvprof_comm_lookup(handle);
    if (HVPROF_LIKELY(ci != UINT32_MAX)) return ci;
    uint32_t nth = atomic_fetch_add(&n_controllers, 1);
    hvprof_file_header *h = hvprof_header();
    /* an elastic file's header holds its first rank, not this epoch's */
    int first = nth == 0 && h && !elastic_job();
    uint64_t id = hvprof_mix(0x676c6f6f6374726cull, nth);
    return hvprof_comm_register(handle, id, first ? h->world_size : -1, first ? h->rank : -1,
                                first ? 0 : -1, COMM_BACKEND_GLOO,
                                nth == 0 ? "gloo-control" : "gloo-control+");
}

static inline uint8_t redop_of(int horovod_op)
{
    switch (horovod_op) { /* message.h ReduceOp, as GlooAllreduce maps it */
    case 1: return HVPROF_REDOP_SUM;
    case 3: return HVPROF_REDOP_MIN;
    case 4: return HVPROF_REDOP_MAX;
    case 5: return HVPROF_REDOP_PROD;
    default: return HVPROF_REDOP_USER;
    }
}

/* ------------------------------------------------------------------------ */
/* GlooAlgorithms<T>: the data collectives.  X(tag, mangled T, size, dtype,
 * substitution numbers of Allgather's and Alltoall's mangled names). */

#define GLOO_TYPES(X)                                                            \
    X(u8,  "h", 1, HVPROF_DT_NCCL_UINT8,   "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(i8,  "a", 1, HVPROF_DT_NCCL_INT8,    "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(u16, "t", 2, HVPROF_DT_UINT16,       "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(i16, "s", 2, HVPROF_DT_INT16,        "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(i32, "i", 4, HVPROF_DT_NCCL_INT32,   "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(i64, "l", 8, HVPROF_DT_NCCL_INT64,   "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(f16, "N4gloo7float16E", 2, HVPROF_DT_NCCL_FLOAT16, "S5_PiS6_",              \
      "S5_RSt6vectorIlSaIlEES9_")                                                 \
    X(f32, "f", 4, HVPROF_DT_NCCL_FLOAT32, "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(f64, "d", 8, HVPROF_DT_NCCL_FLOAT64, "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_") \
    X(b8,  "b", 1, HVPROF_DT_NCCL_UINT8,   "S3_PiS4_", "S3_RSt6vectorIlSaIlEES7_")

#define ALGOS "_ZN7horovod6common14GlooAlgorithmsI"
#define ALGOS_VT "_ZTVN7horovod6common14GlooAlgorithmsI"

typedef void (*allreduce_fn)(void *, void *, int, int);
typedef void (*allgather_fn)(void *, void *, void *, int *, int *);
typedef void (*broadcast_fn)(void *, void *, int, int);
typedef void (*alltoall_fn)(void *, void *, void *, void *, void *);
typedef void (*reducescatter_fn)(void *, void *, void *);

/* std::vector<E> as libstdc++ lays it out: the sum of its elements. */
#define VEC_SUM(vec, E, out)                                                     \
    do {                                                                         \
        const E *const *v_ = (const E *const *)(vec);                            \
        (out) = 0;                                                               \
        if (v_ && v_[0] && v_[1] >= v_[0])                                       \
            for (const E *p_ = v_[0]; p_ < v_[1]; p_++) (out) += (uint64_t)*p_;  \
    } while (0)

#define DECLARE_SPECS(tag, m, size, dt, ag, a2a)                                                 \
    static spec s_allreduce_##tag, s_allgather_##tag, s_broadcast_##tag, s_alltoall_##tag,       \
        s_reducescatter_##tag;
GLOO_TYPES(DECLARE_SPECS)

#define DEFINE_WRAPPERS(tag, m, size, dt, ag, a2a)                                               \
    static void w_allreduce_##tag(void *self, void *buf, int n, int op)                          \
    {                                                                                            \
        allreduce_fn f = (allreduce_fn)orig_of(&s_allreduce_##tag, self);                        \
        if (!recording()) {                                                                           \
            f(self, buf, n, op);                                                                           \
            return;                                                                          \
        }                                            \
        int rank, csize;                                                                         \
        uint32_t ci = data_comm(self, &rank, &csize);                                            \
        call c;                                                                                  \
        call_begin(&c, HVPROF_OP_GLOO_ALLREDUCE, (uint64_t)ci);                                 \
        f(self, buf, n, op);                                                                     \
        uint64_t cnt = n > 0 ? (uint64_t)n : 0;                                                  \
        call_end(&c, ci, HVPROF_OP_GLOO_ALLREDUCE, cnt * (size), cnt, -1, dt, size,              \
                 redop_of(op), hvprof_fold_ptr(buf));                                            \
    }                                                                                            \
    static void w_broadcast_##tag(void *self, void *buf, int n, int root)                        \
    {                                                                                            \
        broadcast_fn f = (broadcast_fn)orig_of(&s_broadcast_##tag, self);                        \
        if (!recording()) {                                                                           \
            f(self, buf, n, root);                                                                           \
            return;                                                                          \
        }                                          \
        int rank, csize;                                                                         \
        uint32_t ci = data_comm(self, &rank, &csize);                                            \
        call c;                                                                                  \
        call_begin(&c, HVPROF_OP_GLOO_BROADCAST, (uint64_t)ci);                                 \
        f(self, buf, n, root);                                                                   \
        uint64_t cnt = n > 0 ? (uint64_t)n : 0;                                                  \
        call_end(&c, ci, HVPROF_OP_GLOO_BROADCAST, cnt * (size), cnt, root, dt, size,            \
                 HVPROF_REDOP_NONE, hvprof_fold_ptr(buf));                                       \
    }                                                                                            \
    static void w_allgather_##tag(void *self, void *in, void *out, int *counts, int *displs)    \
    {                                                                                            \
        allgather_fn f = (allgather_fn)orig_of(&s_allgather_##tag, self);                        \
        if (!recording()) {                                                                           \
            f(self, in, out, counts, displs);                                                                           \
            return;                                                                          \
        }                               \
        int rank, csize;                                                                         \
        uint32_t ci = data_comm(self, &rank, &csize);                                            \
        uint64_t cnt = 0; /* sum(recvcounts): the context's size says how many */                \
        for (int i = 0; counts && i < csize; i++) cnt += counts[i] > 0 ? (uint64_t)counts[i] : 0; \
        call c;                                                                                  \
        call_begin(&c, HVPROF_OP_GLOO_ALLGATHER, (uint64_t)ci);                                 \
        f(self, in, out, counts, displs);                                                        \
        call_end(&c, ci, HVPROF_OP_GLOO_ALLGATHER, cnt * (size), cnt, -1, dt, size,              \
                 HVPROF_REDOP_NONE, hvprof_fold_ptr(out));                                       \
    }                                                                                            \
    static void w_alltoall_##tag(void *self, void *in, void *out, void *sc, void *rc)           \
    {                                                                                            \
        alltoall_fn f = (alltoall_fn)orig_of(&s_alltoall_##tag, self);                           \
        if (!recording()) {                                                                           \
            f(self, in, out, sc, rc);                                                                           \
            return;                                                                          \
        }                                       \
        int rank, csize;                                                                         \
        uint32_t ci = data_comm(self, &rank, &csize);                                            \
        uint64_t cnt;                                                                            \
        VEC_SUM(sc, int64_t, cnt); /* sum(sendcounts), as alltoallv's */                         \
        call c;                                                                                  \
        call_begin(&c, HVPROF_OP_GLOO_ALLTOALL, (uint64_t)ci);                                  \
        f(self, in, out, sc, rc);                                                                \
        call_end(&c, ci, HVPROF_OP_GLOO_ALLTOALL, cnt * (size), cnt, -1, dt, size,               \
                 HVPROF_REDOP_NONE, hvprof_fold_ptr(out));                                       \
    }                                                                                            \
    static void w_reducescatter_##tag(void *self, void *buf, void *counts)                       \
    {                                                                                            \
        reducescatter_fn f = (reducescatter_fn)orig_of(&s_reducescatter_##tag, self);            \
        if (!recording()) {                                                                           \
            f(self, buf, counts);                                                                           \
            return;                                                                          \
        }                                           \
        int rank, csize;                                                                         \
        uint32_t ci = data_comm(self, &rank, &csize);                                            \
        uint64_t cnt;                                                                            \
        VEC_SUM(counts, int, cnt); /* sum(recvcounts), as reduce_scatter's */                    \
        call c;                                                                                  \
        call_begin(&c, HVPROF_OP_GLOO_REDUCESCATTER, (uint64_t)ci);                             \
        f(self, buf, counts);                                                                    \
        call_end(&c, ci, HVPROF_OP_GLOO_REDUCESCATTER, cnt * (size), cnt, -1, dt, size,          \
                 HVPROF_REDOP_SUM, hvprof_fold_ptr(buf));                                        \
    }                                                                                            \
    static spec s_allreduce_##tag = {ALGOS_VT m "EE", ALGOS m "E9AllreduceEPviNS0_8ReduceOpE",   \
                                     (void *)w_allreduce_##tag, {0}, {0}};                       \
    static spec s_allgather_##tag = {ALGOS_VT m "EE", ALGOS m "E9AllgatherEPv" ag,               \
                                     (void *)w_allgather_##tag, {0}, {0}};                       \
    static spec s_broadcast_##tag = {ALGOS_VT m "EE", ALGOS m "E9BroadcastEPvii",                \
                                     (void *)w_broadcast_##tag, {0}, {0}};                       \
    static spec s_alltoall_##tag = {ALGOS_VT m "EE", ALGOS m "E8AlltoallEPv" a2a,                \
                                    (void *)w_alltoall_##tag, {0}, {0}};                         \
    static spec s_reducescatter_##tag = {ALGOS_VT m "EE",                                        \
                                         ALGOS m "E13ReducescatterEPvRSt6vectorIiSaIiEE",        \
                                         (void *)w_reducescatter_##tag, {0}, {0}};
GLOO_TYPES(DEFINE_WRAPPERS)

/* ------------------------------------------------------------------------ */
/* Execute: the process set of the op's entries, for the records inside.
 * void *Execute(Status *sret, Op *this, vector<TensorTableEntry> &, const
 * Response &): the hidden return pointer first, returned in rax. */

typedef void *(*execute_fn)(void *, void *, void *, const void *);
#define ENTRY_PROCESS_SET_OFFSET 84 /* TensorTableEntry.process_set_id (0.28.x) */

static inline int32_t process_set_of(const void *entries)
{
    const char *const *v = (const char *const *)entries;
    if (!v || !v[0] || v[1] <= v[0]) return -1;
    int32_t ps = *(const int32_t *)(v[0] + ENTRY_PROCESS_SET_OFFSET);
    return ps >= 0 && ps < (1 << 16) ? ps : -1;
}

#define EXECUTE_OPS(X)                                                                           \
    X(allreduce, "13GlooAllreduce")                                                              \
    X(allgather, "13GlooAllgather")                                                              \
    X(broadcast, "13GlooBroadcast")                                                              \
    X(alltoall, "12GlooAlltoall")                                                                \
    X(reducescatter, "17GlooReducescatter")

#define DEFINE_EXECUTE(name, cls)                                                                \
    static spec s_exec_##name;                                                                   \
    static void *w_exec_##name(void *sret, void *self, void *entries, const void *response)      \
    {                                                                                            \
        execute_fn f = (execute_fn)orig_of(&s_exec_##name, self);                                \
        int32_t saved = cur_ps;                                                                  \
        cur_ps = process_set_of(entries) + 1;                                                    \
        void *r = f(sret, self, entries, response);                                              \
        cur_ps = saved;                                                                          \
        return r;                                                                                \
    }                                                                                            \
    static spec s_exec_##name = {"_ZTVN7horovod6common" cls "E",                                 \
                                 "_ZN7horovod6common" cls                                        \
                                 "7ExecuteERSt6vectorINS0_16TensorTableEntryESaIS3_EERKNS0_"     \
                                 "8ResponseE",                                                   \
                                 (void *)w_exec_##name, {0}, {0}};
EXECUTE_OPS(DEFINE_EXECUTE)

/* ------------------------------------------------------------------------ */
/* GlooController: negotiation and set-up (kind control). */

#define CTRL "_ZN7horovod6common14GlooController"
#define CTRL_VT "_ZTVN7horovod6common14GlooControllerE"

/* One wrapper: name, op, parameters, arguments, bytes, count, root, redop. */
#define CTRL_WRAPPER(name, sym, op, params, args, bytes_, count_, root_, redop_)                 \
    static spec s_ctl_##name;                                                                    \
    typedef void (*ctl_##name##_fn) params;                                                      \
    static void w_ctl_##name params                                                              \
    {                                                                                            \
        ctl_##name##_fn f = (ctl_##name##_fn)orig_of(&s_ctl_##name, self);                       \
        if (!recording()) {                                                                      \
            f args;                                                                          \
            return;                                                                          \
        }                                                         \
        uint32_t ci = control_comm(self);                                                        \
        call c;                                                                                  \
        call_begin(&c, op, (uint64_t)ci);                                                        \
        f args;                                                                                  \
        uint64_t n_ = (count_), b_ = (bytes_);                                                   \
        call_end(&c, ci, op, b_, n_, (root_), HVPROF_DT_UNKNOWN, n_ ? (uint32_t)(b_ / n_) : 0,   \
                 (redop_), 0);                                                                   \
    }                                                                                            \
    static spec s_ctl_##name = {CTRL_VT, CTRL sym, (void *)w_ctl_##name, {0}, {0}};

static inline uint64_t vec_len(const void *vec, size_t elem)
{
    const char *const *v = (const char *const *)vec;
    return v && v[0] && v[1] >= v[0] ? (uint64_t)(v[1] - v[0]) / elem : 0;
}

CTRL_WRAPPER(bitand, "19CrossRankBitwiseAndERSt6vectorIxSaIxEEi", HVPROF_OP_GLOO_BITAND,
             (void *self, void *bits, int count), (self, bits, count),
             (count > 0 ? (uint64_t)count * 8u : 0), (count > 0 ? (uint64_t)count : 0), -1,
             HVPROF_REDOP_BAND)
CTRL_WRAPPER(bitor, "18CrossRankBitwiseOrERSt6vectorIxSaIxEEi", HVPROF_OP_GLOO_BITOR,
             (void *self, void *bits, int count), (self, bits, count),
             (count > 0 ? (uint64_t)count * 8u : 0), (count > 0 ? (uint64_t)count : 0), -1,
             HVPROF_REDOP_BOR)
CTRL_WRAPPER(bcast, "5BcastEPvmiNS0_12CommunicatorE", HVPROF_OP_GLOO_CTL_BCAST,
             (void *self, void *buf, size_t size, int root, int comm),
             (self, buf, size, root, comm), (uint64_t)size, (uint64_t)size, root,
             HVPROF_REDOP_NONE)
CTRL_WRAPPER(barrier, "7BarrierENS0_12CommunicatorE", HVPROF_OP_GLOO_BARRIER,
             (void *self, int comm), (self, comm), 0, 0, -1, HVPROF_REDOP_NONE)
CTRL_WRAPPER(splits, "21AlltoallGetRecvSplitsERKSt6vectorIiSaIiEERS4_", HVPROF_OP_GLOO_SPLITS,
             (void *self, const void *splits, void *recv), (self, splits, recv),
             vec_len(splits, 4) * 4u, vec_len(splits, 4), -1, HVPROF_REDOP_NONE)
CTRL_WRAPPER(ints, "14Allgather2IntsESt5arrayIiLm2EERSt6vectorIiSaIiEE",
             HVPROF_OP_GLOO_ALLGATHER_INTS, (void *self, uint64_t two_ints, void *recv),
             (self, two_ints, recv), 8, 2, -1, HVPROF_REDOP_NONE)
CTRL_WRAPPER(recv_ready,
             "16RecvReadyTensorsERSt6vectorINSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
             "SaIS8_EERS2_INS0_11RequestListESaISC_EE",
             HVPROF_OP_GLOO_READY, (void *self, void *names, void *lists),
             (self, names, lists), 0, 0, 0, HVPROF_REDOP_NONE)
CTRL_WRAPPER(send_ready, "16SendReadyTensorsERNS0_11RequestListE", HVPROF_OP_GLOO_READY,
             (void *self, void *list), (self, list), 0, 0, 0, HVPROF_REDOP_NONE)
CTRL_WRAPPER(recv_final, "16RecvFinalTensorsERNS0_12ResponseListE", HVPROF_OP_GLOO_FINAL,
             (void *self, void *list), (self, list), 0, 0, 0, HVPROF_REDOP_NONE)
CTRL_WRAPPER(send_final, "16SendFinalTensorsERNS0_12ResponseListE", HVPROF_OP_GLOO_FINAL,
             (void *self, void *list), (self, list), 0, 0, 0, HVPROF_REDOP_NONE)

/* ------------------------------------------------------------------------ */
/* The table and the arming. */

#define SPEC_PTRS(tag, m, size, dt, ag, a2a)                                                     \
    &s_allreduce_##tag, &s_allgather_##tag, &s_broadcast_##tag, &s_alltoall_##tag,               \
        &s_reducescatter_##tag,
#define EXEC_PTR(name, cls) &s_exec_##name,

static spec *const specs[] = {
    GLOO_TYPES(SPEC_PTRS) EXECUTE_OPS(EXEC_PTR)
    &s_ctl_bitand, &s_ctl_bitor, &s_ctl_bcast, &s_ctl_barrier, &s_ctl_splits, &s_ctl_ints,
    &s_ctl_recv_ready, &s_ctl_send_ready, &s_ctl_recv_final, &s_ctl_send_final,
};
#define N_SPECS (sizeof specs / sizeof specs[0])

/* The one that never communicates: it throws (gloo_operations.cc). */
static int skipped(const spec *s) { return s == &s_reducescatter_b8; }

static pthread_mutex_t arm_lock = PTHREAD_MUTEX_INITIALIZER;
static void *armed_base[MAX_LIBS];
static int armed_slots[MAX_LIBS];
static int n_armed;
static int said_missing;

typedef struct relro_query {
    uintptr_t base;
    uintptr_t lo, hi; /* PT_GNU_RELRO, absolute */
} relro_query;

static int find_relro(struct dl_phdr_info *info, size_t n, void *arg)
{
    (void)n;
    relro_query *q = arg;
    if ((uintptr_t)info->dlpi_addr != q->base) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type == PT_GNU_RELRO) {
            q->lo = q->base + p->p_vaddr;
            q->hi = q->lo + p->p_memsz;
        }
    }
    return 1;
}

/* Store `value` into a vtable slot: its page made writable for the store,
 * then read-only again when it lies in the RELRO segment (else it was
 * writable: left so).  0, or -1 when the page cannot be made writable. */
static int store_slot(void **slot, void *value, const relro_query *q)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t page = (uintptr_t)slot & ~((uintptr_t)pg - 1);
    int relro = (uintptr_t)slot >= q->lo && (uintptr_t)slot < q->hi;
    if (mprotect((void *)page, (size_t)pg, PROT_READ | PROT_WRITE) != 0) return -1;
    __atomic_store_n(slot, value, __ATOMIC_RELEASE);
    if (relro) mprotect((void *)page, (size_t)pg, PROT_READ);
    return 0;
}

/* Arm every spec in the library of `handle` (lock held).  Returns the slots
 * now wrapped there; *missing: a symbol or slot not found. */
static int arm_library(void *handle, int li, const relro_query *q, const char **missing)
{
    int armed = 0;
    for (size_t k = 0; k < N_SPECS; k++) {
        spec *s = specs[k];
        if (skipped(s)) continue;
        void **vt = dlsym(handle, s->vtable);
        void *m = dlsym(handle, s->method);
        if (!vt || !m) {
            if (!*missing) *missing = !vt ? s->vtable : s->method;
            continue;
        }
        void **slot = NULL;
        for (int i = 2; i < VTABLE_SCAN; i++) {
            if (vt[i] == m || vt[i] == s->wrapper) {
                slot = &vt[i];
                break;
            }
        }
        if (!slot) {
            if (!*missing) *missing = s->method;
            continue;
        }
        if (*slot == s->wrapper) { /* armed already (another handle, same library) */
            armed++;
            continue;
        }
        __atomic_store_n(&s->orig[li], m, __ATOMIC_RELEASE);
        __atomic_store_n(&s->point[li], (void *)(vt + 2), __ATOMIC_RELEASE);
        if (store_slot(slot, s->wrapper, q) == 0) armed++;
        else if (!*missing) *missing = "a writable vtable page";
    }
    return armed;
}

static int gloo_requested(void)
{
    const char *c = getenv("HOROVOD_CONTROLLER"), *o = getenv("HOROVOD_CPU_OPERATIONS");
    return (c && strcmp(c, "gloo") == 0) || (o && strcmp(o, "gloo") == 0);
}

static int arm_path(const char *path, int explicit_path)
{
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!handle) return -1;
    /* The library's base address: the object the vtable lives in. */
    void *probe = dlsym(handle, s_allreduce_f32.vtable);
    Dl_info info;
    if (!probe || !dladdr(probe, &info)) {
        /* Horovod built without Gloo has none of these symbols: said only
         * where Gloo was asked for (horovodrun --gloo and elastic jobs set
         * HOROVOD_CONTROLLER=gloo) or the library was named; an MPI job's
         * scan of its extension stays silent. */
        if (!said_missing && (gloo_requested() || explicit_path)) {
            said_missing = 1;
            if (gloo_requested())
                hvprof_warn("Gloo collectives are not recorded: this Horovod (%s) is built "
                            "without Gloo, yet the job asks for it (HOROVOD_CONTROLLER=gloo); "
                            "build Horovod with HOROVOD_WITH_GLOO=1", path);
            else
                hvprof_warn("Gloo collectives are not recorded: %s has no %s (a Horovod other "
                            "than 0.28.x?)", path, s_allreduce_f32.vtable);
        }
        dlclose(handle);
        return 0;
    }
    for (int i = 0; i < n_armed; i++) {
        if (armed_base[i] == info.dli_fbase) {
            dlclose(handle);
            return armed_slots[i];
        }
    }
    if (n_armed >= MAX_LIBS) {
        dlclose(handle);
        return 0;
    }
    relro_query q = {(uintptr_t)info.dli_fbase, 0, 0};
    dl_iterate_phdr(find_relro, &q);
    const char *missing = NULL;
    int li = n_armed;
    int armed = arm_library(handle, li, &q, &missing);
    armed_base[li] = info.dli_fbase;
    armed_slots[li] = armed;
    n_armed++;
    if (missing && !said_missing) {
        said_missing = 1;
        hvprof_warn("Gloo collectives partly recorded: %s lacks %s (%d of %zu wrappers armed)",
                    path, missing, armed, N_SPECS - 1);
    }
    /* The handle stays open: the library must not go while wrapped. */
    return armed;
}

/* dl_iterate_phdr: every loaded Horovod extension (a path with "horovod/"
 * and "mpi_lib" in it). */
typedef struct scan { int total; int found; } scan;

static int arm_each(struct dl_phdr_info *info, size_t n, void *arg)
{
    (void)n;
    scan *sc = arg;
    const char *name = info->dlpi_name;
    if (!name || !strstr(name, "horovod/") || !strstr(name, "mpi_lib")) return 0;
    sc->found++;
    int r = arm_path(name, 0);
    if (r > 0) sc->total += r;
    return 0;
}

/* Arm the wrappers in `library` (a path or soname of a loaded library), or,
 * with NULL, in every loaded Horovod extension.  Idempotent, thread-safe.
 * Returns the wrappers armed (>0), 0 when none could be (said once, on
 * stderr), -1 when the library is not loaded.  Never fails the job. */
HVPROF_EXPORT int hvprof_gloo_arm(const char *library)
{
    pthread_mutex_lock(&arm_lock);
    int r;
    if (library && *library) {
        r = arm_path(library, 1);
    } else {
        scan sc = {0, 0};
        dl_iterate_phdr(arm_each, &sc);
        r = sc.found ? sc.total : -1;
    }
    pthread_mutex_unlock(&arm_lock);
    return r;
}

/* Records the wrappers wrote (tests, the rank's metadata). */
HVPROF_EXPORT uint64_t hvprof_gloo_records(void) { return atomic_load(&c_records); }

static void gloo_reset(void) { atomic_store(&n_controllers, 0); }

static void gloo_atfork_child(void) { atomic_store(&open_tried, 0); }

static const hvprof_backend gloo_backend = {
    .name = "gloo",
    .reset = gloo_reset,
    .atfork_child = gloo_atfork_child,
};

__attribute__((constructor)) static void gloo_ctor(void) { hvprof_register_backend(&gloo_backend); }
