/*
 * cpu_cgroup.c -- the rank's CPU limits in the kernel's own terms, for the
 * CPU sidecar (cpu.c): the cgroup the process runs in (cgroup v1's cpu and
 * cpuset controllers, or cgroup v2), its CFS quota and period, its cpuset,
 * and its throttling counters (cpu.stat: nr_periods, nr_throttled,
 * throttled_time in ns on v1, throttled_usec on v2).
 *
 * A quota is hierarchical: a parent's limits its children.  The levels from
 * the process's cgroup up to the hierarchy's root are read, and the one with
 * the smallest quota over period is the limit (its path, quota and period are
 * written; its cpu.stat is the one read).  A process in a cgroup without a
 * quota anywhere above it has quota -1 and no per-step reads.
 *
 * Read at the raw file's open (the counters at start) and at each close (the
 * end), and at the boundaries of the steps whose CPU figures cpu.c reads
 * (one pread of the limit's cpu.stat, kept open): the counters' running
 * totals with the step's number, so that the analysis takes the steady
 * steps' throttling.  At most CG_STEPS marks: when full, every other one is
 * dropped and only steps that are multiples of a doubled stride are kept.  Never on a call's path.  A kernel or container without
 * the files makes an empty block that says why ("reason").
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdint.h>

#include "cpu_internal.h"

#define CG_STEPS 512 /* step marks kept at most: when full, every other is dropped */

typedef struct {
    uint64_t nr_periods, nr_throttled, throttled_ns;
    uint64_t ticks;
    int have;
} cg_stat;

typedef struct {
    uint32_t seq;
    uint64_t ticks, nr_periods, nr_throttled, throttled_ns;
} cg_mark;

static int cg_version;                 /* 1, 2, or 0: none found */
static char cg_path[PATH_MAX];         /* the process's cgroup (as /proc/self/cgroup names it) */
static char cg_limit_path[PATH_MAX];   /* the limiting level's, "" without a quota */
static char cg_limit_dir[PATH_MAX];    /* its folder */
static long long cg_quota_us = -1, cg_period_us = -1;
static char cg_cpuset[256];            /* the effective cpuset, as the kernel lists it */
static char cg_cpuset_path[PATH_MAX];  /* its cgroup (v1: the cpuset controller's own) */
static char cg_reason[160];
static int cg_fd = -1;                 /* the limit's cpu.stat, kept open */
static cg_stat cg_start, cg_end;
static cg_mark cg_marks[CG_STEPS];
static uint32_t n_cg_marks, cg_stride = 1; /* after the first halving: steps % stride */
static uint64_t cg_marks_dropped;

/* The line of /proc/self/cgroup for a v1 controller (ctl: "cpu", "cpuset"),
 * or the v2 line (ctl NULL): its path into out. */
static int proc_cgroup(const char *ctl, char *out, size_t n)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return -1;
    char line[PATH_MAX + 256];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c1 || !c2) continue;
        *c2 = 0;
        const char *ctls = c1 + 1, *path = c2 + 1;
        if (!ctl) {
            if (strncmp(line, "0", 1) == 0 && *ctls == 0) {
                snprintf(out, n, "%s", path);
                found = 0;
            }
            continue;
        }
        /* "cpu,cpuacct": the controller as a whole comma-separated token */
        char buf[256];
        snprintf(buf, sizeof buf, "%s", ctls);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save))
            if (strcmp(tok, ctl) == 0) {
                snprintf(out, n, "%s", path);
                found = 0;
                break;
            }
    }
    fclose(f);
    return found;
}

/* The mount of a v1 controller (ctl) or of cgroup2 (ctl NULL) from
 * /proc/self/mountinfo: its mount point and the hierarchy's path it shows
 * (root: "/" unless a subtree was bound there, as some containers do). */
static int cg_mount(const char *ctl, char *mnt, size_t nm, char *root, size_t nr)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f) return -1;
    char line[2 * PATH_MAX];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        /* id parent maj:min root mountpoint opts [optional...] - fstype source superopts */
        char r[PATH_MAX], m[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", r, m) != 2) continue;
        char *dash = strstr(line, " - ");
        if (!dash) continue;
        char fstype[64], src[256], sopts[1024];
        if (sscanf(dash + 3, "%63s %255s %1023s", fstype, src, sopts) != 3) continue;
        if (!ctl) {
            if (strcmp(fstype, "cgroup2") != 0) continue;
        } else {
            if (strcmp(fstype, "cgroup") != 0) continue;
            int has = 0;
            for (char *save = NULL, *tok = strtok_r(sopts, ",", &save); tok && !has;
                 tok = strtok_r(NULL, ",", &save))
                has = strcmp(tok, ctl) == 0;
            if (!has) continue;
        }
        snprintf(mnt, nm, "%s", m);
        snprintf(root, nr, "%s", r);
        found = 0;
    }
    fclose(f);
    return found;
}

