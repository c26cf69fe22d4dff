"""Transforms on octahedral grids against ducc0's serial transform and against the regular Gaussian transform.

Two tables, each timed in alternation (rounds, medians of the slowest rank):

* one rank: mpisphere's analysis and synthesis on ``O<n>`` against ducc0's
  ``adjoint_synthesis``/``synthesis`` with the same ring geometry, one
  thread, the same fields (``--fields``);
* every grid of the run (1x2 and 2x1 on 2 ranks, 2x2 on 4): the octahedral
  transform against the regular Gaussian transform of the same ``lmax``
  (``2 n`` Gaussian latitudes, ``4 n`` longitudes), as time and as time per
  point.

    python -m mpi4py scripts/bench_reduced.py --n 320 --fields 8
    mpiexec -n 2 python -m mpi4py scripts/bench_reduced.py --n 320 --fields 8 --out docs/results/reduced-2.json
"""

import argparse
import resource

import numpy
from mpi4py import MPI

import mpisphere as ms
from benchtools import grid_shapes, measure_rounds, write_results


def ducc0_rows(comm, rings, fields, lmax, repeats, warmup):
    """One rank: mpisphere's transforms against ducc0's with the same geometry."""
    import ducc0
    grid = ms.ProcessGrid(MPI.COMM_SELF)
    analysis, synthesis = ms.DistributedReducedRealSHT(grid, rings), ms.DistributedInverseReducedRealSHT(grid, rings)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((fields, rings.npoints))
    c = analysis.forward(x)
    top = lmax - 1
    geometry = dict(theta=rings.theta, lmax=top, mmax=top, nphi=rings.nlon.astype(numpy.uintp), phi0=rings.phi0,
                    ringstart=rings.offsets[:-1].astype(numpy.uintp), spin=0, nthreads=1)
    weights = numpy.repeat(2 * numpy.pi * rings.weights / rings.nlon, rings.nlon)
    alm = ducc0.sht.adjoint_synthesis(map=(x * weights)[:, None], **geometry)
    coefficients, field = numpy.empty_like(c), numpy.empty_like(x)
    times = measure_rounds(MPI.COMM_SELF, {
        "mpisphere analysis": lambda: analysis.forward(x, out=coefficients),
        "ducc0 adjoint_synthesis": lambda: ducc0.sht.adjoint_synthesis(map=(x * weights)[:, None], **geometry),
        "mpisphere synthesis": lambda: synthesis.forward(c, out=field),
        "ducc0 synthesis": lambda: ducc0.sht.synthesis(alm=alm, **geometry),
    }, repeats, warmup)
    rows = []
    for ours, theirs in (("mpisphere analysis", "ducc0 adjoint_synthesis"), ("mpisphere synthesis", "ducc0 synthesis")):
        rows.append({"grid": "1x1", "case": ours, "reference": theirs, "ms": float(numpy.median(times[ours])),
                     "reference_ms": float(numpy.median(times[theirs])),
                     "ratio": float(numpy.median(times[ours] / times[theirs])),
                     "legendre": analysis.legendre_for(fields)[0]})
    grid.free()
    return rows


def regular_rows(comm, n, fields, shapes, repeats, warmup):
    """Each grid: the octahedral transform against the regular Gaussian one of the same lmax."""
    rows = []
    rings = ms.RingGeometry.octahedral(n)
    nlat, nlon = 2 * n, 4 * n
    for shape in shapes:
        grid = ms.ProcessGrid(comm, *shape)
        reduced = [ms.DistributedReducedRealSHT(grid, rings), ms.DistributedInverseReducedRealSHT(grid, rings)]
        regular = [ms.DistributedRealSHT(grid, nlat, nlon, lmax=n, mmax=n, quadrature="legendre-gauss"),
                   ms.DistributedInverseRealSHT(grid, nlat, nlon, lmax=n, mmax=n, quadrature="legendre-gauss")]
        rng = numpy.random.default_rng(grid.rank)
        x_red = rng.standard_normal(reduced[0].domain_shape((fields,)))
        x_reg = rng.standard_normal(regular[0].domain_shape((fields,)))
        c = reduced[0].forward(x_red)
        times = measure_rounds(comm, {
            "reduced analysis": lambda: reduced[0].forward(x_red),
            "regular analysis": lambda: regular[0].forward(x_reg),
            "reduced synthesis": lambda: reduced[1].forward(c),
            "regular synthesis": lambda: regular[1].forward(c),
        }, repeats, warmup)
        per_point = (nlat * nlon) / rings.npoints
        for kind in ("analysis", "synthesis"):
            ratio = times[f"reduced {kind}"] / times[f"regular {kind}"]
            rows.append({"grid": f"{shape[0]}x{shape[1]}", "case": f"O{n} {kind}", "reference": f"{nlat} x {nlon} "
                         f"Gaussian {kind}", "ms": float(numpy.median(times[f"reduced {kind}"])),
                         "reference_ms": float(numpy.median(times[f"regular {kind}"])),
                         "ratio": float(numpy.median(ratio)),
                         "ratio_per_point": float(numpy.median(ratio) * per_point),
                         "legendre": reduced[0].legendre_for(fields)[0]})
        grid.free()
    return rows


