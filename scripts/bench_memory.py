"""Peak memory of a forward and an inverse SHT on one rank, in a fresh process per run.

    python scripts/bench_memory.py                          # 361 x 720, 32 fields, lmax = mmax = 361, float64
    python scripts/bench_memory.py --lmax 181 --dtype float32
    PYTHONPATH=/path/to/other/checkout python scripts/bench_memory.py   # the same measure of another version

Prints the peak resident set size (ru_maxrss) after building both operators,
then after one forward and one inverse call (inputs, outputs and everything
the calls keep or free), with the bytes of the Legendre tables and of the
scratch the operators keep (tables shared by the two count once). The peak
also holds the interpreter (printed) and MPI's and OpenBLAS's own buffers.
"""

import argparse
import json
import resource
import sys

import numpy


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--nlon", type=int, default=720)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lmax", type=int, default=361)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    baseline = rss_mb()
    from mpi4py import MPI
    import mpisphere
    dtype = numpy.dtype(args.dtype)
    grid = mpisphere.ProcessGrid(MPI.COMM_SELF)
    sht = mpisphere.DistributedRealSHT(grid, args.nlat, args.nlon, args.lmax, args.lmax, dtype=dtype)
    isht = mpisphere.DistributedInverseRealSHT(grid, args.nlat, args.nlon, args.lmax, args.lmax, dtype=dtype)
    built = rss_mb()
    x = numpy.random.default_rng(0).standard_normal((args.batch, args.nlat, args.nlon)).astype(dtype)
    c = sht.forward(x)
    y = isht.forward(c)
    peak = rss_mb()
    # what the operators keep between calls: their own scratch, and their pipelines' (shared on the grid from 0.2)
    kept = sum(o._scratch.nbytes() for o in (sht, isht))
    if hasattr(grid, "scratch"):
        kept += grid.scratch.nbytes()
    else:
        kept += sum(p.nbytes() for o in (sht, isht) for p in o._pipelines.values())
    tables = sht.table_bytes() + (0 if sht.tables is isht.tables else isht.table_bytes())
    row = {"version": mpisphere.__file__, "nlat": args.nlat, "nlon": args.nlon, "batch": args.batch,
           "lmax": args.lmax, "dtype": args.dtype, "baseline_mb": baseline, "after_build_mb": built,
           "peak_mb": peak, "tables_mb": tables / 2 ** 20,
           "pipeline_scratch_mb": kept / 2 ** 20,
           "arrays_mb": (x.nbytes + c.nbytes + y.nbytes) / 2 ** 20}
    print(f"{row['version']}\n  {args.batch} x {args.nlat} x {args.nlon} {args.dtype}, lmax = mmax = {args.lmax}: "
          f"peak RSS {peak:.0f} MB (interpreter {baseline:.0f} MB, after building {built:.0f} MB); tables "
          f"{row['tables_mb']:.0f} MB, scratch kept {row['pipeline_scratch_mb']:.0f} MB, x + c + y "
          f"{row['arrays_mb']:.0f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)
    grid.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
