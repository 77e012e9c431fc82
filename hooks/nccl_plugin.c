/*
 * nccl_plugin.c -- NCCL's profiler-plugin interface (NCCL >= 2.23).
 *
 * NCCL dlopens a profiler plugin (NCCL_PROFILER_PLUGIN: a name or a path;
 * default libnccl-profiler.so) and looks up a versioned struct of functions,
 * newest version first: ncclProfiler_v7 ... ncclProfiler_v1.  This library
 * exports all seven, so NCCL negotiates its own newest; profiler.collect.
 * activate points NCCL_PROFILER_PLUGIN at this library.  The path works
 * whether NCCL is linked statically (Horovod's default) or dynamically.
 *
 * NCCL's side of the interface, its versioned structs: nccl_profiler_abi.h;
 * the seven versions' entry points, which normalize each version's
 * descriptor and call the events here: nccl_plugin_versions.c; what the two
 * files share: nccl_plugin_internal.h.
 *
 * Events used (the activation mask): Group, Coll, P2p; and, unless
 * HOROVOD_PROFILE_NCCL_PROXY=0, the children of a call where the version has
 * them (child_mask): ProxyOp and ProxyStep (v1 on), NetPlugin (v3 on, counted
 * only), KernelCh with its GPU timers (v4 on).  Children are never a row
 * each: they are summed into their call's event object (objects from the
 * per-thread pool, no allocation per step once the pool is warm) and written
 * when the call is done as two records keyed by the call's comm and seq: one
 * NCCL_NET record (hvprof_format.h: bytes sent / received, steps, ops, the
 * proxy activity's interval) and, from the KernelCh timers, one DEVICE copy
 * of the call's record (the format's DEVICE semantics, as cuda_rt.c writes
 * them).  Before v4 no kernel timer exists: device time then comes only from
 * the wrappers' CUDA events (shared NCCL); the metadata says which
 * ("device_time").  A call whose record a wrapper wrote (shared NCCL, both
 * paths) has no handle here, so its children are counted as orphans.
 *
 * Records, in the format of nccl.c's rows:
 *   - one host record per Coll / P2p event: op from the descriptor's func
 *     (ncclBcast reaches NCCL's core as a Broadcast: nccl_broadcast here),
 *     count, bytes = count x datatype size (ReduceScatter: x nranks where
 *     init gave nranks), dtype, redop (v1 only: later descriptors carry no
 *     reduction operator, redop "none"), root (Broadcast/Reduce) or peer,
 *     comm = the communicator's table entry (id = NCCL's commHash / commId,
 *     equal on every rank), seq = per-communicator call number, t_start ->
 *     t_end = startEvent -> stopEvent on the host;
 *   - NCCL wraps every call in a Group event, per communicator.  A group with
 *     two calls or more is one NCCL_GROUP record (t_start = its first call's
 *     start, t_end = the Group event's stop; count = calls, bytes =
 *     their sum, seq = aux = group number) and its calls carry GROUPED and
 *     aux = group number; a group of one call records the call alone (as the
 *     wrappers do outside ncclGroupStart/End); empty groups are counted.
 *
 * Seen by both paths (shared NCCL, wrappers active): the wrapper records the
 * call; events raised while a wrapper is inside the real NCCL call on the
 * same thread are counted as "silent" and get no handle (NCCL then sends no
 * stop for them).  hvprof_nccl_json says which path saw NCCL, which recorded,
 * and the negotiated interface version.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <unistd.h>

#include "hvprof_internal.h"
#include "nccl_common.h"
#include "nccl_plugin_internal.h"

/* ------------------------------------------------------------------------ */
/* State.                                                                    */

#define CTX_MAGIC 0x68767063u /* "hvpc" */
#define EV_MAGIC 0x68767065u  /* "hvpe" */

typedef struct pev pev;

/* Finished calls wait in their communicator's ring before their network and
 * kernel activity is summed up and written: NCCL stops a Coll event when the
 * call is enqueued (hostStreamPlanTask: after ncclProxyStart), and its proxy
 * thread starts the call's ProxyOp and KernelCh events later.  A call leaves
 * the ring RING calls later, at finalize, or at exit (plugin_flush, from
 * hvprof_nccl_finish); a child still in progress then finishes it at its own stop. */
#define RING 64u