def memory_rows(comm, n, fields, shapes, legendre):
    """Each grid: peak resident memory of building and running a forward and an inverse transform on O<n>,
    against :func:`mpisphere.sht.costs.ring_memory` (run one grid per launch: the peak does not come down)."""
    from mpisphere.sht.costs import ring_memory
    rows = []
    rings = ms.RingGeometry.octahedral(n)
    for shape in shapes:
        grid = ms.ProcessGrid(comm, *shape)
        rng = numpy.random.default_rng(grid.rank)
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        analysis = ms.DistributedReducedRealSHT(grid, rings, legendre=legendre)
        synthesis = ms.DistributedInverseReducedRealSHT(grid, rings, legendre=legendre)
        x = rng.standard_normal(analysis.domain_shape((fields,)))
        c = analysis.forward(x)
        y = synthesis.forward(c)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        caller = x.nbytes + c.nbytes + y.nbytes
        model = ring_memory(rings, analysis.lmax, analysis.mmax, *shape, batch=fields, legendre=analysis.legendre)
        measured = comm.gather(peak - baseline - caller, root=0)
        tables = comm.gather(analysis.table_bytes(), root=0)
        if comm.rank == 0:
            for rank, (used, held) in enumerate(zip(measured, tables)):
                rows.append({"grid": f"{shape[0]}x{shape[1]}", "rank": rank, "legendre": analysis.legendre,
                             "measured_mb": used / 2**20, "model_mb": model[rank]["total"] / 2**20,
                             "tables_mb": held / 2**20, "model_tables_mb": model[rank]["tables"] / 2**20})
        grid.free()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=320, help="octahedral O<n> (lmax n)")
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--grids", default=None, help="e.g. 1x2,2x1 (default: by the number of ranks)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here (and a .txt table beside it)")
    parser.add_argument("--memory", default=None, metavar="LEGENDRE",
                        help="measure the peak memory with this Legendre strategy instead of timing")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rings = ms.RingGeometry.octahedral(args.n)
    if args.memory:
        rows = memory_rows(comm, args.n, args.fields, grid_shapes(args.grids, comm.size)[:1], args.memory)
        if comm.rank == 0:
            lines = [f"O{args.n}, {args.fields} fields, float64: peak resident memory of building and running a "
                     "forward and an inverse transform, less the process before them and the caller's arrays",
                     f"{'grid':5} {'rank':>4} {'legendre':15} {'measured MB':>12} {'model MB':>9} {'tables MB':>10} "
                     f"{'model tables':>12}"]
            lines += [f"{r['grid']:5} {r['rank']:4d} {r['legendre']:15} {r['measured_mb']:12.1f} {r['model_mb']:9.1f} "
                      f"{r['tables_mb']:10.1f} {r['model_tables_mb']:12.1f}" for r in rows]
            print("\n".join(lines))
            if args.out:
                write_results(args.out, {"n": args.n, "fields": args.fields, "ranks": comm.size}, rows)
                with open(args.out.removesuffix(".json") + ".txt", "w") as f:
                    f.write("\n".join(lines) + "\n")
        return
    rows = []
    if comm.size == 1:
        rows += ducc0_rows(comm, rings, args.fields, rings.lmax, args.repeats, args.warmup)
    rows += regular_rows(comm, args.n, args.fields, grid_shapes(args.grids, comm.size), args.repeats, args.warmup)
    if comm.rank == 0:
        lines = [f"O{args.n} ({rings.npoints} points, lmax {rings.lmax}), {args.fields} fields, float64, medians of "
                 f"{args.repeats} rounds in alternation, slowest rank",
                 f"{'grid':5} {'case':22} {'ms':>9} {'reference':32} {'ms':>9} {'ratio':>6} {'per point':>9}"]
        for r in rows:
            per_point = f"{r['ratio_per_point']:9.2f}" if "ratio_per_point" in r else " " * 9
            lines.append(f"{r['grid']:5} {r['case']:22} {r['ms']:9.1f} {r['reference']:32} {r['reference_ms']:9.1f} "
                         f"{r['ratio']:6.2f} {per_point}")
        print("\n".join(lines))
        if args.out:
            write_results(args.out, {"n": args.n, "fields": args.fields, "repeats": args.repeats,
                                     "ranks": comm.size}, rows)
            with open(args.out.removesuffix(".json") + ".txt", "w") as f:
                f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
