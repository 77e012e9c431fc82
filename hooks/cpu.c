/*
 * cpu.c -- CPU contention measured directly: how long each thread of the
 * rank ran on a CPU and how long it waited on a run queue for one.
 *
 * Source: the kernel's per-thread scheduler statistics,
 * /proc/self/task/<tid>/schedstat ("<ns on a CPU> <ns waiting on a run
 * queue> <timeslices>"), and /proc/self/task/<tid>/status
 * (voluntary_ctxt_switches, nonvoluntary_ctxt_switches).  Two products:
 *
 * - APP_CPU records (hvprof_format.h): at the APP_STEP record of each step
 *   that is read (every step of the first 64, then one in
 *   HOROVOD_PROFILE_CPU, 16 by default), one record per thread track (a
 *   thread that recorded anything: the main thread, Horovod's background
 *   thread, any other) with what that thread used and waited since its
 *   previous read.  A thread's first read is taken when its
 *   track is created, and again (no record) when a step opens without
 *   another closing at the same moment (hvprof_cpu_baseline: Python's first
 *   step boundary, step_context's entry), so that step 0 covers step 0.
 *   Each thread keeps one open descriptor (pread at offset 0 re-reads the
 *   file: verified on this kernel), the first CPU_MAX_FDS threads; the rest
 *   open, read and close each time.  A thread that exited (the read fails
 *   with ESRCH) writes nothing from then on, and is counted.
 *
 * - raw/rank-R.cpu.json, the sidecar: the host's online CPUs, this process's
 *   affinity, load averages, the measured cost of one read, OMP_NUM_THREADS,
 *   and every thread of /proc/self/task with its figures at start (the
 *   raw file's open: MPI_Init) and at the end (MPI_Finalize, refreshed at
 *   process exit; each thread keeps its last successful read).  Written at
 *   open and rewritten at each close (atomic rename): a rank that dies keeps
 *   what was read at start.  Python adds the threads' kinds, torch's and
 *   OpenMP's thread counts (profiler.formats.cpu, profiler.postjob.convert).
 *
 * - The host around the rank, in the same sidecar at the same moments (the
 *   noisy neighbour: docs/CPU_CONTENTION.md): each CPU's busy, idle and
 *   steal clock ticks (/proc/stat's cpuN lines), each thread's last CPU
 *   (field 39 of /proc/self/task/<tid>/stat), and every process of /proc
 *   (pid, ppid, comm, utime+stime ticks, last CPU: /proc/<pid>/stat), held
 *   in memory for CPU_MAX_PROCS processes and written for the
 *   CPU_PROCS_KEPT busiest over the run (at start: the busiest so far), this
 *   rank's own always.  A pid whose start time changed between the scans is
 *   a new process.  Read at open and at the first close (MPI_Finalize; exit
 *   when there was none): the run's window, never on a call's path; each
 *   reading's cost is timed and written (scan_ns).
 *
 * - The rank's cgroup (cpu_cgroup.c): its CPU quota and period, its cpuset,
 *   and its cpu.stat throttling counters at open, at each close and at the
 *   end of every step whose threads are read (one pread more, timed with
 *   them): the sidecar's "cgroup" object.
 *
 * Reading never fails the job: a kernel without the files makes no records,
 * and the sidecar says so ("schedstat": false, "reason").  Cost: one pread
 * and one record per thread per step read, never on a call's path; measured
 * in docs/CPU_CONTENTION.md (benchmarks/cpu_read_cost.py) and in every run
 * (the sidecar's step_read_cpu_ns, timed on one read in 16).
 *
 * Locking: cpu_lock guards the per-track state; the order is g.lock (core.c)
 * before cpu_lock.  A thread holding cpu_lock never creates a track (the
 * stepping thread registers its own before taking it), so the records
 * written under it cannot re-enter.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_internal.h"

#define CPU_MAX_FDS 64        /* descriptors kept open (threads beyond: open each time) */
#define CPU_MAX_THREADS 1024  /* threads listed in the sidecar */
#define CPU_COST_READS 9      /* reads timed at start (read_cost_ns: their median) */

