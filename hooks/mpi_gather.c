/*
 * mpi_gather.c -- every rank's files at rank 0 when the ranks share no disk,
 * over the job's own MPI, at MPI_Finalize (mpi.c calls mpi_gather_files
 * after closing the raw file, before PMPI_Finalize), as mpiP and Darshan
 * deliver their reports.
 *
 * Rank 0 decides from what it can see, not from a setting: every rank sends
 * its raw file's identity (pid and start calibration, from the header); rank
 * 0 reads the header at that rank's path in its own profile directory, and a
 * rank whose file it sees there (a shared file system, or the same host)
 * sends nothing.  The others send, one rank after another when rank 0 asks
 * (an ordered gather): each of their files in the profile directory (raw/
 * and hang/, rank-R.*) in chunks of GATHER_CHUNK bytes, so rank 0 holds one
 * chunk at a time whatever the job's size.  Rank 0 writes each file under a
 * temporary name and renames it when complete; its raw header is marked
 * closed and converted by the exit merge (self_converts 0), and
 * raw/rank-R.gathered.json says where it came from.  A rank that cannot
 * read a file still sends its length (zeros) and then the error: rank 0
 * drops that file.  Rank 0 that cannot write drains what it is sent and
 * says so once.  HOROVOD_PROFILE_GATHER=off (rank 0's) turns it all off.
 *
 * Before sending, a rank calls the callback its Python runtime registered
 * (hvprof_set_gather_callback): the facts only the process knows
 * (raw/rank-R.facts.json), which the rank can no longer give its dataset
 * itself on a disk rank 0 sees.  The rank then converts nothing at its exit
 * (hvprof_gathered).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mpi_internal.h"

#define GATHER_CHUNK (4u << 20)
#define TAG_GO 7301
#define TAG_FILE 7302
#define TAG_DATA 7303
#define TAG_STATUS 7304

typedef struct {
    int64_t pid, cal0_ticks, cal0_realtime_ns; /* all 0: nothing to send */
} identity;

typedef struct {
    char name[200]; /* "raw/rank-00001.hvprof"; "" ends the rank's files */
    int64_t size;
} file_msg;

static _Atomic hvprof_callback gather_callback;
static _Atomic int gathered;

HVPROF_EXPORT void hvprof_set_gather_callback(hvprof_callback fn)
{
    atomic_store(&gather_callback, fn);
}
HVPROF_EXPORT int hvprof_gathered(void) { return atomic_load(&gathered); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank 0 sees rank r's own raw file at r's path in its directory. */
static int sees(const char *dir, int r, const identity *id)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/raw/rank-%05d.hvprof", dir, r);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    hvprof_file_header h;
    ssize_t n = pread(fd, &h, sizeof h, 0);
    close(fd);
    return n == (ssize_t)sizeof h && memcmp(h.magic, HVPROF_MAGIC, 8) == 0 &&
           h.pid == id->pid && h.cal0_ticks == id->cal0_ticks &&
           h.cal0_realtime_ns == id->cal0_realtime_ns;
}

/* This rank's files, by name relative to the directory: raw/rank-R.* and
 * hang/rank-R.* (regular files, temporaries left out).  Returns the count. */
static int own_files(const char *dir, int rank, char names[][200], int cap)
{
    static const char *const subs[] = {"raw", "hang"};
    char prefix[32];
    snprintf(prefix, sizeof prefix, "rank-%05d.", rank);
    int n = 0;
    for (size_t s = 0; s < sizeof subs / sizeof *subs; s++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, subs[s]);
        DIR *d = opendir(path);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) && n < cap) {
            size_t len = strlen(e->d_name);
            if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || strstr(e->d_name, ".tmp") ||
                len + strlen(subs[s]) + 2 > sizeof names[0])
                continue;
            memcpy(names[n], subs[s], strlen(subs[s]));
            names[n][strlen(subs[s])] = '/';
            memcpy(names[n] + strlen(subs[s]) + 1, e->d_name, len + 1);
            char full[PATH_MAX];
            struct stat st;
            snprintf(full, sizeof full, "%s/%s", dir, names[n]);
            if (stat(full, &st) == 0 && S_ISREG(st.st_mode)) n++;
        }
        closedir(d);
    }
    return n;
}

