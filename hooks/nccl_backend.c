/*
 * nccl_backend.c -- the NCCL symbol wrappers (nccl.c) seen from outside:
 * hvprof_nccl_visible and hvprof_nccl_json for the Python side, the end of
 * NCCL profiling (hvprof_nccl_flush, hvprof_nccl_finish: device times, the
 * rank's .nccl.json), and the "nccl" backend (its finish and fork hooks).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cuda_rt.h"
#include "hvprof_internal.h"
#include "nccl_common.h"
#include "nccl_internal.h"

#define N_OPS HVPROF_NCCL_N_OPS

static _Atomic int finished;

/* ------------------------------------------------------------------------ */
/* Visibility and counters, for the Python side (profiler/gpu.py).           */

/* Bits: 1 = an interposable ncclAllReduce exists behind this library (NCCL
 * calls reach the wrappers); 2 = a libnccl shared object is loaded; 4 = at
 * least one NCCL call was recorded.  Evaluated at each call (cheap: a dlsym
 * and a walk of the loaded objects). */
HVPROF_EXPORT int hvprof_nccl_visible(void)
{
    char path[256];
    int v = 0;
    if (real_sym("ncclAllReduce", (void *)&ncclAllReduce)) v |= 1;
    if (loaded_object("libnccl", path, sizeof path)) v |= 2;
    for (int i = 0; i < N_OPS; i++)
        if (atomic_load(&hvprof_nccl_calls[i])) v |= 4;
    return v;
}

static const char *const OP_NAMES[N_OPS] = {
    "nccl_allreduce", "nccl_reducescatter", "nccl_allgather", "nccl_broadcast", "nccl_bcast",
    "nccl_reduce",    "nccl_send",          "nccl_recv",      "nccl_group",
};

/* Everything the Python side puts in the rank metadata ("nccl"), as one JSON
 * object.  The buffer is overwritten by the next call. */
HVPROF_EXPORT const char *hvprof_nccl_json(void)
{
    static char buf[8192];
    static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&m);
    size_t n = sizeof buf, k = 0;
#define OUT(...) k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, __VA_ARGS__)
    char nccl_path[256], driver[256];
    int vis = hvprof_nccl_visible();
    loaded_object("libnccl", nccl_path, sizeof nccl_path);
    int version = 0;
    void *gv = real_sym("ncclGetVersion", NULL);
    if (gv) {
        ncclResult_t (*fn)(int *);
        memcpy(&fn, &gv, sizeof fn);
        if (fn(&version) != NCCL_SUCCESS) version = 0;
    }
    OUT("{\"visible\": %d, \"interposable\": %s, \"nccl_loaded\": %s, \"nccl_library\": \"%s\", "
        "\"nccl_version\": %d, \"cuda_driver_loaded\": %s, \"calls\": {",
        vis, vis & 1 ? "true" : "false", vis & 2 ? "true" : "false", nccl_path, version,
        loaded_object("libcuda.so", driver, sizeof driver) ? "true" : "false");
    for (int i = 0; i < N_OPS; i++)
        OUT("%s\"%s\": %llu", i ? ", " : "", OP_NAMES[i],
            (unsigned long long)atomic_load(&hvprof_nccl_calls[i]));
    OUT("}, \"empty_groups\": %llu, \"comms\": %llu, \"comms_first_seen_in_call\": %llu, "
        "\"nested_calls\": %llu, \"missing_real\": %llu, \"finished\": %s, ",
        (unsigned long long)atomic_load(&c_empty_groups), (unsigned long long)hvprof_nccl_comms(),
        (unsigned long long)atomic_load(&c_comms_late), (unsigned long long)atomic_load(&c_nested),
        (unsigned long long)atomic_load(&c_missing_real), atomic_load(&finished) ? "true" : "false");
    if (k < n) k += hvprof_dev_json(buf + k, n - k);
    {
        /* Which path saw NCCL: "wrappers" (symbol interposition, shared
         * NCCL), "plugin" (NCCL's profiler-plugin interface, any NCCL >= 2.23,
         * static too); recorded_by: the paths that wrote records. */
        uint64_t wr = atomic_load(&c_wrapper_records), all = 0;
        for (int i = 0; i < N_OPS; i++) all += atomic_load(&hvprof_nccl_calls[i]);
        uint64_t pr = all > wr ? all - wr : 0, ps = hvprof_nccl_plugin_silent();
        int w_saw = wr > 0, p_saw = pr > 0 || ps > 0;
        OUT(", \"seen_by\": [%s%s%s], \"recorded_by\": \"%s\", \"wrapper_records\": %llu, ",
            w_saw ? "\"wrappers\"" : "", w_saw && p_saw ? ", " : "", p_saw ? "\"plugin\"" : "",
            wr && pr ? "both" : wr ? "wrappers" : pr ? "plugin" : "none",
            (unsigned long long)wr);
        if (k < n) k += hvprof_nccl_plugin_json(buf + k, n - k, pr);
    }
    OUT("}");
#undef OUT
    if (k >= n) snprintf(buf, n, "{\"error\": \"nccl json too long\"}");
    pthread_mutex_unlock(&m);
    return buf;
}

/* Write the JSON document next to the raw file (rank-R.nccl.json), through a
 * temporary file and rename: a reader never sees half of it. */
static void write_sidecar(void)
{
    char path[4096];
    if (hvprof_sidecar_path(path, sizeof path, ".nccl.json") != 0) return;
    if (hvprof_write_text(path, hvprof_nccl_json()) != 0)
        hvprof_warn("cannot write %s: NCCL visibility is not recorded", path);
}

/* Collect every pending device time (see hvprof_dev_flush in cuda_rt.h).
 * Returns the number of pairs still pending. */
HVPROF_EXPORT int hvprof_nccl_flush(int timeout_ms) { return hvprof_dev_flush(timeout_ms); }

/* The end of NCCL profiling in this process: stop the device-time helper,
 * collect pending device times (polling, up to timeout_ms; negative: the
 * default), and write raw/rank-R.nccl.json (this process's hvprof_nccl_json)
 * when the process used NCCL or CUDA.  Returns the pairs left unfinished.
 * Called at exit (atexit), by the Python runtime before it converts the raw
 * file, and by hvprof_close (MPI_Finalize, exit) through this backend's finish
 * hook.  Runs once per process: later calls return 0 at once. */
HVPROF_EXPORT int hvprof_nccl_finish(int timeout_ms)
{
    if (atomic_exchange(&finished, 1)) return 0; /* once: the first caller wins */
    hvprof_nccl_plugin_flush();
    int left = hvprof_dev_finish(timeout_ms);
    char p1[256], p2[256], p3[256];
    int used = hvprof_nccl_visible() != 0 || loaded_object("libcuda.so", p1, sizeof p1) ||
               loaded_object("libcudart", p2, sizeof p2) || loaded_object("libnccl", p3, sizeof p3);
    if (used) write_sidecar();
    return left;
}

static void nccl_exit(void) { hvprof_nccl_finish(-1); }

static void nccl_atfork_child(void)
{
    atomic_store(&finished, 1); /* a child writes no device times, no sidecar */
    nccl_groups_forget();
}

static const hvprof_backend nccl_backend = {
    .name = "nccl",
    .library = "libnccl",
    .finish = nccl_exit,
    .atfork_child = nccl_atfork_child,
};

__attribute__((constructor)) static void nccl_ctor(void)
{
    hvprof_register_backend(&nccl_backend);
    hvprof_nccl_set_exit(nccl_exit);
}
