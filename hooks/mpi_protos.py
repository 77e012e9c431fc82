"""The MPI functions the profiler wraps: one list, from which
scripts/gen_mpi_wrappers.py writes hooks/mpi_wrappers.c (the C wrappers of
the collectives, blocking and nonblocking, with their MPI-4 large-count
forms) and hooks/mpi_fortran.c (the Fortran bindings of every entry marked
`fortran`).

An entry is a C prototype as mpi.h spells it (the name after MPI_, the
parameter list) and how its body is made:

- `collective`: generated in full.  `op` is the record's op (hvprof_format.h),
  `desc` the call described in emit()'s terms after t0 and t1:
  (comm, datatype, count, count_mult, op, root, flags, buffer), `pre` the
  statements that compute locals `desc` needs.  Each collective also gets
  its nonblocking form (I<name>, the same description, a request: recorded
  under `iop`, flagged NONBLOCKING, completed by MPI_Wait/Test) and, where
  mpi.h is MPI-4 (MPICH 4; Open MPI 4.1 has none), the large-count forms of
  both (<name>_c: counts MPI_Count, displacements MPI_Aint).
- `hand`: the C body is written by hand (mpi.c: lifecycle and communicator
  creation; mpi_p2p.c: point-to-point and requests); the compiler checks it
  against mpi.h's prototype.  The list gives it its Fortran binding.

What a collective record's `bytes` means (the collective's data volume in
nccl-tests' sense, computed from what this rank can see locally):
  allreduce, reduce, bcast            count x type size
  allgather, alltoall, gather         per-rank count x type size x comm size
                                      (the receive side when MPI_IN_PLACE)
  allgatherv, reduce_scatter          sum(recvcounts) x type size
  gatherv                             root: sum(recvcounts) x type size;
                                      other ranks: their own sendcount x size
  alltoallv                           sum(sendcounts) x send type size
                                      (recvcounts when MPI_IN_PLACE)
  reduce_scatter_block                recvcount x type size x comm size
  barrier                             0
`count` is the element count of the same volume.  On an intercommunicator
"comm size" above is the remote group's size (the peers; the length of the
counts arrays), except for reduce_scatter(_block), whose counts are per rank
of the local group; an intercommunicator gatherv's root (MPI_ROOT) counts what
it receives, the other ranks of its group (MPI_PROC_NULL) 0.

Fortran (`fortran=True`): mpi_<name>_ and its other manglings (mpif.h and
`use mpi`) and mpi_<name>_f08_ (`use mpi_f08`) convert the handles
(MPI_*_f2c), MPI_IN_PLACE, MPI_BOTTOM and the ignored statuses, and call the
C wrapper above, so a Fortran call is recorded as the C call is.  Built with
Open MPI only: its Fortran bindings call PMPI_* directly and would bypass the
C wrappers; MPICH's call the C MPI_* functions, which are wrapped already.
Not bound in Fortran: the calls returning an index (Waitany, Testany,
Waitsome, Testsome: Fortran counts from 1) and Probe/Iprobe.  Not reached:
MPICH's mpi_f08 binding (mpi_<name>_f08ts_: PMPI_* called directly, buffers
as Fortran 2018 descriptors; docs/guide/profiling.md says so).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Proto:
    name: str  #: after MPI_
    params: str  #: as mpi.h spells them; "void" for none
    body: str = "hand"  #: "collective" (generated) or "hand"
    op: str = ""  #: the record's op (collectives)
    iop: str = ""  #: the nonblocking form's op (default: op)
    pre: str = ""  #: C statements before the description
    desc: str = ""  #: emit()'s arguments after t0, t1 (collectives)
    fortran: bool = True
    #: handle pointers the function reads as well as writes (Fortran: converted in)
    inout: tuple[str, ...] = ()


_IP = "int ip = sendbuf == MPI_IN_PLACE;"

PROTOS: list[Proto] = [
    # --- lifecycle (mpi.c) ---
    Proto("Init", "int *argc, char ***argv"),
    Proto("Init_thread", "int *argc, char ***argv, int required, int *provided"),
    Proto("Finalize", "void"),
    # --- collectives (generated) ---
    Proto("Allreduce", "const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, "
          "MPI_Op op, MPI_Comm comm", "collective", "MPI_ALLREDUCE", "MPI_IALLREDUCE",
          desc="comm, datatype, UCOUNT(count), 0, op, -1, INPLACE(sendbuf), recvbuf"),
    Proto("Reduce", "const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, "
          "MPI_Op op, int root, MPI_Comm comm", "collective", "MPI_REDUCE",
          desc="comm, datatype, UCOUNT(count), 0, op, root, INPLACE(sendbuf), recvbuf"),
    Proto("Bcast", "void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm",
          "collective", "MPI_BCAST",
          desc="comm, datatype, UCOUNT(count), 0, MPI_OP_NULL, root, 0, buffer"),
    Proto("Allgather", "const void *sendbuf, int sendcount, MPI_Datatype sendtype, "
          "void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm",
          "collective", "MPI_ALLGATHER", pre=_IP,
          desc="comm, ip ? recvtype : sendtype, UCOUNT(ip ? recvcount : sendcount), "
               "MULT_PEERS, MPI_OP_NULL, -1, INPLACE(sendbuf), recvbuf"),
    Proto("Allgatherv", "const void *sendbuf, int sendcount, MPI_Datatype sendtype, "
          "void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, "
          "MPI_Comm comm", "collective", "MPI_ALLGATHERV",
          desc="comm, recvtype, sum_counts(recvcounts, comm, 1), 0, MPI_OP_NULL, -1, "
               "INPLACE(sendbuf), recvbuf"),
    Proto("Gather", "const void *sendbuf, int sendcount, MPI_Datatype sendtype, "
          "void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm",
          "collective", "MPI_GATHER", pre=_IP,
          desc="comm, ip ? recvtype : sendtype, UCOUNT(ip ? recvcount : sendcount), "
               "MULT_PEERS, MPI_OP_NULL, root, INPLACE(sendbuf), recvbuf"),
    # The root counts what it receives; an intercommunicator's root says
    # MPI_ROOT, the rest of its group MPI_PROC_NULL (they send nothing); the
    # other ranks count what they send.
    Proto("Gatherv", "const void *sendbuf, int sendcount, MPI_Datatype sendtype, "
          "void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, "
          "int root, MPI_Comm comm", "collective", "MPI_GATHERV",
          pre="int me = -1; PMPI_Comm_rank(comm, &me); "
              "int at_root = me == root || root == MPI_ROOT; "
              "int none = !at_root && root == MPI_PROC_NULL;",
          desc="comm, at_root ? recvtype : none ? MPI_DATATYPE_NULL : sendtype, "
               "at_root ? sum_counts(recvcounts, comm, 1) : none ? 0 : UCOUNT(sendcount), 0, "
               "MPI_OP_NULL, root, at_root ? INPLACE(sendbuf) : 0, recvbuf"),
    Proto("Alltoall", "const void *sendbuf, int sendcount, MPI_Datatype sendtype, "
          "void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm",
          "collective", "MPI_ALLTOALL", pre=_IP,
          desc="comm, ip ? recvtype : sendtype, UCOUNT(ip ? recvcount : sendcount), "
               "MULT_PEERS, MPI_OP_NULL, -1, INPLACE(sendbuf), recvbuf"),
    Proto("Alltoallv", "const void *sendbuf, const int sendcounts[], const int sdispls[], "
          "MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int rdispls[], "
          "MPI_Datatype recvtype, MPI_Comm comm", "collective", "MPI_ALLTOALLV", pre=_IP,
          desc="comm, ip ? recvtype : sendtype, "
               "sum_counts(ip ? recvcounts : sendcounts, comm, 1), 0, MPI_OP_NULL, -1, "
               "INPLACE(sendbuf), recvbuf"),
    Proto("Reduce_scatter", "const void *sendbuf, void *recvbuf, const int recvcounts[], "
          "MPI_Datatype datatype, MPI_Op op, MPI_Comm comm", "collective", "MPI_REDUCE_SCATTER",
          desc="comm, datatype, sum_counts(recvcounts, comm, 0), 0, op, -1, INPLACE(sendbuf), "
               "recvbuf"),
    Proto("Reduce_scatter_block", "const void *sendbuf, void *recvbuf, int recvcount, "
          "MPI_Datatype datatype, MPI_Op op, MPI_Comm comm", "collective",
          "MPI_REDUCE_SCATTER_BLOCK",
          desc="comm, datatype, UCOUNT(recvcount), MULT_SIZE, op, -1, INPLACE(sendbuf), "
               "recvbuf"),
    Proto("Barrier", "MPI_Comm comm", "collective", "MPI_BARRIER",
          desc="comm, MPI_DATATYPE_NULL, 0, 0, MPI_OP_NULL, -1, 0, NULL"),
    # --- point-to-point (mpi_p2p.c) ---
    Proto("Send", "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, "
          "MPI_Comm comm"),
    Proto("Ssend", "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, "
          "MPI_Comm comm"),
    Proto("Bsend", "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, "
          "MPI_Comm comm"),
    Proto("Rsend", "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, "
          "MPI_Comm comm"),
    Proto("Recv", "void *buf, int count, MPI_Datatype datatype, int source, int tag, "
          "MPI_Comm comm, MPI_Status *status"),
    Proto("Sendrecv", "const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, "
          "int sendtag, void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, "
          "int recvtag, MPI_Comm comm, MPI_Status *status"),
    Proto("Sendrecv_replace", "void *buf, int count, MPI_Datatype datatype, int dest, "
          "int sendtag, int source, int recvtag, MPI_Comm comm, MPI_Status *status"),
    Proto("Probe", "int source, int tag, MPI_Comm comm, MPI_Status *status", fortran=False),
    Proto("Iprobe", "int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status",
          fortran=False),
    Proto("Isend", "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, "
          "MPI_Comm comm, MPI_Request *request"),
    Proto("Issend", "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, "
          "MPI_Comm comm, MPI_Request *request"),
    Proto("Irecv", "void *buf, int count, MPI_Datatype datatype, int source, int tag, "
          "MPI_Comm comm, MPI_Request *request"),
    # --- request completion (mpi_p2p.c) ---
    Proto("Wait", "MPI_Request *request, MPI_Status *status", inout=("request",)),
    Proto("Test", "MPI_Request *request, int *flag, MPI_Status *status", inout=("request",)),
    Proto("Waitall", "int count, MPI_Request requests[], MPI_Status statuses[]"),
    Proto("Testall", "int count, MPI_Request requests[], int *flag, MPI_Status statuses[]"),
    Proto("Waitany", "int count, MPI_Request requests[], int *index, MPI_Status *status",
          fortran=False),
    Proto("Testany", "int count, MPI_Request requests[], int *index, int *flag, "
          "MPI_Status *status", fortran=False),
    Proto("Waitsome", "int incount, MPI_Request requests[], int *outcount, int indices[], "
          "MPI_Status statuses[]", fortran=False),
    Proto("Testsome", "int incount, MPI_Request requests[], int *outcount, int indices[], "
          "MPI_Status statuses[]", fortran=False),
    Proto("Request_free", "MPI_Request *request", inout=("request",)),
    # --- communicators and datatypes (mpi.c) ---
    Proto("Comm_dup", "MPI_Comm comm, MPI_Comm *newcomm"),
    Proto("Comm_dup_with_info", "MPI_Comm comm, MPI_Info info, MPI_Comm *newcomm"),
    Proto("Comm_split", "MPI_Comm comm, int color, int key, MPI_Comm *newcomm"),
    Proto("Comm_split_type", "MPI_Comm comm, int split_type, int key, MPI_Info info, "
          "MPI_Comm *newcomm"),
    Proto("Comm_create", "MPI_Comm comm, MPI_Group group, MPI_Comm *newcomm"),
    Proto("Comm_free", "MPI_Comm *comm", inout=("comm",)),
    Proto("Type_free", "MPI_Datatype *datatype", inout=("datatype",)),
]
