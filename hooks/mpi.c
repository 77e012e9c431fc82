/*
 * mpi.c -- PMPI wrappers: the collectives Horovod and mpi4py applications
 * call, MPI_Init/Init_thread/Finalize, communicator creation (for stable
 * communicator ids) and request completion (for MPI_Iallreduce).
 *
 * What a record's `bytes` means, per collective (the collective's data volume
 * in nccl-tests' sense, computed from what this rank can see locally):
 *   allreduce, iallreduce, reduce, bcast      count x type size
 *   allgather, alltoall                       per-rank count x type size x comm size
 *                                             (the receive side when MPI_IN_PLACE)
 *   gather                                    per-rank count x type size x comm size
 *   allgatherv, reduce_scatter                sum(recvcounts) x type size
 *   gatherv                                   root: sum(recvcounts) x type size;
 *                                             other ranks: their own sendcount x size
 *   alltoallv                                 sum(sendcounts) x send type size
 *                                             (recvcounts when MPI_IN_PLACE)
 *   reduce_scatter_block                      recvcount x type size x comm size
 *   barrier                                   0
 * `count` is the element count of the same volume.  On an intercommunicator
 * "comm size" above is the remote group's size (the peers; the length of the
 * counts arrays), except for reduce_scatter(_block), whose counts are per
 * rank of the local group; an intercommunicator gatherv's root (MPI_ROOT)
 * counts what it receives, the other ranks of its group (MPI_PROC_NULL) 0.
 *
 * Communicator ids are equal on every member rank: derived from the parent's
 * id at creation (dup, split, create), else a hash of the members' world
 * ranks (an intercommunicator: of both groups, in an order both sides agree
 * on).  The comm table's size and rank are MPI_Comm_size / MPI_Comm_rank
 * (an intercommunicator's: in the local group).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hvprof_internal.h"

/* A handle as a 64-bit key: Open MPI's are pointers, MPICH's are ints
 * (kept unsigned, not sign-extended). */
#define H(x) ((uint64_t)(uintptr_t)(x) & (sizeof(x) == 4 ? 0xffffffffull : ~0ull))

/* ------------------------------------------------------------------------ */
/* Predefined datatypes and ops: read-only hash tables built at MPI_Init.    */

typedef struct { uint64_t key; uint32_t size; uint8_t code; uint8_t used; } dt_slot;
typedef struct { uint64_t key; uint8_t code; uint8_t used; } op_slot;
#define DT_SLOTS 256u
#define OP_SLOTS 64u
static dt_slot dt_table[DT_SLOTS];
static op_slot op_table[OP_SLOTS];

static inline uint32_t hslot(uint64_t k, uint32_t mask) { return (uint32_t)(hvprof_mix(0, k) & mask); }

static void dt_add(MPI_Datatype dt, uint8_t code)
{
    if (dt == MPI_DATATYPE_NULL) return;
    int size = 0;
    if (PMPI_Type_size(dt, &size) != MPI_SUCCESS) return;
    uint32_t h = hslot(H(dt), DT_SLOTS - 1);
    while (dt_table[h].used) {
        if (dt_table[h].key == H(dt)) return; /* an alias (MPI_LONG_LONG) */
        h = (h + 1) & (DT_SLOTS - 1);
    }
    dt_table[h] = (dt_slot){H(dt), (uint32_t)size, code, 1};
}

static void op_add(MPI_Op op, uint8_t code)
{
    if (op == MPI_OP_NULL) return;
    uint32_t h = hslot(H(op), OP_SLOTS - 1);
    while (op_table[h].used) {
        if (op_table[h].key == H(op)) return;
        h = (h + 1) & (OP_SLOTS - 1);
    }
    op_table[h] = (op_slot){H(op), code, 1};
}

static void build_tables(void)
{
    memset(dt_table, 0, sizeof dt_table);
    memset(op_table, 0, sizeof op_table);
#define D(name) dt_add(name, HVPROF_DT_##name)
    D(MPI_BYTE); D(MPI_CHAR); D(MPI_SIGNED_CHAR); D(MPI_UNSIGNED_CHAR); D(MPI_SHORT);
    D(MPI_UNSIGNED_SHORT); D(MPI_INT); D(MPI_UNSIGNED); D(MPI_LONG); D(MPI_UNSIGNED_LONG);
    D(MPI_LONG_LONG_INT); D(MPI_UNSIGNED_LONG_LONG); D(MPI_FLOAT); D(MPI_DOUBLE);
    D(MPI_LONG_DOUBLE); D(MPI_C_BOOL); D(MPI_INT8_T); D(MPI_INT16_T); D(MPI_INT32_T);
    D(MPI_INT64_T); D(MPI_UINT8_T); D(MPI_UINT16_T); D(MPI_UINT32_T); D(MPI_UINT64_T);
    D(MPI_C_FLOAT_COMPLEX); D(MPI_C_DOUBLE_COMPLEX); D(MPI_FLOAT_INT); D(MPI_DOUBLE_INT);
    D(MPI_LONG_INT); D(MPI_2INT); D(MPI_WCHAR); D(MPI_PACKED);
#undef D
#define O(name, code) op_add(name, HVPROF_REDOP_##code)
    O(MPI_SUM, SUM); O(MPI_PROD, PROD); O(MPI_MIN, MIN); O(MPI_MAX, MAX); O(MPI_LAND, LAND);
    O(MPI_BAND, BAND); O(MPI_LOR, LOR); O(MPI_BOR, BOR); O(MPI_LXOR, LXOR); O(MPI_BXOR, BXOR);
    O(MPI_MINLOC, MINLOC); O(MPI_MAXLOC, MAXLOC); O(MPI_REPLACE, REPLACE); O(MPI_NO_OP, NO_OP);
#undef O
}

typedef struct { uint32_t size; uint8_t code; uint8_t derived; } dtinfo;

/* A datatype's size and code: predefined types from the table; a derived
 * type (Horovod's float16 is one) is DERIVED, its size from MPI.  Called
 * when a thread's hvprof_desc misses (describe_slow). */
