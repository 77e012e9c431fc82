/*
 * collectives.c -- calls every collective the profiler wraps a known number
 * of times with known sizes (tests/test_capture_c.py holds the expected
 * counts and bytes).  Usage: collectives N.  Prints "RESULT OK" when every
 * reduced value is right, so the test also sees results are unchanged.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "check failed line %d: %s\n", __LINE__, #c); \
            bad = 1;                                                    \
        }                                                               \
    } while (0)

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 3;
    int rank, size, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int *ibuf = calloc(4096, sizeof(int)), *iout = calloc(4096, sizeof(int));
    double *dbuf = calloc(4096, sizeof(double)), *dout = calloc(4096, sizeof(double));
    int *counts = calloc(size, sizeof(int)), *displs = calloc(size, sizeof(int));
    MPI_Datatype triple;
    MPI_Type_contiguous(3, MPI_DOUBLE, &triple);
    MPI_Type_commit(&triple);

    for (int it = 0; it < n; it++) {
        /* allreduce: 750 ints = 3000 bytes (not a power of two) */
        for (int i = 0; i < 750; i++) ibuf[i] = rank + 1;
        MPI_Allreduce(ibuf, iout, 750, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(iout[749] == size * (size + 1) / 2);
        /* allreduce in place: 8 doubles = 64 bytes */
        for (int i = 0; i < 8; i++) dbuf[i] = rank;
        MPI_Allreduce(MPI_IN_PLACE, dbuf, 8, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        CHECK(dbuf[7] == size - 1);
        /* iallreduce: 16 floats = 64 bytes */
        float f[16], fo[16];
        for (int i = 0; i < 16; i++) f[i] = 1.0f;
        MPI_Request req;
        MPI_Iallreduce(f, fo, 16, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        CHECK(fo[15] == (float)size);
        /* reduce: 100 doubles = 800 bytes */
        MPI_Reduce(dbuf, dout, 100, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        /* bcast: 3000 bytes */
        MPI_Bcast(ibuf, 3000, MPI_BYTE, 0, MPI_COMM_WORLD);
        /* bcast of a derived type: 5 x 24 = 120 bytes */
        MPI_Bcast(dbuf, 5, triple, 0, MPI_COMM_WORLD);
        /* allgather: 10 ints per rank */
        MPI_Allgather(ibuf, 10, MPI_INT, iout, 10, MPI_INT, MPI_COMM_WORLD);
        /* allgatherv: rank i gives i+1 ints */
        for (int i = 0, d = 0; i < size; i++) { counts[i] = i + 1; displs[i] = d; d += i + 1; }
        MPI_Allgatherv(ibuf, rank + 1, MPI_INT, iout, counts, displs, MPI_INT, MPI_COMM_WORLD);
        /* gather: 5 doubles per rank */
        MPI_Gather(dbuf, 5, MPI_DOUBLE, dout, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        /* gatherv: rank i gives i+1 ints */
        MPI_Gatherv(ibuf, rank + 1, MPI_INT, iout, counts, displs, MPI_INT, 0, MPI_COMM_WORLD);
        /* alltoall: 2 ints per rank */
        MPI_Alltoall(ibuf, 2, MPI_INT, iout, 2, MPI_INT, MPI_COMM_WORLD);
        /* alltoallv: 3 ints to every rank */
        for (int i = 0; i < size; i++) { counts[i] = 3; displs[i] = 3 * i; }
        MPI_Alltoallv(ibuf, counts, displs, MPI_INT, iout, counts, displs, MPI_INT, MPI_COMM_WORLD);
        /* reduce_scatter: 4 ints to every rank */
        for (int i = 0; i < size; i++) counts[i] = 4;
        for (int i = 0; i < 4 * size; i++) ibuf[i] = 1;
        MPI_Reduce_scatter(ibuf, iout, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(iout[3] == size);
        MPI_Reduce_scatter_block(ibuf, iout, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(iout[0] == size);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    /* an erroneous call with MPI_ERRORS_RETURN: passed through, recorded */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Bcast(ibuf, -1, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK(rc != MPI_SUCCESS);
    MPI_Type_free(&triple);
    printf("RESULT %s rank %d rc_err %d\n", bad ? "BAD" : "OK", rank, rc);
    MPI_Finalize();
    return bad;
}
