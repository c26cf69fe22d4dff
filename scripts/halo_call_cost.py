"""Where a replayed halo call spends its time, and which modules it runs, against the hand-written halo.

    mpiexec -n 2 python scripts/halo_call_cost.py                 # 1 x 2 and 2 x 1, one field
    mpiexec -n 2 python scripts/halo_call_cost.py --fields 32

For each grid, on a 361 x 720 float64 field with a halo of 4 rows and 4
columns, in a steady loop (``--calls`` calls each, after a warm-up):

``update`` / ``accumulate``
    ``HaloExchange.update`` / ``accumulate`` on one plain padded array and
    on one from ``halo.zeros`` (its blocks left in memory shared on the
    node), replayed from the plan its second call made
    (``mpisphere.halo.planned``);
``replay alone``
    the planned call's ``run`` without the operator's entry (the guard, the
    failure-note check, the plan's lookup);
``hand-written``
    the halo written by hand in mpi4py (``bench_halo.hand_written_halo``).

Medians of this rank's times, rank 0 printing. Then the modules of
mpisphere whose code an ``update`` and an ``accumulate`` run
(``sys.setprofile`` over 20 calls). Not a benchmark of record
(``bench_halo.py`` is): a diagnosis of the fixed cost.
"""

import argparse
import itertools
import sys
import time

import numpy
from mpi4py import MPI

from benchtools import grid_shapes
from bench_halo import hand_written_halo
from mpisphere import HaloExchange, ProcessGrid


def median_us(grid, call, calls):
    for _ in range(50):
        call()
    grid.cart.Barrier()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e6 * float(numpy.median(times))


def modules_run(call):
    """The mpisphere modules whose functions ``call()`` runs, 20 times."""
    found = set()

    def seen(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and "/mpisphere/" in name:
            found.add(name.split("/mpisphere/")[-1])
    sys.setprofile(seen)
    try:
        for _ in range(20):
            call()
    finally:
        sys.setprofile(None)
    return sorted(found)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grids", default=None, help="e.g. 1x2,2x1 (default: those of the rank count)")
    parser.add_argument("--fields", type=int, default=1)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(argv)
    for npolar, nazimuth in grid_shapes(args.grids, MPI.COMM_WORLD.Get_size()):
        grid = ProcessGrid(MPI.COMM_WORLD, npolar, nazimuth)
        halo = HaloExchange(grid, 4, 4, extents=(361, 720))
        h, w = grid.local_shape(361, 720)
        plain = numpy.random.default_rng(grid.rank).random((args.fields, h + 8, w + 8))
        shared = halo.zeros((args.fields,))
        shared[...] = plain
        by_hand = plain.copy()
        hand = dict(zip(("update", "accumulate"), hand_written_halo(grid, by_hand, 4, 4)))
        for (direction, name), (tile, padded) in itertools.product(
                (("update", "forward"), ("accumulate", "adjoint")), (("plain", plain), ("shared", shared))):
            call = getattr(halo, direction)
            call(padded)
            call(padded)  # planned by the second
            replay = halo._call.replay(name, padded)
            if replay is None:
                raise RuntimeError(f"rank {grid.rank}: the {direction} was not planned")
            whole = median_us(grid, lambda: call(padded), args.calls)
            alone = median_us(grid, replay.run, args.calls)
            yardstick = median_us(grid, hand[direction], args.calls)
            modules = modules_run(lambda: call(padded))
            if grid.rank == 0:
                print(f"{npolar}x{nazimuth} {args.fields:3d} fields {direction:10s} {tile:6s} {whole:7.1f} us, "
                      f"replay alone {alone:7.1f} us, hand-written {yardstick:7.1f} us (x{whole / yardstick:.2f}); "
                      f"{len(modules)} modules: {', '.join(modules)}", flush=True)
            padded[...] = 0.5  # accumulate doubles the interior: keep the values bounded
        halo.free()
        grid.free()


if __name__ == "__main__":
    main()
