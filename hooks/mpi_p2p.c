/*
 * mpi_p2p.c -- point-to-point wrappers (MPI_Send/Recv and their modes,
 * Sendrecv, Probe/Iprobe, Isend/Irecv) and request completion (the pending
 * table: MPI_Wait/Test and their all/any/some forms, MPI_Request_free),
 * which the nonblocking collectives (mpi_wrappers.c) post into too.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "mpi_internal.h"

/* ------------------------------------------------------------------------ */
/* Point-to-point calls in the format's terms (hvprof_format.h, ops 16..23):
 * the peer as a rank of the communicator (never translated to a world rank:
 * the analysis does that from the ranks' communicator tables), the tag in
 * `seq` (the collective sequence is not advanced), MPI's special ranks
 * mapped to the format's values.                                             */

static inline int32_t p2p_peer(int r)
{
    if (HVPROF_LIKELY(r >= 0)) return r;
    return r == MPI_PROC_NULL ? HVPROF_PEER_PROC_NULL
           : r == MPI_ANY_SOURCE ? HVPROF_PEER_ANY_SOURCE : r;
}

static inline uint32_t p2p_tag(int tag)
{
    return (uint32_t)(int32_t)(tag == MPI_ANY_TAG ? HVPROF_TAG_ANY : tag);
}

/* What a receive's (or probe's) status says: the bytes that arrived
 * (MPI_Get_count in MPI_BYTE: both Open MPI and MPICH keep a status's count
 * in bytes, so this holds for derived types too, and needs no datatype
 * handle -- one posted with MPI_Irecv may be freed before the completion),
 * the elements they make, the actual source and tag. */
void mpi_from_status(hvprof_record *r, const MPI_Status *st)
{
    int n = 0;
    if (PMPI_Get_count(st, MPI_BYTE, &n) != MPI_SUCCESS || n < 0) n = 0; /* MPI_UNDEFINED < 0 */
    r->bytes = (uint64_t)n;
    r->count = r->dtype_size ? (uint64_t)n / r->dtype_size : 0;
    r->root = p2p_peer(st->MPI_SOURCE);
    r->seq = p2p_tag(st->MPI_TAG);
    r->flags = (uint16_t)(r->flags | HVPROF_FLAG_FROM_STATUS);
}

/* A point-to-point call's record as known at its start (a receive: as
 * posted).  Nothing moves to or from MPI_PROC_NULL: 0 bytes. */
static inline hvprof_record p2p_rec(uint16_t op, uint64_t t0, uint64_t t1, const hvprof_desc *d,
                                    int count, int peer, int tag, uint16_t flags,
                                    const void *buf, int rc)
{
    int32_t pr = p2p_peer(peer);
    uint64_t n = pr == HVPROF_PEER_PROC_NULL ? 0 : UCOUNT(count);
    return (hvprof_record){
        .t_start = t0, .t_end = t1, .bytes = n * d->dt_size, .count = n, .seq = p2p_tag(tag),
        .comm = d->ci, .track = HVPROF_TRACK_SELF, .root = pr, .op = op, .dtype = d->dt_code,
        .redop = HVPROF_REDOP_NONE,
        .flags = (uint16_t)(flags | d->dt_flags | (rc != MPI_SUCCESS ? HVPROF_FLAG_ERROR : 0)),
        .rc = sat16(rc), .dtype_size = d->dt_size, .aux = hvprof_fold_ptr(buf)};
}

/* A finished record: written, or in summary mode / while sampling is paused
 * folded into the aggregates or counted. */
static void record_or_divert(hvprof_record *r)
{
    if (HVPROF_UNLIKELY(atomic_load_explicit(&hvprof_divert, memory_order_relaxed))) {
        hvprof_divert_call(r->op, r->comm, r->bytes, r->dtype, r->redop, r->flags, r->rc,
                           r->t_start, r->t_end);
        return;
    }
    (void)hvprof_emit(r);
}

/* The general path of a point-to-point call, after it: st (NULL: a send)
 * is the status MPI filled (the caller's, or the wrapper's own when the
 * caller passed MPI_STATUS_IGNORE). */
