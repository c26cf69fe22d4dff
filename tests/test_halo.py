"""HaloExchange on every grid: against a padded global field, adjoints, corners, bad input."""

import contextlib
import re
import numpy
import pytest
from mpi4py import MPI

from mpisphere import config, dottest
from mpisphere.halo import HaloExchange, HaloReduce
from mpisphere.quadrature import latitudes

from helpers import await_failure_note, expected_tile, message_sizes, near_ranks, padded_reference, raises, \
    free_after_a_failure, random_array, rank_rng, the_call_after_a_failure, whole_message

pytestmark = pytest.mark.mpi

NLAT, NLON = 13, 10  # uneven on 2 and 3 ranks both ways


@pytest.mark.parametrize("rows", [0, 1, 3])
@pytest.mark.parametrize("cols", [0, 2])
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.complex128, numpy.float32])
@pytest.mark.parametrize("lead", [(), (2, 3)], ids=str)
@pytest.mark.parametrize("extents", [True, False], ids=["extents", "no-extents"])
def test_forward_matches_padded_global_field(grid, rng, rows, cols, dtype, lead, extents):
    field = random_array(rng, lead + (NLAT, NLON), dtype)
    lat, lon = grid.local_slices(NLAT, NLON)
    x = field[..., lat, lon].copy()
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON) if extents else None)
    y = op.forward(x)
    numpy.testing.assert_array_equal(y, expected_tile(grid, field, rows, cols))
    assert y.dtype == x.dtype
    stale = numpy.full(y.shape, numpy.nan, y.dtype)  # every halo cell is written, whatever out= held
    op.forward(x, out=stale)
    numpy.testing.assert_array_equal(stale, y)


@pytest.mark.parametrize("rows", [0, 1, 3])
@pytest.mark.parametrize("cols", [0, 2])
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.complex128])
def test_dottest(grid, rows, cols, dtype):
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON))
    h, w = grid.local_shape(NLAT, NLON)
    local = rank_rng(grid.cart)
    x = random_array(local, (3, h, w), dtype)
    y = random_array(local, (3, h + 2 * rows, w + 2 * cols), dtype)
    assert dottest(op, x, y, rtol=1e-13) <= 1e-13


@pytest.mark.parametrize("rows, cols", [(1, 2), (3, 0), (0, 2), (2, 3)])
def test_update_and_accumulate_in_place(grid, rng, rows, cols):
    field = rng.standard_normal((2, NLAT, NLON))
    lat, lon = grid.local_slices(NLAT, NLON)
    h, w = lat.stop - lat.start, lon.stop - lon.start
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON))
    local = rank_rng(grid.cart)
    padded = local.standard_normal((2, h + 2 * rows, w + 2 * cols))  # garbage in the halo
    padded[..., rows:rows + h, cols:cols + w] = field[..., lat, lon]
    interior_before = padded[..., rows:rows + h, cols:cols + w].copy()
    address = padded.__array_interface__["data"][0]
    assert op.update(padded) is padded
    assert padded.__array_interface__["data"][0] == address
    numpy.testing.assert_array_equal(padded, expected_tile(grid, field, rows, cols))
    numpy.testing.assert_array_equal(padded[..., rows:rows + h, cols:cols + w], interior_before)

    # update ignores the old halo; accumulate is its adjoint: <update(P), Q> == <P, accumulate(Q)>
    p_arr = local.standard_normal(padded.shape)
    q_arr = local.standard_normal(padded.shape)
    up = op.update(p_arr.copy())
    acc = op.accumulate(q_arr.copy())
    lhs = grid.cart.allreduce(float(numpy.vdot(up, q_arr)))
    rhs = grid.cart.allreduce(float(numpy.vdot(p_arr, acc)))
    bound = grid.cart.allreduce(float(numpy.vdot(abs(up), abs(q_arr)) + numpy.vdot(abs(p_arr), abs(acc))))
    assert abs(lhs - rhs) <= 1e-15 * bound  # data movement and additions only: exact up to rounding of the sums
    # accumulate leaves a zero halo and the interior equal to the adjoint
    interior = (Ellipsis, slice(rows, rows + h), slice(cols, cols + w))
    halo = numpy.ones(padded.shape, bool)
    halo[interior] = False
    assert not acc[halo].any()
    numpy.testing.assert_array_equal(acc[interior], op.adjoint(q_arr))


