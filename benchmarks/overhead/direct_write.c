/*
 * direct_write.c -- benchmarks/, not a test, not part of the library.
 *
 * What it costs a thread to move 64-byte records from memory into a file,
 * per record, on its own CPU clock (and the wall clock, which holds the
 * device's time too):
 *
 *   mode 0: pwrite through the page cache (the library's helper thread does
 *           this: core.c buffer_flush), the blocks reserved first with
 *           fallocate(FALLOC_FL_KEEP_SIZE) as the helper reserves them;
 *   mode 1: pwrite with O_DIRECT (the device reads the buffer itself: no
 *           copy, no page-cache page per 4 KiB; the thread waits for the
 *           device instead).
 *
 * WRITE bytes per call (256 KiB: one chunk of the raw file; 1 MiB, 4 MiB:
 * consecutive chunks written at once), 75 MiB in all, from 8 buffers used
 * in turn (already in memory, as the library's recycled buffers are).
 *
 *   gcc -O2 -DWRITE=$((256*1024)) -o /tmp/dw benchmarks/overhead/direct_write.c
 *   for i in 1 2 3 4 5; do /tmp/dw 0; /tmp/dw 1; done
 *
 * The file goes to $DIR (default: the current directory) and is removed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef WRITE
#define WRITE (256 * 1024)
#endif
#define TOTAL (75L << 20)
#define BUFFERS 8

static double seconds(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (argv[1][0] != '0' && argv[1][0] != '1')) {
        fprintf(stderr, "usage: %s 0|1   (0: page cache, 1: O_DIRECT)\n", argv[0]);
        return 2;
    }
    int direct = argv[1][0] == '1';
    const char *dir = getenv("DIR") ? getenv("DIR") : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/direct-write-%d.%d", dir, direct, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    char *buf = mmap(NULL, (size_t)WRITE * BUFFERS, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(buf, 1, (size_t)WRITE * BUFFERS);
    long calls = TOTAL / WRITE;
    off_t base = 135168; /* the raw file's first chunk (4 KiB-aligned) */
    double c0 = seconds(CLOCK_THREAD_CPUTIME_ID), w0 = seconds(CLOCK_MONOTONIC);
    for (long i = 0; i < calls; i++) {
        off_t off = base + (off_t)i * WRITE;
        if (!direct) fallocate(fd, FALLOC_FL_KEEP_SIZE, off, WRITE);
        if (pwrite(fd, buf + (i % BUFFERS) * (long)WRITE, WRITE, off) != WRITE) {
            perror("pwrite");
            unlink(path);
            return 1;
        }
    }
    double c1 = seconds(CLOCK_THREAD_CPUTIME_ID), w1 = seconds(CLOCK_MONOTONIC);
    double recs = (double)TOTAL / 64;
    printf("%s, %d KiB a write: CPU %.1f ns/record, wall %.1f ns/record (%.0f MB/s)\n",
           direct ? "O_DIRECT  " : "page cache", WRITE / 1024, (c1 - c0) * 1e9 / recs,
           (w1 - w0) * 1e9 / recs, (double)TOTAL / (w1 - w0) / 1e6);
    close(fd);
    unlink(path);
    return 0;
}