static inline void p2p_emit(uint16_t op, uint64_t t0, uint64_t t1, MPI_Comm comm, MPI_Datatype dt,
                            int count, int peer, int tag, const void *buf, int rc,
                            const MPI_Status *st)
{
    const hvprof_desc *d = describe(comm, dt, MPI_OP_NULL);
    hvprof_record r = p2p_rec(op, t0, t1, d, count, peer, tag, 0, buf, rc);
    if (st && rc == MPI_SUCCESS) mpi_from_status(&r, st);
    record_or_divert(&r);
}

/* The fast path's open (call_open without a sequence number). */
static inline __attribute__((always_inline)) void
p2p_open(hvprof_tls *t, hvprof_record *r, uint16_t op, MPI_Comm comm, MPI_Datatype dt, int count,
         int peer, int tag, const void *buf)
{
    (void)dt;
    const hvprof_desc *d = &t->desc;
    int32_t pr = p2p_peer(peer);
    uint64_t n = pr == HVPROF_PEER_PROC_NULL ? 0 : UCOUNT(count);
    r->bytes = n * d->dt_size;
    r->count = n;
    r->seq = p2p_tag(tag);
    r->comm = d->ci;
    r->track = t->track;
    r->root = pr;
    r->op = op;
    r->dtype = d->dt_code;
    r->redop = HVPROF_REDOP_NONE;
    r->flags = d->dt_flags;
    r->dtype_size = d->dt_size;
    r->aux = hvprof_fold_ptr(buf);
    hvprof_inflight_entry *e = t->inflight;
    uint64_t t0 = hvprof_fast_ticks();
    r->t_start = t0;
    if (e) hvprof_inflight_begin_p2p(e, op, H(comm), t0, pr, (int32_t)r->seq);
}

/* MPI_Send and MPI_Recv: the collectives' shape (MPI_WRAPPER) and fast path
 * (one record slot taken before the call, completed after it), without a
 * sequence number; summary mode and paused sampling take the general path.
 * PRE: locals; CALL: the arguments PMPI_<NAME> gets (a receive's status:
 * the wrapper's own when the caller passed MPI_STATUS_IGNORE); DESC: (comm,
 * datatype, count, peer, tag, buffer); ST: the status to read (NULL: none). */
#define P2P_HIT_(t, comm, dt, count, peer, tag, buf) desc_hit(t, comm, dt, MPI_OP_NULL)
#define P2P_FLIGHT_(e, op, t0, comm, dt, count, peer, tag, buf)                \
    hvprof_inflight_begin_p2p(e, op, H(comm), t0, p2p_peer(peer), (int32_t)p2p_tag(tag))
