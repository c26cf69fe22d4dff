"""Contiguous against balanced order layouts, timed in alternation on a 1 x N grid (N = the ranks).

    mpiexec -n 2 python scripts/bench_orders.py

32 fields of 361 x 720, float64, default truncation; forward and inverse
with out=, 15 rounds, each the slowest rank's time after a barrier; medians
and the median of the per-round ratios; and each rank's table bytes.
"""

import sys
import time

import numpy
from mpi4py import MPI

from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, ProcessGrid

LAYOUTS = ("contiguous", "balanced")


def main():
    world = MPI.COMM_WORLD
    with ProcessGrid(world, 1, world.Get_size()) as grid:
        ops = {}
        for layout in LAYOUTS:
            sht = DistributedRealSHT(grid, 361, 720, orders=layout)
            isht = DistributedInverseRealSHT(grid, 361, 720, orders=layout)
            x = numpy.random.default_rng(grid.rank).standard_normal((32,) + sht.tile_shape)
            c = sht.forward(x)
            ops[layout] = (sht, isht, x, c, numpy.empty_like(x))
        times = {(layout, d): [] for layout in LAYOUTS for d in ("forward", "inverse")}
        for _ in range(15):
            for layout in LAYOUTS:
                sht, isht, x, c, y = ops[layout]
                for direction, fn in (("forward", lambda: sht.forward(x, out=c)),
                                      ("inverse", lambda: isht.forward(c, out=y))):
                    grid.cart.Barrier()
                    start = time.perf_counter()
                    fn()
                    elapsed = time.perf_counter() - start
                    times[(layout, direction)].append(grid.cart.allreduce(elapsed, op=MPI.MAX))
        tables = {layout: grid.cart.allgather(ops[layout][0].table_bytes()) for layout in LAYOUTS}
        if grid.rank == 0:
            print(f"1 x {grid.nazimuth}, 32 x 361 x 720 float64, 15 rounds in alternation")
            for (layout, direction), values in times.items():
                print(f"  {layout:10s} {direction:7s} {numpy.median(values) * 1e3:7.1f} ms")
            for direction in ("forward", "inverse"):
                ratio = numpy.median(numpy.array(times[("balanced", direction)]) /
                                     numpy.array(times[("contiguous", direction)]))
                print(f"  balanced / contiguous, {direction}: {ratio:.2f}")
            for layout in LAYOUTS:
                print(f"  table bytes per rank, {layout}: {[round(b / 2 ** 20, 1) for b in tables[layout]]} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
