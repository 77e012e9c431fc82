/*
 * exitmerge.c -- trace.json at exit, the one way for every program (Python,
 * C, Fortran, anything LD_PRELOADed; MPI or NCCL-only).
 *
 * The process whose raw file is rank 0's runs the post-job stage's exit entry
 * point after closing its own file in the library's destructor (this
 * backend's at_exit hook; in a Python process, after every Python exit
 * handler, which converted each Python rank's own file), as a child process:
 *
 *     <python> -c BOOT DIR RAW WORLD PID    (profiler.postjob.atexit.main)
 *
 * The interpreter is the one the package was built with: setup.py writes its
 * path into libhvprof.python next to libhvprof.so, found here from the
 * library's own path (dladdr).  The child gets no LD_PRELOAD and no
 * HOROVOD_PROFILE (it must not profile itself), /dev/null as stdin, a pipe
 * as stdout and stderr (never the launcher's stdio: mpirun waits for every
 * holder of a rank's stdio to close it), no other descriptor, its own
 * session (a launcher that kills the rank's process group spares it).
 *
 * HOROVOD_PROFILE_MERGE=0 leaves the build for a later `profiler merge DIR`
 * and says so in one line.
 *
 * Bounded: the child waits at most HOROVOD_PROFILE_MERGE_TIMEOUT for the
 * other ranks (profiler.postjob.merge.wait_and_merge); this process waits for
 * the child that long plus EXIT_MERGE_GRACE_S for the merge itself, then
 * lets it go on alone and says so.  The child's "horovod-profiler:" lines
 * (normally one: "trace written to ...") are relayed to stderr; anything else
 * it prints is dropped.  Any failure is one line that keeps the raw files and
 * names `profiler merge DIR`.  The exit status of the process is never
 * touched (this runs inside exit(), after the status is set).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvprof_internal.h"

extern char **environ;

#define EXIT_MERGE_GRACE_S 30.0     /* beyond the merge timeout: the merge itself */
#define OUTPUT_KEEP 16384           /* the child's output kept (its tail) */

static const char BOOT[] =
    "import sys\n"
    "if sys.path and sys.path[0] in ('', '.'): del sys.path[0]\n" /* never the cwd's profiler/ */
    "from profiler.postjob.atexit import main\n"
    "sys.exit(main(sys.argv[1:]))\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* HOROVOD_PROFILE_MERGE_TIMEOUT, as the child reads it too (one table). */
static double merge_timeout_s(void)
{
    double t = hvprof_setting_num(HVS_MERGE_TIMEOUT);
    return t > 1e6 ? 1e6 : t;
}

/* The interpreter recorded next to this library; 0, or -1 with *why set. */
static int find_python(char *out, size_t n, char *lib, size_t libn, const char **why)
{
    Dl_info info;
    if (!dladdr((void *)&find_python, &info) || !info.dli_fname || !*info.dli_fname) {
        *why = "cannot find the library's own path";
        return -1;
    }
    snprintf(lib, libn, "%s", info.dli_fname);
    char file[PATH_MAX + 32];
    const char *slash = strrchr(lib, '/');
    int dirlen = slash ? (int)(slash - lib) : 1;
    snprintf(file, sizeof file, "%.*s/libhvprof.python", dirlen, slash ? lib : ".");
    FILE *f = fopen(file, "re");
    if (!f) {
        *why = "no Python interpreter is recorded next to the library (libhvprof.python)";
        return -1;
    }
    size_t got = fread(out, 1, n - 1, f);
    fclose(f);
    out[got] = 0;
    while (got && (out[got - 1] == '\n' || out[got - 1] == '\r' || out[got - 1] == ' '))
        out[--got] = 0;
    if (!got || out[0] != '/') {
        *why = "libhvprof.python next to the library names no interpreter";
        return -1;
    }
    return 0;
}

/* The environment for the child: without LD_PRELOAD and HOROVOD_PROFILE. */
static char **child_env(void)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++) n++;
    char **env = malloc((n + 1) * sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) != 0 && strncmp(*e, "HOROVOD_PROFILE=", 16) != 0)
            env[k++] = *e;
    env[k] = NULL;
    return env;
}