def test_arrays_of_one_shape_in_turn_each_get_their_own_halo(grid, rng):
    """The copies are planned for the last array a call served: another array of the same shape, and the first
    again after its interior changed, each get the halo of their own field."""
    rows, cols = 2, 2
    lat, lon = grid.local_slices(NLAT, NLON)
    h, w = lat.stop - lat.start, lon.stop - lon.start
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON))
    fields = [rng.standard_normal((3, NLAT, NLON)) for _ in range(3)]
    first, second = (numpy.zeros((3, h + 2 * rows, w + 2 * cols)) for _ in range(2))
    for array, field in ((first, fields[0]), (second, fields[1]), (first, fields[2]), (second, fields[1])):
        array[..., rows:rows + h, cols:cols + w] = field[..., lat, lon]
        op.update(array)
        numpy.testing.assert_array_equal(array, expected_tile(grid, field, rows, cols))


@pytest.mark.parametrize("rows, cols", [(1, 2), (2, 0)])
def test_update_and_accumulate_in_turn_on_one_array(grid, rows, cols):
    """The tangent-linear and adjoint steps of a model on one padded array: each direction sends its own blocks
    (the copies planned for the array are kept per block, not per message tag)."""
    op = HaloExchange(grid, rows, cols, extents=(NLAT, NLON))
    h, w = grid.local_shape(NLAT, NLON)
    local = rank_rng(grid.cart)
    padded = numpy.zeros((2, h + 2 * rows, w + 2 * cols))
    for _ in range(2):
        for direction in ("update", "accumulate"):
            padded[...] = local.standard_normal(padded.shape)
            alone = padded.copy()
            getattr(HaloExchange(grid, rows, cols, extents=(NLAT, NLON)), direction)(alone)  # a first call
            getattr(op, direction)(padded)
            numpy.testing.assert_array_equal(padded, alone)


@pytest.mark.parametrize("force_staging", [False, True], ids=["direct", "staged"])
def test_direct_and_staged_paths_agree(grid, rng, force_staging):
    field = rng.standard_normal((3, NLAT, NLON))
    lat, lon = grid.local_slices(NLAT, NLON)
    op = HaloExchange(grid, 2, 2, extents=(NLAT, NLON))
    with config.override(force_staging=force_staging):
        y = op.forward(field[..., lat, lon])
        numpy.testing.assert_array_equal(y, expected_tile(grid, field, 2, 2))
        local = rank_rng(grid.cart)
        assert dottest(op, local.standard_normal(field[..., lat, lon].shape), local.standard_normal(y.shape)) <= 1e-13


def test_non_contiguous_tile(grid, rng):
    field = rng.standard_normal((NLAT, NLON, 2)).transpose(2, 0, 1)  # (2, NLAT, NLON), strided
    lat, lon = grid.local_slices(NLAT, NLON)
    op = HaloExchange(grid, 1, 1)
    numpy.testing.assert_array_equal(op.forward(field[..., lat, lon]), expected_tile(grid, field, 1, 1))
    padded = numpy.asfortranarray(expected_tile(grid, field, 1, 1) * 0)
    padded[..., 1:-1, 1:-1] = field[..., lat, lon]
    op.update(padded)  # not C-contiguous
    numpy.testing.assert_array_equal(padded, expected_tile(grid, field, 1, 1))


@pytest.mark.mpi(min_size=4)
@pytest.mark.also_at(4)
@pytest.mark.parametrize("mistake", ["own", "mismatch"])
def test_a_mistake_reaches_the_diagonal_rank_with_its_class_and_its_rank(comm, mistake):
    """On 2 x 2 the last rank's mistake reaches rank 0 only through a neighbour: rank 0 names the last rank, and
    every rank raises the same class (the mistake's own: TypeError for a dtype no halo moves; a mismatch of
    dtypes between neighbours, ValueError)."""
    from mpisphere import ProcessGrid
    if comm.Get_size() != 4:
        pytest.skip("the 2 x 2 grid: four ranks")
    last = comm.Get_size() - 1
    with ProcessGrid(comm, 2, 2) as grid:
        halo = HaloExchange(grid, 1, 1, extents=(8, 16))
        h, w = grid.local_shape(8, 16)
        odd = numpy.int8 if mistake == "own" else numpy.float32
        padded = numpy.zeros((2, h + 2, w + 2), odd if grid.rank == last else numpy.float64)
        kind = TypeError if mistake == "own" else ValueError
        with pytest.raises(kind) as caught:
            halo.update(padded)
        if grid.rank == 0:
            assert f"at rank {last}" in str(caught.value), str(caught.value)


