/*
 * core.c -- the raw file, per-thread chunks, communicator and track tables,
 * the clock, and the functions Python calls through ctypes.
 *
 * Hot path (hvprof_emit in hvprof_internal.h; the MPI wrappers' fast path in
 * mpi.c: call_slot/call_open/call_close): relaxed loads of a few globals
 * (hvprof_active, hvprof_divert, hvprof_generation, hvprof_handle_epoch),
 * TLS compares, stores into a cache-warm buffer and a release store of the
 * chunk's record count.  No lock, no allocation, no system call, no locked
 * instruction.  Everything else here runs once per thread, per communicator
 * or per chunk (4095 records with the default 256 KiB chunk:
 * HVPROF_DEFAULT_CHUNK_BYTES / HVPROF_RECORD_BYTES - 1 for the chunk header).
 *
 * The core names no backend: mpi.c, nccl.c, cuda_rt.c and the helpers
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

#include "hvprof_internal.h"

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
static _Atomic int app_active = 0;
_Atomic uint32_t hvprof_generation = 1;
hvprof_inflight_entry *_Atomic hvprof_inflight_table = NULL;
_Atomic uint32_t hvprof_handle_epoch = 1;
_Atomic int hvprof_divert = 0;
_Atomic int hvprof_helper_tid = 0;
static void agg_snapshot(void);
static void window_init(void);
static int parse_window(const char *w, double *a, double *b);
/* The helper's flush period: the most a SIGKILL can lose.  Each wake-up
 * costs the job far more than the helper's own tens of microseconds of CPU
 * where ranks share cores (a 2-rank job of 1.2 ms steps lost about 3% of
 * its rate at 25 ms, under 1% at 100 or 250 ms, measured within runs:
 * benchmarks/overhead/ab_corpus.py), so the period trades loss on SIGKILL
 * against that (figures: docs/validation.md). */
#define DEFAULT_FLUSH_MS 100
static void window_tick(int64_t now_mono);
int hvprof_clock_kind = HVPROF_CLOCK_MONOTONIC;

/* Process state: written under the open/close paths only. */
static struct {
    int fd;
    int open;                 /* raw file open (for this process, not a child) */
    int broken;               /* chunk allocation failed: drop from now on */
    int python;               /* a Python runtime converts this rank's file at exit */
    int write_errno;          /* why records were first dropped (0: never) */
    int quiet;                /* MPI ranks: rank 0 reports for the job (mpi.c) */
    char open_error[768];     /* why the last hvprof_open failed ("" if it did not) */
    pid_t pid;
    uint32_t chunk_bytes;
    uint64_t first_chunk_offset;
    hvprof_file_header *hdr;  /* mmapped header + tables */
    size_t meta_bytes;
    char dir[1024];
    char raw_path[PATH_MAX];
    pthread_mutex_t lock;     /* open/close only */
} g = {.fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};

static void helper_start(void);
static uint64_t reserved_chunks; /* chunks with blocks reserved (reserve_chunks; helper only) */
static int reserve_refused;      /* the file system refused once: not asked again */
static void helper_stop(void);
static void signals_install(void);
static pthread_key_t exit_key; /* its destructor hands an exiting thread's buffer over */
static void helper_forget(void);

/* Communicator lookup: open addressing, handle -> table index + 1. */
#define COMM_HASH_SLOTS 4096u
#define COMM_TOMBSTONE UINT64_MAX
static _Atomic uint64_t comm_keys[COMM_HASH_SLOTS];
static _Atomic uint32_t comm_vals[COMM_HASH_SLOTS];
_Atomic uint32_t hvprof_comm_seq[HVPROF_COMM_TABLE_CAPACITY];

/* Stream tracks: the same scheme, stream handle -> track index + 1. */
#define STREAM_HASH_SLOTS 1024u
static _Atomic uint64_t stream_keys[STREAM_HASH_SLOTS];
static _Atomic uint32_t stream_vals[STREAM_HASH_SLOTS];

/* ------------------------------------------------------------------------ */
/* Backend registry.                                                          */

#define MAX_BACKENDS 16
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
static const hvprof_backend *backend_at(uint32_t i)
{
    uint32_t n = atomic_load(&n_backends);
    return i < n && i < MAX_BACKENDS ? atomic_load(&backends[i]) : NULL;
}

#define FOR_EACH_BACKEND(b)                                                   \
    for (uint32_t bi_ = 0; bi_ < MAX_BACKENDS; bi_++)                         \
        for (const hvprof_backend *b = backend_at(bi_); b; b = NULL)

void hvprof_warn(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "horovod-profiler: %s\n", buf);
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
    const char *want = hvprof_setting("HOROVOD_PROFILE_CLOCK");
    int tsc = tsc_invariant() && !(want && strcmp(want, "monotonic") == 0);
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

static void calibrate_now(void)
{
    if (!g.hdr) return;
    int64_t t, m;
    hvprof_clock_pair(&t, &m);
    /* Two 8-byte stores; a reader racing with them sees a pair from a
     * previous calibration at worst -- both pairs are valid. */
    g.hdr->cal1_ticks = t;
    g.hdr->cal1_mono_ns = m;
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
    uint32_t idx = __atomic_fetch_add(&g.hdr->n_tracks, 1, __ATOMIC_RELAXED);
    if (idx >= HVPROF_TRACK_TABLE_CAPACITY - 1) {
        /* The last entry collects every track past capacity. */
        hvprof_track_entry *e = (hvprof_track_entry *)((char *)g.hdr + g.hdr->track_table_offset) +
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
    return (hvprof_track_entry *)((char *)g.hdr + g.hdr->track_table_offset) + idx;
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
    if (!g.hdr) return UINT32_MAX;
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
    if (!g.hdr) return UINT32_MAX;
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
    return (hvprof_comm_entry *)((char *)g.hdr + g.hdr->comm_table_offset) + idx;
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
    if (!g.hdr) return UINT32_MAX;
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
        uint32_t idx = __atomic_fetch_add(&g.hdr->n_comms, 1, __ATOMIC_RELAXED);
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


/* ------------------------------------------------------------------------ */
/* Raw file.                                                                  */

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int env_int(const char *const *names, int fallback)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

/* A process without MPI_Init (NCCL only, horovodrun --gloo) takes its rank
 * from its launcher: MPI's and PMI's first, then Horovod's own (gloo_run.py
 * sets HOROVOD_RANK/SIZE/LOCAL_RANK), then torchrun's and Slurm's. */
static const char *const RANK_VARS[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                        "HOROVOD_RANK", "RANK", "SLURM_PROCID", NULL};
static const char *const SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE",
                                        "WORLD_SIZE", "SLURM_NTASKS", NULL};
static const char *const LOCAL_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                         "HOROVOD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID",
                                         NULL};

/* The default directory name for a job that has no MPI to agree on one
 * (horovodrun --gloo: its rendezvous server's address and port, the same
 * for every rank of the job). */
static void default_dir_from_env(char *out, size_t n)
{
    static const char *const ids[] = {"TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "PMI_KVSNAME",
                                      "OMPI_MCA_orte_hnp_uri", "SLURM_JOB_ID", "MASTER_PORT",
                                      "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                                      "HOROVOD_GLOO_RENDEZVOUS_PORT", NULL};
    uint64_t h = 0;
    int found = 0;
    for (const char *const *v = ids; *v; v++) {
        const char *s = getenv(*v);
        if (!s) continue;
        found = 1;
        for (; *s; s++) h = hvprof_mix(h, (unsigned char)*s);
    }
    if (!found) h = hvprof_mix((uint64_t)getppid(), (uint64_t)time(NULL) / 3600);
    snprintf(out, n, "horovod-profile-%012llx", (unsigned long long)(h & 0xffffffffffffull));
}

static size_t meta_region_bytes(void)
{
    return HVPROF_HEADER_BYTES + (size_t)64 * HVPROF_COMM_TABLE_CAPACITY +
           (size_t)64 * HVPROF_TRACK_TABLE_CAPACITY;
}

/* hvprof_open's way out when the file cannot be made (g.lock held): keep the
 * reason (hvprof_open_error); an MPI job reports for every rank at once (mpi.c:
 * rank 0, one line); otherwise (NCCL-only jobs) rank 0 says it for itself, the
 * others stay quiet (their ranks show as missing in the merge).  Clears the
 * paths, releases the lock. */
__attribute__((format(printf, 2, 3))) static int open_failed(int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.open_error, sizeof g.open_error, fmt, ap);
    va_end(ap);
    if (!g.quiet && rank == 0) hvprof_warn("%s: profiling is off for rank 0", g.open_error);
    g.dir[0] = 0;
    g.raw_path[0] = 0;
    pthread_mutex_unlock(&g.lock);
    return -1;
}

