/*
 * nccl_lookup.c -- what the NCCL symbol wrappers (nccl.c) look up: the real
 * NCCL's functions (dlsym(RTLD_NEXT), else on a libnccl loaded RTLD_LOCAL,
 * found with dl_iterate_phdr), its optional communicator queries, and the
 * registration of a communicator in the core's table.  The method: nccl.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cuda_rt.h"
#include "nccl_internal.h"

_Atomic uint64_t c_comms_late, c_missing_real;

/* ------------------------------------------------------------------------ */
/* Finding the real NCCL.                                                    */

struct find_arg {
    const char *prefix;
    char path[256];
};

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct find_arg *a = data;
    const char *name = info->dlpi_name;
    if (!name || !*name) return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    size_t n = strlen(a->prefix);
    if (strncmp(base, a->prefix, n) != 0 || !strstr(base, ".so")) return 0;
    snprintf(a->path, sizeof a->path, "%s", name);
    return 1;
}

/* Path of a loaded object whose file name starts with prefix ("libnccl",
 * "libcuda."), or "" -- written into out. */
int loaded_object(const char *prefix, char *out, size_t n)
{
    struct find_arg a = {prefix, ""};
    dl_iterate_phdr(find_loaded, &a);
    snprintf(out, n, "%s", a.path);
    return a.path[0] != 0;
}

void *real_sym(const char *name, void *self)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (p && p != self) return p;
    char path[256];
    if (loaded_object("libnccl", path, sizeof path)) {
        void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
        if (h) {
            p = dlsym(h, name);
            dlclose(h); /* only drops the reference NOLOAD took */
            if (p && p != self) return p;
        }
    }
    return NULL;
}

ncclResult_t missing_real(const char *name)
{
    if (atomic_fetch_add(&c_missing_real, 1) == 0)
        hvprof_warn("%s called but no NCCL library provides it", name);
    return NCCL_SYSTEM_ERROR;
}

/* Optional NCCL queries, resolved on first use. */
typedef ncclResult_t (*comm_int_fn)(ncclComm_t, int *);
static comm_int_fn q_count, q_rank, q_device;
static _Atomic int q_done;

static void resolve_queries(void)
{
    if (atomic_load_explicit(&q_done, memory_order_acquire)) return;
    void *p;
    p = real_sym("ncclCommCount", NULL);
    memcpy(&q_count, &p, sizeof p);
    p = real_sym("ncclCommUserRank", NULL);
    memcpy(&q_rank, &p, sizeof p);
    p = real_sym("ncclCommCuDevice", NULL);
    memcpy(&q_device, &p, sizeof p);
    atomic_store_explicit(&q_done, 1, memory_order_release);
}

/* ------------------------------------------------------------------------ */
/* Communicators.                                                            */

uint32_t comm_register(ncclComm_t c, uint64_t id, int size, int rank, int device)
{
    if (!c) return UINT32_MAX;
    resolve_queries();
    if (size <= 0 && q_count && q_count(c, &size) != NCCL_SUCCESS) size = -1;
    if (rank < 0 && q_rank && q_rank(c, &rank) != NCCL_SUCCESS) rank = -1;
    if (device < 0 && q_device && q_device(c, &device) != NCCL_SUCCESS) device = -1;
    if (device < 0) device = hvprof_cuda_current_device();
    return hvprof_nccl_comm_register((uint64_t)(uintptr_t)c, id, size, rank, device);
}

uint64_t uid_hash(const ncclUniqueId *u, uint64_t h)
{
    for (size_t i = 0; i < sizeof u->internal; i += 8) {
        uint64_t w;
        memcpy(&w, u->internal + i, 8);
        h = hvprof_mix(h, w);
    }
    return h;
}
