"""Time the distributed SHT (forward, inverse, both adjoints), and ducc0 on one rank.

    mpiexec -n 1 python scripts/bench_sht.py        # 1 x 1, plus ducc0 when installed (extra "bench")
    mpiexec -n 2 python scripts/bench_sht.py        # 1 x 2 and 2 x 1
    mpiexec -n 4 python scripts/bench_sht.py        # 2 x 2
    mpiexec -n 1 python scripts/bench_sht.py --large --json sht.json
    mpiexec -n 4 python scripts/bench_sht.py --vector-only   # vector against scalar transforms
    mpiexec -n 4 python scripts/bench_sht.py --km            # 2049 x 4096, lmax 1025, table-free, vs ducc0
    python scripts/bench_sht.py --batch-sweep 1,2,4,8,16,32,64 --lmax 361   # auto per batch against ducc0

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
import gc
import resource
import sys
import time

import numpy
from mpi4py import MPI

import mpisphere
from benchtools import grid_shapes, measure, measure_rounds, write_results
from mpisphere.sht import costs
from mpisphere import (DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedRealVectorSHT, ProcessGrid)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_grid(grid, args, xp, sync):
    nlat, nlon, batch = args.nlat, args.nlon, args.batch
    dtype = numpy.dtype(args.dtype)
    start = time.perf_counter()
    options = dict(quadrature=args.quadrature, dtype=dtype, fft=args.fft, orders=args.orders,
                   legendre=args.legendre or "auto")
    sht = DistributedRealSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
    setup = grid.cart.allreduce(time.perf_counter() - start, op=MPI.MAX)
    rng = numpy.random.default_rng(grid.rank)
    x = xp.asarray(rng.standard_normal((batch,) + sht.tile_shape).astype(dtype))
    c = sht.forward(x)
    c_out, x_out = xp.empty_like(c), xp.empty_like(x)
    cases = [("forward", lambda: sht.forward(x)), ("forward out=", lambda: sht.forward(x, out=c_out)),
             ("inverse", lambda: isht.forward(c)), ("inverse out=", lambda: isht.forward(c, out=x_out)),
             ("forward adjoint", lambda: sht.adjoint(c)), ("inverse adjoint", lambda: isht.adjoint(x))]
    if args.overlap:  # the same transforms in two chunks whose transposes travel while the other computes
        osht = DistributedRealSHT(grid, nlat, nlon, args.lmax, args.lmax, overlap=True, **options)
        oisht = DistributedInverseRealSHT(grid, nlat, nlon, args.lmax, args.lmax, overlap=True, **options)
        cases += [("forward out= overlap", lambda: osht.forward(x, out=c_out)),
                  ("inverse out= overlap", lambda: oisht.forward(c, out=x_out))]
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


def bench_vector_grid(grid, args, xp, sync):
    """Vector transforms of ``batch`` winds against scalar transforms of ``batch`` fields, in the same run."""
    nlat, nlon, batch = args.nlat, args.nlon, args.batch
    dtype = numpy.dtype(args.dtype)
    options = dict(quadrature=args.quadrature, dtype=dtype, fft=args.fft, orders=args.orders,
                   legendre=args.legendre or "auto")
    sht = DistributedRealSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
    ivsht = DistributedInverseRealVectorSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
    rng = numpy.random.default_rng(grid.rank)
    wind = xp.asarray(rng.standard_normal((batch, 2) + sht.tile_shape).astype(dtype))
    scalar = wind[:, 0].copy()
    cs, cv = sht.forward(scalar), vsht.forward(wind)
    out = {"scalar": (xp.empty_like(cs), xp.empty_like(scalar)), "vector": (xp.empty_like(cv), xp.empty_like(wind))}
    alternated = {"scalar forward": lambda: sht.forward(scalar, out=out["scalar"][0]),
                  "vector forward": lambda: vsht.forward(wind, out=out["vector"][0]),
                  "scalar inverse": lambda: isht.forward(cs, out=out["scalar"][1]),
                  "vector inverse": lambda: ivsht.forward(cv, out=out["vector"][1])}
    rounds = measure_rounds(grid.cart, alternated, args.repeats, args.warmup, sync)
    timed = {name: (float(numpy.median(t)), float(t.min()), float(t.max())) for name, t in rounds.items()}
    for name, fn in (("vector forward adjoint", lambda: vsht.adjoint(cv)),
                     ("vector inverse adjoint", lambda: ivsht.adjoint(wind))):
        timed[name] = measure(grid.cart, fn, args.repeats, args.warmup, sync)
    label = f"{grid.npolar}x{grid.nazimuth}"
    rows = []
    for name, (median, low, high) in timed.items():
        rows.append({"grid": label, "case": name, "median_ms": median, "min_ms": low, "max_ms": high})
        if grid.rank == 0:
            what = "winds" if name.startswith("vector") else "fields"
            print(f"{label:>4} {name:24s} {median:9.1f} ms [{low:8.1f}..{high:8.1f}]  ({batch} {what}"
                  f"{'' if 'adjoint' in name else ', out='})", flush=True)
    ratios = {kind: float(numpy.median(rounds[f"vector {kind}"] / rounds[f"scalar {kind}"]))
              for kind in ("forward", "inverse")}
    rows += [{"grid": label, "case": f"ratio vector/scalar {kind}", "value": value} for kind, value in ratios.items()]
    if grid.rank == 0:
        print(f"{label:>4} ratios (median of per-round ratios, timed in alternation): vector / scalar forward = "
              f"{ratios['forward']:.2f}, inverse = {ratios['inverse']:.2f} (two components: 2.0 is the cost of "
              f"two scalar transforms)", flush=True)
    return rows


def ducc0_batch(function, maps, alm, spin, lmax, geometry):
    """A call of ``ducc0.sht.experimental.<function>`` per field of the batch, one thread.

    ducc0 takes one map per call; the analysis and the adjoint synthesis write
    ``alm``, the synthesis writes ``maps``. (The adjoint synthesis is the
    quadrature sum alone, the yardstick of mpisphere's forward transform,
    which folds the weights into its tables.)
    """
    import ducc0
    run = getattr(ducc0.sht.experimental, function)

    def call():
        for b in range(len(maps)):
            run(map=maps[b], alm=alm[b], spin=spin, lmax=lmax, geometry=geometry, nthreads=1)
    return call


def bench_ducc0(args):
    try:
        import ducc0
    except ImportError:
        print("ducc0 not installed (pip install '.[bench]'): no comparison")
        return []
    nlat, nlon, batch = args.nlat, args.nlon, args.batch
    # ducc0's lmax is the highest degree, mpisphere's the number of degrees: the same coefficients as mpisphere's
    lmax = (args.lmax if args.lmax is not None else
            mpisphere.truncate_sht(nlat, nlon, quadrature=args.quadrature)[0]) - 1
    # ducc0 analyses on the CC grid only up to nlat - 2 (at most: it is exact there)
    lmax_analysis = min(lmax, nlat - 2) if args.quadrature == "equiangular" else lmax
    geometry = {"equiangular": "CC", "legendre-gauss": "GL"}.get(args.quadrature)
    if geometry is None:
        print(f"ducc0 has no {args.quadrature} geometry: no comparison")
        return []
    dtype = numpy.dtype(args.dtype)
    maps = numpy.random.default_rng(0).standard_normal((batch, 1, nlat, nlon)).astype(dtype)
    nalm = (lmax + 1) * (lmax + 2) // 2
    alm = numpy.zeros((batch, 1, nalm), dtype=numpy.result_type(dtype, numpy.complex64))
    nalm_analysis = (lmax_analysis + 1) * (lmax_analysis + 2) // 2
    alm_analysis = numpy.zeros((batch, 2, nalm_analysis), dtype=alm.dtype)

    vmaps = numpy.random.default_rng(1).standard_normal((batch, 2, nlat, nlon)).astype(dtype)
    valm = numpy.zeros((batch, 2, nalm), dtype=alm.dtype)
    analysis = ducc0_batch("analysis_2d", maps, alm_analysis[:, :1], 0, lmax_analysis, geometry)
    adjoint_synthesis = ducc0_batch("adjoint_synthesis_2d", maps, alm, 0, lmax, geometry)
    synthesis = ducc0_batch("synthesis_2d", maps, alm, 0, lmax, geometry)
    vector_analysis = ducc0_batch("analysis_2d", vmaps, alm_analysis, 1, lmax_analysis, geometry)
    vector_adjoint_synthesis = ducc0_batch("adjoint_synthesis_2d", vmaps, valm, 1, lmax, geometry)
    vector_synthesis = ducc0_batch("synthesis_2d", vmaps, valm, 1, lmax, geometry)
    rows = []
    cases = [("ducc0 analysis_2d", analysis), ("ducc0 adjoint_synthesis_2d", adjoint_synthesis),
             ("ducc0 synthesis_2d", synthesis)]
    if args.vector:
        cases += [("ducc0 analysis_2d spin 1", vector_analysis),
                  ("ducc0 adjoint_synthesis_2d spin 1", vector_adjoint_synthesis),
                  ("ducc0 synthesis_2d spin 1", vector_synthesis)]
    for name, fn in cases:
        median, low, high = measure(MPI.COMM_SELF, fn, args.repeats, args.warmup)
        top = lmax_analysis if name.startswith("ducc0 analysis") else lmax
        rows.append({"grid": "1x1", "case": name, "median_ms": median, "min_ms": low, "max_ms": high,
                     "lmax": top, "ducc0": ducc0.__version__})
        print(f" 1x1 {name:24s} {median:9.1f} ms [{low:8.1f}..{high:8.1f}]  lmax = mmax = {top}, one thread, "
              f"ducc0 {ducc0.__version__}", flush=True)
    return rows


def bench_interleaved(args):
    """One rank: mpisphere and ducc0 timed in alternation, round by round, so drift hits both alike."""
    nlat, nlon, batch = args.nlat, args.nlon, args.batch
    dtype = numpy.dtype(args.dtype)
    geometry = {"equiangular": "CC", "legendre-gauss": "GL"}[args.quadrature]
    with ProcessGrid(MPI.COMM_SELF) as grid:
        options = dict(quadrature=args.quadrature, dtype=dtype, fft=args.fft)
        sht = DistributedRealSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
        isht = DistributedInverseRealSHT(grid, nlat, nlon, args.lmax, args.lmax, **options)
        lmax = sht.lmax - 1
        x = numpy.random.default_rng(0).standard_normal((batch, nlat, nlon)).astype(dtype)
        c = sht.forward(x)
        y = numpy.empty_like(x)
        maps = x.reshape(batch, 1, nlat, nlon)
        alm = numpy.zeros((batch, 1, (lmax + 1) * (lmax + 2) // 2), dtype=sht.cdtype)

        ducc_adjoint_synthesis = ducc0_batch("adjoint_synthesis_2d", maps, alm, 0, lmax, geometry)
        ducc_synthesis = ducc0_batch("synthesis_2d", maps, alm, 0, lmax, geometry)
        cases = {"forward out=": lambda: sht.forward(x, out=c), "ducc0 adjoint_synthesis_2d": ducc_adjoint_synthesis,
                 "inverse out=": lambda: isht.forward(c, out=y), "ducc0 synthesis_2d": ducc_synthesis}
        times = {name: [] for name in cases}
        for fn in cases.values():
            fn()
        for _ in range(args.repeats):
            for name, fn in cases.items():
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
    med = {name: float(numpy.median(t)) for name, t in times.items()}
    for name, value in med.items():
        print(f" 1x1 {name:28s} {value:8.1f} ms (median of {args.repeats} rounds, interleaved)")
    ratio_f = numpy.median(numpy.array(times["forward out="]) / numpy.array(times["ducc0 adjoint_synthesis_2d"]))
    ratio_i = numpy.median(numpy.array(times["inverse out="]) / numpy.array(times["ducc0 synthesis_2d"]))
    print(f"ratios (median of per-round ratios): forward / adjoint_synthesis_2d = {ratio_f:.2f}, "
          f"inverse / synthesis_2d = {ratio_i:.2f}; lmax = mmax = {lmax + 1} degrees, fft {sht.fft}")
    return [{"case": name, "median_ms": value} for name, value in med.items()] + [
        {"case": "ratio forward/adjoint_synthesis_2d", "value": float(ratio_f)},
        {"case": "ratio inverse/synthesis_2d", "value": float(ratio_i)}]


def bench_batch_sweep(args):
    """One rank: per batch, auto (its choice recorded), transpose and table-free against ducc0, in alternation.

    Forward against ``adjoint_synthesis_2d`` (the projection without the
    quadrature weights), and on a Gauss grid also against ``analysis_2d``
    (with them: the same work); inverse against ``synthesis_2d``; with
    ``--vector`` winds against ducc0's spin 1. One thread each, ducc0
    looping over the batch; each ratio is the median of the per-round
    ratios.
    """
    nlat, nlon = args.nlat, args.nlon
    dtype = numpy.dtype(args.dtype)
    geometry = {"equiangular": "CC", "legendre-gauss": "GL"}[args.quadrature]
    rows = []
    with ProcessGrid(MPI.COMM_SELF) as grid:
        options = dict(quadrature=args.quadrature, dtype=dtype, fft=args.fft)
        forward_cls, inverse_cls = ((DistributedRealVectorSHT, DistributedInverseRealVectorSHT) if args.vector else
                                    (DistributedRealSHT, DistributedInverseRealSHT))
        transforms = {name: (forward_cls(grid, nlat, nlon, args.lmax, args.lmax, legendre=name, **options),
                             inverse_cls(grid, nlat, nlon, args.lmax, args.lmax, legendre=name, **options))
                      for name in ("auto", "transpose", "table-free")}
        sht = transforms["auto"][0]
        lmax = sht.lmax - 1
        components = 2 if args.vector else 1
        print(f"{nlat} x {nlon} {args.quadrature} {dtype.name}, {'winds (spin 1)' if args.vector else 'fields'}, "
              f"lmax = mmax = {sht.lmax}, one rank and thread, "
              f"{args.repeats} rounds; machine model: {sht.machine.source}", flush=True)
        for batch in (int(b) for b in args.batch_sweep.split(",")):
            lead = (batch, 2) if args.vector else (batch,)
            x = numpy.random.default_rng(batch).standard_normal(lead + (nlat, nlon)).astype(dtype)
            maps = x.reshape(batch, components, nlat, nlon)
            alm = numpy.zeros((batch, components, (lmax + 1) * (lmax + 2) // 2), dtype=sht.cdtype)
            spin = components - 1
            cases = {"ducc0 forward": ducc0_batch("adjoint_synthesis_2d", maps, alm, spin, lmax, geometry),
                     "ducc0 inverse": ducc0_batch("synthesis_2d", maps, alm, spin, lmax, geometry)}
            if geometry == "GL":  # ducc0's analysis on a Gauss grid: the quadrature sum with its weights, our work
                cases["ducc0 analysis"] = ducc0_batch("analysis_2d", maps, alm, spin, lmax, geometry)
            for name, (forward, inverse) in transforms.items():
                c = forward.forward(x)
                y = numpy.empty_like(x)
                cases[f"{name} forward"] = lambda f=forward, c=c: f.forward(x, out=c)
                cases[f"{name} inverse"] = lambda i=inverse, c=c, y=y: i.forward(c, out=y)
            times = measure_rounds(MPI.COMM_SELF, cases, args.repeats, 1)
            row = {"batch": batch, "auto_forward": sht.legendre_for(batch)[0],
                   "auto_inverse": transforms["auto"][1].legendre_for(batch)[0],
                   "ducc0_forward_ms": float(numpy.median(times["ducc0 forward"])),
                   "ducc0_inverse_ms": float(numpy.median(times["ducc0 inverse"]))}
            for name in transforms:
                for direction in ("forward", "inverse"):
                    ratio = numpy.median(times[f"{name} {direction}"] / times[f"ducc0 {direction}"])
                    row[f"{name}_{direction}_ms"] = float(numpy.median(times[f"{name} {direction}"]))
                    row[f"{name}_{direction}_ratio"] = float(ratio)
            if "ducc0 analysis" in times:
                row["ducc0_analysis_ms"] = float(numpy.median(times["ducc0 analysis"]))
                for name in transforms:
                    row[f"{name}_forward_ratio_analysis"] = float(numpy.median(
                        times[f"{name} forward"] / times["ducc0 analysis"]))
            rows.append(row)
            print(f"{batch:3d} fields: auto ({row['auto_forward']} / {row['auto_inverse']}) "
                  f"{row['auto_forward_ratio']:.2f} / {row['auto_inverse_ratio']:.2f}  transpose "
                  f"{row['transpose_forward_ratio']:.2f} / {row['transpose_inverse_ratio']:.2f}  table-free "
                  f"{row['table-free_forward_ratio']:.2f} / {row['table-free_inverse_ratio']:.2f}  of ducc0 "
                  f"({row['ducc0_forward_ms']:.1f} / {row['ducc0_inverse_ms']:.1f} ms)", flush=True)
            if "ducc0 analysis" in times:
                print(f"      forward / analysis_2d: auto {row['auto_forward_ratio_analysis']:.2f}, transpose "
                      f"{row['transpose_forward_ratio_analysis']:.2f}, table-free "
                      f"{row['table-free_forward_ratio_analysis']:.2f} ({row['ducc0_analysis_ms']:.1f} ms)",
                      flush=True)
            del cases
            for forward, inverse in transforms.values():
                forward.free()
    return rows


def _ducc0_index(lmax_d):
    """Index of ``(l, m)`` in ducc0's triangular alm layout (``mmax = lmax_d``), as a function of both."""
    return lambda l, m: m * (2 * lmax_d + 1 - m) // 2 + l


