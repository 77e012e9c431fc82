/* callgrind_allreduce.c -- N calls of a 0-byte and an 8-byte MPI_Allreduce on
 * MPI_COMM_WORLD, for instruction counts under callgrind (callgrind.sh). */
#include <mpi.h>
#include <stdlib.h>
int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    long v = 1, o = 0;
    for (int i = 0; i < n; i++) MPI_Allreduce(MPI_IN_PLACE, &o, 0, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD);
    for (int i = 0; i < n; i++) MPI_Allreduce(&v, &o, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