#define P2P_FLIGHT(e, op, t0, ...) APPLY(P2P_FLIGHT_, e, op, t0, __VA_ARGS__)
#define P2P_WRAPPER(NAME, OP, PARAMS, ARGS, PRE, CALL, DESC, ST)               \
    static __attribute__((noinline)) int general_##NAME PARAMS                 \
    {                                                                          \
        PRE                                                                    \
        hvprof_inflight_entry *e_ = general_inflight(&hvprof_t);               \
        uint64_t t0 = hvprof_ticks();                                          \
        if (e_) P2P_FLIGHT(e_, HVPROF_OP_##OP, t0, ARGS_OF DESC);              \
        int rc = PMPI_##NAME CALL;                                             \
        if (e_) hvprof_inflight_end(e_);                                       \
        uint64_t t1 = hvprof_ticks();                                          \
        p2p_emit(HVPROF_OP_##OP, t0, t1, ARGS_OF DESC, rc, ST);                \
        return rc;                                                             \
    }                                                                          \
    HVPROF_EXPORT int MPI_##NAME PARAMS                                        \
    {                                                                          \
        if (!ACTIVE()) return PMPI_##NAME ARGS;                                \
        hvprof_tls *t_ = &hvprof_t;                                            \
        int div_;                                                              \
        hvprof_record *r_;                                                     \
        if (HVPROF_UNLIKELY(!APPLY(P2P_HIT_, t_, ARGS_OF DESC) ||              \
                            !call_fast(t_, &div_) || div_ != 0 ||              \
                            !call_slot(t_, &r_)))                              \
            return general_##NAME ARGS;                                        \
        PRE                                                                    \
        p2p_open(t_, r_, HVPROF_OP_##OP, ARGS_OF DESC);                        \
        int rc = PMPI_##NAME CALL;                                             \
        call_close_st(t_, r_, rc, ST);                                             \
        return rc;                                                             \
    }

P2P_WRAPPER(Send, MPI_SEND,
            (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm),
            (buf, count, datatype, dest, tag, comm), ,
            (buf, count, datatype, dest, tag, comm),
            (comm, datatype, count, dest, tag, buf), NULL)

P2P_WRAPPER(Recv, MPI_RECV,
            (void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
             MPI_Status *status),
            (buf, count, datatype, source, tag, comm, status),
            MPI_Status own_;
            MPI_Status *st_ = status == MPI_STATUS_IGNORE ? &own_ : status;,
            (buf, count, datatype, source, tag, comm, st_),
            (comm, datatype, count, source, tag, buf), st_)

/* The other send modes are sends as a trace reads them (bytes, peer, tag):
 * recorded as MPI_SEND, the mode not kept. */
#define SEND_MODE_WRAPPER(NAME)                                                \
    P2P_WRAPPER(NAME, MPI_SEND,                                                \
                (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, \
                 MPI_Comm comm),                                               \
                (buf, count, datatype, dest, tag, comm), ,                     \
                (buf, count, datatype, dest, tag, comm),                       \
                (comm, datatype, count, dest, tag, buf), NULL)
SEND_MODE_WRAPPER(Ssend)
SEND_MODE_WRAPPER(Bsend)
SEND_MODE_WRAPPER(Rsend)

/* MPI_Sendrecv(_replace): two records with the same times, the send half
 * (SENDRECV) and the receive half (SENDRECV_RECV); the general path only. */
HVPROF_EXPORT int MPI_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest,
                               int sendtag, void *recvbuf, int recvcount, MPI_Datatype recvtype,
                               int source, int recvtag, MPI_Comm comm, MPI_Status *status)
{
    if (!ACTIVE())
        return PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                             recvtype, source, recvtag, comm, status);
    MPI_Status own;
    MPI_Status *st = status == MPI_STATUS_IGNORE ? &own : status;
    hvprof_inflight_entry *e = general_inflight(&hvprof_t);
    uint64_t t0 = hvprof_ticks();
    if (e) hvprof_inflight_begin_p2p(e, HVPROF_OP_MPI_SENDRECV, H(comm), t0, p2p_peer(dest),
                                     (int32_t)p2p_tag(sendtag));
    int rc = PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                           recvtype, source, recvtag, comm, st);
    if (e) hvprof_inflight_end(e);
    uint64_t t1 = hvprof_ticks();
    p2p_emit(HVPROF_OP_MPI_SENDRECV, t0, t1, comm, sendtype, sendcount, dest, sendtag, sendbuf,
             rc, NULL);
    p2p_emit(HVPROF_OP_MPI_SENDRECV_RECV, t0, t1, comm, recvtype, recvcount, source, recvtag,
             recvbuf, rc, st);
    return rc;
}

HVPROF_EXPORT int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype datatype, int dest,
                                       int sendtag, int source, int recvtag, MPI_Comm comm,
                                       MPI_Status *status)
{
    if (!ACTIVE())
        return PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                     status);
    MPI_Status own;
    MPI_Status *st = status == MPI_STATUS_IGNORE ? &own : status;
    hvprof_inflight_entry *e = general_inflight(&hvprof_t);
    uint64_t t0 = hvprof_ticks();
    if (e) hvprof_inflight_begin_p2p(e, HVPROF_OP_MPI_SENDRECV, H(comm), t0, p2p_peer(dest),
                                     (int32_t)p2p_tag(sendtag));
    int rc = PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, st);
    if (e) hvprof_inflight_end(e);
    uint64_t t1 = hvprof_ticks();
    p2p_emit(HVPROF_OP_MPI_SENDRECV, t0, t1, comm, datatype, count, dest, sendtag, buf, rc, NULL);
    p2p_emit(HVPROF_OP_MPI_SENDRECV_RECV, t0, t1, comm, datatype, count, source, recvtag, buf,
             rc, st);
    return rc;
}