@contextlib.contextmanager
def _column_of_four(comm):
    """A 4 x 1 grid (skipped unless four ranks), a one-row, one-column halo on a 12 x 8 field, this rank's tile."""
    from mpisphere import ProcessGrid
    if comm.Get_size() != 4:
        pytest.skip("the 4 x 1 grid: four ranks")
    with ProcessGrid(comm, 4, 1) as grid:
        yield grid, HaloExchange(grid, 1, 1, extents=(12, 8)), grid.local_shape(12, 8)


@pytest.mark.mpi(min_size=4)
@pytest.mark.also_at(4)
@pytest.mark.parametrize("then", ["halo", "collective"])
def test_ranks_two_steps_from_a_mistake_raise_at_their_next_call(comm, then):
    """On 4 x 1 the last rank's mistake does not reach rank 0 in the call: rank 0 returns its (correct) result,
    and raises at its next call, halo or collective, with the mistake's class and rank, instead of going on
    while the ranks near the mistake raised (the next collective would wait for them)."""
    last = comm.Get_size() - 1
    with _column_of_four(comm) as (grid, halo, (h, w)):
        padded = numpy.ones((h + 2, w + 2), numpy.int8 if grid.rank == last else numpy.float64)
        raised = False
        try:
            halo.update(padded)
        except TypeError as exc:
            raised = True
            assert f"rank {last}" in whole_message(exc)
        assert raised == (grid.rank >= last - 1), "the ranks next to the mistake raise in the call itself"
        if not raised:  # the note of the ranks that raised has been sent: wait for it (not a race of the test)
            await_failure_note(grid)
        good = numpy.ones((h + 2, w + 2))

        def next_call():
            return halo.update(good) if then == "halo" else grid.gather(good[1:-1, 1:-1])

        if raised:  # the ranks that raised go on to the same call (a program that catches): it works, once
            next_call()
            return
        with pytest.raises(TypeError) as caught:  # the call runs to its end (no rank waits), then raises
            next_call()
        text = whole_message(caught.value)
        assert f"the mistake at rank {last}" in text and "returned normally on this rank" in text, text
        assert (good[-1, 1:-1] == 1).all()  # a halo call that raised for an earlier one still filled its halo


@pytest.mark.mpi(min_size=4)
@pytest.mark.also_at(4)
def test_after_a_failure_every_rank_raises_once_and_the_grid_goes_on(comm):
    """A program that catches the halo's error goes on: every rank raises exactly once for the mistake (the far
    ranks at the end of their next call), then the halo works again on every rank."""
    last = comm.Get_size() - 1
    with _column_of_four(comm) as (grid, halo, (h, w)):
        bad = numpy.ones((h + 2, w + 2), numpy.int8 if grid.rank == last else numpy.float64)
        raised = 0
        for step in range(4):
            if step == 1 and raised == 0:
                await_failure_note(grid)
            try:
                halo.update(bad if step == 0 else numpy.ones((h + 2, w + 2)))
            except TypeError:
                raised += 1
        counts = comm.allgather(raised)
        assert counts == [1] * comm.Get_size(), f"every rank raises once for the mistake: {counts}"
        # the last two calls ran on every rank: the failure is behind the grid
        padded = numpy.zeros((h + 2, w + 2))
        padded[1:-1, 1:-1] = grid.rank + 1
        halo.update(padded)
        if grid.rank > 0:
            assert (padded[0, 1:-1] == grid.rank).all()


