"""The SHT on one GPU against torch-harmonics: times, agreement, peak memory and the Legendre step's bandwidth bound.

    python scripts/bench_gpu.py --json gpu-sht.json       # CuPy and a CUDA device; torch-harmonics if importable
    python scripts/bench_gpu.py --array-module numpy --cases 33x64:2 --repeats 1   # the plumbing on a CPU

For each case (``NLATxNLON:FIELDS``, equiangular, torch-harmonics 0.9's
default truncation), float32 and float64, scalar and vector, on a 1x1 grid:

* mpisphere's forward and inverse transform of each Legendre strategy asked
  for (``auto``, which is ``transpose`` on a device, and ``reduce-scatter``)
  and torch-harmonics' ``RealSHT``/``InverseRealSHT`` (and the vector ones)
  on the same device, each the median of ``--repeats`` synchronised calls
  after a warm-up, the two libraries alternated call by call;
* the largest difference of mpisphere's result from torch-harmonics' on the
  same input, relative to the largest entry (the oracle: torch-harmonics
  in the dtype of the case, built under ``torch.set_default_dtype`` of it);
* the peak memory of a forward + inverse pair (CuPy's pool with all blocks
  freed first; torch's ``max_memory_allocated``);
* the Legendre step alone, timed on the pipeline's own buffers, beside its
  bandwidth bound: its table bytes plus its input and output bytes over the
  device-to-device copy bandwidth measured in the same run.

Also the pinned host <-> device copy bandwidth (the staging path's ceiling)
for a 16.7 MB buffer. With ``--array-module numpy`` everything runs on the
host (torch on the CPU): the plumbing of ``scripts/gpu_check.py --dry-run``.
"""

import argparse
import json
import statistics
import sys
import time

import numpy


class Device:
    """The array module and its synchronisation: CuPy on the current GPU, or NumPy standing in for it."""

    def __init__(self, name):
        self.name = name
        if name == "cupy":
            import cupy
            self.xp = cupy
            self.sync = lambda: cupy.cuda.get_current_stream().synchronize()
        else:
            self.xp = numpy
            self.sync = lambda: None

    def asnumpy(self, a):
        return a.get() if self.name == "cupy" else numpy.asarray(a)

    def pool_bytes(self, reset=False):
        if self.name != "cupy":
            return 0
        pool = self.xp.get_default_memory_pool()
        if reset:
            pool.free_all_blocks()
        return pool.total_bytes()


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