enum { SLOT_NONE = 0, SLOT_LIVE = 1, SLOT_GONE = 2 };

typedef struct cpu_slot {
    int32_t tid;
    int32_t fd;          /* -1: open each time */
    uint32_t state;      /* SLOT_* */
    uint32_t pad;
    uint64_t ticks;      /* the previous read */
    uint64_t run_ns, wait_ns, slices;
} cpu_slot;

typedef struct cpu_vals {
    uint64_t run_ns, wait_ns, slices, nvcsw, nivcsw;
    uint64_t ticks;
    int64_t last_cpu;    /* field 39 of .../stat; -1 unknown */
} cpu_vals;

typedef struct cpu_thread {
    int32_t tid;
    uint8_t has_start, has_end;
    char name[16];
    cpu_vals start, end;
} cpu_thread;

static pthread_mutex_t cpu_lock = PTHREAD_MUTEX_INITIALIZER;
static cpu_slot slots[HVPROF_TRACK_TABLE_CAPACITY];
static int n_fds;
static int available = 1;            /* schedstat readable (decided at open) */
/* Which steps are read (HOROVOD_PROFILE_CPU=K): every step of the first
 * HVPROF_CPU_FIRST_STEPS, then one in K (K=1: all; 0: none, no descriptors
 * kept; the sidecar's start and end figures stay).  A step is read at both its ends, so
 * its rows cover it alone.  Each read is a system call per thread, which on
 * a nested virtual machine costs the job several times its own time
 * (docs/validation.md): one step in 16 keeps the contention findings' samples
 * at a sixteenth of that cost. */
static int step_reads = 1;
static uint32_t step_every = HVS_CPU_DEFAULT;
/* The open step (the one after the last step record) is read: the
 * synchronize hooks read their own thread only then. */
static _Atomic int open_read = 1;
static char reason[160];             /* why not */
static int64_t read_cost_ns = -1;
static double loadavg_start[3], loadavg_end[3];
static int have_load_start, have_load_end;
static char omp_threads[64];
static int have_omp;
/* step_ns: the stepping thread's CPU time in the reads and their records */
static uint64_t rows, steps, reads, step_ns, gone, omitted;
static int exit_written;
static cpu_thread threads[CPU_MAX_THREADS];
static int n_threads;

/* "<run> <wait> <slices>" from fd (pread at 0), or from the path when fd < 0. */
static int read_schedstat(int fd, int32_t tid, uint64_t v[3])
{
    char buf[128];
    int own = -1;
    if (fd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", (int)tid);
        own = fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
    }
    ssize_t n;
    do {
        n = pread(fd, buf, sizeof buf - 1, 0);
    } while (n < 0 && errno == EINTR);
    if (own >= 0) close(own);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = buf, *end;
    for (int i = 0; i < 3; i++) {
        errno = 0;
        v[i] = strtoull(p, &end, 10);
        if (end == p || errno) return -1;
        p = end;
    }
    return 0;
}

/* Name and context switches from /proc/self/task/<tid>/status. */
static int read_status(int32_t tid, char name[16], uint64_t *nvcsw, uint64_t *nivcsw)
{
    static char buf[16384]; /* cpu_lock held: one reader at a time */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    for (;;) { /* the whole file: long CPU and node masks on large machines */
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        n += (size_t)k;
        if (n >= sizeof buf - 1) break;
    }
    close(fd);
    if (n == 0) return -1;
    buf[n] = 0;
    *nvcsw = *nivcsw = 0;
    for (char *line = buf; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (strncmp(line, "Name:", 5) == 0) {
            const char *s = line + 5;
            while (*s == '\t' || *s == ' ') s++;
            snprintf(name, 16, "%s", s);
        } else if (strncmp(line, "voluntary_ctxt_switches:", 24) == 0) {
            *nvcsw = strtoull(line + 24, NULL, 10);
        } else if (strncmp(line, "nonvoluntary_ctxt_switches:", 27) == 0) {
            *nivcsw = strtoull(line + 27, NULL, 10);
        }
        line = next;
    }
    return 0;
}

