/*
 * nccl_common.h -- what NCCL's two paths share (nccl_common.c).  The symbol
 * wrappers (nccl.c) and the profiler-plugin interface (nccl_plugin.c) see the
 * same calls when NCCL is shared, and each call is recorded once: the plugin
 * path stays silent while a wrapper is inside the real call on the same
 * thread.  Each path calls this module and the core, never the other path;
 * what the wrappers need of the plugin path (its part of hvprof_nccl_json, its
 * exit flush; nccl_backend.c) the plugin registers here (hvprof_nccl_register_plugin).
 */
#ifndef HVPROF_NCCL_COMMON_H
#define HVPROF_NCCL_COMMON_H

#include "hvprof_internal.h"

/* >0 while a wrapper (nccl.c) is inside a real NCCL call on this thread:
 * NCCL calls made by NCCL itself pass through, and the plugin path leaves
 * the call to the wrapper.  initial-exec TLS, as hvprof_t. */
extern __thread int hvprof_nccl_nest __attribute__((tls_model("initial-exec")));

static inline int hvprof_nccl_in_wrapper(void) { return hvprof_nccl_nest > 0; }

/* The slow half of hvprof_nccl_recording: once per process, open the raw
 * file when HOROVOD_PROFILE is on and no file was ever opened. */
HVPROF_HIDDEN int hvprof_nccl_open_once(void);

/* Is recording on?  Opens the raw file at the first NCCL call or event of a
 * process that has none yet (no MPI_Init: torchrun and other launchers); a
 * file opened earlier (MPI) and since closed or switched off stays so. */
static inline int hvprof_nccl_recording(void)
{
    if (HVPROF_LIKELY(atomic_load_explicit(&hvprof_active, memory_order_relaxed)))
        return 1;
    return hvprof_nccl_open_once();
}

/* Records written, per op (NCCL_ALLREDUCE .. NCCL_GROUP), by either path:
 * hvprof_nccl_json's "calls". */
#define HVPROF_NCCL_N_OPS (HVPROF_OP_NCCL_GROUP - HVPROF_OP_NCCL_ALLREDUCE + 1)
extern _Atomic uint64_t hvprof_nccl_calls[HVPROF_NCCL_N_OPS];

static inline void hvprof_nccl_count(uint16_t op)
{
    if (op >= HVPROF_OP_NCCL_ALLREDUCE && op <= HVPROF_OP_NCCL_GROUP)
        atomic_fetch_add_explicit(&hvprof_nccl_calls[op - HVPROF_OP_NCCL_ALLREDUCE], 1,
                                  memory_order_relaxed);
}

/* An NCCL communicator into the core's table (backend "nccl"; the world
 * rank of its member 0 is this process's when rank is 0), with its device
 * (-1: unknown) and no splits yet.  The first one of the process registers
 * the exit handler (hvprof_nccl_set_exit). */
HVPROF_HIDDEN uint32_t hvprof_nccl_comm_register(uint64_t handle, uint64_t id, int size,
                                                 int rank, int device);
/* The device of table entry idx (-1: unknown). */
HVPROF_HIDDEN int hvprof_nccl_comm_device(uint32_t idx);
/* The number of entry idx's next split (0 first). */
HVPROF_HIDDEN uint32_t hvprof_nccl_comm_next_split(uint32_t idx);
/* Communicators registered so far. */
HVPROF_HIDDEN uint64_t hvprof_nccl_comms(void);

/* The end of NCCL profiling (nccl_backend.c: hvprof_nccl_finish): run at exit by an
 * atexit handler registered at the first communicator -- CUDA is initialised
 * by then, so the handler runs before the CUDA runtime's exit teardown. */
HVPROF_HIDDEN void hvprof_nccl_set_exit(void (*fn)(void));

/* The plugin path's part of the NCCL metadata and of the exit. */
typedef struct hvprof_nccl_plugin {
    /* Events raised inside a wrapper, left to it. */
    uint64_t (*silent)(void);
    /* "plugin": {...} (no comma) into buf; records: the records of the
     * plugin path (all NCCL records less the wrappers'). */
    size_t (*json)(char *buf, size_t n, uint64_t records);
    /* Write the network / device records of the calls still waiting for
     * late proxy events. */
    void (*flush)(void);
} hvprof_nccl_plugin;

/* Register p (kept, not copied; nccl_plugin.c's constructor). */
HVPROF_HIDDEN void hvprof_nccl_register_plugin(const hvprof_nccl_plugin *p);
/* The registered plugin path's hooks; 0 / nothing without one. */
HVPROF_HIDDEN uint64_t hvprof_nccl_plugin_silent(void);
HVPROF_HIDDEN size_t hvprof_nccl_plugin_json(char *buf, size_t n, uint64_t records);
HVPROF_HIDDEN void hvprof_nccl_plugin_flush(void);

/* NCCL's ncclDataType_t values 0..11 (ncclInt8 .. ncclFloat8e5m2): the
 * format's code, bytes per element, and the name NCCL's profiler descriptors
 * give the type (v2 on).  One table for the symbol wrappers (indexed by the
 * enum) and the profiler plugin (looked up by name). */
#define HVPROF_NCCL_N_DTYPES 12
typedef struct hvprof_nccl_dtype {
    const char *name;
    uint8_t code;
    uint8_t size;
} hvprof_nccl_dtype;
HVPROF_HIDDEN extern const hvprof_nccl_dtype hvprof_nccl_dtypes[HVPROF_NCCL_N_DTYPES];

/* ncclRedOp_t: ncclSum 0, ncclProd 1, ncclMax 2, ncclMin 3, ncclAvg 4; values
 * from ncclNumOps (5) up are ops made by ncclRedOpCreatePreMulSum. */
static inline uint8_t hvprof_nccl_redop(int64_t op)
{
    switch (op) {
    case 0: return HVPROF_REDOP_SUM;
    case 1: return HVPROF_REDOP_PROD;
    case 2: return HVPROF_REDOP_MAX;
    case 3: return HVPROF_REDOP_MIN;
    case 4: return HVPROF_REDOP_AVG;
    default: return op >= 5 ? HVPROF_REDOP_PREMULSUM : HVPROF_REDOP_USER;
    }
}

#endif