typedef struct pctx {
    uint32_t magic;
    int version;
    int nranks;         /* -1: not given (v1-v3) */
    int rank;
    int mask;           /* the activation mask given to NCCL */
    uint64_t id;        /* commHash / commId; 0 until known (v1-v3: first event) */
    _Atomic uint32_t comm_idx; /* UINT32_MAX until registered */
    _Atomic uint32_t ring_next;
    _Atomic(pev *) ring[RING];
} pctx;

enum { K_GROUP = 1, K_CALL, K_POP, K_STEP, K_KCH };
static void live_add(pctx *c);

struct pev {
    uint32_t magic;
    uint8_t kind;
    uint8_t is_send;        /* K_POP, K_STEP */
    uint8_t has_stop;       /* K_KCH: a stop timer came */
    uint8_t version;        /* a call: its context's interface version (the
                               context may be gone when a late child stops) */
    pev *next_free;
    pev *group;             /* a call: its group event, or NULL */
    pev *call;              /* a child: the call it belongs to */
    pctx *ctx;
    hvprof_record rec;      /* a call: the record, t_end at stop */
    /* a group: */
    uint32_t calls;
    uint32_t gno;
    uint64_t bytes;
    hvprof_record held;     /* its first call, until a second one comes */
    /* a child: */
    uint64_t t0;            /* K_POP / K_STEP: host ticks at start; K_KCH: start timer */
    uint64_t t1;            /* K_KCH: stop timer */
    uint64_t trans;         /* bytes (v1-v3 op: so far; v4 on step: this step's) */
    /* a call: what its children said (the proxy thread adds, atomically) */
    _Atomic uint32_t refs;  /* the call's own until stop, the ring's, each child's */
    _Atomic uint32_t n_ops, n_steps, n_net, n_kch;
    _Atomic uint64_t send_bytes, recv_bytes;
    _Atomic uint64_t net_t0, net_t1; /* host ticks: first child start, last child stop */
    _Atomic uint64_t k_t0, k_t1;     /* GPU timer: first channel start, last channel stop */
};

static _Atomic int negotiated;          /* version of the first init */
static _Atomic uint64_t p_inits, p_finals, p_silent, p_events, p_unknown,
    p_empty_groups, p_single_groups, p_not_recording;
/* Communicators of one rank: NCCL (2.19 on, so every NCCL with this interface)
 * runs their collectives as a local copy (ncclLaunchOneRank) before any
 * profiler event, so this path never sees them; counted so that a profile
 * with no event can say why. */
static _Atomic uint64_t p_one_rank;
static _Atomic uint64_t p_children, p_orphans, p_remote, p_net_records, p_dev_records,
    p_ring_flushed;
static _Atomic uint32_t p_group_counter;
static _Atomic int pinned;
static _Atomic int proxy_off = -1;      /* HOROVOD_PROFILE_NCCL_PROXY=0 */
static pid_t my_pid;

/* Event objects: a per-thread free list, refilled in blocks (never freed:
 * bounded by the events in flight at once, and RING per communicator).  A
 * call finished on another thread (the proxy thread's last child, the exit
 * flush) goes back through a global stack, which an empty free list takes
 * whole before allocating: no object migrates for good. */
static __thread pev *free_list TLS_IE;
static _Atomic(pev *) returned;

static pev *ev_alloc(void)
{
    pev *e = free_list;
    if (HVPROF_LIKELY(e)) {
        free_list = e->next_free;
        return e;
    }
    e = atomic_exchange_explicit(&returned, NULL, memory_order_acquire);
    if (e) {
        free_list = e->next_free;
        return e;
    }
    enum { BLOCK = 64 };
    pev *b = calloc(BLOCK, sizeof *b);
    if (!b) return NULL;
    for (int i = 1; i < BLOCK - 1; i++) b[i].next_free = &b[i + 1];
    b[BLOCK - 1].next_free = NULL;
    free_list = BLOCK > 1 ? &b[1] : NULL;
    return &b[0];
}

static inline void ev_free(pev *e)
{
    e->magic = 0;
    e->next_free = free_list;
    free_list = e;
}

