/*
 * nccl_standin.c -- a STAND-IN for NCCL, for tests only.
 *
 * Built by tests/test_nccl_standin.py as libnccl.so.2 (soname libnccl.so.2)
 * in a temporary directory.  It is not NCCL: nothing is communicated.  Each
 * rank behaves as if every peer held the same data (allreduce = copy,
 * allgather/reducescatter copy this rank's block, broadcast copies at the
 * root), which is all the profiler tests need.
 *
 * Each collective enqueues STANDIN_NCCL_DELAY_US microseconds of virtual work
 * on its stream through the CUDA stand-in (standin_stream_enqueue, looked up
 * at run time so this library also works in a process without the CUDA
 * stand-in); standin_nccl_set_delay_us() overrides the variable.  Calls
 * between ncclGroupStart and ncclGroupEnd are queued and launched by the
 * outermost ncclGroupEnd, as NCCL does.  ncclBcast calls ncclBroadcast and
 * ncclCommInitAll calls ncclGroupStart/End through their exported symbols, as
 * NCCL does, so the profiler's handling of NCCL-internal calls is exercised.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct ncclConfig ncclConfig_t;

enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

typedef struct standin_comm {
    int magic;
    int nranks;
    int rank;
    int device;
    ncclUniqueId id;
    uint64_t hash;         /* the communicator's id, equal on every rank */
    void *prof_ctx;        /* the profiler plugin's context (init per comm) */
    int prof_mask;         /* the events the plugin asked for */
    uint64_t seq[8];       /* per-function sequence numbers, as NCCL keeps */
} standin_comm;
typedef standin_comm *ncclComm_t;

#define COMM_MAGIC 0x5354414e /* "STAN" */

static const int TYPE_SIZE[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};


/* ---- the profiler-plugin loader ------------------------------------------
 * Built with -DSTANDIN_PROFILER_V=N (1, 4 or 7; 0 or absent: no loader).
 * Behaves as NCCL's documented loader (plugins/profiler/README.md):
 * NCCL_PROFILER_PLUGIN unset -> "libnccl-profiler.so"; "none" -> no plugin;
 * a name -> "libnccl-profiler-<name>.so", then the name as given (a library
 * name or a path).  dlopen(RTLD_NOW | RTLD_LOCAL), then dlsym of the newest
 * struct version this stand-in supports down to ncclProfiler_v1.  init per
 * communicator, Group / Coll / P2p events around each call (every call in a
 * group of its own unless inside ncclGroupStart/End; a group's calls start
 * at the outermost ncclGroupEnd, one Group event per communicator), finalize
 * at ncclCommDestroy/Abort, dlclose after the last communicator.  The
 * declarations are the stand-in's own, independent of hooks/nccl_plugin.c. */
#ifndef STANDIN_PROFILER_V
#define STANDIN_PROFILER_V 0
#endif
enum { P_GROUP = 1, P_COLL = 2, P_P2P = 4, P_PROXY_OP = 8, P_PROXY_STEP = 16, P_KERNEL_CH = 64,
       P_NET_PLUGIN = 128 };
static const char *const FUNC_NAMES[8] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                          "AllReduce", "SendRecv", "Send", "Recv"};
static const char *const DT_NAMES[12] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                         "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                         "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                         "ncclFloat8e5m2"};
typedef struct { /* ncclProfilerEventDescr_v1_t, the members used */
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name; uint64_t commHash; uint64_t seqNumber; uint8_t func;
            const void *sendBuff; void *recvBuff; size_t count; int root; uint8_t datatype;
            uint32_t op; size_t trafficBytes; uint8_t nMaxChannels, nWarps, algo, proto;
            int isCollnet, isNvls;
        } coll;
        struct {
            const char *name; uint64_t commHash; uint8_t func; void *buff; uint8_t datatype;
            size_t count; int peer;
        } p2p;
        struct { pid_t pid; uint8_t channelId; int peer, nSteps, chunkSize, isSend; } proxyOp;
        struct { int step; } proxyStep;
    };
} sd_v1;
/* the state arguments: v1 (a proxy op's bytes so far), v4 on (a step's
 * bytes, a kernel channel's stop timer) */
