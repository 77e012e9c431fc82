/*
 * threads.c -- MPI_THREAD_MULTIPLE: T threads, each on its own duplicate of
 * MPI_COMM_WORLD, each making M 8-byte MPI_Allreduce calls at once.
 * Usage: threads T M.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int M;
static MPI_Comm comms[64];

static void *work(void *arg)
{
    MPI_Comm c = comms[(long)arg];
    long v = 1, out = 0;
    for (int i = 0; i < M; i++) MPI_Allreduce(&v, &out, 1, MPI_LONG, MPI_SUM, c);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        printf("NO_THREAD_MULTIPLE\n");
        MPI_Finalize();
        return 0;
    }
    int T = argc > 1 ? atoi(argv[1]) : 4;
    M = argc > 2 ? atoi(argv[2]) : 1000;
    for (int i = 0; i < T; i++) MPI_Comm_dup(MPI_COMM_WORLD, &comms[i]);
    pthread_t th[64];
    for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, work, (void *)i);
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < T; i++) MPI_Comm_free(&comms[i]);
    printf("RESULT OK\n");
    MPI_Finalize();
    return 0;
}
