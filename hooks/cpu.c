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

#include "hvprof_internal.h"

#define CPU_MAX_FDS 64        /* descriptors kept open (threads beyond: open each time) */
#define CPU_MAX_THREADS 1024  /* threads listed in the sidecar */
#define CPU_COST_READS 9      /* reads timed at start (read_cost_ns: their median) */
#define CPU_MAX_CPUS 1024     /* cpuN lines of /proc/stat kept */
#define CPU_MAX_PROCS 4096    /* processes held between the start and end scans */
#define CPU_PROCS_KEPT 512    /* processes written: the busiest, and this rank's own */

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

/* One CPU's /proc/stat line, clock ticks: busy = user + nice + system + irq +
 * softirq (guest time is inside user), idle = idle + iowait, steal apart (the
 * hypervisor's, no process of this host). */
typedef struct cpu_stat {
    int32_t cpu;
    uint64_t busy, idle, steal;
} cpu_stat;

/* One whole-host reading (/proc/stat and the process scan). */
typedef struct host_snap {
    int have;                      /* /proc/stat read */
    int n_cpus;
    uint64_t ticks;                /* when (hvprof ticks) */
    int64_t scan_ns, scan_cpu_ns;  /* its cost (wall, thread CPU): /proc/stat and the scan */
    uint64_t seen, unreadable, omitted; /* processes listed, unreadable, past capacity */
    cpu_stat cpus[CPU_MAX_CPUS];
} host_snap;

/* A process of the host at the scans: utime + stime ticks at each. */
typedef struct cpu_proc {
    int32_t pid, ppid;
    int32_t last_cpu;
    uint8_t at_start, at_end;
    uint16_t pad;
    uint64_t starttime;            /* field 22: tells a reused pid */
    uint64_t start_ticks, end_ticks;
    char comm[16];
} cpu_proc;

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
static uint32_t step_every = HVPROF_CPU_DEFAULT_EVERY;
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
static host_snap host_start, host_end;
static cpu_proc procs[CPU_MAX_PROCS];
static int n_procs, n_sorted;      /* procs[0, n_sorted) sorted by pid */
static char host_reason[160];      /* why a host figure is missing */
static int host_ended;             /* the end reading was taken */

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

/* The fields of a /proc/.../stat line this file uses. */
typedef struct stat_fields {
    char comm[16];
    int32_t ppid;
    uint64_t utime, stime, starttime;
    int64_t cpu;
} stat_fields;

/* Parse "pid (comm) state ppid ... " (proc(5)): comm is between the first
 * '(' and the last ')' (it may hold both); then fields 3 on, by position. */
static int parse_stat(char *buf, stat_fields *f)
{
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    if (!l || !r || r < l) return -1;
    size_t n = (size_t)(r - l - 1);
    if (n > sizeof f->comm - 1) n = sizeof f->comm - 1;
    memcpy(f->comm, l + 1, n);
    f->comm[n] = 0;
    f->cpu = -1;
    char *p = r + 1;
    for (int field = 3; field <= 39; field++) {
        while (*p == ' ') p++;
        if (!*p) return field > 22 ? 0 : -1; /* an old kernel: no processor field */
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (field == 3) end = p + 1; /* the state letter */
        else if (end == p) return -1;
        if (field == 4) f->ppid = (int32_t)v;
        else if (field == 14) f->utime = v;
        else if (field == 15) f->stime = v;
        else if (field == 22) f->starttime = v;
        else if (field == 39) f->cpu = (int64_t)(long long)v;
        p = end;
    }
    return 0;
}

/* Read a small proc file whole into buf (NUL-terminated); -1 on error. */
static int read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n;
    do {
        n = read(fd, buf, size - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    return 0;
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

static inline uint64_t delta(uint64_t now, uint64_t before) { return now > before ? now - before : 0; }

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

/* The calling thread's CPU time (ns): what the reads cost it, waits left out. */
static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
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

/* /proc/stat's cpuN lines into h (busy, idle, steal ticks); 0 when read. */
static int read_proc_stat(host_snap *h)
{
    FILE *f = fopen("/proc/stat", "re");
    if (!f) return -1;
    char line[512];
    h->n_cpus = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "cpu", 3) != 0) break; /* the cpu lines come first */
        if (line[3] < '0' || line[3] > '9') continue; /* the "cpu" total */
        unsigned long long v[8] = {0};
        int cpu;
        int n = sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0],
                       &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
        if (n < 5 || h->n_cpus >= CPU_MAX_CPUS) continue;
        cpu_stat *c = &h->cpus[h->n_cpus++];
        c->cpu = cpu;
        c->busy = v[0] + v[1] + v[2] + v[5] + v[6]; /* user nice system irq softirq */
        c->idle = v[3] + v[4];                      /* idle iowait */
        c->steal = v[7];
    }
    fclose(f);
    return h->n_cpus > 0 ? 0 : -1;
}