@pytest.mark.mpi(min_size=6)
def test_corners_on_a_3x2_grid(comm):
    """Each corner block is the diagonal neighbour's data (periodic in longitude, zero past the poles)."""
    from mpisphere import ProcessGrid
    nlat, nlon, rows, cols = 9, 6, 2, 2
    with ProcessGrid(comm, 3, 2) as grid:
        field = numpy.arange(nlat * nlon, dtype=float).reshape(nlat, nlon) + 1.0  # no zeros in the data
        lat, lon = grid.local_slices(nlat, nlon)
        y = HaloExchange(grid, rows, cols, extents=(nlat, nlon)).forward(field[lat, lon])
        h, w = lat.stop - lat.start, lon.stop - lon.start
        west, east = grid.azimuth_neighbors
        north, south = grid.polar_neighbors
        corners = {"nw": (y[:rows, :cols], north, west, "last", "last"),
                   "ne": (y[:rows, cols + w:], north, east, "last", "first"),
                   "sw": (y[rows + h:, :cols], south, west, "first", "last"),
                   "se": (y[rows + h:, cols + w:], south, east, "first", "first")}
        for name, (block, polar_nb, azimuth_nb, which_rows, which_cols) in corners.items():
            if polar_nb == MPI.PROC_NULL:
                assert not block.any(), f"{name} corner past a pole must be zero"
                continue
            owner = polar_nb * grid.nazimuth + azimuth_nb
            olat, olon = grid.tile_slices(nlat, nlon, owner)
            tile = field[olat, olon]
            rsel = slice(-rows, None) if which_rows == "last" else slice(0, rows)
            csel = slice(-cols, None) if which_cols == "last" else slice(0, cols)
            numpy.testing.assert_array_equal(block, tile[rsel, csel], err_msg=f"{name} corner of rank {grid.rank}")
        # the middle row has neighbours on both sides: all four corners are real data
        if grid.polar_rank == 1:
            assert all(c[0].all() for c in corners.values())


def test_a_zero_width_moves_headers_only(grid, rng, monkeypatch):
    """Every call sends one message to each direct neighbour in each phase; data only where a width is not 0."""
    from mpisphere.halo.round import HEADER_BYTES
    sizes = message_sizes(monkeypatch)
    ring = 2 if grid.nazimuth > 1 else 0   # a one-rank ring wraps locally
    polar = (grid.polar_rank > 0) + (grid.polar_rank < grid.npolar - 1)
    h, w = grid.local_shape(NLAT, NLON)
    x = rng.standard_normal((h, w))
    for rows, cols in ((0, 0), (0, 2), (2, 0), (1, 1)):
        with_data = (ring if cols else 0) + (polar if rows else 0)
        sizes.clear()
        HaloExchange(grid, rows, cols, extents=(NLAT, NLON)).forward(x)
        assert len(sizes) == ring + polar, (rows, cols, sizes)
        assert sum(n > HEADER_BYTES for n in sizes) == with_data, (rows, cols, sizes)
        sizes.clear()
        HaloExchange(grid, rows, cols).forward(x)  # without extents, a record (a header alone) to each first
        assert len(sizes) == 2 * (ring + polar), (rows, cols, sizes)
        assert sum(n > HEADER_BYTES for n in sizes) == with_data, (rows, cols, sizes)


def test_halo_wider_than_smallest_tile_is_an_error_before_any_message(grid):
    lat_sizes, lon_sizes = grid.lat_sizes(NLAT), grid.lon_sizes(NLON)
    if grid.npolar > 1:
        with raises(ValueError, match=rf"a halo of {min(lat_sizes) + 1} rows is wider than the smallest polar "
                                             rf"tile \({min(lat_sizes)} rows; nlat={NLAT} split over {grid.npolar}.*"
                                             rf"use at most {min(lat_sizes)} halo rows"):
            HaloExchange(grid, min(lat_sizes) + 1, extents=(NLAT, NLON))
    else:  # a single polar rank: any number of rows, all zero past the poles
        HaloExchange(grid, NLAT + 3, extents=(NLAT, NLON))
    if grid.nazimuth > 1:
        with raises(ValueError, match=rf"a halo of {min(lon_sizes) + 1} columns is wider than the smallest "
                                             rf"azimuth tile \({min(lon_sizes)} columns"):
            HaloExchange(grid, 0, min(lon_sizes) + 1, extents=(NLAT, NLON))
    else:
        with raises(ValueError, match=rf"a halo of {NLON + 1} columns is wider than the whole ring of {NLON}"):
            HaloExchange(grid, 0, NLON + 1, extents=(NLAT, NLON))


