"""HaloExchange on tiles in memory shared on the node: the same results as the message path, bit for bit.

Every rank of these launches shares one node, so every neighbour reads the
blocks of an array from ``halo.zeros`` straight from its owner's memory; the
message path is forced with ``config.shared_memory = False`` (as between
nodes) on some ranks or all, and plain arrays take it always.
"""

import numpy
import pytest

from mpisphere import config
from mpisphere.halo.round import HEADER_BYTES
from mpisphere.halo import HaloExchange

from helpers import await_failure_note, message_sizes, raises, random_array, rank_rng

pytestmark = pytest.mark.mpi

NLAT, NLON = 13, 10  # uneven on 2 and 3 ranks both ways
WIDTHS = [(1, 1), (2, 3), (0, 2), (3, 0)]


def _fits(grid, rows, cols, nlat=NLAT, nlon=NLON):
    return (grid.npolar == 1 or rows <= min(grid.lat_sizes(nlat))) and cols <= min(grid.lon_sizes(nlon))


def _halo(grid, rows, cols, **kwargs):
    if not _fits(grid, rows, cols):
        pytest.skip("the halo is wider than the smallest tile of this grid")
    return HaloExchange(grid, rows, cols, extents=(NLAT, NLON), **kwargs)


@pytest.mark.parametrize("lead", [2, (), (2, 3)], ids=str)
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.complex64])
def test_zeros_is_this_ranks_padded_tile_in_shared_memory(grid, lead, dtype):
    halo = _halo(grid, 2, 1)
    h, w = grid.local_shape(NLAT, NLON)
    a = halo.zeros(lead, dtype)
    want = ((lead,) if isinstance(lead, int) else lead) + (h + 4, w + 2)
    assert a.shape == want and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert not a.any()
    b = halo.empty(lead, dtype)
    assert b.shape == want and not numpy.shares_memory(a, b)
    assert grid.node_memory.find(a).array is a and grid.node_memory.find(a.copy()) is None


@pytest.mark.parametrize("rows, cols", WIDTHS)
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.complex128, numpy.float32])
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=str)
def test_update_and_accumulate_match_the_message_path_bit_for_bit(grid, rows, cols, dtype, lead):
    halo = _halo(grid, rows, cols)
    shared = halo.zeros(lead, dtype)
    start = random_array(rank_rng(grid.cart), shared.shape, dtype)  # garbage in the halo too
    shared[...] = start
    plain = start.copy()
    for call in ("update", "accumulate", "update", "accumulate"):  # calls in a row reuse the plans and counters
        getattr(halo, call)(plain)
        assert getattr(halo, call)(shared) is shared
        numpy.testing.assert_array_equal(shared, plain, err_msg=call)
    # out= a shared tile, and the adjoint of one
    h, w = grid.local_shape(NLAT, NLON)
    x = random_array(rank_rng(grid.cart, 3), lead + (h, w), dtype)
    numpy.testing.assert_array_equal(halo.forward(x, out=shared), halo.forward(x))
    shared[...] = start
    numpy.testing.assert_array_equal(halo.adjoint(shared), halo.adjoint(start))


@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3)])
def test_the_two_paths_mix_in_one_call(grid, rows, cols):
    """Each rank decides for the blocks it sends: shared, messages forced, or a plain array, rank by rank."""
    halo = _halo(grid, rows, cols)
    shared = halo.zeros(3)
    start = rank_rng(grid.cart).standard_normal(shared.shape)
    for call in ("update", "accumulate"):
        want = getattr(halo, call)(start.copy())
        for kind in ("forced on odd ranks", "plain on even ranks"):
            shared[...] = start
            if kind.startswith("forced"):
                with config.override(shared_memory=grid.rank % 2 == 0):
                    got = getattr(halo, call)(shared)
            else:
                got = getattr(halo, call)(shared if grid.rank % 2 else start.copy())
            numpy.testing.assert_array_equal(got, want, err_msg=f"{call}, {kind}")


@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3)])
def test_neighbours_on_another_node_get_messages(grid, rows, cols, monkeypatch):
    """Two nodes, as the node memory sees them: the ranks below half the grid, and the others."""
    halo = _halo(grid, rows, cols)
    shared = halo.zeros(2)
    memory = grid.node_memory
    half = grid.size // 2
    mine = {r: i for r, i in memory._node_rank.items() if (r < half) == (grid.rank < half)}
    monkeypatch.setattr(memory, "_node_rank", mine)
    start = rank_rng(grid.cart).standard_normal(shared.shape)
    for call in ("update", "accumulate"):
        shared[...] = start
        numpy.testing.assert_array_equal(getattr(halo, call)(shared), getattr(halo, call)(start.copy()))


@pytest.mark.parametrize("rows, cols", WIDTHS)
def test_update_and_accumulate_are_adjoint_on_shared_tiles(grid, rows, cols):
    halo = _halo(grid, rows, cols)
    local = rank_rng(grid.cart)
    p_arr, q_arr = halo.zeros(2), halo.zeros(2)
    p_arr[...] = local.standard_normal(p_arr.shape)
    q_arr[...] = local.standard_normal(q_arr.shape)
    p0, q0 = p_arr.copy(), q_arr.copy()
    up, acc = halo.update(p_arr), halo.accumulate(q_arr)
    lhs = grid.cart.allreduce(float(numpy.vdot(up, q0)))
    rhs = grid.cart.allreduce(float(numpy.vdot(p0, acc)))
    bound = grid.cart.allreduce(float(numpy.vdot(abs(up), abs(q0)) + numpy.vdot(abs(p0), abs(acc))))
    assert abs(lhs - rhs) <= 1e-15 * bound  # copies and sums only: equal up to the rounding of the two sums


