/*
 * mpi_internal.h -- what the MPI wrappers' files share (mpi.c: set-up and
 * tear-down; mpi_handles.c: tables, communicators; mpi_clock.c: clock sync;
 * mpi_gather.c: the files' gather; mpi_p2p.c:
 * point-to-point and requests; mpi_wrappers.c and mpi_fortran.c: the
 * collectives and the Fortran bindings, generated from hooks/mpi_protos.py by
 * scripts/gen_mpi_wrappers.py): the handle key,
 * the description of a call, and the fast path every wrapper takes.  The
 * fast path's functions are inline here, so that each wrapper compiles to one
 * function with no call before the MPI call (tests/test_hot_path.py).
 */
#ifndef HVPROF_MPI_INTERNAL_H
#define HVPROF_MPI_INTERNAL_H

#include <mpi.h>

#include "hvprof_internal.h"


/* A handle as a 64-bit key: Open MPI's are pointers, MPICH's are ints
 * (kept unsigned, not sign-extended). */
#define H(x) ((uint64_t)(uintptr_t)(x) & (sizeof(x) == 4 ? 0xffffffffull : ~0ull))

/* Defined in mpi_handles.c (tables, communicators, descriptions) and mpi_p2p.c
 * (statuses). */
extern int mpi_remote_sizes[HVPROF_COMM_TABLE_CAPACITY];
/* The predefined datatypes' and ops' tables (MPI_Init). */
void mpi_build_tables(void);
uint32_t mpi_comm_index_slow(MPI_Comm comm);
void mpi_describe_slow(hvprof_desc *d, MPI_Comm comm, MPI_Datatype dt, MPI_Op op, uint32_t epoch);
void mpi_from_status(hvprof_record *r, const MPI_Status *st);
/* mpi_gather.c: at MPI_Finalize, after the raw file is closed, the files of
 * the ranks whose disk rank 0 cannot see reach rank 0's directory; the
 * number of such ranks (the same on every rank). */
int mpi_gather_files(MPI_Comm comm, int me, int size, const hvprof_file_header *h,
                     const char *dir);


/* The communicator's table index: this thread's hvprof_desc when it holds
 * this communicator, else the table (registering it when new). */
static inline uint32_t comm_index(MPI_Comm comm)
{
    const hvprof_desc *d = &hvprof_t.desc;
    uint32_t epoch = atomic_load_explicit(&hvprof_handle_epoch, memory_order_relaxed);
    if (HVPROF_LIKELY(d->comm == H(comm) && d->epoch == epoch)) return d->ci;
    return mpi_comm_index_slow(comm);
}


static inline int comm_size_of(uint32_t idx)
{
    hvprof_file_header *h = hvprof_header();
    if (!h || idx >= HVPROF_COMM_TABLE_CAPACITY) return 1;
    const hvprof_comm_entry *e = (const hvprof_comm_entry *)((const char *)h + h->comm_table_offset) + idx;
    return e->size > 0 ? e->size : 1;
}

/* The ranks this rank exchanges data with: the communicator's size, or for
 * an intercommunicator the remote group's (the length of the counts arrays of
 * allgatherv, gatherv, alltoallv; the multiplier of allgather, gather,
 * alltoall). */
static inline int peers_of(uint32_t idx)
{
    if (idx < HVPROF_COMM_TABLE_CAPACITY && mpi_remote_sizes[idx] > 0) return mpi_remote_sizes[idx];
    return comm_size_of(idx);
}

static inline int16_t sat16(int rc) { return (int16_t)(rc > 32767 ? 32767 : rc < -32768 ? -32768 : rc); }

#define MULT_SIZE 1
#define MULT_PEERS 2
#define ACTIVE() atomic_load_explicit(&hvprof_active, memory_order_relaxed)

/* What (comm, dt, op) mean: this thread's last lookup when it holds the
 * same three handles within the current epoch, else a fresh one. */