static void read_loadavg(double out[3], int *ok)
{
    *ok = 0;
    FILE *f = fopen("/proc/loadavg", "re");
    if (!f) return;
    *ok = fscanf(f, "%lf %lf %lf", &out[0], &out[1], &out[2]) == 3;
    fclose(f);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ------------------------------------------------------------------------ */
/* Per-track reads (the records).                                             */

static void slot_close(cpu_slot *s)
{
    if (s->fd >= 0) {
        close(s->fd);
        n_fds--;
    }
    s->fd = -1;
}

/* Read slot s now: 0 with v and *t filled, -1 when the thread is gone (the
 * slot is closed and counted). cpu_lock held. */
static int slot_read(cpu_slot *s, uint64_t v[3], uint64_t *t)
{
    *t = hvprof_ticks();
    if (read_schedstat(s->fd, s->tid, v) == 0) return 0;
    slot_close(s);
    s->state = SLOT_GONE;
    gone++;
    return -1;
}

static void cpu_track(uint32_t idx, int32_t tid)
{
    if (idx >= HVPROF_TRACK_TABLE_CAPACITY || tid <= 0 || !available || !step_reads) return;
    pthread_mutex_lock(&cpu_lock);
    cpu_slot *s = &slots[idx];
    slot_close(s);
    s->tid = tid;
    s->state = SLOT_LIVE;
    if (n_fds < CPU_MAX_FDS) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", (int)tid);
        s->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (s->fd >= 0) n_fds++;
    }
    uint64_t v[3], t;
    if (slot_read(s, v, &t) == 0) {
        s->ticks = t;
        s->run_ns = v[0];
        s->wait_ns = v[1];
        s->slices = v[2];
    }
    pthread_mutex_unlock(&cpu_lock);
}


/* Every live thread track read now; emit: one APP_CPU record each (seq). */
static void read_all(int emit, uint32_t seq)
{
    hvprof_file_header *h = hvprof_header();
    if (!h) return;
    uint32_t n = h->n_tracks;
    if (n > HVPROF_TRACK_TABLE_CAPACITY - 1) n = HVPROF_TRACK_TABLE_CAPACITY - 1;
    for (uint32_t i = 0; i < n; i++) {
        cpu_slot *s = &slots[i];
        uint64_t v[3], t;
        if (s->state != SLOT_LIVE || slot_read(s, v, &t) != 0) continue;
        if (emit) {
            hvprof_record r = {
                .t_start = s->ticks, .t_end = t, .bytes = delta(v[0], s->run_ns),
                .count = delta(v[1], s->wait_ns), .seq = seq, .comm = UINT32_MAX, .track = i,
                .root = -1, .op = HVPROF_OP_APP_CPU, .dtype = HVPROF_DT_UNKNOWN,
                .redop = HVPROF_REDOP_NONE, .flags = 0, .rc = 0,
                .dtype_size = (uint32_t)delta(v[2], s->slices), .aux = 0};
            if (hvprof_emit_record(&r, 0) == 0) rows++;
        }
        s->ticks = t;
        s->run_ns = v[0];
        s->wait_ns = v[1];
        s->slices = v[2];
    }
}

/* The reads' own cost (step_ns) is timed on the first CPU_TIMED_FIRST
 * reads, then on one in CPU_TIMED_EVERY, which stands for that many: each
 * timing is two system calls, a sixth of what it times. */
#define CPU_TIMED_FIRST 16
#define CPU_TIMED_EVERY 16

/* Step seq is read (HOROVOD_PROFILE_CPU's rule, above). */
static int step_is_read(uint64_t seq)
{
    return step_reads && (seq < HVPROF_CPU_FIRST_STEPS || seq % step_every == 0);
}

/* Step seq has ended: its rows when it is read, and the read that opens the
 * next when that one is. */
