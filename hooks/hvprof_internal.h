/*
 * hvprof_internal.h -- what the backend files (mpi.c, nccl*.c, and cuda_rt*.c,
 * NCCL's device-time helper) share with the core (core.c: buffers, files,
 * tables, the backend registry; clock.h: the clock; settings.c: the
 * settings).  Not installed.  The core names no backend: each (cpu.c and
 * exitmerge.c too) registers its lifecycle hooks (hvprof_register_backend)
 * from its constructor.  Files call the core; the core calls back only
 * through those hooks (tests/test_c_structure.py checks the call graph).
 */
#ifndef HVPROF_INTERNAL_H
#define HVPROF_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hvprof_format.h"
#include "clock.h"
#include "hvprof_settings.h"

#define HVPROF_EXPORT __attribute__((visibility("default")))
#define HVPROF_HIDDEN __attribute__((visibility("hidden")))
#define HVPROF_LIKELY(x) __builtin_expect(!!(x), 1)
#define HVPROF_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* What a call's handles mean (communicator, datatype, reduction op), as this
 * thread last looked them up: the common case -- the same three handles as
 * the previous call -- costs four compares instead of three table probes.
 * Valid while hvprof_handle_epoch equals `epoch` (bumped when a communicator
 * is registered or forgotten and when a datatype is freed, so that a handle
 * reused by a new communicator or derived datatype is looked up again). */
typedef struct hvprof_desc {
    uint64_t comm, dt, op;       /* the handles (the cache key) */
    uint32_t epoch;              /* hvprof_handle_epoch when looked up */
    uint32_t ci;                 /* communicator table index (UINT32_MAX: none) */
    uint32_t dt_size;            /* bytes per element (MPI_Type_size) */
    uint8_t  dt_code;            /* enum hvprof_dtype */
    uint8_t  redop;              /* enum hvprof_redop */
    uint8_t  dt_flags;           /* HVPROF_FLAG_DERIVED_TYPE for a derived datatype, else 0 */
    uint8_t  pad;
} hvprof_desc;

/* Per-thread writing state.  initial-exec TLS: no __tls_get_addr per call.
 * The library's whole TLS segment is about 200 bytes: it is loaded with
 * dlopen by Python's start-up hook, and dlopen'ed initial-exec TLS comes out
 * of glibc's small static-TLS surplus (a few hundred bytes shared with, e.g.,
 * torch's libgomp): keep it small. */
typedef struct hvprof_tls {
    hvprof_record *slots;        /* first record slot of the current chunk */
    _Atomic uint64_t *nrec;      /* the chunk header's published count */
    uint32_t used;               /* slots taken (== *nrec unless a call is open) */
    uint32_t capacity;           /* slots per chunk; 0 = no chunk yet */
    uint32_t track;              /* this thread's track index, UINT32_MAX = none */
    uint32_t generation;         /* == hvprof_generation when chunk valid */
    /* This thread's flight-recorder entry (NULL: none), valid with `generation`. */
    hvprof_inflight_entry *inflight;
    /* A call whose record slot (open_rec, index open_idx) was taken before
     * the call and is completed after it (mpi.c's fast path); NULL when
     * none.  Any other record this thread makes while one is open first
     * closes the open one as it stands (hvprof_abandon_open: t_end =
     * t_start, HVPROF_FLAG_NO_COMPLETION), and the open call, if it ever
     * returns, finds open_rec changed and leaves its record so: that covers
     * a call made from inside a call (a user-defined reduction that calls
     * MPI) and a call that never returned (longjmp or an exception out of an
     * MPI error handler; a cancelled thread: closed at thread exit), both
     * rare, without a record lost or a chunk switched under an open slot. */
    hvprof_record *open_rec;
    uint32_t open_idx;
    uint32_t agg_generation;     /* summary mode: agg valid while equal to hvprof_generation */
    void    *agg;                /* summary mode: this thread's aggregate table */
    void    *agg_last;           /* ... and the entry of its last call (NULL: none) */
    hvprof_desc desc;            /* the last call's handles, looked up */
} hvprof_tls;

