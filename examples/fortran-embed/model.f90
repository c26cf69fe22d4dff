! A toy Fortran model that owns its fields and calls mpisphere through a C shim (shim.c, bridge.py).
!
! Each rank of a sub-communicator of MPI_COMM_WORLD owns field(nlon_loc, nlat_loc, nlev) on its tile of
! an equiangular nlat x nlon grid (poles included), and a ghost-celled copy padded(0:nlon_loc+1,
! 0:nlat_loc+1, nlev). The model
!   1. hands mpisphere its communicator (MPI_VAL, the Fortran handle) and its tile, which mpisphere
!      checks against its own (collectively: a mismatch stops every rank with the reason);
!   2. asks for the SHT round trip of field, written by mpisphere straight into back(:,:,:);
!   3. asks for an in-place halo exchange of padded;
! and checks both results itself against the analytic field. Arrays pass by address, never copied.
program model
  use mpi_f08
  use iso_c_binding
  implicit none

  interface
    integer(c_int) function mps_start(comm, nlat, nlon, npolar, nazimuth, lat_first, lat_last, lon_first, &
                                      lon_last) bind(c, name="mps_start")
      import :: c_int
      integer(c_int), value :: comm, nlat, nlon, npolar, nazimuth, lat_first, lat_last, lon_first, lon_last
    end function
    integer(c_int) function mps_round_trip(field, back, nlon_loc, nlat_loc, nlev) bind(c, name="mps_round_trip")
      import :: c_int, c_double
      real(c_double), intent(in) :: field(*)
      real(c_double), intent(inout) :: back(*)
      integer(c_int), value :: nlon_loc, nlat_loc, nlev
    end function
    integer(c_int) function mps_halo_update(padded, nlon_pad, nlat_pad, nlev) bind(c, name="mps_halo_update")
      import :: c_int, c_double
      real(c_double), intent(inout) :: padded(*)
      integer(c_int), value :: nlon_pad, nlat_pad, nlev
    end function
    integer(c_int) function mps_stop() bind(c, name="mps_stop")
      import :: c_int
    end function
  end interface

  integer, parameter :: nlat = 37, nlon = 72, nlev = 3
  type(MPI_Comm) :: world_copy
  integer :: rank, size, npolar, nazimuth, prow, pcol, i, j, k, ierr
  integer :: lat_first, lat_last, lon_first, lon_last, nlat_loc, nlon_loc, wrong
  real(c_double), allocatable, target :: field(:, :, :), back(:, :, :), padded(:, :, :)
  real(c_double) :: err, worst, expected
  character(len=32) :: arg

  call MPI_Init()
  ! the model's own communicator: a sub-communicator of MPI_COMM_WORLD (here all of it, split by colour)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_split(MPI_COMM_WORLD, 0, rank, world_copy)
  call MPI_Comm_rank(world_copy, rank)
  call MPI_Comm_size(world_copy, size)
  npolar = 1
  if (command_argument_count() >= 1) then
    call get_command_argument(1, arg)
    read (arg, *) npolar
  end if
  nazimuth = size / npolar
  ! azimuth-fastest rank order: rank = prow * nazimuth + pcol (mpisphere's default)
  prow = rank / nazimuth
  pcol = mod(rank, nazimuth)
  call chunk(nlat, npolar, prow, lat_first, lat_last)
  call chunk(nlon, nazimuth, pcol, lon_first, lon_last)
  nlat_loc = lat_last - lat_first + 1
  nlon_loc = lon_last - lon_first + 1

  allocate (field(nlon_loc, nlat_loc, nlev), back(nlon_loc, nlat_loc, nlev))
  allocate (padded(0:nlon_loc + 1, 0:nlat_loc + 1, nlev))
  do k = 1, nlev
    do j = 1, nlat_loc
      do i = 1, nlon_loc
        field(i, j, k) = analytic(lon_first + i - 1, lat_first + j - 1, k)
      end do
    end do
  end do
  padded = -999.0d0
  padded(1:nlon_loc, 1:nlat_loc, :) = field

  ierr = mps_start(world_copy%MPI_VAL, nlat, nlon, npolar, nazimuth, lat_first, lat_last, lon_first, lon_last)
  if (ierr /= 0) call fail("mps_start")

  ! 1. SHT round trip, written by mpisphere into back
  back = 0
  ierr = mps_round_trip(field, back, nlon_loc, nlat_loc, nlev)
  if (ierr /= 0) call fail("mps_round_trip")
  err = maxval(abs(back - field))
  call MPI_Allreduce(err, worst, 1, MPI_DOUBLE_PRECISION, MPI_MAX, world_copy)

  ! 2. halo exchange in place: every ghost cell, corners included, against the analytic field
  ierr = mps_halo_update(padded, nlon_loc + 2, nlat_loc + 2, nlev)
  if (ierr /= 0) call fail("mps_halo_update")
  wrong = 0
  do k = 1, nlev
    do j = 0, nlat_loc + 1
      do i = 0, nlon_loc + 1
        if (lat_first + j - 1 < 1 .or. lat_first + j - 1 > nlat) then
          expected = 0.0d0                      ! past the poles: zeros
        else
          expected = analytic(modulo(lon_first + i - 2, nlon) + 1, lat_first + j - 1, k)
        end if
        if (padded(i, j, k) /= expected) wrong = wrong + 1   ! halos are copies: exact
      end do
    end do
  end do
  call MPI_Allreduce(MPI_IN_PLACE, wrong, 1, MPI_INTEGER, MPI_SUM, world_copy)

  if (rank == 0) then
    print '(a, i0, a, i0, a, i0, a, i0, a)', "fortran model: ", size, " ranks as ", npolar, " x ", nazimuth, &
      ", ", nlat, " latitudes"
    print '(a, es10.3)', "fortran model: SHT round trip, max |back - field| = ", worst
    print '(a, i0)', "fortran model: halo cells that differ from the analytic field: ", wrong
  end if
  ierr = mps_stop()
  if (worst > 1.0d-12 .or. wrong /= 0) then
    if (rank == 0) print '(a)', "fortran model: FAILED"
    call MPI_Abort(MPI_COMM_WORLD, 1)
  end if
  if (rank == 0) print '(a)', "fortran model: OK"
  call MPI_Comm_free(world_copy)
  call MPI_Finalize()

contains

  ! the balanced split mpisphere uses: the first mod(n, parts) chunks are one longer (1-based, inclusive)
  subroutine chunk(n, parts, index, first, last)
    integer, intent(in) :: n, parts, index
    integer, intent(out) :: first, last
    integer :: base, extra
    base = n / parts
    extra = mod(n, parts)
    first = index * base + min(index, extra) + 1
    last = first + base - 1
    if (index < extra) last = last + 1
  end subroutine

  ! a band-limited field (degrees <= 3): the SHT round trip reproduces it to rounding
  pure real(c_double) function analytic(i, j, k)
    integer, intent(in) :: i, j, k
    real(c_double), parameter :: pi = 3.14159265358979323846d0
    real(c_double) :: theta, phi
    theta = pi * (j - 1) / (nlat - 1)
    phi = 2 * pi * (i - 1) / nlon
    analytic = k * cos(theta) + sin(theta) * cos(phi) + 0.5d0 * sin(theta)**2 * sin(2 * phi) &
               + 0.1d0 * k * sin(theta)**3 * cos(3 * phi)
  end function

  subroutine fail(what)
    character(len=*), intent(in) :: what
    print '(a, i0, a)', "fortran model: rank ", rank, ": " // what // " failed (Python's error is above)"
    call MPI_Abort(MPI_COMM_WORLD, 2)
  end subroutine
end program
