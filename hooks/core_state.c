/*
 * core_state.c -- the core's shared state: every variable the core's files
 * and the backends share (declared in core_internal.h and hvprof_internal.h),
 * defined here and nowhere else; the backend registry; the state's
 * accessors.  The bottom of the core: it calls no other file (core_internal.h
 * has the stack).
 *
 * Hot path (hvprof_emit in hvprof_internal.h; the MPI wrappers' fast path in
 * mpi_internal.h: call_slot/call_open/call_close): relaxed loads of a few of
 * these globals (hvprof_active, hvprof_divert, hvprof_generation,
 * hvprof_handle_epoch), TLS compares, stores into a cache-warm buffer and a
 * release store of the chunk's record count.  No lock, no allocation, no
 * system call, no locked instruction.  Everything else runs once per thread,
 * per communicator or per chunk (4095 records with the default 256 KiB
 * chunk: HVPROF_DEFAULT_CHUNK_BYTES / HVPROF_RECORD_BYTES - 1 for the chunk
 * header).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "core_internal.h"

/* ------------------------------------------------------------------------ */
/* Globals shared with the hot path (hvprof_internal.h).                     */

__thread hvprof_tls hvprof_t __attribute__((tls_model("initial-exec"))) = {
    .track = UINT32_MAX,
};
_Atomic int hvprof_active = 0;
_Atomic uint32_t hvprof_generation = 1;
hvprof_inflight_entry *_Atomic hvprof_inflight_table = NULL;
_Atomic uint32_t hvprof_handle_epoch = 1;
_Atomic int hvprof_divert = 0;
_Atomic int hvprof_helper_tid = 0;
int hvprof_clock_kind = HVPROF_CLOCK_MONOTONIC;
_Atomic uint32_t hvprof_comm_seq[HVPROF_COMM_TABLE_CAPACITY];

/* ------------------------------------------------------------------------ */
/* The core's own (core_internal.h).                                         */

hvprof_core_state hvprof_core = {.fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};
_Atomic int app_active = 0;
pthread_key_t exit_key;

/* ------------------------------------------------------------------------ */
/* Backend registry.                                                          */

static const hvprof_backend *_Atomic backends[MAX_BACKENDS];
static _Atomic uint32_t n_backends;

void hvprof_register_backend(const hvprof_backend *b)
{
    uint32_t n = atomic_load(&n_backends);
    for (uint32_t i = 0; i < n && i < MAX_BACKENDS; i++)
        if (atomic_load(&backends[i]) == b) return;
    uint32_t i = atomic_fetch_add(&n_backends, 1);
    if (i < MAX_BACKENDS) atomic_store(&backends[i], b);
}

/* The i-th registered backend, or NULL (past the end, or being registered). */
const hvprof_backend *backend_at(uint32_t i)
{
    uint32_t n = atomic_load(&n_backends);
    return i < n && i < MAX_BACKENDS ? atomic_load(&backends[i]) : NULL;
}

/* ------------------------------------------------------------------------ */
/* Accessors, for the backends and for Python (ctypes).                      */

HVPROF_EXPORT int hvprof_is_active(void) { return atomic_load(&hvprof_active); }
HVPROF_EXPORT const char *hvprof_dir(void) { return hvprof_core.open ? hvprof_core.dir : ""; }
HVPROF_EXPORT const char *hvprof_raw_path(void) { return hvprof_core.open ? hvprof_core.raw_path : ""; }
HVPROF_EXPORT int hvprof_rank(void) { return hvprof_core.open ? hvprof_core.hdr->rank : -1; }
HVPROF_EXPORT int hvprof_world_size(void) { return hvprof_core.open ? hvprof_core.hdr->world_size : -1; }
HVPROF_EXPORT uint64_t hvprof_now(void) { return hvprof_ticks(); }
/* hvprof_now()'s ticks per nanosecond (0 before the raw file is open). */
HVPROF_EXPORT double hvprof_ticks_per_ns(void) { return hvprof_core.open ? hvprof_core.hdr->ticks_per_ns : 0.0; }
HVPROF_HIDDEN int hvprof_python_attached(void) { return hvprof_core.python; }
HVPROF_HIDDEN int hvprof_app_active(void) { return atomic_load(&app_active); }
hvprof_file_header *hvprof_header(void) { return hvprof_core.open ? hvprof_core.hdr : NULL; }
const char *hvprof_open_error(void) { return hvprof_core.open_error; }
int hvprof_write_errno(void) { return hvprof_core.write_errno; }
void hvprof_set_quiet(int on) { hvprof_core.quiet = on; }
