"""mpisphere demo: a distributed shallow-water model, and checks of the transforms it is built on.

    mpiexec -n 4 python -m mpi4py scripts/demo.py            # Galewsky's unstable jet on a 2 x 2 grid of ranks
    mpiexec -n 4 python -m mpi4py scripts/demo.py --check    # also: SHT round trip, analytic coefficients, dot tests
    mpiexec -n 4 python -m mpi4py scripts/demo.py --device gpu
    mpiexec -n 4 python -m mpi4py scripts/demo.py --days 3 --restart galewsky-checkpoint   # days 7-9


The main job is Galewsky et al. (2004)'s barotropically unstable mid-latitude
jet, run with mpisphere's distributed shallow-water model (the equations and
time stepping of torch-harmonics' example) on a 64 x 128 Gauss grid (T63)
with a 200 s time step for six model days: the jet's small height bump grows
into the rolled-up vortices of the instability from day four on (with a
300 s step the model, like torch-harmonics', blows up: third-order
Adams-Bashforth against the fastest gravity waves). Rank 0 prints one line per model day (time,
mass, total energy, largest relative vorticity, all reduced over the grid)
and at the end writes a picture of the vorticity, ``galewsky_vorticity.png``
in the current folder (matplotlib is optional: ``pip install '.[plot]'``
in the clone; without it the run completes and says so).

With the ``io`` extra (Zarr; ``pip install '.[io]'``), every rank writes
its own part of the vorticity once a model day to ``galewsky.zarr`` (a
Zarr store that ``xarray.open_zarr`` opens on a laptop) and of the model
state, with the time scheme's history, to the checkpoint
``galewsky-checkpoint`` at the end; ``--restart PATH`` continues a run from
a checkpoint (on any number of ranks) exactly where it stopped, appending
to the same output.

``--check`` first runs the transform checks of a 361 x 720 (0.5 degree) field:
the round-trip error, the error of the coefficients against analytic
harmonics, the dot tests of both transforms and their time per call.
"""

import argparse
import math
import sys
import time

import numpy
from mpi4py import MPI

import mpisphere
from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, ProcessGrid, dottest
from mpisphere.examples import AdamsBashforthHistory, ShallowWaterSolver
from mpisphere.io.zarr_files import import_zarr
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


def analytic_field(theta, phi, lmax):
    """The sum of the MODES below degree ``lmax`` on the grid, and their coefficients."""
    field = numpy.zeros((len(theta), len(phi)))
    coeffs = {}
    for l, m, c in (mode for mode in MODES if mode[0] < lmax):
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


def sht_checks(grid, args, xp):
    """The transform checks of ``--check``; returns True when they pass."""
    nlat, nlon = args.check_nlat, args.check_nlon
    # An equiangular grid with the poles integrates degree-(nlat) products exactly, so
    # lmax = (nlat + 1) // 2 makes the forward transform exact for fields of that band.
    lmax = mmax = (nlat + 1) // 2
    sht = DistributedRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature="equiangular")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature="equiangular")

    theta, _ = latitudes(nlat, "equiangular")
    phi = 2 * math.pi * numpy.arange(nlon) / nlon
    waves, analytic = analytic_field(theta, phi, lmax)
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
        backend = "NumPy (CPU)" if xp is numpy else "CuPy (GPU)"
        print(f"transform checks on {grid.npolar} x {grid.nazimuth} ranks, {args.batch} x {nlat} x {nlon} "
              f"(equiangular, {180 / (nlat - 1):g} degree), lmax = mmax = {lmax}, {backend}")
        print(f"  GPU buffers     {grid.device_buffer_path}")
        print(f"  round trip      max |inverse(forward(f)) - f| / max |f| = {round_trip:.2e}")
        print(f"  coefficients    max error against the analytic harmonics = {coeff_error:.2e}")
        print(f"  dot tests       forward {dot_forward:.1e}, inverse {dot_inverse:.1e} (of the rounding bound)")
        print("  time per transform (median of %d, slowest rank):" % args.repeats)
        for name, ms in times.items():
            print(f"    {name:16s} {ms:8.1f} ms  ({ms / args.batch:.2f} ms per field)")
    return round_trip < 1e-10 and coeff_error < 1e-10


