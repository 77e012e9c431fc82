/*
 * core_summary.c -- the core's summary mode (per-thread aggregates, the .agg
 * snapshot), sampling (the application's switch and the time window) and
 * the divert path of a call that is not written one record each.  Above
 * core_tracks.c (core_internal.h has the stack).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core_internal.h"

/* ------------------------------------------------------------------------ */
/* Summary mode and sampling.                                                 */

#define AGG_SLOTS 2048u
#define AGG_PROBES 32u
static _Atomic uintptr_t agg_tables[HVPROF_TRACK_TABLE_CAPACITY];
static _Atomic uint64_t agg_overflow;
static int64_t window_start_ns = -1, window_end_ns = -1; /* CLOCK_MONOTONIC */

/* Recording is on when every switch says so: the application's
 * (profiler.sampling()/paused() and HOROVOD_PROFILE_SAMPLE_STEPS, combined in
 * Python, hvprof_set_sampling) and the time window (HOROVOD_PROFILE_WINDOW,
 * switched by the helper thread).  Neither overrides the other. */
static pthread_mutex_t sampling_lock = PTHREAD_MUTEX_INITIALIZER;
static int sampling_app = 1, sampling_window = 1;

static void sampling_apply(void) /* sampling_lock held */
{
    if (!hvprof_core.hdr) return;
    int on = sampling_app && sampling_window;
    hvprof_core.hdr->sampling = on ? 1u : 0u;
    atomic_store(&hvprof_divert, !on ? HVPROF_DIVERT_PAUSED
                                 : hvprof_core.hdr->mode == HVPROF_MODE_SUMMARY ? HVPROF_DIVERT_SUMMARY : 0);
}

void summary_atfork_child(void) { pthread_mutex_init(&sampling_lock, NULL); }

void set_sampling(int on)
{
    pthread_mutex_lock(&sampling_lock);
    sampling_app = on ? 1 : 0;
    sampling_apply();
    pthread_mutex_unlock(&sampling_lock);
}

static int window_on(int64_t now)
{
    return now >= window_start_ns && (window_end_ns < 0 || now < window_end_ns);
}

/* HOROVOD_PROFILE_WINDOW="A:B": record from A to B seconds after the file
 * was opened (B empty: to the end); the helper thread switches.  An unusable
 * value is ignored (and said by hvprof_settings_check). */
void window_init(void)
{
    const char *w = hvprof_setting_text(HVS_WINDOW);
    double a = 0, b = -1;
    pthread_mutex_lock(&sampling_lock);
    window_start_ns = window_end_ns = -1;
    sampling_app = sampling_window = 1;
    if (w && hvprof_parse_window(w, &a, &b) == 0) {
        int64_t t0 = hvprof_core.hdr->cal0_mono_ns;
        window_start_ns = t0 + (int64_t)(a * 1e9);
        window_end_ns = b >= 0 ? t0 + (int64_t)(b * 1e9) : -1;
        sampling_window = window_on(t0);
    }
    sampling_apply();
    pthread_mutex_unlock(&sampling_lock);
}

void window_tick(int64_t now)
{
    if (window_start_ns < 0 || !hvprof_core.hdr) return;
    int on = window_on(now);
    if (on == sampling_window) return; /* only the helper writes it after init */
    pthread_mutex_lock(&sampling_lock);
    sampling_window = on;
    sampling_apply();
    pthread_mutex_unlock(&sampling_lock);
}

