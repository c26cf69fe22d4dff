"""Careless-user mistakes made on one rank, run under mpiexec by test_misuse.py (not collected by pytest).

    mpiexec -n 4 python tests/misuse_cases.py --out DIR [--debug] [--only CASE]

Every case makes one mistake on one rank (rank 1 unless said otherwise) and
records, per rank, whether the call raised (type and message) or returned.
Each rank appends one JSON line per case to ``DIR/rank<r>.jsonl``; a watchdog
ends a rank stuck in a case (a hang), which the outer test reports as a
failure naming the case. The cases are the rows of issue 11's table, then
issue 24's classes (mistakes around the operators: halos, parameters of
models and spectral operators, whole-field collectives, compositions against
their parts, threads, failed allocations, verdicts), and legal programs
that must run.
"""

import argparse
import faulthandler
import json
import os
import resource
import shutil
import sys
import tempfile
import threading

import numpy
from mpi4py import MPI

from mpisphere import (CopyTo, DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedReducedRealSHT,
                       GatherFrom, GatherFromCopyTo, HaloExchange, LinearOperator, PointInterpolation, ProcessGrid,
                       ReduceFrom, RingGeometry, RingTiles, ScatterTo, Transpose, config, dottest, split_sizes)
from mpisphere.examples import ShallowWaterSolver
from mpisphere.operators import DISTRIBUTED, Layout
from mpisphere.sht import calculus

NLAT, NLON = 13, 10
FOLDERS = []  # the cases' temporary stores, removed at the end


def _chunk(extent, comm):
    return split_sizes(extent, comm.Get_size())[comm.Get_rank()]


def _grid(comm):
    size = comm.Get_size()
    return ProcessGrid(comm, *{1: (1, 1), 2: (1, 2), 4: (2, 2)}.get(size, MPI.Compute_dims(size, 2)))


# --- the cases: each returns nothing; the harness records raise/return per rank ------------------

def chunk_width(comm, grid, me):
    """A wrong chunk width, visible only on the rank that has it."""
    p = comm.Get_size()
    GatherFrom(comm, -1, 3 * p).forward(numpy.zeros((2, 3 + (me == p - 1))))


def batch_gather_from(comm, grid, me):
    GatherFrom(comm, -1, 3 * comm.Get_size()).forward(numpy.zeros((2 + (me == 1), 3)))


def batch_reduce_from(comm, grid, me):
    ReduceFrom(comm).forward(numpy.zeros((2 + (me == 1), 4)))


def batch_transpose(comm, grid, me):
    p = comm.Get_size()
    Transpose(comm, axes=(1, 2), extents=(p, 3 * p)).forward(numpy.zeros((2 + (me == 1), p, 3)))


def batch_halo(comm, grid, me):
    h, w = grid.local_shape(NLAT, NLON)
    HaloExchange(grid, 1, 1).forward(numpy.zeros((2 + (me == 1), h, w)))


def batch_sht(comm, grid, me):
    sht = DistributedRealSHT(grid, NLAT, NLON)
    sht.forward(numpy.zeros((2 + (me == 1),) + sht.tile_shape))


def dtype_gather_from(comm, grid, me):
    GatherFrom(comm, -1, 3 * comm.Get_size()).forward(numpy.zeros((2, 3), numpy.float32 if me == 1 else numpy.float64))


def dtype_copy_to_adjoint(comm, grid, me):
    CopyTo(comm).adjoint(numpy.zeros((2, 3), numpy.float32 if me == 1 else numpy.float64))


def out_shape(comm, grid, me):
    x = numpy.ones((2, 4))
    ReduceFrom(comm).forward(x, out=numpy.zeros((2, 5) if me == 1 else (2, 4)))


def out_dtype(comm, grid, me):
    x = numpy.ones((2, 4))
    ReduceFrom(comm).forward(x, out=numpy.zeros((2, 4), numpy.float32 if me == 1 else numpy.float64))


def out_read_only(comm, grid, me):
    out = numpy.zeros((2, 4))
    out.flags.writeable = me != 1
    ReduceFrom(comm).forward(numpy.ones((2, 4)), out=out)


def other_operator(comm, grid, me):
    """GatherFrom.forward on every rank but one, which runs GatherFromCopyTo.adjoint."""
    p = comm.Get_size()
    if me == 1:
        GatherFromCopyTo(comm, -1, 3 * p).adjoint(numpy.zeros((2, 3 * p)))
    else:
        GatherFrom(comm, -1, 3 * p).forward(numpy.zeros((2, 3)))


def other_extent(comm, grid, me):
    """An operator built with another extent on one rank (its input fits its own operator)."""
    p = comm.Get_size()
    extent = 3 * p + (1 if me == 1 else 0)
    GatherFrom(comm, -1, extent).forward(numpy.zeros((2, _chunk(extent, comm))))


def sht_lmax(comm, grid, me):
    sht = DistributedRealSHT(grid, NLAT, NLON, lmax=5 if me == 1 else None)
    sht.forward(numpy.zeros((2,) + sht.tile_shape))


def halo_wider_than_neighbour(comm, grid, me):
    """Without extents: rank 1's tile is narrower than the halo its neighbours ask of it."""
    h, w = grid.local_shape(NLAT, NLON)
    HaloExchange(grid, 1, 3).forward(numpy.zeros((2, h, 2 if me == 1 else w)))


def halo_tile_widths(comm, grid, me):
    """Without extents: rank 0's tile is one column wider than its column's (a field that is no field)."""
    h, w = grid.local_shape(NLAT, NLON)
    widen = me == 0
    shape = (2, h + (widen and grid.npolar == 1), w + (widen and grid.npolar > 1))
    HaloExchange(grid, 1, 1).forward(numpy.zeros(shape))


