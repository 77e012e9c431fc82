/* tests/test_exit_merge.py: N allreduces of one double and a barrier, then
 * MPI_Finalize; ranks other than 0 then sleep LATE_MS; every rank prints
 * "RESULT OK" and exits with STATUS (after MPI_Finalize).
 *
 *     exit_status N STATUS LATE_MS
 *
 * Built with -DTERM_BEFORE_MERGE -rdynamic, it stands in for a launcher that
 * ends rank 0 (SIGTERM) at the worst moment: after its raw file is closed,
 * just before its exit merge starts (its posix_spawn, which the profiler's
 * library finds here first, signals the process, then spawns).
 */
#ifdef TERM_BEFORE_MERGE
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                const posix_spawnattr_t *at, char *const argv[], char *const envp[])
{
    typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                            const posix_spawnattr_t *, char *const[], char *const[]);
    spawn_fn real = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    kill(getpid(), SIGTERM);
    return real(pid, path, fa, at, argv, envp);
}
#endif
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    int status = argc > 2 ? atoi(argv[2]) : 0;
    int late_ms = argc > 3 ? atoi(argv[3]) : 0;
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double x = 1.0, y = 0.0;
    for (int i = 0; i < n; i++) MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank != 0 && late_ms > 0) {
        struct timespec ts = {late_ms / 1000, (long)(late_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    printf("RESULT OK rank %d\n", rank);
    return status;
}