static void cpu_step(uint32_t seq)
{
    if (!available || !step_reads) return;
    int emit = step_is_read(seq), next = step_is_read((uint64_t)seq + 1);
    atomic_store(&open_read, next);
    hvprof_track_self(); /* the stepping thread's own track first: never under cpu_lock */
    pthread_mutex_lock(&cpu_lock);
    steps++;
    if (!emit && !next) {
        pthread_mutex_unlock(&cpu_lock);
        return;
    }
    int timed = reads < CPU_TIMED_FIRST || reads % CPU_TIMED_EVERY == 0;
    int64_t c0 = timed ? thread_cpu_ns() : 0;
    read_all(emit, seq);
    cpu_cgroup_step(seq);
    if (timed) {
        int64_t c1 = thread_cpu_ns();
        if (c1 > c0) step_ns += (uint64_t)(c1 - c0) * (reads < CPU_TIMED_FIRST ? 1 : CPU_TIMED_EVERY);
    }
    reads++;
    pthread_mutex_unlock(&cpu_lock);
}

/* 1 when the open step is read (schedstat readable, HOROVOD_PROFILE_CPU's
 * rule): the synchronize hooks read their own thread only then. */
HVPROF_EXPORT int hvprof_cpu_step_reads(void) { return available && atomic_load(&open_read); }

HVPROF_EXPORT int hvprof_cpu_baseline(void)
{
    if (!available || !atomic_load(&open_read) || !hvprof_header() || !hvprof_app_active())
        return -1;
    hvprof_track_self();
    pthread_mutex_lock(&cpu_lock);
    read_all(0, 0);
    pthread_mutex_unlock(&cpu_lock);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Whole-process snapshots (the sidecar).                                     */

static cpu_thread *thread_entry(int32_t tid)
{
    for (int i = 0; i < n_threads; i++)
        if (threads[i].tid == tid) return &threads[i];
    if (n_threads >= CPU_MAX_THREADS) {
        omitted++;
        return NULL;
    }
    cpu_thread *e = &threads[n_threads++];
    memset(e, 0, sizeof *e);
    e->tid = tid;
    return e;
}

/* The CPU the thread last ran on (field 39 of its stat); -1 unknown. */
static int64_t thread_last_cpu(int32_t tid)
{
    char path[64], buf[1024];
    stat_fields f;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    if (read_small(path, buf, sizeof buf) != 0 || parse_stat(buf, &f) != 0) return -1;
    return f.cpu;
}

/* Every thread of /proc/self/task now, into start (at_start) or end. */
static void snapshot(int at_start)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *endp;
        long tid = strtol(de->d_name, &endp, 10);
        if (endp == de->d_name || *endp || tid <= 0) continue;
        cpu_vals v;
        uint64_t s[3];
        char name[16] = "";
        v.ticks = hvprof_ticks();
        if (read_schedstat(-1, (int32_t)tid, s) != 0) continue; /* exited meanwhile */
        if (read_status((int32_t)tid, name, &v.nvcsw, &v.nivcsw) != 0) continue;
        v.run_ns = s[0];
        v.wait_ns = s[1];
        v.slices = s[2];
        v.last_cpu = thread_last_cpu((int32_t)tid);
        cpu_thread *e = thread_entry((int32_t)tid);
        if (!e) continue;
        memcpy(e->name, name, sizeof e->name);
        if (at_start) {
            e->start = v;
            e->has_start = 1;
        } else {
            e->end = v;
            e->has_end = 1;
        }
    }
    closedir(d);
}

static void jvals(jbuf *j, const char *key, int has, const cpu_vals *v)
{
    if (!has) {
        jout(j, "\"%s\": null", key);
        return;
    }
    jout(j, "\"%s\": {\"cpu_ns\": %llu, \"wait_ns\": %llu, \"slices\": %llu, \"nvcsw\": %llu, "
         "\"nivcsw\": %llu, \"ticks\": %llu, \"last_cpu\": %lld}", key,
         (unsigned long long)v->run_ns, (unsigned long long)v->wait_ns,
         (unsigned long long)v->slices, (unsigned long long)v->nvcsw,
         (unsigned long long)v->nivcsw, (unsigned long long)v->ticks, (long long)v->last_cpu);
}