def grid_dims(comm, grid, me):
    p = comm.Get_size()
    ProcessGrid(comm, npolar=p if me == 1 else 1).free()


def grid_invalid_dims(comm, grid, me):
    ProcessGrid(comm, npolar=0 if me == 1 else None).free()


def debug_on_one_rank(comm, grid, me):
    with config.override(debug=me == 1):
        GatherFrom(comm, -1, 3 * comm.Get_size()).forward(numpy.zeros((2, 3)))


# --- issue 24: mistakes around the operators -----------------------------------------------------------------

def _polar_grid(comm):
    """A grid whose polar axis holds every rank (the halo rows and the polar communicator reach them all)."""
    return ProcessGrid(comm, comm.Get_size(), 1)


def halo_rows_zero_on_one_rank(comm, grid, me):
    """Class 1: rank 1 builds the exchange without rows; its neighbours would wait for its rows."""
    with _polar_grid(comm) as g:
        h, w = g.local_shape(NLAT, NLON)
        HaloExchange(g, 0 if me == 1 else 1, 1).forward(numpy.zeros((2, h, w)))


def halo_cols_zero_in_the_call(comm, grid, me):
    """Class 1: both exchanges built everywhere; rank 1 calls the one without columns."""
    h, w = grid.local_shape(NLAT, NLON)
    with_cols, without = HaloExchange(grid, 1, 1), HaloExchange(grid, 1, 0)
    (without if me == 1 else with_cols).forward(numpy.zeros((2, h, w)))


def halo_poles_across_on_one_rank(comm, grid, me):
    """Class 1: poles='across' on rank 1, zeros past the poles elsewhere."""
    with _polar_grid(comm) as g:
        h, w = g.local_shape(NLAT, 12)
        across = dict(poles="across", quadrature="legendre-gauss") if me == 1 else {}
        HaloExchange(g, 1, 1, extents=(NLAT, 12), **across).forward(numpy.zeros((2, h, w)))


def halo_update_against_accumulate(comm, grid, me):
    """Class 1: rank 1 accumulates while the others update: the phases run in opposite orders."""
    h, w = grid.local_shape(NLAT, NLON)
    op = HaloExchange(grid, 1, 1)
    padded = numpy.zeros((2, h + 2, w + 2))
    (op.accumulate if me == 1 else op.update)(padded)


def laplacian_radius(comm, grid, me):
    """Class 2: the Laplacian of a composition built with another radius on rank 1."""
    sht = DistributedRealSHT(grid, NLAT, NLON)
    op = calculus.laplacian(sht, 2.0 if me == 1 else 1.0) @ sht
    op.forward(numpy.ones((1,) + sht.tile_shape))


def gradient_radius(comm, grid, me):
    ivsht = DistributedInverseRealVectorSHT(grid, NLAT, NLON)
    calculus.gradient(ivsht, 6.37e6 if me == 1 else 1.0)


def hyperdiffusion_dt(comm, grid, me):
    sht = DistributedRealSHT(grid, NLAT, NLON)
    calculus.hyperdiffusion(sht, 900.0 if me == 1 else 600.0)


def solver_dt(comm, grid, me):
    """Class 2: a model built with another time step on rank 1."""
    ShallowWaterSolver(grid, 12, 24, dt=900.0 if me == 1 else 600.0, quadrature="legendre-gauss")


def scatter_root(comm, grid, me):
    """Class 3: rank 1 scatters from root 1, the others from root 0; then a correct scatter must be correct."""
    field = numpy.arange(NLAT * NLON, dtype=float).reshape(NLAT, NLON)
    try:
        grid.scatter(field, root=1 if me == 1 else 0)
    finally:
        tile = grid.scatter(field + 1000, root=0)
        lat, lon = grid.local_slices(NLAT, NLON)
        assert numpy.array_equal(tile, field[lat, lon] + 1000), "the next scatter handed out another field's tile"


def gather_root(comm, grid, me):
    h, w = grid.local_shape(NLAT, NLON)
    grid.gather(numpy.zeros((2, h, w)), root=1 if me == 1 else 0)


def integrate_grid_batch(comm, grid, me):
    """Class 3: the model's integral over batches of 3 fields on rank 1 and 2 elsewhere."""
    solver = ShallowWaterSolver(grid, 12, 24, dt=600.0, quadrature="legendre-gauss")
    h, w = grid.local_shape(12, 24)
    solver.integrate_grid(numpy.ones((3 if me == 1 else 2, h, w)))


def interpolation_same_weighted_sum(comm, grid, me):
    """Class 3: two different point sets whose old weighted-sum digest is equal (0.1 + 2 0.2 + 3 0.3 = 1.4)."""
    lats = [0.3, 0.1, 0.3] if me == 1 else [0.1, 0.2, 0.3]
    PointInterpolation(grid, NLAT, NLON, lats, [1.0, 1.0, 1.0])


def interpolation_nan_point(comm, grid, me):
    """Class 3: identical point sets with a NaN in them: the same set, refused for its NaN on every rank."""
    PointInterpolation(grid, NLAT, NLON, [0.1, float("nan")], [1.0, 1.0])


def interpolation_last_rank(comm, grid, me):
    """Class 3: the last rank's points differ; the message names it, not rank 0."""
    last = comm.Get_size() - 1
    PointInterpolation(grid, NLAT, NLON, [0.1, 0.2 + (me == last)], [1.0, 1.0])


