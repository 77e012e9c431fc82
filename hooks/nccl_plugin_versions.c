/*
 * nccl_plugin_versions.c -- the entry points of NCCL's profiler-plugin
 * interface, versions 1 to 7 (ncclProfiler_vN, exported): each normalizes its
 * version's descriptor (nccl_profiler_abi.h) and calls nccl_plugin.c's events.
 */
#define _GNU_SOURCE
#include <string.h>
#include <strings.h>

#include "nccl_plugin_internal.h"

static int func_index(const char *s)
{
    if (!s) return -1;
    for (int i = 0; i < 8; i++)
        if (strcmp(s, FUNCS[i].name) == 0) return i;
    return -1;
}

static int dtype_index(const char *s)
{
    if (!s) return -1;
    if (strncmp(s, "nccl", 4) == 0) s += 4;
    for (int i = 0; i < HVPROF_NCCL_N_DTYPES; i++)
        if (strcasecmp(s, hvprof_nccl_dtypes[i].name) == 0) return i;
    /* NCCL's aliases */
    if (strcasecmp(s, "Char") == 0) return 0;
    if (strcasecmp(s, "Int") == 0) return 2;
    if (strcasecmp(s, "Half") == 0) return 6;
    if (strcasecmp(s, "Float") == 0) return 7;
    if (strcasecmp(s, "Double") == 0) return 8;
    return -1;
}

/* One-entry per-thread caches: NCCL passes the same static strings each time. */
static __thread const char *tc_func_s TLS_IE, *tc_dt_s TLS_IE;
static __thread int tc_func_i TLS_IE = -1, tc_dt_i TLS_IE = -1;

static inline int func_of(const char *s)
{
    if (HVPROF_LIKELY(s == tc_func_s && s)) return tc_func_i;
    tc_func_i = func_index(s);
    tc_func_s = s;
    return tc_func_i;
}

static inline int dtype_of(const char *s)
{
    if (HVPROF_LIKELY(s == tc_dt_s && s)) return tc_dt_i;
    tc_dt_i = dtype_index(s);
    tc_dt_s = s;
    return tc_dt_i;
}

/* ------------------------------------------------------------------------ */
/* Per-version entry points.                                                 */

static ncclResult_t init_v1(void **context, int *mask) { return ctx_new(context, 1, 0, -1, -1, mask); }
static ncclResult_t init_v2(void **context, int *mask) { return ctx_new(context, 2, 0, -1, -1, mask); }
static ncclResult_t init_v3(void **context, int *mask) { return ctx_new(context, 3, 0, -1, -1, mask); }

static ncclResult_t init_v4(void **context, int *mask, const char *commName, uint64_t commHash,
                            int nNodes, int nranks, int rank, plugin_logger_t logfn)
{
    (void)commName;
    (void)nNodes;
    (void)logfn;
    return ctx_new(context, 4, commHash, nranks, rank, mask);
}

#define INIT_NEW(N)                                                                   \
    static ncclResult_t init_v##N(void **context, uint64_t commId, int *mask,         \
                                  const char *commName, int nNodes, int nranks, int rank, \
                                  plugin_logger_t logfn)                              \
    {                                                                                 \
        (void)commName;                                                               \
        (void)nNodes;                                                                 \
        (void)logfn;                                                                  \
        return ctx_new(context, N, commId, nranks, rank, mask);                       \
    }
INIT_NEW(5)
INIT_NEW(6)
INIT_NEW(7)

/* The child descriptors are laid out alike in every version (kernelCh's
 * timer from v4 on). */
#define CHILD_FIELDS(n, d, V)                                                         \
    do {                                                                              \
        (n).parent = (d)->parentObj;                                                  \
        if ((d)->type == EV_PROXY_OP) {                                               \
            (n).pid = (d)->proxyOp.pid;                                               \
            (n).is_send = (d)->proxyOp.isSend;                                        \
        } else if ((d)->type == EV_KERNEL_CH && (V) >= 4) {                           \
            (n).ptimer = (d)->kernelCh.pTimer;                                        \
        }                                                                             \
    } while (0)

