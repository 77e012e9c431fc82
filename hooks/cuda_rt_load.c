/*
 * cuda_rt_load.c -- the CUDA runtime of device timing, found once per process
 * at the first NCCL call that wants device time (without it NCCL calls still
 * get their host record: cuda_rt.c describes the method), and the device
 * timing settings, read at the same time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt_internal.h"

cuda_api cu;

pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
_Atomic int cuda_state;              /* 0 untried, 1 ok, -1 unavailable */
char cuda_path[256];
int cuda_version;
_Atomic int forked;

/* settings, read once at load */
int dev_on = HVS_NCCL_DEVICE_DEFAULT;
uint32_t pool_pairs = HVS_NCCL_EVENTS_DEFAULT;
int poll_ms = HVS_NCCL_POLL_MS_DEFAULT;
int64_t anchor_ms = HVS_NCCL_ANCHOR_MS_DEFAULT;
int dev_flush_ms = HVS_NCCL_FLUSH_MS_DEFAULT;

/* ------------------------------------------------------------------------ */
/* Loading the runtime.                                                      */

static int find_loaded_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    if (!name || !*name) return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcudart", 9) != 0 || !strstr(base, ".so")) return 0;
    snprintf((char *)data, sizeof cuda_path, "%s", name);
    return 1;
}

static int resolve_runtime(void *h)
{
#define REQ(f) if (!(*(void **)&cu.f = dlsym(h, "cuda" #f))) return -1
#define OPT(f) *(void **)&cu.f = dlsym(h, "cuda" #f)
    REQ(EventCreateWithFlags);
    REQ(EventRecord);
    REQ(EventQuery);
    REQ(EventElapsedTime);
    REQ(EventDestroy);
    REQ(GetDevice);
    REQ(StreamCreateWithFlags);
    OPT(SetDevice);
    OPT(StreamIsCapturing);
    OPT(ThreadExchangeStreamCaptureMode);
    OPT(GetLastError);
    OPT(RuntimeGetVersion);
#undef REQ
#undef OPT
    int dev = -1;
    if (cu.GetDevice(&dev) != CU_SUCCESS || dev < 0) {
        clear_cuda_error();
        return -1;
    }
    if (cu.RuntimeGetVersion) cu.RuntimeGetVersion(&cuda_version);
    return 0;
}

static void read_settings(void)
{
    dev_on = (int)hvprof_setting_int(HVS_NCCL_DEVICE);
    pool_pairs = (uint32_t)hvprof_setting_int(HVS_NCCL_EVENTS);
    poll_ms = (int)hvprof_setting_int(HVS_NCCL_POLL_MS);
    anchor_ms = hvprof_setting_int(HVS_NCCL_ANCHOR_MS);
    dev_flush_ms = (int)hvprof_setting_int(HVS_NCCL_FLUSH_MS);
}

/* The slow half of cuda_load (cuda_rt_internal.h): decided once per process,
 * under load_lock. */
int cuda_load_slow(void)
{
    pthread_mutex_lock(&load_lock);
    int s = atomic_load(&cuda_state);
    if (s == 0) {
        read_settings();
        s = -1;
        const char *forced = hvprof_setting_text(HVS_CUDART);
        char found[sizeof cuda_path] = "";
        if (forced) {
            if (strcmp(forced, "none") != 0) snprintf(found, sizeof found, "%s", forced);
        } else {
            dl_iterate_phdr(find_loaded_cudart, found);
        }
        static const char *const names[] = {"libcudart.so.13", "libcudart.so.12",
                                            "libcudart.so.11.0", "libcudart.so"};
        const char *cands[6];
        int nc = 0;
        if (forced && *forced) {
            if (found[0]) cands[nc++] = found;
        } else {
            if (found[0]) cands[nc++] = found;
            for (size_t i = 0; i < sizeof names / sizeof *names; i++) cands[nc++] = names[i];
        }
        for (int i = 0; i < nc; i++) {
            void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
            if (h && resolve_runtime(h) == 0) {
                snprintf(cuda_path, sizeof cuda_path, "%s", cands[i]);
                s = 1;
                break;
            }
            /* A runtime that cannot reach a device stays loaded: unloading a
             * CUDA runtime is not safe.  Try the next name. */
            memset(&cu, 0, sizeof cu);
        }
        atomic_store_explicit(&cuda_state, s, memory_order_release);
    }
    pthread_mutex_unlock(&load_lock);
    return s;
}
