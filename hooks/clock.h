/*
 * clock.h -- the profiler's time source.
 *
 * x86-64 with an invariant TSC (CPUID 0x80000007 EDX bit 8): rdtsc, ~10 ns a
 * read on this project's machines.  Elsewhere (or HOROVOD_PROFILE_CLOCK=
 * monotonic): CLOCK_MONOTONIC through the vDSO, ~23 ns.  Records hold raw
 * ticks; the file header holds calibration pairs (ticks, CLOCK_MONOTONIC ns)
 * taken at start, at every chunk switch and at MPI_Finalize, from which the
 * reader converts ticks to nanoseconds.
 */
#ifndef HVPROF_CLOCK_H
#define HVPROF_CLOCK_H

#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#define HVPROF_CLOCK_TSC 1
#define HVPROF_CLOCK_MONOTONIC 2

/* Set once by hvprof_clock_init() before any record is written. */
extern int hvprof_clock_kind;

static inline int64_t hvprof_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint64_t hvprof_ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_expect(hvprof_clock_kind == HVPROF_CLOCK_TSC, 1)) return __rdtsc();
#endif
    return (uint64_t)hvprof_mono_ns();
}

/* The fast path's clock (mpi.c): taken only when hvprof_fast_clock() says
 * so, it reads the TSC without testing the clock kind again. */
#if defined(__x86_64__) || defined(__i386__)
static inline int hvprof_fast_clock(void) { return hvprof_clock_kind == HVPROF_CLOCK_TSC; }
static inline uint64_t hvprof_fast_ticks(void) { return __rdtsc(); }
#else
static inline int hvprof_fast_clock(void) { return 1; }
static inline uint64_t hvprof_fast_ticks(void) { return hvprof_ticks(); }
#endif

/* Choose the clock and measure ticks per nanosecond (about 2 ms of spinning
 * for the TSC).  Returns ticks_per_ns; fills the first calibration pair. */
double hvprof_clock_init(int64_t *ticks0, int64_t *mono0, int64_t *realtime0);

/* One (ticks, CLOCK_MONOTONIC) pair read as close together as possible. */
void hvprof_clock_pair(int64_t *ticks, int64_t *mono);

#endif