static dtinfo dt_lookup(MPI_Datatype dt)
{
    if (dt == MPI_DATATYPE_NULL) return (dtinfo){0, HVPROF_DT_UNKNOWN, 0};
    uint64_t k = H(dt);
    uint32_t h = hslot(k, DT_SLOTS - 1);
    while (dt_table[h].used) {
        if (dt_table[h].key == k) return (dtinfo){dt_table[h].size, dt_table[h].code, 0};
        h = (h + 1) & (DT_SLOTS - 1);
    }
    int size = 0;
    if (PMPI_Type_size(dt, &size) != MPI_SUCCESS || size < 0) size = 0;
    return (dtinfo){(uint32_t)size, HVPROF_DT_DERIVED, 1};
}

/* A reduction op's code: predefined from the table, else USER (a handle
 * freed and reused can only be another user-defined op). */
static uint8_t op_lookup(MPI_Op op)
{
    if (op == MPI_OP_NULL) return HVPROF_REDOP_NONE;
    uint64_t k = H(op);
    uint32_t h = hslot(k, OP_SLOTS - 1);
    while (op_table[h].used) {
        if (op_table[h].key == k) return op_table[h].code;
        h = (h + 1) & (OP_SLOTS - 1);
    }
    return HVPROF_REDOP_USER;
}

/* ------------------------------------------------------------------------ */
/* Communicators: stable ids.                                                 */

#define ID_WORLD 0x574f524c44ull /* "WORLD" */
#define ID_SELF 0x53454c46ull    /* "SELF" */
#define ID_ANON 0x414e4f4eull    /* "ANON" */
#define ID_INTER 0x494e544552ull /* "INTER" */

/* World rank of rank r of a group (-1 if it has none: MPI_UNDEFINED too). */
static int world_rank_in(MPI_Group g, int r)
{
    MPI_Group wg;
    int out = -1;
    if (PMPI_Comm_group(MPI_COMM_WORLD, &wg) != MPI_SUCCESS) return -1;
    PMPI_Group_translate_ranks(g, 1, &r, wg, &out);
    PMPI_Group_free(&wg);
    return out;
}

/* A communicator's groups: the local one (MPI_Comm_group: for an
 * intercommunicator, the group this rank belongs to) and, for an
 * intercommunicator, the remote one (MPI_Comm_remote_group); MPI_GROUP_NULL
 * otherwise.  0, or -1 when MPI refuses. */
static int comm_groups(MPI_Comm comm, MPI_Group *local, MPI_Group *remote)
{
    int inter = 0;
    *local = *remote = MPI_GROUP_NULL;
    if (PMPI_Comm_group(comm, local) != MPI_SUCCESS) return -1;
    if (PMPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && inter &&
        PMPI_Comm_remote_group(comm, remote) != MPI_SUCCESS) {
        PMPI_Group_free(local);
        return -1;
    }
    return 0;
}

static void groups_free(MPI_Group *local, MPI_Group *remote)
{
    if (*local != MPI_GROUP_NULL) PMPI_Group_free(local);
    if (*remote != MPI_GROUP_NULL) PMPI_Group_free(remote);
}

/* Hash of a group's size and members' world ranks (the first 4096). */
static uint64_t group_hash(MPI_Group g, uint64_t h)
{
    int size = 0;
    PMPI_Group_size(g, &size);
    h = hvprof_mix(h, (uint64_t)size);
    for (int i = 0; i < size && i < 4096; i++) h = hvprof_mix(h, (uint64_t)world_rank_in(g, i));
    return h;
}

/* Per comm-table index: how many communicators were created from it so far
 * (the same on every member, since creation is collective over the parent),
 * its id, and for an intercommunicator the size of the remote group (0: an
 * intracommunicator). */
static uint32_t children[HVPROF_COMM_TABLE_CAPACITY];
static uint64_t comm_ids[HVPROF_COMM_TABLE_CAPACITY];
static int remote_sizes[HVPROF_COMM_TABLE_CAPACITY];

/* The communicator's table entry: size and rank are MPI_Comm_size and
 * MPI_Comm_rank (for an intercommunicator: in the local group), world_rank0
 * the world rank of (local) rank 0.  id == 0: first seen in a collective,
 * not created under the profiler: a hash of its members, so that every
 * member computes the same id -- for an intercommunicator, of both groups,
 * the one holding the lower world rank first, so that the two sides agree. */
static uint32_t comm_register_mpi(MPI_Comm comm, uint64_t id)
{
    int size = 0, rank = 0, r0 = -1, rsize = 0;
    PMPI_Comm_size(comm, &size);
    PMPI_Comm_rank(comm, &rank);
    char name[MPI_MAX_OBJECT_NAME] = "";
    int len = 0;
    PMPI_Comm_get_name(comm, name, &len);
    MPI_Group local, remote;
    if (comm_groups(comm, &local, &remote) == 0) {
        r0 = world_rank_in(local, 0);
        if (remote != MPI_GROUP_NULL) PMPI_Group_size(remote, &rsize);
        if (id == 0 && remote == MPI_GROUP_NULL) {
            id = group_hash(local, ID_ANON); /* == mix(ANON, size), then each member */
        } else if (id == 0) {
            unsigned l0 = (unsigned)r0, q0 = (unsigned)world_rank_in(remote, 0);
            MPI_Group first = l0 <= q0 ? local : remote; /* -1 (none) last */
            MPI_Group second = first == local ? remote : local;
            id = group_hash(second, group_hash(first, ID_INTER));
        }
        groups_free(&local, &remote);
    }
    uint32_t idx = hvprof_comm_register(H(comm), id, size, rank, r0, 0, name);
    if (idx < HVPROF_COMM_TABLE_CAPACITY) {
        comm_ids[idx] = id;
        remote_sizes[idx] = rsize;
    }
    return idx;
}

/* The world rank that tells communicators created by one call apart (split
 * colours): of the new communicator's rank 0; for an intercommunicator the
 * lower of its two groups' rank 0 (the same on both sides). */
static int comm_discriminator(MPI_Comm comm)
{
    MPI_Group local, remote;
    if (comm_groups(comm, &local, &remote) != 0) return -1;
    int r = world_rank_in(local, 0);
    if (remote != MPI_GROUP_NULL) {
        int q = world_rank_in(remote, 0);
        if ((unsigned)q < (unsigned)r) r = q;
    }
    groups_free(&local, &remote);
    return r;
}

static uint32_t comm_index_slow(MPI_Comm comm);

/* The communicator's table index: this thread's hvprof_desc when it holds
 * this communicator, else the table (registering it when new). */
