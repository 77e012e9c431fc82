/*
 * core.c -- the core: communicator and track tables, the clock, the raw
 * file's close, fork and exit, and the functions Python calls through ctypes.
 * Its other rooms, one purpose each: core_open.c (the raw file: directory,
 * settings check, header, open), core_flush.c (chunk supply, the helper
 * thread, signals, thread exit), core_summary.c (summary mode, sampling, the
 * time window), core_layout.c (the layout JSON); what they share:
 * core_internal.h (not for backends: they see hvprof_internal.h).
 *
 * Hot path (hvprof_emit in hvprof_internal.h; the MPI wrappers' fast path in
 * mpi_internal.h: call_slot/call_open/call_close): relaxed loads of a few globals
 * (hvprof_active, hvprof_divert, hvprof_generation, hvprof_handle_epoch),
 * TLS compares, stores into a cache-warm buffer and a release store of the
 * chunk's record count.  No lock, no allocation, no system call, no locked
 * instruction.  Everything else here runs once per thread, per communicator
 * or per chunk (4095 records with the default 256 KiB chunk:
 * HVPROF_DEFAULT_CHUNK_BYTES / HVPROF_RECORD_BYTES - 1 for the chunk header).
 *
 * The core names no backend: mpi.c, nccl*.c, cuda_rt*.c and the helpers
 * (cpu.c, exitmerge.c) register their lifecycle hooks
 * (hvprof_register_backend) and the core calls them; it calls no function
 * of theirs by name (tests/test_c_structure.py).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core_internal.h"

/* ------------------------------------------------------------------------ */
/* Globals shared with the hot path.                                         */

__thread hvprof_tls hvprof_t __attribute__((tls_model("initial-exec"))) = {
    .track = UINT32_MAX,
};
_Atomic int hvprof_active = 0;
/* Application records (steps, marks) are taken from open to process exit:
 * MPI_Finalize may come first on another thread (Horovod's background thread
 * finalizes when any rank shuts Horovod down, while this rank's main thread
 * is still closing its last step). */
_Atomic int app_active = 0;
_Atomic uint32_t hvprof_generation = 1;
hvprof_inflight_entry *_Atomic hvprof_inflight_table = NULL;
_Atomic uint32_t hvprof_handle_epoch = 1;
_Atomic int hvprof_divert = 0;
_Atomic int hvprof_helper_tid = 0;
int hvprof_clock_kind = HVPROF_CLOCK_MONOTONIC;

/* Process state (core_internal.h): written under the open/close paths only. */
hvprof_core_state hvprof_core = {.fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};

pthread_key_t exit_key; /* its destructor hands an exiting thread's buffer over */

/* Communicator lookup: open addressing, handle -> table index + 1. */
#define COMM_TOMBSTONE UINT64_MAX
_Atomic uint64_t comm_keys[COMM_HASH_SLOTS];
_Atomic uint32_t comm_vals[COMM_HASH_SLOTS];
_Atomic uint32_t hvprof_comm_seq[HVPROF_COMM_TABLE_CAPACITY];

/* Stream tracks: the same scheme, stream handle -> track index + 1. */
_Atomic uint64_t stream_keys[STREAM_HASH_SLOTS];
_Atomic uint32_t stream_vals[STREAM_HASH_SLOTS];

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
/* Clock.                                                                     */

void hvprof_clock_pair(int64_t *ticks, int64_t *mono)
{
    /* Take the pair whose two tick reads are closest: bounds the skew. */
    int64_t best = INT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = hvprof_ticks();
        int64_t m = hvprof_mono_ns();
        uint64_t b = hvprof_ticks();
        if ((int64_t)(b - a) < best) {
            best = (int64_t)(b - a);
            *ticks = (int64_t)(a + (b - a) / 2);
            *mono = m;
        }
    }
}

static int tsc_invariant(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1;
#else
    return 0;
#endif
}

static void clock_select(void)
{
    /* HOROVOD_PROFILE_CLOCK: tsc, monotonic or auto (choices 0, 1, 2); the TSC
     * only where it is invariant. */
    int tsc = tsc_invariant() && hvprof_setting_int(HVS_CLOCK) != 1;
    hvprof_clock_kind = tsc ? HVPROF_CLOCK_TSC : HVPROF_CLOCK_MONOTONIC;
}

