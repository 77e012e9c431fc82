/*
 * killed.c -- makes K allreduce calls, says so on stdout, then waits to be
 * killed (SIGKILL from the test).  Usage: killed K.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int k = argc > 1 ? atoi(argv[1]) : 10000, rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int v = 1, out;
    for (int i = 0; i < k; i++) MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("DONE %d pid %d\n", rank, (int)getpid());
    fflush(stdout);
    for (;;) pause();
}
