/*
 * settings.c -- the one way the library reads a HOROVOD_PROFILE_* variable.
 *
 * SETTINGS lists every variable the C side reads; it is the C half of
 * profiler._env.SETTINGS (the entries whose side is "C" or "both"), and
 * tests/test_settings.py checks that the two agree and that every read goes
 * through hvprof_setting.  Other variables (LD_PRELOAD, the launchers'
 * rank variables, NCCL's and Horovod's own) are read with getenv directly.
 *
 * A leaf: this file calls nothing else of the library, so that every file,
 * the core included, may call it.  hvprof_setting is getenv plus string
 * compares: it may be called wherever getenv may, and nowhere else (never in
 * a signal handler).  It caches nothing: each caller
 * reads when it did before (some once, some at every open).
 */
#include <stdlib.h>
#include <string.h>

#include "hvprof_internal.h"

static const char *const SETTINGS[] = {
    "HOROVOD_PROFILE",
    "HOROVOD_PROFILE_CHUNK_KB",
    "HOROVOD_PROFILE_CLOCK",
    "HOROVOD_PROFILE_CLOCK_SYNC",
    "HOROVOD_PROFILE_CPU",
    "HOROVOD_PROFILE_CUDART",
    "HOROVOD_PROFILE_DIR",
    "HOROVOD_PROFILE_FLUSH_MS",
    "HOROVOD_PROFILE_HELPER",
    "HOROVOD_PROFILE_MERGE",
    "HOROVOD_PROFILE_MERGE_TIMEOUT",
    "HOROVOD_PROFILE_NCCL_ANCHOR_MS",
    "HOROVOD_PROFILE_NCCL_DEVICE",
    "HOROVOD_PROFILE_NCCL_EVENTS",
    "HOROVOD_PROFILE_NCCL_FLUSH_MS",
    "HOROVOD_PROFILE_NCCL_POLL_MS",
    "HOROVOD_PROFILE_NCCL_PROXY",
    "HOROVOD_PROFILE_NCCL_WRAPPERS",
    "HOROVOD_PROFILE_SIGNALS",
    "HOROVOD_PROFILE_TIMELINE",
    "HOROVOD_PROFILE_WINDOW",
    NULL,
};

static int listed(const char *name)
{
    for (const char *const *s = SETTINGS; *s; s++)
        if (strcmp(*s, name) == 0) return 1;
    return 0;
}

const char *hvprof_setting(const char *name)
{
    /* A name missing from the table is a programming error that the settings
     * test catches; in a job it reads nothing (the default applies), never
     * stopping the application. */
    return listed(name) ? getenv(name) : NULL;
}
