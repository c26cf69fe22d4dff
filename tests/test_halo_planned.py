"""Planned halo calls (mpisphere.halo.planned): replays against first calls, and the hand-over to the full round
when a neighbour's call is not the planned one."""

import contextlib

import numpy
import pytest

from mpisphere import config
from mpisphere.halo import HaloExchange
from mpisphere.halo.planned import PlannedCall

from helpers import await_failure_note, expected_tile, near_ranks, raises, rank_rng

pytestmark = pytest.mark.mpi

NLAT, NLON = 13, 10  # uneven on 2 and 3 ranks both ways


@pytest.fixture
def replays(monkeypatch):
    """The number of calls this rank replayed (a list of one count), and of those handed over (the second)."""
    count = [0, 0]
    run, hand_over = PlannedCall.run, PlannedCall._hand_over

    def counted(self):
        count[0] += 1
        return run(self)

    def counted_hand_over(self, *args):
        count[1] += 1
        return hand_over(self, *args)
    monkeypatch.setattr(PlannedCall, "run", counted)
    monkeypatch.setattr(PlannedCall, "_hand_over", counted_hand_over)
    return count


def _padded(grid, field, rows, cols):
    """This rank's tile of ``field`` with a halo of NaN around it."""
    lat, lon = grid.local_slices(NLAT, NLON)
    h, w = lat.stop - lat.start, lon.stop - lon.start
    padded = numpy.full(field.shape[:-2] + (h + 2 * rows, w + 2 * cols), numpy.nan)
    padded[..., rows:rows + h, cols:cols + w] = field[..., lat, lon]
    return padded


@pytest.mark.parametrize("rows, cols", [(1, 2), (2, 0), (0, 2), (2, 3)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_replayed_calls_are_the_first_calls_bit_for_bit(grid, rows, cols, order, replays):
    """Zero widths (headers alone), one-rank rings, rows past the poles and arrays not in C order included."""
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON))
    rng = numpy.random.default_rng(3)  # the same fields on every rank
    padded = numpy.asarray(_padded(grid, numpy.zeros((2, NLAT, NLON)), rows, cols), order=order)
    for step in range(4):
        field = rng.standard_normal((2, NLAT, NLON))
        padded[...] = _padded(grid, field, rows, cols)  # the same array, a new field, garbage in the halo
        assert op.update(padded) is padded
        numpy.testing.assert_array_equal(padded, expected_tile(grid, field, rows, cols))
    assert replays[0] == 2  # planned by the second call, replayed by the next two
    local = rank_rng(grid.cart)
    for step in range(3):
        padded[...] = local.standard_normal(padded.shape)
        first = padded.copy()
        HaloExchange(grid, rows, cols, extents=(NLAT, NLON)).accumulate(first)  # a first call: the full round
        assert op.accumulate(padded) is padded
        numpy.testing.assert_array_equal(padded, first)
    assert replays[0] == 3


def test_a_planned_call_is_not_replayed_on_another_array_or_a_changed_one(grid, replays):
    op = HaloExchange(grid, 1, 1, extents=(NLAT, NLON))
    field = numpy.random.default_rng(5).standard_normal((2, NLAT, NLON))
    first, second = _padded(grid, field, 1, 1), _padded(grid, field, 1, 1)
    for array in (first, second, first, second, first, second):
        op.update(array)
    assert replays[0] == 2  # each array planned by its own second call
    with config.override(debug=config.debug):  # a switch set: planned calls are checked again
        op.update(first)
    assert replays[0] == 2
    op.update(first)  # leaving the override set the switch back: planned again
    op.update(first)
    assert replays[0] == 3
    first.flags.writeable = False
    with raises(ValueError, match="read-only"):
        op.update(first)
    numpy.testing.assert_array_equal(second, expected_tile(grid, field, 1, 1))


# rank 1's call: the other direction (planned too, or its first call), another batch, an array it cannot write,
# another switch
MISTAKES = ["accumulate-planned", "accumulate", "batch", "read-only", "debug"]


