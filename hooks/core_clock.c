/*
 * core_clock.c -- the core's clock: the TSC or CLOCK_MONOTONIC
 * (HOROVOD_PROFILE_CLOCK), and calibration pairs of the two (the reader turns
 * ticks into nanoseconds with them).  Above core_state.c (core_internal.h
 * has the stack).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core_internal.h"

void hvprof_clock_pair(int64_t *ticks, int64_t *mono)
{
    /* Take the pair whose two tick reads are closest: bounds the skew. */
    int64_t best = INT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = hvprof_ticks();
        int64_t m = hvprof_mono_ns();
        uint64_t b = hvprof_ticks();
        if ((int64_t)(b - a) < best) {
            best = (int64_t)(b - a);
            *ticks = (int64_t)(a + (b - a) / 2);
            *mono = m;
        }
    }
}

static int tsc_invariant(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1;
#else
    return 0;
#endif
}

void clock_select(void)
{
    /* HOROVOD_PROFILE_CLOCK: tsc, monotonic or auto (choices 0, 1, 2); the TSC
     * only where it is invariant. */
    int tsc = tsc_invariant() && hvprof_setting_int(HVS_CLOCK) != 1;
    hvprof_clock_kind = tsc ? HVPROF_CLOCK_TSC : HVPROF_CLOCK_MONOTONIC;
}

double hvprof_clock_init(int64_t *ticks0, int64_t *mono0, int64_t *realtime0)
{
    int tsc = hvprof_clock_kind == HVPROF_CLOCK_TSC;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    hvprof_clock_pair(ticks0, mono0);
    *realtime0 = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec;
    if (!tsc) return 1.0;
    int64_t t1, m1;
    do {
        hvprof_clock_pair(&t1, &m1);
    } while (m1 - *mono0 < 2000000); /* 2 ms */
    return (double)(t1 - *ticks0) / (double)(m1 - *mono0);
}

void calibrate_now(void)
{
    if (!hvprof_core.hdr) return;
    int64_t t, m;
    hvprof_clock_pair(&t, &m);
    /* Two 8-byte stores; a reader racing with them sees a pair from a
     * previous calibration at worst -- both pairs are valid. */
    hvprof_core.hdr->cal1_ticks = t;
    hvprof_core.hdr->cal1_mono_ns = m;
}
