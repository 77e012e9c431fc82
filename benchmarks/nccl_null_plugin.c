/*
 * nccl_null_plugin.c -- a profiler plugin that does nothing (asks for the
 * same events as the profiler's, returns a handle, records nothing), for
 * benchmarks/nccl_plugin_cost.sh: the cost of NCCL's (here: the stand-in's)
 * side of the interface -- descriptors filled, four calls per collective --
 * apart from the profiler's own work.  ncclProfiler_v7 only.
 */
#include <stdint.h>

typedef int ncclResult_t;
typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, uint64_t, int *, const char *, int, int, int, void *);
    ncclResult_t (*startEvent)(void *, void **, void *);
    ncclResult_t (*stopEvent)(void *);
    ncclResult_t (*recordEventState)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
} null_entry;

static int dummy;
static ncclResult_t n_init(void **ctx, uint64_t id, int *mask, const char *name, int nn, int nr,
                           int r, void *log)
{
    (void)id; (void)name; (void)nn; (void)nr; (void)r; (void)log;
    *ctx = &dummy;
    *mask = 1 | 2 | 4; /* Group, Coll, P2p: the profiler's mask */
    return 0;
}
static ncclResult_t n_start(void *ctx, void **h, void *d)
{
    (void)ctx; (void)d;
    *h = &dummy;
    return 0;
}
static ncclResult_t n_stop(void *h) { (void)h; return 0; }
static ncclResult_t n_state(void *h, int s, void *a) { (void)h; (void)s; (void)a; return 0; }
static ncclResult_t n_fini(void *ctx) { (void)ctx; return 0; }

__attribute__((visibility("default"))) const null_entry ncclProfiler_v7 = {
    "null", n_init, n_start, n_stop, n_state, n_fini};