/* The HOROVOD_PROFILE_* settings the library reads: a value it cannot use is
 * said once (rank 0), with what is done instead; the job never stops for it. */
static int one_of(const char *v, const char *const *allowed)
{
    for (; *allowed; allowed++)
        if (strcmp(v, *allowed) == 0) return 1;
    return 0;
}

static int int_in(const char *v, long lo, long hi)
{
    char *end = NULL;
    long x = strtol(v, &end, 10);
    return end != v && *end == 0 && x >= lo && x <= hi;
}

static void env_check(int rank)
{
    if (rank != 0) return;
    static const char *const modes[] = {"1", "on", "true", "yes", "full", "summary", NULL};
    static const char *const bools[] = {"0", "1", NULL};
    static const char *const clocks[] = {"tsc", "monotonic", "auto", NULL};
    static const char *const syncs[] = {"host", "rank", NULL};
    static const char *const timeline[] = {"0", "off", "1", "on", NULL};
    const char *v;
    if ((v = hvprof_setting("HOROVOD_PROFILE")) && *v && !one_of(v, modes))
        hvprof_warn("warning: HOROVOD_PROFILE=%.64s is not 1 or summary: recording every call",
                    v);
    if ((v = hvprof_setting("HOROVOD_PROFILE_CHUNK_KB")) && !int_in(v, 4, 1 << 20))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_CHUNK_KB=%.64s (KiB, 4 to 1048576): "
                    "using %u", v, HVPROF_DEFAULT_CHUNK_BYTES / 1024u);
    if ((v = hvprof_setting("HOROVOD_PROFILE_FLUSH_MS")) && !int_in(v, 1, 60000))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_FLUSH_MS=%.64s (1 to 60000): using %d",
                    v, DEFAULT_FLUSH_MS);
    if ((v = hvprof_setting("HOROVOD_PROFILE_CPU")) && !int_in(v, 0, HVPROF_CPU_MAX_EVERY))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_CPU=%.64s (0 to %d: one step in how "
                    "many is read after the first %d; 0: none): using %d", v,
                    HVPROF_CPU_MAX_EVERY, HVPROF_CPU_FIRST_STEPS, HVPROF_CPU_DEFAULT_EVERY);
    if ((v = hvprof_setting("HOROVOD_PROFILE_HELPER")) && !one_of(v, bools))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_HELPER=%.64s (0 or 1)", v);
    if ((v = hvprof_setting("HOROVOD_PROFILE_SIGNALS")) && !one_of(v, bools))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_SIGNALS=%.64s (0 or 1)", v);
    if ((v = hvprof_setting("HOROVOD_PROFILE_CLOCK")) && !one_of(v, clocks))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_CLOCK=%.64s (tsc or monotonic)", v);
    if ((v = hvprof_setting("HOROVOD_PROFILE_CLOCK_SYNC")) && !one_of(v, syncs))
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_CLOCK_SYNC=%.64s (host or rank)", v);
    if ((v = hvprof_setting("HOROVOD_PROFILE_TIMELINE")) && !one_of(v, timeline))
        hvprof_warn("warning: HOROVOD_PROFILE_TIMELINE=%.64s is not 0 or 1: Horovod's "
                    "timeline is not written", v);
    double a, b;
    if ((v = hvprof_setting("HOROVOD_PROFILE_WINDOW")) && *v &&
        parse_window(v, &a, &b) != 0)
        hvprof_warn("warning: ignoring HOROVOD_PROFILE_WINDOW=%.64s (A:B seconds after start, "
                    "0 <= A < B; A: to the end): recording the whole run", v);
}

const char *hvprof_open_error(void) { return g.open_error; }
int hvprof_write_errno(void) { return g.write_errno; }
void hvprof_set_quiet(int on) { g.quiet = on; }

/* The profile directory: the caller's (MPI: rank 0's choice), else
 * HOROVOD_PROFILE_DIR, else a name derived from the launcher's environment. */
static void choose_dir(const char *dir)
{
    if (dir && *dir) {
        snprintf(g.dir, sizeof g.dir, "%s", dir);
    } else {
        const char *d = hvprof_setting("HOROVOD_PROFILE_DIR");
        if (d && *d) snprintf(g.dir, sizeof g.dir, "%s", d);
        else default_dir_from_env(g.dir, sizeof g.dir);
    }
}

/* Create <dir>/raw/rank-R.hvprof, reserve and map its metadata region
 * (header + tables).  The header, or NULL after open_failed (g.lock
 * released); *fd_out: the file. */
static hvprof_file_header *create_raw_file(int rank, size_t meta, int *fd_out)
{
    char rawdir[1100];
    snprintf(rawdir, sizeof rawdir, "%s/raw", g.dir);
    mode_t old = umask(022);
    if (mkdir_p(rawdir, 0755) != 0) {
        umask(old);
        open_failed(rank, "cannot create %s (%s)", rawdir, strerror(errno));
        return NULL;
    }
    snprintf(g.raw_path, sizeof g.raw_path, "%s/rank-%05d.hvprof", rawdir, rank);
    int fd = open(g.raw_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    umask(old);
    int ferr = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)meta); /* returns the error */
    if (ferr != 0) {
        if (fd >= 0) close(fd);
        open_failed(rank, "cannot write %s (%s)", g.raw_path, strerror(ferr));
        return NULL;
    }
    void *m = mmap(NULL, meta, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        open_failed(rank, "cannot map %s (%s)", g.raw_path, strerror(e));
        return NULL;
    }
    *fd_out = fd;
    return (hvprof_file_header *)m;
}

/* Bytes per chunk (= per-thread buffer): HOROVOD_PROFILE_CHUNK_KB when
 * usable, else the default; whole pages. */
static uint32_t chunk_bytes_setting(void)
{
    uint32_t chunk = HVPROF_DEFAULT_CHUNK_BYTES;
    const char *ck = hvprof_setting("HOROVOD_PROFILE_CHUNK_KB");
    if (ck && int_in(ck, 4, 1 << 20)) chunk = (uint32_t)atol(ck) * 1024u;
    long page = sysconf(_SC_PAGESIZE);
    return (uint32_t)((chunk + page - 1) / page * page);
}

/* Fill a fresh header (the clock is calibrated here: ~2 ms with the TSC).
 * The magic is stored last: a reader sees a whole header or none. */