@pytest.mark.parametrize("rows, cols", [(1, 0), (2, 2)])
def test_across_the_poles_on_shared_tiles(grid, rows, cols):
    nlon = 12
    if not _fits(grid, rows + 1, cols, nlon=nlon):
        pytest.skip("the polar tiles are too small for these rows past the poles")
    halo = HaloExchange(grid, rows, cols, extents=(NLAT, nlon), poles="across", signs=(1, -1, -1),
                        quadrature="equiangular")
    shared = halo.zeros((2, 3))
    start = rank_rng(grid.cart).standard_normal(shared.shape)
    for call in ("update", "accumulate"):
        shared[...] = start
        numpy.testing.assert_array_equal(getattr(halo, call)(shared), getattr(halo, call)(start.copy()))


def test_shared_tiles_send_headers_alone(grid, monkeypatch):
    """Blocks of a shared tile stay in memory (every message a header); forced, they travel as messages."""
    sizes = message_sizes(monkeypatch)
    halo = _halo(grid, 1, 1)
    shared = halo.zeros(2)
    halo.update(shared)
    neighbours = len(halo.pattern.sends)
    assert len(sizes) == neighbours and all(n == HEADER_BYTES for n in sizes), sizes
    sizes.clear()
    with config.override(shared_memory=False):
        halo.update(shared)
    assert len(sizes) == neighbours and all(n > HEADER_BYTES for n in sizes), sizes


def test_the_message_path_sets_up_its_sends_once(grid, monkeypatch):
    """One persistent send per neighbour, direction and epoch (the wire tag's offset, which follows the count of
    agreements on the grid) for every call of a shape; new ones after free()."""
    from mpisphere.halo.round import EPOCH_TAGS
    from mpisphere import collectives
    made = []
    send_init = collectives.send_init_bytes

    def spy(comm, buf, dest, tag):
        made.append((dest, tag))
        return send_init(comm, buf, dest, tag)

    monkeypatch.setattr(collectives, "send_init_bytes", spy)
    halo = _halo(grid, 1, 1)
    h, w = grid.local_shape(NLAT, NLON)
    padded = numpy.zeros((2, h + 2, w + 2))
    for _ in range(4):
        halo.update(padded)
        halo.accumulate(padded)
    first = {(dest, tag) for tag, dest in halo.pattern.sends.items()}
    twins = {(dest, tag + EPOCH_TAGS) for dest, tag in first}
    assert len(made) == len(set(made)) and first <= set(made) <= first | twins, made
    before = len(made)
    halo.free()
    halo.update(padded)
    assert len(made) == before + len(halo.pattern.sends) and set(made[before:]) <= first | twins, made


def test_a_mistake_next_to_a_shared_tile_raises_and_the_next_call_works(grid):
    """Rank 1 passes another batch; its neighbours raise, the others return and raise at the end of their next
    call (which completes on every rank); then every rank exchanges again."""
    if grid.size < 2:
        pytest.skip("needs two ranks")
    halo = _halo(grid, 1, 1)
    shared = halo.zeros(2)
    start = rank_rng(grid.cart).standard_normal(shared.shape)
    shared[...] = start
    p0, a0 = divmod(1, grid.nazimuth)
    near = {p * grid.nazimuth + (a0 + da) % grid.nazimuth
            for p in (p0 - 1, p0, p0 + 1) if 0 <= p < grid.npolar for da in (-1, 0, 1)}
    x = numpy.zeros((3,) + shared.shape[1:]) if grid.rank == 1 else shared
    if grid.rank in near:
        with raises(ValueError, match="cannot exchange its halo"):
            halo.update(x)
    else:
        halo.update(x)
        await_failure_note(grid)
    shared[...] = start  # every rank again: nothing of the failed call is left behind (messages, counters)
    if grid.rank in near:
        halo.update(shared)
    else:  # the ranks the mistake did not reach raise at the end of their next call, which completes
        # the first note read may come from rank 1 itself (its view: its call and a neighbour's do not match)
        with raises(ValueError, match=r"failed on rank \d+ \((its call and rank \d+'s do not match)\) in an "
                                      r"earlier call"):
            halo.update(shared)
    numpy.testing.assert_array_equal(shared, halo.update(start.copy()))
    shared[...] = start  # and the call after that works on every rank
    numpy.testing.assert_array_equal(halo.update(shared), halo.update(start.copy()))


def test_allocation_checks_and_agrees(grid):
    halo = _halo(grid, 1, 1)
    with raises(TypeError, match=r"^HaloExchange.zeros: ranks? [0-9, -]+ of \d+: lead must be an int or a "
                                        r"tuple"):
        halo.zeros("2")
    with raises(TypeError, match=r"^HaloExchange.empty: ranks? [0-9, -]+ of \d+: .*bool"):
        halo.empty(2, bool)
    with raises(TypeError, match=r"^HaloExchange.zeros: ranks? [0-9, -]+ of \d+: a halo without extents"):
        HaloExchange(grid, 1, 1).zeros(2)


def test_a_grid_frees_its_shared_tiles(comm):
    from mpisphere import ProcessGrid
    with ProcessGrid(comm) as grid:
        halo = HaloExchange(grid, 1, 1, extents=(NLAT, NLON))
        halo.update(halo.zeros(2))
        memory = grid.node_memory
    assert memory.freed and not memory.records