def km_coefficients(b, lmax):
    """Field ``b``'s band-limited coefficients, the whole ``(lmax, lmax)`` (the same on every rank)."""
    rng = numpy.random.default_rng(100 + b)
    whole = rng.standard_normal((lmax, lmax)) + 1j * rng.standard_normal((lmax, lmax))
    whole *= numpy.tril(numpy.ones((lmax, lmax), dtype=bool))
    whole[:, 0] = whole[:, 0].real
    return whole


def bench_km(args):
    """The kilometre-scale problem: 2049 x 4096 equiangular, lmax = mmax = 1025, 4 fields, forward and inverse.

    Each rank holds only its tile, its coefficient block and no table (legendre="table-free" unless
    --legendre says otherwise). The inverse of band-limited coefficients and the forward of the result
    are checked against ducc0 on the gathered field, one field at a time on rank 0, and timed against
    ducc0 doing the same fields there (one thread) in the same run. Every rank's peak RSS is reported.
    """
    import ducc0
    world = MPI.COMM_WORLD
    size = world.Get_size()
    nlat, nlon, lmax, batch = 2049, 4096, 1025, args.batch
    npolar, nazimuth = (2, 2) if size == 4 else tuple(MPI.Compute_dims(size, 2))
    legendre = args.legendre or "table-free"
    with ProcessGrid(world, npolar, nazimuth) as grid:
        options = dict(quadrature="equiangular", legendre=legendre)
        sht = DistributedRealSHT(grid, nlat, nlon, lmax, lmax, **options)
        isht = DistributedInverseRealSHT(grid, nlat, nlon, lmax, lmax, **options)
        degrees, orders = sht.local_degrees, sht.local_orders
        c = numpy.stack([km_coefficients(b, lmax)[degrees][:, orders] for b in range(batch)])
        x = isht.forward(c)
        y = sht.forward(x)
        inverse = measure(grid.cart, lambda: isht.forward(c, out=x), args.repeats, 1)
        forward = measure(grid.cart, lambda: sht.forward(x, out=y), args.repeats, 1)
        # the check and ducc0's time, one field at a time on rank 0; the transforms' buffers are dropped first
        # (they are rebuilt on a next call), so that rank 0 holds one whole field and ducc0's map besides its tile
        sht.free()
        isht.free()
        gc.collect()
        lmax_d = lmax - 1
        index = _ducc0_index(lmax_d)
        worst = {"inverse": 0.0, "forward": 0.0}
        ducc = {"synthesis_2d": 0.0, "analysis_2d": 0.0}
        for b in range(batch):
            field = grid.gather(x[b])
            coefficients = sht.gather_coefficients(y[b])
            if grid.rank == 0:
                whole = km_coefficients(b, lmax)
                alm = numpy.zeros((1, (lmax_d + 1) * (lmax_d + 2) // 2), dtype=numpy.complex128)
                for m in range(lmax):
                    alm[0, index(m, m):index(m, m) + lmax - m] = whole[m:, m]
                reference = numpy.empty((1, nlat, nlon))
                start = time.perf_counter()
                ducc0.sht.experimental.synthesis_2d(alm=alm, map=reference, spin=0, lmax=lmax_d, geometry="CC",
                                                    nthreads=1)
                ducc["synthesis_2d"] += time.perf_counter() - start
                worst["inverse"] = max(worst["inverse"], float(abs(field - reference[0]).max() /
                                                               abs(reference).max()))
                analysed = numpy.zeros_like(alm)
                start = time.perf_counter()
                ducc0.sht.experimental.analysis_2d(map=field[None], alm=analysed, spin=0, lmax=lmax_d,
                                                   geometry="CC", nthreads=1)
                ducc["analysis_2d"] += time.perf_counter() - start
                ours = numpy.zeros_like(alm)
                for m in range(lmax):
                    ours[0, index(m, m):index(m, m) + lmax - m] = coefficients[m:, m]
                worst["forward"] = max(worst["forward"], float(abs(ours - analysed).max() / abs(analysed).max()))
                del field, reference, analysed, ours, alm, whole
            grid.cart.Barrier()
        rss = grid.cart.gather(peak_rss_mb(), root=0)
        tables = grid.cart.allreduce(sht.table_bytes() + isht.table_bytes(), op=MPI.MAX)
        transpose_tables = costs.legendre_table_bytes("transpose", nlat, lmax, lmax, npolar, nazimuth)
        if grid.rank != 0:
            return []
        ratio_i = inverse[0] / (1e3 * ducc["synthesis_2d"])
        ratio_f = forward[0] / (1e3 * ducc["analysis_2d"])
        print(f"km-scale: {batch} x {nlat} x {nlon} equiangular, lmax = mmax = {lmax}, {npolar} x {nazimuth} ranks, "
              f"legendre={sht.legendre!r}, tables {tables / 2 ** 20:.1f} MiB per rank (the transpose strategy would "
              f"hold {transpose_tables / 2 ** 20:.0f} MiB)")
        print(f"  inverse {inverse[0]:9.1f} ms [{inverse[1]:.1f}..{inverse[2]:.1f}]  ducc0 synthesis_2d of the same "
              f"{batch} fields on one rank {1e3 * ducc['synthesis_2d']:.1f} ms: ratio {ratio_i:.2f}")
        print(f"  forward {forward[0]:9.1f} ms [{forward[1]:.1f}..{forward[2]:.1f}]  ducc0 analysis_2d "
              f"{1e3 * ducc['analysis_2d']:.1f} ms: ratio {ratio_f:.2f}")
        print(f"  largest difference from ducc0, relative to the largest value: inverse {worst['inverse']:.1e}, "
              f"forward {worst['forward']:.1e}")
        print(f"  peak RSS per rank: {', '.join(f'{r:.0f}' for r in rss)} MiB (largest {max(rss):.0f})")
        return [{"case": "km inverse", "median_ms": inverse[0], "min_ms": inverse[1], "max_ms": inverse[2],
                 "ducc0_ms": 1e3 * ducc["synthesis_2d"], "ratio": ratio_i, "max_rel_diff": worst["inverse"]},
                {"case": "km forward", "median_ms": forward[0], "min_ms": forward[1], "max_ms": forward[2],
                 "ducc0_ms": 1e3 * ducc["analysis_2d"], "ratio": ratio_f, "max_rel_diff": worst["forward"]},
                {"case": "km peak RSS", "peak_rss_mib": rss, "table_mib": tables / 2 ** 20,
                 "transpose_table_mib": transpose_tables / 2 ** 20, "legendre": sht.legendre,
                 "grid": f"{npolar}x{nazimuth}"}]


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
    parser.add_argument("--lmax", type=int, default=None, help="lmax = mmax (default: torch-harmonics' truncation)")
    parser.add_argument("--fft", default="auto", choices=["auto", "numpy", "ducc0"])
    parser.add_argument("--orders", default="contiguous", choices=["contiguous", "balanced"])
    parser.add_argument("--vector", action="store_true",
                        help="also the vector transforms against scalar ones, and ducc0 with spin 1")
    parser.add_argument("--vector-only", action="store_true", help="only the vector rows")
    parser.add_argument("--interleaved", action="store_true",
                        help="one rank: mpisphere and ducc0 alternately, round by round (the fair ratio)")
    parser.add_argument("--overlap", action="store_true",
                        help="also the transforms with overlap=True (two chunks, transposes in flight)")
    parser.add_argument("--km", action="store_true",
                        help="2049 x 4096 equiangular, lmax = mmax = 1025, 4 fields, every rank's peak RSS, vs ducc0")
    parser.add_argument("--legendre", default=None, choices=["auto", "transpose", "reduce-scatter", "table-free"],
                        help="the transforms' Legendre strategy (default: auto; table-free with --km)")
    parser.add_argument("--batch-sweep", default=None,
                        help="one rank: these batch sizes (comma-separated), auto, transpose and table-free against "
                             "ducc0 in alternation")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.large:
        args.nlat, args.nlon = 721, 1440
    if args.batch_sweep:
        rows = bench_batch_sweep(args)
        if args.json:
            write_results(args.json, {"nlat": args.nlat, "nlon": args.nlon, "lmax": args.lmax, "fft": args.fft,
                                      "dtype": args.dtype, "quadrature": args.quadrature}, rows)
        return 0
    if args.km:
        args.batch = 4 if args.batch == 32 else args.batch
        rows = bench_km(args)
        if args.json and rows:
            write_results(args.json, {"ranks": MPI.COMM_WORLD.Get_size(), "batch": args.batch, "nlat": 2049,
                                      "nlon": 4096, "lmax": 1025}, rows)
        return 0
    args.vector = args.vector or args.vector_only
    world = MPI.COMM_WORLD
    if args.interleaved:
        rows = bench_interleaved(args)
        if args.json:
            write_results(args.json, {"nlat": args.nlat, "nlon": args.nlon, "batch": args.batch, "lmax": args.lmax,
                                      "fft": args.fft, "dtype": args.dtype}, rows)
        return 0
    xp, sync = numpy, None
    if args.device == "gpu":
        mpisphere.select_device(world)
        import cupy as xp  # noqa: N813
        sync = lambda: xp.cuda.get_current_stream().synchronize()  # noqa: E731
    size = world.Get_size()
    shapes = grid_shapes(args.grids, size, {1: [(1, 1)]})
    if world.Get_rank() == 0:
        print(f"mpisphere {mpisphere.__version__}, numpy {numpy.__version__}, {size} rank(s), {args.batch} x "
              f"{args.nlat} x {args.nlon} {args.quadrature} {args.dtype}, {args.device}, {args.repeats} repeats, "
              f"lmax {args.lmax or 'default'}, fft {args.fft}, orders {args.orders}")
    rows = []
    for npolar, nazimuth in shapes:
        with ProcessGrid(world, npolar, nazimuth) as grid:
            if not args.vector_only:
                rows += bench_grid(grid, args, xp, sync)
            if args.vector or args.vector_only:
                rows += bench_vector_grid(grid, args, xp, sync)
    if size == 1 and not args.no_ducc0 and args.device == "cpu":
        rows += bench_ducc0(args)
        medians = {r["case"]: r["median_ms"] for r in rows}
        if "ducc0 analysis_2d" in medians and "forward" in medians:
            print(f"ratios: forward / adjoint_synthesis_2d = "
                  f"{medians['forward out='] / medians['ducc0 adjoint_synthesis_2d']:.2f}, forward / analysis_2d = "
                  f"{medians['forward out='] / medians['ducc0 analysis_2d']:.2f}, inverse / synthesis_2d = "
                  f"{medians['inverse out='] / medians['ducc0 synthesis_2d']:.2f} (mpisphere with out=)")
        if "ducc0 analysis_2d spin 1" in medians:
            print(f"ratios: vector forward / adjoint_synthesis_2d spin 1 = "
                  f"{medians['vector forward'] / medians['ducc0 adjoint_synthesis_2d spin 1']:.2f}, "
                  f"vector forward / analysis_2d spin 1 = "
                  f"{medians['vector forward'] / medians['ducc0 analysis_2d spin 1']:.2f}, vector inverse / "
                  f"synthesis_2d spin 1 = {medians['vector inverse'] / medians['ducc0 synthesis_2d spin 1']:.2f}")
    if args.json and world.Get_rank() == 0:
        meta = {"ranks": size, "batch": args.batch, "nlat": args.nlat, "nlon": args.nlon, "dtype": args.dtype,
                "lmax": args.lmax, "fft": args.fft, "orders": args.orders,
                "quadrature": args.quadrature, "device": args.device}
        write_results(args.json, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
