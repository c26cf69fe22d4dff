"""A rank in another collective call while its neighbours are in a halo call (mpisphere.halo.absent): it answers
them, and every rank raises instead of waiting (issue 56: ``grid.free()`` on one rank between halo replays)."""

import re

import numpy
import pytest

from mpisphere.halo import HaloExchange

from helpers import expected_tile, near_ranks, raises

pytestmark = pytest.mark.mpi

NLAT, NLON = 13, 10  # uneven on 2 and 3 ranks both ways


def _direct(grid, rank):
    """The direct neighbours of ``rank`` (the ranks its halo messages go to)."""
    p0, a0 = divmod(rank, grid.nazimuth)
    found = {p * grid.nazimuth + a0 for p in (p0 - 1, p0 + 1) if 0 <= p < grid.npolar}
    if grid.nazimuth > 1:
        found |= {p0 * grid.nazimuth + (a0 + d) % grid.nazimuth for d in (-1, 1)}
    return found - {rank}


def _tile(grid, halo, how):
    h, w = grid.local_shape(NLAT, NLON)
    if how == "shared":
        return halo.zeros(2)
    return numpy.zeros((2, h + 2, w + 2))


@pytest.mark.parametrize("culprit", ["last", "first"])
@pytest.mark.parametrize("how", ["first-call", "replayed", "shared", "no-extents"])
def test_a_rank_that_frees_the_grid_during_a_halo_call_raises_on_every_rank(grid, how, culprit):
    """The culprit frees the grid while the others make a halo call (their first on the array, a replay of a
    planned one, one on tiles in shared memory, or one without extents): its neighbours raise in the call, naming
    it and its call; the culprit raises in free(); the ranks farther away raise in their own free(), which the
    grid's agreement told of the failure. The grid is freed on every rank, and no rank waits."""
    if grid.size < 2:
        pytest.skip("needs two ranks")
    bad = grid.size - 1 if culprit == "last" else 0
    # without extents, a halo call sends its records (headers alone) ahead of its data
    halo = HaloExchange(grid, 1, 1, extents=None if how == "no-extents" else (NLAT, NLON))
    padded = _tile(grid, halo, how)
    for _ in range(3 if how in ("replayed", "shared") else 0):  # planned at the second call, replayed from the third
        halo.update(padded)
    near, direct = near_ranks(grid, bad), _direct(grid, bad)
    if how == "no-extents":  # the records poison the data the direct neighbours send on: the mistake reaches further
        near = set().union(*(near_ranks(grid, r) for r in near))
    if grid.rank == bad:
        with raises(ValueError, match=rf"^ProcessGrid.free: rank {bad} of {grid.size}: (north|south|east|west) "
                                      r"neighbour rank \d+ was in HaloExchange.update on this grid \(halo call \d+\) "
                                      r"while this rank was in ProcessGrid.free, called at .*test_halo_absent.py:\d+: "
                                      r"this rank answered that it is not in that call, and rank \d+ raised there "
                                      r"\(the grid is freed on every rank\)\n  fix: make the same mpisphere calls"):
            grid.free()
    elif grid.rank in near:
        pattern = (rf"cannot exchange its halo: .*neighbour rank {bad}: is not making the same call.*rank {bad}: it is "
                   r"in ProcessGrid.free, called at .*test_halo_absent.py:\d+, not in a halo call"
                   if grid.rank in direct else r"cannot exchange its halo: .*(neighbour rank \d+: could not complete "
                                               rf"its own exchange|neighbour rank {bad}: is not making the same call)")
        if grid.rank in direct or how != "no-extents":
            with raises(ValueError, match=pattern):
                halo.update(padded)
            grid.free()
            return
        try:  # two steps away: it raises if its own exchange needed a block the records poisoned
            halo.update(padded)
        except ValueError as exc:
            assert re.search(pattern, str(exc)), exc
            grid.free()
        else:
            with raises(ValueError, match=r"in an earlier call.*\(the grid is freed on every rank\)"):
                grid.free()
    else:
        halo.update(padded)  # too far from the culprit: returns
        with raises(ValueError, match=rf"^ProcessGrid.free: rank {grid.rank} of {grid.size}: HaloExchange.update "
                                      r"failed on rank \d+ .* in an earlier call, halo call \d+ on this grid, which "
                                      r"returned normally on this rank.*\(the grid is freed on every rank\)"):
            grid.free()
    assert grid.freed


@pytest.mark.parametrize("culprit", ["last", "first"])
def test_a_free_refused_during_a_halo_call_leaves_the_halo_working(grid, culprit):
    """The culprit frees the grid while the others make a halo call, then they all gather: the free and the gather
    are refused on every rank (different calls), the grid stays; every rank's next halo call then works and the
    next free frees the grid without raising (every rank raised once for the mistake)."""
    if grid.size < 2:
        pytest.skip("needs two ranks")
    bad = grid.size - 1 if culprit == "last" else 0
    halo = HaloExchange(grid, 1, 1, extents=(NLAT, NLON))
    padded = _tile(grid, halo, "replayed")
    for _ in range(3):
        halo.update(padded)
    raised = 0
    try:
        if grid.rank == bad:
            grid.free()
        else:
            halo.update(padded)
    except ValueError:
        raised += 1
    if grid.rank != bad:
        with raises(ValueError, match=r"different calls: .*ProcessGrid.(free|gather)"):
            grid.gather(numpy.zeros(grid.local_shape(NLAT, NLON)))
        raised += 1
    else:
        assert raised == 1 and not grid.freed
    counts = grid.cart.allgather(raised)
    near = near_ranks(grid, bad)
    assert counts == [1 if r == bad else 1 + (r in near) for r in range(grid.size)], counts
    field = numpy.random.default_rng(7).standard_normal((2, NLAT, NLON))  # the same on every rank
    lat, lon = grid.local_slices(NLAT, NLON)
    numpy.testing.assert_array_equal(halo.forward(field[..., lat, lon].copy()), expected_tile(grid, field, 1, 1))
    padded[:] = numpy.nan  # the replayed call writes the whole halo
    padded[..., 1:-1, 1:-1] = field[..., lat, lon]
    halo.update(padded)
    numpy.testing.assert_array_equal(padded, expected_tile(grid, field, 1, 1))
    grid.free()
    assert grid.freed