/* MPI_Probe: the message found (bytes, source, tag from the status; count in
 * MPI_BYTE).  MPI_Iprobe: recorded only when it found one (a polling loop's
 * misses would be most of the records and say nothing). */
HVPROF_EXPORT int MPI_Probe(int source, int tag, MPI_Comm comm, MPI_Status *status)
{
    if (!ACTIVE()) return PMPI_Probe(source, tag, comm, status);
    MPI_Status own;
    MPI_Status *st = status == MPI_STATUS_IGNORE ? &own : status;
    hvprof_inflight_entry *e = general_inflight(&hvprof_t);
    uint64_t t0 = hvprof_ticks();
    if (e) hvprof_inflight_begin_p2p(e, HVPROF_OP_MPI_PROBE, H(comm), t0, p2p_peer(source),
                                     (int32_t)p2p_tag(tag));
    int rc = PMPI_Probe(source, tag, comm, st);
    if (e) hvprof_inflight_end(e);
    uint64_t t1 = hvprof_ticks();
    p2p_emit(HVPROF_OP_MPI_PROBE, t0, t1, comm, MPI_BYTE, 0, source, tag, NULL, rc, st);
    return rc;
}

HVPROF_EXPORT int MPI_Iprobe(int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status)
{
    if (!ACTIVE()) return PMPI_Iprobe(source, tag, comm, flag, status);
    MPI_Status own;
    MPI_Status *st = status == MPI_STATUS_IGNORE ? &own : status;
    uint64_t t0 = hvprof_ticks();
    int rc = PMPI_Iprobe(source, tag, comm, flag, st);
    if (rc == MPI_SUCCESS && !*flag) return rc;
    p2p_emit(HVPROF_OP_MPI_IPROBE, t0, hvprof_ticks(), comm, MPI_BYTE, 0, source, tag, NULL, rc,
             st);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Nonblocking calls (MPI_Iallreduce, MPI_Isend, MPI_Irecv): timed from the
 * call to the completion that MPI_Wait/Test* reports.  Pending requests sit
 * in a small lock-free table, each with its record as known at the post;
 * Wait/Test pay one relaxed load when nothing is pending.  A receive's
 * completion status (the caller's, or the wrapper's own when the caller
 * passed MPI_STATUS(ES)_IGNORE) fills in what arrived.  A request not in the
 * table (MPI_REQUEST_NULL, another nonblocking call) is looked for and not
 * found: a scan of the table, only while something is pending.               */

#define PENDING_SLOTS 512u
typedef struct {
    _Atomic uint64_t req;  /* request handle, 0 = free, 1 = being filled */
    hvprof_record rec;     /* the record at the post; t_end at completion */
} pending_t;
static pending_t pending[PENDING_SLOTS];
static _Atomic int n_pending;

/* Track the request whose record *rec starts (rc: the post's); a failed
 * post, or one with nothing to wait for, is recorded now. */
static void pending_add(MPI_Request req, hvprof_record *rec)
{
    if (rec->rc != 0 || req == MPI_REQUEST_NULL) {
        rec->t_end = hvprof_ticks();
        record_or_divert(rec);
        return;
    }
    rec->track = hvprof_track_self();
    uint32_t start = (uint32_t)(hvprof_mix(0, H(req)) & (PENDING_SLOTS - 1));
    for (uint32_t i = 0; i < PENDING_SLOTS; i++) {
        pending_t *p = &pending[(start + i) & (PENDING_SLOTS - 1)];
        uint64_t expect = 0;
        if (!atomic_compare_exchange_strong(&p->req, &expect, 1)) continue;
        p->rec = *rec;
        atomic_store_explicit(&p->req, H(req), memory_order_release);
        atomic_fetch_add(&n_pending, 1);
        return;
    }
    __atomic_fetch_add(&hvprof_header()->dropped_records, 1, __ATOMIC_RELAXED);
}

/* Completed (or freed) request: write its record, on the issuing thread's
 * track, from whichever thread completes it.  st: the completion's status
 * (NULL: none, or the completion failed). */
static void pending_done(uint64_t key, uint64_t t1, uint16_t extra_flags, const MPI_Status *st)
{
    if (key == H(MPI_REQUEST_NULL)) return;
    uint32_t start = (uint32_t)(hvprof_mix(0, key) & (PENDING_SLOTS - 1));
    for (uint32_t i = 0; i < PENDING_SLOTS; i++) {
        pending_t *p = &pending[(start + i) & (PENDING_SLOTS - 1)];
        if (atomic_load_explicit(&p->req, memory_order_acquire) != key) continue;
        hvprof_record r = p->rec;
        atomic_store_explicit(&p->req, 0, memory_order_release);
        atomic_fetch_sub(&n_pending, 1);
        r.t_end = t1;
        r.flags = (uint16_t)(r.flags | extra_flags);
        if (st && r.op == HVPROF_OP_MPI_IRECV && !(extra_flags & HVPROF_FLAG_NO_COMPLETION))
            mpi_from_status(&r, st);
        record_or_divert(&r);
        return;
    }
}

/* MPI_Isend / MPI_Irecv: the post's record goes into the pending table. */
static __attribute__((noinline)) void p2p_post(uint16_t op, uint64_t t0, MPI_Comm comm,
                                               MPI_Datatype dt, int count, int peer, int tag,
                                               const void *buf, int rc, MPI_Request *request)
{
    const hvprof_desc *d = describe(comm, dt, MPI_OP_NULL);
    hvprof_record r = p2p_rec(op, t0, 0, d, count, peer, tag, HVPROF_FLAG_NONBLOCKING, buf, rc);
    pending_add(rc == MPI_SUCCESS ? *request : MPI_REQUEST_NULL, &r);
}

/* A nonblocking post (NAME), recorded as OP: the record waits in the pending
 * table for the request's completion.  MPI_Issend is recorded as MPI_Isend
 * (the mode not kept). */
#define P2P_POST_WRAPPER(NAME, OP, BUF_T, PEER)                                \
    HVPROF_EXPORT int MPI_##NAME(BUF_T *buf, int count, MPI_Datatype datatype,  \
                                 int PEER, int tag, MPI_Comm comm,              \
                                 MPI_Request *request)                          \
    {                                                                           \
        if (!ACTIVE()) return PMPI_##NAME(buf, count, datatype, PEER, tag, comm, request); \
        uint64_t t0 = hvprof_ticks();                                           \
        int rc = PMPI_##NAME(buf, count, datatype, PEER, tag, comm, request);   \
        p2p_post(HVPROF_OP_##OP, t0, comm, datatype, count, PEER, tag, buf, rc, request); \
        return rc;                                                              \
    }
P2P_POST_WRAPPER(Isend, MPI_ISEND, const void, dest)
P2P_POST_WRAPPER(Issend, MPI_ISEND, const void, dest)
P2P_POST_WRAPPER(Irecv, MPI_IRECV, void, source)

#define ANY_PENDING() atomic_load_explicit(&n_pending, memory_order_relaxed)

/* The status of completion i of a multi-completion call whose return code is
 * rc (MPI_ERR_IN_STATUS: each status says), NULL when it failed. */
static inline const MPI_Status *status_ok(const MPI_Status *s, int rc)
{
    if (rc == MPI_SUCCESS) return s;
    return rc == MPI_ERR_IN_STATUS && s->MPI_ERROR == MPI_SUCCESS ? s : NULL;
}

HVPROF_EXPORT int MPI_Wait(MPI_Request *request, MPI_Status *status)
{
    if (!ANY_PENDING()) return PMPI_Wait(request, status);
    MPI_Status own;
    MPI_Status *s = status == MPI_STATUS_IGNORE ? &own : status;
    uint64_t key = H(*request);
    int rc = PMPI_Wait(request, s);
    pending_done(key, hvprof_ticks(), 0, rc == MPI_SUCCESS ? s : NULL);
    return rc;
}

HVPROF_EXPORT int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status)
{
    if (!ANY_PENDING()) return PMPI_Test(request, flag, status);
    MPI_Status own;
    MPI_Status *s = status == MPI_STATUS_IGNORE ? &own : status;
    uint64_t key = H(*request);
    int rc = PMPI_Test(request, flag, s);
    if (*flag) pending_done(key, hvprof_ticks(), 0, rc == MPI_SUCCESS ? s : NULL);
    return rc;
}

