! Fortran MPI kernels that Python drives through numpy.f2py (see driver.py).
!
! f2py passes the communicator as its Fortran INTEGER handle (comm.py2f() in mpi4py), so the kernels use
! the `mpi` module, whose communicators are integers.

! The 5-point Laplacian (in grid units) of each level of a halo-padded tile: the halo comes from
! mpisphere's HaloExchange, the arithmetic from Fortran.
subroutine laplacian5(padded, lap, nlon, nlat, nlev)
  implicit none
  integer, intent(in) :: nlon, nlat, nlev
  real(8), intent(in) :: padded(0:nlon + 1, 0:nlat + 1, nlev)
  real(8), intent(out) :: lap(nlon, nlat, nlev)
  integer :: i, j, k
  do k = 1, nlev
    do j = 1, nlat
      do i = 1, nlon
        lap(i, j, k) = padded(i - 1, j, k) + padded(i + 1, j, k) + padded(i, j - 1, k) + padded(i, j + 1, k) &
                       - 4 * padded(i, j, k)
      end do
    end do
  end do
end subroutine

! The sum over every rank of a tile's values per level, by MPI_Allreduce on the caller's communicator.
subroutine global_sums(field, sums, nlon, nlat, nlev, comm)
  use mpi
  implicit none
  integer, intent(in) :: nlon, nlat, nlev, comm
  real(8), intent(in) :: field(nlon, nlat, nlev)
  real(8), intent(out) :: sums(nlev)
  real(8) :: mine(nlev)
  integer :: k, ierr
  do k = 1, nlev
    mine(k) = sum(field(:, :, k))
  end do
  call MPI_Allreduce(mine, sums, nlev, MPI_DOUBLE_PRECISION, MPI_SUM, comm, ierr)
end subroutine