typedef union { struct { size_t transSize; int steps; } proxyOp; } sd_args_v1;
typedef union {
    struct { size_t transSize; } proxyStep;
    struct { uint64_t pTimer; } kernelCh;
} sd_args_v4;
#define SD_NEW(N, TYPE_T, COLL_TAIL, P2P_TAIL)                                        \
    typedef struct {                                                                 \
        TYPE_T type;                                                                 \
        void *parentObj;                                                             \
        int rank;                                                                    \
        union {                                                                      \
            struct {                                                                 \
                uint64_t seqNumber; const char *func; const void *sendBuff;          \
                void *recvBuff; size_t count; int root; const char *datatype;        \
                uint8_t nChannels, nWarps; const char *algo, *proto; COLL_TAIL       \
            } coll;                                                                  \
            struct {                                                                 \
                const char *func; void *buff; const char *datatype; size_t count;    \
                int peer; uint8_t nChannels; P2P_TAIL                                \
            } p2p;                                                                   \
            struct {                                                                 \
                pid_t pid; uint8_t channelId; int peer, nSteps, chunkSize, isSend;   \
            } proxyOp;                                                               \
            struct { int step; } proxyStep;                                          \
            struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                 \
            struct { int64_t id; void *data; } netPlugin;                            \
        };                                                                           \
    } sd_v##N;
SD_NEW(4, uint8_t, , )
SD_NEW(7, uint64_t, void *parentGroup; const char *kernelVariant; bool isSymColl;
       uint64_t userTag;, void *parentGroup; uint64_t userTag;)
typedef void (*sd_logger)(int, unsigned long, const char *, int, const char *, ...);
typedef struct {
    const char *name;
    void *init;
    ncclResult_t (*startEvent)(void *, void **, void *);
    ncclResult_t (*stopEvent)(void *);
    ncclResult_t (*recordEventState)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
} sd_entry;
typedef ncclResult_t (*init_old_fn)(void **, int *);
typedef ncclResult_t (*init_v4_fn)(void **, int *, const char *, uint64_t, int, int, int,
                                   sd_logger);
typedef ncclResult_t (*init_v5_fn)(void **, uint64_t, int *, const char *, int, int, int,
                                   sd_logger);

static pthread_mutex_t plug_lock = PTHREAD_MUTEX_INITIALIZER;
static void *plug_handle;
static const sd_entry *plug;
static int plug_version, plug_refs, plug_tried;
static char plug_path[512];

static void sd_log(int level, unsigned long flags, const char *file, int line, const char *fmt,
                   ...)
{
    (void)level; (void)flags; (void)file; (void)line; (void)fmt;
}