/* Bumped whenever a communicator handle is registered or forgotten, and when
 * a datatype is freed: a thread's hvprof_desc is valid only within one epoch. */
extern _Atomic uint32_t hvprof_handle_epoch;

extern __thread hvprof_tls hvprof_t __attribute__((tls_model("initial-exec")));

/* Close the calling thread's open call as it stands (see open_rec). */
HVPROF_HIDDEN void hvprof_abandon_open(void);

/* Write `text` and a newline to `path` as a whole (a temporary file beside
 * it, renamed), mode 0644 whatever the umask allows more; 0 or -1. */
HVPROF_HIDDEN int hvprof_write_text(const char *path, const char *text);

/* The path of this rank's sidecar file `suffix` next to its raw file
 * (rank-R.hvprof -> rank-R<suffix>); 0, or -1 without a raw file. */
HVPROF_HIDDEN int hvprof_sidecar_path(char *out, size_t size, const char *suffix);

static inline void hvprof_publish(hvprof_tls *t)
{
    atomic_store_explicit(t->nrec, t->used, memory_order_release);
}

/* 1 while records are being written (file open, not finalized). Read with a
 * relaxed load on every call: the only global the hot path touches. */
extern _Atomic int hvprof_active;
/* Bumped when the file is (re)opened or closed: stale TLS chunks are dropped. */
extern _Atomic uint32_t hvprof_generation;

/* Non-zero when calls are not written one record each: summary mode
 * (HOROVOD_PROFILE=summary: HVPROF_DIVERT_SUMMARY) or sampling paused
 * (HVPROF_DIVERT_PAUSED, whatever the mode).  One relaxed load per call. */
#define HVPROF_DIVERT_SUMMARY 1
#define HVPROF_DIVERT_PAUSED 2
extern _Atomic int hvprof_divert;

/* A call while hvprof_divert is set: fold it into this thread's aggregates
 * (summary mode) or count it as unsampled.  The caller has already taken
 * the call's sequence number. */
HVPROF_HIDDEN void hvprof_divert_call(uint16_t op, uint32_t comm, uint64_t bytes, uint8_t dtype,
                                      uint8_t redop, uint16_t flags, int rc, uint64_t t0,
                                      uint64_t t1);

/* One more call of duration d (ticks) in aggregate entry e (summary mode);
 * the call count last, so that a reader trusts the entry. */
static inline void hvprof_agg_add(hvprof_agg_entry *e, uint64_t d, uint16_t flags, int rc)
{
    uint64_t calls = __atomic_load_n(&e->calls, __ATOMIC_RELAXED);
    e->sum_ticks += d;
    if (d < e->min_ticks) e->min_ticks = d;
    if (d > e->max_ticks) e->max_ticks = d;
    e->hist[hvprof_agg_bucket(d)]++;
    e->flags_or |= flags;
    if (HVPROF_UNLIKELY(rc != 0) && e->errors < UINT16_MAX) e->errors++;
    __atomic_store_n(&e->calls, calls + 1, __ATOMIC_RELEASE);
}

/* Slow path: give the calling thread a fresh chunk.  Returns 0 on success,
 * -1 when no chunk can be had (the record is then counted as dropped). */
HVPROF_HIDDEN int hvprof_refill(void);

/* Reserve the next record slot of the calling thread, or NULL when out of
 * space (the drop is counted).  No recording check: hvprof_emit makes it. */
static inline hvprof_record *hvprof_slot_any(void)
{
    hvprof_tls *t = &hvprof_t;
    if (HVPROF_UNLIKELY(t->used >= t->capacity ||
                        t->generation != atomic_load_explicit(&hvprof_generation,
                                                              memory_order_relaxed))) {
        if (hvprof_refill() != 0) return NULL;
    }
    return &t->slots[t->used];
}

/* rec->track value meaning "the calling thread's track": known only once a
 * slot is reserved (a thread's first record registers its track). */
#define HVPROF_TRACK_SELF UINT32_MAX