/* Copies of up to this many request handles (and, for a caller that passed
 * MPI_STATUSES_IGNORE, statuses: 8 KiB of stack at most, in the *_tracked
 * helpers only, never on the path with nothing pending) live on the stack; a
 * call with more requests is not followed: its requests are reported as
 * never completed at MPI_Finalize (with the time of MPI_Finalize). */
#define MAX_TRACKED 256

static __attribute__((noinline)) int waitall_tracked(int count, MPI_Request requests[],
                                                     MPI_Status statuses[])
{
    uint64_t keys[MAX_TRACKED];
    MPI_Status own[MAX_TRACKED];
    MPI_Status *s = statuses == MPI_STATUSES_IGNORE ? own : statuses;
    for (int i = 0; i < count; i++) keys[i] = H(requests[i]);
    int rc = PMPI_Waitall(count, requests, s);
    uint64_t t1 = hvprof_ticks();
    for (int i = 0; i < count; i++) pending_done(keys[i], t1, 0, status_ok(&s[i], rc));
    return rc;
}

HVPROF_EXPORT int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[])
{
    if (!ANY_PENDING() || count > MAX_TRACKED || count < 0)
        return PMPI_Waitall(count, requests, statuses);
    return waitall_tracked(count, requests, statuses);
}

static __attribute__((noinline)) int testall_tracked(int count, MPI_Request requests[], int *flag,
                                                     MPI_Status statuses[])
{
    uint64_t keys[MAX_TRACKED];
    MPI_Status own[MAX_TRACKED];
    MPI_Status *s = statuses == MPI_STATUSES_IGNORE ? own : statuses;
    for (int i = 0; i < count; i++) keys[i] = H(requests[i]);
    int rc = PMPI_Testall(count, requests, flag, s);
    if (*flag) {
        uint64_t t1 = hvprof_ticks();
        for (int i = 0; i < count; i++) pending_done(keys[i], t1, 0, status_ok(&s[i], rc));
    }
    return rc;
}