/* A sending rank: each file's name and size, its bytes in chunks, a status. */
static void send_files(MPI_Comm comm, const char *dir, int rank, char *buf)
{
    enum { MAX_FILES = 64 };
    static char names[MAX_FILES][200];
    int n = own_files(dir, rank, names, MAX_FILES);
    for (int i = 0; i < n; i++) {
        char full[PATH_MAX + 256];
        snprintf(full, sizeof full, "%.1024s/%.199s", dir, names[i]);
        int fd = open(full, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            if (fd >= 0) close(fd);
            continue;
        }
        file_msg m;
        memset(&m, 0, sizeof m);
        snprintf(m.name, sizeof m.name, "%.199s", names[i]);
        m.size = st.st_size;
        PMPI_Send(&m, (int)sizeof m, MPI_BYTE, 0, TAG_FILE, comm);
        int status = 0;
        for (int64_t off = 0; off < m.size;) {
            size_t k = (size_t)(m.size - off < GATHER_CHUNK ? m.size - off : GATHER_CHUNK);
            ssize_t got = status ? -1 : pread(fd, buf, k, off);
            if (got < (ssize_t)k) { /* unreadable or shorter now: the length still goes */
                if (!status) status = got < 0 ? errno : EIO;
                if (!status) status = EIO;
                memset(buf + (got > 0 ? got : 0), 0, k - (size_t)(got > 0 ? got : 0));
            }
            PMPI_Send(buf, (int)k, MPI_BYTE, 0, TAG_DATA, comm);
            off += (int64_t)k;
        }
        close(fd);
        PMPI_Send(&status, 1, MPI_INT, 0, TAG_STATUS, comm);
    }
    file_msg end;
    memset(&end, 0, sizeof end);
    PMPI_Send(&end, (int)sizeof end, MPI_BYTE, 0, TAG_FILE, comm);
}

typedef struct {
    int failed_errno;     /* the first write error (0: none) */
    char failed_path[PATH_MAX + 32];
    long long bytes;
    int files;
} recv_state;

/* Rank 0: rank r's files into the directory. */
static void receive_files(MPI_Comm comm, const char *dir, int r, char *buf, recv_state *rs,
                          char *host, size_t host_n)
{
    long long bytes = 0;
    int files = 0;
    for (;;) {
        file_msg m;
        PMPI_Recv(&m, (int)sizeof m, MPI_BYTE, r, TAG_FILE, comm, MPI_STATUS_IGNORE);
        m.name[sizeof m.name - 1] = 0;
        if (!m.name[0]) break;
        /* Only names this protocol makes: raw/ or hang/, no path above them. */
        int ok_name = (strncmp(m.name, "raw/", 4) == 0 || strncmp(m.name, "hang/", 5) == 0) &&
                      !strstr(m.name, "..") && strchr(strchr(m.name, '/') + 1, '/') == NULL;
        char final[PATH_MAX], tmp[PATH_MAX + 32];
        snprintf(final, sizeof final, "%s/%s", dir, m.name);
        snprintf(tmp, sizeof tmp, "%s.gather.tmp", final);
        int fd = -1;
        if (ok_name) {
            if (strncmp(m.name, "hang/", 5) == 0) {
                char sub[PATH_MAX];
                snprintf(sub, sizeof sub, "%s/hang", dir);
                mkdir(sub, 0755);
            }
            fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0 && !rs->failed_errno) {
                rs->failed_errno = errno;
                snprintf(rs->failed_path, sizeof rs->failed_path, "%s", tmp);
            }
        }
        int is_raw = ok_name && strlen(m.name) > 7 &&
                     strcmp(m.name + strlen(m.name) - 7, ".hvprof") == 0;
        for (int64_t off = 0; off < m.size;) {
            size_t k = (size_t)(m.size - off < GATHER_CHUNK ? m.size - off : GATHER_CHUNK);
            PMPI_Recv(buf, (int)k, MPI_BYTE, r, TAG_DATA, comm, MPI_STATUS_IGNORE);
            if (off == 0 && is_raw && k >= sizeof(hvprof_file_header)) {
                /* A complete copy: closed, converted by the exit merge. */
                hvprof_file_header *h = (hvprof_file_header *)(void *)buf;
                h->state |= HVPROF_STATE_CLOSED;
                h->self_converts = 0;
                snprintf(host, host_n, "%.*s", (int)sizeof h->hostname, h->hostname);
            }
            if (fd >= 0 && write(fd, buf, k) != (ssize_t)k) {
                if (!rs->failed_errno) {
                    rs->failed_errno = errno ? errno : EIO;
                    snprintf(rs->failed_path, sizeof rs->failed_path, "%s", tmp);
                }
                close(fd);
                unlink(tmp);
                fd = -1;
            }
            off += (int64_t)k;
        }
        int status = 0;
        PMPI_Recv(&status, 1, MPI_INT, r, TAG_STATUS, comm, MPI_STATUS_IGNORE);
        if (fd >= 0) {
            int ok = close(fd) == 0 && status == 0 && rename(tmp, final) == 0;
            if (!ok) unlink(tmp);
            else {
                bytes += m.size;
                files++;
            }
        }
    }
    rs->bytes += bytes;
    rs->files += files;
    if (files) { /* where they came from, for the merge's metadata */
        char path[PATH_MAX], text[512];
        snprintf(path, sizeof path, "%s/raw/rank-%05d.gathered.json", dir, r);
        snprintf(text, sizeof text, "{\"rank\": %d, \"host\": \"%s\", \"files\": %d, "
                 "\"bytes\": %lld, \"over\": \"mpi\"}", r, host, files, bytes);
        for (char *c = text; *c; c++)
            if ((unsigned char)*c < 32) *c = '?';
        hvprof_write_text(path, text);
    }
}

