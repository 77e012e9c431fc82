/*
 * steps.c -- the training-step state: where the open step began, the next
 * step's number, who marks steps (the application or a framework hook), the
 * last synchronize of the open step, and step sampling.
 *
 * One state per process, behind one flag, for every way steps are marked:
 * profiler.step() and step_context (profiler/collect/steps.py, through
 * ctypes or profiler._fastrec), the DistributedOptimizer's step and
 * synchronize hooks (profiler._fastrec's StepHook, straight from C: a Python
 * frame costs microseconds inside a training step), TensorFlow's and Keras's
 * hooks.  The rules are those of profiler/collect/steps.py's docstring:
 *
 * - step(images) closes the interval begun at the previous boundary (the
 *   first call only opens one); once the application marks steps, the hooks
 *   fall silent, and if a hook had opened a step, that interval restarts at
 *   the application's first call, so nothing is counted twice;
 * - a hooked boundary writes the step's "sync" row first: the last
 *   synchronize of the open step, else [entered, now);
 * - HOROVOD_PROFILE_SAMPLE_STEPS=N (read in Python, which warns once, and
 *   handed over by hvprof_steps_configure): steps 0, N, 2N, ... are
 *   recorded, switched at each step's opening; combined with the user's
 *   switch (hvprof_steps_user_sampling).
 *
 * Records: APP_STEP (count = images, seq = step number), APP_SYNC (seq = the
 * open step's number), APP_JOIN (seq = steps recorded so far); each through
 * hvprof_record_app, which writes the step's APP_CPU rows (cpu.c).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "hvprof_internal.h"

/* The state's guard: a flag taken with one atomic exchange, no mutex and no
 * system call of its own.  One thread marks steps in practice, so it is not
 * contended; another would spin while the holder writes the step's records. */
static atomic_flag busy = ATOMIC_FLAG_INIT;

static inline void lock_state(void)
{
    while (atomic_flag_test_and_set_explicit(&busy, memory_order_acquire)) {
    }
}

static inline void unlock_state(void) { atomic_flag_clear_explicit(&busy, memory_order_release); }

static struct {
    int has_last;       /* a step is open */
    uint64_t last;      /* ticks of the last boundary: the open step's start */
    uint64_t next_seq;  /* number of the next step record */
    int explicit_;      /* the application marks steps itself */
    int hooked;         /* a framework hook has marked a boundary */
    int user_on;        /* profiler.sampling() / paused() */
    int steps_on;       /* the open step is one to record */
    uint32_t every;     /* HOROVOD_PROFILE_SAMPLE_STEPS (1: every step) */
    uint64_t batch;     /* images a hooked step records when the hook does not know */
    int has_sync;       /* the open step's last synchronize: */
    uint64_t sync_in, sync_out;
    int64_t sync_cpu, sync_wait; /* its ns on a CPU and waiting for one (-1: not read) */
    int has_begun;      /* hvprof_steps_hook_begin's step is open */
    uint64_t begun;
} st = {.user_on = 1, .steps_on = 1, .every = 1};

static void child_after_fork(void)
{
    unlock_state(); /* a thread of the parent may have held it */
}