/* The one way a record is written, by every backend and the core: reserve
 * the calling thread's next slot, store *rec there (rec->track ==
 * HVPROF_TRACK_SELF is replaced by the calling thread's track, in *rec too),
 * publish it.  gated: 1 = only while recording (hvprof_active); 0 =
 * application records, which the caller gates itself (core.c: from open to
 * process exit).  (The profiler's own MPI use calls PMPI_* directly and never
 * reaches a wrapper.)  Returns 0, or -1 when the record was not written.
 * Always inlined: with a constant gate and a compound literal the stores go
 * straight into the slot. */
static inline __attribute__((always_inline)) int hvprof_emit_record(hvprof_record *rec, int gated)
{
    hvprof_tls *t = &hvprof_t;
    if (gated && HVPROF_UNLIKELY(!atomic_load_explicit(&hvprof_active, memory_order_relaxed)))
        return -1;
    if (HVPROF_UNLIKELY(t->open_rec != NULL)) hvprof_abandon_open();
    hvprof_record *r = hvprof_slot_any();
    if (HVPROF_UNLIKELY(!r)) return -1;
    if (rec->track == HVPROF_TRACK_SELF) rec->track = t->track;
    *r = *rec;
    t->used++;
    hvprof_publish(t);
    return 0;
}

/* A backend's record (gated). */
static inline __attribute__((always_inline)) int hvprof_emit(hvprof_record *rec)
{
    return hvprof_emit_record(rec, 1);
}

/* ------------------------------------------------------------------------ */
/* Backends.  Each backend (and backend helper) registers its lifecycle hooks
 * with the core from its constructor; the core calls them in registration
 * order.  Every hook may be NULL. */
typedef struct hvprof_backend {
    const char *name;         /* "mpi", "nccl", "cuda", "cpu", "exitmerge" */
    /* File-name prefix of the library the backend wraps ("libmpi"): its
     * frames are skipped when naming the code that called a wrapper. */
    const char *library;
    /* hvprof_open, a new file (g.lock held): forget the previous file's
     * state, before recording starts. */
    void (*reset)(void);
    /* hvprof_open, once recording has started (g.lock held). */
    void (*opened)(void);
    /* A thread's track was registered (idx: its track, tid: its thread id). */
    void (*track_new)(uint32_t idx, int32_t tid);
    /* After the calling thread's APP_STEP record (seq: the step's). */
    void (*app_step)(uint32_t seq);
    /* hvprof_close, before recording stops (g.lock held): write what is still
     * in flight (NCCL device times) while records are still taken. */
    void (*finish)(void);
    /* hvprof_close of MPI_Finalize (at_exit 0) or of process exit (1), once
     * recording has stopped (g.lock held). */
    void (*closed)(int at_exit);
    /* In a forked child, after the core has reset its own state. */
    void (*atfork_child)(void);
    /* A Python rank's exit work starts (before MPI_Finalize and its own
     * conversion): the profile directory and this process's rank. */
    void (*exit_prepare)(const char *dir, int rank);
    /* Process exit, before the raw file is closed (this process's rank). */
    void (*exit_begin)(int rank);
    /* Process exit, after the raw file was closed: the profile directory,
     * the raw file, this process's rank and the world size. */
    void (*at_exit)(const char *dir, const char *raw, int rank, int world);
    /* A step ended (seq; t_end: its end, ticks), told on the helper thread
     * at its next pass, in step order (at once, on the stepping thread, where
     * no helper runs or its queue is full): per-step work that need not run
     * at the boundary itself belongs here, off the training thread (app_step
     * is for what must).  core_flush.c: helper_step_post. */
    void (*helper_step)(uint32_t seq, uint64_t t_end);
} hvprof_backend;

/* 1 when sig would end the process as its default action does: no handler
 * but the default, or only the core's fatal-signal handler before it. */
HVPROF_HIDDEN int hvprof_signal_ends_process(int sig);

/* Register b (kept, not copied); a second registration of b is ignored. */
HVPROF_HIDDEN void hvprof_register_backend(const hvprof_backend *b);

/* Track of the calling thread (registers it on first use). */
HVPROF_HIDDEN uint32_t hvprof_track_self(void);
/* Track for a device stream (registers it on first use; lock-free lookup). */
HVPROF_HIDDEN uint32_t hvprof_track_stream(uint64_t stream, int device);