def composition_against_parts(comm, grid, me):
    """Class 4: on the polar communicator, the composition on rank 1, its two parts one after the other elsewhere."""
    with _polar_grid(comm) as g:
        n = 2 * comm.Get_size()
        scatter, gather = ScatterTo(g.polar, -1, n), GatherFrom(g.polar, -1, n)
        x = numpy.ones((2, n))
        if me == 1:
            (gather @ scatter).forward(x)
        else:
            gather.forward(scatter.forward(x))


class _Blocking(LinearOperator):
    """An operator on a grid whose run waits for an event: it holds the grid while another thread tries."""

    def __init__(self, grid, started, release):
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self.started, self.release = started, release

    def _output(self, direction, spec):
        return spec, spec.describe()

    def _run(self, direction, x, out, context):
        self.started.set()
        self.release.wait(30)
        out[...] = x


def _worker_holding_the_grid(grid, hold):
    """A worker thread inside an operator call on ``grid``: ``(thread, release, results)``.

    The call holds the grid until ``release`` is set (at once when ``hold``
    is false); its result lands in ``results["worker"]``.
    """
    started, release = threading.Event(), threading.Event()
    if not hold:
        release.set()
    holder = _Blocking(grid, started, release)
    results = {}
    worker = threading.Thread(target=lambda: results.setdefault("worker", holder.forward(numpy.full(3, 7.0))),
                              name="worker")
    worker.start()
    started.wait(30)
    return worker, release, results


def _in_a_thread(work):
    """Run ``work()`` in a new thread and raise what it raised."""
    failure = []

    def run():
        try:
            work()
        except Exception as exc:  # noqa: BLE001 -- raised again in the calling thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if failure:
        raise failure[0]


def two_threads_on_one_grid(comm, grid, me):
    """While one thread runs an operator on the grid, another thread's operator on it raises (every rank)."""
    worker, release, results = _worker_holding_the_grid(grid, hold=True)
    try:
        ReduceFrom(grid.cart).forward(numpy.ones(3))
    finally:
        release.set()
        worker.join(30)
        assert (results["worker"] == 7.0).all()


def threads_taking_turns(comm, grid, me):
    """Class 5: rank 0's call is refused (its worker holds the grid); the other ranks make it and must raise too."""
    # elsewhere the worker's call ends at once and the main thread's call, made after it, is not refused
    worker, release, _ = _worker_holding_the_grid(grid, hold=me == 0)
    if me != 0:
        worker.join(30)
    try:
        ReduceFrom(grid.cart).forward(numpy.ones(3))
    finally:
        release.set()
        worker.join(30)


def run_in_worker_threads_named_differently(comm, grid, me):
    """Class 5, legal: the model in a worker thread on every rank, one rank having started a helper thread first."""
    if me == 1:
        helper = threading.Thread(target=lambda: None)
        helper.start()
        helper.join()

    def work():
        ReduceFrom(grid.cart).forward(numpy.ones(3))
        DistributedRealSHT(grid, NLAT, NLON).forward(numpy.ones(grid.local_shape(NLAT, NLON)))

    _in_a_thread(work)


def main_thread_against_worker(comm, grid, me):
    """Class 5, legal: rank 1 calls from a worker thread, the others from their main thread."""
    def work():
        ReduceFrom(grid.cart).forward(numpy.ones(3))

    if me == 1:
        _in_a_thread(work)
    else:
        work()


def allocation_fails_on_one_rank(comm, grid, me):
    """Class 6: identical valid GatherFrom calls; rank 1 cannot allocate the 256 MB result (a real MemoryError)."""
    p = comm.Get_size()
    n = (32 << 20) // p  # float64 entries per rank: the whole result is 256 MB
    x = numpy.ones((1, n))
    op = GatherFrom(comm, -1, n * p)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    if me == 1:  # the address space this process has now plus 64 MB: the result does not fit
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), limits[1]))
    try:
        op.forward(x)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)


def dottest_rtol(comm, grid, me):
    """Class 7: rtol=1e-30 on rank 1, 1e-12 elsewhere: one verdict for every rank (here: they disagree)."""
    dottest(GatherFrom(comm, -1, 3 * comm.Get_size()), rtol=1e-30 if me == 1 else 1e-12, lead=(2, 1))


def gather_coefficients_short(comm, grid, me):
    """Class 7: rank 1's block is one column short; every rank raises before anything moves."""
    sht = DistributedRealSHT(grid, NLAT, NLON, orders="balanced")
    l_loc, m_loc = sht.block_shape
    sht.gather_coefficients(numpy.zeros((l_loc, m_loc - (me == 1)), sht.cdtype))


# --- issue 39: the entry points outside the operators; each mistake on the last rank only -----------------

def _folder(comm):
    """A new temporary folder, the same on every rank (one machine)."""
    path = comm.bcast(tempfile.mkdtemp(prefix="mpisphere-misuse-") if comm.Get_rank() == 0 else None)
    FOLDERS.append(path)
    return path


def _last(comm):
    return comm.Get_size() - 1


def _in_step_then(comm, first):
    """Every rank must still be in step (a hang here is the failure); then the first exception, as one kind."""
    ReduceFrom(comm).forward(numpy.ones(1))
    raise RuntimeError(f"{type(first).__name__}: {first}")


def checkpoint_fails_on_the_last_rank_before_writing(comm, grid, me):
    """The last rank raises inside the block before its first write: every rank raises, none waits afterwards."""
    from mpisphere.io import checkpoint
    path = _folder(comm)
    h, w = grid.local_shape(NLAT, NLON)
    first = None
    try:
        with checkpoint(f"{path}/ck", grid) as store:
            if me == _last(comm):
                raise KeyError("a bug on the last rank")
            store.write_tiles("t", numpy.ones((h, w)), NLAT, NLON)
    except Exception as exc:  # noqa: BLE001
        first = exc
    _in_step_then(comm, first)