__attribute__((constructor)) static void steps_init(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

static void apply_sampling(void) { hvprof_set_sampling(st.user_on && st.steps_on); }

/* Step number next_seq has just opened: sample it or not. */
static void open_step(void)
{
    if (st.every > 1) {
        int on = st.next_seq % st.every == 0;
        if (on != st.steps_on) {
            st.steps_on = on;
            apply_sampling();
        }
    }
}

static void record_step(uint64_t t0, uint64_t t1, uint64_t images)
{
    hvprof_record_app(HVPROF_OP_APP_STEP, t0, t1, images, (uint32_t)st.next_seq);
    st.next_seq++;
}

/* Close the open step (if any) now and open the next.  A step that opens
 * with none closing reads every thread's CPU now (cpu.c), so that its rows
 * cover it alone. */
static void boundary(uint64_t images)
{
    uint64_t now = hvprof_now();
    if (st.has_last)
        record_step(st.last, now, images);
    else
        hvprof_cpu_baseline();
    st.last = now;
    st.has_last = 1;
    open_step();
}

HVPROF_EXPORT void hvprof_steps_configure(uint32_t every, uint64_t batch)
{
    lock_state();
    st.every = every ? every : 1;
    st.batch = batch;
    if (st.every == 1 && !st.steps_on) {
        st.steps_on = 1;
        apply_sampling();
    }
    unlock_state();
}

HVPROF_EXPORT void hvprof_steps_set_batch(uint64_t batch)
{
    lock_state();
    st.batch = batch;
    unlock_state();
}

/* profiler.step(images). */
HVPROF_EXPORT void hvprof_steps_mark(uint64_t images)
{
    lock_state();
    if (!st.explicit_) {
        st.explicit_ = 1;
        if (st.hooked) {
            st.last = hvprof_now();
            st.has_last = 1;
            hvprof_cpu_baseline();
            open_step();
            unlock_state();
            return;
        }
    }
    boundary(images);
    unlock_state();
}

/* step_context's entry: opens step next_seq; returns its start (ticks). */
HVPROF_EXPORT uint64_t hvprof_steps_context_enter(void)
{
    lock_state();
    open_step();
    unlock_state();
    uint64_t t0 = hvprof_now();
    hvprof_cpu_baseline();
    return t0;
}

/* step_context's exit: the body [t0, now) is one step. */
HVPROF_EXPORT void hvprof_steps_context_exit(uint64_t t0, uint64_t images)
{
    lock_state();
    st.explicit_ = 1;
    uint64_t t1 = hvprof_now();
    record_step(t0, t1, images);
    st.last = t1;
    st.has_last = 1;
    open_step();
    unlock_state();
}

/* The open step's synchronize, as it returns: [t_in, t_out) and the calling
 * thread's ns on a CPU and waiting for one during it (-1: not read). */
HVPROF_EXPORT void hvprof_steps_sync(uint64_t t_in, uint64_t t_out, int64_t cpu_ns,
                                     int64_t wait_ns)
{
    lock_state();
    st.has_sync = 1;
    st.sync_in = t_in;
    st.sync_out = t_out;
    st.sync_cpu = cpu_ns;
    st.sync_wait = wait_ns;
    unlock_state();
}

/* A framework hook's boundary (after optimizer.step, a step function, a
 * tape's gradient): the open step's sync row, then the step record.
 * entered: the clock as optimizer.step began (0: unknown); images < 0: the
 * configured batch size. */
HVPROF_EXPORT void hvprof_steps_hook(uint64_t entered, int64_t images)
{
    lock_state();
    if (st.explicit_) {
        unlock_state();
        return;
    }
    st.hooked = 1;
    int had_sync = st.has_sync;
    st.has_sync = 0;
    if (st.has_last) {
        uint32_t seq = (uint32_t)st.next_seq;
        if (had_sync && st.sync_in >= st.last) {
            if (st.sync_cpu >= 0 && st.sync_wait >= 0)
                hvprof_record_app_cpu(HVPROF_OP_APP_SYNC, st.sync_in, st.sync_out,
                                      (uint64_t)st.sync_cpu, (uint64_t)st.sync_wait, seq);
            else
                hvprof_record_app(HVPROF_OP_APP_SYNC, st.sync_in, st.sync_out, 0, seq);
        } else if (entered) {
            hvprof_record_app(HVPROF_OP_APP_SYNC, entered, hvprof_now(), 0, seq);
        }
    }
    boundary(images < 0 ? st.batch : (uint64_t)images);
    unlock_state();
}

/* A framework hook as a step begins (Keras's on_train_batch_begin). */
HVPROF_EXPORT void hvprof_steps_hook_begin(void)
{
    lock_state();
    if (!st.explicit_) {
        st.hooked = 1;
        open_step();
        st.begun = hvprof_now();
        st.has_begun = 1;
        hvprof_cpu_baseline();
    }
    unlock_state();
}

/* ... and as it ends: one step [begun, now). */
HVPROF_EXPORT void hvprof_steps_hook_end(uint64_t images)
{
    lock_state();
    if (!st.explicit_ && st.has_begun) {
        uint64_t now = hvprof_now();
        record_step(st.begun, now, images);
        st.last = now;
        st.has_last = 1;
        st.has_begun = 0;
        open_step();
    }
    unlock_state();
}

/* hvd.join's wait: count = the rank join returned, seq = steps so far. */
HVPROF_EXPORT void hvprof_steps_join(uint64_t t_in, uint64_t t_out, uint64_t last_rank)
{
    lock_state();
    uint32_t seq = (uint32_t)st.next_seq;
    unlock_state();
    hvprof_record_app(HVPROF_OP_APP_JOIN, t_in, t_out, last_rank, seq);
}

/* The user's switch; returns the previous setting. */
HVPROF_EXPORT int hvprof_steps_user_sampling(int on)
{
    lock_state();
    int before = st.user_on;
    st.user_on = on != 0;
    apply_sampling();
    unlock_state();
    return before;
}

HVPROF_EXPORT uint64_t hvprof_steps_recorded(void)
{
    lock_state();
    uint64_t n = st.next_seq;
    unlock_state();
    return n;
}

/* 0: no step marked yet, 1: by a hook, 2: by the application. */
HVPROF_EXPORT int hvprof_steps_mode(void)
{
    lock_state();
    int m = st.explicit_ ? 2 : st.hooked ? 1 : 0;
    unlock_state();
    return m;
}