static inline __attribute__((always_inline)) const hvprof_desc *describe(MPI_Comm comm,
                                                                        MPI_Datatype dt,
                                                                        MPI_Op op)
{
    hvprof_desc *d = &hvprof_t.desc;
    uint32_t epoch = atomic_load_explicit(&hvprof_handle_epoch, memory_order_relaxed);
    if (HVPROF_UNLIKELY(d->comm != H(comm) || d->dt != H(dt) || d->op != H(op) ||
                        d->epoch != epoch))
        mpi_describe_slow(d, comm, dt, op, epoch);
    return d;
}

/* A call, described in MPI's terms, becomes one record (hvprof_emit) or, in
 * summary mode and while sampling is paused, one aggregate (hvprof_divert_call).
 * count_mult: multiply the element count by the communicator size (MULT_SIZE)
 * or by the number of peers (MULT_PEERS: the remote group's size for an
 * intercommunicator); 0: not at all.  The general path (wrappers' fast path:
 * call_open / call_close below). */
static inline __attribute__((always_inline)) void emit(uint16_t op, uint64_t t0, uint64_t t1,
                                                       MPI_Comm comm, MPI_Datatype dt,
                                                       uint64_t count, int count_mult, MPI_Op mop,
                                                       int root, uint16_t flags,
                                                       const void *buf, int rc)
{
    const hvprof_desc *d = describe(comm, dt, mop);
    uint32_t ci = d->ci;
    uint32_t seq = hvprof_comm_next_seq(ci); /* advance even when not recorded */
    if (count_mult) count *= (uint64_t)(count_mult == MULT_PEERS ? peers_of(ci) : comm_size_of(ci));
    flags = (uint16_t)(flags | d->dt_flags);
    if (HVPROF_UNLIKELY(atomic_load_explicit(&hvprof_divert, memory_order_relaxed))) {
        hvprof_divert_call(op, ci, count * d->dt_size, d->dt_code, d->redop, flags, rc, t0, t1);
        return;
    }
    (void)hvprof_emit(&(hvprof_record){
        .t_start = t0, .t_end = t1, .bytes = count * d->dt_size, .count = count, .seq = seq,
        .comm = ci, .track = HVPROF_TRACK_SELF, .root = root, .op = op, .dtype = d->dt_code,
        .redop = d->redop,
        .flags = (uint16_t)(flags | (rc != MPI_SUCCESS ? HVPROF_FLAG_ERROR : 0)),
        .rc = sat16(rc), .dtype_size = d->dt_size, .aux = hvprof_fold_ptr(buf)});
}

/* The fast path: the record's slot is taken before the call and filled with
 * everything known then (the handles looked up, the sequence number, sizes,
 * t_start); after the call only t_end, rc and the error flag are stored and
 * the count published.  Across the call the wrapper keeps the slot and the
 * thread state, not the call's arguments.  Taken when recording one record per call, on this thread's
 * current chunk with a free slot, and no call open on this thread (else the
 * general path: emit after the call, as for every other record). */
/* 1 when this thread's hvprof_desc holds the call's handles (checked first:
 * the fast path then calls nothing before the MPI call, so the arguments
 * need not be saved; a miss takes the general path, which looks them up). */
static inline __attribute__((always_inline)) int desc_hit(hvprof_tls *t, MPI_Comm comm,
                                                          MPI_Datatype dt, MPI_Op op)
{
    const hvprof_desc *d = &t->desc;
    uint32_t epoch = atomic_load_explicit(&hvprof_handle_epoch, memory_order_relaxed);
    return HVPROF_LIKELY(d->comm == H(comm) && d->dt == H(dt) && d->op == H(op) &&
                         d->epoch == epoch);
}
#define DESC_HIT_(t, comm, dt, count, mult, op, root, flags, buf) desc_hit(t, comm, dt, op)
#define APPLY(m, ...) m(__VA_ARGS__)

/* The fast paths' common conditions: no call open on this thread, its TLS
 * state of the current file, the TSC clock; *divert: hvprof_divert. */
static inline __attribute__((always_inline)) int call_fast(hvprof_tls *t, int *divert)
{
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_relaxed);
    *divert = atomic_load_explicit(&hvprof_divert, memory_order_relaxed);
    return HVPROF_LIKELY(t->open_rec == NULL && t->generation == gen && hvprof_fast_clock());
}