static inline uint32_t comm_index(MPI_Comm comm)
{
    const hvprof_desc *d = &hvprof_t.desc;
    uint32_t epoch = atomic_load_explicit(&hvprof_handle_epoch, memory_order_relaxed);
    if (HVPROF_LIKELY(d->comm == H(comm) && d->epoch == epoch)) return d->ci;
    return comm_index_slow(comm);
}

static uint32_t comm_index_slow(MPI_Comm comm)
{
    uint32_t idx = hvprof_comm_lookup(H(comm));
    if (HVPROF_LIKELY(idx != UINT32_MAX)) return idx;
    uint64_t id = 0;
    if (comm == MPI_COMM_WORLD) id = ID_WORLD;
    else if (comm == MPI_COMM_SELF) {
        int wr = 0;
        PMPI_Comm_rank(MPI_COMM_WORLD, &wr);
        id = hvprof_mix(ID_SELF, (uint64_t)wr);
    }
    return comm_register_mpi(comm, id);
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
    if (idx < HVPROF_COMM_TABLE_CAPACITY && remote_sizes[idx] > 0) return remote_sizes[idx];
    return comm_size_of(idx);
}

/* A communicator was created from `parent`: give it an id derived from the
 * parent's id, the creation number on the parent, and a discriminator (the
 * world rank of the new communicator's rank 0 separates split colours). */
static void comm_created(MPI_Comm parent, MPI_Comm *newcomm, uint64_t kind)
{
    if (!atomic_load_explicit(&hvprof_active, memory_order_relaxed)) return;
    uint32_t p = comm_index(parent);
    uint64_t pid = p < HVPROF_COMM_TABLE_CAPACITY ? comm_ids[p] : 0;
    uint32_t n = p < HVPROF_COMM_TABLE_CAPACITY ? children[p]++ : 0;
    if (!newcomm || *newcomm == MPI_COMM_NULL) return;
    int r0 = comm_discriminator(*newcomm);
    uint64_t id = hvprof_mix(hvprof_mix(hvprof_mix(pid, n), kind), (uint64_t)(int64_t)r0);
    hvprof_comm_forget(H(*newcomm)); /* the handle of a freed communicator */
    comm_register_mpi(*newcomm, id);
}

/* ------------------------------------------------------------------------ */
/* Writing a record.                                                          */

static inline int16_t sat16(int rc) { return (int16_t)(rc > 32767 ? 32767 : rc < -32768 ? -32768 : rc); }

#define MULT_SIZE 1
#define MULT_PEERS 2
#define ACTIVE() atomic_load_explicit(&hvprof_active, memory_order_relaxed)

static void describe_slow(hvprof_desc *d, MPI_Comm comm, MPI_Datatype dt, MPI_Op op,
                          uint32_t epoch)
{
    dtinfo i = dt_lookup(dt);
    d->ci = comm_index_slow(comm);
    d->dt_size = i.size;
    d->dt_code = i.code;
    d->dt_flags = i.derived ? HVPROF_FLAG_DERIVED_TYPE : 0;
    d->redop = op_lookup(op);
    d->comm = H(comm);
    d->dt = H(dt);
    d->op = H(op);
    /* read before the lookups: a change since invalidates; a communicator
     * without a table entry is never cached (the fast path indexes by ci) */
    d->epoch = d->ci < HVPROF_COMM_TABLE_CAPACITY ? epoch : 0;
}

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
        describe_slow(d, comm, dt, op, epoch);
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
    uint32_t ci = d->ci; /* < HVPROF_COMM_TABLE_CAPACITY: describe_slow caches no other */
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
static void from_status(hvprof_record *r, const MPI_Status *st);
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
        if (st) from_status(r, st); /* a receive: bytes, source and tag from its status */
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