static void *open_plugin(void)
{
    const char *env = getenv("NCCL_PROFILER_PLUGIN");
    char buf[512];
    void *h = NULL;
    if (env && strcmp(env, "none") == 0) return NULL;
    if (!env || !*env) {
        snprintf(buf, sizeof buf, "libnccl-profiler.so");
        h = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
    } else {
        snprintf(buf, sizeof buf, "libnccl-profiler-%s.so", env);
        h = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(buf, sizeof buf, "%s", env);
            h = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (h) snprintf(plug_path, sizeof plug_path, "%s", buf);
    return h;
}

/* Called at each communicator's creation, under no other lock. */
static void plugin_acquire(void)
{
    if (STANDIN_PROFILER_V <= 0) return;
    pthread_mutex_lock(&plug_lock);
    if (!plug && !plug_tried) {
        plug_tried = 1;
        plug_handle = open_plugin();
        if (plug_handle) {
            for (int v = STANDIN_PROFILER_V; v >= 1 && !plug; v--) {
                if (v != 1 && v != 4 && v != 7) continue; /* the layouts declared here */
                char name[32];
                snprintf(name, sizeof name, "ncclProfiler_v%d", v);
                plug = dlsym(plug_handle, name);
                if (plug) plug_version = v;
            }
            if (!plug) {
                dlclose(plug_handle);
                plug_handle = NULL;
            }
        }
    }
    if (plug) plug_refs++;
    pthread_mutex_unlock(&plug_lock);
}

static void plugin_release(void)
{
    pthread_mutex_lock(&plug_lock);
    if (plug && --plug_refs == 0) {
        dlclose(plug_handle);
        plug_handle = NULL;
        plug = NULL;
        plug_tried = 0;
    }
    pthread_mutex_unlock(&plug_lock);
}

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void plugin_comm_init(standin_comm *c)
{
    plugin_acquire();
    if (!plug) return;
    c->prof_mask = 0;
    ncclResult_t rc = 1;
    if (plug_version <= 3) {
        init_old_fn f;
        memcpy(&f, &plug->init, sizeof f);
        rc = f(&c->prof_ctx, &c->prof_mask);
    } else if (plug_version == 4) {
        init_v4_fn f;
        memcpy(&f, &plug->init, sizeof f);
        rc = f(&c->prof_ctx, &c->prof_mask, "standin", c->hash, 1, c->nranks, c->rank, sd_log);
    } else {
        init_v5_fn f;
        memcpy(&f, &plug->init, sizeof f);
        rc = f(&c->prof_ctx, c->hash, &c->prof_mask, "standin", 1, c->nranks, c->rank, sd_log);
    }
    if (rc != ncclSuccess) {
        c->prof_ctx = NULL;
        c->prof_mask = 0;
    }
}

static void proxy_drain(void);

static void plugin_comm_fini(standin_comm *c)
{
    if (!plug) return;
    proxy_drain();
    if (c->prof_ctx || c->prof_mask) plug->finalize(c->prof_ctx);
    c->prof_ctx = NULL;
    plugin_release();
}

/* A call's description, kept until its group launches. */
typedef struct callinfo {
    standin_comm *comm;
    int func;  /* FUNC_NAMES index */
    const void *send;
    void *recv;
    size_t count;
    int dt;
    int op;
    int root;  /* root, or peer for Send/Recv */
} callinfo;

static void *prof_group_start(standin_comm *c)
{
    void *h = NULL;
    if (!plug || !(c->prof_mask & P_GROUP)) return NULL;
    union { sd_v1 v1; sd_v4 v4; sd_v7 v7; } d;
    memset(&d, 0, sizeof d);
    if (plug_version <= 4) { d.v1.type = P_GROUP; d.v1.rank = c->rank; }
    else { d.v7.type = P_GROUP; d.v7.rank = c->rank; }
    plug->startEvent(c->prof_ctx, &h, &d);
    return h;
}

static void prof_stop(void *h)
{
    if (plug && h) plug->stopEvent(h);
}

static void *prof_call_start(const callinfo *ci, void *group)
{
    standin_comm *c = ci->comm;
    int p2p = ci->func == 6 || ci->func == 7;
    if (!plug || !(c->prof_mask & (p2p ? P_P2P : P_COLL))) return NULL;
    uint64_t seq = c->seq[ci->func]++;
    void *h = NULL;
    union { sd_v1 v1; sd_v4 v4; sd_v7 v7; } d;
    memset(&d, 0, sizeof d);
    if (plug_version == 1) {
        sd_v1 *x = &d.v1;
        x->type = p2p ? P_P2P : P_COLL; x->parentObj = group; x->rank = c->rank;
        if (p2p) {
            x->p2p.name = FUNC_NAMES[ci->func]; x->p2p.commHash = c->hash;
            x->p2p.func = (uint8_t)ci->func; x->p2p.buff = ci->recv; x->p2p.datatype = (uint8_t)ci->dt;
            x->p2p.count = ci->count; x->p2p.peer = ci->root;
        } else {
            x->coll.name = FUNC_NAMES[ci->func]; x->coll.commHash = c->hash;
            x->coll.seqNumber = seq; x->coll.func = (uint8_t)ci->func;
            x->coll.sendBuff = ci->send; x->coll.recvBuff = ci->recv; x->coll.count = ci->count;
            x->coll.root = ci->root; x->coll.datatype = (uint8_t)ci->dt; x->coll.op = (uint32_t)ci->op;
            x->coll.trafficBytes = ci->count * TYPE_SIZE[ci->dt];
        }
    } else if (plug_version == 4) {
        sd_v4 *x = &d.v4;
        x->type = p2p ? P_P2P : P_COLL; x->parentObj = group; x->rank = c->rank;
        if (p2p) {
            x->p2p.func = FUNC_NAMES[ci->func]; x->p2p.buff = ci->recv;
            x->p2p.datatype = DT_NAMES[ci->dt]; x->p2p.count = ci->count; x->p2p.peer = ci->root;
        } else {
            x->coll.seqNumber = seq; x->coll.func = FUNC_NAMES[ci->func];
            x->coll.sendBuff = ci->send; x->coll.recvBuff = ci->recv; x->coll.count = ci->count;
            x->coll.root = ci->root; x->coll.datatype = DT_NAMES[ci->dt];
            x->coll.algo = "Ring"; x->coll.proto = "Simple";
        }
    } else {
        sd_v7 *x = &d.v7;
        x->type = p2p ? P_P2P : P_COLL; x->parentObj = NULL; /* the API event: not asked for */
        x->rank = c->rank;
        if (p2p) {
            x->p2p.func = FUNC_NAMES[ci->func]; x->p2p.buff = ci->recv;
            x->p2p.datatype = DT_NAMES[ci->dt]; x->p2p.count = ci->count; x->p2p.peer = ci->root;
            x->p2p.parentGroup = group;
        } else {
            x->coll.seqNumber = seq; x->coll.func = FUNC_NAMES[ci->func];
            x->coll.sendBuff = ci->send; x->coll.recvBuff = ci->recv; x->coll.count = ci->count;
            x->coll.root = ci->root; x->coll.datatype = DT_NAMES[ci->dt];
            x->coll.algo = "Ring"; x->coll.proto = "Simple"; x->coll.parentGroup = group;
            x->coll.kernelVariant = "standin";
        }
    }
    plug->startEvent(c->prof_ctx, &h, &d);
    return h;
}

/* ---- the stand-in's proxy thread (STANDIN_NCCL_PROXY=1) -----------------
 * As NCCL's proxy progress thread does (plugins/profiler/README.md, "Event
 * hierarchy"), after a collective's Coll event has stopped (NCCL stops it
 * once the call is enqueued) this thread raises, for each of SD_CHANNELS
 * channels: a KernelCh event (v4 on, when asked for) whose start and stop
 * timers are FAKE GPU timestamps (CLOCK_MONOTONIC ns + SD_FAKE_EPOCH: the
 * stand-in has no GPU), reported after the fake times have passed as the
 * proxy thread reports a kernel's counters; and a send and a receive ProxyOp
 * (parent: the Coll event) of SD_STEPS ProxySteps (parent: the ProxyOp),
 * each step with its bytes (v4 on: the step's state arguments; v1: the op's
 * running total) and, v4 on, one NetPlugin event (parent: the step).  Each
 * direction carries the call's bytes, split over channels and steps.  Only
 * collectives with bytes; none for point-to-point calls.  The FAKE kernel
 * of a call runs SD_FAKE_KERNEL_NS(bytes) ns from SD_FAKE_LAUNCH_NS after its
 * Coll event stopped.  Not NCCL's numbers: a stand-in's. */
#define SD_CHANNELS 2
#define SD_STEPS 4
#define SD_FAKE_EPOCH 0x1000000000000000ull
#define SD_FAKE_LAUNCH_NS 1000
#define SD_FAKE_KERNEL_NS(bytes) (20000 + (int64_t)(bytes) / 16)

typedef struct pwork {
    standin_comm *c;
    void *coll;
    size_t bytes;
    int64_t t_stop; /* host ns when the Coll event stopped */
} pwork;

static pthread_mutex_t pq_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pq_cond = PTHREAD_COND_INITIALIZER, pq_idle = PTHREAD_COND_INITIALIZER;
static pwork pq[1024];
static unsigned pq_head, pq_tail;
static int pq_busy, pq_started, proxy_on = -1;

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void wait_until(int64_t t)
{
    while (mono_ns() < t) {
    }
}

static void sd_state(void *h, int state, size_t trans, int steps, uint64_t timer)
{
    if (!h || !plug->recordEventState) return;
    if (plug_version < 4) {
        sd_args_v1 a = {.proxyOp = {trans, steps}};
        plug->recordEventState(h, state, &a);
    } else {
        sd_args_v4 a;
        memset(&a, 0, sizeof a);
        if (timer) a.kernelCh.pTimer = timer;
        else a.proxyStep.transSize = trans;
        plug->recordEventState(h, state, &a);
    }
}

static void *sd_child(standin_comm *c, int type, void *parent, int ch, int is_send,
                      int step, int nsteps, int chunk, uint64_t timer)
{
    union { sd_v1 v1; sd_v4 v4; sd_v7 v7; } d;
    memset(&d, 0, sizeof d);
    void *h = NULL;
    if (plug_version < 4) {
        d.v1.type = (uint8_t)type; d.v1.parentObj = parent; d.v1.rank = c->rank;
        if (type == P_PROXY_OP) {
            d.v1.proxyOp.pid = getpid(); d.v1.proxyOp.channelId = (uint8_t)ch;
            d.v1.proxyOp.peer = (c->rank + 1) % (c->nranks > 0 ? c->nranks : 1);
            d.v1.proxyOp.nSteps = nsteps; d.v1.proxyOp.chunkSize = chunk;
            d.v1.proxyOp.isSend = is_send;
        } else {
            d.v1.proxyStep.step = step;
        }
    } else {
#define SD_FILL(x)                                                                        \
        x.type = (uint8_t)type; x.parentObj = parent; x.rank = c->rank;                  \
        if (type == P_PROXY_OP) {                                                        \
            x.proxyOp.pid = getpid(); x.proxyOp.channelId = (uint8_t)ch;                 \
            x.proxyOp.peer = (c->rank + 1) % (c->nranks > 0 ? c->nranks : 1);           \
            x.proxyOp.nSteps = nsteps; x.proxyOp.chunkSize = chunk;                      \
            x.proxyOp.isSend = is_send;                                                  \
        } else if (type == P_PROXY_STEP) {                                               \
            x.proxyStep.step = step;                                                     \
        } else if (type == P_KERNEL_CH) {                                                \
            x.kernelCh.channelId = (uint8_t)ch; x.kernelCh.pTimer = timer;               \
        } else {                                                                         \
            x.netPlugin.id = (1 << 16) | 1; x.netPlugin.data = NULL;                     \
        }
        if (plug_version == 4) { SD_FILL(d.v4) }
        else { SD_FILL(d.v7) }
#undef SD_FILL
    }
    plug->startEvent(c->prof_ctx, &h, &d);
    return h;
}

static void proxy_one(const pwork *w)
{
    standin_comm *c = w->c;
    int mask = c->prof_mask;
    int64_t k0 = w->t_stop + SD_FAKE_LAUNCH_NS, k1 = k0 + SD_FAKE_KERNEL_NS(w->bytes);
    void *kch[SD_CHANNELS] = {0};
    int kernel = plug_version >= 4 && (mask & P_KERNEL_CH);
    if (kernel) {
        wait_until(k0);
        for (int ch = 0; ch < SD_CHANNELS; ch++)
            kch[ch] = sd_child(c, P_KERNEL_CH, w->coll, ch, 0, 0, 0, 0,
                               (uint64_t)k0 + SD_FAKE_EPOCH);
    }
    if (mask & P_PROXY_OP) {
        for (int ch = 0; ch < SD_CHANNELS; ch++) {
            size_t per_ch = w->bytes / SD_CHANNELS + (ch == SD_CHANNELS - 1 ? w->bytes % SD_CHANNELS : 0);
            size_t per_step = per_ch / SD_STEPS;
            for (int is_send = 1; is_send >= 0; is_send--) {
                void *op = sd_child(c, P_PROXY_OP, w->coll, ch, is_send, 0, SD_STEPS,
                                    (int)per_step, 0);
                size_t sofar = 0;
                for (int i = 0; i < SD_STEPS; i++) {
                    size_t b = per_step + (i == SD_STEPS - 1 ? per_ch % SD_STEPS : 0);
                    sofar += b;
                    void *st = (mask & P_PROXY_STEP)
                                   ? sd_child(c, P_PROXY_STEP, op, ch, is_send, i, SD_STEPS,
                                              (int)per_step, 0)
                                   : NULL;
                    if (plug_version >= 4) {
                        sd_state(st, is_send ? 9 : 10, b, 0, 0); /* Send/RecvWait */
                        if (st && (mask & P_NET_PLUGIN)) {
                            void *nh = sd_child(c, P_NET_PLUGIN, st, ch, is_send, i, 0, 0, 0);
                            if (nh) plug->stopEvent(nh);
                        }
                    } else {
                        sd_state(op, is_send ? 2 : 5, sofar, i + 1, 0); /* Transmitted / Received */
                    }
                    if (st) plug->stopEvent(st);
                }
                if (plug_version < 4) sd_state(op, is_send ? 3 : 7, sofar, SD_STEPS, 0); /* Done */
                if (op) plug->stopEvent(op);
            }
        }
    }
    if (kernel) {
        wait_until(k1);
        for (int ch = 0; ch < SD_CHANNELS; ch++) {
            if (!kch[ch]) continue;
            sd_state(kch[ch], 22 /* KernelChStop */, 0, 0, (uint64_t)k1 + SD_FAKE_EPOCH);
            plug->stopEvent(kch[ch]);
        }
    }
}

static void *proxy_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pq_lock);
    for (;;) {
        while (pq_head == pq_tail) pthread_cond_wait(&pq_cond, &pq_lock);
        pwork w = pq[pq_head % 1024];
        pq_busy = 1;
        pq_head++;
        pthread_mutex_unlock(&pq_lock);
        proxy_one(&w);
        pthread_mutex_lock(&pq_lock);
        pq_busy = 0;
        if (pq_head == pq_tail) pthread_cond_broadcast(&pq_idle);
    }
    return NULL;
}