static void jload(jbuf *j, const char *key, int ok, const double l[3])
{
    if (ok) jout(j, "\"%s\": [%.2f, %.2f, %.2f], ", key, l[0], l[1], l[2]);
    else jout(j, "\"%s\": null, ", key);
}

/* Rewrite raw/rank-R.cpu.json (cpu_lock held). */
static void write_sidecar(const char *state)
{
    char path[PATH_MAX];
    if (hvprof_sidecar_path(path, sizeof path, ".cpu.json") != 0) return;
    jbuf j = {NULL, 8192 + (size_t)n_threads * 640 + sizeof reason * 6
                        + cpu_host_json_bytes() + cpu_cgroup_json_bytes(), 0};
    j.buf = malloc(j.n);
    if (!j.buf) return;
    j.buf[0] = 0;
    jout(&j, "{\"version\": 1, \"state\": \"%s\", \"pid\": %d, \"schedstat\": %s, "
         "\"step_reads\": %s, \"step_first\": %d, \"step_every\": %u, \"reason\": ", state,
         (int)getpid(), available ? "true" : "false", available && step_reads ? "true" : "false",
         HVPROF_CPU_FIRST_STEPS, step_reads ? step_every : 0u);
    jstr(&j, reason);
    jout(&j, ", \"host_cpus\": %ld, \"affinity\": [", sysconf(_SC_NPROCESSORS_ONLN));
    cpu_set_t set;
    if (sched_getaffinity(getpid(), sizeof set, &set) == 0) {
        const char *sep = "";
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) {
                jout(&j, "%s%d", sep, c);
                sep = ", ";
            }
    }
    jout(&j, "], \"clk_tck\": %ld, ", sysconf(_SC_CLK_TCK));
    cpu_host_json(&j);
    jout(&j, ", ");
    cpu_cgroup_json(&j);
    jout(&j, ", ");
    jload(&j, "loadavg_start", have_load_start, loadavg_start);
    jload(&j, "loadavg_end", have_load_end, loadavg_end);
    jout(&j, "\"read_cost_ns\": %lld, \"omp_num_threads\": ", (long long)read_cost_ns);
    if (have_omp) jstr(&j, omp_threads);
    else jout(&j, "null");
    jout(&j, ", \"helper_tid\": %d, \"rows\": %llu, \"steps\": %llu, \"steps_read\": %llu, "
         "\"step_read_cpu_ns\": %llu, \"threads_gone\": %llu, \"threads_omitted\": %llu, "
         "\"threads\": [", atomic_load(&hvprof_helper_tid), (unsigned long long)rows,
         (unsigned long long)steps, (unsigned long long)reads,
         (unsigned long long)step_ns, (unsigned long long)gone, (unsigned long long)omitted);
    for (int i = 0; i < n_threads; i++) {
        const cpu_thread *e = &threads[i];
        jout(&j, "%s{\"tid\": %d, \"name\": ", i ? ", " : "", (int)e->tid);
        jstr(&j, e->name);
        jout(&j, ", ");
        jvals(&j, "start", e->has_start, &e->start);
        jout(&j, ", ");
        jvals(&j, "end", e->has_end, &e->end);
        jout(&j, "}");
    }
    jout(&j, "]}");
    if (j.k < j.n) hvprof_write_text(path, j.buf); /* never a cut document */
    free(j.buf);
}

/* The cost of one schedstat read (pread at 0 of an open descriptor, the
 * per-step path), median of CPU_COST_READS, in ns; -1 when unreadable. */
static int64_t measure_read_cost(int fd)
{
    int64_t d[CPU_COST_READS];
    uint64_t v[3];
    for (int i = 0; i < CPU_COST_READS; i++) {
        int64_t a = hvprof_mono_ns();
        if (read_schedstat(fd, 0, v) != 0) return -1;
        d[i] = hvprof_mono_ns() - a;
    }
    qsort(d, CPU_COST_READS, sizeof d[0], cmp_i64);
    return d[CPU_COST_READS / 2];
}

