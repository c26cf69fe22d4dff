"""mpisphere demo: a distributed spherical harmonic transform on a 2-D grid of ranks.

    mpiexec -n 4 python -m mpi4py scripts/demo.py                # NumPy, 2 x 2 grid, 361 x 720 (0.5 degree)
    mpiexec -n 4 python -m mpi4py scripts/demo.py --device gpu   # CuPy, one GPU per rank (shared if fewer)

Builds a field from a few spherical harmonics (closed forms, independent of
mpisphere's Legendre code) plus a zonal jet, scatters it over the grid, and
runs the forward and inverse transforms and both adjoints. Rank 0 prints the
grid, the backend and GPU buffer path, the round-trip error, the error of the
coefficients against the analytic ones, the dot-test errors and the time per
transform (median over repetitions, slowest rank).
"""

import argparse
import math
import sys
import time

import numpy
from mpi4py import MPI

import mpisphere
from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, ProcessGrid, dottest
from mpisphere.partition import chunk_slice
from mpisphere.quadrature import latitudes


def sectoral(l, m, theta):
    """Orthonormal P(l, m) with Condon-Shortley phase for m = l or m = l - 1, in closed form."""
    k = numpy.arange(1, l + 1)
    log_diag = 0.5 * (math.log(1 / (4 * math.pi)) + numpy.sum(numpy.log((2 * k + 1) / (2 * k))))
    with numpy.errstate(divide="ignore"):
        diag = (-1) ** l * numpy.exp(log_diag + l * numpy.log(numpy.sin(theta)))
    if m == l:
        return diag
    # P(l, l-1) from P(l-1, l-1)
    k = numpy.arange(1, l)
    log_prev = 0.5 * (math.log(1 / (4 * math.pi)) + numpy.sum(numpy.log((2 * k + 1) / (2 * k))))
    with numpy.errstate(divide="ignore"):
        prev = (-1) ** (l - 1) * numpy.exp(log_prev + (l - 1) * numpy.log(numpy.sin(theta)))
    return math.sqrt(2 * l + 1) * numpy.cos(theta) * prev


def zonal(l, theta):
    """Orthonormal P(l, 0) = sqrt((2l + 1) / 4 pi) P_l(cos theta)."""
    return math.sqrt((2 * l + 1) / (4 * math.pi)) * numpy.polynomial.legendre.legval(numpy.cos(theta), [0] * l + [1])


# (l, m, coefficient): the field is sum c Y_lm + conj for m > 0
MODES = [(2, 0, 1.0), (10, 0, -0.4), (5, 5, 0.5 - 0.3j), (40, 40, 0.2 + 0.1j), (30, 29, -0.3j), (90, 89, 0.05)]


def analytic_field(theta, phi):
    field = numpy.zeros((len(theta), len(phi)))
    coeffs = {}
    for l, m, c in MODES:
        radial = zonal(l, theta) if m == 0 else sectoral(l, m, theta)
        wave = numpy.exp(1j * m * phi)
        term = (c * radial[:, None] * wave[None, :]).real
        field += term if m == 0 else 2 * term
        coeffs[(l, m)] = c
    return field, coeffs


def zonal_jet(theta, nlon):
    """A westerly jet at 45 degrees north, about 10 degrees wide."""
    lat = 90 - numpy.degrees(theta)
    return numpy.repeat((30 * numpy.exp(-((lat - 45) / 10) ** 2))[:, None], nlon, axis=1)


