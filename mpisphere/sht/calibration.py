"""The rates of ``mpisphere.sht.strategies.MachineModel`` measured here (``python -m mpisphere calibrate``).

The model predicts a strategy's time for a batch from a handful of rates
(:mod:`mpisphere.sht.strategies.machine`). ``calibrate`` fits them to
whole transforms on one rank, on reference problems whose tables are far
larger than any cache (``REFERENCES``):

* the table strategy at 2 and 32 fields: the part that does not grow with
  the batch is the table read (``table bytes / table_bandwidth``), the part
  that does the products and all else a field costs (``entries * columns /
  product_rate``);
* the table-free strategy at 4 fields: its time per field (``values /
  on_the_fly_rate``).

Analysis and synthesis, scalar and vector are fitted separately (the four
transforms). Every time is the median of ``repeats`` calls, the strategies
alternated call by call so that drift hits both alike.
"""

import statistics
import time

import numpy

from .strategies import STRATEGIES, MachineModel
from .transforms import DistributedInverseRealSHT, DistributedRealSHT
from .vector import DistributedInverseRealVectorSHT, DistributedRealVectorSHT

__all__ = ["calibrate", "REFERENCES"]


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


REFERENCES = {"scalar": (361, 720, 361), "vector": (241, 480, 241)}
"""The reference problems: ``(nlat, nlon, lmax)``, tables far larger than any cache (94 and 56 MB)."""


def calibrate(repeats=5, comm=None):
    """This core's :class:`MachineModel`, fitted to whole one-rank transforms (about half a minute).

    Run it as the transforms run: one thread (``OMP_NUM_THREADS=1``), and
    on a node whose other cores are as busy as in a job. ``comm``: the
    communicator of the one-rank grid (default ``MPI.COMM_SELF``).
    """
    from mpi4py import MPI

    from ..grid import ProcessGrid

    classes = {("scalar", "analysis"): DistributedRealSHT, ("scalar", "synthesis"): DistributedInverseRealSHT,
               ("vector", "analysis"): DistributedRealVectorSHT,
               ("vector", "synthesis"): DistributedInverseRealVectorSHT}
    # the rates of the two kinds of kernel the model knows: a table product (the first strategy holding
    # tables at every latitude) and functions evaluated as they go (the first holding none)
    products = next(r for r in STRATEGIES if r.holds_tables and r.polar_transposes)
    on_the_fly = next(r for r in STRATEGIES if not r.holds_tables)
    rng = numpy.random.default_rng(0)
    found = {}
    with ProcessGrid(MPI.COMM_SELF if comm is None else comm) as grid:
        for (kind, direction), cls in classes.items():
            nlat, nlon, lmax = REFERENCES[kind]
            vector = kind == "vector"
            components = 2 if vector else 1
            entries = products.values(lmax, range(lmax), nlat, nlat, 1, vector)
            values = on_the_fly.values(lmax, range(lmax), nlat, nlat, 1, vector)
            table = products.table_bytes(nlat, lmax, lmax, 1, 1, vector=vector)
            ops = {r.name: cls(grid, nlat, nlon, lmax, lmax, legendre=r.name) for r in (products, on_the_fly)}
            calls = {}
            for name, batch in ((products.name, 2), (products.name, 32), (on_the_fly.name, 4)):
                op = ops[name]
                domain = op.domain_shape((batch,))
                x = rng.standard_normal(domain) if direction == "analysis" else \
                    (rng.standard_normal(domain) + 1j * rng.standard_normal(domain)).astype(op.cdtype)
                out = numpy.empty(op.range_shape((batch,)), op.cdtype if direction == "analysis" else op.dtype)
                calls[name, batch] = lambda op=op, x=x, out=out: op.forward(x, out=out)
            seconds = _medians(calls, repeats)
            per_field = max((seconds[products.name, 32] - seconds[products.name, 2]) / 30, 1e-9)
            fixed = max(seconds[products.name, 2] - 2 * per_field, 0.02 * seconds[products.name, 2])
            found[f"{kind}_{direction}_table_bandwidth"] = table / fixed
            found[f"{kind}_{direction}_product_rate"] = 2 * components * entries / per_field  # 2 C real columns
            found[f"{kind}_{direction}_on_the_fly_rate"] = 4 * components * values / seconds[on_the_fly.name, 4]
            for op in ops.values():
                op.free()
    return MachineModel(**found, source=f"calibrated {time.strftime('%Y-%m-%d %H:%M')}")