MPI_WRAPPER(Allreduce, MPI_ALLREDUCE,
            (const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
             MPI_Comm comm),
            (sendbuf, recvbuf, count, datatype, op, comm), ,
            (comm, datatype, UCOUNT(count), 0, op, -1, INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Reduce, MPI_REDUCE,
            (const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
             int root, MPI_Comm comm),
            (sendbuf, recvbuf, count, datatype, op, root, comm), ,
            (comm, datatype, UCOUNT(count), 0, op, root, INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Bcast, MPI_BCAST,
            (void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm),
            (buffer, count, datatype, root, comm), ,
            (comm, datatype, UCOUNT(count), 0, MPI_OP_NULL, root, 0, buffer))

MPI_WRAPPER(Allgather, MPI_ALLGATHER,
            (const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
             int recvcount, MPI_Datatype recvtype, MPI_Comm comm),
            (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm),
            int ip = sendbuf == MPI_IN_PLACE;,
            (comm, ip ? recvtype : sendtype, UCOUNT(ip ? recvcount : sendcount), MULT_PEERS,
             MPI_OP_NULL, -1, INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Allgatherv, MPI_ALLGATHERV,
            (const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
             const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm),
            (sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm), ,
            (comm, recvtype, sum_counts(recvcounts, comm, 1), 0, MPI_OP_NULL, -1,
             INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Gather, MPI_GATHER,
            (const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
             int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm),
            (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm),
            int ip = sendbuf == MPI_IN_PLACE;,
            (comm, ip ? recvtype : sendtype, UCOUNT(ip ? recvcount : sendcount), MULT_PEERS,
             MPI_OP_NULL, root, INPLACE(sendbuf), recvbuf))

/* The root counts what it receives; an intercommunicator's root says
 * MPI_ROOT, the rest of its group MPI_PROC_NULL (they send nothing); the
 * other ranks count what they send. */
MPI_WRAPPER(Gatherv, MPI_GATHERV,
            (const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
             const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
             MPI_Comm comm),
            (sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm),
            int me = -1;
            PMPI_Comm_rank(comm, &me);
            int at_root = me == root || root == MPI_ROOT;
            int none = !at_root && root == MPI_PROC_NULL;,
            (comm, at_root ? recvtype : none ? MPI_DATATYPE_NULL : sendtype,
             at_root ? sum_counts(recvcounts, comm, 1) : none ? 0 : UCOUNT(sendcount), 0,
             MPI_OP_NULL, root, at_root ? INPLACE(sendbuf) : 0, recvbuf))

MPI_WRAPPER(Alltoall, MPI_ALLTOALL,
            (const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
             int recvcount, MPI_Datatype recvtype, MPI_Comm comm),
            (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm),
            int ip = sendbuf == MPI_IN_PLACE;,
            (comm, ip ? recvtype : sendtype, UCOUNT(ip ? recvcount : sendcount), MULT_PEERS,
             MPI_OP_NULL, -1, INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Alltoallv, MPI_ALLTOALLV,
            (const void *sendbuf, const int sendcounts[], const int sdispls[],
             MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int rdispls[],
             MPI_Datatype recvtype, MPI_Comm comm),
            (sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm),
            int ip = sendbuf == MPI_IN_PLACE;,
            (comm, ip ? recvtype : sendtype, sum_counts(ip ? recvcounts : sendcounts, comm, 1), 0,
             MPI_OP_NULL, -1, INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Reduce_scatter, MPI_REDUCE_SCATTER,
            (const void *sendbuf, void *recvbuf, const int recvcounts[], MPI_Datatype datatype,
             MPI_Op op, MPI_Comm comm),
            (sendbuf, recvbuf, recvcounts, datatype, op, comm), ,
            (comm, datatype, sum_counts(recvcounts, comm, 0), 0, op, -1, INPLACE(sendbuf),
             recvbuf))

MPI_WRAPPER(Reduce_scatter_block, MPI_REDUCE_SCATTER_BLOCK,
            (const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
             MPI_Comm comm),
            (sendbuf, recvbuf, recvcount, datatype, op, comm), ,
            (comm, datatype, UCOUNT(recvcount), MULT_SIZE, op, -1, INPLACE(sendbuf), recvbuf))

MPI_WRAPPER(Barrier, MPI_BARRIER, (MPI_Comm comm), (comm), ,
            (comm, MPI_DATATYPE_NULL, 0, 0, MPI_OP_NULL, -1, 0, NULL))

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
static void from_status(hvprof_record *r, const MPI_Status *st)
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
    if (st && rc == MPI_SUCCESS) from_status(&r, st);
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
            from_status(&r, st);
        record_or_divert(&r);
        return;
    }
}

HVPROF_EXPORT int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count,
                                 MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                 MPI_Request *request)
{
    if (!ACTIVE()) return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
    hvprof_inflight_entry *e = general_inflight(&hvprof_t);
    uint64_t t0 = hvprof_ticks();
    if (e) hvprof_inflight_begin(e, HVPROF_OP_MPI_IALLREDUCE, H(comm), t0);
    int rc = PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
    if (e) hvprof_inflight_end(e);
    const hvprof_desc *d = describe(comm, datatype, op);
    hvprof_record r = {
        .t_start = t0, .bytes = UCOUNT(count) * d->dt_size, .count = UCOUNT(count),
        .seq = hvprof_comm_next_seq(d->ci), .comm = d->ci, .track = HVPROF_TRACK_SELF, .root = -1,
        .op = HVPROF_OP_MPI_IALLREDUCE, .dtype = d->dt_code, .redop = d->redop,
        .flags = (uint16_t)(INPLACE(sendbuf) | HVPROF_FLAG_NONBLOCKING | d->dt_flags |
                            (rc != MPI_SUCCESS ? HVPROF_FLAG_ERROR : 0)),
        .rc = sat16(rc), .dtype_size = d->dt_size, .aux = 0};
    pending_add(rc == MPI_SUCCESS ? *request : MPI_REQUEST_NULL, &r);
    return rc;
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

/* ------------------------------------------------------------------------ */
/* Communicator creation and destruction.                                     */

#define KIND_DUP 1
#define KIND_SPLIT 2
#define KIND_SPLIT_TYPE 3
#define KIND_CREATE 4

HVPROF_EXPORT int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm)
{
    int rc = PMPI_Comm_dup(comm, newcomm);
    if (rc == MPI_SUCCESS) comm_created(comm, newcomm, KIND_DUP);
    return rc;
}

HVPROF_EXPORT int MPI_Comm_dup_with_info(MPI_Comm comm, MPI_Info info, MPI_Comm *newcomm)
{
    int rc = PMPI_Comm_dup_with_info(comm, info, newcomm);
    if (rc == MPI_SUCCESS) comm_created(comm, newcomm, KIND_DUP);
    return rc;
}

HVPROF_EXPORT int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm)
{
    int rc = PMPI_Comm_split(comm, color, key, newcomm);
    if (rc == MPI_SUCCESS) comm_created(comm, newcomm, KIND_SPLIT);
    return rc;
}

HVPROF_EXPORT int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm)
{
    int rc = PMPI_Comm_split_type(comm, split_type, key, info, newcomm);
    if (rc == MPI_SUCCESS) comm_created(comm, newcomm, KIND_SPLIT_TYPE);
    return rc;
}

HVPROF_EXPORT int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm *newcomm)
{
    int rc = PMPI_Comm_create(comm, group, newcomm);
    if (rc == MPI_SUCCESS) comm_created(comm, newcomm, KIND_CREATE);
    return rc;
}

HVPROF_EXPORT int MPI_Comm_free(MPI_Comm *comm)
{
    uint64_t key = comm ? H(*comm) : 0;
    int rc = PMPI_Comm_free(comm);
    if (rc == MPI_SUCCESS && key) hvprof_comm_forget(key);
    return rc;
}

/* A freed datatype's handle may come back as a new derived type of another
 * size: every thread's cached description (hvprof_desc) is dropped.  (Frees
 * that do not pass through the MPI_ symbol, such as Open MPI's Fortran
 * bindings calling PMPI_Type_free, are not seen.) */
HVPROF_EXPORT int MPI_Type_free(MPI_Datatype *datatype)
{
    int rc = PMPI_Type_free(datatype);
    atomic_fetch_add(&hvprof_handle_epoch, 1);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Set-up and tear-down.                                                      */

static MPI_Comm prof_comm = MPI_COMM_NULL; /* private: never the application's */

static int profiling_wanted(void)
{
    /* Loaded by the start-up hook: HOROVOD_PROFILE is set.  Loaded with
     * LD_PRELOAD: on unless HOROVOD_PROFILE says off. */
    const char *v = hvprof_setting("HOROVOD_PROFILE");
    if (!v) return 1;
    return !(v[0] == 0 || strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "false") == 0);
}