int mpi_gather_files(MPI_Comm comm, int me, int size, const hvprof_file_header *h,
                     const char *dir)
{
    if (size < 2) return 0;
    double t_in = now_s();
    identity mine = {0, 0, 0};
    if (h) mine = (identity){h->pid, h->cal0_ticks, h->cal0_realtime_ns};
    identity *all = NULL;
    int *need = NULL;
    int on = me == 0 && h && dir && *dir && hvprof_setting_int(HVS_GATHER);
    if (me == 0) {
        all = calloc((size_t)size, sizeof *all);
        need = calloc((size_t)size, sizeof *need);
        if (!all || !need) on = 0;
    }
    PMPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, comm);
    int n_need = 0;
    if (me == 0 && on)
        for (int r = 1; r < size; r++) {
            int nothing = all[r].pid == 0 && all[r].cal0_ticks == 0;
            need[r] = !nothing && !sees(dir, r, &all[r]);
            n_need += need[r];
        }
    PMPI_Bcast(&n_need, 1, MPI_INT, 0, comm);
    if (!n_need) {
        free(all);
        free(need);
        return 0;
    }
    int my_need = 0;
    PMPI_Scatter(need, 1, MPI_INT, &my_need, 1, MPI_INT, 0, comm);
    char *buf = malloc(GATHER_CHUNK);
    int have_buf = buf != NULL, all_bufs = 0;
    PMPI_Allreduce(&have_buf, &all_bufs, 1, MPI_INT, MPI_MIN, comm);
    if (!all_bufs) { /* someone could not take part: nothing moves */
        free(buf);
        free(all);
        free(need);
        return 0;
    }
    if (me != 0 && my_need) {
        hvprof_callback fn = atomic_load(&gather_callback);
        if (fn) fn(); /* raw/rank-R.facts.json, while the process can say them */
        int go = 0;
        PMPI_Recv(&go, 1, MPI_INT, 0, TAG_GO, comm, MPI_STATUS_IGNORE);
        send_files(comm, dir, me, buf);
        atomic_store(&gathered, 1);
    } else if (me == 0) {
        recv_state rs;
        memset(&rs, 0, sizeof rs);
        double t0 = now_s(); /* decided: the transfers start */
        int ranks = 0;
        for (int r = 1; r < size; r++) {
            if (!need[r]) continue;
            int go = 1;
            char host[80] = "";
            PMPI_Send(&go, 1, MPI_INT, r, TAG_GO, comm);
            receive_files(comm, dir, r, buf, &rs, host, sizeof host);
            ranks++;
        }
        if (rs.failed_errno)
            hvprof_warn("could not write the files gathered from other hosts (%s: %s): their "
                        "ranks stay on their own hosts", rs.failed_path,
                        strerror(rs.failed_errno));
        char path[PATH_MAX], text[256];
        snprintf(path, sizeof path, "%s/raw/gather.json", dir);
        double t1 = now_s();
        snprintf(text, sizeof text, "{\"over\": \"mpi\", \"ranks\": %d, \"files\": %d, "
                 "\"bytes\": %lld, \"seconds\": %.6f, \"decide_seconds\": %.6f, "
                 "\"chunk_bytes\": %u}", ranks, rs.files, rs.bytes, t1 - t_in, t0 - t_in,
                 GATHER_CHUNK);
        hvprof_write_text(path, text);
    }
    free(buf);
    free(all);
    free(need);
    return n_need;
}