/* Communicator table.  lookup: index of a handle seen before, or UINT32_MAX.
 * register: adds (or returns the existing) entry; thread-safe, lock-free. */
HVPROF_HIDDEN uint32_t hvprof_comm_lookup(uint64_t handle);
HVPROF_HIDDEN uint32_t hvprof_comm_register(uint64_t handle, uint64_t id, int size,
                                            int rank, int world_rank0, int backend,
                                            const char *name);
HVPROF_HIDDEN void hvprof_comm_forget(uint64_t handle);
/* Per-communicator call numbers.  Collectives on one communicator are
 * serialized by the MPI standard's rules (and NCCL's), so a plain load+store
 * (no locked instruction) is exact. */
extern _Atomic uint32_t hvprof_comm_seq[HVPROF_COMM_TABLE_CAPACITY];
static inline uint32_t hvprof_comm_next_seq(uint32_t comm)
{
    if (HVPROF_UNLIKELY(comm >= HVPROF_COMM_TABLE_CAPACITY)) return 0;
    uint32_t s = atomic_load_explicit(&hvprof_comm_seq[comm], memory_order_relaxed);
    atomic_store_explicit(&hvprof_comm_seq[comm], s + 1, memory_order_relaxed);
    return s;
}

/* Open the raw file for this process if not open yet.  rank/world/local may
 * be -1 (then taken from the launcher's environment where it has them).
 * dir: the profile directory, or NULL for the default. Returns 0 or -1. */
HVPROF_HIDDEN int hvprof_open(int rank, int world_size, int local_rank, const char *dir);
/* Flush calibration, mark FINALIZED, stop recording. Idempotent. */
HVPROF_HIDDEN void hvprof_close(uint32_t state_bits);
/* The exit work starts (exported for Python's activate.finish; MPI_Finalize
 * calls it for C ranks): rank 0 says how to build the trace if a signal ends
 * it from here.  Once per process. */
HVPROF_EXPORT void hvprof_exit_prepare(void);
HVPROF_HIDDEN hvprof_file_header *hvprof_header(void);
/* Why the last hvprof_open failed ("" when it did not). */
HVPROF_HIDDEN const char *hvprof_open_error(void);
/* The errno of the first failed write of records (0: none failed). */
HVPROF_HIDDEN int hvprof_write_errno(void);
/* quiet: failures are reported for the whole job by rank 0 (MPI jobs);
 * otherwise each process says its own. */
HVPROF_HIDDEN void hvprof_set_quiet(int on);

/* Exported to Python (see docs/ARCHITECTURE.md section 6), used here too. */
HVPROF_EXPORT const char *hvprof_dir(void);
HVPROF_EXPORT const char *hvprof_raw_path(void);
HVPROF_EXPORT int hvprof_rank(void);
HVPROF_HIDDEN int hvprof_python_attached(void);
/* The library's clock and the application records (core.c, cpu.c), which
 * the step state (steps.c) writes through. */
HVPROF_EXPORT uint64_t hvprof_now(void);
HVPROF_EXPORT void hvprof_set_sampling(int on);
HVPROF_EXPORT int hvprof_record_app(int op, uint64_t t_start, uint64_t t_end, uint64_t count,
                                    uint32_t seq);
HVPROF_EXPORT int hvprof_record_app_cpu(int op, uint64_t t_start, uint64_t t_end,
                                        uint64_t cpu_ns, uint64_t wait_ns, uint32_t seq);
HVPROF_EXPORT int hvprof_cpu_baseline(void);
/* Which steps read every thread's CPU (cpu.c): all of the first
 * HVPROF_CPU_FIRST_STEPS, then one in HOROVOD_PROFILE_CPU. */
#define HVPROF_CPU_FIRST_STEPS 64
HVPROF_EXPORT int hvprof_cpu_step_reads(void);

/* 64-bit mixing used for stable communicator ids. */
static inline uint64_t hvprof_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
    return h;
}

/* The helper thread's tid (0 before it runs; core.c): the CPU sidecar
 * (cpu.c, a registered backend helper) names it. */
extern _Atomic int hvprof_helper_tid;
/* 1 while application records (steps) are taken. */
HVPROF_HIDDEN int hvprof_app_active(void);