/* The folder of a cgroup path under a mount (the mount's root taken off). */
static void cg_dir(const char *mnt, const char *root, const char *path, char *out, size_t n)
{
    size_t rl = strlen(root);
    const char *rest = path;
    if (strcmp(root, "/") != 0 && strncmp(path, root, rl) == 0) rest = path + rl;
    if (strcmp(rest, "/") == 0) rest = "";
    snprintf(out, n, "%s%s", mnt, rest);
}

static int read_file(const char *dir, const char *name, char *buf, size_t n)
{
    char p[PATH_MAX + 64];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p) return -1;
    return read_small(p, buf, n);
}

/* The quota and period of one level (-1: none, or unreadable). */
static void level_quota(const char *dir, long long *quota, long long *period)
{
    char buf[128];
    *quota = *period = -1;
    if (cg_version == 1) {
        if (read_file(dir, "cpu.cfs_quota_us", buf, sizeof buf) == 0) *quota = strtoll(buf, NULL, 10);
        if (read_file(dir, "cpu.cfs_period_us", buf, sizeof buf) == 0)
            *period = strtoll(buf, NULL, 10);
    } else if (read_file(dir, "cpu.max", buf, sizeof buf) == 0) { /* "max 100000" | "Q P" */
        char q[32];
        long long p = -1;
        if (sscanf(buf, "%31s %lld", q, &p) >= 1) {
            *quota = strcmp(q, "max") == 0 ? -1 : strtoll(q, NULL, 10);
            *period = p;
        }
    }
    if (*quota <= 0 || *period <= 0) *quota = -1;
}