void hvprof_divert_call(uint16_t op, uint32_t comm, uint64_t bytes, uint8_t dtype, uint8_t redop,
                        uint16_t flags, int rc, uint64_t t0, uint64_t t1)
{
    hvprof_file_header *h = hvprof_core.hdr;
    if (!h) return;
    if (!h->sampling) {
        __atomic_fetch_add(&h->unsampled_calls, 1, __ATOMIC_RELAXED);
        return;
    }
    hvprof_tls *t = &hvprof_t;
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_relaxed);
    if (HVPROF_UNLIKELY(!t->agg || t->agg_generation != gen)) {
        uint32_t track = hvprof_track_self();
        void *m = mmap(NULL, AGG_SLOTS * sizeof(hvprof_agg_entry), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || track >= HVPROF_TRACK_TABLE_CAPACITY) {
            __atomic_fetch_add(&h->dropped_records, 1, __ATOMIC_RELAXED);
            return;
        }
        t->agg = m;
        t->agg_last = NULL;
        t->agg_generation = gen;
        atomic_store_explicit(&agg_tables[track], (uintptr_t)m, memory_order_release);
    }
    uint64_t d = t1 - t0;
    /* The same (op, communicator, size, datatype, reduction) as this thread's
     * previous call: its entry, without hashing (3 mixes) and probing. */
    hvprof_agg_entry *last = (hvprof_agg_entry *)t->agg_last;
    if (HVPROF_LIKELY(last && last->bytes == bytes && last->op == op && last->comm == comm &&
                      last->dtype == dtype && last->redop == redop)) {
        hvprof_agg_add(last, d, flags, rc);
        return;
    }
    hvprof_agg_entry *tab = (hvprof_agg_entry *)t->agg;
    uint64_t key = hvprof_mix(hvprof_mix(hvprof_mix(op, comm), bytes), (uint64_t)dtype << 8 | redop);
    for (uint32_t i = 0; i < AGG_PROBES; i++) {
        hvprof_agg_entry *e = &tab[(key + i) & (AGG_SLOTS - 1)];
        uint64_t calls = __atomic_load_n(&e->calls, __ATOMIC_RELAXED);
        if (calls == 0) {
            e->bytes = bytes;
            e->comm = comm;
            e->track = t->track;
            e->op = op;
            e->dtype = dtype;
            e->redop = redop;
            e->min_ticks = d;
            e->first_ticks = t0;
        } else if (e->bytes != bytes || e->op != op || e->comm != comm || e->dtype != dtype ||
                   e->redop != redop) {
            continue;
        }
        hvprof_agg_add(e, d, flags, rc);
        t->agg_last = e;
        return;
    }
    atomic_fetch_add(&agg_overflow, 1);
}

/* Rewrite rank-R.agg from every thread's table (helper thread, and close). */
void agg_snapshot(void)
{
    if (!hvprof_core.hdr || hvprof_core.hdr->mode != HVPROF_MODE_SUMMARY) return;
    uint64_t n = 0, total = 0;
    for (uint32_t k = 0; k < HVPROF_TRACK_TABLE_CAPACITY; k++) {
        hvprof_agg_entry *tab = (hvprof_agg_entry *)atomic_load(&agg_tables[k]);
        for (uint32_t i = 0; tab && i < AGG_SLOTS; i++) n += __atomic_load_n(&tab[i].calls, __ATOMIC_ACQUIRE) != 0;
    }
    size_t bytes = sizeof(hvprof_agg_header) + n * sizeof(hvprof_agg_entry);
    char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return;
    hvprof_agg_header *ah = (hvprof_agg_header *)buf;
    uint64_t m = 0;
    for (uint32_t k = 0; k < HVPROF_TRACK_TABLE_CAPACITY && m < n; k++) {
        hvprof_agg_entry *tab = (hvprof_agg_entry *)atomic_load(&agg_tables[k]);
        for (uint32_t i = 0; tab && i < AGG_SLOTS && m < n; i++) {
            if (!__atomic_load_n(&tab[i].calls, __ATOMIC_ACQUIRE)) continue;
            hvprof_agg_entry *e = (hvprof_agg_entry *)(buf + sizeof *ah) + m++;
            memcpy(e, &tab[i], sizeof *e);
            total += e->calls;
        }
    }
    memcpy(ah->magic, HVPROF_AGG_MAGIC, 8);
    ah->version = HVPROF_FORMAT_VERSION;
    ah->entry_bytes = sizeof(hvprof_agg_entry);
    ah->n_entries = m;
    ah->rank = hvprof_core.hdr->rank;
    ah->buckets = HVPROF_AGG_BUCKETS;
    ah->snapshot_ticks = hvprof_ticks();
    ah->overflow_calls = atomic_load(&agg_overflow);
    hvprof_core.hdr->aggregated_calls = total;
    char path[PATH_MAX + 16], tmp[PATH_MAX + 32];
    snprintf(path, sizeof path, "%.*s", (int)(strlen(hvprof_core.raw_path) - 7), hvprof_core.raw_path); /* drop .hvprof */
    strncat(path, ".agg", sizeof path - strlen(path) - 1);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        size_t len = sizeof *ah + m * sizeof(hvprof_agg_entry);
        int ok = write(fd, buf, len) == (ssize_t)len;
        close(fd);
        if (ok) rename(tmp, path);
        else unlink(tmp);
    }
    munmap(buf, bytes);
}