static void cpu_reset(void)
{
    pthread_mutex_lock(&cpu_lock);
    for (uint32_t i = 0; i < HVPROF_TRACK_TABLE_CAPACITY; i++) {
        slot_close(&slots[i]);
        slots[i].state = SLOT_NONE;
    }
    n_fds = 0;
    available = 1;
    step_reads = 1;
    step_every = HVS_CPU_DEFAULT;
    atomic_store(&open_read, 1);
    reason[0] = 0;
    read_cost_ns = -1;
    have_load_start = have_load_end = have_omp = 0;
    rows = steps = reads = step_ns = gone = omitted = 0;
    exit_written = 0;
    n_threads = 0;
    cpu_host_reset();
    cpu_cgroup_reset();
    pthread_mutex_unlock(&cpu_lock);
}

static void cpu_open(void)
{
    pthread_mutex_lock(&cpu_lock);
    long every = hvprof_setting_int(HVS_CPU);
    step_reads = every > 0;
    step_every = every > 0 ? (uint32_t)every : 1u;
    atomic_store(&open_read, step_reads);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t v[3];
    if (fd < 0 || read_schedstat(fd, 0, v) != 0) {
        snprintf(reason, sizeof reason, "cannot read %s (%s): no per-thread CPU figures",
                 "/proc/self/task/<tid>/schedstat", strerror(errno ? errno : ENOENT));
        available = 0;
    } else {
        read_cost_ns = measure_read_cost(fd);
    }
    if (fd >= 0) close(fd);
    read_loadavg(loadavg_start, &have_load_start);
    const char *omp = getenv("OMP_NUM_THREADS");
    if (omp) {
        snprintf(omp_threads, sizeof omp_threads, "%s", omp);
        have_omp = 1;
    }
    snapshot(1);
    cpu_host_read(1);
    cpu_cgroup_open();
    write_sidecar("start");
    pthread_mutex_unlock(&cpu_lock);
}

static void cpu_close(int at_exit)
{
    if (at_exit && exit_written) return;
    pthread_mutex_lock(&cpu_lock);
    read_loadavg(loadavg_end, &have_load_end);
    snapshot(0);
    /* The host's window ends at the first close (MPI_Finalize): at exit a
     * rank converts its file and waits for the others, idle time that other
     * processes take without slowing the job. */
    if (!cpu_host_ended()) cpu_host_read(0);
    cpu_cgroup_close();
    write_sidecar(at_exit ? "exit" : "finalize");
    if (at_exit) exit_written = 1;
    pthread_mutex_unlock(&cpu_lock);
}

/* A forked child: the descriptors name the parent's threads; the lock may
 * have been held by a thread that does not exist here. */
static void cpu_atfork_child(void)
{
    pthread_mutex_init(&cpu_lock, NULL);
    for (uint32_t i = 0; i < HVPROF_TRACK_TABLE_CAPACITY; i++) {
        if (slots[i].fd >= 0) close(slots[i].fd);
        slots[i].fd = -1;
        slots[i].state = SLOT_NONE;
    }
    n_fds = 0;
    n_threads = 0;
    cpu_host_forget();
    cpu_cgroup_forget();
    atomic_store(&hvprof_helper_tid, 0);
}

/* The core's hooks (hvprof_backend): a file's start, its threads, its steps,
 * its ends. */
static const hvprof_backend cpu_backend = {
    .name = "cpu",
    .reset = cpu_reset,
    .opened = cpu_open,
    .track_new = cpu_track,
    .app_step = cpu_step,
    .closed = cpu_close,
    .atfork_child = cpu_atfork_child,
};

__attribute__((constructor)) static void cpu_ctor(void)
{
    for (uint32_t i = 0; i < HVPROF_TRACK_TABLE_CAPACITY; i++) slots[i].fd = -1;
    hvprof_register_backend(&cpu_backend);
}