/* After a Coll event stopped: its proxy and kernel events, on the proxy thread. */
static void proxy_post(standin_comm *c, void *coll, size_t bytes)
{
    if (proxy_on < 0) {
        const char *v = getenv("STANDIN_NCCL_PROXY");
        proxy_on = v && strcmp(v, "1") == 0;
    }
    if (!proxy_on || !plug || !coll || !bytes || !(c->prof_mask & (P_PROXY_OP | P_KERNEL_CH)))
        return;
    pthread_mutex_lock(&pq_lock);
    if (!pq_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, proxy_main, NULL) == 0) {
            pthread_detach(t);
            pq_started = 1;
        }
    }
    while (pq_tail - pq_head >= 1024) pthread_cond_wait(&pq_idle, &pq_lock);
    pq[pq_tail % 1024] = (pwork){c, coll, bytes, mono_ns()};
    pq_tail++;
    pthread_cond_signal(&pq_cond);
    pthread_mutex_unlock(&pq_lock);
}

/* Before a communicator's finalize: its proxy work is done. */
static void proxy_drain(void)
{
    pthread_mutex_lock(&pq_lock);
    while (pq_started && (pq_head != pq_tail || pq_busy)) pthread_cond_wait(&pq_idle, &pq_lock);
    pthread_mutex_unlock(&pq_lock);
}