def timed(comm, fn, repeats):
    """Median over repeats of the slowest rank's time, in milliseconds."""
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return 1e3 * float(numpy.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--nlon", type=int, default=720)
    parser.add_argument("--batch", type=int, default=8, help="fields transformed together")
    parser.add_argument("--npolar", type=int, default=None, help="polar ranks (default: MPI.Compute_dims)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    xp = numpy
    if args.device == "gpu":
        device = mpisphere.select_device(world)
        import cupy as xp  # noqa: N813 -- same interface as NumPy
    grid = ProcessGrid(world, npolar=args.npolar)
    nlat, nlon = args.nlat, args.nlon
    # An equiangular grid with the poles integrates degree-(nlat) products exactly, so
    # lmax = (nlat + 1) // 2 makes the forward transform exact for fields of that band.
    lmax = mmax = (nlat + 1) // 2
    sht = DistributedRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature="equiangular")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature="equiangular")

    theta, _ = latitudes(nlat, "equiangular")
    phi = 2 * math.pi * numpy.arange(nlon) / nlon
    waves, analytic = analytic_field(theta, phi)
    lat, lon = grid.local_slices(nlat, nlon)
    waves_tile = xp.asarray(waves[lat, lon])
    # the jet, band-limited to the transform's truncation so that the round trip is exact
    jet_tile = isht.forward(sht.forward(xp.asarray(zonal_jet(theta, nlon)[lat, lon])))
    fields = xp.stack([waves_tile + (0.5 + 0.1 * i) * jet_tile for i in range(args.batch)])

    # coefficients of the harmonic part against the analytic ones (every entry, every rank)
    expected = numpy.zeros((lmax, mmax), complex)
    for (l, m), c in analytic.items():
        expected[l, m] = c
    block = expected[chunk_slice(lmax, grid.npolar, grid.polar_rank), chunk_slice(mmax, grid.nazimuth,
                                                                                   grid.azimuth_rank)]
    got = sht.forward(waves_tile)
    coeff_error = grid.cart.allreduce(float(abs(got - xp.asarray(block)).max()), op=MPI.MAX)

    coeffs = sht.forward(fields)
    back = isht.forward(coeffs)
    scale = grid.cart.allreduce(float(abs(fields).max()), op=MPI.MAX)
    round_trip = grid.cart.allreduce(float(abs(back - fields).max()), op=MPI.MAX) / scale

    rng = numpy.random.default_rng([1, grid.rank])
    x = xp.asarray(rng.standard_normal(fields.shape))
    y = xp.asarray(rng.standard_normal(coeffs.shape) + 1j * rng.standard_normal(coeffs.shape))
    dot_forward = dottest(sht, x, y, rtol=1e-10)
    dot_inverse = dottest(isht, y, x, rtol=1e-10)

    times = {
        "forward": timed(grid.cart, lambda: sht.forward(fields), args.repeats),
        "inverse": timed(grid.cart, lambda: isht.forward(coeffs), args.repeats),
        "forward adjoint": timed(grid.cart, lambda: sht.adjoint(coeffs), args.repeats),
        "inverse adjoint": timed(grid.cart, lambda: isht.adjoint(fields), args.repeats),
    }

    if grid.rank == 0:
        backend = "NumPy (CPU)" if xp is numpy else f"CuPy (GPU {device} on rank 0)"
        print(f"mpisphere {mpisphere.__version__} demo")
        print(f"  grid            {grid.npolar} x {grid.nazimuth} ranks (polar x azimuth), "
              f"{MPI.COMM_WORLD.Get_size()} processes")
        print(f"  field           {args.batch} x {nlat} x {nlon} (equiangular, "
              f"{180 / (nlat - 1):g} degree), lmax = mmax = {lmax}")
        print(f"  rank 0 tile     {tuple(fields.shape)}, coefficient block {tuple(coeffs.shape)}")
        print(f"  backend         {backend}")
        print(f"  GPU buffers     {grid.device_buffer_path}")
        print(f"  round trip      max |inverse(forward(f)) - f| / max |f| = {round_trip:.2e}")
        print(f"  coefficients    max error against the analytic harmonics = {coeff_error:.2e}")
        print(f"  dot tests       forward {dot_forward:.1e}, inverse {dot_inverse:.1e} (relative)")
        print("  time per transform (median of %d, slowest rank):" % args.repeats)
        for name, ms in times.items():
            print(f"    {name:16s} {ms:8.1f} ms  ({ms / args.batch:.2f} ms per field)")
    ok = round_trip < 1e-10 and coeff_error < 1e-10
    grid.free()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