static void header_init(hvprof_file_header *h, int rank, int world_size, int local_rank,
                        uint32_t chunk, size_t meta)
{
    memset(h, 0, HVPROF_HEADER_BYTES);
    const char *mode = hvprof_setting("HOROVOD_PROFILE");
    h->mode = (mode && strcmp(mode, "summary") == 0) ? HVPROF_MODE_SUMMARY : HVPROF_MODE_FULL;
    h->sampling = 1;
    h->version = HVPROF_FORMAT_VERSION;
    h->header_bytes = HVPROF_HEADER_BYTES;
    h->record_bytes = HVPROF_RECORD_BYTES;
    h->chunk_bytes = chunk;
    h->comm_table_offset = HVPROF_HEADER_BYTES;
    h->comm_table_capacity = HVPROF_COMM_TABLE_CAPACITY;
    h->track_table_offset = HVPROF_HEADER_BYTES + 64 * HVPROF_COMM_TABLE_CAPACITY;
    h->track_table_capacity = HVPROF_TRACK_TABLE_CAPACITY;
    h->inflight_offset = HVPROF_INFLIGHT_OFFSET;
    h->inflight_capacity = HVPROF_INFLIGHT_CAPACITY;
    h->first_chunk_offset = meta;
    h->rank = rank;
    h->world_size = world_size;
    h->local_rank = local_rank;
    h->pid = (int32_t)getpid();
    h->self_converts = g.python ? 1u : 0u;
    h->thread_level = -1;
    h->clock_kind = (uint32_t)hvprof_clock_kind;
    h->ticks_per_ns = hvprof_clock_init(&h->cal0_ticks, &h->cal0_mono_ns, &h->cal0_realtime_ns);
    h->clock_kind = (uint32_t)hvprof_clock_kind;
    h->cal1_ticks = h->cal0_ticks;
    h->cal1_mono_ns = h->cal0_mono_ns;
    gethostname(h->hostname, sizeof h->hostname - 1);
    memcpy(h->magic, HVPROF_MAGIC, 8); /* last: a reader sees a whole header */
    __atomic_store_n(&h->state, HVPROF_STATE_OPEN, __ATOMIC_RELEASE);
}

/* The file is ready: adopt it, forget the previous file's tables (stale TLS
 * chunks and cached handles are dropped through the generation and epoch),
 * switch recording on, start the helper thread (g.lock held). */
static void start_recording(int fd, hvprof_file_header *h, size_t meta, uint32_t chunk, int rank)
{
    g.fd = fd;
    g.hdr = h;
    atomic_store(&hvprof_inflight_table,
                 (hvprof_inflight_entry *)((char *)h + HVPROF_INFLIGHT_OFFSET));
    g.meta_bytes = meta;
    g.chunk_bytes = chunk;
    g.first_chunk_offset = meta;
    g.broken = 0;
    g.write_errno = 0;
    reserved_chunks = 0;
    reserve_refused = 0;
    g.pid = getpid();
    g.open = 1;
    memset(comm_keys, 0, sizeof comm_keys);
    memset(comm_vals, 0, sizeof comm_vals);
    memset(stream_keys, 0, sizeof stream_keys);
    memset(stream_vals, 0, sizeof stream_vals);
    atomic_fetch_add(&hvprof_handle_epoch, 1);
    atomic_fetch_add(&hvprof_generation, 1);
    FOR_EACH_BACKEND(b)
        if (b->reset) b->reset();
    window_init();
    env_check(rank);
    atomic_store(&hvprof_divert, !h->sampling ? HVPROF_DIVERT_PAUSED
                                 : h->mode == HVPROF_MODE_SUMMARY ? HVPROF_DIVERT_SUMMARY : 0);
    atomic_store(&hvprof_active, 1);
    atomic_store(&app_active, 1);
    helper_start();
    signals_install();
    FOR_EACH_BACKEND(b) /* every thread's CPU figures at start, the cpu sidecar */
        if (b->opened) b->opened();
}

int hvprof_open(int rank, int world_size, int local_rank, const char *dir)
{
    pthread_mutex_lock(&g.lock);
    if (g.open && g.pid == getpid()) {
        /* Already open (NCCL first, MPI later): fill in what is now known. */
        if (rank >= 0) g.hdr->rank = rank;
        if (world_size > 0) g.hdr->world_size = world_size;
        if (local_rank >= 0) g.hdr->local_rank = local_rank;
        pthread_mutex_unlock(&g.lock);
        return 0;
    }
    if (rank < 0) rank = env_int(RANK_VARS, -1);
    if (world_size < 0) world_size = env_int(SIZE_VARS, -1);
    if (local_rank < 0) local_rank = env_int(LOCAL_VARS, -1);
    if (rank < 0) rank = 0;

    choose_dir(dir);
    g.open_error[0] = 0;
    size_t meta = meta_region_bytes();
    int fd = -1;
    hvprof_file_header *h = create_raw_file(rank, meta, &fd);
    if (!h) return -1; /* open_failed said why and released the lock */
    uint32_t chunk = chunk_bytes_setting();
    header_init(h, rank, world_size, local_rank, chunk, meta);
    start_recording(fd, h, meta, chunk, rank);
    pthread_mutex_unlock(&g.lock);
    return 0;
}

hvprof_file_header *hvprof_header(void) { return g.open ? g.hdr : NULL; }

/* ------------------------------------------------------------------------ */
/* Chunk supply.  A thread writes its records into an anonymous, cache-warm
 * buffer laid out exactly like a file chunk (64-byte header + slots).  A
 * helper thread ("hvprof-io") copies what is new in every live buffer into
 * the buffer's chunk of the raw file with pwrite every few milliseconds
 * (HOROVOD_PROFILE_FLUSH_MS, default 100), recycles full buffers, and keeps a
 * few fresh ones ready.  The calling thread never makes a system call for a
 * record, and the kernel's page-cache work runs on the helper.  A rank
 * killed with SIGKILL loses at most the records of the last flush interval.
 * Without the helper (HOROVOD_PROFILE_HELPER=0, or it failed to start), a
 * thread flushes its own buffer when it is full.                           */

/* Ready buffers.  The helper keeps FREE_TARGET of them (free_target); the
 * queue holds more than that, so that a recycled buffer always finds a slot
 * (no munmap of a buffer only to mmap a fresh one).  A thread that takes one
 * and leaves fewer than FREE_LOW wakes the helper; otherwise full buffers
 * wait for its next tick (within the flush period, like the live ones), and
 * a thread pays no futex call per chunk.  When the queue is empty the thread
 * maps a buffer itself (an mmap that zeroes 256 KiB, ~50 us).  Counted in a
 * 0-byte loop of 74 chunks: with 8 ready (once a chunk was taken) and a wake
 * under 3, the thread mapped 11-29 itself; with 12 from the start, a wake
 * under 6 and a bounded top-up (helper_main), 1-3 when the helper gets a
 * core, more when other work keeps it off one. */
#define FREE_SLOTS 32u
#define FREE_TARGET 12u
#define FREE_LOW 6u
#define FULL_SLOTS 256u
#define MAX_BUFFERS 512u /* x chunk_bytes: the profiler's memory bound */
static _Atomic uintptr_t freeq[FREE_SLOTS];
static _Atomic int n_free; /* buffers in freeq */
static _Atomic uintptr_t fullq[FULL_SLOTS];
static _Atomic uintptr_t live[HVPROF_TRACK_TABLE_CAPACITY];
static _Atomic int n_buffers;
static _Atomic int helper_run;
static _Atomic uint32_t helper_futex;
static pthread_t helper_thread;
static int helper_started;
static _Atomic int flush_ms = DEFAULT_FLUSH_MS; /* 0: no clock ticks (hvprof_set_flush_ms) */

/* Flusher-private progress of a buffer: records already in the file. */
#define FLUSHED(ch) ((ch)->reserved[0])

