/*
 * intercomm.c -- collectives on an intercommunicator.  World rank 0 is group
 * A, ranks 1..n-1 group B (uneven from np=3 on); MPI_Intercomm_create joins
 * them.  Usage: intercomm N.  Then N x (MPI_Allreduce of one long, and
 * MPI_Allgatherv where local rank i sends i+1 ints), one MPI_Barrier on the
 * intercommunicator and one MPI_Allreduce on its duplicate.  Prints
 * "RESULT OK world W local_size L remote_size R" when every value is right.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 3;
    int rank, size, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        printf("NEEDS_2_RANKS\n");
        MPI_Finalize();
        return 1;
    }
    int color = rank == 0 ? 0 : 1;
    MPI_Comm local, inter, dup;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &local);
    MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, color == 0 ? 1 : 0, 77, &inter);
    int lsize, rsize, lrank;
    MPI_Comm_size(inter, &lsize);
    MPI_Comm_remote_size(inter, &rsize);
    MPI_Comm_rank(inter, &lrank);
    /* the remote group's world ranks: 0 for B, 1..size-1 for A */
    long remote_sum = color == 0 ? (long)size * (size - 1) / 2 : 0;
    int *counts = malloc(sizeof(int) * rsize), *displs = malloc(sizeof(int) * rsize);
    int total = 0;
    for (int i = 0; i < rsize; i++) {
        counts[i] = i + 1;
        displs[i] = total;
        total += i + 1;
    }
    int *send = malloc(sizeof(int) * (lrank + 1)), *recv = malloc(sizeof(int) * total);
    for (int i = 0; i <= lrank; i++) send[i] = 1000 * rank + i;
    for (int it = 0; it < n; it++) {
        long v = rank, out = -1;
        MPI_Allreduce(&v, &out, 1, MPI_LONG, MPI_SUM, inter);
        if (out != remote_sum) bad = 1;
        MPI_Allgatherv(send, lrank + 1, MPI_INT, recv, counts, displs, MPI_INT, inter);
        /* remote local rank i is world rank i (A) or i + 1 (B) */
        for (int i = 0; i < rsize; i++)
            if (recv[displs[i]] != 1000 * (color == 0 ? i + 1 : i)) bad = 1;
    }
    MPI_Barrier(inter);
    MPI_Comm_dup(inter, &dup);
    long v = 1, out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_LONG, MPI_SUM, dup);
    if (out != rsize) bad = 1;
    MPI_Comm_free(&dup);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
    free(counts);
    free(displs);
    free(send);
    free(recv);
    printf("RESULT %s world %d local_size %d remote_size %d\n", bad ? "BAD" : "OK", rank, lsize,
           rsize);
    MPI_Finalize();
    return bad;
}