double hvprof_clock_init(int64_t *ticks0, int64_t *mono0, int64_t *realtime0)
{
    int tsc = hvprof_clock_kind == HVPROF_CLOCK_TSC;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    hvprof_clock_pair(ticks0, mono0);
    *realtime0 = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec;
    if (!tsc) return 1.0;
    int64_t t1, m1;
    do {
        hvprof_clock_pair(&t1, &m1);
    } while (m1 - *mono0 < 2000000); /* 2 ms */
    return (double)(t1 - *ticks0) / (double)(m1 - *mono0);
}

void calibrate_now(void)
{
    if (!hvprof_core.hdr) return;
    int64_t t, m;
    hvprof_clock_pair(&t, &m);
    /* Two 8-byte stores; a reader racing with them sees a pair from a
     * previous calibration at worst -- both pairs are valid. */
    hvprof_core.hdr->cal1_ticks = t;
    hvprof_core.hdr->cal1_mono_ns = m;
}

/* ------------------------------------------------------------------------ */
/* Tracks (threads and device streams).                                       */

static void caller_object(char *out, size_t n)
{
    /* The first frame outside this library names the code that called MPI
     * (Horovod's mpi_lib, mpi4py's MPI module, the application...). Once per
     * thread. */
    void *frames[16];
    int depth = backtrace(frames, 16);
    Dl_info self, info;
    out[0] = 0;
    if (!dladdr((void *)&caller_object, &self)) return;
    for (int i = 1; i < depth; i++) {
        if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
        if (info.dli_fbase == self.dli_fbase) continue;
        const char *base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        /* skip the wrapped libraries themselves (libmpi called through a
         * PMPI layer, NCCL calling its own exported symbols) */
        int wrapped = 0;
        FOR_EACH_BACKEND(b)
            if (b->library && strncmp(base, b->library, strlen(b->library)) == 0) wrapped = 1;
        if (wrapped) continue;
        snprintf(out, n, "%s", base[0] ? base : "(main)");
        return;
    }
}

static uint32_t track_alloc(void)
{
    uint32_t idx = __atomic_fetch_add(&hvprof_core.hdr->n_tracks, 1, __ATOMIC_RELAXED);
    if (idx >= HVPROF_TRACK_TABLE_CAPACITY - 1) {
        /* The last entry collects every track past capacity. */
        hvprof_track_entry *e = (hvprof_track_entry *)((char *)hvprof_core.hdr + hvprof_core.hdr->track_table_offset) +
                                (HVPROF_TRACK_TABLE_CAPACITY - 1);
        if (!e->valid) {
            snprintf(e->name, sizeof e->name, "(overflow)");
            e->tid = -1;
            e->kind = 1;
            __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
        }
        return HVPROF_TRACK_TABLE_CAPACITY - 1;
    }
    return idx;
}

static hvprof_track_entry *track_entry(uint32_t idx)
{
    return (hvprof_track_entry *)((char *)hvprof_core.hdr + hvprof_core.hdr->track_table_offset) + idx;
}

uint32_t hvprof_track_self(void)
{
    hvprof_tls *t = &hvprof_t;
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_acquire);
    if (t->generation != gen) {
        /* State of a previous file (or of the parent before fork). */
        t->slots = NULL;
        t->nrec = NULL;
        t->used = t->capacity = 0;
        t->track = UINT32_MAX;
        t->inflight = NULL;
        t->open_rec = NULL;
        t->generation = gen;
    }
    if (t->track != UINT32_MAX) return t->track;
    if (!hvprof_core.hdr) return UINT32_MAX;
    uint32_t idx = track_alloc();
    if (idx < HVPROF_TRACK_TABLE_CAPACITY - 1) {
        hvprof_track_entry *e = track_entry(idx);
        e->handle = (uint64_t)pthread_self();
        e->tid = (int32_t)syscall(SYS_gettid);
        e->kind = 1;
        e->is_main = e->tid == (int32_t)getpid();
        e->device = -1;
        pthread_getname_np(pthread_self(), e->name, sizeof e->name);
        caller_object(e->caller, sizeof e->caller);
        pthread_setspecific(exit_key, (void *)1); /* thread_exit() hands over its buffer */
        __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
        FOR_EACH_BACKEND(b) /* its first CPU read (cpu.c) */
            if (b->track_new) b->track_new(idx, e->tid);
    }
    hvprof_inflight_entry *tab = atomic_load_explicit(&hvprof_inflight_table, memory_order_relaxed);
    t->inflight = tab && idx < HVPROF_INFLIGHT_CAPACITY ? &tab[idx] : NULL;
    t->track = idx;
    return idx;
}