/* ---- stand-in controls for the plugin (not NCCL API) --------------------- */
API int standin_nccl_profiler_version(void) { return plug ? plug_version : 0; }
API const char *standin_nccl_profiler_path(void) { return plug_path; }

static _Atomic int delay_override = -1;
static _Atomic uint64_t n_calls, n_group_launches;

typedef struct item {
    cudaStream_t stream;
    int64_t dur_ns;
    callinfo ci;
} item;

static __thread int group_depth;
static __thread item queued[256];
static __thread int n_queued;

static int64_t delay_ns(void)
{
    int d = atomic_load(&delay_override);
    if (d < 0) {
        const char *v = getenv("STANDIN_NCCL_DELAY_US");
        d = v && *v ? atoi(v) : 0;
    }
    return (int64_t)d * 1000;
}

static void launch(cudaStream_t s, int64_t dur)
{
    static int64_t (*enqueue)(cudaStream_t, int64_t);
    static int looked;
    if (!looked) {
        void *p = dlsym(RTLD_DEFAULT, "standin_stream_enqueue");
        memcpy(&enqueue, &p, sizeof p);
        looked = 1;
    }
    if (enqueue) enqueue(s, dur);
}

/* STANDIN_NCCL_NEVER_COMPLETES=N: the N-th collective (from 1) never returns
 * to its caller, as a blocking NCCL whose peer never comes (a hang). */