/* Offset of this rank's CLOCK_MONOTONIC to rank 0's.  Ranks on one host
 * share CLOCK_MONOTONIC, so only one rank per host (the node leader, lowest
 * rank there) measures: rank 0 ping-pongs each leader in turn (Cristian's
 * method with the minimum-delay filter: offset = b - (a + c) / 2 for the
 * round trip with the smallest c - a, whose error is at most (c - a) / 2
 * plus the clock's read granularity), and each leader passes its result to
 * the ranks of its host.  With several hosts it runs again at MPI_Finalize:
 * the reader interpolates between the two measurements when they differ by
 * more than their error bounds (profiler.formats.clock.clock_drift_ppm).
 *
 * On a busy machine most round trips are stretched by a descheduled peer;
 * the fastest of many, spread over time, is not.  So rank 0 sends bursts of
 * SYNC_BURST pings with a pause between bursts, up to SYNC_MAX_BURSTS bursts
 * or a time budget per leader (SYNC_BUDGET_NS; with many hosts
 * SYNC_TOTAL_NS shared, at least SYNC_MIN_BUDGET_NS each), stopping early
 * once the best round trip is below SYNC_GOOD_RTT_NS (a quiet machine: a
 * few bursts) or, after more bursts, below SYNC_OK_RTT_NS.  A burst ends
 * early at a slow round trip (a peer lost its CPU), so the budget buys many
 * independent tries rather than many slow round trips.  Both sides of a
 * burst have just woken from a sleep (rank 0's pause, the leader's idle
 * wait), which the scheduler favours over CPU-bound neighbours: the burst's
 * later round trips then run with both on a CPU.  Ranks that are not
 * measuring wait without spinning (sync_wait_idle), leaving the CPUs to the
 * two that are.  Cost at rank 0: about a millisecond per host on a quiet
 * machine (SYNC_MIN_BURSTS bursts), at most max(SYNC_TOTAL_NS, hosts x
 * SYNC_MIN_BUDGET_NS) on a busy one, at MPI_Init and again at MPI_Finalize. */
typedef struct { int64_t offset, err, at; } clock_sync; /* at: this rank's clock */

enum {
    SYNC_TAG = 7717,      /* ping (rank 0 -> leader) and pong */
    SYNC_TAG_DONE = 7718, /* rank 0 -> leader: {offset, err, at} */
    SYNC_TAG_END = 7719,  /* rank 0 -> leader: the burst is over */
    SYNC_BURST = 16,
    SYNC_MIN_BURSTS = 4,  /* then stop at a round trip <= SYNC_GOOD_RTT_NS */
    SYNC_OK_BURSTS = 32,  /* then stop at a round trip <= SYNC_OK_RTT_NS */
    SYNC_MAX_BURSTS = 1024,
};
#define SYNC_GOOD_RTT_NS 30000LL      /* bound <= 15 us */
#define SYNC_OK_RTT_NS 60000LL        /* bound <= 30 us */
#define SYNC_BUDGET_NS 1000000000LL   /* per leader (a busy machine) ... */
#define SYNC_TOTAL_NS 4000000000LL    /* ... and for all leaders together, */
#define SYNC_MIN_BUDGET_NS 20000000LL /* but at least this per leader */
#define SYNC_SLOW_RTT_NS 50000LL      /* a round trip this slow may end a burst */
#define SYNC_PAUSE_NS 300000L         /* between bursts: 1 to 2 x this */

/* Complete a request without spinning for long: a rank waiting its turn (or
 * for its leader's result) sleeps between tests. */
static void sync_wait_idle(MPI_Request *req, MPI_Status *st)
{
    struct timespec nap = {0, 200000};
    for (int spins = 0;; spins++) {
        int done = 0;
        PMPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        if (done) return;
        if (spins >= 32) nanosleep(&nap, NULL);
    }
}

/* The clock's read granularity (ns, at least 1). */
static int64_t sync_clock_res_ns(void)
{
    struct timespec r;
    if (clock_getres(CLOCK_MONOTONIC, &r) != 0) return 1;
    int64_t ns = (int64_t)r.tv_sec * 1000000000LL + r.tv_nsec;
    return ns > 0 ? ns : 1;
}

/* Rank 0's side for one leader: returns {offset, err, at (leader's clock)}. */
static void sync_measure_leader(MPI_Comm leaders, int r, int64_t res_ns, int64_t budget_ns,
                                int64_t out[3])
{
    int64_t best_rtt = INT64_MAX, best_off = 0, best_b = 0;
    int64_t t_start = hvprof_mono_ns();
    uint64_t seed = (uint64_t)t_start ^ ((uint64_t)r << 32);
    for (int burst = 0; burst < SYNC_MAX_BURSTS; burst++) {
        if (burst) {
            /* a pause of random length: other processes run, and the next
             * burst does not fall in step with a periodic load */
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            struct timespec pause = {0, SYNC_PAUSE_NS + (long)((seed >> 33) % SYNC_PAUSE_NS)};
            nanosleep(&pause, NULL);
        }
        for (int k = 0; k < SYNC_BURST; k++) {
            int64_t a = hvprof_mono_ns(), b = 0;
            PMPI_Send(&a, 1, MPI_INT64_T, r, SYNC_TAG, leaders);
            PMPI_Recv(&b, 1, MPI_INT64_T, r, SYNC_TAG, leaders, MPI_STATUS_IGNORE);
            int64_t c = hvprof_mono_ns();
            if (c - a < best_rtt) {
                best_rtt = c - a;
                best_off = b - (a + (c - a) / 2);
                best_b = b;
            }
            /* A slow round trip after the first (which wakes the leader):
             * a peer lost its CPU.  End the burst and try again later,
             * rather than spend the budget on more slow ones. */
            if (k > 0 && c - a > 2 * best_rtt && c - a > SYNC_SLOW_RTT_NS) break;
        }
        int64_t end = 0;
        PMPI_Send(&end, 1, MPI_INT64_T, r, SYNC_TAG_END, leaders);
        if (burst + 1 >= SYNC_MIN_BURSTS && best_rtt <= SYNC_GOOD_RTT_NS) break;
        if (burst + 1 >= SYNC_OK_BURSTS && best_rtt <= SYNC_OK_RTT_NS) break;
        if (hvprof_mono_ns() - t_start > budget_ns) break;
    }
    out[0] = best_off;
    out[1] = (best_rtt + 1) / 2 + res_ns;
    out[2] = best_b;
}

