"""Does a transpose in flight overlap with local work on this machine? The measurement behind the pipeline's choice.

    mpiexec -n 2 python scripts/bench_overlap.py        # 1 x 2 (azimuth) and 2 x 1 (polar)

The SHT's transposes could run while the previous chunk of fields is
contracted. Whether that pays depends on the MPI progressing the exchange
while the CPU computes. Three timings per grid, each the median over
repetitions of the slowest rank (barrier-aligned):

* ``exchange``: the polar (2 x 1) or azimuth (1 x 2) transpose of half the
  reference batch, blocking;
* ``work``: a matrix product of about the same duration, standing in for the
  contraction of the other half (no MPI);
* ``overlapped``: ``start_forward``, the product, ``wait``.

``hidden`` is the share of the shorter of the two that the overlap saved:
``(exchange + work - overlapped) / min(exchange, work)``; 0 means no
overlap, 1 complete overlap.
"""

import argparse
import sys
import time

import numpy
from mpi4py import MPI

import mpisphere
from benchtools import mpi_version, measure, write_results
from mpisphere import ProcessGrid, Transpose


def calibrated_work(target_ms, rng):
    """A matrix product taking about ``target_ms`` on this core (the size found by doubling)."""
    n = 64
    while True:
        a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
        start = time.perf_counter()
        numpy.matmul(a, b)
        if (time.perf_counter() - start) * 1e3 >= target_ms or n >= 4096:
            return lambda: numpy.matmul(a, b)
        n = int(n * 1.26)


def bench_grid(grid, args):
    nlat, mmax, batch = args.nlat, args.mmax, args.batch // 2
    polar = grid.npolar > 1
    comm = grid.polar if polar else grid.azimuth
    h, _ = grid.local_shape(nlat, 2 * mmax)
    m_loc = mpisphere.split_sizes(mmax, grid.nazimuth)[grid.azimuth_rank]
    rng = numpy.random.default_rng(grid.rank)
    if polar:  # (B, C, h, m) -> (Bp, C, nlat, m): the SHT's latitude transpose
        op = Transpose(comm, axes=(0, 2), extents=(batch, nlat))
        x = rng.standard_normal((batch, 1, h, m_loc)) + 0j
    else:      # (Ba, C, h, mmax) -> (B, C, h, m): the SHT's order transpose
        op = Transpose(comm, axes=(3, 0), extents=(mmax, batch))
        ba = mpisphere.split_sizes(batch, grid.nazimuth)[grid.azimuth_rank]
        x = rng.standard_normal((ba, 1, h, mmax)) + 0j
    out = op.forward(x)
    exchange = measure(grid.cart, lambda: op.forward(x, out=out), args.repeats, args.warmup)
    work = calibrated_work(exchange[0], rng)
    computed = measure(grid.cart, work, args.repeats, args.warmup)

    def overlapped():
        flight = op.start_forward(x, out=out)
        work()
        flight.wait()
    both = measure(grid.cart, overlapped, args.repeats, args.warmup)
    hidden = (exchange[0] + computed[0] - both[0]) / min(exchange[0], computed[0])
    name = f"{grid.npolar}x{grid.nazimuth}"
    if grid.rank == 0:
        print(f"{name}: exchange {exchange[0]:.2f} ms, work {computed[0]:.2f} ms, overlapped {both[0]:.2f} ms "
              f"(sum {exchange[0] + computed[0]:.2f}): hidden {hidden:.2f} of the shorter", flush=True)
    return {"grid": name, "exchange_ms": exchange[0], "work_ms": computed[0], "overlapped_ms": both[0],
            "hidden": hidden}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--mmax", type=int, default=361)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        print(f"mpisphere {mpisphere.__version__}, {world.Get_size()} ranks, half of {args.batch} fields of "
              f"{args.nlat} latitudes x {args.mmax} orders; MPI: {mpi_version()}")
    shapes = [(1, world.Get_size()), (world.Get_size(), 1)]
    rows = []
    for npolar, nazimuth in shapes:
        with ProcessGrid(world, npolar, nazimuth) as grid:
            rows.append(bench_grid(grid, args))
    if args.json and world.Get_rank() == 0:
        write_results(args.json, {"ranks": world.Get_size(), "nlat": args.nlat, "mmax": args.mmax,
                                  "batch": args.batch}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
