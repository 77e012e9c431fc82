/* The nonblocking collectives and, where mpi.h is MPI-4 (MPICH 4; not Open
 * MPI 4.1), the large-count (_c) forms, for tests/test_capture_c.py: each
 * call once, the results checked (the profiler must not change them).
 * Prints "large-count 1" when the _c forms were called. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #cond); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                      \
        }                                                                      \
    } while (0)

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double d[16];
    float f[6], fo[6];
    int in[64], out[256], counts[64], displs[64];
    for (int i = 0; i < 16; i++) d[i] = rank == 0 ? i : -1;
    for (int i = 0; i < 64; i++) in[i] = rank;
    for (int i = 0; i < 6; i++) f[i] = 1.0f;
    for (int i = 0; i < size; i++) {
        counts[i] = 2;
        displs[i] = 2 * i;
    }
    MPI_Request r[4];
    MPI_Status st[4]; /* MPICH's MPI_STATUSES_IGNORE trips gcc's -Wstringop-overflow */
    MPI_Ibcast(d, 16, MPI_DOUBLE, 0, MPI_COMM_WORLD, &r[0]);
    MPI_Iallgather(in, 4, MPI_INT, out, 4, MPI_INT, MPI_COMM_WORLD, &r[1]);
    MPI_Ibarrier(MPI_COMM_WORLD, &r[2]);
    MPI_Waitall(3, r, st);
    CHECK(d[15] == 15 && out[4 * size - 1] == size - 1);

    MPI_Ialltoallv(in, counts, displs, MPI_INT, out, counts, displs, MPI_INT, MPI_COMM_WORLD,
                   &r[0]);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    CHECK(out[2 * size - 1] == size - 1);
    MPI_Ireduce_scatter_block(in, out, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[0]);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    CHECK(out[2] == size * (size - 1) / 2);
    MPI_Igather(in, 5, MPI_INT, out, 5, MPI_INT, 0, MPI_COMM_WORLD, &r[0]);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    MPI_Ireduce(f, fo, 6, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD, &r[0]);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    CHECK(rank != 0 || fo[5] == (float)size);

    int large = 0;
#if MPI_VERSION >= 4
    large = 1;
    double s[16];
    MPI_Allreduce_c(d, s, (MPI_Count)16, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    CHECK(s[15] == 15.0 * size);
    MPI_Iallreduce_c(in, out, (MPI_Count)8, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r[0]);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    CHECK(out[7] == size - 1);
    MPI_Count ccounts[64];
    MPI_Aint cdispls[64];
    for (int i = 0; i < size; i++) {
        ccounts[i] = 3;
        cdispls[i] = 3 * i;
    }
    MPI_Allgatherv_c(in, (MPI_Count)3, MPI_INT, out, ccounts, cdispls, MPI_INT, MPI_COMM_WORLD);
    CHECK(out[3 * size - 1] == size - 1);
#endif
    if (rank == 0) printf("large-count %d\n", large);
    MPI_Finalize();
    return 0;
}
