"""Careless-user mistakes made on one rank, run under mpiexec by test_misuse.py (not collected by pytest).

    mpiexec -n 4 python tests/misuse_cases.py --out DIR [--debug] [--only CASE]

Every case makes one mistake on one rank (rank 1 unless said otherwise) and
records, per rank, whether the call raised (type and message) or returned.
Each rank appends one JSON line per case to ``DIR/rank<r>.jsonl``; a watchdog
ends a rank stuck in a case (a hang), which the outer test reports as a
failure naming the case. The cases are the rows of issue 11's table.
"""

import argparse
import faulthandler
import json
import sys
import threading

import numpy
from mpi4py import MPI

from mpisphere import (CopyTo, DistributedRealSHT, GatherFrom, GatherFromCopyTo, HaloExchange, LinearOperator,
                       ProcessGrid, ReduceFrom, Transpose, config, split_sizes)
from mpisphere.operators import DISTRIBUTED, Layout

NLAT, NLON = 13, 10


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


def two_threads_on_one_grid(comm, grid, me):
    """While one thread runs an operator on the grid, another thread's operator on it raises (every rank)."""
    started, release = threading.Event(), threading.Event()
    holder = _Blocking(grid, started, release)
    results = {}

    def first():
        results["first"] = holder.forward(numpy.full(3, 7.0))

    thread = threading.Thread(target=first, name="first")
    thread.start()
    started.wait(30)
    try:
        ReduceFrom(grid.cart).forward(numpy.ones(3))
    finally:
        release.set()
        thread.join(30)
        assert (results["first"] == 7.0).all()


CASES = [chunk_width, batch_gather_from, batch_reduce_from, batch_transpose, batch_halo, batch_sht,
         dtype_gather_from, dtype_copy_to_adjoint, out_shape, out_dtype, out_read_only, other_operator,
         other_extent, sht_lmax, halo_wider_than_neighbour, halo_tile_widths, grid_dims, grid_invalid_dims,
         debug_on_one_rank, two_threads_on_one_grid]


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
    for case in CASES:
        if args.only and case.__name__ != args.only:
            continue
        print(f"START {case.__name__}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(args.timeout, exit=True)
        try:
            case(comm, grid, me)
            record = {"outcome": "returned"}
        except Exception as exc:  # noqa: BLE001 -- what was raised is the result
            record = {"outcome": "raised", "type": type(exc).__name__, "message": str(exc)}
        finally:
            faulthandler.cancel_dump_traceback_later()
        config.debug = args.debug
        record.update(case=case.__name__, rank=me, size=world.Get_size(), debug=args.debug)
        results.write(json.dumps(record) + "\n")
        results.flush()
        meet.Barrier()
    results.close()
    grid.free()
    meet.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
