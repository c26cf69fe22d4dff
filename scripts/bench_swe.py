"""Time a step of the distributed shallow-water model, with where the time goes.

    mpiexec -n 1 python scripts/bench_swe.py            # 1 x 1
    mpiexec -n 2 python scripts/bench_swe.py            # 1 x 2 and 2 x 1
    mpiexec -n 4 python scripts/bench_swe.py --json swe-2x2.json

One step (``timestep(uspec, 1)`` after the Adams-Bashforth start) of
Galewsky's jet on a Gauss grid (default 256 x 512, T255): three scalar
inverse transforms and one inverse vector transform to the grid, the
products, two forward vector transforms (one call) and one forward scalar
transform back. Each figure is the median over repetitions of the slowest
rank's time (barrier-aligned). Then the tangent-linear and adjoint models
over ``--tl-steps`` steps (``ShallowWaterSolver.linearize``), per step and
as a ratio to the nonlinear step of the same run, and ``linearize`` itself
(the nonlinear run that stores the trajectory).

The breakdown times, on every rank, each stage of every transform while the
steps run (the stages of one call run in sequence, so their times add up):
the transposes (MPI; on one rank, or within a rank's own block, a copy
between memory layouts), the FFTs, the Legendre products with the vector
coupling, and what remains of the transform calls (input checks, the
agreement allreduce, copies); "grid-point and spectral work" is the step
minus the transform calls. Rank 0 prints the mean over ranks per step, and
the largest rank's.
"""

import argparse
import sys
import time
from collections import defaultdict

import numpy
from mpi4py import MPI

import mpisphere
from benchtools import grid_shapes, measure, write_results
from mpisphere import ProcessGrid, ReduceScatter, Transpose
from mpisphere.examples import ShallowWaterSolver
from mpisphere.operators import AdjointOperator
from mpisphere.sht.coupling import VectorCoupling
from mpisphere.stages.fourier import FourierStage, Truncation
from mpisphere.sht.legendre_stage import LegendreStage
from mpisphere.sht.strategies.base import OwnLatitudeStage

CATEGORIES = ("transposes (MPI)", "FFT", "Legendre + coupling", "checks, agreement, copies",
              "grid-point and spectral work")


