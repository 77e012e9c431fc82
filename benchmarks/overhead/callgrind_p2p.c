/* callgrind_p2p.c -- for instruction counts under callgrind (callgrind.sh
 * with PROG=callgrind_p2p): N iterations of two point-to-point calls at np=1.
 * CG_MODE=null (default): two 8-byte MPI_Send to MPI_PROC_NULL (the wrapper
 * around a call that does almost nothing); CG_MODE=self: an 8-byte MPI_Send
 * to this rank and the MPI_Recv of it (MPI_STATUS_IGNORE: the wrapper reads
 * its own status). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    const char *mode = getenv("CG_MODE");
    int self = mode && strcmp(mode, "self") == 0;
    long v = 1, o = 0;
    for (int i = 0; i < n; i++) {
        if (self) {
            MPI_Send(&v, 1, MPI_LONG, 0, 5, MPI_COMM_WORLD);
            MPI_Recv(&o, 1, MPI_LONG, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Send(&v, 1, MPI_LONG, MPI_PROC_NULL, 5, MPI_COMM_WORLD);
            MPI_Send(&o, 1, MPI_LONG, MPI_PROC_NULL, 5, MPI_COMM_WORLD);
        }
    }
    MPI_Finalize();
    return 0;
}
