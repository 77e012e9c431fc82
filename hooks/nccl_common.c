/*
 * nccl_common.c -- the state NCCL's two paths share (nccl_common.h): the
 * wrappers' nesting count, the open at the first NCCL call, the per-op call
 * counters, the NCCL communicators' devices and splits, the exit handler,
 * the datatype table, and the plugin path's registered hooks.  Calls the
 * core only; nccl.c and nccl_plugin.c reach each other through here.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "nccl_common.h"

__thread int hvprof_nccl_nest __attribute__((tls_model("initial-exec")));
_Atomic uint64_t hvprof_nccl_calls[HVPROF_NCCL_N_OPS];

const hvprof_nccl_dtype hvprof_nccl_dtypes[HVPROF_NCCL_N_DTYPES] = {
    {"Int8", HVPROF_DT_NCCL_INT8, 1},          {"Uint8", HVPROF_DT_NCCL_UINT8, 1},
    {"Int32", HVPROF_DT_NCCL_INT32, 4},        {"Uint32", HVPROF_DT_NCCL_UINT32, 4},
    {"Int64", HVPROF_DT_NCCL_INT64, 8},        {"Uint64", HVPROF_DT_NCCL_UINT64, 8},
    {"Float16", HVPROF_DT_NCCL_FLOAT16, 2},    {"Float32", HVPROF_DT_NCCL_FLOAT32, 4},
    {"Float64", HVPROF_DT_NCCL_FLOAT64, 8},    {"Bfloat16", HVPROF_DT_NCCL_BFLOAT16, 2},
    {"Float8e4m3", HVPROF_DT_NCCL_FLOAT8E4M3, 1}, {"Float8e5m2", HVPROF_DT_NCCL_FLOAT8E5M2, 1},
};

static _Atomic int open_tried;
static _Atomic int exit_registered;
static void (*_Atomic exit_fn)(void);
static const hvprof_nccl_plugin *_Atomic plugin;
static _Atomic int16_t comm_dev[HVPROF_COMM_TABLE_CAPACITY];   /* device + 1 */
static _Atomic uint32_t comm_splits[HVPROF_COMM_TABLE_CAPACITY];
static _Atomic uint64_t c_comms;

/* ------------------------------------------------------------------------ */
/* Activation.                                                               */

int hvprof_nccl_open_once(void)
{
    if (atomic_load_explicit(&open_tried, memory_order_relaxed)) return 0;
    if (atomic_exchange(&open_tried, 1)) return 0;
    if (!hvprof_header() && hvprof_profile_mode() != HVPROF_PROFILE_OFF) hvprof_open(-1, -1, -1, NULL);
    return atomic_load(&hvprof_active);
}

/* ------------------------------------------------------------------------ */
/* Communicators and the exit.                                               */

void hvprof_nccl_set_exit(void (*fn)(void)) { atomic_store(&exit_fn, fn); }

static void nccl_common_exit(void)
{
    void (*fn)(void) = atomic_load(&exit_fn);
    if (fn) fn();
}

uint32_t hvprof_nccl_comm_register(uint64_t handle, uint64_t id, int size, int rank, int device)
{
    if (!atomic_load_explicit(&exit_registered, memory_order_relaxed) &&
        !atomic_exchange(&exit_registered, 1))
        atexit(nccl_common_exit);
    uint32_t idx = hvprof_comm_register(handle, id, size, rank, rank == 0 ? hvprof_rank() : -1,
                                        1, "nccl");
    if (idx < HVPROF_COMM_TABLE_CAPACITY) {
        atomic_store_explicit(&comm_dev[idx], (int16_t)(device + 1), memory_order_relaxed);
        atomic_store_explicit(&comm_splits[idx], 0, memory_order_relaxed);
        atomic_fetch_add(&c_comms, 1);
    }
    return idx;
}

int hvprof_nccl_comm_device(uint32_t idx)
{
    if (idx >= HVPROF_COMM_TABLE_CAPACITY) return -1;
    return (int)atomic_load_explicit(&comm_dev[idx], memory_order_relaxed) - 1;
}

uint32_t hvprof_nccl_comm_next_split(uint32_t idx)
{
    return idx < HVPROF_COMM_TABLE_CAPACITY ? atomic_fetch_add(&comm_splits[idx], 1) : 0;
}

uint64_t hvprof_nccl_comms(void) { return atomic_load(&c_comms); }

/* ------------------------------------------------------------------------ */
/* The plugin path's hooks.                                                  */

void hvprof_nccl_register_plugin(const hvprof_nccl_plugin *p) { atomic_store(&plugin, p); }

uint64_t hvprof_nccl_plugin_silent(void)
{
    const hvprof_nccl_plugin *p = atomic_load(&plugin);
    return p && p->silent ? p->silent() : 0;
}

size_t hvprof_nccl_plugin_json(char *buf, size_t n, uint64_t records)
{
    const hvprof_nccl_plugin *p = atomic_load(&plugin);
    return p && p->json ? p->json(buf, n, records) : 0;
}

void hvprof_nccl_plugin_flush(void)
{
    const hvprof_nccl_plugin *p = atomic_load(&plugin);
    if (p && p->flush) p->flush();
}

/* ------------------------------------------------------------------------ */

/* A forked child may open its own file at its first NCCL call; the forking
 * thread was outside any wrapper in the child. */
static void nccl_common_atfork_child(void)
{
    atomic_store(&open_tried, 0);
    hvprof_nccl_nest = 0;
}

static const hvprof_backend nccl_common_backend = {
    .name = "nccl_common",
    .atfork_child = nccl_common_atfork_child,
};

__attribute__((constructor)) static void nccl_common_ctor(void)
{
    hvprof_register_backend(&nccl_common_backend);
}