def checkpoint_keep_on_the_last_rank(comm, grid, me):
    from mpisphere.io import checkpoint
    with checkpoint(f"{_folder(comm)}/ck", grid, keep=3 if me == _last(comm) else 2):
        pass


def store_mode_on_the_last_rank(comm, grid, me):
    from mpisphere.io import FieldStore
    FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="rw" if me == _last(comm) else "w")


def _allocation_limited(comm, me, call):
    """``call()`` with the last rank's address space limited to what it has now plus 8 MB."""
    limits = resource.getrlimit(resource.RLIMIT_AS)
    if me == _last(comm):
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (8 << 20), limits[1]))
    try:
        call()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)


def store_write_allocation_fails_on_the_last_rank(comm, grid, me):
    """The last rank cannot allocate the write's exchange buffers (twice its tile): every rank raises."""
    from mpisphere.io import FieldStore
    store = FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="w")
    nlat, nlon = 512, 1024
    tile = numpy.ones((32,) + grid.local_shape(nlat, nlon))  # 128 MB over the ranks: 32 MB or more on each
    _allocation_limited(comm, me, lambda: store.write_tiles("big", tile, nlat, nlon))


def store_read_allocation_fails_on_the_last_rank(comm, grid, me):
    from mpisphere.io import FieldStore
    store = FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="w")
    nlat, nlon = 512, 1024
    store.write_tiles("big", numpy.ones((32,) + grid.local_shape(nlat, nlon)), nlat, nlon)
    _allocation_limited(comm, me, lambda: store.read_tiles("big", nlat, nlon))


def coefficients_orders_on_the_last_rank(comm, grid, me):
    """Blocks written by a balanced transform on the last rank, contiguous ones elsewhere: refused, not mixed."""
    from mpisphere.io import FieldStore
    nlat, nlon = 33, 64
    sht = DistributedRealSHT(grid, nlat, nlon, orders="balanced" if me == _last(comm) else "contiguous")
    store = FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="w")
    store.write_coefficients("c", numpy.zeros(sht.block_shape, sht.cdtype), sht)


def set_attrs_values_on_the_last_rank(comm, grid, me):
    from mpisphere.io import FieldStore
    FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="w").set_attrs({"a": 2 if me == _last(comm) else 1})


def set_attrs_in_another_key_order_on_the_last_rank(comm, grid, me):
    """Legal: equal attributes in another key order."""
    from mpisphere.io import FieldStore
    attrs = {"b": [1, 2], "a": {"y": 1.5, "x": "s"}} if me == _last(comm) else {"a": {"x": "s", "y": 1.5},
                                                                               "b": [1, 2]}
    FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="w").set_attrs(attrs)


def write_attrs_in_another_key_order_on_the_last_rank(comm, grid, me):
    """Legal: a variable's equal attributes in another key order."""
    from mpisphere.io import FieldStore
    attrs = {"units": "m", "long_name": "h"} if me == _last(comm) else {"long_name": "h", "units": "m"}
    store = FieldStore(f"{_folder(comm)}/s.zarr", grid, mode="w")
    store.write_tiles("h", numpy.ones(grid.local_shape(NLAT, NLON)), NLAT, NLON, attrs=attrs)


def _solver(grid, **options):
    return ShallowWaterSolver(grid, 12, 24, dt=150.0, quadrature="legendre-gauss", **options)


def leapfrog_history_ahead_on_the_last_rank(comm, grid, me):
    """The last rank's history two steps ahead: every rank raises instead of running the others' steps."""
    swe = _solver(grid, scheme="semi-implicit")
    u = swe.random_initial_condition()
    history = swe.new_history()
    u = swe.timestep(u, 1, history)
    if me == _last(comm):
        history.step += 2
    swe.timestep(u, 1, history)


def history_malformed_on_the_last_rank(comm, grid, me):
    swe = _solver(grid)
    u = swe.random_initial_condition()
    history = swe.new_history()
    u = swe.timestep(u, 3, history)
    if me == _last(comm):
        history.tendencies.pop(min(history.tendencies))
    swe.timestep(u, 1, history)


def state_not_finite_on_the_last_rank(comm, grid, me):
    """A model that blows up (here: a NaN planted on the last rank) raises on every rank naming the step."""
    swe = _solver(grid)
    u = swe.random_initial_condition()
    if me == _last(comm):
        u[0].flat[0] = numpy.nan
    swe.timestep(u, 2)


def save_not_finite_on_the_last_rank(comm, grid, me):
    swe = _solver(grid)
    u = swe.random_initial_condition()
    if me == _last(comm):
        u[1].flat[0] = numpy.inf
    swe.save(f"{_folder(comm)}/ck", u)


def save_allow_nonfinite_on_the_last_rank(comm, grid, me):
    """``allow_nonfinite=True`` on the last rank only, the state finite: the flag is named."""
    swe = _solver(grid)
    swe.save(f"{_folder(comm)}/ck", swe.random_initial_condition(), allow_nonfinite=me == _last(comm))


def save_allow_nonfinite_on_rank_0_not_finite(comm, grid, me):
    """``allow_nonfinite=True`` on rank 0 only, and the state blown up everywhere: the refusal is named."""
    swe = _solver(grid)
    u = swe.random_initial_condition()
    u[0].flat[0] = numpy.nan
    swe.save(f"{_folder(comm)}/ck", u, allow_nonfinite=me == 0)