/* One record per call: take the next slot of the thread's current chunk
 * (0: none free, the general path switches chunks).  Published after the
 * call (call_close). */
static inline __attribute__((always_inline)) int call_slot(hvprof_tls *t, hvprof_record **out)
{
    uint32_t i = t->used;
    if (HVPROF_UNLIKELY(i >= t->capacity)) return 0;
    *out = &t->slots[i];
    t->open_idx = i;
    t->used = i + 1;
    t->open_rec = *out;
    return 1;
}

static inline __attribute__((always_inline)) void
call_open(hvprof_tls *t, hvprof_record *r, uint16_t op, MPI_Comm comm, MPI_Datatype dt,
          uint64_t count, int count_mult, MPI_Op mop, int root, uint16_t flags, const void *buf)
{
    (void)dt;
    (void)mop;
    const hvprof_desc *d = &t->desc;
    uint32_t ci = d->ci; /* < HVPROF_COMM_TABLE_CAPACITY: mpi_describe_slow caches no other */
    if (count_mult) count *= (uint64_t)(count_mult == MULT_PEERS ? peers_of(ci) : comm_size_of(ci));
    r->bytes = count * d->dt_size;
    r->count = count;
    uint32_t seq = atomic_load_explicit(&hvprof_comm_seq[ci], memory_order_relaxed);
    atomic_store_explicit(&hvprof_comm_seq[ci], seq + 1, memory_order_relaxed);
    r->seq = seq;
    r->comm = ci;
    r->track = t->track;
    r->root = root;
    r->op = op;
    r->dtype = d->dt_code;
    r->redop = d->redop;
    r->flags = (uint16_t)(flags | d->dt_flags);
    r->dtype_size = d->dt_size;
    r->aux = hvprof_fold_ptr(buf);
    hvprof_inflight_entry *e = t->inflight;
    uint64_t t0 = hvprof_fast_ticks();
    r->t_start = t0;
    if (e) hvprof_inflight_begin(e, op, H(comm), t0);
}

/* After the call: when open_rec is no longer this call's slot, the call was
 * closed meanwhile (another record was made from inside it: see open_rec)
 * and its record is left so. */
static inline __attribute__((always_inline)) void call_close_st(hvprof_tls *t, hvprof_record *r,
                                                                int rc, const MPI_Status *st)
{
    hvprof_inflight_entry *e = t->inflight;
    if (e) hvprof_inflight_end(e);
    uint64_t t1 = hvprof_fast_ticks();
    if (HVPROF_UNLIKELY(t->open_rec != r)) return;
    r->t_end = t1;
    if (HVPROF_LIKELY(rc == MPI_SUCCESS)) {
        r->rc = 0;
        if (st) mpi_from_status(r, st); /* a receive: bytes, source and tag from its status */
    } else {
        r->rc = sat16(rc);
        r->flags = (uint16_t)(r->flags | HVPROF_FLAG_ERROR);
    }
    t->open_rec = NULL;
    hvprof_publish(t);
}

/* A collective's close: no status (the NULL folds away, always inline). */
static inline __attribute__((always_inline)) void call_close(hvprof_tls *t, hvprof_record *r,
                                                             int rc)
{
    call_close_st(t, r, rc, NULL);
}

/* Summary mode: the aggregate this call goes into when it is the same
 * (op, communicator, bytes, datatype, reduction) as this thread's previous
 * call (NULL: the general path, which finds or makes the entry).  Across
 * the call the wrapper keeps the entry, the start and the flags. */
