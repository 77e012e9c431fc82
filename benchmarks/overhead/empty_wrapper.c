/* empty_wrapper.c -- the floor of a PMPI profiler: MPI_Allreduce that only
 * calls PMPI_Allreduce (no clock, no record), built as a shared library and
 * preloaded like any profiler (callgrind_compare.sh, separate.py --baseline
 * style comparisons).  What is left of a wrapper's cost beyond this is the
 * wrapper's own work. */
#include <mpi.h>
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
                  MPI_Op op, MPI_Comm comm)
{
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}