static int cmp_proc_pid(const void *a, const void *b)
{
    int32_t x = ((const cpu_proc *)a)->pid, y = ((const cpu_proc *)b)->pid;
    return (x > y) - (x < y);
}

/* The entry of pid (the sorted part, then what this scan appended). */
static cpu_proc *proc_find(int32_t pid)
{
    int lo = 0, hi = n_sorted;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (procs[mid].pid < pid) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_sorted && procs[lo].pid == pid ? &procs[lo] : NULL;
}

/* Every process of /proc now, into its start or end figures. */
static void scan_procs(host_snap *h, int at_start)
{
    DIR *d = opendir("/proc");
    if (!d) {
        snprintf(host_reason, sizeof host_reason, "cannot list /proc (%s)", strerror(errno));
        return;
    }
    struct dirent *de;
    char path[64], buf[1024];
    while ((de = readdir(d)) != NULL) {
        char *endp;
        long pid = strtol(de->d_name, &endp, 10);
        if (endp == de->d_name || *endp || pid <= 0 || pid > INT32_MAX) continue;
        stat_fields f;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        if (read_small(path, buf, sizeof buf) != 0 || parse_stat(buf, &f) != 0) {
            h->unreadable++; /* exited meanwhile, or hidden (hidepid) */
            continue;
        }
        h->seen++;
        cpu_proc *e = proc_find((int32_t)pid);
        if (e && e->starttime != f.starttime) { /* the pid was reused: a new process */
            e->at_start = 0;
            e->start_ticks = 0;
        }
        if (!e) {
            if (n_procs >= CPU_MAX_PROCS) {
                h->omitted++;
                continue;
            }
            e = &procs[n_procs++];
            memset(e, 0, sizeof *e);
            e->pid = (int32_t)pid;
        }
        e->ppid = f.ppid;
        e->starttime = f.starttime;
        e->last_cpu = (int32_t)f.cpu;
        memcpy(e->comm, f.comm, sizeof e->comm);
        if (at_start) {
            e->start_ticks = f.utime + f.stime;
            e->at_start = 1;
        } else {
            e->end_ticks = f.utime + f.stime;
            e->at_end = 1;
        }
    }
    closedir(d);
    qsort(procs, (size_t)n_procs, sizeof procs[0], cmp_proc_pid);
    n_sorted = n_procs;
}

