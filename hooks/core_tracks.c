/*
 * core_tracks.c -- the core's tracks (one per thread that records, one per
 * device stream) and its communicator table: lock-free lookups, a table
 * entry in the raw file's header per track and per communicator.  Above
 * core_state.c and core_clock.c (core_internal.h has the stack).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core_internal.h"

/* Communicator lookup: open addressing, handle -> table index + 1. */
#define COMM_HASH_SLOTS 4096u
#define COMM_TOMBSTONE UINT64_MAX
static _Atomic uint64_t comm_keys[COMM_HASH_SLOTS];
static _Atomic uint32_t comm_vals[COMM_HASH_SLOTS];

/* Stream tracks: the same scheme, stream handle -> track index + 1. */
#define STREAM_HASH_SLOTS 1024u
static _Atomic uint64_t stream_keys[STREAM_HASH_SLOTS];
static _Atomic uint32_t stream_vals[STREAM_HASH_SLOTS];

void tables_reset(void)
{
    memset(comm_keys, 0, sizeof comm_keys);
    memset(comm_vals, 0, sizeof comm_vals);
    memset(stream_keys, 0, sizeof stream_keys);
    memset(stream_vals, 0, sizeof stream_vals);
}

/* ------------------------------------------------------------------------ */
/* Tracks (threads and device streams).                                       */

static void caller_object(char *out, size_t n)
{
    /* The first frame outside this library names the code that called MPI
     * (Horovod's mpi_lib, mpi4py's MPI module, the application...). Once per
     * thread. */
    void *frames[16];
    int depth = backtrace(frames, 16);
    Dl_info self, info;
    out[0] = 0;
    if (!dladdr((void *)&caller_object, &self)) return;
    for (int i = 1; i < depth; i++) {
        if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
        if (info.dli_fbase == self.dli_fbase) continue;
        const char *base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        /* skip the wrapped libraries themselves (libmpi called through a
         * PMPI layer, NCCL calling its own exported symbols) */
        int wrapped = 0;
        FOR_EACH_BACKEND(b)
            if (b->library && strncmp(base, b->library, strlen(b->library)) == 0) wrapped = 1;
        if (wrapped) continue;
        snprintf(out, n, "%s", base[0] ? base : "(main)");
        return;
    }
}

static uint32_t track_alloc(void)
{
    uint32_t idx = __atomic_fetch_add(&hvprof_core.hdr->n_tracks, 1, __ATOMIC_RELAXED);
    if (idx >= HVPROF_TRACK_TABLE_CAPACITY - 1) {
        /* The last entry collects every track past capacity. */
        hvprof_track_entry *e = (hvprof_track_entry *)((char *)hvprof_core.hdr + hvprof_core.hdr->track_table_offset) +
                                (HVPROF_TRACK_TABLE_CAPACITY - 1);
        if (!e->valid) {
            snprintf(e->name, sizeof e->name, "(overflow)");
            e->tid = -1;
            e->kind = 1;
            __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
        }
        return HVPROF_TRACK_TABLE_CAPACITY - 1;
    }
    return idx;
}

static hvprof_track_entry *track_entry(uint32_t idx)
{
    return (hvprof_track_entry *)((char *)hvprof_core.hdr + hvprof_core.hdr->track_table_offset) + idx;
}

uint32_t hvprof_track_self(void)
{
    hvprof_tls *t = &hvprof_t;
    uint32_t gen = atomic_load_explicit(&hvprof_generation, memory_order_acquire);
    if (t->generation != gen) {
        /* State of a previous file (or of the parent before fork). */
        t->slots = NULL;
        t->nrec = NULL;
        t->used = t->capacity = 0;
        t->track = UINT32_MAX;
        t->inflight = NULL;
        t->open_rec = NULL;
        t->generation = gen;
    }
    if (t->track != UINT32_MAX) return t->track;
    if (!hvprof_core.hdr) return UINT32_MAX;
    uint32_t idx = track_alloc();
    if (idx < HVPROF_TRACK_TABLE_CAPACITY - 1) {
        hvprof_track_entry *e = track_entry(idx);
        e->handle = (uint64_t)pthread_self();
        e->tid = (int32_t)syscall(SYS_gettid);
        e->kind = 1;
        e->is_main = e->tid == (int32_t)getpid();
        e->device = -1;
        pthread_getname_np(pthread_self(), e->name, sizeof e->name);
        caller_object(e->caller, sizeof e->caller);
        pthread_setspecific(exit_key, (void *)1); /* thread_exit() hands over its buffer */
        __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
        FOR_EACH_BACKEND(b) /* its first CPU read (cpu.c) */
            if (b->track_new) b->track_new(idx, e->tid);
    }
    hvprof_inflight_entry *tab = atomic_load_explicit(&hvprof_inflight_table, memory_order_relaxed);
    t->inflight = tab && idx < HVPROF_INFLIGHT_CAPACITY ? &tab[idx] : NULL;
    t->track = idx;
    return idx;
}