static void maybe_never_complete(unsigned long n)
{
    static long at = -2;
    if (at == -2) {
        const char *v = getenv("STANDIN_NCCL_NEVER_COMPLETES");
        at = v && *v ? atol(v) : -1;
    }
    if (at > 0 && (long)n == at)
        for (;;) pause();
}

static ncclResult_t work(const callinfo *ci, cudaStream_t s)
{
    ncclComm_t comm = ci->comm;
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    if (ci->dt < 0 || ci->dt >= 12) return ncclInvalidArgument;
    maybe_never_complete((unsigned long)atomic_fetch_add(&n_calls, 1) + 1);
    if (group_depth > 0) {
        if (n_queued < 256) queued[n_queued++] = (item){s, delay_ns(), *ci};
    } else { /* a group of its own, as NCCL runs every call */
        void *g = prof_group_start(comm);
        void *h = prof_call_start(ci, g);
        launch(s, delay_ns());
        prof_stop(h);
        prof_stop(g);
        if (ci->func != 6 && ci->func != 7) proxy_post(comm, h, ci->count * TYPE_SIZE[ci->dt]);
    }
    return ncclSuccess;
}

#define CALL(F, SEND, RECV, COUNT, DT, OP, ROOT)                                     \
    callinfo ci_ = {comm, F, SEND, RECV, COUNT, DT, OP, ROOT};                       \
    ncclResult_t rc = work(&ci_, stream)