/* The host now: /proc/stat and the processes, timed (cpu_lock held). */
static void host_read(int at_start)
{
    host_snap *h = at_start ? &host_start : &host_end;
    int64_t t0 = hvprof_mono_ns(), c0 = thread_cpu_ns();
    h->ticks = hvprof_ticks();
    h->seen = h->unreadable = h->omitted = 0;
    h->have = read_proc_stat(h) == 0;
    if (!h->have)
        snprintf(host_reason, sizeof host_reason, "cannot read /proc/stat's cpuN lines (%s)",
                 strerror(errno ? errno : ENOENT));
    scan_procs(h, at_start);
    h->scan_ns = hvprof_mono_ns() - t0;
    h->scan_cpu_ns = thread_cpu_ns() - c0;
    if (!at_start) host_ended = 1;
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

typedef struct {
    char *buf;
    size_t n, k;
} jbuf;

__attribute__((format(printf, 2, 3))) static void jout(jbuf *j, const char *fmt, ...)
{
    if (j->k >= j->n) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(j->buf + j->k, j->n - j->k, fmt, ap);
    va_end(ap);
    if (w > 0) j->k += (size_t)w;
}

/* A JSON string, ASCII only: quotes, control characters and bytes >= 0x80
 * escaped (a thread name is bytes, not necessarily UTF-8). */
static void jstr(jbuf *j, const char *s)
{
    jout(j, "\"");
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') jout(j, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) jout(j, "\\u%04x", c);
        else jout(j, "%c", c);
    }
    jout(j, "\"");
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

/* One host reading: {"ticks", "scan_ns", "scan_cpu_ns", "procs_seen",
 * "procs_unreadable", "procs_omitted", "cpus": [[cpu, busy, idle, steal], ...]}
 * or null. */
static void jhost(jbuf *j, const char *key, const host_snap *h, int taken)
{
    if (!taken) {
        jout(j, "\"%s\": null", key);
        return;
    }
    jout(j, "\"%s\": {\"ticks\": %llu, \"scan_ns\": %lld, \"scan_cpu_ns\": %lld, "
         "\"procs_seen\": %llu, \"procs_unreadable\": %llu, \"procs_omitted\": %llu, "
         "\"cpus\": [", key, (unsigned long long)h->ticks, (long long)h->scan_ns,
         (long long)h->scan_cpu_ns, (unsigned long long)h->seen,
         (unsigned long long)h->unreadable, (unsigned long long)h->omitted);
    for (int i = 0; h->have && i < h->n_cpus; i++)
        jout(j, "%s[%d, %llu, %llu, %llu]", i ? ", " : "", (int)h->cpus[i].cpu,
             (unsigned long long)h->cpus[i].busy, (unsigned long long)h->cpus[i].idle,
             (unsigned long long)h->cpus[i].steal);
    jout(j, "]}");
}

/* A process's CPU ticks in the run: since the start scan, or all of them
 * when it began after it; at the "start" write, all so far. */
static uint64_t proc_used(const cpu_proc *p, int ended)
{
    if (!ended) return p->start_ticks;
    if (!p->at_end) return 0;
    return p->at_start ? delta(p->end_ticks, p->start_ticks) : p->end_ticks;
}

static int cmp_used_desc(const void *a, const void *b)
{
    uint64_t x = ((const uint64_t *)a)[0], y = ((const uint64_t *)b)[0];
    return (x < y) - (x > y);
}

/* "procs": the CPU_PROCS_KEPT busiest (proc_used), this rank's own first:
 * [{"pid", "ppid", "name", "cpu" (last CPU), "start", "end" (utime + stime
 * ticks at the scans; null: not seen there), "own"}]. */
static void jprocs(jbuf *j, int ended)
{
    static uint64_t order[CPU_MAX_PROCS][2]; /* (ticks used, index): cpu_lock held */
    int n = 0;
    int32_t self = (int32_t)getpid();
    for (int i = 0; i < n_procs; i++) {
        const cpu_proc *p = &procs[i];
        if (ended && !p->at_end) continue; /* gone before the end: its time is unknown */
        order[n][0] = p->pid == self ? UINT64_MAX : proc_used(p, ended);
        order[n][1] = (uint64_t)i;
        n++;
    }
    qsort(order, (size_t)n, sizeof order[0], cmp_used_desc);
    if (n > CPU_PROCS_KEPT) n = CPU_PROCS_KEPT;
    jout(j, "\"procs\": [");
    for (int k = 0; k < n; k++) {
        const cpu_proc *p = &procs[order[k][1]];
        jout(j, "%s{\"pid\": %d, \"ppid\": %d, \"name\": ", k ? ", " : "", (int)p->pid,
             (int)p->ppid);
        jstr(j, p->comm);
        jout(j, ", \"cpu\": %d, \"start\": ", (int)p->last_cpu);
        if (p->at_start) jout(j, "%llu", (unsigned long long)p->start_ticks);
        else jout(j, "null");
        jout(j, ", \"end\": ");
        if (ended && p->at_end) jout(j, "%llu", (unsigned long long)p->end_ticks);
        else jout(j, "null");
        jout(j, ", \"own\": %s}", p->pid == self ? "true" : "false");
    }
    jout(j, "]");
}

/* Rewrite raw/rank-R.cpu.json (cpu_lock held). */
static void write_sidecar(const char *state)
{
    char path[PATH_MAX];
    if (hvprof_sidecar_path(path, sizeof path, ".cpu.json") != 0) return;
    int ended = host_ended;
    jbuf j = {NULL, 8192 + (size_t)n_threads * 640 + sizeof reason * 6
                        + sizeof host_reason * 6 + (size_t)CPU_PROCS_KEPT * 220
                        + (size_t)(host_start.n_cpus + host_end.n_cpus) * 90, 0};
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
    jout(&j, "], \"clk_tck\": %ld, \"host\": {\"reason\": ", sysconf(_SC_CLK_TCK));
    jstr(&j, host_reason);
    jout(&j, ", \"procs_kept\": %d, ", CPU_PROCS_KEPT);
    jhost(&j, "start", &host_start, 1);
    jout(&j, ", ");
    jhost(&j, "end", &host_end, ended);
    jout(&j, ", ");
    jprocs(&j, ended);
    jout(&j, "}, ");
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
    step_every = HVPROF_CPU_DEFAULT_EVERY;
    atomic_store(&open_read, 1);
    reason[0] = 0;
    read_cost_ns = -1;
    have_load_start = have_load_end = have_omp = 0;
    rows = steps = reads = step_ns = gone = omitted = 0;
    exit_written = 0;
    n_threads = 0;
    n_procs = n_sorted = 0;
    host_start.have = host_end.have = 0;
    host_start.n_cpus = host_end.n_cpus = 0;
    host_reason[0] = 0;
    host_ended = 0;
    pthread_mutex_unlock(&cpu_lock);
}

static void cpu_open(void)
{
    pthread_mutex_lock(&cpu_lock);
    const char *setting = hvprof_setting("HOROVOD_PROFILE_CPU");
    char *end = NULL;
    long every = setting && *setting ? strtol(setting, &end, 10) : -1;
    if (every < 0 || every > HVPROF_CPU_MAX_EVERY || (end && *end))
        every = HVPROF_CPU_DEFAULT_EVERY;
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
    host_read(1);
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
    if (!host_ended) host_read(0);
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
    n_procs = n_sorted = 0;
    host_ended = 0;
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
