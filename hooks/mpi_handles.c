/*
 * mpi_handles.c -- what an MPI call's handles mean: the predefined datatypes
 * and reduction ops (read-only tables built at MPI_Init), a derived
 * datatype's size, and the communicators: their table entries, their stable
 * ids, and their creation and destruction (the MPI_Comm_* and MPI_Type_free
 * wrappers).  Below mpi.c, mpi_p2p.c and the generated wrappers, which look
 * a call's handles up here (mpi_describe_slow, mpi_comm_index_slow: the fast
 * path's misses, mpi_internal.h); calls only the core.
 *
 * Communicator ids are equal on every member rank: derived from the parent's
 * id at creation (dup, split, create), else a hash of the members' world
 * ranks (an intercommunicator: of both groups, in an order both sides agree
 * on).  The comm table's size and rank are MPI_Comm_size / MPI_Comm_rank
 * (an intercommunicator's: in the local group).
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <string.h>

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

void mpi_build_tables(void)
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
