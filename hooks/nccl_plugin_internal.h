/*
 * nccl_plugin_internal.h -- what nccl_plugin.c (the plugin's events: contexts,
 * calls, their children, the records) and nccl_plugin_versions.c (the seven
 * versions' entry points, each descriptor normalized) share.
 */
#ifndef HVPROF_NCCL_PLUGIN_INTERNAL_H
#define HVPROF_NCCL_PLUGIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "hvprof_internal.h"
#include "nccl_common.h"
#include "nccl_profiler_abi.h"

#define TLS_IE __attribute__((tls_model("initial-exec")))

/* ncclFunc_t (v1): Broadcast, Reduce, AllGather, ReduceScatter, AllReduce,
 * SendRecv, Send, Recv; v2 on: the same names as strings. */
static const struct {
    const char *name;
    uint16_t op;
} FUNCS[8] = {
    {"Broadcast", HVPROF_OP_NCCL_BROADCAST}, {"Reduce", HVPROF_OP_NCCL_REDUCE},
    {"AllGather", HVPROF_OP_NCCL_ALLGATHER}, {"ReduceScatter", HVPROF_OP_NCCL_REDUCESCATTER},
    {"AllReduce", HVPROF_OP_NCCL_ALLREDUCE}, {"SendRecv", HVPROF_OP_NCCL_SEND},
    {"Send", HVPROF_OP_NCCL_SEND},           {"Recv", HVPROF_OP_NCCL_RECV},
};

/* Normalized event, from any version's descriptor. */
typedef struct norm {
    uint64_t type;
    void *group;      /* the parent group handle (one of ours, or NULL) */
    void *parent;     /* a child's parentObj */
    int rank;
    uint64_t hash;    /* v1-v3: the descriptor's commHash */
    int func;         /* FUNCS index */
    size_t count;
    int dtype;        /* DTYPES index */
    uint8_t redop;
    int root;         /* root or peer */
    int in_place;
    int pid;          /* ProxyOp: the process that made it (PXN: another one) */
    int is_send;      /* ProxyOp */
    uint64_t ptimer;  /* KernelCh v4 on: the start timer */
} norm;

/* Approximate counters (a plain relaxed load + store, no locked
 * instruction on the per-call path: concurrent threads may lose a count). */
/* nccl_plugin.c: the events, whatever the version. */
ncclResult_t ctx_new(void **context, int version, uint64_t id, int nranks, int rank, int *mask);
ncclResult_t start_common(void *context, void **eHandle, const norm *n);
ncclResult_t stop_event(void *eHandle);
void record_state(void *eHandle, plugin_state_t s, const void *args, int version);
ncclResult_t finalize_ctx(void *context);

#endif