/* cpu.stat's throttling counters (pread of the open descriptor). */
static int read_cg_stat(cg_stat *s)
{
    s->have = 0;
    if (cg_fd < 0) return -1;
    char buf[1024];
    ssize_t n;
    do {
        n = pread(cg_fd, buf, sizeof buf - 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return -1;
    buf[n] = 0;
    s->ticks = hvprof_ticks();
    s->nr_periods = s->nr_throttled = s->throttled_ns = 0;
    for (char *line = buf; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = 0;
        char key[64];
        unsigned long long v;
        if (sscanf(line, "%63s %llu", key, &v) == 2) {
            if (strcmp(key, "nr_periods") == 0) s->nr_periods = v;
            else if (strcmp(key, "nr_throttled") == 0) s->nr_throttled = v;
            else if (strcmp(key, "throttled_time") == 0) s->throttled_ns = v;       /* v1: ns */
            else if (strcmp(key, "throttled_usec") == 0) s->throttled_ns = v * 1000; /* v2 */
        }
        line = next;
    }
    s->have = 1;
    return 0;
}

void cpu_cgroup_open(void)
{
    char mnt[PATH_MAX], root[PATH_MAX], own[PATH_MAX];
    cg_version = 0;
    /* v1's cpu controller where it is mounted (hybrid systems keep cpu on v1
     * and leave cgroup2 without it); else cgroup2 */
    if (proc_cgroup("cpu", cg_path, sizeof cg_path) == 0
        && cg_mount("cpu", mnt, sizeof mnt, root, sizeof root) == 0) {
        cg_version = 1;
    } else if (proc_cgroup(NULL, cg_path, sizeof cg_path) == 0
               && cg_mount(NULL, mnt, sizeof mnt, root, sizeof root) == 0) {
        cg_version = 2;
    } else {
        snprintf(cg_reason, sizeof cg_reason,
                 "no cgroup cpu controller found (/proc/self/cgroup, /proc/self/mountinfo)");
        return;
    }
    cg_dir(mnt, root, cg_path, own, sizeof own);
    /* from the process's level up to the hierarchy's root: the tightest quota */
    char level[PATH_MAX], best[PATH_MAX] = "";
    double best_share = 0;
    snprintf(level, sizeof level, "%s", cg_path);
    for (;;) {
        char dir[PATH_MAX];
        cg_dir(mnt, root, level, dir, sizeof dir);
        long long q, p;
        level_quota(dir, &q, &p);
        if (q > 0 && (!best[0] || (double)q / (double)p < best_share)) {
            best_share = (double)q / (double)p;
            snprintf(best, sizeof best, "%s", level);
            snprintf(cg_limit_dir, sizeof cg_limit_dir, "%s", dir);
            cg_quota_us = q;
            cg_period_us = p;
        }
        char *slash = strrchr(level, '/');
        if (!slash || strcmp(level, "/") == 0 || strlen(dir) <= strlen(mnt)) break;
        if (slash == level) level[1] = 0;
        else *slash = 0;
    }
    snprintf(cg_limit_path, sizeof cg_limit_path, "%s", best);
    char stat_path[PATH_MAX + 16];
    snprintf(stat_path, sizeof stat_path, "%s/cpu.stat", best[0] ? cg_limit_dir : own);
    cg_fd = open(stat_path, O_RDONLY | O_CLOEXEC);
    if (cg_fd < 0) snprintf(cg_reason, sizeof cg_reason, "cannot read %.120s", stat_path);
    read_cg_stat(&cg_start);
    /* the cpuset: v1's own controller, or cgroup2's file (where enabled) */
    char cpath[PATH_MAX], cdir[PATH_MAX];
    cg_cpuset[0] = 0;
    if (proc_cgroup("cpuset", cpath, sizeof cpath) == 0
        && cg_mount("cpuset", mnt, sizeof mnt, root, sizeof root) == 0) {
        snprintf(cg_cpuset_path, sizeof cg_cpuset_path, "%s", cpath);
        cg_dir(mnt, root, cpath, cdir, sizeof cdir);
        if (read_file(cdir, "cpuset.effective_cpus", cg_cpuset, sizeof cg_cpuset) != 0)
            read_file(cdir, "cpuset.cpus", cg_cpuset, sizeof cg_cpuset);
    } else if (cg_version == 2) {
        snprintf(cg_cpuset_path, sizeof cg_cpuset_path, "%s", cg_path);
        read_file(own, "cpuset.cpus.effective", cg_cpuset, sizeof cg_cpuset);
    }
    cg_cpuset[strcspn(cg_cpuset, "\n")] = 0;
}

/* A step's read (cpu.c's cadence): the counters' running totals. */
void cpu_cgroup_step(uint32_t seq)
{
    if (cg_quota_us <= 0 || cg_fd < 0) return;
    if (cg_stride > 1 && seq % cg_stride != 0) return;
    if (n_cg_marks >= CG_STEPS) { /* bounded, spread over the whole run */
        uint32_t k = 0;
        for (uint32_t i = 0; i < n_cg_marks; i += 2) cg_marks[k++] = cg_marks[i];
        cg_marks_dropped += n_cg_marks - k;
        n_cg_marks = k;
        cg_stride = cg_stride > 1 ? cg_stride * 2 : 32;
    }
    cg_stat s;
    if (read_cg_stat(&s) != 0) return;
    cg_marks[n_cg_marks++] = (cg_mark){seq, s.ticks, s.nr_periods, s.nr_throttled,
                                       s.throttled_ns};
}

void cpu_cgroup_close(void) { read_cg_stat(&cg_end); }

/* five strings of up to PATH_MAX bytes, each at most 6x when escaped */
size_t cpu_cgroup_json_bytes(void) { return 32 * PATH_MAX + 1024 + (size_t)n_cg_marks * 96; }

static void jstat(jbuf *j, const char *key, const cg_stat *s)
{
    if (!s->have) {
        jout(j, "\"%s\": null", key);
        return;
    }
    jout(j, "\"%s\": {\"nr_periods\": %llu, \"nr_throttled\": %llu, \"throttled_ns\": %llu, "
         "\"ticks\": %llu}", key, (unsigned long long)s->nr_periods,
         (unsigned long long)s->nr_throttled, (unsigned long long)s->throttled_ns,
         (unsigned long long)s->ticks);
}

void cpu_cgroup_json(jbuf *j)
{
    jout(j, "\"cgroup\": {\"version\": %d, \"path\": ", cg_version);
    jstr(j, cg_path);
    jout(j, ", \"limit_path\": ");
    jstr(j, cg_limit_path);
    jout(j, ", \"quota_us\": %lld, \"period_us\": %lld, \"cpuset\": ", cg_quota_us, cg_period_us);
    jstr(j, cg_cpuset);
    jout(j, ", \"cpuset_path\": ");
    jstr(j, cg_cpuset_path);
    jout(j, ", \"reason\": ");
    jstr(j, cg_reason);
    jout(j, ", ");
    jstat(j, "start", &cg_start);
    jout(j, ", ");
    jstat(j, "end", &cg_end);
    jout(j, ", \"marks_dropped\": %llu, \"steps\": [", (unsigned long long)cg_marks_dropped);
    for (uint32_t i = 0; i < n_cg_marks; i++)
        jout(j, "%s[%u, %llu, %llu, %llu, %llu]", i ? ", " : "", cg_marks[i].seq,
             (unsigned long long)cg_marks[i].ticks, (unsigned long long)cg_marks[i].nr_periods,
             (unsigned long long)cg_marks[i].nr_throttled,
             (unsigned long long)cg_marks[i].throttled_ns);
    jout(j, "]}");
}

void cpu_cgroup_reset(void)
{
    if (cg_fd >= 0) close(cg_fd);
    cg_fd = -1;
    cg_version = 0;
    cg_path[0] = cg_limit_path[0] = cg_limit_dir[0] = cg_cpuset[0] = cg_reason[0] = 0;
    cg_cpuset_path[0] = 0;
    cg_quota_us = cg_period_us = -1;
    memset(&cg_start, 0, sizeof cg_start);
    memset(&cg_end, 0, sizeof cg_end);
    n_cg_marks = 0;
    cg_stride = 1;
    cg_marks_dropped = 0;
}

/* A forked child: the descriptor is the parent's (the same file: kept). */
void cpu_cgroup_forget(void) { n_cg_marks = 0; }
