/*
 * cpu_internal.h -- what cpu.c (the rank's threads) and cpu_host.c (the host
 * around the rank: /proc/stat and every process) share: reading /proc,
 * writing JSON, and the host's interface.
 */
#ifndef HVPROF_CPU_INTERNAL_H
#define HVPROF_CPU_INTERNAL_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hvprof_internal.h"

static inline uint64_t delta(uint64_t now, uint64_t before) { return now > before ? now - before : 0; }

/* The fields of a /proc/.../stat line this file uses. */
typedef struct stat_fields {
    char comm[16];
    int32_t ppid;
    uint64_t utime, stime, starttime;
    int64_t cpu;
} stat_fields;

/* Parse "pid (comm) state ppid ... " (proc(5)): comm is between the first
 * '(' and the last ')' (it may hold both); then fields 3 on, by position. */
static inline int parse_stat(char *buf, stat_fields *f)
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
static inline int read_small(const char *path, char *buf, size_t size)
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

/* The calling thread's CPU time (ns): what the reads cost it, waits left out. */
static inline int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    char *buf;
    size_t n, k;
} jbuf;

__attribute__((format(printf, 2, 3))) static inline void jout(jbuf *j, const char *fmt, ...)
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
static inline void jstr(jbuf *j, const char *s)
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


/* The host around the rank (cpu_host.c), read at open and at the first
 * close, under cpu_lock (cpu.c). */
void cpu_host_read(int at_start);  /* /proc/stat and every process, timed */
int cpu_host_ended(void);          /* the end reading was taken */
void cpu_host_json(jbuf *j);       /* the sidecar's "host": {...} */
size_t cpu_host_json_bytes(void);  /* at most what cpu_host_json writes */
void cpu_host_reset(void);         /* a new file */
void cpu_host_forget(void);        /* a forked child */

/* The rank's cgroup (cpu_cgroup.c): its quota, period, cpuset and throttling
 * counters, read at open, at the read steps' boundaries and at each close,
 * under cpu_lock (cpu.c). */
void cpu_cgroup_open(void);          /* find the cgroup and its limit; the counters at start */
void cpu_cgroup_step(uint32_t seq);  /* the counters at a read step's boundary */
void cpu_cgroup_close(void);         /* the counters at the end */
void cpu_cgroup_json(jbuf *j);       /* the sidecar's "cgroup": {...} */
size_t cpu_cgroup_json_bytes(void);  /* at most what cpu_cgroup_json writes */
void cpu_cgroup_reset(void);         /* a new file */
void cpu_cgroup_forget(void);        /* a forked child */

#endif
