"""mpisphere.interop: Fortran memory as NumPy views, and a rank's tile as Fortran index ranges."""

import numpy
import pytest
from mpi4py import MPI

from mpisphere.interop import array_from_address, fortran_tile

from helpers import raises


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
def test_array_from_address_is_the_transposed_view(dtype):
    nlon, nlat, nlev = 5, 4, 3
    fortran = numpy.asfortranarray(numpy.arange(nlon * nlat * nlev, dtype=dtype).reshape(nlon, nlat, nlev))
    view = array_from_address(fortran.ctypes.data, (nlon, nlat, nlev), dtype=dtype)
    assert view.shape == (nlev, nlat, nlon) and view.dtype == dtype and view.flags.c_contiguous
    assert numpy.array_equal(view, fortran.T)
    view[1, 2, 3] = -1  # writes land in the Fortran array: no copy
    assert fortran[3, 2, 1] == -1


def test_array_from_address_rejects_bad_arguments():
    with raises(ValueError, match="array_from_address: address must be positive"):
        array_from_address(0, (2, 2))
    with raises(TypeError, match="array_from_address: fortran_shape entry must be an integer"):
        array_from_address(1, (2.5, 2))
    with raises(ValueError, match="fortran_shape entry must be non-negative"):
        array_from_address(1, (-1, 2))


@pytest.mark.mpi
@pytest.mark.parametrize("nlat, nlon", [(7, 10), (19, 36)])
def test_fortran_tile_matches_local_slices_and_covers_the_sphere(grid, nlat, nlon):
    lat_first, lat_last, lon_first, lon_last = fortran_tile(grid, nlat, nlon)
    lat, lon = grid.local_slices(nlat, nlon)
    assert (lat_first - 1, lat_last, lon_first - 1, lon_last) == (lat.start, lat.stop, lon.start, lon.stop)
    count = numpy.zeros((nlat, nlon), dtype=numpy.int64)
    count[lat_first - 1:lat_last, lon_first - 1:lon_last] += 1
    grid.cart.Allreduce(MPI.IN_PLACE, count, op=MPI.SUM)
    assert (count == 1).all()  # every point on exactly one rank