/* One line for stderr, the raw files named; never more than one. */
__attribute__((format(printf, 2, 3))) static void failed(const char *dir, const char *fmt, ...)
{
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    for (char *p = what; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
    hvprof_warn("error: cannot build the trace at exit: %s; the raw files are kept: "
                "build it with: profiler merge %s", what, dir);
}

/* The child's "horovod-profiler: " lines: counted, or written to stderr
 * (out); *last: its last non-empty line (either way). */
static int relay(const char *buf, size_t len, int out, char *last, size_t lastn)
{
    int said = 0;
    last[0] = 0;
    for (size_t i = 0; i < len;) {
        const char *line = buf + i;
        const char *nl = memchr(line, '\n', len - i);
        size_t n = nl ? (size_t)(nl - line) : len - i;
        if (n >= 18 && memcmp(line, "horovod-profiler: ", 18) == 0) {
            if (out) fprintf(stderr, "%.*s\n", (int)n, line);
            said++;
        }
        if (n) snprintf(last, lastn, "%.*s", (int)(n > 200 ? 200 : n), line);
        i += n + 1;
    }
    if (out) fflush(stderr);
    return said;
}

/* From the start of the exit work to the merge's end, a launcher may end
 * this process (mpirun aborts the job when another rank exits with a
 * non-zero status; Slurm, Ctrl-C).  Only signals that would end it are
 * taken (an application's own handler, Python's SIGINT, stay as they are),
 * in three phases:
 *  - EARLY, a Python rank's MPI_Finalize and its own conversion (seconds):
 *    the signal ends it at once, with a line that names `profiler merge`;
 *  - DEFER, from the close of the raw file to the merge's start
 *    (milliseconds): the signal waits for the start;
 *  - ARMED, the merge started: the child goes on alone (its own session)
 *    and the line says so.
 * The line is written from the signal handler; then the signal does what it
 * did before. */
enum { END_OFF, END_EARLY, END_DEFER, END_ARMED };
static const int end_signals[] = {SIGTERM, SIGINT, SIGHUP};
#define N_END (sizeof end_signals / sizeof end_signals[0])
static struct sigaction end_old[N_END];
static char end_line[1400], early_line[1400];
static size_t end_len, early_len;
static volatile sig_atomic_t end_mode, end_said, end_pending;

static void end_say(void)
{
    const char *line = end_mode == END_ARMED ? end_line : early_line;
    size_t len = end_mode == END_ARMED ? end_len : early_len;
    if (!end_said && len) {
        end_said = 1;
        ssize_t w = write(2, line, len);
        (void)w;
    }
}

static void on_end_signal(int sig)
{
    if (end_mode == END_DEFER) { /* the merge is not started yet: after it is */
        end_pending = sig;
        return;
    }
    int saved = errno;
    end_say();
    for (size_t i = 0; i < N_END; i++)
        if (end_signals[i] == sig) sigaction(sig, &end_old[i], NULL);
    raise(sig); /* delivered to the previous handler once this one returns */
    errno = saved;
}

static int is_ours(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == on_end_signal;
}

static void end_signals_catch(int on)
{
    for (size_t i = 0; i < N_END; i++) {
        struct sigaction cur;
        if (sigaction(end_signals[i], NULL, &cur) != 0) continue;
        if (on) {
            if (is_ours(&cur) || !hvprof_signal_ends_process(end_signals[i])) continue;
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_end_signal;
            sigemptyset(&sa.sa_mask);
            end_old[i] = cur;
            sigaction(end_signals[i], &sa, NULL);
        } else if (is_ours(&cur)) {
            sigaction(end_signals[i], &end_old[i], NULL);
        }
    }
}

/* The merge started (the line set) or cannot start (its one line said): a
 * signal that waited ends the process now, as it would have. */
static void end_arm(void)
{
    end_mode = END_ARMED;
    int sig = end_pending;
    if (!sig) return;
    end_say();
    end_signals_catch(0);
    raise(sig);
}

/* While rank 0 waits for its merge, a SIGINT whose handler lets the process
 * go on (Python's: a KeyboardInterrupt later; an application's own) is a
 * person at the terminal who wants the process to end, not a wait of up to
 * the merge's bound: the wait stops, the merge goes on alone, one line says
 * where its trace appears, and the signal then goes to that handler. */
static struct sigaction wait_old;
static volatile sig_atomic_t wait_taken, wait_interrupted;

static void on_wait_interrupt(int sig)
{
    (void)sig;
    wait_interrupted = 1;
}

static void wait_interrupt_catch(int on)
{
    struct sigaction cur;
    if (on) {
        wait_interrupted = 0;
        if (sigaction(SIGINT, NULL, &cur) != 0 || (cur.sa_flags & SA_SIGINFO) ||
            cur.sa_handler == SIG_IGN || cur.sa_handler == SIG_DFL || is_ours(&cur))
            return; /* ignored, or one that ends the process: the end signals' path */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_wait_interrupt; /* no SA_RESTART: poll and nanosleep return */
        sigemptyset(&sa.sa_mask);
        wait_old = cur;
        if (sigaction(SIGINT, &sa, NULL) == 0) wait_taken = 1;
    } else if (wait_taken) {
        wait_taken = 0;
        sigaction(SIGINT, &wait_old, NULL);
    }
}

/* Run the Python merge as a child, bounded.  Prints one line; never fails
 * the process. */
static void exit_merge_run(const char *dir, const char *raw, int world)
{
    char python[PATH_MAX], lib[PATH_MAX];
    const char *why = NULL;
    if (!hvprof_setting_int(HVS_MERGE)) { /* the user merges later, elsewhere */
        if (hvprof_python_attached()) /* each rank converted its own file */
            hvprof_warn("no trace at exit (HOROVOD_PROFILE_MERGE=0): each rank's dataset is "
                        "in %s/ranks; build it with: profiler merge %s", dir, dir);
        else
            hvprof_warn("no trace at exit (HOROVOD_PROFILE_MERGE=0): the raw files are in "
                        "%s/raw; build it with: profiler merge %s", dir, dir);
        return;
    }
    lib[0] = 0;
    if (find_python(python, sizeof python, lib, sizeof lib, &why) != 0) {
        failed(dir, "%s (%s)", why, lib[0] ? lib : "libhvprof.so");
        return;
    }
    double bound = merge_timeout_s() + EXIT_MERGE_GRACE_S;
    char world_s[16], pid_s[16];
    snprintf(world_s, sizeof world_s, "%d", world > 0 ? world : 1);
    snprintf(pid_s, sizeof pid_s, "%d", (int)getpid());
    char *argv[] = {python, "-c", (char *)BOOT, (char *)dir, (char *)raw, world_s, pid_s, NULL};

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        failed(dir, "cannot make a pipe (%s)", strerror(errno));
        return;
    }
    char **env = child_env();
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETSID);
    fflush(NULL); /* the application's buffered output first (exit would, after this) */
    wait_interrupt_catch(1); /* before the child exists: a Ctrl-C once it does stops the wait */
    pid_t pid = -1;
    int rc = posix_spawn(&pid, python, &fa, &at, argv, env ? env : environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        failed(dir, "cannot start %s (%s)", python, strerror(rc));
        return;
    }

    int n = snprintf(end_line, sizeof end_line,
                     "horovod-profiler: this process was ended while the trace was being "
                     "built (pid %d, left running): %s/trace.json appears when it ends; or "
                     "build it with: profiler merge %s\n", (int)pid, dir, dir);
    end_len = n > 0 && (size_t)n < sizeof end_line ? (size_t)n : 0;
    end_arm();

    static char buf[OUTPUT_KEEP + 1];
    size_t len = 0;
    double deadline = now_s() + bound;
    int eof = 0;
    while (!eof && !wait_interrupted) {
        double left = deadline - now_s();
        if (left <= 0) break;
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int r = poll(&p, 1, left > 3600 ? 3600000 : (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        if (len == OUTPUT_KEEP) { /* keep the tail: the last lines matter */
            memmove(buf, buf + OUTPUT_KEEP / 2, OUTPUT_KEEP / 2);
            len = OUTPUT_KEEP / 2;
        }
        ssize_t got = read(fds[0], buf + len, OUTPUT_KEEP - len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) eof = 1;
        else len += (size_t)got;
    }
    close(fds[0]); /* a child left running writes into a closed pipe (EPIPE) */
    int status = 0, known = 0, elsewhere = 0;
    while (eof && !wait_interrupted) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) { known = 1; break; }
        if (w < 0 && errno != EINTR) { /* ECHILD: reaped elsewhere (SIGCHLD ignored) */
            elsewhere = 1;
            break;
        }
        if (now_s() >= deadline) break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    end_signals_catch(0);
    if (wait_interrupted && !known && !elsewhere) {
        hvprof_warn("interrupted while the trace was being built (pid %d, left running): "
                    "%s/trace.json appears when it ends; or build it with: profiler merge %s",
                    (int)pid, dir, dir);
        return; /* the caller hands the SIGINT on */
    }
    char last[256];
    int said = relay(buf, len, 0, last, sizeof last);
    if (!eof || (!known && !elsewhere)) {
        hvprof_warn("the trace is still being built after %.0f s (pid %d, left running): "
                    "%s/trace.json appears when it ends; or build it with: profiler merge %s",
                    bound, (int)pid, dir, dir);
        return;
    }
    int fine = known ? WIFEXITED(status) && (WEXITSTATUS(status) == 0 ||
                                             WEXITSTATUS(status) == 2)
                     : 1; /* reaped by someone else: its lines tell */
    if (fine && said) {
        relay(buf, len, 1, last, sizeof last); /* how it went, the Python exit handler's way */
        return;
    }
    const char *open_ = last[0] ? " (" : "", *close_ = last[0] ? ")" : "";
    if (known && WIFSIGNALED(status))
        failed(dir, "%s was killed by signal %d%s%s%s", python, WTERMSIG(status), open_, last,
               close_);
    else if (known)
        failed(dir, "%s exited with status %d%s%s%s", python, WEXITSTATUS(status), open_,
               last, close_);
    else
        failed(dir, "%s said nothing%s%s%s", python, open_, last, close_);
}