/* Settings (settings.c, the one reader; the table is hvprof_settings.h,
 * generated from profiler._env.SETTINGS).  A number, a switch (0/1) or a
 * choice (its index) as the table parses it, the default when unset or
 * unusable; a text's value (NULL when unset or empty). */
HVPROF_HIDDEN long hvprof_setting_int(hvprof_setting_id id);
HVPROF_HIDDEN double hvprof_setting_num(hvprof_setting_id id);
HVPROF_HIDDEN const char *hvprof_setting_text(hvprof_setting_id id);
/* HOROVOD_PROFILE: HVPROF_MODE_FULL, HVPROF_MODE_SUMMARY or
 * HVPROF_PROFILE_OFF (unset, empty, an off word, or a value that is none of
 * its words, said once): the one decision, for every backend. */
#define HVPROF_PROFILE_OFF (-1)
HVPROF_HIDDEN int hvprof_profile_mode(void);
/* The same, saying nothing: where no rank is known yet (a constructor runs
 * in the launcher's processes too). */
HVPROF_HIDDEN int hvprof_profile_mode_quiet(void);
/* Say every unusable C-side setting once per process (rank 0's open). */
HVPROF_HIDDEN void hvprof_settings_check(void);
/* HOROVOD_PROFILE_WINDOW "A:B" / "A:" seconds: 0, or -1 when unusable. */
HVPROF_HIDDEN int hvprof_parse_window(const char *w, double *a, double *b);
/* The default profile directory's name (core_open.c): horovod-profile-<12
 * hex digits>, from `job_id` (an MPI job: rank 0's, broadcast), else (0)
 * from the launcher's job identity, which every rank computes alike. */
HVPROF_HIDDEN void hvprof_default_dir(char *out, size_t n, uint64_t job_id);
/* A function of the caller's (Python's, through ctypes) the library calls. */
typedef void (*hvprof_callback)(void);
/* The process's rank as its launcher's variables say it (-1: none does). */
HVPROF_HIDDEN int hvprof_launcher_rank(void);
/* Every setting as the library reads it, as JSON (tests). */
HVPROF_EXPORT size_t hvprof_settings_json(char *buf, size_t n);

/* Diagnostics go to stderr, one line, prefixed; never from the hot path. */
HVPROF_HIDDEN void hvprof_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The flight recorder (hvprof_format.h): this process's in-flight table in
 * the mmapped header, NULL while no file is open (and in a forked child).
 * A few stores per call, no system call. */
extern hvprof_inflight_entry *_Atomic hvprof_inflight_table;

/* A thread's entry is hvprof_tls.inflight (set when its track is
 * registered: &table[track] for the first HVPROF_INFLIGHT_CAPACITY tracks).
 * Begin: the communicator and start, then state and op in one 8-byte release
 * store (state at offset 0, op at 4, pad0 at 6), so that a reader that sees
 * state 1 sees the rest; end: state 0. */
static inline void hvprof_inflight_begin(hvprof_inflight_entry *e, uint16_t op, uint64_t comm,
                                         uint64_t t0)
{
    e->comm = comm;
    e->t_start = t0;
    typedef uint64_t __attribute__((may_alias)) word;
    __atomic_store_n((word *)(void *)e, 1u | (uint64_t)op << 32, __ATOMIC_RELEASE);
}

HVPROF_STATIC_ASSERT(offsetof(hvprof_inflight_entry, state) == 0 &&
                         offsetof(hvprof_inflight_entry, op) == 4,
                     "state and op share the first 8 bytes");

/* A point-to-point call: its peer and tag too (format values), before the
 * release store. */
static inline void hvprof_inflight_begin_p2p(hvprof_inflight_entry *e, uint16_t op,
                                             uint64_t comm, uint64_t t0, int32_t peer,
                                             int32_t tag)
{
    e->peer = peer;
    e->tag = tag;
    hvprof_inflight_begin(e, op, comm, t0);
}

static inline void hvprof_inflight_end(hvprof_inflight_entry *e)
{
    __atomic_store_n(&e->state, 0u, __ATOMIC_RELEASE);
}

#endif