static void helper_wake(void)
{
    atomic_fetch_add(&helper_futex, 1);
    syscall(SYS_futex, &helper_futex, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static hvprof_chunk_header *buffer_new(void)
{
    if (atomic_fetch_add(&n_buffers, 1) >= (int)MAX_BUFFERS) {
        atomic_fetch_sub(&n_buffers, 1);
        return NULL;
    }
    void *m = mmap(NULL, g.chunk_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) {
        atomic_fetch_sub(&n_buffers, 1);
        return NULL;
    }
    return (hvprof_chunk_header *)m;
}

static hvprof_chunk_header *free_take(void)
{
    for (uint32_t i = 0; i < FREE_SLOTS; i++) {
        uintptr_t c = atomic_load_explicit(&freeq[i], memory_order_acquire);
        if (c && atomic_compare_exchange_strong(&freeq[i], &c, 0)) {
            atomic_fetch_sub(&n_free, 1);
            return (hvprof_chunk_header *)c;
        }
    }
    return NULL;
}

static int free_put(hvprof_chunk_header *ch)
{
    for (uint32_t i = 0; i < FREE_SLOTS; i++) {
        uintptr_t expect = 0;
        if (atomic_compare_exchange_strong(&freeq[i], &expect, (uintptr_t)ch)) {
            atomic_fetch_add(&n_free, 1);
            return 0;
        }
    }
    return -1;
}

/* pwrite every byte: a short write (the disk filled, RLIMIT_FSIZE reached)
 * is retried for the rest, which then fails with the real reason (ENOSPC,
 * EFBIG, EIO...).  Returns 0 or that errno. */
static int pwrite_all(const void *buf, size_t len, off_t off)
{
    const char *p = (const char *)buf;
    while (len > 0) {
        ssize_t w = pwrite(g.fd, p, len, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno ? errno : EIO;
        }
        if (w == 0) return ENOSPC; /* no progress and no reason given */
        p += w;
        len -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Write what is new in one buffer to its chunk of the file: the records,
 * then the chunk header with the new count, so the file is consistent at
 * every moment.  Called by the helper, or by the owner without a helper. */
static void buffer_flush(hvprof_chunk_header *ch)
{
    uint64_t n = __atomic_load_n(&ch->nrec, __ATOMIC_ACQUIRE);
    uint64_t done = FLUSHED(ch);
    if (n <= done) return;
    if (g.broken) {
        __atomic_fetch_add(&g.hdr->dropped_records, n - done, __ATOMIC_RELAXED);
        FLUSHED(ch) = n;
        return;
    }
    off_t base = (off_t)(g.first_chunk_offset + ch->index * g.chunk_bytes);
    const char *recs = (const char *)ch + HVPROF_RECORD_BYTES;
    size_t len = (size_t)(n - done) * HVPROF_RECORD_BYTES;
    off_t off = base + (off_t)HVPROF_RECORD_BYTES * (off_t)(done + 1);
    hvprof_chunk_header h = {HVPROF_CHUNK_MAGIC, ch->track, n, ch->index, {0}};
    int err = pwrite_all(recs + done * HVPROF_RECORD_BYTES, len, off);
    if (!err) err = pwrite_all(&h, sizeof h, base);
    if (err) {
        g.broken = 1;
        g.write_errno = err;
        __atomic_or_fetch(&g.hdr->state, HVPROF_STATE_TRUNCATED, __ATOMIC_RELAXED);
        __atomic_fetch_add(&g.hdr->dropped_records, n - done, __ATOMIC_RELAXED);
        /* Said once, at once, by rank 0 (or by a process on its own); MPI_Finalize
         * then says what the whole job lost. */
        if (!g.quiet || g.hdr->rank == 0)
            hvprof_warn("rank %d: cannot write %s (%s): further records are dropped and "
                        "counted", g.hdr->rank, g.raw_path, strerror(err));
    }
    FLUSHED(ch) = n;
}

static void flush_all(void)
{
    for (uint32_t i = 0; i < FULL_SLOTS; i++) {
        uintptr_t c = atomic_exchange(&fullq[i], 0);
        if (!c) continue;
        hvprof_chunk_header *ch = (hvprof_chunk_header *)c;
        buffer_flush(ch);
        if (free_put(ch) != 0) {
            munmap(ch, g.chunk_bytes);
            atomic_fetch_sub(&n_buffers, 1);
        }
    }
    uint32_t n = g.hdr->n_tracks < HVPROF_TRACK_TABLE_CAPACITY ? g.hdr->n_tracks
                                                               : HVPROF_TRACK_TABLE_CAPACITY;
    for (uint32_t i = 0; i < n; i++) {
        uintptr_t c = atomic_load_explicit(&live[i], memory_order_acquire);
        if (c) buffer_flush((hvprof_chunk_header *)c);
    }
}

/* A full buffer (or the buffer of a thread that exits) goes to the helper. */
static void retire(hvprof_chunk_header *ch, uint32_t track)
{
    if (track < HVPROF_TRACK_TABLE_CAPACITY) {
        uintptr_t expect = (uintptr_t)ch;
        atomic_compare_exchange_strong(&live[track], &expect, 0);
    }
    for (uint32_t i = 0; helper_started && i < FULL_SLOTS; i++) {
        uintptr_t expect = 0;
        if (atomic_compare_exchange_strong(&fullq[i], &expect, (uintptr_t)ch)) {
            if (atomic_load_explicit(&n_free, memory_order_relaxed) < (int)FREE_LOW) helper_wake();
            return;
        }
    }
    buffer_flush(ch); /* no helper, or its queue is full: do it here */
    if (free_put(ch) != 0) {
        munmap(ch, g.chunk_bytes);
        atomic_fetch_sub(&n_buffers, 1);
    }
}

/* How many ready buffers the helper keeps: FREE_TARGET when recording one
 * record per call, from the start (3 MiB mapped by the helper at its first
 * tick, so that the first chunks are not mapped by the calling threads);
 * in summary mode, where only app records (steps) take chunks, one once a
 * chunk was taken. */
static int free_target(uint64_t chunks)
{
    if (g.hdr->mode == HVPROF_MODE_FULL) return (int)FREE_TARGET;
    return chunks ? 1 : 0;
}

/* Blocks for the chunks taken so far, reserved in one fallocate per tick
 * before their first write (FALLOC_FL_KEEP_SIZE: the file's size is still
 * what was written).  Measured on ext4 here: pwrite of 256 KiB pieces of a
 * new file costs the helper ~21 ns of CPU per 64-byte record, ~15 ns when the
 * range was reserved first (the file system maps one extent instead of
 * reserving block by block).  Only chunks already taken are reserved, so no
 * block is left past the file's end (at most the unwritten tail of each
 * thread's last chunk).  A file system that refuses (no fallocate, no space,
 * RLIMIT_FSIZE is not checked with KEEP_SIZE) is not asked again: writes go
 * on as before and fail, if they fail, with the real reason. */
static void reserve_chunks(uint64_t chunks)
{
    if (reserve_refused || g.broken || chunks <= reserved_chunks) return;
    off_t from = (off_t)(g.first_chunk_offset + reserved_chunks * g.chunk_bytes);
    off_t len = (off_t)((chunks - reserved_chunks) * g.chunk_bytes);
    if (fallocate(g.fd, FALLOC_FL_KEEP_SIZE, from, len) != 0) reserve_refused = 1;
    else reserved_chunks = chunks;
}

/* The helper runs where the launcher could run anything, not only on the
 * rank's own core: Open MPI binds each rank to a core (at 1 or 2 ranks by
 * default) and a thread inherits its creator's binding, so a rank's helper
 * competed with that rank for one core while others idled.  The set
 * is the parent process's affinity (mpirun's daemon, slurmstepd, the shell:
 * what the user gave the job, isolated cores excluded) when it contains the
 * rank's own; otherwise, or when anything fails, the inherited one stays. */
static void helper_spread(void)
{
    cpu_set_t mine, parent;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) return;
    if (sched_getaffinity(getppid(), sizeof parent, &parent) != 0) return;
    cpu_set_t both;
    CPU_AND(&both, &mine, &parent);
    if (!CPU_EQUAL(&both, &mine) || CPU_EQUAL(&parent, &mine)) return;
    sched_setaffinity(0, sizeof parent, &parent);
}

/* The helper's own CPU time so far, into the header (helper_cpu_ns). */
static void helper_cpu_store(void)
{
    struct timespec ts;
    if (g.hdr && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
        __atomic_store_n(&g.hdr->helper_cpu_ns, (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec,
                         __ATOMIC_RELAXED);
}

static void *helper_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* the application's signals are not ours */
    atomic_store(&hvprof_helper_tid, (int)syscall(SYS_gettid));
    helper_spread();
    int64_t last_cal = hvprof_mono_ns();
    for (;;) {
        int run = atomic_load(&helper_run);
        uint32_t seen = atomic_load(&helper_futex);
        uint64_t chunks = __atomic_load_n(&g.hdr->n_chunks, __ATOMIC_RELAXED);
        reserve_chunks(chunks);
        flush_all();
        int target = free_target(chunks);
        /* at most the shortfall seen now: were it "until the queue is
         * full", a thread taking buffers as fast as they come would keep the
         * helper mapping new ones, its full buffers never recycled */
        for (int k = target - atomic_load(&n_free); run && k > 0; k--) {
            hvprof_chunk_header *c = buffer_new();
            if (!c) break;
            if (free_put(c) != 0) {
                munmap(c, g.chunk_bytes);
                atomic_fetch_sub(&n_buffers, 1);
                break;
            }
        }
        int64_t now = hvprof_mono_ns();
        window_tick(now);
        if (now - last_cal > 1000000000LL) {
            calibrate_now();
            agg_snapshot();
            last_cal = now;
        }
        helper_cpu_store();
        if (!run) break; /* drained once more after the stop request */
        int ms = atomic_load(&flush_ms);
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        syscall(SYS_futex, &helper_futex, FUTEX_WAIT_PRIVATE, seen, ms > 0 ? &ts : NULL, NULL, 0);
    }
    return NULL;
}

static void thread_exit(void *arg)
{
    /* The thread's buffer stays readable: hand it to the helper. */
    hvprof_tls *t = &hvprof_t;
    (void)arg;
    hvprof_abandon_open(); /* a thread cancelled inside a call */
    if (t->slots && t->generation == atomic_load(&hvprof_generation) && g.hdr) {
        retire((hvprof_chunk_header *)((char *)t->slots - HVPROF_RECORD_BYTES), t->track);
        t->slots = NULL;
        t->capacity = t->used = 0;
    }
}

/* Fatal signals: write what the buffers hold, then let the signal do what it
 * would have done (the previous handler, Open MPI's backtrace printer for
 * instance, or the default action).  pwrite is async-signal-safe; a flush
 * racing the helper writes the same bytes at the same offsets.  SIGINT only
 * where nobody handles it (Python does, and exits through its exit path). */
static const int fatal_signals[] = {SIGTERM, SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGINT};
#define N_FATAL (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction old_actions[N_FATAL];
static int signals_installed;

static void flush_for_signal(void)
{
    if (!g.hdr || g.pid != getpid()) return;
    for (uint32_t i = 0; i < FULL_SLOTS; i++) {
        uintptr_t c = atomic_load(&fullq[i]);
        if (c) buffer_flush((hvprof_chunk_header *)c);
    }
    uint32_t n = g.hdr->n_tracks < HVPROF_TRACK_TABLE_CAPACITY ? g.hdr->n_tracks
                                                               : HVPROF_TRACK_TABLE_CAPACITY;
    for (uint32_t i = 0; i < n; i++) {
        uintptr_t c = atomic_load(&live[i]);
        if (c) buffer_flush((hvprof_chunk_header *)c);
    }
    calibrate_now();
}

static void on_fatal_signal(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    flush_for_signal();
    errno = saved;
    for (size_t i = 0; i < N_FATAL; i++) {
        if (fatal_signals[i] != sig) continue;
        struct sigaction *old = &old_actions[i];
        if (old->sa_flags & SA_SIGINFO) {
            if (old->sa_sigaction) { old->sa_sigaction(sig, info, ctx); return; }
        } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
            old->sa_handler(sig);
            return;
        } else if (old->sa_handler == SIG_IGN) {
            return;
        }
        /* default action: restore it and deliver the signal again */
        sigaction(sig, old, NULL);
        raise(sig);
        return;
    }
}

int hvprof_signal_ends_process(int sig)
{
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0) return 0;
    if (!(cur.sa_flags & SA_SIGINFO)) return cur.sa_handler == SIG_DFL;
    if (cur.sa_sigaction != on_fatal_signal) return 0;
    for (size_t i = 0; i < N_FATAL; i++)
        if (fatal_signals[i] == sig)
            return !(old_actions[i].sa_flags & SA_SIGINFO) && old_actions[i].sa_handler == SIG_DFL;
    return 0;
}

static void signals_install(void)
{
    const char *v = hvprof_setting("HOROVOD_PROFILE_SIGNALS");
    if (signals_installed || (v && strcmp(v, "0") == 0)) return;
    for (size_t i = 0; i < N_FATAL; i++) {
        struct sigaction sa, old;
        if (sigaction(fatal_signals[i], NULL, &old) != 0) continue;
        if (fatal_signals[i] == SIGINT && (old.sa_flags & SA_SIGINFO || old.sa_handler != SIG_DFL))
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fatal_signal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | (old.sa_flags & SA_RESTART);
        sigemptyset(&sa.sa_mask);
        old_actions[i] = old;
        sigaction(fatal_signals[i], &sa, NULL);
    }
    signals_installed = 1;
}

static void helper_start(void)
{
    const char *ms = hvprof_setting("HOROVOD_PROFILE_FLUSH_MS");
    if (ms && int_in(ms, 1, 60000)) atomic_store(&flush_ms, atoi(ms));
    if (helper_started) return;
    const char *v = hvprof_setting("HOROVOD_PROFILE_HELPER");
    if (v && strcmp(v, "0") == 0) return; /* everything on the calling threads */
    atomic_store(&helper_run, 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    if (pthread_create(&helper_thread, &attr, helper_main, NULL) == 0) {
        pthread_setname_np(helper_thread, "hvprof-io");
        helper_started = 1;
    }
    pthread_attr_destroy(&attr);
}

/* In a forked child: the helper thread was not copied, and the parent's
 * buffers are not the child's to flush. */
static void helper_forget(void)
{
    helper_started = 0;
    atomic_store(&helper_run, 0);
    for (uint32_t i = 0; i < FREE_SLOTS; i++) atomic_store(&freeq[i], 0);
    for (uint32_t i = 0; i < FULL_SLOTS; i++) atomic_store(&fullq[i], 0);
    for (uint32_t i = 0; i < HVPROF_TRACK_TABLE_CAPACITY; i++) atomic_store(&live[i], 0);
    atomic_store(&n_buffers, 0);
}

/* Stop the helper after a last drain; without one, drain here. */
static void helper_stop(void)
{
    if (helper_started) {
        atomic_store(&helper_run, 0);
        helper_wake();
        pthread_join(helper_thread, NULL);
        helper_started = 0;
    } else if (g.hdr) {
        flush_all();
    }
}

/* ------------------------------------------------------------------------ */
/* Summary mode and sampling.                                                 */

#define AGG_SLOTS 2048u
#define AGG_PROBES 32u
static _Atomic uintptr_t agg_tables[HVPROF_TRACK_TABLE_CAPACITY];
static _Atomic uint64_t agg_overflow;
static int64_t window_start_ns = -1, window_end_ns = -1; /* CLOCK_MONOTONIC */

/* Recording is on when every switch says so: the application's
 * (profiler.sampling()/paused() and HOROVOD_PROFILE_SAMPLE_STEPS, combined in
 * Python, hvprof_set_sampling) and the time window (HOROVOD_PROFILE_WINDOW,
 * switched by the helper thread).  Neither overrides the other. */
static pthread_mutex_t sampling_lock = PTHREAD_MUTEX_INITIALIZER;
static int sampling_app = 1, sampling_window = 1;

static void sampling_apply(void) /* sampling_lock held */
{
    if (!g.hdr) return;
    int on = sampling_app && sampling_window;
    g.hdr->sampling = on ? 1u : 0u;
    atomic_store(&hvprof_divert, !on ? HVPROF_DIVERT_PAUSED
                                 : g.hdr->mode == HVPROF_MODE_SUMMARY ? HVPROF_DIVERT_SUMMARY : 0);
}

static void set_sampling(int on)
{
    pthread_mutex_lock(&sampling_lock);
    sampling_app = on ? 1 : 0;
    sampling_apply();
    pthread_mutex_unlock(&sampling_lock);
}

static int window_on(int64_t now)
{
    return now >= window_start_ns && (window_end_ns < 0 || now < window_end_ns);
}

/* HOROVOD_PROFILE_WINDOW="A:B": record from A to B seconds after the file
 * was opened (B empty: to the end); the helper thread switches.  Parses "A:B",
 * "A:" or "A" (seconds, 0 <= A < B): 0, else -1 (the window is ignored, with
 * a warning from env_check). */
static int parse_window(const char *w, double *a, double *b)
{
    char *end = NULL;
    *a = strtod(w, &end);
    *b = -1;
    if (end == w || !(*a >= 0) || *a > 1e9) return -1;
    if (*end == 0) return 0;
    if (*end != ':') return -1;
    const char *rest = end + 1;
    if (*rest == 0) return 0;
    *b = strtod(rest, &end);
    return end != rest && *end == 0 && *b > *a && *b <= 1e9 ? 0 : -1;
}

static void window_init(void)
{
    const char *w = hvprof_setting("HOROVOD_PROFILE_WINDOW");
    double a = 0, b = -1;
    pthread_mutex_lock(&sampling_lock);
    window_start_ns = window_end_ns = -1;
    sampling_app = sampling_window = 1;
    if (w && *w && parse_window(w, &a, &b) == 0) {
        int64_t t0 = g.hdr->cal0_mono_ns;
        window_start_ns = t0 + (int64_t)(a * 1e9);
        window_end_ns = b >= 0 ? t0 + (int64_t)(b * 1e9) : -1;
        sampling_window = window_on(t0);
    }
    sampling_apply();
    pthread_mutex_unlock(&sampling_lock);
}

static void window_tick(int64_t now)
{
    if (window_start_ns < 0 || !g.hdr) return;
    int on = window_on(now);
    if (on == sampling_window) return; /* only the helper writes it after init */
    pthread_mutex_lock(&sampling_lock);
    sampling_window = on;
    sampling_apply();
    pthread_mutex_unlock(&sampling_lock);
}

void hvprof_divert_call(uint16_t op, uint32_t comm, uint64_t bytes, uint8_t dtype, uint8_t redop,
                        uint16_t flags, int rc, uint64_t t0, uint64_t t1)
{
    hvprof_file_header *h = g.hdr;
    if (!h) return;
    if (!h->sampling) {
        __atomic_fetch_add(&h->unsampled_calls, 1, __ATOMIC_RELAXED);
        return;
    }
    hvprof_tls *t = &hvprof_t;
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_relaxed);
    if (HVPROF_UNLIKELY(!t->agg || t->agg_generation != gen)) {
        uint32_t track = hvprof_track_self();
        void *m = mmap(NULL, AGG_SLOTS * sizeof(hvprof_agg_entry), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || track >= HVPROF_TRACK_TABLE_CAPACITY) {
            __atomic_fetch_add(&h->dropped_records, 1, __ATOMIC_RELAXED);
            return;
        }
        t->agg = m;
        t->agg_last = NULL;
        t->agg_generation = gen;
        atomic_store_explicit(&agg_tables[track], (uintptr_t)m, memory_order_release);
    }
    uint64_t d = t1 - t0;
    /* The same (op, communicator, size, datatype, reduction) as this thread's
     * previous call: its entry, without hashing (3 mixes) and probing. */
    hvprof_agg_entry *last = (hvprof_agg_entry *)t->agg_last;
    if (HVPROF_LIKELY(last && last->bytes == bytes && last->op == op && last->comm == comm &&
                      last->dtype == dtype && last->redop == redop)) {
        hvprof_agg_add(last, d, flags, rc);
        return;
    }
    hvprof_agg_entry *tab = (hvprof_agg_entry *)t->agg;
    uint64_t key = hvprof_mix(hvprof_mix(hvprof_mix(op, comm), bytes), (uint64_t)dtype << 8 | redop);
    for (uint32_t i = 0; i < AGG_PROBES; i++) {
        hvprof_agg_entry *e = &tab[(key + i) & (AGG_SLOTS - 1)];
        uint64_t calls = __atomic_load_n(&e->calls, __ATOMIC_RELAXED);
        if (calls == 0) {
            e->bytes = bytes;
            e->comm = comm;
            e->track = t->track;
            e->op = op;
            e->dtype = dtype;
            e->redop = redop;
            e->min_ticks = d;
            e->first_ticks = t0;
        } else if (e->bytes != bytes || e->op != op || e->comm != comm || e->dtype != dtype ||
                   e->redop != redop) {
            continue;
        }
        hvprof_agg_add(e, d, flags, rc);
        t->agg_last = e;
        return;
    }
    atomic_fetch_add(&agg_overflow, 1);
}

/* Rewrite rank-R.agg from every thread's table (helper thread, and close). */
static void agg_snapshot(void)
{
    if (!g.hdr || g.hdr->mode != HVPROF_MODE_SUMMARY) return;
    uint64_t n = 0, total = 0;
    for (uint32_t k = 0; k < HVPROF_TRACK_TABLE_CAPACITY; k++) {
        hvprof_agg_entry *tab = (hvprof_agg_entry *)atomic_load(&agg_tables[k]);
        for (uint32_t i = 0; tab && i < AGG_SLOTS; i++) n += __atomic_load_n(&tab[i].calls, __ATOMIC_ACQUIRE) != 0;
    }
    size_t bytes = sizeof(hvprof_agg_header) + n * sizeof(hvprof_agg_entry);
    char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return;
    hvprof_agg_header *ah = (hvprof_agg_header *)buf;
    uint64_t m = 0;
    for (uint32_t k = 0; k < HVPROF_TRACK_TABLE_CAPACITY && m < n; k++) {
        hvprof_agg_entry *tab = (hvprof_agg_entry *)atomic_load(&agg_tables[k]);
        for (uint32_t i = 0; tab && i < AGG_SLOTS && m < n; i++) {
            if (!__atomic_load_n(&tab[i].calls, __ATOMIC_ACQUIRE)) continue;
            hvprof_agg_entry *e = (hvprof_agg_entry *)(buf + sizeof *ah) + m++;
            memcpy(e, &tab[i], sizeof *e);
            total += e->calls;
        }
    }
    memcpy(ah->magic, HVPROF_AGG_MAGIC, 8);
    ah->version = HVPROF_FORMAT_VERSION;
    ah->entry_bytes = sizeof(hvprof_agg_entry);
    ah->n_entries = m;
    ah->rank = g.hdr->rank;
    ah->buckets = HVPROF_AGG_BUCKETS;
    ah->snapshot_ticks = hvprof_ticks();
    ah->overflow_calls = atomic_load(&agg_overflow);
    g.hdr->aggregated_calls = total;
    char path[PATH_MAX + 16], tmp[PATH_MAX + 32];
    snprintf(path, sizeof path, "%.*s", (int)(strlen(g.raw_path) - 7), g.raw_path); /* drop .hvprof */
    strncat(path, ".agg", sizeof path - strlen(path) - 1);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        size_t len = sizeof *ah + m * sizeof(hvprof_agg_entry);
        int ok = write(fd, buf, len) == (ssize_t)len;
        close(fd);
        if (ok) rename(tmp, path);
        else unlink(tmp);
    }
    munmap(buf, bytes);
}

/* Close the calling thread's open call (hvprof_tls.open_rec) as it stands:
 * its record keeps what was known before the call, with t_end = t_start and
 * HVPROF_FLAG_NO_COMPLETION, and is published; its flight-recorder entry is
 * cleared. */
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

void hvprof_abandon_open(void)
{
    hvprof_tls *t = &hvprof_t;
    if (!t->open_rec) return;
    t->open_rec = NULL;
    if (t->inflight) hvprof_inflight_end(t->inflight);
    if (t->generation != atomic_load_explicit(&hvprof_generation, memory_order_acquire) ||
        !t->slots || t->open_idx >= t->used)
        return;
    hvprof_record *r = &t->slots[t->open_idx];
    r->t_end = r->t_start;
    r->flags = (uint16_t)(r->flags | HVPROF_FLAG_NO_COMPLETION);
    r->rc = 0;
    hvprof_publish(t);
}

int hvprof_refill(void)
{
    hvprof_tls *t = &hvprof_t;
    if (!(atomic_load_explicit(&hvprof_active, memory_order_acquire) ||
          atomic_load_explicit(&app_active, memory_order_acquire)) || !g.hdr)
        return -1;
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_acquire);
    if (t->open_rec) hvprof_abandon_open(); /* its slot is in the chunk retired below */
    /* The next buffer first, then the full one to the helper: were it
     * retired first, the helper could recycle it into a queue this thread
     * had not yet taken from, find no slot and unmap it. */
    hvprof_chunk_header *ch = free_take();
    if (!ch) ch = buffer_new();
    if (t->generation == gen && t->slots) {
        retire((hvprof_chunk_header *)((char *)t->slots - HVPROF_RECORD_BYTES), t->track);
        t->slots = NULL;
        t->nrec = NULL;
        t->used = t->capacity = 0;
    }
    uint32_t track = hvprof_track_self();
    if (!ch || g.broken) {
        if (ch) free_put(ch);
        __atomic_fetch_add(&g.hdr->dropped_records, 1, __ATOMIC_RELAXED);
        return -1;
    }
    ch->magic = HVPROF_CHUNK_MAGIC;
    ch->track = track;
    ch->index = __atomic_fetch_add(&g.hdr->n_chunks, 1, __ATOMIC_RELAXED);
    FLUSHED(ch) = 0;
    __atomic_store_n(&ch->nrec, 0, __ATOMIC_RELEASE);
    if (track < HVPROF_TRACK_TABLE_CAPACITY)
        atomic_store_explicit(&live[track], (uintptr_t)ch, memory_order_release);
    t->slots = (hvprof_record *)((char *)ch + HVPROF_RECORD_BYTES);
    t->nrec = (_Atomic uint64_t *)&ch->nrec;
    t->used = 0;
    t->capacity = g.chunk_bytes / HVPROF_RECORD_BYTES - 1;
    return 0;
}