static void exit_merge(const char *dir, const char *raw, int world)
{
    exit_merge_run(dir, raw, world);
    wait_interrupt_catch(0); /* whichever way the run ended */
    if (wait_interrupted) { /* the handler the wait interrupted gets its SIGINT now */
        wait_interrupted = 0;
        raise(SIGINT);
    }
}

/* The exit work's start, before the raw file is closed: rank 0 takes the
 * signals that end it from here (a merge left to later needs none). */
static int merges_at_exit(int rank)
{
    return rank == 0 && hvprof_setting_int(HVS_MERGE);
}

/* A Python rank's exit work starts: a signal that ends rank 0 before its
 * merge starts says how to build the trace. */
static void exitmerge_exit_prepare(const char *dir, int rank)
{
    if (!merges_at_exit(rank)) return;
    int n = snprintf(early_line, sizeof early_line,
                     "horovod-profiler: this process was ended before the trace was built; "
                     "the raw files are kept: build it with: profiler merge %s\n", dir);
    early_len = n > 0 && (size_t)n < sizeof early_line ? (size_t)n : 0;
    end_mode = END_EARLY;
    end_signals_catch(1);
}

static void exitmerge_exit_begin(int rank)
{
    if (!merges_at_exit(rank)) return;
    end_mode = END_DEFER;
    end_signals_catch(1);
}

/* The core's destructor, after the raw file is closed: rank 0 builds the
 * trace, whatever the program. */
static void exitmerge_at_exit(const char *dir, const char *raw, int rank, int world)
{
    if (rank != 0) return;
    exit_merge(dir, raw, world);
    end_arm(); /* a merge that could not start: the signal that waited */
    end_signals_catch(0);
}

static const hvprof_backend exitmerge_backend = {
    .name = "exitmerge",
    .exit_prepare = exitmerge_exit_prepare,
    .exit_begin = exitmerge_exit_begin,
    .at_exit = exitmerge_at_exit,
};

__attribute__((constructor)) static void exitmerge_ctor(void)
{
    hvprof_register_backend(&exitmerge_backend);
}