/* Push-only, taken whole: no ABA. */
static void ev_return(pev *e)
{
    e->magic = 0;
    pev *h = atomic_load_explicit(&returned, memory_order_relaxed);
    do {
        e->next_free = h;
    } while (!atomic_compare_exchange_weak_explicit(&returned, &h, e, memory_order_release,
                                                    memory_order_relaxed));
}

/* NCCL dlcloses its plugin when its last communicator is gone; this library
 * also holds the raw file and exit handlers: keep it loaded. */
static void pin_self(void)
{
    if (atomic_exchange(&pinned, 1)) return;
    Dl_info info;
    if (dladdr((void *)&pin_self, &info) && info.dli_fname)
        (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

static int proxy_wanted(void)
{
    int v = atomic_load_explicit(&proxy_off, memory_order_relaxed);
    if (v < 0) {
        v = !hvprof_setting_int(HVS_NCCL_PROXY);
        atomic_store(&proxy_off, v);
        my_pid = getpid();
    }
    return !v;
}

ncclResult_t ctx_new(void **context, int version, uint64_t id, int nranks, int rank,
                     int *mask)
{
    pin_self();
    int expect = 0;
    atomic_compare_exchange_strong(&negotiated, &expect, version);
    atomic_fetch_add(&p_inits, 1);
    if (nranks == 1) atomic_fetch_add(&p_one_rank, 1);
    int m = CALL_MASK | (proxy_wanted() ? child_mask(version) : 0);
    if (mask) *mask = m;
    pctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (context) *context = NULL;
        if (mask) *mask = 0;
        return NCCL_OK; /* never fail NCCL's communicator creation */
    }
    c->magic = CTX_MAGIC;
    c->version = version;
    c->nranks = nranks;
    c->rank = rank;
    c->mask = m;
    c->id = id;
    atomic_store(&c->comm_idx, UINT32_MAX);
    live_add(c);
    if (context) *context = c;
    (void)hvprof_nccl_recording(); /* a process without MPI opens its file here */
    return NCCL_OK;
}

/* The communicator's table index (registered at its first recorded event). */
static inline uint32_t ctx_comm(pctx *c, uint64_t hash, int rank)
{
    uint32_t idx = atomic_load_explicit(&c->comm_idx, memory_order_relaxed);
    if (HVPROF_LIKELY(idx != UINT32_MAX)) return idx;
    if (!c->id) c->id = hash;
    if (c->rank < 0) c->rank = rank;
    /* the handle is this context, never an ncclComm_t: no device is known */
    idx = hvprof_nccl_comm_register((uint64_t)(uintptr_t)c, c->id, c->nranks, c->rank, -1);
    atomic_store_explicit(&c->comm_idx, idx, memory_order_relaxed);
    return idx;
}

#define BUMP(c) atomic_store_explicit(&(c), atomic_load_explicit(&(c), memory_order_relaxed) + 1, \
                                      memory_order_relaxed)

/* Every record of this path: counted exactly in the shared per-op counters
 * (hvprof_nccl_calls); this path's records = those less the wrappers'
 * (hvprof_nccl_json passes them to plugin_json). */
static inline void emit(hvprof_record *r)
{
    if (hvprof_emit(r) == 0) hvprof_nccl_count(r->op);
}