static inline __attribute__((always_inline)) hvprof_agg_entry *
agg_open(hvprof_tls *t, uint64_t *t0, uint16_t *fl, uint16_t op, MPI_Comm comm, MPI_Datatype dt,
         uint64_t count, int count_mult, MPI_Op mop, int root, uint16_t flags, const void *buf)
{
    (void)dt;
    (void)mop;
    (void)root;
    (void)buf;
    const hvprof_desc *d = &t->desc;
    hvprof_agg_entry *e = (hvprof_agg_entry *)t->agg_last;
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_relaxed);
    uint32_t ci = d->ci;
    if (count_mult) count *= (uint64_t)(count_mult == MULT_PEERS ? peers_of(ci) : comm_size_of(ci));
    if (HVPROF_UNLIKELY(!e || t->agg_generation != gen || e->bytes != count * d->dt_size ||
                        e->op != op || e->comm != ci || e->dtype != d->dt_code ||
                        e->redop != d->redop))
        return NULL;
    uint32_t seq = atomic_load_explicit(&hvprof_comm_seq[ci], memory_order_relaxed);
    atomic_store_explicit(&hvprof_comm_seq[ci], seq + 1, memory_order_relaxed);
    *fl = (uint16_t)(flags | d->dt_flags);
    hvprof_inflight_entry *i = t->inflight;
    *t0 = hvprof_fast_ticks();
    if (i) hvprof_inflight_begin(i, op, H(comm), *t0);
    return e;
}

static inline __attribute__((always_inline)) void agg_close(hvprof_tls *t, hvprof_agg_entry *e,
                                                            uint64_t t0, uint16_t flags, int rc)
{
    hvprof_inflight_entry *i = t->inflight;
    if (i) hvprof_inflight_end(i);
    uint64_t t1 = hvprof_fast_ticks();
    if (HVPROF_UNLIKELY(rc != MPI_SUCCESS)) flags = (uint16_t)(flags | HVPROF_FLAG_ERROR);
    hvprof_agg_add(e, t1 - t0, flags, rc);
}

/* The general path's flight-recorder entry (NULL: none).  A call open on
 * this thread is closed first (see hvprof_tls.open_rec). */
static inline hvprof_inflight_entry *general_inflight(hvprof_tls *t)
{
    if (HVPROF_UNLIKELY(t->open_rec != NULL)) hvprof_abandon_open();
    if (t->generation != atomic_load_explicit(&hvprof_generation, memory_order_relaxed))
        return NULL;
    return t->inflight;
}

/* A negative count (an erroneous call) is recorded as 0 elements. */
#define UCOUNT(c) ((uint64_t)((c) > 0 ? (c) : 0))
#define INPLACE(buf) ((buf) == MPI_IN_PLACE ? HVPROF_FLAG_IN_PLACE : 0)

/* Sum of a counts array of one entry per peer (peers: 1) or per rank of the
 * communicator's (local) group (peers: 0; reduce_scatter). */