static void ping_pong_leaders(MPI_Comm leaders, clock_sync *out)
{
    int me = 0, n = 1;
    PMPI_Comm_rank(leaders, &me);
    PMPI_Comm_size(leaders, &n);
    int64_t res_ns = sync_clock_res_ns();
    if (me == 0) {
        int64_t budget = SYNC_TOTAL_NS / (n > 1 ? n - 1 : 1);
        if (budget > SYNC_BUDGET_NS) budget = SYNC_BUDGET_NS;
        if (budget < SYNC_MIN_BUDGET_NS) budget = SYNC_MIN_BUDGET_NS;
        for (int r = 1; r < n; r++) {
            int64_t res[3];
            sync_measure_leader(leaders, r, res_ns, budget, res);
            PMPI_Send(res, 3, MPI_INT64_T, r, SYNC_TAG_DONE, leaders);
        }
        *out = (clock_sync){0, 0, hvprof_mono_ns()};
        return;
    }
    /* A leader answers pings until rank 0 sends the result.  Between bursts
     * (and while waiting its turn) it sleeps, so the first ping of a burst
     * wakes it; inside a burst it waits spinning, for the fastest answer. */
    int idle = 1;
    for (;;) {
        int64_t m[3] = {0, 0, 0};
        MPI_Status st;
        if (idle) {
            MPI_Request req;
            PMPI_Irecv(m, 3, MPI_INT64_T, 0, MPI_ANY_TAG, leaders, &req);
            sync_wait_idle(&req, &st);
        } else {
            PMPI_Recv(m, 3, MPI_INT64_T, 0, MPI_ANY_TAG, leaders, &st);
        }
        if (st.MPI_TAG == SYNC_TAG_DONE) {
            /* granularity of this side's clock too */
            *out = (clock_sync){m[0], m[1] + res_ns, m[2]};
            return;
        }
        if (st.MPI_TAG == SYNC_TAG_END) {
            idle = 1;
            continue;
        }
        idle = 0;
        int64_t b = hvprof_mono_ns();
        PMPI_Send(&b, 1, MPI_INT64_T, 0, SYNC_TAG, leaders);
    }
}

/* HOROVOD_PROFILE_CLOCK_SYNC=rank: every rank measures its own offset, as if
 * each were on its own host (diagnostics; it runs the several-host path on
 * one machine).  Read once at MPI_Init: the same value on every rank. */
static int sync_per_rank(void)
{
    const char *v = hvprof_setting("HOROVOD_PROFILE_CLOCK_SYNC");
    return v && strcmp(v, "rank") == 0;
}

/* Returns the number of clock domains (leaders) that took part. */
static int estimate_offsets(int rank, int per_rank, clock_sync *out)
{
    int64_t res[3] = {0, 0, hvprof_mono_ns()};
    int hosts = 1, lrank = 0;
    MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    if (per_rank || PMPI_Comm_split_type(prof_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                         &local) != MPI_SUCCESS)
        local = MPI_COMM_NULL;
    if (local != MPI_COMM_NULL) PMPI_Comm_rank(local, &lrank);
    else lrank = 0; /* no host grouping: every rank measures */
    PMPI_Comm_split(prof_comm, lrank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
    if (leaders != MPI_COMM_NULL) {
        clock_sync mine;
        PMPI_Comm_size(leaders, &hosts);
        ping_pong_leaders(leaders, &mine);
        res[0] = mine.offset;
        res[1] = mine.err;
        res[2] = mine.at;
        PMPI_Comm_free(&leaders);
    }
    if (local != MPI_COMM_NULL) {
        MPI_Request req; /* one host, one clock: `at` holds */
        PMPI_Ibcast(res, 3, MPI_INT64_T, 0, local, &req);
        sync_wait_idle(&req, NULL);
        PMPI_Comm_free(&local);
    }
    MPI_Request req;
    PMPI_Ibcast(&hosts, 1, MPI_INT, 0, prof_comm, &req);
    sync_wait_idle(&req, NULL);
    *out = (clock_sync){res[0], res[1], res[2]};
    return hosts;
}

static int resync_at_finalize; /* several clock domains: measure again (every rank) */
static int sync_mode;          /* 0: host leaders, 1: every rank */

/* One line for the job when ranks could not open their raw files: rank 0
 * prints the first failing rank's reason and how many ranks record nothing. */
static void report_open_failures(int rank, int size, int ok)
{
    int mine = ok ? INT_MAX : rank, first = INT_MAX, bad = ok ? 0 : 1, nbad = 0;
    PMPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, prof_comm);
    if (first == INT_MAX) return; /* every rank has its file */
    PMPI_Reduce(&bad, &nbad, 1, MPI_INT, MPI_SUM, 0, prof_comm);
    char why[768];
    snprintf(why, sizeof why, "%s", ok ? "" : hvprof_open_error());
    enum { TAG = 0x4856 };
    if (first != 0 && rank == first) PMPI_Send(why, (int)sizeof why, MPI_CHAR, 0, TAG, prof_comm);
    if (first != 0 && rank == 0)
        PMPI_Recv(why, (int)sizeof why, MPI_CHAR, first, TAG, prof_comm, MPI_STATUS_IGNORE);
    if (rank != 0) return;
    why[sizeof why - 1] = 0;
    if (nbad == size && size > 1)
        hvprof_warn("%s: profiling is off for every rank (%d)", why, size);
    else if (nbad == 1)
        hvprof_warn("%s: profiling is off for rank %d", why, first);
    else
        hvprof_warn("%s: profiling is off for %d of %d ranks (the first: rank %d)", why, nbad,
                    size, first);
}