def test_halo_wider_than_every_tile_fails_on_every_rank_without_extents(grid):
    h, w = grid.local_shape(NLAT, NLON)
    x = numpy.zeros((h, w))
    with raises(ValueError, match=rf"HaloExchange.forward: rank {grid.rank} of {grid.size}.*"
                                         rf"a halo of {NLON + 1} "
                                         "columns is wider than"):
        HaloExchange(grid, 0, NLON + 1).forward(x)  # wider than any tile: every rank raises, none waits


def test_single_rank_ring_wraps_onto_itself(comm, rng):
    from mpisphere import ProcessGrid
    with ProcessGrid(comm, comm.Get_size(), 1) as grid:
        nlat = max(NLAT, 2 * grid.npolar)
        field = rng.standard_normal((nlat, 5))
        lat, lon = grid.local_slices(nlat, 5)
        op = HaloExchange(grid, 1, 5, extents=(nlat, 5))  # the whole ring on each side
        numpy.testing.assert_array_equal(op.forward(field[lat, lon]), expected_tile(grid, field, 1, 5))
        local = rank_rng(comm)
        assert dottest(op, local.standard_normal((lat.stop - lat.start, 5)),
                       local.standard_normal((lat.stop - lat.start + 2, 15))) <= 1e-13


def test_wrong_tile_shape_with_extents(grid):
    h, w = grid.local_shape(NLAT, NLON)
    op = HaloExchange(grid, 1, 1, extents=(NLAT, NLON))
    with raises(ValueError) as caught:
        op.forward(numpy.zeros((h, w + 1)))
    assert re.search(rf"^HaloExchange.forward: rank {grid.rank} .*: the last two axes \({h}, {w + 1}\) are not this "
                     rf"rank's tile .*\n  fix: grid.scatter\(field\).*\n(.*\n)*  rank {grid.rank}: expected \({h}, "
                     rf"{w}\), got \({h}, {w + 1}\)", whole_message(caught.value)), whole_message(caught.value)
    with raises(ValueError) as caught:
        op.update(numpy.zeros((h, w)))
    assert f"rank {grid.rank}: expected ({h + 2}, {w + 2}), got ({h}, {w})" in whole_message(caught.value)
    if grid.size > 1:  # the whole field where a tile belongs: said so, with what to do
        with raises(ValueError) as caught:
            op.forward(numpy.zeros((NLAT, NLON)))
        text = whole_message(caught.value)
        assert re.search(rf"^HaloExchange.forward: rank {grid.rank} of {grid.size} .*cannot exchange its halo: this "
                         rf"rank: got the whole {NLAT} x {NLON} field where this rank's tile belongs;[^\n]*\n  fix: "
                         r"grid.scatter\(field\) gives each rank its tile", text), text
    with raises(TypeError, match="at least 2 axes"):
        op.forward(numpy.zeros(4))
    with raises(TypeError, match="unsupported dtype int64"):
        op.forward(numpy.zeros((h, w), numpy.int64))


def test_bad_widths(grid):
    with raises(ValueError, match="rows must be non-negative, got rows=-1"):
        HaloExchange(grid, -1)
    with raises(TypeError, match="HaloExchange: cols must be an integer, got 1.5"):
        HaloExchange(grid, 1, 1.5)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("direction", ["forward", "adjoint", "update", "accumulate"])
def test_a_rank_with_another_batch_raises_on_its_neighbours(grid, rng, debug, direction):
    """Rank 1's neighbours see its headers, their neighbours see theirs; ranks farther away return correct results."""
    field = rng.standard_normal((3, NLAT, NLON))
    lat, lon = grid.local_slices(NLAT, NLON)
    batch = 3 if grid.rank == 1 else 2
    op = HaloExchange(grid, 1, 1)
    padded = expected_tile(grid, field[:batch], 1, 1)
    x = field[:batch, lat, lon].copy() if direction == "forward" else padded.copy()
    run = getattr(op, direction)
    near = near_ranks(grid, 1)
    with config.override(debug=debug):
        if grid.rank in near:
            with raises(ValueError, match="cannot exchange its halo: .*(not making the same call|could not "
                                                 "complete its own exchange)"):
                run(x)
        else:  # too far from rank 1 to exchange anything wrong with it: a correct result
            got = run(x)
            if direction in ("forward", "update"):
                numpy.testing.assert_array_equal(got, padded)
    free_after_a_failure(grid, near)  # and then they raise in free(): they do not go on alone