def plot_vorticity(vorticity, lats, lons, day, path):
    """Write the vorticity (rank 0's whole field) as a latitude-longitude picture; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    north = lats >= 0  # the jet and its instability live in the northern hemisphere
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=110)
    limit = float(abs(vorticity).max())
    image = ax.pcolormesh(numpy.degrees(lons), numpy.degrees(lats[north]), vorticity[north] * 1e5, cmap="RdBu_r",
                          vmin=-limit * 1e5, vmax=limit * 1e5, shading="nearest")
    ax.set_xlabel("longitude (degrees)")
    ax.set_ylabel("latitude (degrees)")
    ax.set_title(f"Galewsky's unstable jet after {day:g} days: relative vorticity (1e-5 / s), mpisphere")
    fig.colorbar(image, ax=ax, shrink=0.9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def zarr_missing():
    """Why the run writes no output: None when Zarr is installed."""
    try:
        import_zarr()
    except ImportError as exc:
        return str(exc)
    return None


def run_galewsky(grid, args):
    swe = ShallowWaterSolver(grid, args.nlat, args.nlon, dt=args.dt, quadrature="legendre-gauss")
    steps_per_day = int(round(86400.0 / args.dt))
    io_missing = zarr_missing() if (args.output or args.checkpoint or args.restart) else None
    if args.restart and io_missing:
        raise SystemExit(f"--restart needs mpisphere.io: {io_missing}")
    if args.restart:
        uspec, history = swe.load(args.restart)
    else:
        uspec, history = swe.galewsky_initial_condition(), AdamsBashforthHistory()
    first_day = history.step / steps_per_day
    output = None
    if args.output and not io_missing:
        from mpisphere.io import FieldStore
        output = FieldStore(args.output, grid, mode="a" if args.restart else "w")
    first = swe.diagnostics(uspec)
    if grid.rank == 0:
        print(f"mpisphere {mpisphere.__version__}: shallow-water model, Galewsky's unstable jet")
        print(f"  grid            {grid.npolar} x {grid.nazimuth} ranks, {args.nlat} x {args.nlon} Gauss grid, "
              f"lmax = mmax = {swe.lmax}, dt = {args.dt:g} s ({steps_per_day} steps a day)")
        if args.restart:
            print(f"  restarted       from {args.restart} at day {first_day:g} (step {history.step})")
        print(f"  {'day':>5} {'mass (m^3)':>16} {'energy':>16} {'max |vorticity|':>16} {'wall':>8}")
        print(f"  {first_day:5.1f} {first['mass']:16.9e} {first['energy']:16.9e} {first['max_vorticity']:16.6e} "
              f"{0:7.1f}s")

    def write_vorticity(day):
        if output is not None:
            output.write_tiles("vorticity", swe.spec2grid(uspec[1])[None], args.nlat, args.nlon, "legendre-gauss",
                               dims=("time",), coords={"time": ([day], {"long_name": "model time in days"})},
                               attrs={"units": "s-1", "long_name": "relative vorticity"}, append=day > 0)

    if not args.restart:
        write_vorticity(0.0)
    start = time.perf_counter()
    for day in range(1, args.days + 1):
        uspec = swe.timestep(uspec, steps_per_day, history)
        d = swe.diagnostics(uspec)
        wall = grid.cart.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if not all(math.isfinite(v) for v in d.values()):
            raise FloatingPointError(f"the run blew up on day {day}: {d} (time step {args.dt} s too long?)")
        write_vorticity(first_day + day)
        if grid.rank == 0:
            print(f"  {first_day + day:5.1f} {d['mass']:16.9e} {d['energy']:16.9e} {d['max_vorticity']:16.6e} "
                  f"{wall:7.1f}s", flush=True)
    if args.checkpoint and not io_missing:
        swe.save(args.checkpoint, uspec, history)
    vorticity = grid.gather(swe.spec2grid(uspec[1]))
    lats = grid.gather(numpy.broadcast_to(swe.lats[:, None], swe.sht.tile_shape).copy())
    lons = grid.gather(numpy.broadcast_to(swe.lons[None, :], swe.sht.tile_shape).copy())
    if grid.rank == 0:
        drift_mass = d["mass"] / first["mass"] - 1
        drift_energy = d["energy"] / first["energy"] - 1
        print(f"  after {args.days} days: mass changed by {drift_mass:.1e}, energy by {drift_energy:.1e} "
              f"(relative); {steps_per_day * args.days / (time.perf_counter() - start):.0f} steps a second")
        if io_missing:
            print(f"  output          none: {io_missing}")
        else:
            if output is not None:
                print(f"  output          {args.output} (vorticity once a model day; xarray.open_zarr opens it)")
            if args.checkpoint:
                print(f"  checkpoint      {args.checkpoint} (day {history.step / steps_per_day:g}; continue with "
                      f"--restart {args.checkpoint})")
        if not args.png:
            pass
        elif plot_vorticity(vorticity, lats[:, 0], lons[0], history.step / steps_per_day, args.png):
            print(f"  picture         {args.png}")
        else:
            print("  picture         matplotlib is not installed: pip install '.[plot]' in the mpisphere "
                  "clone and run again for the picture")
    return swe


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=64, help="Gauss latitudes of the model (default 64)")
    parser.add_argument("--nlon", type=int, default=128)
    parser.add_argument("--dt", type=float, default=200.0, help="time step, seconds (default 200)")
    parser.add_argument("--days", type=int, default=6)
    parser.add_argument("--png", default="galewsky_vorticity.png", help="picture to write ('' for none)")
    parser.add_argument("--output", default="galewsky.zarr",
                        help="Zarr store of the vorticity once a model day ('' for none; needs the io extra)")
    parser.add_argument("--checkpoint", default="galewsky-checkpoint",
                        help="checkpoint written at the end ('' for none; needs the io extra)")
    parser.add_argument("--restart", default=None, metavar="PATH",
                        help="continue from this checkpoint (--days more days), appending to --output")
    parser.add_argument("--check", action="store_true", help="run the transform checks first")
    parser.add_argument("--check-nlat", type=int, default=361)
    parser.add_argument("--check-nlon", type=int, default=720)
    parser.add_argument("--batch", type=int, default=8, help="fields transformed together in the checks")
    parser.add_argument("--npolar", type=int, default=None, help="polar ranks (default: MPI.Compute_dims)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="arrays of the checks")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    xp = numpy
    if args.device == "gpu":
        mpisphere.select_device(world)
        import cupy as xp  # noqa: N813 -- same interface as NumPy
    ok = True
    with ProcessGrid(world, npolar=args.npolar) as grid:
        if args.check:
            ok = sht_checks(grid, args, xp)
        run_galewsky(grid, args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