API ncclResult_t ncclGetVersion(int *v)
{
    *v = 22105; /* pretends to be 2.21.5 */
    return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error (stand-in)" : "error (stand-in)";
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "standin-%d-%ld", (int)getpid(), (long)random());
    return ncclSuccess;
}

static ncclResult_t make_comm(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                              int device, uint64_t hash)
{
    if (!out || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    standin_comm *c = calloc(1, sizeof *c);
    c->magic = COMM_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->device = device;
    if (id) c->id = *id;
    c->hash = id ? fnv(id, sizeof *id, 0xcbf29ce484222325ull) : hash;
    plugin_comm_init(c);
    *out = c;
    return ncclSuccess;
}

static int current_device(void)
{
    static int (*get)(int *);
    void *p = dlsym(RTLD_DEFAULT, "cudaGetDevice");
    memcpy(&get, &p, sizeof p);
    int d = 0;
    if (get) get(&d);
    return d;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return make_comm(comm, nranks, &id, rank, current_device(), 0);
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                        ncclConfig_t *config)
{
    (void)config;
    return make_comm(comm, nranks, &id, rank, current_device(), 0);
}

API ncclResult_t ncclGroupStart(void);
API ncclResult_t ncclGroupEnd(void);

API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1) return ncclInvalidArgument;
    static _Atomic uint64_t n_all;
    uint64_t h = fnv("all", 3, 0xcbf29ce484222325ull + (uint64_t)getpid() * 31 +
                                   atomic_fetch_add(&n_all, 1));
    ncclGroupStart(); /* through the exported symbol, as NCCL does */
    for (int i = 0; i < ndev; i++)
        make_comm(&comms[i], ndev, NULL, i, devlist ? devlist[i] : i, h);
    return ncclGroupEnd();
}

