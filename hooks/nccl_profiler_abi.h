/*
 * nccl_profiler_abi.h -- NCCL's profiler-plugin ABI, versions 1 to 7: the
 * event types, the event descriptors, the state arguments and the entry
 * structs NCCL looks up (ncclProfiler_vN), for nccl_plugin.c.
 *
 * The declarations below are this project's own, written from NVIDIA's
 * documentation of the ABI (plugins/profiler/README.md and the version
 * headers of NVIDIA/nccl); only the members this file reads are named in the
 * descriptor unions (a union's members all start at its first byte, so the
 * others need no declaration).
 */
#ifndef HVPROF_NCCL_PROFILER_ABI_H
#define HVPROF_NCCL_PROFILER_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>


typedef int ncclResult_t;
typedef int plugin_state_t; /* ncclProfilerEventState_vN_t: an int-sized enum */
typedef void (*plugin_logger_t)(int level, unsigned long flags, const char *file, int line,
                                const char *fmt, ...);

enum {
    EV_GROUP = 1 << 0,
    EV_COLL = 1 << 1,
    EV_P2P = 1 << 2,
    EV_PROXY_OP = 1 << 3,
    EV_PROXY_STEP = 1 << 4,
    EV_PROXY_CTRL = 1 << 5,
    EV_KERNEL_CH = 1 << 6,
    EV_NET_PLUGIN = 1 << 7,
    EV_GROUP_API = 1 << 8, /* v5 on */
    EV_COLL_API = 1 << 9,
    EV_P2P_API = 1 << 10,
    EV_KERNEL_LAUNCH = 1 << 11,
};
#define CALL_MASK (EV_GROUP | EV_COLL | EV_P2P)
/* What each version can say of a call's network and device activity (asked
 * for unless HOROVOD_PROFILE_NCCL_PROXY=0): v1-v2 proxy ops (bytes in their
 * state arguments) and steps; v3 adds network-plugin events (kernel-channel
 * events carry no timer there: not asked for); v4 on: steps carry their
 * bytes, kernel-channel events their GPU timers. */
static inline int child_mask(int version)
{
    if (version <= 2) return EV_PROXY_OP | EV_PROXY_STEP;
    if (version == 3) return EV_PROXY_OP | EV_PROXY_STEP | EV_NET_PLUGIN;
    return EV_PROXY_OP | EV_PROXY_STEP | EV_NET_PLUGIN | EV_KERNEL_CH;
}

/* v1: func and datatype as NCCL's enums (uint8), the reduction op as uint32. */
struct coll_v1 {
    const char *name;
    uint64_t commHash;
    uint64_t seqNumber;
    uint8_t func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    uint8_t datatype;
    uint32_t op;
    size_t trafficBytes;
    uint8_t nMaxChannels, nWarps, algo, proto;
    int isCollnet, isNvls;
};
struct p2p_v1 {
    const char *name;
    uint64_t commHash;
    uint8_t func;
    void *buff;
    uint8_t datatype;
    size_t count;
    int peer;
};
/* v2, v3: strings for func and datatype (v3 drops trafficBytes, after them). */
struct coll_v2 {
    const char *name;
    uint64_t commHash;
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    /* v2: size_t trafficBytes; then channels, warps, algo, proto */
};
struct p2p_v2 {
    const char *name;
    uint64_t commHash;
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
};
/* v4 on: no name/commHash (init gives the communicator). */
struct coll_v4 {
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t nChannels, nWarps;
    const char *algo, *proto;
    void *parentGroup; /* v5 on */
    /* v7: kernelVariant, isSymColl, userTag */
};
struct p2p_v4 {
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
    void *parentGroup; /* v5 on */
    /* v7: userTag */
};

/* The descriptor: v1-v4 begin with a uint8_t type, v5 on with a uint64_t;
 * either way the union starts at byte 24 on LP64. */
#define DESCR(N, TYPE_T, COLL, P2P)                                                   \
    typedef struct {                                                                  \
        TYPE_T type;                                                                  \
        void *parentObj;                                                              \
        int rank;                                                                     \
        union {                                                                       \
            struct COLL coll;                                                         \
            struct P2P p2p;                                                           \
            struct {                                                                  \
                pid_t pid;                                                            \
                uint8_t channelId;                                                    \
                int peer, nSteps, chunkSize, isSend;                                  \
            } proxyOp;                                                                \
            struct { int step; } proxyStep;                                           \
            struct { uint8_t channelId; uint64_t pTimer; /* v4 on */ } kernelCh;      \
            struct { int64_t id; void *data; } netPlugin; /* v3 on */                 \
        };                                                                            \
    } descr_v##N;
DESCR(1, uint8_t, coll_v1, p2p_v1)
DESCR(2, uint8_t, coll_v2, p2p_v2)
DESCR(3, uint8_t, coll_v2, p2p_v2)
DESCR(4, uint8_t, coll_v4, p2p_v4)
DESCR(5, uint64_t, coll_v4, p2p_v4)
DESCR(6, uint64_t, coll_v4, p2p_v4)
DESCR(7, uint64_t, coll_v4, p2p_v4)
#undef DESCR

/* State arguments (recordEventState).  v1-v3: a proxy op's bytes so far
 * (transSize) and steps; v4 on: a proxy step's bytes, a kernel channel's
 * stop timer.  transSize and pTimer are each the union's first member. */
typedef union {
    struct { size_t transSize; int steps; } proxyOp;
    struct { int appendedProxyOps; } proxyCtrl;
} stargs_v1;
typedef stargs_v1 stargs_v2, stargs_v3;
typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void *data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} stargs_v4;
typedef stargs_v4 stargs_v5, stargs_v6, stargs_v7;

/* The entry structs: name, init, startEvent, stopEvent, recordEventState,
 * finalize.  init: v1-v3 (context, mask); v4 (context, mask, commName,
 * commHash, nNodes, nranks, rank, logfn); v5 on (context, commId, mask,
 * commName, nNodes, nranks, rank, logfn). */
#define ENTRY(N, ...)                                                                 \
    typedef struct {                                                                  \
        const char *name;                                                             \
        ncclResult_t (*init)(__VA_ARGS__);                                            \
        ncclResult_t (*startEvent)(void *context, void **eHandle, descr_v##N *eDescr); \
        ncclResult_t (*stopEvent)(void *eHandle);                                     \
        ncclResult_t (*recordEventState)(void *eHandle, plugin_state_t eState,        \
                                         stargs_v##N *eStateArgs);                    \
        ncclResult_t (*finalize)(void *context);                                      \
    } ncclProfiler_v##N##_t;
#define INIT_OLD void **context, int *eActivationMask
#define INIT_V4                                                                        \
    void **context, int *eActivationMask, const char *commName, uint64_t commHash,     \
        int nNodes, int nranks, int rank, plugin_logger_t logfn
#define INIT_V5                                                                        \
    void **context, uint64_t commId, int *eActivationMask, const char *commName,       \
        int nNodes, int nranks, int rank, plugin_logger_t logfn
ENTRY(1, INIT_OLD)
ENTRY(2, INIT_OLD)
ENTRY(3, INIT_OLD)
ENTRY(4, INIT_V4)
ENTRY(5, INIT_V5)
ENTRY(6, INIT_V5)
ENTRY(7, INIT_V5)
#undef ENTRY

enum { NCCL_OK = 0 };

#endif
