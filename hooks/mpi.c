/*
 * mpi.c -- the MPI backend's tables and lifecycle: predefined datatypes and
 * ops, communicator ids, MPI_Init/Init_thread/Finalize, communicator
 * creation (for stable communicator ids) and the call-cost calibration.
 * The wrappers themselves: mpi_wrappers.c (collectives) and mpi_fortran.c
 * (the Fortran bindings), generated from the prototype list
 * hooks/mpi_protos.py by scripts/gen_mpi_wrappers.py; mpi_p2p.c
 * (point-to-point and requests);
 * the clock sync at MPI_Init: mpi_clock.c; what they share: mpi_internal.h.
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

#include "mpi_internal.h"
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

static void dt_alias(MPI_Datatype dt, MPI_Datatype c, uint8_t code)
{
    int a = -1, b = -2;
    if (dt == MPI_DATATYPE_NULL || PMPI_Type_size(dt, &a) != MPI_SUCCESS ||
        PMPI_Type_size(c, &b) != MPI_SUCCESS || a != b)
        return;
    dt_add(dt, code);
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
    /* Fortran's predefined types (a Fortran program's MPI_REAL ...) under the
     * code of the C type of the same kind, when of the same size (not with
     * gfortran's -fdefault-integer-8, say: then they read as DERIVED). */
#define F(name, c) dt_alias(name, c, HVPROF_DT_##c)
    F(MPI_INTEGER, MPI_INT); F(MPI_REAL, MPI_FLOAT); F(MPI_DOUBLE_PRECISION, MPI_DOUBLE);
    F(MPI_CHARACTER, MPI_CHAR); F(MPI_COMPLEX, MPI_C_FLOAT_COMPLEX);
    F(MPI_DOUBLE_COMPLEX, MPI_C_DOUBLE_COMPLEX); F(MPI_INTEGER1, MPI_INT8_T);
    F(MPI_INTEGER2, MPI_INT16_T); F(MPI_INTEGER4, MPI_INT32_T); F(MPI_INTEGER8, MPI_INT64_T);
    F(MPI_REAL4, MPI_FLOAT); F(MPI_REAL8, MPI_DOUBLE); F(MPI_2INTEGER, MPI_2INT);
#undef F
#define O(name, code) op_add(name, HVPROF_REDOP_##code)
    O(MPI_SUM, SUM); O(MPI_PROD, PROD); O(MPI_MIN, MIN); O(MPI_MAX, MAX); O(MPI_LAND, LAND);
    O(MPI_BAND, BAND); O(MPI_LOR, LOR); O(MPI_BOR, BOR); O(MPI_LXOR, LXOR); O(MPI_BXOR, BXOR);
    O(MPI_MINLOC, MINLOC); O(MPI_MAXLOC, MAXLOC); O(MPI_REPLACE, REPLACE); O(MPI_NO_OP, NO_OP);
#undef O
}

typedef struct { uint32_t size; uint8_t code; uint8_t derived; } dtinfo;

/* A datatype's size and code: predefined types from the table; a derived
 * type (Horovod's float16 is one) is DERIVED, its size from MPI.  Called
 * when a thread's hvprof_desc misses (mpi_describe_slow). */
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
int mpi_remote_sizes[HVPROF_COMM_TABLE_CAPACITY];

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
        mpi_remote_sizes[idx] = rsize;
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

uint32_t mpi_comm_index_slow(MPI_Comm comm)
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

/* What (comm, dt, op) mean, looked up afresh into this thread's cache (the
 * fast path's miss: describe, mpi_internal.h). */
void mpi_describe_slow(hvprof_desc *d, MPI_Comm comm, MPI_Datatype dt, MPI_Op op,
                       uint32_t epoch)
{
    dtinfo i = dt_lookup(dt);
    d->ci = mpi_comm_index_slow(comm);
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
 * size: every thread's cached description (hvprof_desc) is dropped.  (A
 * Fortran program's frees come here too: mpi_fortran.c; frees that pass
 * through no wrapped symbol are not seen.) */
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
    return hvprof_profile_mode() != HVPROF_PROFILE_OFF;
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
    mpi_describe_slow(&c.desc, MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM, epoch);
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
        const char *d = hvprof_setting_text(HVS_DIR);
        if (d) {
            snprintf(job.dir, sizeof job.dir, "%s", d);
        } else {
            hvprof_default_dir(job.dir, sizeof job.dir, job.job_id | 1u);
        }
    }
    PMPI_Bcast(&job, (int)sizeof job, MPI_BYTE, 0, prof_comm);

    hvprof_set_quiet(1); /* rank 0 reports failures for the job, once */
    int ok = hvprof_open(rank, size, -1, job.dir) == 0;
    report_open_failures(rank, size, ok);
    /* Every rank must take part in the offset exchange, even one whose file
     * could not be opened, or rank 0 would wait for it. */
    sync_mode = mpi_sync_per_rank();
    clock_sync cs;
    int hosts = mpi_estimate_offsets(prof_comm, rank, sync_mode, &cs);
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
    if (!getenv("HOROVOD_TIMELINE") && hvprof_setting_int(HVS_TIMELINE)) {
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
    /* A C rank's exit work starts here, as a Python rank's does before its
     * MPI_Finalize: a launcher that ends rank 0 from now on (mpirun aborting
     * the job for another rank's non-zero exit) gets the line that names
     * `profiler merge`, not a silent death (exitmerge.c). */
    hvprof_exit_prepare();
    /* Every rank has prof_comm (duplicated at MPI_Init), whether or not its
     * file opened or recording is paused now: each takes part in the
     * reductions below, or rank 0 would wait for ever. */
    if (prof_comm != MPI_COMM_NULL) {
        hvprof_file_header *h = hvprof_header();
        if (h && ACTIVE()) {
            uint64_t t0 = hvprof_ticks();
            mpi_pending_finalize(t0); /* requests never completed */
            emit(HVPROF_OP_MPI_FINALIZE, t0, hvprof_ticks(), MPI_COMM_WORLD, MPI_DATATYPE_NULL,
                 0, 0, MPI_OP_NULL, -1, 0, NULL, MPI_SUCCESS);
            h->finalize_ticks = (int64_t)t0;
        }
        int me = 0, size = 1;
        PMPI_Comm_rank(prof_comm, &me);
        PMPI_Comm_size(prof_comm, &size);
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", h ? hvprof_dir() : "");
        if (resync_at_finalize) { /* the same decision on every rank (hosts) */
            clock_sync cs;
            mpi_estimate_offsets(prof_comm, me, sync_mode, &cs);
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
        /* The files of ranks whose disk rank 0 does not see, to rank 0. */
        mpi_gather_files(prof_comm, me, size, h, dir);
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