/*
 * core_flush.c -- the core's chunk supply, the helper thread ("hvprof-io"),
 * signals, thread exit.  Above core_summary.c (core_internal.h has the
 * stack).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core_internal.h"

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
static uint64_t reserved_chunks; /* chunks with blocks reserved (reserve_chunks; helper only) */
static int reserve_refused;      /* the file system refused once: not asked again */
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
static _Atomic int flush_ms = HVS_FLUSH_MS_DEFAULT; /* 0: no clock ticks */

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
    void *m = mmap(NULL, hvprof_core.chunk_bytes, PROT_READ | PROT_WRITE,
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
        ssize_t w = pwrite(hvprof_core.fd, p, len, off);
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
    if (hvprof_core.broken) {
        __atomic_fetch_add(&hvprof_core.hdr->dropped_records, n - done, __ATOMIC_RELAXED);
        FLUSHED(ch) = n;
        return;
    }
    off_t base = (off_t)(hvprof_core.first_chunk_offset + ch->index * hvprof_core.chunk_bytes);
    const char *recs = (const char *)ch + HVPROF_RECORD_BYTES;
    size_t len = (size_t)(n - done) * HVPROF_RECORD_BYTES;
    off_t off = base + (off_t)HVPROF_RECORD_BYTES * (off_t)(done + 1);
    hvprof_chunk_header h = {HVPROF_CHUNK_MAGIC, ch->track, n, ch->index, {0}};
    int err = pwrite_all(recs + done * HVPROF_RECORD_BYTES, len, off);
    if (!err) err = pwrite_all(&h, sizeof h, base);
    if (err) {
        hvprof_core.broken = 1;
        hvprof_core.write_errno = err;
        __atomic_or_fetch(&hvprof_core.hdr->state, HVPROF_STATE_TRUNCATED, __ATOMIC_RELAXED);
        __atomic_fetch_add(&hvprof_core.hdr->dropped_records, n - done, __ATOMIC_RELAXED);
        /* Said once, at once, by rank 0 (or by a process on its own); MPI_Finalize
         * then says what the whole job lost. */
        if (!hvprof_core.quiet || hvprof_core.hdr->rank == 0)
            hvprof_warn("rank %d: cannot write %s (%s): further records are dropped and "
                        "counted", hvprof_core.hdr->rank, hvprof_core.raw_path, strerror(err));
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
            munmap(ch, hvprof_core.chunk_bytes);
            atomic_fetch_sub(&n_buffers, 1);
        }
    }
    uint32_t n = hvprof_core.hdr->n_tracks < HVPROF_TRACK_TABLE_CAPACITY ? hvprof_core.hdr->n_tracks
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
        munmap(ch, hvprof_core.chunk_bytes);
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
    if (hvprof_core.hdr->mode == HVPROF_MODE_FULL) return (int)FREE_TARGET;
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
    if (reserve_refused || hvprof_core.broken || chunks <= reserved_chunks) return;
    off_t from = (off_t)(hvprof_core.first_chunk_offset + reserved_chunks * hvprof_core.chunk_bytes);
    off_t len = (off_t)((chunks - reserved_chunks) * hvprof_core.chunk_bytes);
    if (fallocate(hvprof_core.fd, FALLOC_FL_KEEP_SIZE, from, len) != 0) reserve_refused = 1;
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
    if (hvprof_core.hdr && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
        __atomic_store_n(&hvprof_core.hdr->helper_cpu_ns, (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec,
                         __ATOMIC_RELAXED);
}

/* Step ends for the backends' helper_step hooks: a ring the stepping thread
 * appends to (a slot claimed with one fetch-add, two stores, no system call,
 * no wake: the helper finds them at its next pass) and the helper drains in
 * order.  A slot holds seq + 1 (0: empty) and the step's end. */
#define STEP_SLOTS 1024u
static struct {
    _Atomic uint64_t seq1;
    uint64_t t_end;
} step_ring[STEP_SLOTS];
static _Atomic uint32_t step_head; /* next slot to claim */
static uint32_t step_tail;         /* next slot to drain (the helper's, or under
                                      drain_lock without a helper) */
static _Atomic int drain_lock;

static void steps_tell(uint32_t seq, uint64_t t_end)
{
    FOR_EACH_BACKEND(b)
        if (b->helper_step) b->helper_step(seq, t_end);
}

/* Everything posted so far, in order (the helper; or a poster where none runs). */
static void steps_drain(void)
{
    for (;;) {
        uint64_t s1 = atomic_load_explicit(&step_ring[step_tail % STEP_SLOTS].seq1,
                                           memory_order_acquire);
        if (!s1) return;
        uint64_t t = step_ring[step_tail % STEP_SLOTS].t_end;
        atomic_store_explicit(&step_ring[step_tail % STEP_SLOTS].seq1, 0, memory_order_release);
        step_tail++;
        steps_tell((uint32_t)(s1 - 1), t);
    }
}

void helper_step_post(uint32_t seq, uint64_t t_end)
{
    if (!helper_started) { /* no helper: here, now */
        while (atomic_exchange_explicit(&drain_lock, 1, memory_order_acquire)) {
        }
        steps_drain();
        steps_tell(seq, t_end);
        atomic_store_explicit(&drain_lock, 0, memory_order_release);
        return;
    }
    uint32_t i = atomic_fetch_add_explicit(&step_head, 1, memory_order_relaxed) % STEP_SLOTS;
    if (HVPROF_UNLIKELY(atomic_load_explicit(&step_ring[i].seq1, memory_order_acquire))) {
        steps_tell(seq, t_end); /* the helper is a whole ring behind: here, now */
        return;
    }
    step_ring[i].t_end = t_end;
    atomic_store_explicit(&step_ring[i].seq1, (uint64_t)seq + 1, memory_order_release);
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
        uint64_t chunks = __atomic_load_n(&hvprof_core.hdr->n_chunks, __ATOMIC_RELAXED);
        reserve_chunks(chunks);
        steps_drain();
        flush_all();
        int target = free_target(chunks);
        /* at most the shortfall seen now: were it "until the queue is
         * full", a thread taking buffers as fast as they come would keep the
         * helper mapping new ones, its full buffers never recycled */
        for (int k = target - atomic_load(&n_free); run && k > 0; k--) {
            hvprof_chunk_header *c = buffer_new();
            if (!c) break;
            if (free_put(c) != 0) {
                munmap(c, hvprof_core.chunk_bytes);
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

void thread_exit(void *arg)
{
    /* The thread's buffer stays readable: hand it to the helper. */
    hvprof_tls *t = &hvprof_t;
    (void)arg;
    hvprof_abandon_open(); /* a thread cancelled inside a call */
    if (t->slots && t->generation == atomic_load(&hvprof_generation) && hvprof_core.hdr) {
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
    if (!hvprof_core.hdr || hvprof_core.pid != getpid()) return;
    for (uint32_t i = 0; i < FULL_SLOTS; i++) {
        uintptr_t c = atomic_load(&fullq[i]);
        if (c) buffer_flush((hvprof_chunk_header *)c);
    }
    uint32_t n = hvprof_core.hdr->n_tracks < HVPROF_TRACK_TABLE_CAPACITY ? hvprof_core.hdr->n_tracks
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

void signals_install(void)
{
    if (signals_installed || !hvprof_setting_int(HVS_SIGNALS)) return;
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

void helper_start(void)
{
    atomic_store(&flush_ms, (int)hvprof_setting_int(HVS_FLUSH_MS));
    if (helper_started) return;
    if (!hvprof_setting_int(HVS_HELPER)) return; /* everything on the calling threads */
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
void helper_forget(void)
{
    helper_started = 0;
    atomic_store(&helper_run, 0);
    for (uint32_t i = 0; i < FREE_SLOTS; i++) atomic_store(&freeq[i], 0);
    for (uint32_t i = 0; i < FULL_SLOTS; i++) atomic_store(&fullq[i], 0);
    for (uint32_t i = 0; i < HVPROF_TRACK_TABLE_CAPACITY; i++) atomic_store(&live[i], 0);
    atomic_store(&n_buffers, 0);
    for (uint32_t i = 0; i < STEP_SLOTS; i++) atomic_store(&step_ring[i].seq1, 0);
    atomic_store(&step_head, 0);
    step_tail = 0;
    atomic_store(&drain_lock, 0);
}

int helper_set_period(int ms)
{
    int was = atomic_exchange(&flush_ms, ms);
    if (ms != was && helper_started) helper_wake(); /* the new period at once */
    return was;
}

void flush_reset(void)
{
    reserved_chunks = 0;
    reserve_refused = 0;
}

/* Stop the helper after a last drain; without one, drain here. */
void helper_stop(void)
{
    if (helper_started) {
        atomic_store(&helper_run, 0);
        helper_wake();
        pthread_join(helper_thread, NULL);
        helper_started = 0;
    } else if (hvprof_core.hdr) {
        flush_all();
    }
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
          atomic_load_explicit(&app_active, memory_order_acquire)) || !hvprof_core.hdr)
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
    if (!ch || hvprof_core.broken) {
        if (ch) free_put(ch);
        __atomic_fetch_add(&hvprof_core.hdr->dropped_records, 1, __ATOMIC_RELAXED);
        return -1;
    }
    ch->magic = HVPROF_CHUNK_MAGIC;
    ch->track = track;
    ch->index = __atomic_fetch_add(&hvprof_core.hdr->n_chunks, 1, __ATOMIC_RELAXED);
    FLUSHED(ch) = 0;
    __atomic_store_n(&ch->nrec, 0, __ATOMIC_RELEASE);
    if (track < HVPROF_TRACK_TABLE_CAPACITY)
        atomic_store_explicit(&live[track], (uintptr_t)ch, memory_order_release);
    t->slots = (hvprof_record *)((char *)ch + HVPROF_RECORD_BYTES);
    t->nrec = (_Atomic uint64_t *)&ch->nrec;
    t->used = 0;
    t->capacity = hvprof_core.chunk_bytes / HVPROF_RECORD_BYTES - 1;
    return 0;
}