static inline uint64_t sum_counts(const int *counts, MPI_Comm comm, int peers)
{
    if (!counts) return 0;
    uint32_t ci = comm_index(comm);
    int n = peers ? peers_of(ci) : comm_size_of(ci);
    uint64_t s = 0;
    for (int i = 0; i < n; i++) s += (uint64_t)(counts[i] > 0 ? counts[i] : 0);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Collectives.                                                               */

/* One wrapper, the same shape for every collective (and the same as nccl.c's
 * NCCL_WRAPPER): the name after MPI_, the MPI prototype's parameter list and
 * the same names as the argument list, each written once; the call is
 * forwarded to PMPI_<NAME> (untimed while the profiler is off).  PRE:
 * statements run first (locals the description needs); DESC: the call
 * described, the arguments of emit() after t0 and t1 in parentheses:
 * (comm, datatype, count, count_mult, op, root, flags, buffer), evaluated
 * before the call on the fast path, after it on the general path. */
#define ARGS_OF(...) __VA_ARGS__
#define MPI_WRAPPER(NAME, OP, PARAMS, ARGS, PRE, DESC)                         \
    static __attribute__((noinline)) int general_##NAME PARAMS                 \
    {                                                                          \
        PRE                                                                    \
        hvprof_inflight_entry *e_ = general_inflight(&hvprof_t);               \
        uint64_t t0 = hvprof_ticks();                                          \
        if (e_) hvprof_inflight_begin(e_, HVPROF_OP_##OP, H(comm), t0);        \
        int rc = PMPI_##NAME ARGS;                                             \
        if (e_) hvprof_inflight_end(e_);                                       \
        uint64_t t1 = hvprof_ticks();                                          \
        emit(HVPROF_OP_##OP, t0, t1, ARGS_OF DESC, rc);                        \
        return rc;                                                             \
    }                                                                          \
    HVPROF_EXPORT int MPI_##NAME PARAMS                                        \
    {                                                                          \
        if (!ACTIVE()) return PMPI_##NAME ARGS;                                \
        hvprof_tls *t_ = &hvprof_t;                                            \
        PRE                                                                    \
        int div_;                                                              \
        if (HVPROF_UNLIKELY(!APPLY(DESC_HIT_, t_, ARGS_OF DESC) ||             \
                            !call_fast(t_, &div_)))                            \
            return general_##NAME ARGS;                                        \
        if (HVPROF_LIKELY(div_ == 0)) {                                        \
            hvprof_record *r_;                                                 \
            if (HVPROF_UNLIKELY(!call_slot(t_, &r_))) return general_##NAME ARGS; \
            call_open(t_, r_, HVPROF_OP_##OP, ARGS_OF DESC);                   \
            int rc = PMPI_##NAME ARGS;                                         \
            call_close(t_, r_, rc);                                            \
            return rc;                                                         \
        }                                                                      \
        uint64_t t0_;                                                          \
        uint16_t fl_;                                                          \
        hvprof_agg_entry *a_;                                                  \
        if (div_ != HVPROF_DIVERT_SUMMARY ||                                   \
            !(a_ = agg_open(t_, &t0_, &fl_, HVPROF_OP_##OP, ARGS_OF DESC)))    \
            return general_##NAME ARGS;                                        \
        int rc = PMPI_##NAME ARGS;                                             \
        agg_close(t_, a_, t0_, fl_, rc);                                       \
        return rc;                                                             \
    }

/* The same over a large-count array (MPI-4's _c forms). */
static inline uint64_t sum_counts_c(const MPI_Count *counts, MPI_Comm comm, int peers)
{
    if (!counts) return 0;
    uint32_t ci = comm_index(comm);
    int n = peers ? peers_of(ci) : comm_size_of(ci);
    uint64_t s = 0;
    for (int i = 0; i < n; i++) s += (uint64_t)(counts[i] > 0 ? counts[i] : 0);
    return s;
}

/* A nonblocking collective: the post described as its blocking form would be
 * (DESC: the same arguments), flagged NONBLOCKING, its record waiting in the
 * pending table (mpi_p2p.c) for the request's completion.  Recorded under the
 * blocking form's op (MPI_Iallreduce under its own, as before the others were
 * wrapped): the trace reads the op and the flag. */
void mpi_nbc_post(uint16_t op, uint64_t t0, MPI_Comm comm, MPI_Datatype dt, uint64_t count,
                  int count_mult, MPI_Op mop, int root, uint16_t flags, const void *buf, int rc,
                  MPI_Request *request);
#define NBC_WRAPPER(NAME, OP, PARAMS, ARGS, PRE, DESC)                         \
    HVPROF_EXPORT int MPI_##NAME PARAMS                                        \
    {                                                                          \
        if (!ACTIVE()) return PMPI_##NAME ARGS;                                \
        PRE                                                                    \
        hvprof_inflight_entry *e_ = general_inflight(&hvprof_t);               \
        uint64_t t0 = hvprof_ticks();                                          \
        if (e_) hvprof_inflight_begin(e_, HVPROF_OP_##OP, H(comm), t0);        \
        int rc = PMPI_##NAME ARGS;                                             \
        if (e_) hvprof_inflight_end(e_);                                       \
        mpi_nbc_post(HVPROF_OP_##OP, t0, ARGS_OF DESC, rc, request);           \
        return rc;                                                             \
    }

/* Requests never completed at MPI_Finalize: recorded as such (mpi_p2p.c). */
void mpi_pending_finalize(uint64_t t0);

/* Clock sync (mpi_clock.c): this rank's offset to rank 0's clock. */
typedef struct { int64_t offset, err, at; } clock_sync; /* at: this rank's clock */
int mpi_sync_per_rank(void);
int mpi_estimate_offsets(MPI_Comm comm, int rank, int per_rank, clock_sync *out);

#endif