def _halo_then_next_call(comm, culprit, me):
    """A column of ranks (``size x 1``): rank ``culprit`` passes a dtype no halo moves. The ranks next to it raise
    in the call; the others return and must raise at the end of their next call, which a program that catches
    makes on every rank (it completes: no rank waits)."""
    from helpers import await_failure_note
    with ProcessGrid(comm, comm.Get_size(), 1) as column:
        halo = HaloExchange(column, 1, 1, extents=(4 * comm.Get_size(), 8))
        h, w = column.local_shape(4 * comm.Get_size(), 8)
        good = numpy.zeros((h + 2, w + 2))
        try:
            halo.update(good.astype(numpy.int8) if me == culprit else good)
        except TypeError as first:
            halo.update(good)  # the same next call as the others: it completes, and raises nothing more here
            raise first
        await_failure_note(column)  # the note is on its way: the verdict does not depend on its speed
        halo.update(good)


def halo_far_ranks_on_the_last_rank(comm, grid, me):
    _halo_then_next_call(comm, _last(comm), me)


def halo_far_ranks_on_rank_0(comm, grid, me):
    _halo_then_next_call(comm, 0, me)


# --- issue 48: replayed halo calls (mpisphere.halo.planned) next to a mistake ------------------------------------

def _replayed_halo_then_next_call(comm, culprit, me, mistake, before=None):
    """As ``_halo_then_next_call``, after two good calls on every rank (the others replay the third): rank
    ``culprit`` makes ``mistake(halo, good)`` instead. ``before(column)``, on every rank, returns the function
    that ends what it began (after the call)."""
    from helpers import await_failure_note
    with ProcessGrid(comm, comm.Get_size(), 1) as column:
        halo = HaloExchange(column, 1, 1, extents=(4 * comm.Get_size(), 8))
        h, w = column.local_shape(4 * comm.Get_size(), 8)
        good = numpy.zeros((h + 2, w + 2))
        halo.update(good)
        halo.update(good)
        end = before(column) if before is not None else (lambda: None)
        try:
            mistake(halo, good) if me == culprit else halo.update(good)
        except (TypeError, RuntimeError) as first:
            end()
            halo.update(good)  # the same next call as the others: it completes, and raises nothing more here
            raise first
        end()
        await_failure_note(column)
        halo.update(good)


def halo_replay_next_to_a_dtype_on_the_last_rank(comm, grid, me):
    """The last rank passes a dtype no halo moves while the others replay their planned update."""
    _replayed_halo_then_next_call(comm, _last(comm), me, lambda halo, good: halo.update(good.astype(numpy.int8)))


def halo_replay_refused_in_a_thread_on_rank_0(comm, grid, me):
    """Rank 0's call is refused (a worker thread holds its grid) while the others replay their planned update."""
    def worker(column):  # every rank runs the worker's call (it agrees over the grid); rank 0's holds the grid
        thread, release, _ = _worker_holding_the_grid(column, hold=me == 0)
        if me != 0:
            thread.join(30)

        def end():
            release.set()
            thread.join(30)
        return end
    _replayed_halo_then_next_call(comm, 0, me, lambda halo, good: halo.update(good), worker)


def laplacian_radius_zero_on_the_last_rank(comm, grid, me):
    calculus.laplacian(DistributedRealSHT(grid, NLAT, NLON), 0.0 if me == _last(comm) else 1.0)


def laplacian_radius_huge_on_the_last_rank(comm, grid, me):
    calculus.inverse_laplacian(DistributedRealSHT(grid, NLAT, NLON), 1e300 if me == _last(comm) else 1.0)


def hyperdiffusion_negative_dt_on_the_last_rank(comm, grid, me):
    calculus.hyperdiffusion(DistributedRealSHT(grid, NLAT, NLON), -600.0 if me == _last(comm) else 600.0)


# --- issue 40: tiles in memory shared on the node ---------------------------------------------------------

def shared_lead_on_the_last_rank(comm, grid, me):
    """The allocation is collective: another number of fields on the last rank."""
    HaloExchange(grid, 1, 1, extents=(NLAT, NLON)).zeros(3 if me == _last(comm) else 2)


def shared_without_extents_on_the_last_rank(comm, grid, me):
    """A halo without extents does not know the tile: the last rank allocates from one."""
    with_extents, without = HaloExchange(grid, 1, 1, extents=(NLAT, NLON)), HaloExchange(grid, 1, 1)
    (without if me == _last(comm) else with_extents).zeros(2)


def shared_update_against_accumulate(comm, grid, me):
    """Shared tiles everywhere; the last rank accumulates while the others update (their blocks left to read)."""
    op = HaloExchange(grid, 1, 1, extents=(NLAT, NLON))
    padded = op.zeros(2)
    (op.accumulate if me == _last(comm) else op.update)(padded)


def shared_plain_batch_on_the_last_rank(comm, grid, me):
    """Shared tiles everywhere but on the last rank, which passes a plain array of another batch."""
    op = HaloExchange(grid, 1, 1, extents=(NLAT, NLON))
    padded = op.zeros(2)
    if me == _last(comm):
        padded = numpy.zeros((3,) + padded.shape[1:])
    op.update(padded)


# --- issue 41: reduced grids; each mistake on the last rank only ---------------------------------------------

def ring_gather_not_an_array_on_the_last_rank(comm, grid, me):
    """The last rank hands RingTiles.gather a list where its points belong."""
    tiles = RingTiles(grid, RingGeometry.octahedral(4))
    part = numpy.zeros(tiles.npoints)
    tiles.gather(part.tolist() if me == _last(comm) else part)


def ring_scatter_points_on_the_last_rank(comm, grid, me):
    """The last rank scatters a field with one point too many (root is the last rank)."""
    rings = RingGeometry.octahedral(4)
    field = numpy.zeros(rings.npoints + 1) if me == _last(comm) else None
    RingTiles(grid, rings).scatter(field, root=_last(comm))


