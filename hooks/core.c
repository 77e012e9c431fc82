/*
 * core.c -- the top of the core: the raw file's close, fork and exit, and the
 * functions Python calls through ctypes (sampling, the helper's period, the
 * application's records).  Calls the core's files below it (core_internal.h
 * has the stack); the backends call it.
 *
 * The core names no backend: mpi.c, nccl*.c, cuda_rt*.c and the helpers
 * (cpu.c, exitmerge.c) register their lifecycle hooks
 * (hvprof_register_backend) and the core calls them; it calls no function
 * of theirs by name (tests/test_c_structure.py).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core_internal.h"

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
    summary_atfork_child(); /* the helper may have held its lock */
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

HVPROF_EXPORT void hvprof_set_python(int on)
{
    hvprof_core.python = on;
    if (hvprof_core.open && hvprof_core.hdr) __atomic_store_n(&hvprof_core.hdr->self_converts, on ? 1u : 0u, __ATOMIC_RELAXED);
}

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
    return helper_set_period(ms);
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
    /* The backends' per-step work: what must be read at the boundary itself
     * here (app_step: each thread's CPU and run-queue time over the step,
     * cpu.c), the rest on the helper thread (helper_step). */
    if (op == HVPROF_OP_APP_STEP) {
        int later = 0;
        FOR_EACH_BACKEND(b) {
            if (b->app_step) b->app_step(seq);
            later |= b->helper_step != NULL;
        }
        if (later) helper_step_post(seq, t_end);
    }
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