void hvprof_close(uint32_t state_bits)
{
    pthread_mutex_lock(&g.lock);
    /* Once per state: a file already closed is not touched again (its rank
     * may have converted it since: the dataset stays up to date). */
    if (g.open && g.pid == getpid() &&
        (__atomic_load_n(&g.hdr->state, __ATOMIC_ACQUIRE) & state_bits) != state_bits) {
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
        __atomic_or_fetch(&g.hdr->state, state_bits, __ATOMIC_RELEASE);
        /* Chunks stay mapped: a thread that passed the active check a moment
         * ago may still be storing its last record. MAP_SHARED pages reach
         * the file without msync; the kernel writes them back. */
    }
    pthread_mutex_unlock(&g.lock);
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
    if (g.fd >= 0) close(g.fd);
    g.fd = -1;
    g.open = 0;
    g.hdr = NULL;
    helper_forget();
    g.dir[0] = 0;
    g.raw_path[0] = 0;
    pthread_mutex_init(&g.lock, NULL);
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
    if (!g.open || g.pid != getpid() || atomic_exchange(&done, 1)) return;
    int rank = g.hdr ? g.hdr->rank : -1, world = g.hdr ? g.hdr->world_size : -1;
    FOR_EACH_BACKEND(b)
        if (b->exit_begin) b->exit_begin(rank);
    hvprof_close(HVPROF_STATE_CLOSED);
    FOR_EACH_BACKEND(b)
        if (b->at_exit) b->at_exit(g.dir, g.raw_path, rank, world);
}

