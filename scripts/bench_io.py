"""Parallel write and read of distributed fields (mpisphere.io) against what users do without it.

    mpiexec -n 4 python -m mpi4py scripts/bench_io.py                # 32 fields of 721 x 1440, float64
    mpiexec -n 2 python -m mpi4py scripts/bench_io.py --json docs/results/io-2.json

Three ways to put the same fields on disk and back, timed in alternation
round by round (:func:`benchtools.measure_rounds`, slowest rank, median):

``mpisphere``
    :class:`mpisphere.io.FieldStore`: every rank sends the pieces of its
    tile to the ranks that store each chunk (one all-to-all) and writes its
    own chunks into one Zarr v3 store that xarray opens; reading the
    reverse. A new store each round, so the metadata is timed too.
``numpy.save per rank``
    every rank writes its tile to a file of its own: the limit (no
    exchange, no metadata, but files no other tool can assemble).
``gather + numpy.save``
    ``grid.gather`` to rank 0, which writes one file (what users do
    today); reading: rank 0 loads it and ``grid.scatter`` cuts the tiles.

The files go to ``--dir`` (default: a new folder under the current one).
On a machine with free memory the writes land in the page cache, so the
figures measure the work of each method (copies, exchange, encoding,
checksums, system calls), not the disk; on a parallel filesystem the
ratios differ.
"""

import argparse
import os
import shutil
import sys
import tempfile

import numpy
from mpi4py import MPI

from benchtools import measure_rounds, write_results
from mpisphere import ProcessGrid
from mpisphere.io import FieldStore


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=721)
    parser.add_argument("--nlon", type=int, default=1440)
    parser.add_argument("--fields", type=int, default=32)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the files go (default: a new folder here, removed)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    with ProcessGrid(world) as grid:
        base = args.dir or world.bcast(tempfile.mkdtemp(prefix="bench_io_", dir=".") if world.rank == 0 else None)
        lat, lon = grid.local_slices(args.nlat, args.nlon)
        rng = numpy.random.default_rng([11, grid.rank])
        tile = rng.standard_normal((args.fields, lat.stop - lat.start, lon.stop - lon.start)).astype(args.dtype)
        store_path = os.path.join(base, "fields.zarr")
        own_file = os.path.join(base, f"tile-{grid.rank}.npy")
        one_file = os.path.join(base, "whole.npy")

        def write_store():
            FieldStore(store_path, grid, mode="w").write_tiles("f", tile, args.nlat, args.nlon, dims=("field",))

        def read_store():
            FieldStore(store_path, grid).read_tiles("f", args.nlat, args.nlon)

        def write_own():
            numpy.save(own_file, tile)

        def read_own():
            numpy.load(own_file)

        def write_gathered():
            whole = grid.gather(tile)
            if grid.rank == 0:
                numpy.save(one_file, whole)

        def read_scattered():
            grid.scatter(numpy.load(one_file) if grid.rank == 0 else None)

        cases = {"mpisphere write": write_store, "numpy.save per rank": write_own,
                 "gather + numpy.save": write_gathered, "mpisphere read": read_store,
                 "numpy.load per rank": read_own, "numpy.load + scatter": read_scattered}
        times = measure_rounds(world, cases, args.repeats, args.warmup)
        check = FieldStore(store_path, grid).read_tiles("f", args.nlat, args.nlon)
        exact = world.allreduce(int(numpy.array_equal(check, tile)), op=MPI.MIN)
        nbytes = args.fields * args.nlat * args.nlon * numpy.dtype(args.dtype).itemsize
        medians = {name: float(numpy.median(t)) for name, t in times.items()}
        ratio = {f"{a} / {b}": float(numpy.median(times[a] / times[b])) for a, b in [
            ("mpisphere write", "numpy.save per rank"), ("mpisphere write", "gather + numpy.save"),
            ("mpisphere read", "numpy.load per rank"), ("mpisphere read", "numpy.load + scatter")]}
        if grid.rank == 0:
            print(f"{args.fields} fields of {args.nlat} x {args.nlon} {args.dtype} ({nbytes / 2**20:.0f} MiB) on "
                  f"{grid.npolar} x {grid.nazimuth} ranks, median of {args.repeats} rounds (slowest rank); "
                  f"read back exactly: {bool(exact)}")
            for name, ms in medians.items():
                print(f"  {name:24s} {ms:9.1f} ms  {nbytes / 2**30 / (ms / 1e3):6.2f} GiB/s")
            for name, r in ratio.items():
                print(f"  {name:48s} {r:6.2f}")
            if args.json:
                write_results(args.json, dict(vars(args), ranks=grid.size, grid=[grid.npolar, grid.nazimuth],
                                              nbytes=nbytes, exact=bool(exact)),
                              {"median_ms": medians, "ratios": ratio})
        world.Barrier()
        if args.dir is None and world.rank == 0:
            shutil.rmtree(base, ignore_errors=True)
        return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
