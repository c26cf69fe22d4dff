"""Timing shared by the benchmark scripts (not part of the package)."""

import json
import time

import numpy
from mpi4py import MPI

import mpisphere


def mpi_version():
    """The MPI library's version line, without the NUL Open MPI ends it with (grep reads the logs as text)."""
    return MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()


def measure(comm, fn, repeats, warmup, sync=None):
    """Median, min and max (ms) over ``repeats`` of the slowest rank's time of ``fn()``.

    Each repetition starts at a barrier; ``sync`` (e.g. a CUDA stream
    synchronisation) runs inside the timed region so device work is counted.
    """
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    times = 1e3 * numpy.array(times)
    return float(numpy.median(times)), float(times.min()), float(times.max())


def measure_rounds(comm, cases, repeats, warmup, sync=None):
    """Per-round times (ms, slowest rank) of several callables timed in alternation.

    Each round runs every case of ``cases`` (a dict of name -> callable)
    once, each from a barrier, so drift of a shared machine hits all of them
    alike; the ratio of two cases is best taken round by round (the median
    of per-round ratios). Returns a dict of name -> array of ``repeats``
    times.
    """
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    if sync is not None:
        sync()
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            comm.Barrier()
            start = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            times[name].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return {name: 1e3 * numpy.array(t) for name, t in times.items()}


def write_results(path, meta, rows):
    """Write ``{"meta": meta, "rows": rows}`` as JSON, with the NumPy and mpisphere versions added to ``meta``."""
    meta = dict(meta, numpy=numpy.__version__, mpisphere=mpisphere.__version__)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def grid_shapes(grids, size, defaults=None):
    """The ``(npolar, nazimuth)`` grids of a run: ``grids`` ("1x2,2x1") or the defaults for ``size`` ranks.

    Defaults: 2 x 2 on 4 ranks, 1 x 2 and 2 x 1 on 2, MPI's balanced split otherwise (``defaults`` adds to them).
    """
    if grids:
        return [tuple(int(v) for v in g.split("x")) for g in grids.split(",")]
    known = {4: [(2, 2)], 2: [(1, 2), (2, 1)], **(defaults or {})}
    return known.get(size, [tuple(MPI.Compute_dims(size, 2))])
