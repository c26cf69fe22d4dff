"""The rates of :class:`~mpisphere.sht.strategies.MachineModel` measured here (``python -m mpisphere calibrate``).

The model predicts a strategy's time for a batch from a handful of rates
(:mod:`mpisphere.sht.strategies.machine`). :func:`calibrate` fits them to
whole transforms on one rank, on a reference problem whose tables are far
larger than any cache (361 x 720, 361 degrees and orders, 94 MB):

* the table strategy at 2 and 32 fields: the part that does not grow with
  the batch is the table read (``table bytes / table_bandwidth``), the part
  that does the products and all else a field costs (``entries * columns /
  product_rate``);
* the table-free strategy at 4 fields: its time per field (``values /
  on_the_fly_rate``).

Analysis and synthesis are fitted separately (a forward and an inverse
transform). Every time is the median of ``repeats`` calls, the strategies
alternated call by call so that drift hits both alike.
"""

import statistics
import time

import numpy

from .strategies import MachineModel, strategy
from .strategies.base import row_entries, triangle_entries
from .transforms import DistributedInverseRealSHT, DistributedRealSHT

__all__ = ["calibrate"]


def _medians(calls, repeats):
    """The median seconds of each of ``calls`` (a dict), run in alternation after one warm-up each."""
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(found) for name, found in times.items()}


def calibrate(nlat=361, nlon=720, lmax=361, repeats=5, comm=None):
    """This core's :class:`MachineModel`, fitted to whole one-rank transforms (about ten seconds).

    Run it as the transforms run: one thread (``OMP_NUM_THREADS=1``), and
    on a node whose other cores are as busy as in a job. ``comm``: the
    communicator of the one-rank grid (default ``MPI.COMM_SELF``).
    """
    from mpi4py import MPI

    from ..grid import ProcessGrid

    rng = numpy.random.default_rng(0)
    entries = triangle_entries(lmax, range(lmax), nlat)
    values = row_entries(lmax, range(lmax), nlat)
    table = strategy("transpose").table_bytes(nlat, lmax, lmax, 1, 1)
    found = {}
    with ProcessGrid(MPI.COMM_SELF if comm is None else comm) as grid:
        for direction, cls in (("analysis", DistributedRealSHT), ("synthesis", DistributedInverseRealSHT)):
            ops = {name: cls(grid, nlat, nlon, lmax, lmax, legendre=name) for name in ("transpose", "table-free")}
            calls = {}
            for name, batch in (("transpose", 2), ("transpose", 32), ("table-free", 4)):
                op = ops[name]
                domain = op.domain_shape((batch,))
                x = rng.standard_normal(domain) if direction == "analysis" else \
                    (rng.standard_normal(domain) + 1j * rng.standard_normal(domain)).astype(op.cdtype)
                out = numpy.empty(op.range_shape((batch,)), op.cdtype if direction == "analysis" else op.dtype)
                calls[name, batch] = lambda op=op, x=x, out=out: op.forward(x, out=out)
            seconds = _medians(calls, repeats)
            per_field = max((seconds["transpose", 32] - seconds["transpose", 2]) / 30, 1e-9)
            fixed = max(seconds["transpose", 2] - 2 * per_field, 0.02 * seconds["transpose", 2])
            found[f"{direction}_table_bandwidth"] = table / fixed
            found[f"{direction}_product_rate"] = 2 * entries / per_field  # two real columns a field
            found[f"{direction}_on_the_fly_rate"] = 4 * values / seconds["table-free", 4]
            for op in ops.values():
                op.free()
    return MachineModel(**found, source=f"calibrated {time.strftime('%Y-%m-%d %H:%M')} on {nlat} x {nlon}, "
                                        f"lmax {lmax}")