__attribute__((destructor)) static void hvprof_dtor(void) { exit_work(); }

HVPROF_EXPORT void hvprof_exit_work(void) { exit_work(); }

/* A Python rank's exit work starts (activate.finish): the backends' first
 * look at it (exitmerge.c: rank 0 says so if a signal ends it from here). */
HVPROF_EXPORT void hvprof_exit_prepare(void)
{
    static atomic_int done;
    if (!g.open || g.pid != getpid() || atomic_exchange(&done, 1)) return;
    int rank = g.hdr ? g.hdr->rank : -1;
    FOR_EACH_BACKEND(b)
        if (b->exit_prepare) b->exit_prepare(g.dir, rank);
}

/* ------------------------------------------------------------------------ */
/* Exports for Python (ctypes) and for tools.                                 */

HVPROF_EXPORT int hvprof_is_active(void) { return atomic_load(&hvprof_active); }
HVPROF_EXPORT const char *hvprof_dir(void) { return g.open ? g.dir : ""; }
HVPROF_EXPORT const char *hvprof_raw_path(void) { return g.open ? g.raw_path : ""; }
HVPROF_EXPORT int hvprof_rank(void) { return g.open ? g.hdr->rank : -1; }
HVPROF_EXPORT int hvprof_world_size(void) { return g.open ? g.hdr->world_size : -1; }
HVPROF_EXPORT uint64_t hvprof_now(void) { return hvprof_ticks(); }
/* hvprof_now()'s ticks per nanosecond (0 before the raw file is open). */
HVPROF_EXPORT double hvprof_ticks_per_ns(void) { return g.open ? g.hdr->ticks_per_ns : 0.0; }
HVPROF_EXPORT void hvprof_set_python(int on)
{
    g.python = on;
    if (g.open && g.hdr) __atomic_store_n(&g.hdr->self_converts, on ? 1u : 0u, __ATOMIC_RELAXED);
}
HVPROF_HIDDEN int hvprof_python_attached(void) { return g.python; }
HVPROF_HIDDEN int hvprof_app_active(void) { return atomic_load(&app_active); }

