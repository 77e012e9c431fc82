/*
 * mmap_vs_pwrite.c -- benchmarks/, not a test, not part of the library.
 *
 * Two ways for 64-byte records to reach a raw file, timed per record on the
 * writing thread and on a helper thread (their thread CPU clocks):
 *
 *   mode 0 (the library's way): the thread writes into an anonymous buffer
 *     (populated ahead, as the library's recycled buffers are); a helper
 *     thread reserves blocks (fallocate KEEP_SIZE) and pwrites what is new
 *     every millisecond;
 *   mode 1: the thread writes straight into a MAP_SHARED mapping of the file
 *     (the page cache itself); the helper keeps 400 chunks of 256 KiB ahead
 *     writable (madvise MADV_POPULATE_WRITE, Linux 5.14), so that no page
 *     fault should land on the writing thread.
 *
 * Each record costs two TSC reads, as a wrapper's does.
 *
 *   gcc -O2 -o /tmp/mvp benchmarks/overhead/mmap_vs_pwrite.c -lpthread
 *   for i in 1 2 3 4 5; do /tmp/mvp 0 6000000; /tmp/mvp 1 6000000; done
 *
 * The file goes to $TMPDIR (default /tmp) and is removed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define REC 64
#define CHUNK (256 * 1024)
#define PER (CHUNK / REC)
static int mode, fd;
static long N;
static _Atomic long published; // records written by main
static _Atomic int stop;
static char *anon;      // A: one big anon buffer (enough for N)
static char *map;       // B: mapping of the whole file area
static _Atomic long ready_chunks; // B: chunks prefaulted
static double tcpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double helper_cpu;
static void *helper(void *a) {
    (void)a; long done = 0;
    for (;;) {
        int s = atomic_load(&stop);
        if (mode == 0) {
            long n = atomic_load(&published);
            if (n > done) {
                fallocate(fd, FALLOC_FL_KEEP_SIZE, done * REC, (n - done) * REC);
                pwrite(fd, anon + done * REC, (n - done) * REC, done * REC);
                done = n;
            }
        } else {
            long n = atomic_load(&published);
            long need = n / PER + 400; if (need > N / PER + 16) need = N / PER + 16;
            long have = atomic_load(&ready_chunks);
            if (need > have) {
                madvise(map + have * (long)CHUNK, (need - have) * (long)CHUNK, MADV_POPULATE_WRITE);
                atomic_store(&ready_chunks, need);
            }
        }
        if (s) break;
        struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL);
    }
    helper_cpu = tcpu();
    return NULL;
}
int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s 0|1 RECORDS\n", argv[0]); return 2; }
    mode = atoi(argv[1]); N = atol(argv[2]);
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4096]; snprintf(path, sizeof path, "%s/mvp-%d.%d", dir, mode, getpid());
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    long bytes = (N / PER + 16) * (long)CHUNK;
    if (mode == 0) {
        anon = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(anon, bytes, MADV_POPULATE_WRITE); // recycled, populated buffers
    } else {
        fallocate(fd, 0, 0, bytes);
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        madvise(map, 400L * CHUNK, MADV_POPULATE_WRITE);
        atomic_store(&ready_chunks, 400);
    }
    pthread_t h; pthread_create(&h, NULL, helper, NULL);
    char *buf = mode == 0 ? anon : map;
    double c0 = tcpu(); uint64_t w0 = __rdtsc();
    for (long i = 0; i < N; i++) {
        if (mode == 1 && (i % PER) == 0) while (i / PER + 1 > atomic_load(&ready_chunks)) ;
        uint64_t a = __rdtsc();
        uint64_t b = __rdtsc();
        uint64_t *r = (uint64_t *)(buf + i * REC);
        r[0] = a; r[1] = b; r[2] = i; r[3] = 0; r[4] = 1; r[5] = 2; r[6] = 3; r[7] = 4;
        atomic_store_explicit(&published, i + 1, memory_order_release);
    }
    uint64_t w1 = __rdtsc(); double c1 = tcpu();
    atomic_store(&stop, 1); pthread_join(h, NULL);
    printf("%s main %.1f ns/rec cpu, helper %.1f ns/rec cpu, tsc %.1f cyc/rec\n", mode ? "mmap " : "pwrite",
           (c1 - c0) * 1e9 / N, helper_cpu * 1e9 / N, (double)(w1 - w0) / N);
    close(fd); unlink(path);
    return 0;
}
