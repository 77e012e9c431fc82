! The same calls through one of MPI's three Fortran bindings, chosen at
! compile time: -DBINDING=1 mpif.h, 2 `use mpi`, 3 `use mpi_f08`.  Run at
! np=2 by tests/test_fortran.py, which knows what each rank calls; the
! results are checked here (the profiler must not change them), and the
! program stops with status 1 when one is wrong.
program fortran_calls
#if BINDING == 2
  use mpi
#elif BINDING == 3
  use mpi_f08
#endif
  implicit none
#if BINDING == 1
  include 'mpif.h'
#endif
#if BINDING == 3
  type(MPI_Comm) :: sub
  type(MPI_Request) :: reqs(3)
  type(MPI_Status) :: st
#else
  integer :: sub
  integer :: reqs(3)
  integer :: st(MPI_STATUS_SIZE)
#endif
  integer :: ierr, rank, size, i, provided
  double precision :: a(100), b(100), d(8), p(5)
  real :: r(16), rs(16)
  integer :: k(10), bc(25), g(3), gg(6), red(4), redo(4), s2(4), r2(4), one, sone

  call MPI_Init_thread(MPI_THREAD_FUNNELED, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, size, ierr)

  a = rank + 1
  call MPI_Allreduce(a, b, 100, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (b(100) /= size * (size + 1) / 2) stop 1

  k = rank
  call MPI_Allreduce(MPI_IN_PLACE, k, 10, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (k(10) /= size - 1) stop 1

  bc = rank + 7
  call MPI_Bcast(bc, 25, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
  if (bc(25) /= 7) stop 1

  r = 1.0
  call MPI_Iallreduce(r, rs, 16, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
  call MPI_Wait(reqs(1), st, ierr)
  if (rs(16) /= size) stop 1

  d = rank + 3
  call MPI_Ibcast(d, 8, MPI_DOUBLE_PRECISION, 1, MPI_COMM_WORLD, reqs(1), ierr)
  call MPI_Ibarrier(MPI_COMM_WORLD, reqs(2), ierr)
  call MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE, ierr)
  if (d(8) /= 4) stop 1

  g = rank
  call MPI_Allgather(g, 3, MPI_INTEGER, gg, 3, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  if (gg(6) /= 1) stop 1

  red = rank + 1
  call MPI_Reduce(red, redo, 4, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0 .and. redo(4) /= 3) stop 1

  s2 = rank
  call MPI_Alltoall(s2, 2, MPI_INTEGER, r2, 2, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  if (r2(4) /= 1) stop 1

  if (rank == 0) then
    p = 2.5d0
    call MPI_Send(p, 5, MPI_DOUBLE_PRECISION, 1, 42, MPI_COMM_WORLD, ierr)
  else if (rank == 1) then
    call MPI_Recv(p, 5, MPI_DOUBLE_PRECISION, 0, MPI_ANY_TAG, MPI_COMM_WORLD, st, ierr)
#if BINDING == 3
    if (st%MPI_TAG /= 42 .or. st%MPI_SOURCE /= 0) stop 1
#else
    if (st(MPI_TAG) /= 42 .or. st(MPI_SOURCE) /= 0) stop 1
#endif
    if (p(5) /= 2.5d0) stop 1
  end if

  call MPI_Comm_split(MPI_COMM_WORLD, 0, rank, sub, ierr)
  one = 1
  call MPI_Allreduce(one, sone, 1, MPI_INTEGER, MPI_SUM, sub, ierr)
  if (sone /= size) stop 1
  call MPI_Comm_free(sub, ierr)

#if BINDING == 3
  call MPI_Barrier(MPI_COMM_WORLD)  ! ierror left out: optional in mpi_f08
#else
  call MPI_Barrier(MPI_COMM_WORLD, ierr)
#endif
  do i = 1, 1
    if (rank == 0) print '(a)', 'fortran calls ok'
  end do
  call MPI_Finalize(ierr)
end program fortran_calls
