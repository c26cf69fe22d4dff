"""The Python side of the Fortran model's calls (shim.c): mpisphere on the model's communicator and memory."""

import numpy

from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, HaloExchange, ProcessGrid
from mpisphere.interop import array_from_address


class Session:
    """One per model process: the grid on the model's communicator, and the operators it asks for."""

    def __init__(self, comm, nlat, nlon, npolar, nazimuth, lat_first, lat_last, lon_first, lon_last):
        self.grid = ProcessGrid.from_fortran(comm, npolar, nazimuth)
        # the model's tile, 1-based inclusive, must be mpisphere's: raises on every rank otherwise
        self.grid.check_tile(nlat, nlon, (lat_first - 1, lat_last), (lon_first - 1, lon_last))
        self.sht = DistributedRealSHT(self.grid, nlat, nlon, quadrature="equiangular")
        self.isht = DistributedInverseRealSHT(self.grid, nlat, nlon, quadrature="equiangular")
        self.halo = HaloExchange(self.grid, rows=1, cols=1, extents=(nlat, nlon))

    def round_trip(self, field, back, nlon_loc, nlat_loc, nlev):
        x = array_from_address(field, (nlon_loc, nlat_loc, nlev))   # (nlev, nlat_loc, nlon_loc), no copy
        out = array_from_address(back, (nlon_loc, nlat_loc, nlev))
        self.isht.forward(self.sht.forward(x), out=out)               # written into the Fortran array

    def halo_update(self, padded, nlon_pad, nlat_pad, nlev):
        self.halo.update(array_from_address(padded, (nlon_pad, nlat_pad, nlev)))

    def close(self):
        self.grid.free()


assert numpy.dtype(numpy.float64).itemsize == 8  # real(c_double)