static ncclResult_t start_v1(void *context, void **eHandle, descr_v1 *d)
{
    norm n = {.type = d->type, .group = d->parentObj, .rank = d->rank, .func = -1, .dtype = -1};
    if (d->type > EV_P2P) {
        CHILD_FIELDS(n, d, 1);
    } else if (d->type == EV_COLL) {
        n.hash = d->coll.commHash;
        n.func = d->coll.func < 8 ? d->coll.func : -1;
        n.count = d->coll.count;
        n.dtype = d->coll.datatype < 12 ? d->coll.datatype : -1;
        n.redop = hvprof_nccl_redop(d->coll.op);
        n.root = d->coll.root;
        n.in_place = d->coll.sendBuff == d->coll.recvBuff;
    } else if (d->type == EV_P2P) {
        n.hash = d->p2p.commHash;
        n.func = d->p2p.func < 8 ? d->p2p.func : -1;
        n.count = d->p2p.count;
        n.dtype = d->p2p.datatype < 12 ? d->p2p.datatype : -1;
        n.root = d->p2p.peer;
    }
    return start_common(context, eHandle, &n);
}

#define START_V2(N)                                                                   \
    static ncclResult_t start_v##N(void *context, void **eHandle, descr_v##N *d)      \
    {                                                                                 \
        norm n = {.type = d->type, .group = d->parentObj, .rank = d->rank, .func = -1, \
                  .dtype = -1};                                                       \
        if (d->type > EV_P2P) {                                                       \
            CHILD_FIELDS(n, d, N);                                                    \
        } else if (d->type == EV_COLL) {                                              \
            n.hash = d->coll.commHash;                                                \
            n.func = func_of(d->coll.func);                                           \
            n.count = d->coll.count;                                                  \
            n.dtype = dtype_of(d->coll.datatype);                                     \
            n.root = d->coll.root;                                                    \
            n.in_place = d->coll.sendBuff == d->coll.recvBuff;                        \
        } else if (d->type == EV_P2P) {                                               \
            n.hash = d->p2p.commHash;                                                 \
            n.func = func_of(d->p2p.func);                                            \
            n.count = d->p2p.count;                                                   \
            n.dtype = dtype_of(d->p2p.datatype);                                      \
            n.root = d->p2p.peer;                                                     \
        }                                                                             \
        return start_common(context, eHandle, &n);                                    \
    }
START_V2(2)
START_V2(3)

/* v4: the group is parentObj; v5 on: parentGroup (parentObj is the API event). */
#define START_V4(N, GROUP_OF)                                                         \
    static ncclResult_t start_v##N(void *context, void **eHandle, descr_v##N *d)      \
    {                                                                                 \
        norm n = {.type = d->type, .group = d->parentObj, .rank = d->rank, .func = -1, \
                  .dtype = -1};                                                       \
        if (d->type > EV_P2P) {                                                       \
            CHILD_FIELDS(n, d, N);                                                    \
        } else if (d->type == EV_COLL) {                                              \
            n.group = GROUP_OF(d->coll);                                              \
            n.func = func_of(d->coll.func);                                           \
            n.count = d->coll.count;                                                  \
            n.dtype = dtype_of(d->coll.datatype);                                     \
            n.root = d->coll.root;                                                    \
            n.in_place = d->coll.sendBuff == d->coll.recvBuff;                        \
        } else if (d->type == EV_P2P) {                                               \
            n.group = GROUP_OF(d->p2p);                                               \
            n.func = func_of(d->p2p.func);                                            \
            n.count = d->p2p.count;                                                   \
            n.dtype = dtype_of(d->p2p.datatype);                                      \
            n.root = d->p2p.peer;                                                     \
        }                                                                             \
        return start_common(context, eHandle, &n);                                    \
    }
#define PARENT_OBJ(x) d->parentObj
#define PARENT_GROUP(x) (x).parentGroup
START_V4(4, PARENT_OBJ)
START_V4(5, PARENT_GROUP)
START_V4(6, PARENT_GROUP)
START_V4(7, PARENT_GROUP)

#define RECORD_STATE(N)                                                               \
    static ncclResult_t record_state_v##N(void *eHandle, plugin_state_t s, stargs_v##N *a) \
    {                                                                                 \
        record_state(eHandle, s, a, N);                                               \
        return NCCL_OK;                                                               \
    }
RECORD_STATE(1)
RECORD_STATE(2)
RECORD_STATE(3)
RECORD_STATE(4)
RECORD_STATE(5)
RECORD_STATE(6)
RECORD_STATE(7)

#define PLUGIN_NAME "horovod-profiler"
#define EXPORT_ENTRY(N)                                                               \
    HVPROF_EXPORT const ncclProfiler_v##N##_t ncclProfiler_v##N = {                   \
        PLUGIN_NAME, init_v##N, start_v##N, stop_event, record_state_v##N, finalize_ctx};
EXPORT_ENTRY(1)
EXPORT_ENTRY(2)
EXPORT_ENTRY(3)
EXPORT_ENTRY(4)
EXPORT_ENTRY(5)
EXPORT_ENTRY(6)
EXPORT_ENTRY(7)