/* Sampling switch for the application (profiler.sampling(on) in Python):
 * while off, calls keep their sequence numbers and are counted as unsampled,
 * not recorded. */
HVPROF_EXPORT void hvprof_set_sampling(int on)
{
    if (g.open && g.pid == getpid()) set_sampling(on);
}

HVPROF_EXPORT void hvprof_set_enabled(int on)
{
    if (!g.open || g.pid != getpid()) return;
    if (g.hdr->state & HVPROF_STATE_FINALIZED) return;
    atomic_store(&hvprof_active, on ? 1 : 0);
}

/* The helper's flush period from now on, in ms (1 to 60000; 0: no clock
 * ticks, it wakes only when a thread runs short of ready buffers); returns
 * the previous one.  Benchmarks switch it within a run
 * (benchmarks/overhead/ab_corpus.py); a job sets HOROVOD_PROFILE_FLUSH_MS.
 * A longer period widens what a SIGKILL loses and slows the heartbeat. */
HVPROF_EXPORT int hvprof_set_flush_ms(int ms)
{
    if (!g.open || g.pid != getpid() || ms < 0 || ms > 60000) return -1;
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

/* The layout of every on-disk struct and every enum table, generated from
 * the same definitions the writer uses, for the Python view's tests. */
HVPROF_EXPORT const char *hvprof_layout_json(void)
{
    static char buf[32768];
    static int done;
    if (done) return buf;
    size_t n = 0;
#define OUT(...) n += (size_t)snprintf(buf + n, sizeof buf - n, __VA_ARGS__)
#define FIELD(T, f) OUT("\"%s\": [%zu, %zu], ", #f, offsetof(T, f), sizeof(((T *)0)->f))
#define STRUCT_BEGIN(T, name) OUT("\"%s\": {\"size\": %zu, \"fields\": {", name, sizeof(T))
#define STRUCT_END() n -= 2, OUT("}}, ")
    OUT("{\"version\": %u, \"magic\": \"HVPROF\", \"chunk_magic\": %u, ", HVPROF_FORMAT_VERSION,
        HVPROF_CHUNK_MAGIC);
    STRUCT_BEGIN(hvprof_record, "record");
    FIELD(hvprof_record, t_start); FIELD(hvprof_record, t_end); FIELD(hvprof_record, bytes);
    FIELD(hvprof_record, count); FIELD(hvprof_record, seq); FIELD(hvprof_record, comm);
    FIELD(hvprof_record, track); FIELD(hvprof_record, root); FIELD(hvprof_record, op);
    FIELD(hvprof_record, dtype); FIELD(hvprof_record, redop); FIELD(hvprof_record, flags);
    FIELD(hvprof_record, rc); FIELD(hvprof_record, dtype_size); FIELD(hvprof_record, aux);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_chunk_header, "chunk_header");
    FIELD(hvprof_chunk_header, magic); FIELD(hvprof_chunk_header, track);
    FIELD(hvprof_chunk_header, nrec); FIELD(hvprof_chunk_header, index);
    FIELD(hvprof_chunk_header, reserved);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_comm_entry, "comm_entry");
    FIELD(hvprof_comm_entry, handle); FIELD(hvprof_comm_entry, id); FIELD(hvprof_comm_entry, size);
    FIELD(hvprof_comm_entry, rank); FIELD(hvprof_comm_entry, world_rank0);
    FIELD(hvprof_comm_entry, backend); FIELD(hvprof_comm_entry, valid);
    FIELD(hvprof_comm_entry, name);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_track_entry, "track_entry");
    FIELD(hvprof_track_entry, handle); FIELD(hvprof_track_entry, tid);
    FIELD(hvprof_track_entry, kind); FIELD(hvprof_track_entry, valid);
    FIELD(hvprof_track_entry, is_main); FIELD(hvprof_track_entry, device);
    FIELD(hvprof_track_entry, name); FIELD(hvprof_track_entry, caller);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_file_header, "file_header");
    FIELD(hvprof_file_header, magic); FIELD(hvprof_file_header, version);
    FIELD(hvprof_file_header, header_bytes); FIELD(hvprof_file_header, record_bytes);
    FIELD(hvprof_file_header, chunk_bytes); FIELD(hvprof_file_header, comm_table_offset);
    FIELD(hvprof_file_header, comm_table_capacity); FIELD(hvprof_file_header, track_table_offset);
    FIELD(hvprof_file_header, track_table_capacity); FIELD(hvprof_file_header, first_chunk_offset);
    FIELD(hvprof_file_header, rank); FIELD(hvprof_file_header, world_size);
    FIELD(hvprof_file_header, local_rank); FIELD(hvprof_file_header, pid);
    FIELD(hvprof_file_header, state); FIELD(hvprof_file_header, n_comms);
    FIELD(hvprof_file_header, n_tracks); FIELD(hvprof_file_header, thread_level);
    FIELD(hvprof_file_header, n_chunks); FIELD(hvprof_file_header, dropped_records);
    FIELD(hvprof_file_header, clock_kind); FIELD(hvprof_file_header, offset_method);
    FIELD(hvprof_file_header, ticks_per_ns); FIELD(hvprof_file_header, cal0_ticks);
    FIELD(hvprof_file_header, cal0_mono_ns); FIELD(hvprof_file_header, cal1_ticks);
    FIELD(hvprof_file_header, cal1_mono_ns); FIELD(hvprof_file_header, cal0_realtime_ns);
    FIELD(hvprof_file_header, offset_ns); FIELD(hvprof_file_header, offset_err_ns);
    FIELD(hvprof_file_header, init_start_ticks); FIELD(hvprof_file_header, init_end_ticks);
    FIELD(hvprof_file_header, finalize_ticks); FIELD(hvprof_file_header, job_id);
    FIELD(hvprof_file_header, hostname); FIELD(hvprof_file_header, mpi_version);
    FIELD(hvprof_file_header, job_t0_ns); FIELD(hvprof_file_header, mode);
    FIELD(hvprof_file_header, sampling); FIELD(hvprof_file_header, unsampled_calls);
    FIELD(hvprof_file_header, aggregated_calls); FIELD(hvprof_file_header, offset_at_ns);
    FIELD(hvprof_file_header, offset_end_ns); FIELD(hvprof_file_header, offset_end_err_ns);
    FIELD(hvprof_file_header, offset_end_at_ns); FIELD(hvprof_file_header, inflight_offset);
    FIELD(hvprof_file_header, inflight_capacity); FIELD(hvprof_file_header, call_cost_ns);
    FIELD(hvprof_file_header, helper_cpu_ns); FIELD(hvprof_file_header, self_converts);
    FIELD(hvprof_file_header, reserved);
    FIELD(hvprof_file_header, inflight);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_inflight_entry, "inflight_entry");
    FIELD(hvprof_inflight_entry, state); FIELD(hvprof_inflight_entry, op);
    FIELD(hvprof_inflight_entry, pad0); FIELD(hvprof_inflight_entry, comm);
    FIELD(hvprof_inflight_entry, t_start); FIELD(hvprof_inflight_entry, reserved);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_agg_header, "agg_header");
    FIELD(hvprof_agg_header, magic); FIELD(hvprof_agg_header, version);
    FIELD(hvprof_agg_header, entry_bytes); FIELD(hvprof_agg_header, n_entries);
    FIELD(hvprof_agg_header, rank); FIELD(hvprof_agg_header, buckets);
    FIELD(hvprof_agg_header, snapshot_ticks); FIELD(hvprof_agg_header, overflow_calls);
    FIELD(hvprof_agg_header, reserved);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_agg_entry, "agg_entry");
    FIELD(hvprof_agg_entry, bytes); FIELD(hvprof_agg_entry, calls); FIELD(hvprof_agg_entry, sum_ticks);
    FIELD(hvprof_agg_entry, min_ticks); FIELD(hvprof_agg_entry, max_ticks);
    FIELD(hvprof_agg_entry, first_ticks); FIELD(hvprof_agg_entry, comm); FIELD(hvprof_agg_entry, track);
    FIELD(hvprof_agg_entry, op); FIELD(hvprof_agg_entry, dtype); FIELD(hvprof_agg_entry, redop);
    FIELD(hvprof_agg_entry, flags_or); FIELD(hvprof_agg_entry, errors); FIELD(hvprof_agg_entry, hist);
    STRUCT_END();
