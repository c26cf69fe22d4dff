"""The SHT on one GPU against torch-harmonics, with peak memory and the Legendre step's bandwidth bound.

    python scripts/bench_gpu.py --json gpu-sht.json      # needs CuPy and a CUDA device; torch-harmonics if installed

For 361 x 720 and 721 x 1440 (equiangular, torch-harmonics 0.9's default
truncation), 32 fields, float32 and float64, on a 1x1 grid: mpisphere's
forward and inverse transforms (scalar and vector) on CuPy arrays, and
torch-harmonics' RealSHT/InverseRealSHT (and the vector ones) on the same
GPU, each the median of --repeats timed calls after a warm-up, synchronised.
Peak memory of a forward + inverse pair: CuPy's pool (all blocks freed
first) and torch's max_memory_allocated. The bandwidth bound of the Legendre
step: its table bytes plus its input and output bytes over the
device-to-device copy bandwidth measured in the same run. Also the pinned
host <-> device copy bandwidth (the staging path's ceiling) for a 16.7 MB
buffer.
"""

import argparse
import json
import statistics
import sys
import time

import numpy


def timed(fn, sync, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def copy_bandwidths(cp, repeats):
    nbytes = 16_777_216
    device = cp.empty(nbytes // 8)
    other = cp.empty_like(device)
    pinned = cp.cuda.alloc_pinned_memory(nbytes)
    host = numpy.frombuffer(pinned, numpy.float64, nbytes // 8)
    sync = cp.cuda.get_current_stream().synchronize
    d2d = timed(lambda: cp.copyto(other, device), sync, repeats)
    h2d = timed(lambda: device.set(host), sync, repeats)
    d2h = timed(lambda: device.get(out=host), sync, repeats)
    return {"bytes": nbytes, "d2d_gbs": 2 * nbytes / d2d / 1e6, "h2d_gbs": nbytes / h2d / 1e6,
            "d2h_gbs": nbytes / d2h / 1e6}


def _mpisphere_pair(cp, grid, nlat, nlon, dtype, batch, repeats, d2d_gbs, vector):
    """One forward + inverse pair; its arrays die with this frame, before the next pair's peak is taken."""
    import mpisphere
    sync = cp.cuda.get_current_stream().synchronize
    forward_cls = mpisphere.DistributedRealVectorSHT if vector else mpisphere.DistributedRealSHT
    inverse_cls = mpisphere.DistributedInverseRealVectorSHT if vector else mpisphere.DistributedInverseRealSHT
    pool = cp.get_default_memory_pool()
    grid.scratch.clear()
    pool.free_all_blocks()
    sht = forward_cls(grid, nlat, nlon, dtype=dtype)
    isht = inverse_cls(grid, nlat, nlon, dtype=dtype)
    lead = (batch, 2) if vector else (batch,)
    x = cp.asarray(numpy.random.default_rng(0).standard_normal(lead + (nlat, nlon)).astype(dtype))
    c = sht.forward(x)
    y = isht.forward(c)
    sync()
    peak = pool.total_bytes()
    forward = timed(lambda: sht.forward(x, out=c), sync, repeats)
    inverse = timed(lambda: isht.forward(c, out=y), sync, repeats)
    columns = 2 * batch * (2 if vector else 1)
    legendre_bytes = sht.table_bytes() + columns * numpy.dtype(dtype).itemsize * (nlat + sht.lmax) * sht.mmax
    return {"library": "mpisphere", "kind": "vector" if vector else "scalar", "nlat": nlat, "nlon": nlon,
            "dtype": numpy.dtype(dtype).name, "forward_ms": forward, "inverse_ms": inverse,
            "pair_peak_mb": peak / 2 ** 20, "legendre_bound_ms": legendre_bytes / d2d_gbs / 1e6}


def bench_mpisphere(cp, grid, nlat, nlon, dtype, batch, repeats, d2d_gbs):
    return [_mpisphere_pair(cp, grid, nlat, nlon, dtype, batch, repeats, d2d_gbs, vector) for vector in (False, True)]


def _torch_harmonics_pair(torch, th, nlat, nlon, tdtype, dtype, batch, repeats, vector):
    sync = torch.cuda.synchronize
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    forward_cls, inverse_cls = (th.RealVectorSHT, th.InverseRealVectorSHT) if vector else \
        (th.RealSHT, th.InverseRealSHT)
    sht = forward_cls(nlat, nlon, grid="equiangular").to("cuda", dtype=tdtype)
    isht = inverse_cls(nlat, nlon, grid="equiangular").to("cuda", dtype=tdtype)
    lead = (batch, 2) if vector else (batch,)
    x = torch.randn(lead + (nlat, nlon), device="cuda", dtype=tdtype)
    with torch.no_grad():
        c = sht(x)
        isht(c)
        sync()
        peak = torch.cuda.max_memory_allocated()
        forward = timed(lambda: sht(x), sync, repeats)
        inverse = timed(lambda: isht(c), sync, repeats)
    return {"library": "torch-harmonics", "kind": "vector" if vector else "scalar", "nlat": nlat,
            "nlon": nlon, "dtype": numpy.dtype(dtype).name, "forward_ms": forward, "inverse_ms": inverse,
            "pair_peak_mb": peak / 2 ** 20, "version": th.__version__}


def bench_torch_harmonics(nlat, nlon, dtype, batch, repeats):
    try:
        import torch
        import torch_harmonics as th
    except Exception as exc:  # noqa: BLE001 - any import failure means: no comparison, say why
        return [{"library": "torch-harmonics", "error": f"{type(exc).__name__}: {exc}"}]
    tdtype = {numpy.float32: torch.float32, numpy.float64: torch.float64}[dtype]
    return [_torch_harmonics_pair(torch, th, nlat, nlon, tdtype, dtype, batch, repeats, vector)
            for vector in (False, True)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--sizes", default="361x720,721x1440")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import cupy as cp
    from mpi4py import MPI

    import mpisphere
    copies = copy_bandwidths(cp, args.repeats)
    print(f"copies of {copies['bytes'] / 2 ** 20:.1f} MiB: device-to-device {copies['d2d_gbs']:.0f} GB/s (read + "
          f"write), pinned host-to-device {copies['h2d_gbs']:.1f} GB/s, device-to-host {copies['d2h_gbs']:.1f} GB/s",
          flush=True)
    rows = []
    with mpisphere.ProcessGrid(MPI.COMM_SELF) as grid:
        for size in args.sizes.split(","):
            nlat, nlon = (int(v) for v in size.split("x"))
            for dtype in (numpy.float32, numpy.float64):
                found = bench_mpisphere(cp, grid, nlat, nlon, dtype, args.batch, args.repeats, copies["d2d_gbs"])
                found += bench_torch_harmonics(nlat, nlon, dtype, args.batch, args.repeats)
                for row in found:
                    if "error" in row:
                        print(f"  torch-harmonics: not compared ({row['error']})", flush=True)
                        continue
                    bound = f", Legendre bound {row['legendre_bound_ms']:.2f} ms" if "legendre_bound_ms" in row else ""
                    print(f"  {row['library']:16s} {row['kind']:6s} {nlat} x {nlon} {row['dtype']}: forward "
                          f"{row['forward_ms']:.2f} ms, inverse {row['inverse_ms']:.2f} ms, pair peak "
                          f"{row['pair_peak_mb']:.0f} MB{bound}", flush=True)
                rows += found
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copies": copies, "rows": rows, "batch": args.batch}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