/* The profiler states its own cost: call_cost_ns in the raw file's header,
 * measured here at MPI_Init, off the hot path.  Method: blocks of CAL_ITERS
 * calls of cal_wrapped -- exactly the wrapper's fast path (the same inline
 * functions in the same order: active check, cached description, slot,
 * fill, two clock reads, flight recorder, publish; summary mode: the
 * aggregate update) around an empty non-inlined stand-in for the MPI call --
 * alternate with blocks calling the stand-in directly, as an unprofiled
 * program calls MPI; the median of CAL_PAIRS block differences, per call.
 * Everything it writes is scratch that nobody reads: a private thread state
 * whose chunk is a static array (never published, never flushed), a private
 * flight-recorder entry, a private aggregate; the communicator's call
 * counter it advances is put back.  Left out: the helper thread's copy of
 * each record to the file (its CPU time is helper_cpu_ns) and the cache
 * misses of a real chunk (the scratch slots stay warm).  About 0.3 ms. */
#define CAL_ITERS 512
#define CAL_PAIRS 15
static hvprof_record cal_slots[CAL_ITERS];
static float cal_buf[1];

__attribute__((noinline)) static int cal_stand_in(int i)
{
    int r; /* opaque to the compiler, like the MPI call it stands for */
    __asm__ volatile("" : "=r"(r) : "0"(i == -1) : "memory");
    return r;
}

__attribute__((noinline)) static int cal_wrapped(hvprof_tls *t, int i, int summary)
{
    if (!ACTIVE()) return cal_stand_in(i);
    int div;
    if (!desc_hit(t, MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM) || !call_fast(t, &div))
        return cal_stand_in(i);
    if (!summary) {
        hvprof_record *r;
        if (!call_slot(t, &r)) return cal_stand_in(i);
        call_open(t, r, HVPROF_OP_MPI_ALLREDUCE, MPI_COMM_WORLD, MPI_FLOAT, 0, 0, MPI_SUM, -1, 0,
                  cal_buf);
        int rc = cal_stand_in(i);
        call_close(t, r, rc);
        return rc;
    }
    uint64_t t0;
    uint16_t fl;
    hvprof_agg_entry *a = agg_open(t, &t0, &fl, HVPROF_OP_MPI_ALLREDUCE, MPI_COMM_WORLD,
                                   MPI_FLOAT, 0, 0, MPI_SUM, -1, 0, cal_buf);
    if (!a) return cal_stand_in(i);
    int rc = cal_stand_in(i);
    agg_close(t, a, t0, fl, rc);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double calibrate_call_cost(const hvprof_file_header *h)
{
    if (!hvprof_fast_clock()) return 0; /* the general path would be timed: not calibrated */
    int summary = h->mode == HVPROF_MODE_SUMMARY;
    static hvprof_tls c; /* a stand-in thread, not hvprof_t: nothing of it is published */
    static hvprof_inflight_entry cal_inflight;
    static hvprof_agg_entry cal_agg;
    static _Atomic uint64_t cal_nrec;
    memset(&c, 0, sizeof c);
    uint32_t gen = atomic_load(&hvprof_generation);
    uint32_t epoch = atomic_load(&hvprof_handle_epoch);
    describe_slow(&c.desc, MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM, epoch);
    uint32_t ci = c.desc.ci;
    if (ci >= HVPROF_COMM_TABLE_CAPACITY || c.desc.epoch != atomic_load(&hvprof_handle_epoch))
        return 0;
    c.slots = cal_slots;
    c.nrec = &cal_nrec;
    c.capacity = CAL_ITERS;
    c.track = 0;
    c.generation = gen;
    c.inflight = &cal_inflight;
    memset(&cal_agg, 0, sizeof cal_agg);
    cal_agg.op = HVPROF_OP_MPI_ALLREDUCE;
    cal_agg.comm = ci;
    cal_agg.dtype = c.desc.dt_code;
    cal_agg.redop = c.desc.redop;
    cal_agg.calls = 1;
    c.agg = &cal_agg;
    c.agg_last = &cal_agg;
    c.agg_generation = gen;
    uint32_t seq = atomic_load_explicit(&hvprof_comm_seq[ci], memory_order_relaxed);
    double diff[CAL_PAIRS];
    int sink = 0;
    for (int p = -1; p < CAL_PAIRS; p++) { /* p = -1: warm-up */
        c.used = 0;
        int64_t a = hvprof_mono_ns();
        for (int i = 0; i < CAL_ITERS; i++) sink += cal_wrapped(&c, i, summary);
        int64_t b = hvprof_mono_ns();
        for (int i = 0; i < CAL_ITERS; i++) sink += cal_stand_in(i);
        int64_t e = hvprof_mono_ns();
        if (p >= 0) diff[p] = (double)((b - a) - (e - b)) / CAL_ITERS;
    }
    atomic_store_explicit(&hvprof_comm_seq[ci], seq, memory_order_relaxed);
    /* every call took the fast path, or this was not what the job runs */
    if (sink != 0 || c.used != (summary ? 0u : CAL_ITERS) ||
        cal_agg.calls != (summary ? 1u + (CAL_PAIRS + 1u) * CAL_ITERS : 1u))
        return 0;
    qsort(diff, CAL_PAIRS, sizeof diff[0], cmp_double);
    double med = diff[CAL_PAIRS / 2];
    return med > 0 ? med : 0;
}

static void mpi_started(uint64_t t0, int provided)
{
    if (!profiling_wanted()) return;
    int rank = 0, size = 1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    if (PMPI_Comm_dup(MPI_COMM_WORLD, &prof_comm) != MPI_SUCCESS) return;

    /* Rank 0 names the job's directory; every rank opens its file there. */
    struct { char dir[1024]; uint64_t job_id; } job;
    memset(&job, 0, sizeof job);
    if (rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        job.job_id = hvprof_mix(hvprof_mix((uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec), (uint64_t)getpid());
        const char *d = hvprof_setting("HOROVOD_PROFILE_DIR");
        if (d && *d) {
            snprintf(job.dir, sizeof job.dir, "%s", d);
        } else {
            struct tm tm;
            localtime_r(&ts.tv_sec, &tm);
            char stamp[32];
            strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
            snprintf(job.dir, sizeof job.dir, "horovod-profile-%s-%06llx", stamp,
                     (unsigned long long)(job.job_id & 0xffffff));
        }
    }
    PMPI_Bcast(&job, (int)sizeof job, MPI_BYTE, 0, prof_comm);

    hvprof_set_quiet(1); /* rank 0 reports failures for the job, once */
    int ok = hvprof_open(rank, size, -1, job.dir) == 0;
    report_open_failures(rank, size, ok);
    /* Every rank must take part in the offset exchange, even one whose file
     * could not be opened, or rank 0 would wait for it. */
    sync_mode = sync_per_rank();
    clock_sync cs;
    int hosts = estimate_offsets(rank, sync_mode, &cs);
    resync_at_finalize = hosts > 1;
    int64_t t0_job = hvprof_mono_ns();
    PMPI_Bcast(&t0_job, 1, MPI_INT64_T, 0, prof_comm);
    if (!ok) return;

    hvprof_file_header *h = hvprof_header();
    build_tables();
    h->job_id = job.job_id;
    h->offset_ns = cs.offset;
    h->offset_err_ns = cs.err;
    h->offset_at_ns = cs.at;
    /* 0: one host, one clock, offset 0 exactly; 1: per host; 2: per rank */
    h->offset_method = hosts > 1 ? (sync_mode ? 2 : 1) : 0;
    h->job_t0_ns = t0_job; /* rank 0's clock: the job's time zero */
    h->thread_level = provided;
    h->init_start_ticks = (int64_t)t0;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (PMPI_Get_library_version(ver, &len) == MPI_SUCCESS) {
        /* first line only, cut to the field */
        size_t k = 0;
        while (k + 1 < sizeof h->mpi_version && ver[k] && ver[k] != '\n') {
            h->mpi_version[k] = ver[k];
            k++;
        }
        h->mpi_version[k] = 0;
    }
    comm_index(MPI_COMM_WORLD); /* table entry 0: the world */
    h->call_cost_ns = calibrate_call_cost(h);

    /* Horovod's own timeline, into the profile directory, when asked for with
     * HOROVOD_PROFILE_TIMELINE=1 (rank 0 writes it; Horovod reads the variable
     * after MPI is initialized).  Off by default: it costs a quarter to a
     * third of the throughput, and the lineage comes from APP_TENSOR records. */
    const char *tl = hvprof_setting("HOROVOD_PROFILE_TIMELINE");
    if (!getenv("HOROVOD_TIMELINE") && tl && (strcmp(tl, "1") == 0 || strcmp(tl, "on") == 0)) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/timeline.json", job.dir);
        setenv("HOROVOD_TIMELINE", path, 0);
    }
    uint64_t t1 = hvprof_ticks();
    h->init_end_ticks = (int64_t)t1;
    __atomic_or_fetch(&h->state, HVPROF_STATE_MPI_INIT, __ATOMIC_RELEASE);
    emit(HVPROF_OP_MPI_INIT, t0, t1, MPI_COMM_WORLD, MPI_DATATYPE_NULL, 0, 0, MPI_OP_NULL, -1, 0,
         NULL, MPI_SUCCESS);
}

HVPROF_EXPORT int MPI_Init(int *argc, char ***argv)
{
    uint64_t t0 = hvprof_ticks();
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) mpi_started(t0, -1);
    return rc;
}