uint32_t hvprof_track_stream(uint64_t stream, int device)
{
    if (!hvprof_core.hdr) return UINT32_MAX;
    /* the default stream (0) of each device is a track of its own */
    uint64_t key = hvprof_mix(stream + 1, (uint64_t)(int64_t)device) | 1;
    uint32_t h = (uint32_t)(hvprof_mix(0, key) & (STREAM_HASH_SLOTS - 1));
    for (uint32_t probe = 0; probe < STREAM_HASH_SLOTS; probe++, h = (h + 1) & (STREAM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&stream_keys[h], memory_order_acquire);
        if (k == key) {
            uint32_t v;
            while ((v = atomic_load_explicit(&stream_vals[h], memory_order_acquire)) == 0) {
            }
            return v - 1;
        }
        if (k == 0) {
            uint64_t expect = 0;
            if (!atomic_compare_exchange_strong(&stream_keys[h], &expect, key)) {
                if (expect != key) continue; /* another key took the slot */
                uint32_t v; /* another thread is registering this stream */
                while ((v = atomic_load_explicit(&stream_vals[h], memory_order_acquire)) == 0) {
                }
                return v - 1;
            }
            uint32_t idx = track_alloc();
            if (idx < HVPROF_TRACK_TABLE_CAPACITY - 1) {
                hvprof_track_entry *e = track_entry(idx);
                e->handle = stream;
                e->tid = -1;
                e->kind = 2;
                e->is_main = 0;
                e->device = device;
                snprintf(e->name, sizeof e->name, "stream %d", device);
                __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
            }
            atomic_store_explicit(&stream_vals[h], idx + 1, memory_order_release);
            return idx;
        }
    }
    return HVPROF_TRACK_TABLE_CAPACITY - 1;
}

/* ------------------------------------------------------------------------ */
/* Communicators.                                                             */

static hvprof_comm_entry *comm_entry(uint32_t idx)
{
    return (hvprof_comm_entry *)((char *)hvprof_core.hdr + hvprof_core.hdr->comm_table_offset) + idx;
}

static inline uint32_t comm_slot0(uint64_t handle)
{
    return (uint32_t)(hvprof_mix(0, handle) & (COMM_HASH_SLOTS - 1));
}

uint32_t hvprof_comm_lookup(uint64_t handle)
{
    uint32_t h = comm_slot0(handle);
    for (uint32_t probe = 0; probe < COMM_HASH_SLOTS; probe++, h = (h + 1) & (COMM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&comm_keys[h], memory_order_acquire);
        if (k == handle) {
            uint32_t v = atomic_load_explicit(&comm_vals[h], memory_order_acquire);
            if (v) return v - 1;
        } else if (k == 0) {
            return UINT32_MAX;
        }
    }
    return UINT32_MAX;
}

uint32_t hvprof_comm_register(uint64_t handle, uint64_t id, int size, int rank,
                              int world_rank0, int backend, const char *name)
{
    if (!hvprof_core.hdr) return UINT32_MAX;
    uint32_t h = comm_slot0(handle);
    for (uint32_t probe = 0; probe < COMM_HASH_SLOTS; probe++, h = (h + 1) & (COMM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&comm_keys[h], memory_order_acquire);
        if (k == handle) {
            uint32_t v;
            while ((v = atomic_load_explicit(&comm_vals[h], memory_order_acquire)) == 0) {
            }
            return v - 1;
        }
        if (k != 0) continue;
        uint64_t expect = 0;
        if (!atomic_compare_exchange_strong(&comm_keys[h], &expect, handle)) {
            if (expect != handle) continue; /* another handle took the slot */
            uint32_t v; /* another thread is registering this handle */
            while ((v = atomic_load_explicit(&comm_vals[h], memory_order_acquire)) == 0) {
            }
            return v - 1;
        }
        uint32_t idx = __atomic_fetch_add(&hvprof_core.hdr->n_comms, 1, __ATOMIC_RELAXED);
        if (idx >= HVPROF_COMM_TABLE_CAPACITY - 1) {
            idx = HVPROF_COMM_TABLE_CAPACITY - 1; /* overflow entry */
            hvprof_comm_entry *e = comm_entry(idx);
            if (!e->valid) {
                snprintf(e->name, sizeof e->name, "(overflow)");
                e->size = -1;
                e->rank = -1;
                e->world_rank0 = -1;
                __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
            }
        } else {
            hvprof_comm_entry *e = comm_entry(idx);
            e->handle = handle;
            e->id = id;
            e->size = size;
            e->rank = rank;
            e->world_rank0 = world_rank0;
            e->backend = (uint16_t)backend;
            snprintf(e->name, sizeof e->name, "%s", name ? name : "");
            atomic_store_explicit(&hvprof_comm_seq[idx], 0, memory_order_relaxed);
            __atomic_store_n(&e->valid, 1, __ATOMIC_RELEASE);
        }
        atomic_store_explicit(&comm_vals[h], idx + 1, memory_order_release);
        atomic_fetch_add(&hvprof_handle_epoch, 1);
        return idx;
    }
    return HVPROF_COMM_TABLE_CAPACITY - 1;
}

void hvprof_comm_forget(uint64_t handle)
{
    uint32_t h = comm_slot0(handle);
    for (uint32_t probe = 0; probe < COMM_HASH_SLOTS; probe++, h = (h + 1) & (COMM_HASH_SLOTS - 1)) {
        uint64_t k = atomic_load_explicit(&comm_keys[h], memory_order_acquire);
        if (k == 0) return;
        if (k == handle) {
            atomic_store_explicit(&comm_keys[h], COMM_TOMBSTONE, memory_order_release);
            atomic_fetch_add(&hvprof_handle_epoch, 1);
            return;
        }
    }
}