def alternated(cases, sync, repeats, warmup=1):
    """Median ms of each of ``cases`` (name -> callable), timed in alternation call by call."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    sync()
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def copy_bandwidths(device, repeats):
    nbytes = 16_777_216
    xp = device.xp
    a = xp.empty(nbytes // 8)
    other = xp.empty_like(a)
    d2d = timed(lambda: xp.copyto(other, a), device.sync, repeats)
    found = {"bytes": nbytes, "d2d_gbs": 2 * nbytes / d2d / 1e6}
    if device.name == "cupy":
        pinned = xp.cuda.alloc_pinned_memory(nbytes)
        host = numpy.frombuffer(pinned, numpy.float64, nbytes // 8)
        found["h2d_gbs"] = nbytes / timed(lambda: a.set(host), device.sync, repeats) / 1e6
        found["d2h_gbs"] = nbytes / timed(lambda: a.get(out=host), device.sync, repeats) / 1e6
    return found


def torch_harmonics(device_name):
    """``(torch, torch_harmonics, device)``, or ``(None, None, why not)``."""
    try:
        import torch
        import torch_harmonics as th
    except Exception as exc:  # noqa: BLE001 -- any import failure means: no comparison, say why
        return None, None, f"{type(exc).__name__}: {exc}"
    return torch, th, "cuda" if device_name == "cupy" else "cpu"


def _legendre_stage_ms(sht, x, device, repeats):
    """The pipeline's Legendre stage alone, on the pipeline's own buffers in their planned layouts."""
    from mpisphere.operators import FORWARD
    from mpisphere.sht.strategies.base import OwnLatitudeStage
    from mpisphere.sht.legendre_stage import LegendreStage
    batch = x.shape[0]
    pipeline = sht._pipeline(batch, x)
    index = next(k for k, stage in enumerate(pipeline.stages) if isinstance(stage, (LegendreStage, OwnLatitudeStage)))
    source, target = pipeline._buffer(index, x, 0), pipeline._buffer(index + 1, x, 1)
    source[...] = 0
    stage = pipeline.stages[index]
    return timed(lambda: stage._run(FORWARD, source, target, None), device.sync, repeats)


def bench_case(grid, device, th_modules, nlat, nlon, batch, dtype, vector, strategies, repeats, d2d_gbs):
    import mpisphere
    xp = device.xp
    torch, th, where = th_modules
    forward_cls = mpisphere.DistributedRealVectorSHT if vector else mpisphere.DistributedRealSHT
    inverse_cls = mpisphere.DistributedInverseRealVectorSHT if vector else mpisphere.DistributedInverseRealSHT
    lead = (batch, 2) if vector else (batch,)
    host = numpy.random.default_rng(0).standard_normal(lead + (nlat, nlon)).astype(dtype)
    x = xp.asarray(host)
    rows, cases, results = [], {}, {}
    for strategy in strategies:
        grid.scratch.clear()
        device.pool_bytes(reset=True)
        sht = forward_cls(grid, nlat, nlon, dtype=dtype, legendre=strategy)
        isht = inverse_cls(grid, nlat, nlon, dtype=dtype, legendre=strategy)
        c = sht.forward(x)
        y = isht.forward(c)
        device.sync()
        peak = device.pool_bytes()
        results[strategy] = (device.asnumpy(c), device.asnumpy(y))
        cases[f"{strategy} forward"] = lambda sht=sht, c=c: sht.forward(x, out=c)
        cases[f"{strategy} inverse"] = lambda isht=isht, c=c, y=y: isht.forward(c, out=y)
        columns = 2 * batch * (2 if vector else 1)
        table = sht.table_bytes()
        bound_bytes = table + columns * numpy.dtype(dtype).itemsize * (nlat + sht.lmax + vector) * sht.mmax
        rows.append({"library": "mpisphere", "strategy": sht.legendre_for(batch, device.name == "cupy")[0],
                     "asked": strategy, "pair_peak_mb": peak / 2 ** 20, "table_mb": table / 2 ** 20,
                     "legendre_ms": _legendre_stage_ms(sht, x, device, repeats),
                     "legendre_bound_ms": bound_bytes / d2d_gbs / 1e6})
    oracle = None
    if torch is not None:
        tdtype = {numpy.dtype(numpy.float32): torch.float32, numpy.dtype(numpy.float64): torch.float64}[
            numpy.dtype(dtype)]
        saved = torch.get_default_dtype()
        torch.set_default_dtype(tdtype)  # torch-harmonics builds some constants in the default dtype
        try:
            forward = (th.RealVectorSHT if vector else th.RealSHT)(nlat, nlon, grid="equiangular").to(where)
            inverse = (th.InverseRealVectorSHT if vector else th.InverseRealSHT)(nlat, nlon, grid="equiangular")
            inverse = inverse.to(where)
        finally:
            torch.set_default_dtype(saved)
        if where == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        tx = torch.as_tensor(host, device=where)
        with torch.no_grad():
            tc = forward(tx)
            ty = inverse(tc)
            peak = torch.cuda.max_memory_allocated() if where == "cuda" else 0
            cases["torch-harmonics forward"] = lambda: forward(tx)
            cases["torch-harmonics inverse"] = lambda: inverse(tc)
            oracle = (tc.cpu().numpy(), ty.cpu().numpy())
        rows.append({"library": "torch-harmonics", "version": th.__version__, "pair_peak_mb": peak / 2 ** 20})
        # the inverse compared on the same coefficients: torch-harmonics' own
        for strategy in strategies:
            isht = inverse_cls(grid, nlat, nlon, dtype=dtype, legendre=strategy)
            y_same = device.asnumpy(isht.forward(xp.asarray(oracle[0].astype(isht.cdtype))))
            c_error = float(abs(results[strategy][0] - oracle[0]).max() / max(abs(oracle[0]).max(), 1e-300))
            y_error = float(abs(y_same - oracle[1]).max() / max(abs(oracle[1]).max(), 1e-300))
            next(r for r in rows if r.get("asked") == strategy).update(
                oracle_forward=c_error, oracle_inverse=y_error)
    sync = device.sync if torch is None or where != "cuda" else (lambda: (device.sync(), torch.cuda.synchronize()))
    times = alternated(cases, sync, repeats)
    for row in rows:
        name = row.get("asked", "torch-harmonics")
        row.update(forward_ms=times[f"{name} forward"], inverse_ms=times[f"{name} inverse"])
    for row in rows:
        row.update(kind="vector" if vector else "scalar", nlat=nlat, nlon=nlon, batch=batch,
                   dtype=numpy.dtype(dtype).name)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="361x720:32,721x1440:32,1025x2048:8",
                        help="NLATxNLON:FIELDS, comma-separated")
    parser.add_argument("--strategies", default="auto,reduce-scatter")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--kinds", default="scalar,vector")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--array-module", choices=["cupy", "numpy"], default="cupy")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from mpi4py import MPI

    import mpisphere
    device = Device(args.array_module)
    copies = copy_bandwidths(device, args.repeats)
    print(f"copies of {copies['bytes'] / 2 ** 20:.1f} MiB: device-to-device {copies['d2d_gbs']:.0f} GB/s (read + "
          f"write)" + (f", pinned host-to-device {copies['h2d_gbs']:.1f} GB/s, device-to-host "
                       f"{copies['d2h_gbs']:.1f} GB/s" if "h2d_gbs" in copies else ""), flush=True)
    th_modules = torch_harmonics(args.array_module)
    if th_modules[0] is None:
        print(f"  torch-harmonics: not compared ({th_modules[2]})", flush=True)
    rows = []
    strategies = args.strategies.split(",")
    with mpisphere.ProcessGrid(MPI.COMM_SELF) as grid:
        for case in args.cases.split(","):
            size, batch = case.split(":")
            nlat, nlon = (int(v) for v in size.split("x"))
            for dtype in (numpy.dtype(d) for d in args.dtypes.split(",")):
                for vector in (kind == "vector" for kind in args.kinds.split(",")):
                    found = bench_case(grid, device, th_modules, nlat, nlon, int(batch), dtype, vector, strategies,
                                       args.repeats, copies["d2d_gbs"])
                    reference = next((r for r in found if r["library"] == "torch-harmonics"), None)
                    for row in found:
                        ratio = "" if reference is None or row is reference else (
                            f"  x{row['forward_ms'] / reference['forward_ms']:.2f} / "
                            f"x{row['inverse_ms'] / reference['inverse_ms']:.2f} torch-harmonics")
                        extra = "" if row is reference else (
                            f", Legendre {row['legendre_ms']:.2f} ms (bound {row['legendre_bound_ms']:.2f}), "
                            f"tables {row['table_mb']:.0f} MB" + (f", oracle {row['oracle_forward']:.1e} / "
                                                                  f"{row['oracle_inverse']:.1e}"
                                                                  if "oracle_forward" in row else ""))
                        label = row["library"] if row is reference else f"mpisphere {row['asked']}"
                        print(f"  {label:26s} {row['kind']:6s} {nlat} x {nlon} x {batch} {row['dtype']}: forward "
                              f"{row['forward_ms']:.2f} ms, inverse {row['inverse_ms']:.2f} ms, pair peak "
                              f"{row['pair_peak_mb']:.0f} MB{extra}{ratio}", flush=True)
                    rows += found
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copies": copies, "rows": rows, "array_module": args.array_module,
                       "mpisphere": mpisphere.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