HVPROF_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    uint64_t t0 = hvprof_ticks();
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) mpi_started(t0, provided ? *provided : -1);
    return rc;
}

HVPROF_EXPORT int MPI_Finalize(void)
{
    /* Every rank has prof_comm (duplicated at MPI_Init), whether or not its
     * file opened or recording is paused now: each takes part in the
     * reductions below, or rank 0 would wait for ever. */
    if (prof_comm != MPI_COMM_NULL) {
        hvprof_file_header *h = hvprof_header();
        if (h && ACTIVE()) {
            uint64_t t0 = hvprof_ticks();
            /* Requests never completed: record them as such. */
            if (ANY_PENDING())
                for (uint32_t i = 0; i < PENDING_SLOTS; i++) {
                    uint64_t k = atomic_load(&pending[i].req);
                    if (k > 2) pending_done(k, t0, HVPROF_FLAG_NO_COMPLETION, NULL);
                }
            emit(HVPROF_OP_MPI_FINALIZE, t0, hvprof_ticks(), MPI_COMM_WORLD, MPI_DATATYPE_NULL,
                 0, 0, MPI_OP_NULL, -1, 0, NULL, MPI_SUCCESS);
            h->finalize_ticks = (int64_t)t0;
        }
        int me = 0, size = 1;
        PMPI_Comm_rank(prof_comm, &me);
        PMPI_Comm_size(prof_comm, &size);
        if (resync_at_finalize) { /* the same decision on every rank (hosts) */
            clock_sync cs;
            estimate_offsets(me, sync_mode, &cs);
            if (h) {
                h->offset_end_ns = cs.offset;
                h->offset_end_err_ns = cs.err;
                h->offset_end_at_ns = cs.at;
            }
        }
        /* Drain first (the last flush may drop), then rank 0 says once what
         * the job lost, if anything. */
        if (h) hvprof_close(HVPROF_STATE_FINALIZED);
        int err = hvprof_write_errno(), worst = 0;
        unsigned long long mine[2] = {h ? (unsigned long long)h->dropped_records : 0ull,
                                      err ? 1ull : 0ull};
        unsigned long long all[2] = {0, 0};
        PMPI_Reduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, prof_comm);
        PMPI_Reduce(&err, &worst, 1, MPI_INT, MPI_MAX, 0, prof_comm);
        if (me == 0) {
            if (all[0] && all[1])
                hvprof_warn("%llu records were dropped: %llu of %d rank(s) could not write "
                            "(%s); see %s", all[0], all[1], size, strerror(worst),
                            h ? hvprof_dir() : "the profile directory");
            else if (all[0])
                hvprof_warn("%llu records were dropped: no buffer space (the writer could "
                            "not keep up, or too many requests in flight); see %s", all[0],
                            h ? hvprof_dir() : "the profile directory");
            /* trace.json: Python's exit handler, else the library's own
             * exit merge (exitmerge.c), at process exit. */
        }
        PMPI_Comm_free(&prof_comm);
        prof_comm = MPI_COMM_NULL;
    }
    return PMPI_Finalize();
}

/* ------------------------------------------------------------------------ */
/* Registration with the core: MPI_Finalize closes the file itself, so this
 * backend has no lifecycle hook; the core skips libmpi's frames (a PMPI
 * layer in between) when naming a thread's caller. */

static const hvprof_backend mpi_backend = {.name = "mpi", .library = "libmpi"};

__attribute__((constructor)) static void mpi_ctor(void)
{
    hvprof_register_backend(&mpi_backend);
}