static inline void atomic_min64(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v < cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

static inline void atomic_max64(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

/* ---- GPU timer -> host ticks ---------------------------------------------
 * KernelCh timers (v4 on) are the GPU's globaltimer, in ns, on the device's
 * own epoch.  The proxy thread reports a channel's start and stop after the
 * kernel wrote them, so host_ticks(report) - timer is at least the true
 * offset; the smallest such difference seen so far (one per process) maps a
 * timer onto the host axis.  Error: the smallest report delay (the proxy
 * thread's polling), always late, never early.  Timers are taken relative to
 * the first one seen so the double conversion stays exact. */
static _Atomic uint64_t kt_base;           /* first timer seen (0: none yet) */
static _Atomic int64_t kt_off = INT64_MAX; /* min over reports of host ticks - scaled timer */

static double plugin_tpn(void)
{
    hvprof_file_header *h = hvprof_header();
    return (h && h->ticks_per_ns > 0) ? h->ticks_per_ns : 1.0;
}

static inline int64_t kt_scaled(uint64_t timer)
{
    uint64_t base = atomic_load_explicit(&kt_base, memory_order_relaxed);
    if (HVPROF_UNLIKELY(!base)) {
        uint64_t want = timer ? timer : 1;
        if (atomic_compare_exchange_strong(&kt_base, &base, want)) base = want;
    }
    double d = (double)(int64_t)(timer - base) * plugin_tpn();
    return (int64_t)(d >= 0 ? d + 0.5 : d - 0.5);
}

static inline void kt_observe(uint64_t timer, uint64_t host_ticks)
{
    int64_t diff = (int64_t)host_ticks - kt_scaled(timer);
    int64_t cur = atomic_load_explicit(&kt_off, memory_order_relaxed);
    while (diff < cur && !atomic_compare_exchange_weak_explicit(&kt_off, &cur, diff,
                                                                memory_order_relaxed,
                                                                memory_order_relaxed)) {
    }
}

/* A finished call: its network aggregate (op NCCL_NET) and its device
 * interval (a DEVICE copy of its record), when its children gave them. */
static void call_finish(pev *e)
{
    uint32_t ops = atomic_load(&e->n_ops), steps = atomic_load(&e->n_steps);
    if (ops || steps) {
        uint64_t t0 = atomic_load(&e->net_t0), t1 = atomic_load(&e->net_t1);
        hvprof_record r = {
            .t_start = t0 == UINT64_MAX ? e->rec.t_end : t0,
            .t_end = t1 ? t1 : e->rec.t_end,
            .bytes = atomic_load(&e->send_bytes),
            .count = atomic_load(&e->recv_bytes),
            .seq = e->rec.seq,
            .comm = e->rec.comm,
            .track = HVPROF_TRACK_SELF,
            .root = (int32_t)steps,
            .op = HVPROF_OP_NCCL_NET,
            .dtype = HVPROF_DT_UNKNOWN,
            .redop = HVPROF_REDOP_NONE,
            .dtype_size = ops,
            .aux = atomic_load(&e->n_net),
        };
        if (hvprof_emit(&r) == 0) BUMP(p_net_records);
    }
    uint64_t k0 = atomic_load(&e->k_t0), k1 = atomic_load(&e->k_t1);
    int64_t off = atomic_load(&kt_off);
    if (atomic_load(&e->n_kch) && k0 != UINT64_MAX && k1 >= k0 && off != INT64_MAX) {
        hvprof_record r = e->rec;
        int64_t s = kt_scaled(k0) + off, d = kt_scaled(k1) - kt_scaled(k0);
        r.t_start = (uint64_t)s;
        r.t_end = (uint64_t)(s + (d > 0 ? d : 0));
        r.flags = (uint16_t)((r.flags & ~HVPROF_FLAG_DEVICE_PENDING) | HVPROF_FLAG_DEVICE);
        r.aux = e->rec.track; /* the host record's track, as the CUDA-event path */
        r.track = hvprof_track_stream((uint64_t)(uintptr_t)e->ctx | 1u, -1);
        if (hvprof_emit(&r) == 0) BUMP(p_dev_records);
    }
}

/* Drop one reference to a call; the last one writes what its children said
 * and frees it (local: on the thread that made it, else the global stack). */
static void call_release(pev *e, int local)
{
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1) return;
    call_finish(e);
    if (local) ev_free(e);
    else ev_return(e);
}

/* A stopped call enters its communicator's ring; the one it displaces (RING
 * calls older) loses the ring's reference. */
static void call_park(pev *e)
{
    pctx *c = e->ctx;
    uint32_t i = atomic_fetch_add_explicit(&c->ring_next, 1, memory_order_relaxed) % RING;
    pev *old = atomic_exchange_explicit(&c->ring[i], e, memory_order_acq_rel);
    if (old) call_release(old, 1);
}

static void ring_flush(pctx *c)
{
    for (uint32_t i = 0; i < RING; i++) {
        pev *old = atomic_exchange_explicit(&c->ring[i], NULL, memory_order_acq_rel);
        if (old) {
            call_release(old, 0);
            BUMP(p_ring_flushed);
        }
    }
}

/* Live contexts, for the exit flush (a process may exit without destroying
 * its communicators: torch does). */
#define MAX_CTX 256
static _Atomic(pctx *) live[MAX_CTX];

static void live_add(pctx *c)
{
    for (int i = 0; i < MAX_CTX; i++) {
        pctx *expect = NULL;
        if (atomic_compare_exchange_strong(&live[i], &expect, c)) return;
    }
}

static void live_remove(pctx *c)
{
    for (int i = 0; i < MAX_CTX; i++) {
        pctx *expect = c;
        if (atomic_compare_exchange_strong(&live[i], &expect, NULL)) return;
    }
}

static void plugin_flush(void)
{
    for (int i = 0; i < MAX_CTX; i++) {
        pctx *c = atomic_load(&live[i]);
        if (c && c->magic == CTX_MAGIC) ring_flush(c);
    }
}

/* ProxyOp / ProxyStep / KernelCh / NetPlugin: summed into their call. */
static ncclResult_t start_child(void **eHandle, const norm *n)
{
    pev *p = n->parent;
    BUMP(p_children);
    if (HVPROF_UNLIKELY(!p || p->magic != EV_MAGIC)) {
        BUMP(p_orphans); /* the call was not recorded here (wrapper, not recording) */
        return NCCL_OK;
    }
    pev *call;
    uint8_t is_send = 0;
    if (n->type == EV_PROXY_OP) {
        if (HVPROF_UNLIKELY(n->pid != my_pid)) { /* PXN: not our address space */
            BUMP(p_remote);
            return NCCL_OK;
        }
        if (p->kind != K_CALL) goto orphan;
        call = p;
        is_send = n->is_send != 0;
    } else if (n->type == EV_PROXY_STEP) {
        if (p->kind != K_POP) goto orphan;
        call = p->call;
        is_send = p->is_send;
    } else if (n->type == EV_NET_PLUGIN) {
        if (p->kind != K_STEP) goto orphan;
        atomic_fetch_add_explicit(&p->call->n_net, 1, memory_order_relaxed);
        return NCCL_OK; /* counted; the plugin-defined payload is not read */
    } else if (n->type == EV_KERNEL_CH) {
        if (p->kind != K_CALL) goto orphan;
        call = p;
    } else {
        atomic_fetch_add_explicit(&p_unknown, 1, memory_order_relaxed);
        return NCCL_OK;
    }
    pev *e = ev_alloc();
    if (!e) return NCCL_OK;
    atomic_fetch_add_explicit(&call->refs, 1, memory_order_relaxed);
    e->magic = EV_MAGIC;
    e->kind = n->type == EV_PROXY_OP ? K_POP : n->type == EV_PROXY_STEP ? K_STEP : K_KCH;
    e->is_send = is_send;
    e->has_stop = 0;
    e->call = call;
    e->trans = 0;
    e->t1 = 0;
    if (e->kind == K_KCH) {
        e->t0 = n->ptimer;
        if (n->ptimer) kt_observe(n->ptimer, hvprof_ticks());
    } else {
        e->t0 = hvprof_ticks();
    }
    *eHandle = e;
    return NCCL_OK;
orphan:
    BUMP(p_orphans);
    return NCCL_OK;
}

static void stop_child(pev *e)
{
    pev *call = e->call;
    if (e->kind == K_KCH) {
        if (e->t0 && e->has_stop) {
            atomic_min64(&call->k_t0, e->t0);
            atomic_max64(&call->k_t1, e->t1);
            atomic_fetch_add_explicit(&call->n_kch, 1, memory_order_relaxed);
        }
    } else {
        uint64_t now = hvprof_ticks();
        atomic_min64(&call->net_t0, e->t0);
        atomic_max64(&call->net_t1, now);
        /* bytes: v1-v3 from the op (so far = all, at its stop); v4 on from
         * the steps (their ops' state arguments are deprecated) */
        int from_op = call->version < 4;
        if (e->kind == K_POP) {
            atomic_fetch_add_explicit(&call->n_ops, 1, memory_order_relaxed);
        } else {
            atomic_fetch_add_explicit(&call->n_steps, 1, memory_order_relaxed);
        }
        if ((e->kind == K_POP) == from_op && e->trans)
            atomic_fetch_add_explicit(e->is_send ? &call->send_bytes : &call->recv_bytes,
                                      e->trans, memory_order_relaxed);
    }
    call_release(call, 0);
    ev_free(e);
}

ncclResult_t start_common(void *context, void **eHandle, const norm *n)
{
    *eHandle = NULL;
    BUMP(p_events);
    pctx *c = context;
    if (HVPROF_UNLIKELY(!c || c->magic != CTX_MAGIC)) return NCCL_OK;
    if (n->type & (EV_PROXY_OP | EV_PROXY_STEP | EV_KERNEL_CH | EV_NET_PLUGIN))
        return start_child(eHandle, n);
    if (hvprof_nccl_in_wrapper()) { /* the wrapper records this call */
        BUMP(p_silent);
        return NCCL_OK;
    }
    if (HVPROF_UNLIKELY(!hvprof_nccl_recording())) {
        atomic_fetch_add_explicit(&p_not_recording, 1, memory_order_relaxed);
        return NCCL_OK;
    }
    if (n->type == EV_GROUP) {
        pev *e = ev_alloc();
        if (!e) return NCCL_OK;
        e->magic = EV_MAGIC;
        e->kind = K_GROUP;
        e->ctx = c;
        e->group = NULL;
        e->calls = 0;
        e->gno = 0;
        e->bytes = 0;
        e->rec.t_start = 0; /* its first call's start: no clock read for a group */
        *eHandle = e;
        return NCCL_OK;
    }
    if (n->type != EV_COLL && n->type != EV_P2P) {
        atomic_fetch_add_explicit(&p_unknown, 1, memory_order_relaxed);
        return NCCL_OK;
    }
    pev *e = ev_alloc();
    if (!e) return NCCL_OK;
    e->magic = EV_MAGIC;
    e->kind = K_CALL;
    e->ctx = c;
    e->version = (uint8_t)c->version;
    pev *g = n->group;
    e->group = (g && g->magic == EV_MAGIC && g->kind == K_GROUP) ? g : NULL;
    if (c->mask & EV_PROXY_OP) { /* children may come: the call lives on in the ring */
        atomic_store_explicit(&e->refs, 2, memory_order_relaxed); /* its own + the ring's */
        atomic_store_explicit(&e->n_ops, 0, memory_order_relaxed);
        atomic_store_explicit(&e->n_steps, 0, memory_order_relaxed);
        atomic_store_explicit(&e->n_net, 0, memory_order_relaxed);
        atomic_store_explicit(&e->n_kch, 0, memory_order_relaxed);
        atomic_store_explicit(&e->send_bytes, 0, memory_order_relaxed);
        atomic_store_explicit(&e->recv_bytes, 0, memory_order_relaxed);
        atomic_store_explicit(&e->net_t0, UINT64_MAX, memory_order_relaxed);
        atomic_store_explicit(&e->net_t1, 0, memory_order_relaxed);
        atomic_store_explicit(&e->k_t0, UINT64_MAX, memory_order_relaxed);
        atomic_store_explicit(&e->k_t1, 0, memory_order_relaxed);
    } else {
        atomic_store_explicit(&e->refs, 0, memory_order_relaxed);
    }
    uint16_t op = n->func >= 0 ? FUNCS[n->func].op : HVPROF_OP_NCCL_ALLREDUCE;
    uint8_t code = HVPROF_DT_UNKNOWN, size = 0;
    if (n->dtype >= 0) {
        code = hvprof_nccl_dtypes[n->dtype].code;
        size = hvprof_nccl_dtypes[n->dtype].size;
    }
    uint32_t comm = ctx_comm(c, n->hash, n->rank);
    uint64_t count = n->count;
    if (op == HVPROF_OP_NCCL_REDUCESCATTER && c->nranks > 0) count *= (uint64_t)c->nranks;
    int has_root = op == HVPROF_OP_NCCL_BROADCAST || op == HVPROF_OP_NCCL_REDUCE ||
                   op == HVPROF_OP_NCCL_SEND || op == HVPROF_OP_NCCL_RECV;
    int has_redop = op == HVPROF_OP_NCCL_ALLREDUCE || op == HVPROF_OP_NCCL_REDUCE ||
                    op == HVPROF_OP_NCCL_REDUCESCATTER;
    e->rec = (hvprof_record){
        .bytes = count * size,
        .count = count,
        .comm = comm,
        .track = HVPROF_TRACK_SELF,
        .root = has_root ? n->root : -1,
        .op = op,
        .dtype = code,
        .redop = has_redop ? n->redop : HVPROF_REDOP_NONE,
        .flags = n->in_place ? HVPROF_FLAG_IN_PLACE : 0,
        .dtype_size = size,
    };
    *eHandle = e;
    e->rec.t_start = hvprof_ticks();
    return NCCL_OK;
}

/* A call's end: free it, or (children may come) park it in the ring. */
static inline void call_done(pev *e)
{
    if (atomic_load_explicit(&e->refs, memory_order_relaxed) == 0) {
        ev_free(e);
        return;
    }
    /* the DEVICE copy names the host record's track (a single-call group's
     * record was written from the group's copy: resolve it here) */
    if (e->rec.track == HVPROF_TRACK_SELF) e->rec.track = hvprof_track_self();
    call_park(e);
    call_release(e, 1); /* its own reference */
}

ncclResult_t stop_event(void *eHandle)
{
    pev *e = eHandle;
    if (HVPROF_UNLIKELY(!e || e->magic != EV_MAGIC)) return NCCL_OK;
    if (e->kind == K_POP || e->kind == K_STEP || e->kind == K_KCH) {
        stop_child(e);
        return NCCL_OK;
    }
    if (e->kind == K_CALL) {
        e->rec.t_end = hvprof_ticks();
        e->rec.seq = hvprof_comm_next_seq(e->rec.comm);
        pev *g = e->group;
        if (g && g->magic == EV_MAGIC) {
            g->bytes += e->rec.bytes;
            if (g->calls == 0) {
                g->held = e->rec; /* alone so far: not known to be grouped */
                g->rec.comm = e->rec.comm;
                g->rec.t_start = e->rec.t_start;
            } else {
                if (g->calls == 1) {
                    g->gno = atomic_fetch_add(&p_group_counter, 1) + 1;
                    g->held.flags |= HVPROF_FLAG_GROUPED;
                    g->held.aux = g->gno;
                    emit(&g->held);
                }
                e->rec.flags |= HVPROF_FLAG_GROUPED;
                e->rec.aux = g->gno;
                emit(&e->rec);
            }
            g->calls++;
        } else {
            emit(&e->rec);
        }
        call_done(e);
        return NCCL_OK;
    }
    if (e->calls == 1) {
        emit(&e->held);
        BUMP(p_single_groups);
    } else if (e->calls > 1) {
        hvprof_record r = {
            .t_start = e->rec.t_start,
            .t_end = hvprof_ticks(),
            .bytes = e->bytes,
            .count = e->calls,
            .seq = e->gno,
            .comm = e->rec.comm,
            .track = HVPROF_TRACK_SELF,
            .root = -1,
            .op = HVPROF_OP_NCCL_GROUP,
            .dtype = HVPROF_DT_UNKNOWN,
            .redop = HVPROF_REDOP_NONE,
            .aux = e->gno,
        };
        emit(&r);
    } else {
        atomic_fetch_add_explicit(&p_empty_groups, 1, memory_order_relaxed);
    }
    ev_free(e);
    return NCCL_OK;
}

/* recordEventState: a child's bytes and timers; nothing else is read. */
void record_state(void *eHandle, plugin_state_t s, const void *args, int version)
{
    pev *e = eHandle;
    if (HVPROF_UNLIKELY(!e || e->magic != EV_MAGIC || !args)) return;
    if (e->kind == K_POP && version < 4) {
        size_t t;
        memcpy(&t, args, sizeof t); /* proxyOp.transSize: bytes so far */
        if (t > e->trans) e->trans = t;
    } else if (e->kind == K_STEP && version >= 4) {
        size_t t;
        memcpy(&t, args, sizeof t); /* proxyStep.transSize: this step's bytes */
        if (t) e->trans = t;
    } else if (e->kind == K_KCH && version >= 4 && s == 22 /* KernelChStop */) {
        uint64_t t;
        memcpy(&t, args, sizeof t); /* kernelCh.pTimer: the stop timer */
        if (t) {
            e->t1 = t;
            e->has_stop = 1;
            kt_observe(t, hvprof_ticks());
        }
    }
}

ncclResult_t finalize_ctx(void *context)
{
    pctx *c = context;
    if (!c || c->magic != CTX_MAGIC) return NCCL_OK;
    atomic_fetch_add(&p_finals, 1);
    live_remove(c);
    ring_flush(c);
    if (atomic_load(&c->comm_idx) != UINT32_MAX) hvprof_comm_forget((uint64_t)(uintptr_t)c);
    c->magic = 0;
    free(c);
    return NCCL_OK;
}

/* ------------------------------------------------------------------------ */
/* Activation of a program started with LD_PRELOAD of this library (Python
 * processes: profiler.collect.activate does it, and says when the user's own
 * plugin takes precedence): with HOROVOD_PROFILE on and NCCL_PROFILER_PLUGIN
 * unset, point it at this library, so that a statically linked NCCL loads
 * it.  Only when preloaded: the constructor then runs before the program
 * has threads (setenv is not safe beside a concurrent getenv). */
__attribute__((constructor)) static void plugin_ctor(void)
{
    const char *pre = getenv("LD_PRELOAD");
    if (!pre || !strstr(pre, "libhvprof") || hvprof_profile_mode_quiet() == HVPROF_PROFILE_OFF)
        return;
    const char *cur = getenv("NCCL_PROFILER_PLUGIN");
    if (cur && *cur) return; /* the user's choice */
    Dl_info info;
    if (dladdr((void *)&plugin_ctor, &info) && info.dli_fname && info.dli_fname[0] == '/')
        setenv("NCCL_PROFILER_PLUGIN", info.dli_fname, 0);
}

/* ------------------------------------------------------------------------ */
/* This path's part of hvprof_nccl_json and of the exit (nccl_common.h).     */

static uint64_t plugin_silent(void) { return atomic_load(&p_silent); }

static size_t plugin_json(char *buf, size_t n, uint64_t records)
{
    int v = atomic_load(&negotiated);
    int proxy = v > 0 && proxy_wanted();
    int mask = v > 0 ? CALL_MASK | (proxy ? child_mask(v) : 0) : 0;
    /* Where device time comes from on this path: the interface's kernel-
     * channel timers (v4 on), else the symbol wrappers' CUDA events (shared
     * NCCL only: a static NCCL seen by the plugin alone has host times). */
    const char *devtime = v >= 4 && proxy ? "kernel_channel_timers"
                          : v > 0 ? "cuda_events_of_the_wrappers" : "none";
    int k = snprintf(buf, n,
                     "\"plugin\": {\"interface_version\": %d, \"versions_exported\": [1, 2, 3, 4, "
                     "5, 6, 7], \"activation_mask\": %d, \"comms_init\": %llu, "
                     "\"one_rank_comms\": %llu, \"comms_finalized\": %llu, \"events\": %llu, "
                     "\"records\": %llu, "
                     "\"silent_in_wrapper\": %llu, \"not_recording\": %llu, "
                     "\"other_events\": %llu, \"single_call_groups\": %llu, "
                     "\"empty_groups\": %llu, \"proxy_events\": %s, \"child_events\": %llu, "
                     "\"child_orphans\": %llu, \"child_remote_pid\": %llu, "
                     "\"net_records\": %llu, \"device_records\": %llu, "
                     "\"device_time\": \"%s\"}",
                     v, mask,
                     (unsigned long long)atomic_load(&p_inits),
                     (unsigned long long)atomic_load(&p_one_rank),
                     (unsigned long long)atomic_load(&p_finals),
                     (unsigned long long)atomic_load(&p_events),
                     (unsigned long long)records,
                     (unsigned long long)atomic_load(&p_silent),
                     (unsigned long long)atomic_load(&p_not_recording),
                     (unsigned long long)atomic_load(&p_unknown),
                     (unsigned long long)atomic_load(&p_single_groups),
                     (unsigned long long)atomic_load(&p_empty_groups),
                     proxy ? "true" : "false", (unsigned long long)atomic_load(&p_children),
                     (unsigned long long)atomic_load(&p_orphans),
                     (unsigned long long)atomic_load(&p_remote),
                     (unsigned long long)atomic_load(&p_net_records),
                     (unsigned long long)atomic_load(&p_dev_records), devtime);
    return k < 0 ? 0 : (size_t)k;
}

static const hvprof_nccl_plugin plugin_hooks = {
    .silent = plugin_silent,
    .json = plugin_json,
    .flush = plugin_flush,
};

__attribute__((constructor)) static void plugin_register(void)
{
    hvprof_nccl_register_plugin(&plugin_hooks);
}