def test_halo_reduce_is_the_adjoint_as_an_operator(grid):
    h, w = grid.local_shape(NLAT, NLON)
    local = rank_rng(grid.cart)
    reduce = HaloReduce(grid, 2, 1, extents=(NLAT, NLON))
    exchange = HaloExchange(grid, 2, 1, extents=(NLAT, NLON))
    y = local.standard_normal((2, h + 4, w + 2))
    numpy.testing.assert_array_equal(reduce.forward(y), exchange.adjoint(y))
    x = local.standard_normal((2, h, w))
    numpy.testing.assert_array_equal(reduce.adjoint(x), exchange.forward(x))
    assert reduce.H is reduce.op and isinstance(reduce.op, HaloExchange)
    assert dottest(reduce, y, x, rtol=1e-13) <= 1e-13


def test_halo_reduce_messages_name_halo_reduce(grid):
    h, w = grid.local_shape(NLAT, NLON)
    reduce = HaloReduce(grid, 1, 1, extents=(NLAT, NLON))
    with raises(ValueError, match=r"^HaloReduce.forward: rank \d+ of \d+.*the last two axes .* are not this rank's "
                                  r"padded tile"):
        reduce.forward(numpy.zeros((h, w)))
    with raises(ValueError, match=r"^HaloReduce: a halo of \d+ rows is wider than the smallest polar tile") \
            if grid.npolar > 1 else raises(ValueError, match=r"^HaloReduce: a halo of \d+ columns"):
        HaloReduce(grid, NLAT + 1, NLON + 1, extents=(NLAT, NLON))


def test_messages_that_teach(grid):
    with raises(TypeError, match=r"HaloExchange: grid must be a ProcessGrid, got GridComm \(a communicator; "
                                        r"pass the ProcessGrid it belongs to, or build one: ProcessGrid\(comm\)\)"):
        HaloExchange(grid.cart, 1)
    with raises(TypeError, match=r"HaloExchange: extents\[0\] \(nlat\) must be an integer, got 13.0"):
        HaloExchange(grid, 1, extents=(13.0, 10))
    with raises(TypeError, match=r"HaloExchange: extents must be a pair \(nlat, nlon\) of integers, "
                                        r"got \(13,\)"):
        HaloExchange(grid, 1, extents=(13,))
    from mpisphere import GatherFrom
    with raises(ValueError, match=r"GatherFrom @ HaloExchange: .*cannot take part in a composition: without "
                                         r"extents .* build it with extents=\(nlat, nlon\)|HaloExchange cannot take "
                                         r"part in a composition"):
        GatherFrom(grid.polar, -2, NLAT) @ HaloExchange(grid, 0, 1)


def test_a_halo_without_extents_against_one_with_them(grid, rng):
    """Rank 1 sends records first (no extents), its neighbours do not expect them: every message still matches."""
    if grid.size < 2:
        pytest.skip("needs two ranks")
    h, w = grid.local_shape(NLAT, NLON)
    with_extents, without = HaloExchange(grid, 1, 1, extents=(NLAT, NLON)), HaloExchange(grid, 1, 1)
    x = rng.standard_normal((2, h, w))
    for direction in ("forward", "adjoint"):
        op = without if grid.rank == 1 else with_extents
        arg = x if direction == "forward" else numpy.zeros((2, h + 2, w + 2))
        near = near_ranks(grid, 1)
        if grid.rank in near:
            with raises(ValueError, match="cannot exchange its halo"):
                getattr(op, direction)(arg)
        else:  # too far from rank 1 to exchange anything with it: returns, and raises at the end of its next call
            getattr(op, direction)(arg)
        the_call_after_a_failure(grid, near, lambda: with_extents.forward(x))
    field = numpy.random.default_rng(7).standard_normal((2, NLAT, NLON))  # the same on every rank
    lat, lon = grid.local_slices(NLAT, NLON)
    numpy.testing.assert_array_equal(without.forward(field[..., lat, lon].copy()), expected_tile(grid, field, 1, 1))


