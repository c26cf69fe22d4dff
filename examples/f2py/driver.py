"""Python drives Fortran MPI kernels (kernels.f90, built by build.sh) on mpisphere's tiles and halos.

    mpirun -n 4 python driver.py

Each rank: a random field on its tile, a one-cell halo by mpisphere (periodic in longitude, zeros past the
poles), the 5-point Laplacian by Fortran on the padded tile, and the global sum of the result per level by
Fortran's MPI_Allreduce on the grid's communicator. Python checks both against a NumPy computation of the
whole field on rank 0, and the Fortran sums against mpisphere's.
"""

import sys

import numpy
from mpi4py import MPI

import kernels
from mpisphere import HaloExchange, ProcessGrid, ReduceFrom

NLAT, NLON, NLEV = 19, 36, 3


def main():
    with ProcessGrid(MPI.COMM_WORLD) as grid:
        rng = numpy.random.default_rng(1)
        whole = rng.standard_normal((NLEV, NLAT, NLON))
        tile = grid.scatter(whole if grid.rank == 0 else None)
        padded = HaloExchange(grid, rows=1, cols=1, extents=(NLAT, NLON)).forward(tile)
        # a C-order (nlev, nlat + 2, nlon + 2) array is Fortran's (nlon + 2, nlat + 2, nlev): pass .T, no copy
        lap = kernels.laplacian5(padded.T).T
        sums = kernels.global_sums(lap.T, grid.cart.py2f())
        gathered = grid.gather(numpy.ascontiguousarray(lap))
        total = ReduceFrom(grid.cart)  # sums over the ranks, agreed like every mpisphere call
        expected_sums = total.forward(lap.sum(axis=(-2, -1)))
        # the two sums add the same terms in different orders: compare against a bound on the rounding of
        # either, which is proportional to the sum of the terms' magnitudes (it cannot cancel)
        magnitude = total.forward(abs(lap).sum(axis=(-2, -1)))
        bound = 2 * NLAT * NLON * numpy.finfo(float).eps * magnitude
        sums_ok = bool(numpy.all(abs(sums - expected_sums) <= bound))
        if grid.rank == 0:
            ext = numpy.zeros((NLEV, NLAT + 2, NLON + 2))
            ext[:, 1:-1, :] = whole[:, :, (numpy.arange(NLON + 2) - 1) % NLON]
            reference = ext[:, :-2, 1:-1] + ext[:, 2:, 1:-1] + ext[:, 1:-1, :-2] + ext[:, 1:-1, 2:] \
                - 4 * ext[:, 1:-1, 1:-1]
            # Fortran and NumPy may order the five terms differently: bound each cell by their magnitudes
            terms = abs(ext[:, :-2, 1:-1]) + abs(ext[:, 2:, 1:-1]) + abs(ext[:, 1:-1, :-2]) \
                + abs(ext[:, 1:-1, 2:]) + 4 * abs(ext[:, 1:-1, 1:-1])
            error = abs(gathered - reference).max()
            laplacian_ok = bool(numpy.all(abs(gathered - reference) <= 8 * numpy.finfo(float).eps * terms))
            print(f"f2py driver: {grid.size} ranks as {grid.npolar} x {grid.nazimuth}: Laplacian error {error:.1e}, "
                  f"Fortran global sums {numpy.array2string(sums, precision=6)} "
                  f"{'match' if sums_ok else 'DIFFER from'} mpisphere's")
        else:
            laplacian_ok = True
        ok = bool(total.forward(numpy.array([float(not (sums_ok and laplacian_ok))]))[0] == 0)
        if grid.rank == 0:
            print("f2py driver: OK" if ok else "f2py driver: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