def ring_points_on_the_last_rank(comm, grid, me):
    """A reduced-grid transform whose input on the last rank has one point too many."""
    sht = DistributedReducedRealSHT(grid, RingGeometry.octahedral(4))
    sht.forward(numpy.zeros((2, sht.tiles.npoints + (me == _last(comm)))))


def ring_interpolation_whole_field_on_the_last_rank(comm, grid, me):
    """The last rank passes the whole field where its points belong."""
    rings = RingGeometry.octahedral(4)
    op = PointInterpolation(RingTiles(grid, rings), [0.3, -0.2], [1.0, 4.0])
    op.forward(numpy.zeros(rings.npoints if me == _last(comm) else op.tiles.npoints))


# issue 46: a call made on some ranks only, grid.free() among them

def _free_while_one_transforms(comm, grid, culprit):
    own = ProcessGrid(comm, grid.npolar, grid.nazimuth)
    sht = DistributedRealSHT(own, NLAT, NLON)
    try:
        if comm.Get_rank() == culprit:
            sht.forward(numpy.zeros(own.local_shape(NLAT, NLON)))
        own.free()
    finally:
        own.free()  # after the error every rank is in step: this free is made by all


def free_while_the_last_rank_transforms(comm, grid, me):
    """The last rank is still in a transform while the others free the grid (and would exit)."""
    _free_while_one_transforms(comm, grid, _last(comm))


def free_while_rank_0_transforms(comm, grid, me):
    """The same mistake on rank 0."""
    _free_while_one_transforms(comm, grid, 0)


def a_call_ahead_on_rank_0(comm, grid, me):
    """Rank 0 makes one forward transform more (inside 'if rank == 0:'); then every rank makes the inverse."""
    sht, isht = DistributedRealSHT(grid, NLAT, NLON), DistributedInverseRealSHT(grid, NLAT, NLON)
    coefficients = sht.forward(numpy.zeros(grid.local_shape(NLAT, NLON)))
    if me == 0:
        sht.forward(numpy.zeros(grid.local_shape(NLAT, NLON)))
    isht.forward(coefficients)


def _is_last(comm, me):
    return me == comm.Get_size() - 1


def _machine_model_missing(grid, odd):
    """``MPISPHERE_MACHINE_MODEL`` names a file that is not there, on rank ``odd`` only."""
    from mpisphere.sht.strategies.machine import MODEL_VARIABLE
    before = os.environ.get(MODEL_VARIABLE)
    if grid.rank == odd:
        os.environ[MODEL_VARIABLE] = "/nonexistent/machine.json"
    try:
        DistributedRealSHT(grid, NLAT, NLON).forward(numpy.zeros(grid.local_shape(NLAT, NLON)))
    finally:
        if before is None:
            os.environ.pop(MODEL_VARIABLE, None)
        else:
            os.environ[MODEL_VARIABLE] = before


def machine_model_missing_on_the_last_rank(comm, grid, me):
    _machine_model_missing(grid, _last(comm))


def machine_model_missing_on_rank_0(comm, grid, me):
    _machine_model_missing(grid, 0)


def disco_tile_on_the_last_rank(comm, grid, me):
    """The last rank passes one row too many to a DISCO convolution."""
    from mpisphere import DiscoConvS2
    conv = DiscoConvS2(grid, (NLAT, 2 * NLON), (NLAT, 2 * NLON), (3,), numpy.ones((2, 2, 2)))
    h, w = grid.local_shape(NLAT, 2 * NLON)
    conv.forward(numpy.zeros((1, 2, h + _is_last(comm, me), w)))


def disco_weight_on_the_last_rank(comm, grid, me):
    """The last rank's weights differ (a checkpoint read on one rank)."""
    from mpisphere import DiscoConvS2
    conv = DiscoConvS2(grid, (NLAT, 2 * NLON), (NLAT, 2 * NLON), (3,), numpy.ones((2, 2, 2)))
    conv.weight = numpy.ones((2, 2, 2)) * (2 if _is_last(comm, me) else 1)
    conv.forward(numpy.zeros((1, 2) + grid.local_shape(NLAT, 2 * NLON)))


def disco_bias_in_the_gradients_on_the_last_rank(comm, grid, me):
    """The last rank's bias differs, seen by the gradients (the bias is a parameter the ranks compare)."""
    from mpisphere import DiscoConvS2
    conv = DiscoConvS2(grid, (NLAT, 2 * NLON), (NLAT, 2 * NLON), (3,), numpy.ones((2, 2, 2)), bias=numpy.zeros(2))
    conv.set_parameters(bias=numpy.full(2, 2.0 if _is_last(comm, me) else 1.0))
    x = numpy.zeros((1, 2) + grid.local_shape(NLAT, 2 * NLON))
    conv.gradients(x, x)


def _attention(grid, **changed):
    from mpisphere import NeighborhoodAttentionS2
    options = dict(num_heads=1, theta_cutoff=None)
    options.update(changed)
    op = NeighborhoodAttentionS2(grid, 2, (NLAT, 2 * NLON), (NLAT, 2 * NLON), options["num_heads"],
                                 theta_cutoff=options["theta_cutoff"])
    op.set_parameters(**{n: numpy.ones((2, 2)) for n in ("q_weights", "k_weights", "v_weights", "proj_weights")})
    return op


def attention_heads_on_the_last_rank(comm, grid, me):
    """The last rank builds its attention with two heads, the others with one."""
    _attention(grid, num_heads=2 if _is_last(comm, me) else 1)