HVPROF_EXPORT int MPI_Testall(int count, MPI_Request requests[], int *flag, MPI_Status statuses[])
{
    if (!ANY_PENDING() || count > MAX_TRACKED || count < 0)
        return PMPI_Testall(count, requests, flag, statuses);
    return testall_tracked(count, requests, flag, statuses);
}

static __attribute__((noinline)) int waitany_tracked(int count, MPI_Request requests[], int *index,
                                                     int *flag, MPI_Status *status)
{
    uint64_t keys[MAX_TRACKED];
    MPI_Status own;
    MPI_Status *s = status == MPI_STATUS_IGNORE ? &own : status;
    for (int i = 0; i < count; i++) keys[i] = H(requests[i]);
    int rc = flag ? PMPI_Testany(count, requests, index, flag, s)
                  : PMPI_Waitany(count, requests, index, s);
    if ((!flag || *flag) && *index >= 0 && *index < count)
        pending_done(keys[*index], hvprof_ticks(), 0, rc == MPI_SUCCESS ? s : NULL);
    return rc;
}

HVPROF_EXPORT int MPI_Waitany(int count, MPI_Request requests[], int *index, MPI_Status *status)
{
    if (!ANY_PENDING() || count > MAX_TRACKED || count < 0)
        return PMPI_Waitany(count, requests, index, status);
    return waitany_tracked(count, requests, index, NULL, status);
}

HVPROF_EXPORT int MPI_Testany(int count, MPI_Request requests[], int *index, int *flag, MPI_Status *status)
{
    if (!ANY_PENDING() || count > MAX_TRACKED || count < 0)
        return PMPI_Testany(count, requests, index, flag, status);
    return waitany_tracked(count, requests, index, flag, status);
}