uint32_t hvprof_track_stream(uint64_t stream, int device)
{
    if (!hvprof_core.hdr) return UINT32_MAX;
    /* the default stream (0) of each device is a track of its own */
    uint64_t key = hvprof_mix(stream + 1, (uint64_t)(int64_t)device) | 1;
    uint32_t h = (uint32_t)(hvprof_mix(0, key) & (STREAM_HASH_SLOTS - 1));
    for (uint32_t probe = 0; probe < STREAM_HASH_SLOTS; probe++, h = (h + 1) & (STREAM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&stream_keys[h], memory_order_acquire);
        if (k == key) {
            uint32_t v;
            while ((v = atomic_load_explicit(&stream_vals[h], memory_order_acquire)) == 0) {
            }
            return v - 1;
        }
        if (k == 0) {
            uint64_t expect = 0;
            if (!atomic_compare_exchange_strong(&stream_keys[h], &expect, key)) {
                if (expect != key) continue; /* another key took the slot */
                uint32_t v; /* another thread is registering this stream */
                while ((v = atomic_load_explicit(&stream_vals[h], memory_order_acquire)) == 0) {
                }
                return v - 1;
            }
            uint32_t idx = track_alloc();
            if (idx < HVPROF_TRACK_TABLE_CAPACITY - 1) {
                hvprof_track_entry *e = track_entry(idx);
                e->handle = stream;
                e->tid = -1;
                e->kind = 2;
                e->is_main = 0;
                e->device = device;
                snprintf(e->name, sizeof e->name, "stream %d", device);
                __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
            }
            atomic_store_explicit(&stream_vals[h], idx + 1, memory_order_release);
            return idx;
        }
    }
    return HVPROF_TRACK_TABLE_CAPACITY - 1;
}

/* ------------------------------------------------------------------------ */
/* Communicators.                                                             */

static hvprof_comm_entry *comm_entry(uint32_t idx)
{
    return (hvprof_comm_entry *)((char *)hvprof_core.hdr + hvprof_core.hdr->comm_table_offset) + idx;
}

static inline uint32_t comm_slot0(uint64_t handle)
{
    return (uint32_t)(hvprof_mix(0, handle) & (COMM_HASH_SLOTS - 1));
}

uint32_t hvprof_comm_lookup(uint64_t handle)
{
    uint32_t h = comm_slot0(handle);
    for (uint32_t probe = 0; probe < COMM_HASH_SLOTS; probe++, h = (h + 1) & (COMM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&comm_keys[h], memory_order_acquire);
        if (k == handle) {
            uint32_t v = atomic_load_explicit(&comm_vals[h], memory_order_acquire);
            if (v) return v - 1;
        } else if (k == 0) {
            return UINT32_MAX;
        }
    }
    return UINT32_MAX;
}

