/* The names of the tensors a process hands to Horovod: one id space per
 * process, shared by every recorder (profiler.collect.tensors from Python,
 * hooks/tf/kernels.cc from TensorFlow's kernel threads).
 *
 * Rule: id i is line i of raw/rank-R.tensors (one JSON string per line, read
 * by profiler.formats.raw.read_tensor_names).  An id is given and its line
 * written under one lock with one write(2), so lines are in id order and a
 * name is on disk before any record can refer to it (a rank that dies keeps
 * its names).  A forked child starts over: it writes its own raw file. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvprof_internal.h"

#define NAME_MAX_BYTES 4096 /* longer names are cut (one line stays one write) */

typedef struct {
    uint64_t hash;
    uint32_t len;
    uint32_t id;
    char *name; /* NULL: empty slot */
} slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static slot *table;
static size_t cap;   /* a power of two, or 0 */
static uint32_t used;
static int fd = -1;

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int grow(void)
{
    size_t ncap = cap ? cap * 2 : 256;
    slot *nt = calloc(ncap, sizeof *nt);
    if (!nt) return -1;
    for (size_t i = 0; i < cap; i++) {
        if (!table[i].name) continue;
        size_t j = table[i].hash & (ncap - 1);
        while (nt[j].name) j = (j + 1) & (ncap - 1);
        nt[j] = table[i];
    }
    free(table);
    table = nt;
    cap = ncap;
    return 0;
}

/* `name` as one JSON string and a newline into out (room: 6 * len + 3). */
static size_t json_line(char *out, const char *name, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            memcpy(out + o, "\\u00", 4);
            out[o + 4] = hex[c >> 4];
            out[o + 5] = hex[c & 15];
            o += 6;
        } else {
            out[o++] = (char)c;
        }
    }
    out[o++] = '"';
    out[o++] = '\n';
    return o;
}

static int open_file(void)
{
    const char *raw = hvprof_raw_path();
    size_t n = strlen(raw);
    if (n <= 7) return -1; /* no raw file open */
    char path[PATH_MAX];
    /* rank-R.hvprof -> rank-R.tensors (profiler.layout.tensor_names_path) */
    if (snprintf(path, sizeof path, "%.*s.tensors", (int)(n - 7), raw) >= (int)sizeof path)
        return -1;
    fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    return fd >= 0 ? 0 : -1;
}

/* The id of `name` (`len` bytes, UTF-8), writing its line the first time;
 * -1 when no raw file is open or the line could not be written. */
HVPROF_EXPORT int64_t hvprof_tensor_name_id(const char *name, size_t len)
{
    if (!name) return -1;
    if (len > NAME_MAX_BYTES) { /* cut at a character's start: the line stays UTF-8 */
        len = NAME_MAX_BYTES;
        while (len > 0 && ((unsigned char)name[len] & 0xC0) == 0x80) len--;
    }
    uint64_t h = fnv1a(name, len);
    int64_t got = -1;
    pthread_mutex_lock(&lock);
    if (cap) {
        for (size_t j = h & (cap - 1); table[j].name; j = (j + 1) & (cap - 1))
            if (table[j].hash == h && table[j].len == len && memcmp(table[j].name, name, len) == 0) {
                got = table[j].id;
                goto out;
            }
    }
    if (fd < 0 && open_file() != 0) goto out;
    if ((used + 1) * 2 > cap && grow() != 0) goto out;
    char *copy = malloc(len + 1);
    char *line = malloc(6 * len + 3);
    if (!copy || !line) {
        free(copy);
        free(line);
        goto out;
    }
    size_t n = json_line(line, name, len);
    ssize_t w;
    do w = write(fd, line, n); while (w < 0 && errno == EINTR);
    free(line);
    if (w != (ssize_t)n) { /* a short line would shift every later id */
        free(copy);
        goto out;
    }
    memcpy(copy, name, len);
    copy[len] = 0;
    size_t j = h & (cap - 1);
    while (table[j].name) j = (j + 1) & (cap - 1);
    table[j] = (slot){.hash = h, .len = (uint32_t)len, .id = used, .name = copy};
    got = used++;
out:
    pthread_mutex_unlock(&lock);
    return got;
}

/* A forked child writes its own raw file: its names start over.  The
 * parent's table is left allocated (another thread may have held the lock). */
static void names_atfork_child(void)
{
    pthread_mutex_init(&lock, NULL);
    if (fd >= 0) close(fd);
    fd = -1;
    table = NULL;
    cap = 0;
    used = 0;
}

__attribute__((constructor)) static void names_ctor(void)
{
    pthread_atfork(NULL, NULL, names_atfork_child);
}