API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               ncclConfig_t *config)
{
    (void)key;
    (void)config;
    if (!comm || comm->magic != COMM_MAGIC || !newcomm) return ncclInvalidArgument;
    if (color == -1) { /* NCCL_SPLIT_NOCOLOR */
        *newcomm = NULL;
        return ncclSuccess;
    }
    uint64_t h = fnv(&color, sizeof color, comm->hash ^ 0x73706c6974ull);
    return make_comm(newcomm, 1, NULL, 0, comm->device, h);
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    plugin_comm_fini(comm);
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

API ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    CALL(4, s, r, count, dt, op, 0);
    if (rc == ncclSuccess && s != r) memmove(r, s, count * TYPE_SIZE[dt]);
    return rc;
}

API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t dt,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    CALL(3, s, r, recvcount, dt, op, 0);
    if (rc == ncclSuccess) {
        size_t blk = recvcount * TYPE_SIZE[dt];
        const char *src = (const char *)s + (size_t)comm->rank * blk;
        if (src != r) memmove(r, src, blk);
    }
    return rc;
}

API ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t dt,
                               ncclComm_t comm, cudaStream_t stream)
{
    CALL(2, s, r, sendcount, dt, 0, 0);
    if (rc == ncclSuccess) {
        size_t blk = sendcount * TYPE_SIZE[dt];
        for (int i = 0; i < comm->nranks; i++) {
            char *dst = (char *)r + (size_t)i * blk;
            if (dst != s) memmove(dst, s, blk);
        }
    }
    return rc;
}

API ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t dt, int root,
                               ncclComm_t comm, cudaStream_t stream)
{
    CALL(0, s, r, count, dt, 0, root);
    if (rc == ncclSuccess && root == comm->rank && s != r) memmove(r, s, count * TYPE_SIZE[dt]);
    return rc;
}

API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, dt, root, comm, stream); /* exported symbol */
}

API ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
                            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    CALL(1, s, r, count, dt, op, root);
    if (rc == ncclSuccess && root == comm->rank && s != r) memmove(r, s, count * TYPE_SIZE[dt]);
    return rc;
}

API ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t dt, int peer,
                          ncclComm_t comm, cudaStream_t stream)
{
    CALL(6, s, NULL, count, dt, 0, peer);
    return rc;
}

API ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                          cudaStream_t stream)
{
    CALL(7, NULL, r, count, dt, 0, peer);
    return rc;
}

API ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth == 0) {
        /* one Group event per communicator, in the order of first use */
        for (int i = 0; i < n_queued; i++) {
            standin_comm *c = queued[i].ci.comm;
            int first = 1;
            for (int j = 0; j < i; j++)
                if (queued[j].ci.comm == c) first = 0;
            if (!first) continue;
            void *g = prof_group_start(c);
            for (int j = i; j < n_queued; j++) {
                if (queued[j].ci.comm != c) continue;
                void *h = prof_call_start(&queued[j].ci, g);
                launch(queued[j].stream, queued[j].dur_ns);
                prof_stop(h);
                const callinfo *q = &queued[j].ci;
                if (q->func != 6 && q->func != 7) proxy_post(c, h, q->count * TYPE_SIZE[q->dt]);
            }
            prof_stop(g);
        }
        if (n_queued) atomic_fetch_add(&n_group_launches, 1);
        n_queued = 0;
    }
    return ncclSuccess;
}

/* ---- stand-in controls and counters (not NCCL API) ---------------------- */
API void standin_nccl_set_delay_us(int us) { atomic_store(&delay_override, us); }
API uint64_t standin_nccl_calls(void) { return atomic_load(&n_calls); }
API uint64_t standin_nccl_group_launches(void) { return atomic_load(&n_group_launches); }
