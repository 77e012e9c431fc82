/*
 * cpu_host.c -- the host around the rank, for the CPU sidecar (cpu.c's top
 * comment has the method): each CPU's busy, idle and steal ticks from
 * /proc/stat, and every process of /proc with its CPU ticks, read at open and
 * at the first close; written as the sidecar's "host" object.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <stdint.h>

#include "cpu_internal.h"

#define CPU_MAX_CPUS 1024     /* cpuN lines of /proc/stat kept */
#define CPU_MAX_PROCS 4096    /* processes held between the start and end scans */
#define CPU_PROCS_KEPT 512    /* processes written: the busiest, and this rank's own */

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

static host_snap host_start, host_end;
static cpu_proc procs[CPU_MAX_PROCS];
static int n_procs, n_sorted;      /* procs[0, n_sorted) sorted by pid */
static char host_reason[160];      /* why a host figure is missing */
/* the kernel's boot id: "hosts" that share it (network namespaces, containers
 * on one node) share the CPUs and see each other's processes */
static char boot_id[40];
static int host_ended;             /* the end reading was taken */

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

/* boot_id: /proc/sys/kernel/random/boot_id's 36 characters, or "" */
static void read_boot_id(void)
{
    boot_id[0] = 0;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, boot_id, sizeof boot_id - 1);
    close(fd);
    boot_id[n > 0 ? n : 0] = 0;
    for (char *c = boot_id; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || *c == '-')) *c = 0;
}

/* The host now: /proc/stat and the processes, timed (cpu_lock held). */
void cpu_host_read(int at_start)
{
    host_snap *h = at_start ? &host_start : &host_end;
    int64_t t0 = hvprof_mono_ns(), c0 = thread_cpu_ns();
    h->ticks = hvprof_ticks();
    h->seen = h->unreadable = h->omitted = 0;
    if (at_start) read_boot_id();
    h->have = read_proc_stat(h) == 0;
    if (!h->have)
        snprintf(host_reason, sizeof host_reason, "cannot read /proc/stat's cpuN lines (%s)",
                 strerror(errno ? errno : ENOENT));
    scan_procs(h, at_start);
    h->scan_ns = hvprof_mono_ns() - t0;
    h->scan_cpu_ns = thread_cpu_ns() - c0;
    if (!at_start) host_ended = 1;
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

/* The sidecar's "host": {"reason", "boot_id", "procs_kept", "start", "end",
 * "procs"}. */
void cpu_host_json(jbuf *j)
{
    int ended = host_ended;
    jout(j, "\"host\": {\"reason\": ");
    jstr(j, host_reason);
    jout(j, ", \"boot_id\": ");
    jstr(j, boot_id);
    jout(j, ", \"procs_kept\": %d, ", CPU_PROCS_KEPT);
    jhost(j, "start", &host_start, 1);
    jout(j, ", ");
    jhost(j, "end", &host_end, ended);
    jout(j, ", ");
    jprocs(j, ended);
    jout(j, "}");
}

size_t cpu_host_json_bytes(void)
{
    return sizeof host_reason * 6 + sizeof boot_id + 16 + (size_t)CPU_PROCS_KEPT * 220
           + (size_t)(host_start.n_cpus + host_end.n_cpus) * 90;
}

int cpu_host_ended(void) { return host_ended; }

void cpu_host_reset(void)
{
    n_procs = n_sorted = 0;
    host_start.have = host_end.have = 0;
    host_start.n_cpus = host_end.n_cpus = 0;
    host_reason[0] = 0;
    boot_id[0] = 0;
    host_ended = 0;
}

void cpu_host_forget(void)
{
    n_procs = n_sorted = 0;
    host_ended = 0;
}
