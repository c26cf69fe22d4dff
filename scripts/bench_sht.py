"""Time the distributed SHT (forward, inverse, both adjoints), and ducc0 on one rank.

    mpiexec -n 1 python scripts/bench_sht.py        # 1 x 1, plus ducc0 when installed (extra "bench")
    mpiexec -n 2 python scripts/bench_sht.py        # 1 x 2 and 2 x 1
    mpiexec -n 4 python scripts/bench_sht.py        # 2 x 2
    mpiexec -n 1 python scripts/bench_sht.py --large --json sht.json

Reference problem: 32 real fields of 361 x 720 (0.5 degree, equiangular),
float64, default truncation (lmax = 361, mmax = 361). Each figure is the
median over repetitions of the slowest rank's time (barrier-aligned), with
min..max. On one rank, ducc0's analysis_2d / synthesis_2d run in the same
process on the same fields, one thread, looping over the batch (ducc0 takes
one map per call); on the equiangular ("CC") grid ducc0 analyses up to
lmax = nlat - 2, so it computes slightly fewer coefficients than the
torch-harmonics truncation mpisphere uses. Memory: Legendre table bytes held
by each rank (its own orders only) and the process's peak resident size.
"""

import argparse
import json
import resource
import sys
import time

import numpy
from mpi4py import MPI

import mpisphere
from benchtools import measure
from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, ProcessGrid


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_grid(grid, args, xp, sync):
    nlat, nlon, batch = args.nlat, args.nlon, args.batch
    dtype = numpy.dtype(args.dtype)
    start = time.perf_counter()
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature=args.quadrature, dtype=dtype)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature=args.quadrature, dtype=dtype)
    setup = grid.cart.allreduce(time.perf_counter() - start, op=MPI.MAX)
    rng = numpy.random.default_rng(grid.rank)
    x = xp.asarray(rng.standard_normal((batch,) + sht.tile_shape).astype(dtype))
    c = sht.forward(x)
    c_out, x_out = xp.empty_like(c), xp.empty_like(x)
    cases = [("forward", lambda: sht.forward(x)), ("forward out=", lambda: sht.forward(x, out=c_out)),
             ("inverse", lambda: isht.forward(c)), ("inverse out=", lambda: isht.forward(c, out=x_out)),
             ("forward adjoint", lambda: sht.adjoint(c)), ("inverse adjoint", lambda: isht.adjoint(x))]
    rows = []
    tables = grid.cart.allreduce(sht.table_bytes() + isht.table_bytes(), op=MPI.MAX)
    for name, fn in cases:
        median, low, high = measure(grid.cart, fn, args.repeats, args.warmup, sync)
        rss = grid.cart.allreduce(peak_rss_mb(), op=MPI.MAX)
        rows.append({"grid": f"{grid.npolar}x{grid.nazimuth}", "case": name, "median_ms": median, "min_ms": low,
                     "max_ms": high, "table_mb_per_rank": tables / 2 ** 20, "peak_rss_mb": rss,
                     "setup_s": setup})
        if grid.rank == 0:
            print(f"{rows[-1]['grid']:>4} {name:18s} {median:9.1f} ms [{low:8.1f}..{high:8.1f}]  tables "
                  f"{tables / 2 ** 20:7.1f} MB/rank  peak RSS {rss:7.0f} MB  (set-up {setup:.1f} s)", flush=True)
    return rows


def bench_ducc0(args):
    try:
        import ducc0
    except ImportError:
        print("ducc0 not installed (pip install '.[bench]'): no comparison")
        return []
    nlat, nlon, batch = args.nlat, args.nlon, args.batch
    lmax = nlat - 2 if args.quadrature == "equiangular" else nlat - 1
    geometry = {"equiangular": "CC", "legendre-gauss": "GL"}.get(args.quadrature)
    if geometry is None:
        print(f"ducc0 has no {args.quadrature} geometry: no comparison")
        return []
    dtype = numpy.dtype(args.dtype)
    maps = numpy.random.default_rng(0).standard_normal((batch, 1, nlat, nlon)).astype(dtype)
    nalm = (lmax + 1) * (lmax + 2) // 2
    alm = numpy.zeros((batch, 1, nalm), dtype=numpy.result_type(dtype, numpy.complex64))

    def analysis():
        for b in range(batch):
            ducc0.sht.experimental.analysis_2d(map=maps[b], alm=alm[b], spin=0, lmax=lmax, geometry=geometry,
                                               nthreads=1)

    def synthesis():
        for b in range(batch):
            ducc0.sht.experimental.synthesis_2d(alm=alm[b], map=maps[b], spin=0, lmax=lmax, geometry=geometry,
                                                nthreads=1)
    rows = []
    for name, fn in (("ducc0 analysis_2d", analysis), ("ducc0 synthesis_2d", synthesis)):
        median, low, high = measure(MPI.COMM_SELF, fn, args.repeats, args.warmup)
        rows.append({"grid": "1x1", "case": name, "median_ms": median, "min_ms": low, "max_ms": high,
                     "lmax": lmax, "ducc0": ducc0.__version__})
        print(f" 1x1 {name:18s} {median:9.1f} ms [{low:8.1f}..{high:8.1f}]  lmax = mmax = {lmax}, one thread, "
              f"ducc0 {ducc0.__version__}", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--nlon", type=int, default=720)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--large", action="store_true", help="721 x 1440 (0.25 degree)")
    parser.add_argument("--quadrature", default="equiangular")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--grids", default=None, help="comma-separated PxA (default: by the number of ranks)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--no-ducc0", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.large:
        args.nlat, args.nlon = 721, 1440
    world = MPI.COMM_WORLD
    xp, sync = numpy, None
    if args.device == "gpu":
        mpisphere.select_device(world)
        import cupy as xp  # noqa: N813
        sync = lambda: xp.cuda.get_current_stream().synchronize()  # noqa: E731
    size = world.Get_size()
    if args.grids:
        shapes = [tuple(int(v) for v in g.split("x")) for g in args.grids.split(",")]
    else:
        shapes = {1: [(1, 1)], 2: [(1, 2), (2, 1)], 4: [(2, 2)]}.get(size, [tuple(MPI.Compute_dims(size, 2))])
    if world.Get_rank() == 0:
        print(f"mpisphere {mpisphere.__version__}, numpy {numpy.__version__}, {size} rank(s), {args.batch} x "
              f"{args.nlat} x {args.nlon} {args.quadrature} {args.dtype}, {args.device}, {args.repeats} repeats")
    rows = []
    for npolar, nazimuth in shapes:
        with ProcessGrid(world, npolar, nazimuth) as grid:
            rows += bench_grid(grid, args, xp, sync)
    if size == 1 and not args.no_ducc0 and args.device == "cpu":
        rows += bench_ducc0(args)
        medians = {r["case"]: r["median_ms"] for r in rows}
        if "ducc0 analysis_2d" in medians:
            print(f"ratios: forward / analysis_2d = {medians['forward'] / medians['ducc0 analysis_2d']:.2f}, "
                  f"inverse / synthesis_2d = {medians['inverse'] / medians['ducc0 synthesis_2d']:.2f}")
    if args.json and world.Get_rank() == 0:
        meta = {"ranks": size, "batch": args.batch, "nlat": args.nlat, "nlon": args.nlon, "dtype": args.dtype,
                "quadrature": args.quadrature, "device": args.device, "numpy": numpy.__version__,
                "mpisphere": mpisphere.__version__}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