def attention_key_tile_on_the_last_rank(comm, grid, me):
    """The last rank passes a key one row short of its tile."""
    op = _attention(grid)
    h, w = grid.local_shape(NLAT, 2 * NLON)
    query = numpy.zeros((1, 2, h, w))
    op.forward(query, numpy.zeros((1, 2, h - _is_last(comm, me), w)), query)


def spectral_convolution_whole_field_on_the_last_rank(comm, grid, me):
    """The last rank passes the whole field where its tile belongs."""
    from mpisphere import SpectralConvS2
    from mpisphere.spectral_convolution import spectral_truncation
    lmax = spectral_truncation((NLAT, 2 * NLON), (NLAT, 2 * NLON))
    conv = SpectralConvS2(grid, (NLAT, 2 * NLON), (NLAT, 2 * NLON), numpy.ones((1, 2, 2, lmax), complex))
    shape = (NLAT, 2 * NLON) if _is_last(comm, me) else grid.local_shape(NLAT, 2 * NLON)
    conv.forward(numpy.zeros((1, 2) + shape))


def resample_dtype_on_the_last_rank(comm, grid, me):
    from mpisphere import ResampleS2
    op = ResampleS2(grid, (NLAT, 2 * NLON), (2 * NLAT, 4 * NLON))
    op.forward(numpy.zeros(grid.local_shape(NLAT, 2 * NLON), numpy.float32 if _is_last(comm, me) else numpy.float64))


# --- issue 56 ---------------------------------------------------------------------------------------------

def refused_free_then_a_halo_mistake_on_rank_0(comm, grid, me):
    """The last rank frees a column grid while the others transform on it (refused on every rank); then rank 0
    passes a dtype no halo moves: the far ranks must still hear of it (a refused free left them deaf)."""
    from helpers import await_failure_note
    with ProcessGrid(comm, comm.Get_size(), 1) as column:
        sht = DistributedRealSHT(column, 4 * comm.Get_size(), 8)
        try:
            if me == _last(comm):
                column.free()
            else:
                sht.forward(numpy.zeros(column.local_shape(4 * comm.Get_size(), 8)))
        except ValueError:
            pass  # refused on every rank, as the table's free rows show
        halo = HaloExchange(column, 1, 1, extents=(4 * comm.Get_size(), 8))
        h, w = column.local_shape(4 * comm.Get_size(), 8)
        good = numpy.zeros((h + 2, w + 2))
        try:
            halo.update(good.astype(numpy.int8) if me == 0 else good)
        except TypeError as first:
            halo.update(good)
            raise first
        await_failure_note(column)
        halo.update(good)


def _free_between_halo_replays(comm, culprit):
    with ProcessGrid(comm, comm.Get_size(), 1) as column:  # at 4 ranks, two ranks lie beyond the culprit's reach
        nlat = 4 * comm.Get_size()
        halo = HaloExchange(column, 1, 1, extents=(nlat, 8))
        padded = numpy.zeros((column.local_shape(nlat, 8)[0] + 2, 10))
        for _ in range(3):  # planned at the second call, replayed from the third
            halo.update(padded)
        if column.rank == culprit:
            column.free()
        halo.update(padded)


def free_between_halo_replays_on_the_last_rank(comm, grid, me):
    """The last rank frees the grid while the others replay a planned halo call (they waited for each other)."""
    _free_between_halo_replays(comm, _last(comm))


def free_between_halo_replays_on_rank_0(comm, grid, me):
    """The same mistake on rank 0."""
    _free_between_halo_replays(comm, 0)


def tiling_extents_on_the_last_rank(comm, grid, me):
    """A regular tiling of one more latitude on the last rank: its part would be larger than what root sends."""
    tiling = grid.tiling(NLAT + (1 if _is_last(comm, me) else 0), NLON)
    tiling.scatter(numpy.zeros((NLAT, NLON)) if me == 0 else None)


def ring_tiles_rings_on_the_last_rank(comm, grid, me):
    """RingTiles of O5 on the last rank, O4 elsewhere: the gathered parts would not fit root's field."""
    tiles = RingTiles(grid, RingGeometry.octahedral(5 if _is_last(comm, me) else 4))
    tiles.gather(numpy.zeros(tiles.npoints))


def disco_nan_on_the_last_rank(comm, grid, me):
    """One missing value (NaN) in the last rank's tile of a DISCO convolution's input."""
    from mpisphere import DiscoConvS2
    op = DiscoConvS2(grid, (NLAT, 2 * NLON), (NLAT, 2 * NLON), (3,), numpy.ones((2, 2, 2)))
    x = numpy.zeros((1, 2) + grid.local_shape(NLAT, 2 * NLON))
    if _is_last(comm, me):
        x[0, 1, 0, 0] = numpy.nan
    op.forward(x)