uint32_t hvprof_comm_register(uint64_t handle, uint64_t id, int size, int rank,
                              int world_rank0, int backend, const char *name)
{
    if (!hvprof_core.hdr) return UINT32_MAX;
    uint32_t h = comm_slot0(handle);
    for (uint32_t probe = 0; probe < COMM_HASH_SLOTS; probe++, h = (h + 1) & (COMM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&comm_keys[h], memory_order_acquire);
        if (k == handle) {
            uint32_t v;
            while ((v = atomic_load_explicit(&comm_vals[h], memory_order_acquire)) == 0) {
            }
            return v - 1;
        }
        if (k != 0) continue;
        uint64_t expect = 0;
        if (!atomic_compare_exchange_strong(&comm_keys[h], &expect, handle)) {
            if (expect != handle) continue; /* another handle took the slot */
            uint32_t v; /* another thread is registering this handle */
            while ((v = atomic_load_explicit(&comm_vals[h], memory_order_acquire)) == 0) {
            }
            return v - 1;
        }
        uint32_t idx = __atomic_fetch_add(&hvprof_core.hdr->n_comms, 1, __ATOMIC_RELAXED);
        if (idx >= HVPROF_COMM_TABLE_CAPACITY - 1) {
            idx = HVPROF_COMM_TABLE_CAPACITY - 1; /* overflow entry */
            hvprof_comm_entry *e = comm_entry(idx);
            if (!e->valid) {
                snprintf(e->name, sizeof e->name, "(overflow)");
                e->size = -1;
                e->rank = -1;
                e->world_rank0 = -1;
                __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
            }
        } else {
            hvprof_comm_entry *e = comm_entry(idx);
            e->handle = handle;
            e->id = id;
            e->size = size;
            e->rank = rank;
            e->world_rank0 = world_rank0;
            e->backend = (uint16_t)backend;
            snprintf(e->name, sizeof e->name, "%s", name ? name : "");
            atomic_store_explicit(&hvprof_comm_seq[idx], 0, memory_order_relaxed);
            __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
        }
        atomic_store_explicit(&comm_vals[h], idx + 1, memory_order_release);
        atomic_fetch_add(&hvprof_handle_epoch, 1);
        return idx;
    }
    return HVPROF_COMM_TABLE_CAPACITY - 1;
}

void hvprof_comm_forget(uint64_t handle)
{
    uint32_t h = comm_slot0(handle);
    for (uint32_t probe = 0; probe < COMM_HASH_SLOTS; probe++, h = (h + 1) & (COMM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&comm_keys[h], memory_order_acquire);
        if (k == 0) return;
        if (k == handle) {
            atomic_store_explicit(&comm_keys[h], COMM_TOMBSTONE, memory_order_release);
            atomic_fetch_add(&hvprof_handle_epoch, 1);
            return;
        }
    }
}



int hvprof_sidecar_path(char *out, size_t size, const char *suffix)
{
    const char *raw = hvprof_raw_path();
    const char *ext = ".hvprof";
    size_t n = raw ? strlen(raw) : 0, e = strlen(ext);
    if (n <= e || strcmp(raw + n - e, ext) != 0) return -1;
    int w = snprintf(out, size, "%.*s%s", (int)(n - e), raw, suffix);
    return w >= 0 && (size_t)w < size ? 0 : -1;
}