@contextlib.contextmanager
def _nothing():
    yield


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mistake", MISTAKES)
@pytest.mark.parametrize("rows, cols", [(1, 1), (0, 2)])
@pytest.mark.parametrize("tile", ["plain", "shared"])
def test_a_neighbour_that_differs_while_this_rank_replays(grid, mistake, rows, cols, tile, replays):
    """Rank 1 makes another call while every other rank replays its planned update: the ranks whose result
    would use wrong data raise in that call, the others at the end of their next one, and the grid goes on."""
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON))
    field = numpy.random.default_rng(9).standard_normal((2, NLAT, NLON))
    padded = _padded(grid, field, rows, cols)
    if tile == "shared":  # the blocks stay in the windows of the node
        shared = op.zeros((2,))
        shared[...] = padded
        padded = shared
    for _ in range(2):
        op.update(padded)
        if mistake == "accumulate-planned":
            op.accumulate(padded)
    call, switches = (lambda: op.update(padded)), _nothing()
    if grid.rank == 1:
        if mistake.startswith("accumulate"):
            call = lambda: op.accumulate(padded)  # noqa: E731
        elif mistake == "batch":
            call = lambda: op.update(numpy.zeros((3,) + padded.shape[1:]))  # noqa: E731
        elif mistake == "read-only":
            padded.flags.writeable = False
        else:
            switches = config.override(debug=True)
    raised = False
    try:
        with switches:
            call()
    except ValueError as exc:
        raised = True
        assert "cannot exchange its halo" in str(exc) or "read-only" in str(exc), str(exc)
    if mistake.startswith("accumulate"):
        # phases in the other order: a neighbour that sees it flushes its round, and its own neighbours may
        # raise in this call too (the round breaks a cycle of waits that way); the 3 x 3 block always does
        assert raised or grid.rank not in near_ranks(grid, 1), f"rank {grid.rank} did not raise"
    else:
        assert raised == (grid.rank in near_ranks(grid, 1)), f"rank {grid.rank} raised: {raised}"
    if not raised:
        await_failure_note(grid)
    padded.flags.writeable = True
    with (raises(ValueError, match="failed on rank") if not raised else _nothing()):
        op.update(padded)  # every rank makes it; the ranks that had not raised raise at its end
    padded[...] = _padded(grid, field, rows, cols)
    op.update(padded)
    numpy.testing.assert_array_equal(padded, expected_tile(grid, field, rows, cols))
    assert replays[0] >= (3 if mistake == "accumulate-planned" else 1)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("direction", ["update", "accumulate"])
def test_a_neighbour_that_turns_to_a_shared_tile_while_this_rank_replays(grid, direction, replays):
    """Rank 1's blocks start to stay in memory shared on the node (headers alone): a replaying neighbour hands
    its call over to the full round, which reads them there, and plans the next calls from it; every result is
    the one of the first calls, bit for bit."""
    op = HaloExchange(grid, 2, 2, extents=(NLAT, NLON))
    call = getattr(op, direction)
    local = rank_rng(grid.cart)
    values = local.standard_normal(_padded(grid, numpy.zeros((2, NLAT, NLON)), 2, 2).shape)
    padded = values.copy()
    call(padded)
    call(padded)  # planned: rank 1's blocks come as messages
    shared = op.zeros((2,))
    mine = shared if grid.rank == 1 else padded
    for _ in range(3):
        mine[...] = values
        call(mine)
        first = values.copy()
        getattr(HaloExchange(grid, 2, 2, extents=(NLAT, NLON)), direction)(first)  # a first call, messages only
        numpy.testing.assert_array_equal(mine, first)
    neighbour = 1 in op.pattern.receives.values()  # receives blocks from rank 1 (the diagonal ranks do not)
    # rank 1: planned by its second call on the shared tile; its neighbours: one hand-over, then the new plan
    assert replays == ([1, 0] if grid.rank == 1 else [3, 1] if neighbour else [3, 0]), replays


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("direction", ["update", "accumulate"])
def test_replays_on_shared_tiles_are_the_first_calls_bit_for_bit(grid, direction, replays):
    """Every rank on a tile from zeros(): the blocks stay in the windows, read and acknowledged by replays."""
    op = HaloExchange(grid, 2, 3, extents=(NLAT, NLON))
    shared = op.zeros((2,))
    local = rank_rng(grid.cart)
    for step in range(3):
        shared[...] = local.standard_normal(shared.shape)
        first = shared.copy()
        getattr(HaloExchange(grid, 2, 3, extents=(NLAT, NLON)), direction)(first)  # a first call, messages only
        getattr(op, direction)(shared)
        numpy.testing.assert_array_equal(shared, first)
    assert replays == [1, 0], replays  # planned by the second call
    with config.override(shared_memory=False):  # the same tiles, as messages: planned apart, at once
        for step in range(2):
            shared[...] = local.standard_normal(shared.shape)
            first = shared.copy()
            getattr(HaloExchange(grid, 2, 3, extents=(NLAT, NLON)), direction)(first)
            getattr(op, direction)(shared)
            numpy.testing.assert_array_equal(shared, first)
    getattr(op, direction)(shared)
    assert replays == [3, 0], replays