/* Waitsome (test = 0) and Testsome (test = 1). */
static __attribute__((noinline)) int waitsome_tracked(int test, int incount,
                                                      MPI_Request requests[], int *outcount,
                                                      int indices[], MPI_Status statuses[])
{
    uint64_t keys[MAX_TRACKED];
    MPI_Status own[MAX_TRACKED];
    MPI_Status *s = statuses == MPI_STATUSES_IGNORE ? own : statuses;
    for (int i = 0; i < incount; i++) keys[i] = H(requests[i]);
    int rc = test ? PMPI_Testsome(incount, requests, outcount, indices, s)
                  : PMPI_Waitsome(incount, requests, outcount, indices, s);
    uint64_t t1 = hvprof_ticks();
    for (int i = 0; *outcount != MPI_UNDEFINED && i < *outcount; i++)
        if (indices[i] >= 0 && indices[i] < incount)
            pending_done(keys[indices[i]], t1, 0, status_ok(&s[i], rc));
    return rc;
}

HVPROF_EXPORT int MPI_Waitsome(int incount, MPI_Request requests[], int *outcount, int indices[],
                 MPI_Status statuses[])
{
    if (!ANY_PENDING() || incount > MAX_TRACKED || incount < 0)
        return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
    return waitsome_tracked(0, incount, requests, outcount, indices, statuses);
}

HVPROF_EXPORT int MPI_Testsome(int incount, MPI_Request requests[], int *outcount, int indices[],
                 MPI_Status statuses[])
{
    if (!ANY_PENDING() || incount > MAX_TRACKED || incount < 0)
        return PMPI_Testsome(incount, requests, outcount, indices, statuses);
    return waitsome_tracked(1, incount, requests, outcount, indices, statuses);
}

HVPROF_EXPORT int MPI_Request_free(MPI_Request *request)
{
    if (!ANY_PENDING()) return PMPI_Request_free(request);
    uint64_t key = H(*request);
    int rc = PMPI_Request_free(request);
    pending_done(key, hvprof_ticks(), HVPROF_FLAG_NO_COMPLETION, NULL);
    return rc;
}

/* A nonblocking collective's post (NBC_WRAPPER): described as its blocking
 * form, after the call; the record waits in the pending table. */
void mpi_nbc_post(uint16_t op, uint64_t t0, MPI_Comm comm, MPI_Datatype dt, uint64_t count,
                  int count_mult, MPI_Op mop, int root, uint16_t flags, const void *buf, int rc,
                  MPI_Request *request)
{
    (void)buf; /* aux: 0, as MPI_Iallreduce's record has always had */
    const hvprof_desc *d = describe(comm, dt, mop);
    if (count_mult)
        count *= (uint64_t)(count_mult == MULT_PEERS ? peers_of(d->ci) : comm_size_of(d->ci));
    hvprof_record r = {
        .t_start = t0, .bytes = count * d->dt_size, .count = count,
        .seq = hvprof_comm_next_seq(d->ci), .comm = d->ci, .track = HVPROF_TRACK_SELF,
        .root = root, .op = op, .dtype = d->dt_code, .redop = d->redop,
        .flags = (uint16_t)(flags | HVPROF_FLAG_NONBLOCKING | d->dt_flags |
                            (rc != MPI_SUCCESS ? HVPROF_FLAG_ERROR : 0)),
        .rc = sat16(rc), .dtype_size = d->dt_size, .aux = 0};
    pending_add(rc == MPI_SUCCESS ? *request : MPI_REQUEST_NULL, &r);
}

/* At MPI_Finalize: requests never completed are recorded as such. */
void mpi_pending_finalize(uint64_t t0)
{
    if (!ANY_PENDING()) return;
    for (uint32_t i = 0; i < PENDING_SLOTS; i++) {
        uint64_t k = atomic_load(&pending[i].req);
        if (k > 2) pending_done(k, t0, HVPROF_FLAG_NO_COMPLETION, NULL);
    }
}