CASES = [chunk_width, batch_gather_from, batch_reduce_from, batch_transpose, batch_halo, batch_sht,
         dtype_gather_from, dtype_copy_to_adjoint, out_shape, out_dtype, out_read_only, other_operator,
         disco_tile_on_the_last_rank, disco_weight_on_the_last_rank, disco_bias_in_the_gradients_on_the_last_rank,
         attention_heads_on_the_last_rank, attention_key_tile_on_the_last_rank,
         spectral_convolution_whole_field_on_the_last_rank,
         resample_dtype_on_the_last_rank, machine_model_missing_on_the_last_rank, machine_model_missing_on_rank_0,
         other_extent, sht_lmax, halo_wider_than_neighbour, halo_tile_widths, grid_dims, grid_invalid_dims,
         debug_on_one_rank, two_threads_on_one_grid,
         # issue 24
         halo_rows_zero_on_one_rank, halo_cols_zero_in_the_call, halo_poles_across_on_one_rank,
         halo_update_against_accumulate, laplacian_radius, gradient_radius, hyperdiffusion_dt, solver_dt, scatter_root,
         gather_root, integrate_grid_batch, interpolation_same_weighted_sum, interpolation_nan_point,
         interpolation_last_rank, composition_against_parts, threads_taking_turns,
         run_in_worker_threads_named_differently, main_thread_against_worker, allocation_fails_on_one_rank,
         dottest_rtol, gather_coefficients_short,
         # issue 39
         checkpoint_fails_on_the_last_rank_before_writing, checkpoint_keep_on_the_last_rank,
         store_mode_on_the_last_rank, store_write_allocation_fails_on_the_last_rank,
         store_read_allocation_fails_on_the_last_rank, coefficients_orders_on_the_last_rank,
         set_attrs_values_on_the_last_rank, set_attrs_in_another_key_order_on_the_last_rank,
         write_attrs_in_another_key_order_on_the_last_rank, leapfrog_history_ahead_on_the_last_rank,
         history_malformed_on_the_last_rank, state_not_finite_on_the_last_rank, save_not_finite_on_the_last_rank,
         save_allow_nonfinite_on_the_last_rank, save_allow_nonfinite_on_rank_0_not_finite,
         halo_far_ranks_on_the_last_rank, halo_far_ranks_on_rank_0,
         laplacian_radius_zero_on_the_last_rank, laplacian_radius_huge_on_the_last_rank,
         hyperdiffusion_negative_dt_on_the_last_rank,
         # issue 40
         shared_lead_on_the_last_rank, shared_without_extents_on_the_last_rank, shared_update_against_accumulate,
         shared_plain_batch_on_the_last_rank,
         # issue 41
         ring_gather_not_an_array_on_the_last_rank, ring_scatter_points_on_the_last_rank, ring_points_on_the_last_rank,
         ring_interpolation_whole_field_on_the_last_rank,
         # issue 46
         free_while_the_last_rank_transforms, free_while_rank_0_transforms, a_call_ahead_on_rank_0,
         # issue 48
         halo_replay_next_to_a_dtype_on_the_last_rank, halo_replay_refused_in_a_thread_on_rank_0,
         # issue 56
         refused_free_then_a_halo_mistake_on_rank_0, tiling_extents_on_the_last_rank, ring_tiles_rings_on_the_last_rank,
         disco_nan_on_the_last_rank, free_between_halo_replays_on_the_last_rank, free_between_halo_replays_on_rank_0]


# --- issue 56: the drop-in modules' construction (needs torch: test_misuse.py skips these rows without it) ------

def _dropin_disco(grid, **changed):
    import torch  # noqa: F401 -- the rows need the torch extra
    import mpisphere.torch_harmonics as thd
    options = dict(in_channels=2, out_channels=2, in_shape=(NLAT, 2 * NLON), out_shape=(NLAT, 2 * NLON),
                   kernel_shape=(3,))
    thd.DistributedDiscreteContinuousConvS2(**{**options, **changed}, process_grid=grid)


def dropin_groups_on_the_last_rank(comm, grid, me):
    _dropin_disco(grid, groups=3 if _is_last(comm, me) else 1)


def dropin_basis_type_on_the_last_rank(comm, grid, me):
    _dropin_disco(grid, basis_type="piecewise-linear" if _is_last(comm, me) else "piecewise linear")


def dropin_polar_mode_on_the_last_rank(comm, grid, me):
    _dropin_disco(grid, polar_mode="reduce-scatter" if _is_last(comm, me) else "halo-exchange")


def dropin_in_shape_on_the_last_rank(comm, grid, me):
    _dropin_disco(grid, in_shape=NLAT if _is_last(comm, me) else (NLAT, 2 * NLON))


def dropin_spectral_groups_on_rank_0(comm, grid, me):
    import mpisphere.torch_harmonics as thd
    thd.DistributedSpectralConvS2((NLAT, 2 * NLON), (NLAT, 2 * NLON), 4, 4, num_groups=3 if me == 0 else 1,
                                  process_grid=grid)


TORCH_CASES = [dropin_groups_on_the_last_rank, dropin_basis_type_on_the_last_rank, dropin_polar_mode_on_the_last_rank,
               dropin_in_shape_on_the_last_rank, dropin_spectral_groups_on_rank_0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--only", default=None)
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--out", required=True, help="folder for the per-rank result files")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    meet = world.Dup()  # resynchronise between cases on a communicator no case uses
    me = world.Get_rank()
    config.debug = args.debug
    grid = _grid(world)
    comm = grid.cart
    results = open(f"{args.out}/rank{me}.jsonl", "w")
    for case in CASES + TORCH_CASES:
        if args.only and case.__name__ != args.only:
            continue
        print(f"START {case.__name__}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(args.timeout, exit=True)
        try:
            case(comm, grid, me)
            record = {"outcome": "returned"}
        except Exception as exc:  # noqa: BLE001 -- what was raised is the result
            # the whole message (every rank keeps it; one rank prints it, the others one line naming that rank)
            record = {"outcome": "raised", "type": type(exc).__name__,
                      "message": getattr(exc, "mpisphere_message", str(exc)), "printed": str(exc),
                      "reporter": getattr(exc, "mpisphere_reporter", None)}
        finally:
            faulthandler.cancel_dump_traceback_later()
        config.debug = args.debug
        record.update(case=case.__name__, rank=me, size=world.Get_size(), debug=args.debug)
        results.write(json.dumps(record) + "\n")
        results.flush()
        meet.Barrier()
    results.close()
    grid.free()
    meet.Barrier()
    if me == 0:
        for folder in FOLDERS:
            shutil.rmtree(folder, ignore_errors=True)
    meet.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
