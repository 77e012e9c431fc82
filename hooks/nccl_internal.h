/*
 * nccl_internal.h -- what the files of the NCCL symbol wrappers share:
 * nccl_lookup.c (the real NCCL's functions, communicator registration),
 * nccl.c (the wrapped entry points and their recording path) and
 * nccl_backend.c (hvprof_nccl_visible, hvprof_nccl_json, the end of NCCL
 * profiling, the backend).  Each file uses only those before it.  Not for
 * the plugin path (nccl_plugin.c): the two paths share nccl_common.h only.
 */
#ifndef HVPROF_NCCL_INTERNAL_H
#define HVPROF_NCCL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

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
/* nccl_lookup.c: finding the real NCCL.                                     */

/* Path of a loaded object whose file name starts with prefix ("libnccl",
 * "libcuda."), or "" -- written into out. */
int loaded_object(const char *prefix, char *out, size_t n);

/* The real NCCL function `name`: dlsym(RTLD_NEXT), else on a libnccl loaded
 * RTLD_LOCAL; never `self` (this library's wrapper).  NULL: none. */
void *real_sym(const char *name, void *self);

/* A wrapper called without a real function behind it: warned once, counted
 * (c_missing_real); returns ncclSystemError. */
ncclResult_t missing_real(const char *name);
extern _Atomic uint64_t c_missing_real;

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

/* ------------------------------------------------------------------------ */
/* Communicators: registered by nccl_lookup.c, looked up inline.             */

/* Communicators first seen in a call (comm_index). */
extern _Atomic uint64_t c_comms_late;

/* Register communicator c in the core's table (UINT32_MAX: c is NULL); size,
 * rank and device from NCCL's queries where not given (< 0), else the device
 * from the CUDA runtime. */
uint32_t comm_register(ncclComm_t c, uint64_t id, int size, int rank, int device);

/* ncclUniqueId's bytes mixed into h. */
uint64_t uid_hash(const ncclUniqueId *u, uint64_t h);

static inline const hvprof_comm_entry *comm_entry_of(uint32_t idx)
{
    hvprof_file_header *h = hvprof_header();
    if (!h || idx >= h->comm_table_capacity) return NULL;
    return (const hvprof_comm_entry *)((const char *)h + h->comm_table_offset) + idx;
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

/* ------------------------------------------------------------------------ */
/* nccl.c: the wrappers.                                                     */

extern _Atomic uint64_t c_empty_groups, c_nested;
/* Records written by these wrappers (of hvprof_nccl_calls: both paths'). */
extern _Atomic uint64_t c_wrapper_records;

/* A forked child: no group open on the thread that forked. */
void nccl_groups_forget(void);

/* The wrapper hvprof_nccl_visible looks for behind this library. */
HVPROF_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t stream);

#endif
