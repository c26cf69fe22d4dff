"""Handing arrays and tiles between a Fortran (or C) model and mpisphere without copies.

A Fortran array ``a(nlon, nlat, nlev)`` is column-major: in memory it is the
C-order array ``(nlev, nlat, nlon)``, which is exactly mpisphere's layout of
``nlev`` fields on ``(nlat, nlon)`` tiles. :func:`array_from_address` wraps
such memory as a NumPy array (a view: operators read it, and ``out=`` writes
into it). :func:`fortran_tile` gives a rank's tile as the 1-based inclusive
index ranges a Fortran model declares its arrays with.
"""

import ctypes

import numpy

from .validation import check_int

__all__ = ["array_from_address", "fortran_tile"]


def array_from_address(address, fortran_shape, dtype=numpy.float64):
    """A NumPy view of a Fortran array at ``address``: C-order shape ``reversed(fortran_shape)``.

    Parameters
    ----------
    address : int
        The array's first element (``c_loc(a)`` in Fortran, a ``double *`` in C).
    fortran_shape : sequence of int
        The Fortran extents, fastest first: ``(nlon, nlat, nlev)``.
    dtype : numpy dtype
        The element type (``real(c_double)`` is float64, ``real(c_float)`` float32).

    Returns
    -------
    ndarray of shape ``tuple(reversed(fortran_shape))``, writeable, sharing the memory.

    Notes
    -----
    The memory must stay allocated (and must not move) while the view is used;
    nothing checks that. ``array_from_address(addr, (nlon, nlat, nlev))`` is
    the ``(nlev, nlat, nlon)`` stack of tiles mpisphere takes.
    """
    address = check_int(address, "address", "array_from_address", minimum=1)
    shape = tuple(check_int(n, "fortran_shape entry", "array_from_address", minimum=0)
                  for n in reversed(tuple(fortran_shape)))
    dtype = numpy.dtype(dtype)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    buffer = (ctypes.c_byte * (count * dtype.itemsize)).from_address(address)
    return numpy.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def fortran_tile(grid, nlat, nlon):
    """This rank's tile as 1-based inclusive ranges: ``(lat_first, lat_last, lon_first, lon_last)``.

    A Fortran model that declares ``field(lon_first:lon_last, lat_first:lat_last, nlev)``
    holds exactly mpisphere's tile (latitudes from the north, longitudes from 0 eastward).
    """
    lat, lon = grid.local_slices(nlat, nlon)
    return lat.start + 1, lat.stop, lon.start + 1, lon.stop