#define ENUM3(v, N, s, b) OUT("\"%d\": [\"%s\", \"%s\"], ", v, s, b);
#define ENUM2(v, N, s) OUT("\"%d\": \"%s\", ", (int)(v), s);
    OUT("\"ops\": {"); HVPROF_OPS(ENUM3) n -= 2; OUT("}, ");
    OUT("\"dtypes\": {"); HVPROF_DTYPES(ENUM2) n -= 2; OUT("}, ");
    OUT("\"redops\": {"); HVPROF_REDOPS(ENUM2) n -= 2; OUT("}, ");
    OUT("\"flags\": {"); HVPROF_FLAGS(ENUM2) n -= 2; OUT("}, ");
    OUT("\"modes\": {\"full\": %u, \"summary\": %u}, ", HVPROF_MODE_FULL, HVPROF_MODE_SUMMARY);
    OUT("\"states\": {\"open\": %u, \"mpi_init\": %u, \"finalized\": %u, \"closed\": %u, "
        "\"truncated\": %u}}",
        HVPROF_STATE_OPEN, HVPROF_STATE_MPI_INIT, HVPROF_STATE_FINALIZED, HVPROF_STATE_CLOSED,
        HVPROF_STATE_TRUNCATED);
#undef OUT
    done = 1;
    return buf;
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
    if (tab == NULL || g.hdr == NULL) return 0;
    uint64_t now = hvprof_ticks(), oldest = now;
    for (uint32_t i = 0; i < HVPROF_INFLIGHT_CAPACITY; i++)
        if (__atomic_load_n(&tab[i].state, __ATOMIC_ACQUIRE) && tab[i].t_start < oldest)
            oldest = tab[i].t_start;
    if (oldest >= now) return 0;
    double tpn = g.hdr->ticks_per_ns > 0 ? g.hdr->ticks_per_ns : 1.0;
    return (int64_t)((double)(now - oldest) / tpn);
}