int hvprof_write_text(const char *path, const char *text)
{
    char tmp[PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
    ok = (close(fd) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

void hvprof_close(uint32_t state_bits)
{
    pthread_mutex_lock(&hvprof_core.lock);
    /* Once per state: a file already closed is not touched again (its rank
     * may have converted it since: the dataset stays up to date). */
    if (hvprof_core.open && hvprof_core.pid == getpid() &&
        (__atomic_load_n(&hvprof_core.hdr->state, __ATOMIC_ACQUIRE) & state_bits) != state_bits) {
        /* What the backends still have in flight (NCCL device times: a
         * bounded wait, never a synchronization of the application's
         * streams), while records are still taken. */
        FOR_EACH_BACKEND(b)
            if (b->finish) b->finish();
        atomic_store(&hvprof_active, 0);
        if (state_bits & HVPROF_STATE_CLOSED) atomic_store(&app_active, 0);
        /* every thread's CPU figures, the helper's among them while it runs */
        if (state_bits & (HVPROF_STATE_CLOSED | HVPROF_STATE_FINALIZED))
            FOR_EACH_BACKEND(b)
                if (b->closed) b->closed((state_bits & HVPROF_STATE_CLOSED) != 0);
        helper_stop();
        calibrate_now();
        agg_snapshot();
        __atomic_or_fetch(&hvprof_core.hdr->state, state_bits, __ATOMIC_RELEASE);
        /* Chunks stay mapped: a thread that passed the active check a moment
         * ago may still be storing its last record. MAP_SHARED pages reach
         * the file without msync; the kernel writes them back. */
    }
    pthread_mutex_unlock(&hvprof_core.lock);
}

/* A forked child inherits the mappings and this thread's TLS: it must never
 * write into the parent's file.  It starts closed; if it calls MPI_Init
 * itself it opens its own file. */
static void atfork_child(void)
{
    atomic_store(&hvprof_active, 0);
    atomic_store(&app_active, 0);
    atomic_store(&hvprof_inflight_table, (hvprof_inflight_entry *)NULL);
    atomic_fetch_add(&hvprof_generation, 1);
    hvprof_t.inflight = NULL; /* the forking thread's: the parent's header */
    hvprof_t.open_rec = NULL;
    if (hvprof_core.fd >= 0) close(hvprof_core.fd);
    hvprof_core.fd = -1;
    hvprof_core.open = 0;
    hvprof_core.hdr = NULL;
    helper_forget();
    hvprof_core.dir[0] = 0;
    hvprof_core.raw_path[0] = 0;
    pthread_mutex_init(&hvprof_core.lock, NULL);
    pthread_mutex_init(&sampling_lock, NULL); /* the helper may have held it */
    FOR_EACH_BACKEND(b)
        if (b->atfork_child) b->atfork_child();
}

__attribute__((constructor)) static void hvprof_ctor(void)
{
    clock_select(); /* before any tick is read: MPI_Init's entry time */
    pthread_key_create(&exit_key, thread_exit);
    pthread_atfork(NULL, NULL, atfork_child);
}

/* The process's exit work, once (after MPI_Finalize, or without it: an
 * NCCL-only job, a C program): drain and close, then the backends' exit
 * hooks (exitmerge.c: rank 0 builds trace.json).  Run by the destructor, or
 * earlier by Python's exit handler once it converted its own file
 * (hvprof_exit_work): a Python process ended by a signal, as after an
 * uncaught KeyboardInterrupt, runs no destructor. */
static void exit_work(void)
{
    static atomic_int done;
    if (!hvprof_core.open || hvprof_core.pid != getpid() || atomic_exchange(&done, 1)) return;
    int rank = hvprof_core.hdr ? hvprof_core.hdr->rank : -1, world = hvprof_core.hdr ? hvprof_core.hdr->world_size : -1;
    FOR_EACH_BACKEND(b)
        if (b->exit_begin) b->exit_begin(rank);
    hvprof_close(HVPROF_STATE_CLOSED);
    FOR_EACH_BACKEND(b)
        if (b->at_exit) b->at_exit(hvprof_core.dir, hvprof_core.raw_path, rank, world);
}

__attribute__((destructor)) static void hvprof_dtor(void) { exit_work(); }

HVPROF_EXPORT void hvprof_exit_work(void) { exit_work(); }

/* A Python rank's exit work starts (activate.finish): the backends' first
 * look at it (exitmerge.c: rank 0 says so if a signal ends it from here). */
HVPROF_EXPORT void hvprof_exit_prepare(void)
{
    static atomic_int done;
    if (!hvprof_core.open || hvprof_core.pid != getpid() || atomic_exchange(&done, 1)) return;
    int rank = hvprof_core.hdr ? hvprof_core.hdr->rank : -1;
    FOR_EACH_BACKEND(b)
        if (b->exit_prepare) b->exit_prepare(hvprof_core.dir, rank);
}

/* ------------------------------------------------------------------------ */
/* Exports for Python (ctypes) and for tools.                                 */

HVPROF_EXPORT int hvprof_is_active(void) { return atomic_load(&hvprof_active); }
HVPROF_EXPORT const char *hvprof_dir(void) { return hvprof_core.open ? hvprof_core.dir : ""; }
HVPROF_EXPORT const char *hvprof_raw_path(void) { return hvprof_core.open ? hvprof_core.raw_path : ""; }
HVPROF_EXPORT int hvprof_rank(void) { return hvprof_core.open ? hvprof_core.hdr->rank : -1; }
HVPROF_EXPORT int hvprof_world_size(void) { return hvprof_core.open ? hvprof_core.hdr->world_size : -1; }
HVPROF_EXPORT uint64_t hvprof_now(void) { return hvprof_ticks(); }
/* hvprof_now()'s ticks per nanosecond (0 before the raw file is open). */
HVPROF_EXPORT double hvprof_ticks_per_ns(void) { return hvprof_core.open ? hvprof_core.hdr->ticks_per_ns : 0.0; }
HVPROF_EXPORT void hvprof_set_python(int on)
{
    hvprof_core.python = on;
    if (hvprof_core.open && hvprof_core.hdr) __atomic_store_n(&hvprof_core.hdr->self_converts, on ? 1u : 0u, __ATOMIC_RELAXED);
}
HVPROF_HIDDEN int hvprof_python_attached(void) { return hvprof_core.python; }
HVPROF_HIDDEN int hvprof_app_active(void) { return atomic_load(&app_active); }

/* Sampling switch for the application (profiler.sampling(on) in Python):
 * while off, calls keep their sequence numbers and are counted as unsampled,
 * not recorded. */
HVPROF_EXPORT void hvprof_set_sampling(int on)
{
    if (hvprof_core.open && hvprof_core.pid == getpid()) set_sampling(on);
}

HVPROF_EXPORT void hvprof_set_enabled(int on)
{
    if (!hvprof_core.open || hvprof_core.pid != getpid()) return;
    if (hvprof_core.hdr->state & HVPROF_STATE_FINALIZED) return;
    atomic_store(&hvprof_active, on ? 1 : 0);
}

/* The helper's flush period from now on, in ms (1 to 60000; 0: no clock
 * ticks, it wakes only when a thread runs short of ready buffers); returns
 * the previous one.  Benchmarks switch it within a run
 * (benchmarks/overhead/ab_corpus.py); a job sets HOROVOD_PROFILE_FLUSH_MS.
 * A longer period widens what a SIGKILL loses and slows the heartbeat. */
HVPROF_EXPORT int hvprof_set_flush_ms(int ms)
{
    if (!hvprof_core.open || hvprof_core.pid != getpid() || ms < 0 || ms > 60000) return -1;
    int was = atomic_exchange(&flush_ms, ms);
    if (ms != was && helper_started) helper_wake(); /* the new period at once */
    return was;
}

HVPROF_EXPORT int hvprof_record_app(int op, uint64_t t_start, uint64_t t_end, uint64_t count,
                                    uint32_t seq)
{
    if (op != HVPROF_OP_APP_STEP && op != HVPROF_OP_APP_MARK && op != HVPROF_OP_APP_SYNC
        && op != HVPROF_OP_APP_JOIN)
        return -1;
    /* Not gated by hvprof_active: app_active is the gate.  No getpid() (a
     * system call per record): a forked child starts with app_active 0
     * (atfork_child). */
    if (!atomic_load(&app_active)) return -1;
    int rc = hvprof_emit_record(&(hvprof_record){
        .t_start = t_start, .t_end = t_end, .bytes = 0, .count = count, .seq = seq,
        .comm = UINT32_MAX, .track = HVPROF_TRACK_SELF, .root = -1, .op = (uint16_t)op,
        .dtype = HVPROF_DT_UNKNOWN, .redop = HVPROF_REDOP_NONE, .flags = 0, .rc = 0,
        .dtype_size = 0, .aux = 0}, 0);
    /* Each thread's CPU and run-queue time over the step: APP_CPU records. */
    if (op == HVPROF_OP_APP_STEP)
        FOR_EACH_BACKEND(b)
            if (b->app_step) b->app_step(seq);
    return rc;
}

/* An APP_SYNC record with the calling thread's schedstat during it (bytes = ns
 * on a CPU, count = ns waiting on a run queue; profiler.collect.steps reads
 * them around Horovod's synchronize).  Gated like hvprof_record_app. */
HVPROF_EXPORT int hvprof_record_app_cpu(int op, uint64_t t_start, uint64_t t_end,
                                        uint64_t cpu_ns, uint64_t wait_ns, uint32_t seq)
{
    if (op != HVPROF_OP_APP_SYNC) return -1;
    if (!atomic_load(&app_active)) return -1;
    return hvprof_emit_record(&(hvprof_record){
        .t_start = t_start, .t_end = t_end, .bytes = cpu_ns, .count = wait_ns, .seq = seq,
        .comm = UINT32_MAX, .track = HVPROF_TRACK_SELF, .root = -1, .op = (uint16_t)op,
        .dtype = HVPROF_DT_UNKNOWN, .redop = HVPROF_REDOP_NONE, .flags = 0, .rc = 0,
        .dtype_size = 0, .aux = 0}, 0);
}

/* One APP_TENSOR record on the calling thread, at the cost of any record;
 * gated like the app records.  aux: the call's buffer folded (0: unknown,
 * hvprof_fold_ptr(NULL) == 0); flags: the operation when the name lacks it. */
static int record_tensor(uint64_t t_start, uint64_t t_end, uint64_t bytes, uint64_t count,
                         uint32_t name_id, int32_t root, uint32_t dtype, uint32_t dtype_size,
                         uint32_t redop, int32_t process_set, uint16_t flags, uint64_t buffer)
{
    if (!atomic_load(&app_active)) return -1; /* as hvprof_record_app */
    return hvprof_emit_record(&(hvprof_record){
        .t_start = t_start, .t_end = t_end, .bytes = bytes, .count = count, .seq = name_id,
        .comm = UINT32_MAX, .track = HVPROF_TRACK_SELF, .root = root,
        .op = HVPROF_OP_APP_TENSOR, .dtype = (uint8_t)dtype, .redop = (uint8_t)redop,
        .flags = flags, .rc = (int16_t)(process_set > 32767 ? 32767 : process_set),
        .dtype_size = dtype_size, .aux = hvprof_fold_ptr((const void *)(uintptr_t)buffer)}, 0);
}

/* A tensor handed to Horovod (profiler.collect.tensors, from Horovod's Python
 * entry points): t_start/t_end around the enqueue, aux its output. */
HVPROF_EXPORT int hvprof_record_tensor(uint64_t t_start, uint64_t t_end, uint64_t bytes,
                                       uint64_t count, uint32_t name_id, int32_t root,
                                       uint32_t dtype, uint32_t dtype_size, uint32_t redop,
                                       int32_t process_set, uint64_t output)
{
    return record_tensor(t_start, t_end, bytes, count, name_id, root, dtype, dtype_size, redop,
                         process_set, 0, output);
}

/* A tensor a TensorFlow kernel of Horovod's hands over (hooks/tf/kernels.cc):
 * the operation in flags (its node name does not say it) and, for aux, the
 * buffer Horovod's call will use when the kernel knows it (a broadcast's
 * root: its input), else 0 (an output not allocated yet). */
HVPROF_EXPORT int hvprof_record_op_tensor(uint64_t t, uint64_t bytes, uint64_t count,
                                          uint32_t name_id, int32_t root, uint32_t dtype,
                                          uint32_t dtype_size, uint32_t redop,
                                          int32_t process_set, uint32_t tensor_op,
                                          uint64_t buffer)
{
    return record_tensor(t, t, bytes, count, name_id, root, dtype, dtype_size, redop,
                         process_set, (uint16_t)((tensor_op & 15u) << HVPROF_TENSOR_OP_SHIFT),
                         buffer);
}

HVPROF_EXPORT void hvprof_process_exit(void)
{
    hvprof_close(HVPROF_STATE_CLOSED);
}

/* The op (HVPROF_OP_*) of the oldest call in flight, 0 when none: the
 * watchdog names it (an MPI_Recv is not a collective). */
HVPROF_EXPORT int hvprof_inflight_oldest_op(void)
{
    hvprof_inflight_entry *tab = atomic_load(&hvprof_inflight_table);
    if (tab == NULL) return 0;
    uint64_t oldest = UINT64_MAX;
    int op = 0;
    for (uint32_t i = 0; i < HVPROF_INFLIGHT_CAPACITY; i++)
        if (__atomic_load_n(&tab[i].state, __ATOMIC_ACQUIRE) && tab[i].t_start < oldest) {
            oldest = tab[i].t_start;
            op = tab[i].op;
        }
    return op;
}

/* The flight recorder's watchdog asks: how long has the oldest collective of
 * this process been in flight (ns; 0 when none)?  Read from the in-flight
 * table, no lock: a call that ends meanwhile reads as in flight once more. */
HVPROF_EXPORT int64_t hvprof_inflight_oldest_ns(void)
{
    hvprof_inflight_entry *tab = atomic_load(&hvprof_inflight_table);
    if (tab == NULL || hvprof_core.hdr == NULL) return 0;
    uint64_t now = hvprof_ticks(), oldest = now;
    for (uint32_t i = 0; i < HVPROF_INFLIGHT_CAPACITY; i++)
        if (__atomic_load_n(&tab[i].state, __ATOMIC_ACQUIRE) && tab[i].t_start < oldest)
            oldest = tab[i].t_start;
    if (oldest >= now) return 0;
    double tpn = hvprof_core.hdr->ticks_per_ns > 0 ? hvprof_core.hdr->ticks_per_ns : 1.0;
    return (int64_t)((double)(now - oldest) / tpn);
}