def test_two_different_halo_calls_on_neighbours_raise_instead_of_waiting(grid, rng):
    """Rank 1 runs a column-only exchange while the others run a row-only one: every message still matches."""
    if grid.size < 2:
        pytest.skip("needs two ranks")
    h, w = grid.local_shape(NLAT, NLON)
    rows_only, cols_only = HaloExchange(grid, 1, 0), HaloExchange(grid, 0, 1)
    x = rng.standard_normal((2, h, w))
    near = near_ranks(grid, 1)
    if grid.rank in near:
        with raises(ValueError, match="cannot exchange its halo"):
            (cols_only if grid.rank == 1 else rows_only).forward(x)
    else:
        rows_only.forward(x)
    the_call_after_a_failure(grid, near, lambda: rows_only.forward(x))
    # the next call finds no message of the failed one left behind
    field = numpy.random.default_rng(7).standard_normal((2, NLAT, NLON))  # the same on every rank
    lat, lon = grid.local_slices(NLAT, NLON)
    numpy.testing.assert_array_equal(HaloExchange(grid, 1, 1).forward(field[..., lat, lon].copy()),
                                     expected_tile(grid, field, 1, 1))


# --- across the poles ------------------------------------------------------------------------

def across_reference(field, rows, cols, signs, quadrature):
    """The global field continued past the poles by reflection, from the grid's colatitudes alone.

    Past the north pole lie the reflections ``-theta_j`` of the rows, past
    the south pole ``2 pi - theta_j``; the halo rows are those that lie
    beyond the first (last) row, nearest first, each holding its row half
    way round times the field's sign. A row at a pole reflects onto itself
    and is not one of them.
    """
    nlat, nlon = field.shape[-2:]
    theta, _ = latitudes(nlat, quadrature)
    out = padded_reference(field, rows, cols)
    columns = ((numpy.arange(nlon + 2 * cols) - cols) + nlon // 2) % nlon
    s = numpy.asarray(signs, dtype=float).reshape(-1, 1)  # per field, over the columns of one row
    beyond_north = sorted((j for j in range(nlat) if -theta[j] < theta[0] - 1e-12), key=lambda j: theta[j])
    beyond_south = sorted((j for j in range(nlat) if 2 * numpy.pi - theta[j] > theta[-1] + 1e-12),
                          key=lambda j: numpy.pi - theta[j])
    for k in range(rows):
        out[..., rows - 1 - k, :] = s * field[..., beyond_north[k], columns]
        out[..., rows + nlat + k, :] = s * field[..., beyond_south[k], columns]
    return out


ACROSS_NLON = 12  # even: the opposite longitude is a grid column; uneven on 5 azimuth ranks
QUADRATURES = ["equiangular", "legendre-gauss", "lobatto"]


def _fits_across(grid, rows, quadrature):
    theta, _ = latitudes(NLAT, quadrature)
    sizes = grid.lat_sizes(NLAT)
    return rows + (theta[0] == 0) <= sizes[0] and rows + (abs(theta[-1] - numpy.pi) < 1e-12) <= sizes[-1]


@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("rows, cols", [(1, 0), (2, 2), (3, 1)])
def test_across_the_poles_matches_the_reflected_global_field(grid, rng, rows, cols, quadrature):
    if not _fits_across(grid, rows, quadrature):
        pytest.skip("the polar tiles are too small for these rows past the poles")
    field = rng.standard_normal((2, 3, NLAT, ACROSS_NLON))
    signs = (1, -1, -1)  # (h, u, v): vector components turn round at the pole
    op = HaloExchange(grid, rows, cols, extents=(NLAT, ACROSS_NLON), poles="across", signs=signs,
                      quadrature=quadrature)
    lat, lon = grid.local_slices(NLAT, ACROSS_NLON)
    got = op.forward(field[..., lat, lon].copy())
    want = across_reference(field, rows, cols, signs, quadrature)[..., lat.start:lat.stop + 2 * rows,
                                                                     lon.start:lon.stop + 2 * cols]
    numpy.testing.assert_array_equal(got, want)
    # in place, on an array that keeps its ghost cells
    padded = numpy.zeros_like(got)
    padded[..., rows:rows + lat.stop - lat.start, cols:cols + lon.stop - lon.start] = field[..., lat, lon]
    numpy.testing.assert_array_equal(op.update(padded), want)


def test_across_a_pole_row_is_not_repeated(grid):
    """Issue 24's example: a 9 x 8 equiangular field; the row next to the north pole is row 1 half way round."""
    nlat, nlon = 9, 8
    if grid.lat_sizes(nlat)[0] < 2 or grid.lat_sizes(nlat)[-1] < 2 or grid.nazimuth > nlon:
        pytest.skip("needs two rows on each polar tile")
    field = numpy.zeros((nlat, nlon))
    field[0] = numpy.arange(nlon)
    field[1] = 100 + numpy.arange(nlon)
    lat, lon = grid.local_slices(nlat, nlon)
    op = HaloExchange(grid, 1, 0, extents=(nlat, nlon), poles="across", quadrature="equiangular")
    got = op.forward(field[lat, lon].copy())
    if grid.polar_rank == 0:
        numpy.testing.assert_array_equal(got[0], (100 + (numpy.arange(nlon) + nlon // 2) % nlon)[lon])


@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("rows, cols", [(1, 0), (2, 2), (3, 1)])
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.complex128])
def test_across_the_poles_dottest(grid, rows, cols, dtype, quadrature):
    if not _fits_across(grid, rows, quadrature):
        pytest.skip("the polar tiles are too small for these rows past the poles")
    op = HaloExchange(grid, rows, cols, extents=(NLAT, ACROSS_NLON), poles="across", signs=(1, -1),
                      quadrature=quadrature)
    h, w = grid.local_shape(NLAT, ACROSS_NLON)
    local = rank_rng(grid.cart)
    x = random_array(local, (4, 2, h, w), dtype)
    y = random_array(local, (4, 2, h + 2 * rows, w + 2 * cols), dtype)
    assert dottest(op, x, y, rtol=1e-13) <= 1e-13
    reduce = HaloReduce(grid, rows, cols, extents=(NLAT, ACROSS_NLON), poles="across", signs=(1, -1),
                        quadrature=quadrature)
    numpy.testing.assert_array_equal(reduce.forward(y), op.adjoint(y))
    padded = y.copy()
    numpy.testing.assert_allclose(op.accumulate(padded)[..., rows:rows + h, cols:cols + w], op.adjoint(y),
                                  rtol=1e-15, atol=1e-15)


def test_across_the_poles_refuses_what_it_cannot_do(grid):
    with raises(ValueError, match="needs an even nlon"):
        HaloExchange(grid, 1, 1, extents=(NLAT, 11), poles="across", quadrature="legendre-gauss")
    with raises(ValueError, match="needs extents"):
        HaloExchange(grid, 1, 1, poles="across", quadrature="legendre-gauss")
    with raises(ValueError, match="needs quadrature="):
        HaloExchange(grid, 1, 1, extents=(NLAT, ACROSS_NLON), poles="across")
    with raises(ValueError, match="quadrature must be one of .*got 'gauss-hermite'"):
        HaloExchange(grid, 1, 1, extents=(NLAT, ACROSS_NLON), poles="across", quadrature="gauss-hermite")
    with raises(ValueError, match="poles must be one of 'zero', 'across'"):
        HaloExchange(grid, 1, 1, extents=(NLAT, ACROSS_NLON), poles="mirror")
    with raises(ValueError, match="signs apply across the poles"):
        HaloExchange(grid, 1, 1, extents=(NLAT, ACROSS_NLON), signs=(1, -1))
    with raises(ValueError, match="quadrature says where the poles are"):
        HaloExchange(grid, 1, 1, extents=(NLAT, ACROSS_NLON), quadrature="lobatto")
    op = HaloExchange(grid, 1, 1, extents=(NLAT, ACROSS_NLON), poles="across", signs=(1, -1),
                      quadrature="legendre-gauss")
    h, w = grid.local_shape(NLAT, ACROSS_NLON)
    fields = 3 if grid.rank == 0 else 2  # one rank passes three fields for two signs: every rank raises
    with raises(ValueError, match=f"rank 0 of {grid.size}: signs has 2 entries"):
        op.forward(numpy.zeros((fields, h, w)))


@pytest.mark.mpi(min_size=2)
def test_ranks_that_build_another_halo_raise_at_construction(grid):
    """The widths and poles decide who talks to whom: agreed when the exchange is built, on every rank."""
    with raises(ValueError, match=r"^HaloExchange: the \d ranks built it from different arguments: rows: .*, "
                                         r"rank 1 0\n  fix: build HaloExchange with the same rows on every rank .*"
                                         r"\n.*\n  rank 1 has: HaloExchange\(grid=.*rows=0"):
        HaloExchange(grid, 0 if grid.rank == 1 else 1, 1)