class StageClock:
    """Accumulates seconds per category; only the outermost timed call counts (stages call each other)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.depth = 0

    def wrap(self, category, fn):
        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.seconds[category] += time.perf_counter() - start
        return timed


def stage_category(stage):
    inner = stage.op if isinstance(stage, AdjointOperator) else stage
    if isinstance(inner, (Transpose, ReduceScatter)):  # the reduce-scatter strategies' polar sum is the latter
        return "transposes (MPI)"
    if isinstance(inner, FourierStage):
        return "FFT"
    if isinstance(inner, (LegendreStage, OwnLatitudeStage, VectorCoupling)):  # every Legendre strategy's stage
        return "Legendre + coupling"
    if isinstance(inner, Truncation):
        return "checks, agreement, copies"
    raise TypeError(f"no category for {stage!r}")


def instrument(swe, clock):
    """Time the transform calls of ``swe`` and the stages inside them (instance attributes; the classes stay).

    A transform call is one of the scalar transforms or of the winds' calculus operators (a vector transform
    and a diagonal scaling): the time inside them that no stage accounts for is checks, agreement and copies.
    """
    transforms = (swe.sht, swe.isht, swe.vsht, swe.ivsht)
    for op in transforms:
        for pipeline in op._pipelines.values():
            for stage in pipeline.stages:
                category = stage_category(stage)
                stage._run = clock.wrap(category, stage._run)
                if hasattr(stage, "_run_consuming"):
                    stage._run_consuming = clock.wrap(category, stage._run_consuming)
            pipeline._plans.clear()  # compiled plans hold the stages' methods as they were: compile again
    calls = defaultdict(float)

    def wrap_call(op):
        forward = op.forward

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                calls["transform calls"] += time.perf_counter() - start
        op.forward = timed
    # the model calls the scalar transforms and, for the winds, the calculus compositions around the vector ones
    for op in (swe.sht, swe.isht, swe.uv_to_vrtdiv, swe.vrtdiv_to_uv):
        wrap_call(op)
    return calls


def bench_grid(grid, args):
    swe = ShallowWaterSolver(grid, args.nlat, args.nlon, dt=args.dt, quadrature="legendre-gauss")
    uspec = swe.timestep(swe.galewsky_initial_condition(), 3)  # builds every pipeline once
    step = lambda: swe.timestep(uspec, 1)  # noqa: E731
    median, low, high = measure(grid.cart, step, args.repeats, args.warmup)

    # tangent-linear and adjoint steps, over a trajectory of tl_steps steps (per step)
    n = args.tl_steps
    model = swe.linearize(uspec, n)
    du = 1e-3 * uspec
    tlad = {}
    for label, fn in (("linearize (nonlinear + trajectory)", lambda: swe.linearize(uspec, n)),
                      ("tangent-linear", lambda: model.forward(du)), ("adjoint", lambda: model.adjoint(du))):
        m, lo, hi = measure(grid.cart, fn, max(3, args.repeats // 3), 1)
        tlad[label] = (m / n, lo / n, hi / n)

    clock = StageClock()
    calls = instrument(swe, clock)
    grid.cart.Barrier()
    start = time.perf_counter()
    for _ in range(args.repeats):
        step()
    total = time.perf_counter() - start
    parts = {name: clock.seconds[name] for name in CATEGORIES[:3]}
    parts["checks, agreement, copies"] = calls["transform calls"] - sum(parts.values())
    parts["grid-point and spectral work"] = total - calls["transform calls"]
    local = numpy.array([parts[name] / args.repeats * 1e3 for name in CATEGORIES] + [total / args.repeats * 1e3])
    mean, largest = numpy.empty_like(local), numpy.empty_like(local)
    grid.cart.Allreduce(local, mean, op=MPI.SUM)
    grid.cart.Allreduce(local, largest, op=MPI.MAX)
    mean /= grid.size
    name = f"{grid.npolar}x{grid.nazimuth}"
    row = {"grid": name, "step_median_ms": median, "step_min_ms": low, "step_max_ms": high,
           "breakdown_mean_ms": dict(zip(CATEGORIES, mean[:-1].tolist())),
           "breakdown_max_ms": dict(zip(CATEGORIES, largest[:-1].tolist())),
           "instrumented_step_mean_ms": float(mean[-1]),
           "per_step_ms": {label: {"median": v[0], "min": v[1], "max": v[2]} for label, v in tlad.items()}}
    if grid.rank == 0:
        print(f"{name:>4} step {median:8.1f} ms [{low:7.1f}..{high:7.1f}]  ({args.nlat} x {args.nlon} Gauss, "
              f"lmax = {swe.lmax}; instrumented run {mean[-1]:.1f} ms/step)", flush=True)
        for category, m, x in zip(CATEGORIES, mean, largest):
            print(f"       {category:30s} {m:8.1f} ms  ({100 * m / mean[-1]:4.1f}%; largest rank {x:.1f} ms)")
        for label, (m, lo, hi) in tlad.items():
            print(f"     {label:36s} {m:8.1f} ms a step [{lo:7.1f}..{hi:7.1f}]  {m / median:.2f}x the nonlinear "
                  f"step ({n} steps)")
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=256)
    parser.add_argument("--nlon", type=int, default=512)
    parser.add_argument("--dt", type=float, default=60.0)
    parser.add_argument("--grids", default=None, help="comma-separated PxA (default: by the number of ranks)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--tl-steps", type=int, default=10, help="steps of the tangent-linear and adjoint runs")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    size = world.Get_size()
    shapes = grid_shapes(args.grids, size, {1: [(1, 1)]})
    if world.Get_rank() == 0:
        print(f"mpisphere {mpisphere.__version__}, numpy {numpy.__version__}, {size} rank(s), shallow-water step, "
              f"{args.repeats} repeats")
    rows = []
    for npolar, nazimuth in shapes:
        with ProcessGrid(world, npolar, nazimuth) as grid:
            rows.append(bench_grid(grid, args))
    if args.json and world.Get_rank() == 0:
        write_results(args.json, {"ranks": size, "nlat": args.nlat, "nlon": args.nlon}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
