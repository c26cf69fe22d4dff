"""Communication primitives against a serial NumPy reference, and their adjoints.

Every test builds the same global array on every rank (the rng fixture is
seeded identically), gives each rank its piece, runs the operator on
``grid.polar`` or ``grid.azimuth``, and compares with the slice of a NumPy
computation on the global array. Dot tests use data that differs per rank.
"""

import gc
import re
import tracemalloc

import numpy
import pytest
from mpi4py import MPI

import mpisphere
from mpisphere import (BufferPool, CopyTo, GatherFrom, GatherFromCopyTo, ReduceFrom, ReduceScatter, ScatterTo,
                       Transpose, config, dottest)

from helpers import FLOAT_TOL, chunk, every_rank, quoted, raises, random_array, rank_rng, whole_message

pytestmark = pytest.mark.mpi

COMMS = ["polar", "azimuth", "cart"]  # cart: 4 and 6 ranks in one communicator
DTYPES = [numpy.float64, numpy.complex128, numpy.float32, numpy.complex64, numpy.float16]
EXACT_DTYPES = [numpy.float64, numpy.complex128]

# (global shape, (a, b)): uneven extents everywhere; split axes leading, trailing, middle, negative
TRANSPOSE_CASES = [
    ((5, 7, 11), (0, -1)),
    ((5, 7, 11), (-1, 0)),
    ((5, 7, 11), (1, 2)),
    ((5, 7, 11), (2, 1)),
    ((6, 9), (0, 1)),
    ((3, 5, 7, 8), (1, -1)),
    ((3, 5, 7, 8), (-1, -3)),
    ((1, 1, 13, 7), (2, 3)),
]


def _comm(grid, which):
    return getattr(grid, which)


# --- Transpose ------------------------------------------------------------------

@pytest.mark.parametrize("which", COMMS)
@pytest.mark.parametrize("shape, axes", TRANSPOSE_CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: numpy.dtype(d).name)
def test_transpose_matches_reference(grid, which, rng, shape, axes, dtype):
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    a, b = axes
    if shape[a] < p or shape[b] < p:
        pytest.skip("extent smaller than the communicator")
    g = random_array(rng, shape, dtype)
    op = Transpose(comm, axes=axes, extents=(shape[a], shape[b]))
    x = chunk(g, b, p, r)
    y = op.forward(x)
    numpy.testing.assert_array_equal(y, chunk(g, a, p, r))  # pure data movement: exact
    assert y.dtype == g.dtype and y.flags.c_contiguous
    back = op.adjoint(y)
    numpy.testing.assert_array_equal(back, x)  # adjoint of a permutation is its inverse, bit for bit


@pytest.mark.parametrize("which", COMMS)
@pytest.mark.parametrize("shape, axes", TRANSPOSE_CASES, ids=str)
@pytest.mark.parametrize("dtype", EXACT_DTYPES, ids=lambda d: numpy.dtype(d).name)
def test_transpose_dottest(grid, which, shape, axes, dtype):
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    a, b = axes
    if shape[a] < p or shape[b] < p:
        pytest.skip("extent smaller than the communicator")
    op = Transpose(comm, axes=axes, extents=(shape[a], shape[b]))
    local = rank_rng(comm)
    x_shape = list(shape)
    x_shape[b] = mpisphere.split_sizes(shape[b], p)[r]
    y_shape = list(shape)
    y_shape[a] = mpisphere.split_sizes(shape[a], p)[r]
    assert dottest(op, random_array(local, x_shape, dtype), random_array(local, y_shape, dtype), rtol=1e-13) <= 1e-13


@pytest.mark.parametrize("which", COMMS)
def test_transpose_reference_problem_sizes(grid, which, rng):
    """nlat=361 and nlon=720 over the comm, a leading axis of 5 (uneven over 2, 3 and 4 ranks)."""
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    g = rng.standard_normal((5, 361, 720))
    for axes in ((0, -1), (-2, 0), (-1, -2)):
        a, b = axes
        if min(g.shape[a], g.shape[b]) < p:
            continue  # a batch of 5 cannot be split over 6 ranks (tested as an error elsewhere)
        op = Transpose(comm, axes=axes, extents=(g.shape[a], g.shape[b]))
        x = chunk(g, b, p, r)
        y = op.forward(x)
        numpy.testing.assert_array_equal(y, chunk(g, a, p, r))
        numpy.testing.assert_array_equal(op.adjoint(y), x)
        local = rank_rng(comm)
        assert dottest(op, local.standard_normal(x.shape), local.standard_normal(y.shape)) <= 1e-13


@pytest.mark.parametrize("which", COMMS)
def test_transpose_non_contiguous_input_and_out(grid, which, rng):
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    g = rng.standard_normal((6, 9, 10))
    op = Transpose(comm, axes=(0, 2), extents=(6, 10))
    x = numpy.asfortranarray(chunk(g, 2, p, r))  # same values, Fortran order
    assert not x.flags.c_contiguous
    y = op.forward(x)
    numpy.testing.assert_array_equal(y, chunk(g, 0, p, r))
    x_view = chunk(g, 2, p, r)[:, ::1, :]  # a strided view of the global array
    out = numpy.full(y.shape, numpy.nan)
    assert op.forward(x_view, out=out) is out
    numpy.testing.assert_array_equal(out, y)
    out_f = numpy.asfortranarray(numpy.zeros_like(y))  # a non-contiguous out is written correctly too
    op.forward(x, out=out_f)
    numpy.testing.assert_array_equal(out_f, y)


def test_transpose_inputs_are_not_modified(grid, rng):
    comm = grid.azimuth
    p, r = comm.Get_size(), comm.Get_rank()
    g = rng.standard_normal((4, 5, 6))
    x = chunk(g, -1, p, r).copy()
    before = x.copy()
    op = Transpose(comm, (0, -1), (4, 6))
    y = op.forward(x)
    y_before = y.copy()
    op.adjoint(y)
    numpy.testing.assert_array_equal(x, before)
    numpy.testing.assert_array_equal(y, y_before)
    assert not numpy.shares_memory(y, x)


# --- reductions and gathers ---------------------------------------------------------

def _reference(name, g_ranks, axis, p, r):
    """Serial result of op ``name`` on rank r, from every rank's input ``g_ranks[q]``."""
    if name in ("ReduceFrom",):
        return sum(g.astype(numpy.float32) if g.dtype == numpy.float16 else g for g in g_ranks)
    if name in ("GatherFrom", "GatherFromCopyTo"):
        return numpy.concatenate([chunk(g_ranks[q], axis, p, q) for q in range(p)], axis=axis)
    if name == "ReduceScatter":
        total = sum(g.astype(numpy.float32) if g.dtype == numpy.float16 else g for g in g_ranks)
        return chunk(total, axis, p, r)
    raise AssertionError(name)


def _abs_sum(g_ranks):
    """Elementwise sum over ranks of |terms|: the bound a sum's rounding is measured against."""
    return sum(abs(g.astype(numpy.complex128 if g.dtype.kind == "c" else numpy.float64)) for g in g_ranks)


def assert_sum_close(got, exact, bound, dtype):
    """``|got - exact| <= tol * bound`` elementwise, ``bound`` the sum of |terms| (it cannot cancel).

    float16 is summed in float32 and rounded once to float16 (half an ulp of
    the result, at most 2**-11 of the bound, plus float32 rounding).
    """
    got = got.astype(numpy.complex128 if got.dtype.kind == "c" else numpy.float64)
    exact = numpy.asarray(exact).astype(got.dtype)
    tol = 2.0 ** -10 if numpy.dtype(dtype) == numpy.float16 else FLOAT_TOL[numpy.dtype(dtype)]
    excess = abs(got - exact) - tol * bound
    assert (excess <= 0).all(), f"rounding beyond {tol:.1e} of the bound: {excess.max():.3e} too far"


SPLIT_CASES = [((5, 7, 11), 0), ((5, 7, 11), -1), ((5, 7, 11), 1), ((3, 4, 361), -1), ((6, 5), -2)]


@pytest.mark.parametrize("which", COMMS)
@pytest.mark.parametrize("shape, axis", SPLIT_CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: numpy.dtype(d).name)
def test_gathers_and_scatters_match_reference(grid, which, rng, shape, axis, dtype):
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    if shape[axis] < p:
        pytest.skip("extent smaller than the communicator")
    extent = shape[axis]
    # a different global array per rank, known to every rank
    g_ranks = [random_array(rng, shape, dtype) for _ in range(p)]
    mine = g_ranks[r]

    y = GatherFrom(comm, axis, extent).forward(chunk(mine, axis, p, r))
    numpy.testing.assert_array_equal(y, _reference("GatherFrom", g_ranks, axis, p, r))
    y = GatherFromCopyTo(comm, axis, extent).forward(chunk(mine, axis, p, r))
    numpy.testing.assert_array_equal(y, _reference("GatherFromCopyTo", g_ranks, axis, p, r))
    y = ScatterTo(comm, axis, extent).forward(g_ranks[0])
    numpy.testing.assert_array_equal(y, chunk(g_ranks[0], axis, p, r))
    y = GatherFrom(comm, axis, extent).adjoint(g_ranks[0])
    numpy.testing.assert_array_equal(y, chunk(g_ranks[0], axis, p, r))
    y = ScatterTo(comm, axis, extent).adjoint(chunk(mine, axis, p, r))
    numpy.testing.assert_array_equal(y, _reference("GatherFrom", g_ranks, axis, p, r))

    for name, op, direction in (("ReduceScatter", ReduceScatter(comm, axis, extent), "forward"),
                                ("ReduceScatter", GatherFromCopyTo(comm, axis, extent), "adjoint")):
        y = getattr(op, direction)(mine)
        ref = _reference(name, g_ranks, axis, p, r)
        assert y.dtype == mine.dtype and y.shape == ref.shape
        assert_sum_close(y, ref, chunk(_abs_sum(g_ranks), axis, p, r), dtype)


@pytest.mark.parametrize("which", COMMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: numpy.dtype(d).name)
def test_copy_to_and_reduce_from_match_reference(grid, which, rng, dtype):
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    g_ranks = [random_array(rng, (3, 5, 7), dtype) for _ in range(p)]
    mine = g_ranks[r]
    before = mine.copy()
    ref = _reference("ReduceFrom", g_ranks, 0, p, r)
    for y in (ReduceFrom(comm).forward(mine), CopyTo(comm).adjoint(mine)):
        assert y.dtype == mine.dtype and not numpy.shares_memory(y, mine)
        assert_sum_close(y, ref, _abs_sum(g_ranks), dtype)
    numpy.testing.assert_array_equal(mine, before)  # the caller's array is never reduced in place
    for y in (CopyTo(comm).forward(mine), ReduceFrom(comm).adjoint(mine)):
        numpy.testing.assert_array_equal(y, mine)
        assert not numpy.shares_memory(y, mine)


def test_float16_reduction_runs_in_float32(grid):
    """Many small float16 terms: float16 accumulation would lose them, float32 keeps them."""
    comm = grid.cart
    p = comm.Get_size()
    x = numpy.full(4, 2048.0, numpy.float16) if comm.Get_rank() == 0 else numpy.full(4, 1.0, numpy.float16)
    y = ReduceFrom(comm).forward(x)
    # the exact sum, rounded to float16 once (sequential float16 additions would stay at 2048)
    assert (y == numpy.float32(2048 + (p - 1)).astype(numpy.float16)).all()


OPS_WITH_AXIS = [ScatterTo, GatherFrom, ReduceScatter, GatherFromCopyTo]


def _domain_shape(op, shape, axis, p, r):
    whole = op.domain.kind == mpisphere.REPLICATED or isinstance(op, ReduceScatter)
    s = list(shape)
    if not whole:
        s[axis] = mpisphere.split_sizes(shape[axis], p)[r]
    return tuple(s)


def _range_shape(op, shape, axis, p, r):
    whole = isinstance(op, (GatherFrom, GatherFromCopyTo))
    s = list(shape)
    if not whole:
        s[axis] = mpisphere.split_sizes(shape[axis], p)[r]
    return tuple(s)


def _point(layout, rng_same, rng_local, shape, dtype):
    """Test data for one side: identical on all ranks when replicated."""
    source = rng_same if layout.kind == mpisphere.REPLICATED else rng_local
    return random_array(source, shape, dtype)


@pytest.mark.parametrize("which", COMMS)
@pytest.mark.parametrize("shape, axis", SPLIT_CASES, ids=str)
@pytest.mark.parametrize("dtype", EXACT_DTYPES, ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("cls", OPS_WITH_AXIS + [CopyTo, ReduceFrom], ids=lambda c: c.__name__)
def test_dottest(grid, which, rng, shape, axis, dtype, cls):
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    if shape[axis] < p:
        pytest.skip("extent smaller than the communicator")
    if cls in OPS_WITH_AXIS:
        op = cls(comm, axis, shape[axis])
        xs, ys = _domain_shape(op, shape, axis, p, r), _range_shape(op, shape, axis, p, r)
    else:
        op = cls(comm)
        xs = ys = shape
    local = rank_rng(comm)
    x = _point(op.domain, rng, local, xs, dtype)
    y = _point(op.range, rng, local, ys, dtype)
    assert dottest(op, x, y, rtol=1e-13) <= 1e-13
    assert dottest(op.H, y, x, rtol=1e-13) <= 1e-13


# --- composition -------------------------------------------------------------------

def test_composition_adjoint_equals_reversed_adjoints(grid, rng):
    nlat, nlon, batch = 13, 10, 5
    polar, azimuth = grid.polar, grid.azimuth
    h = mpisphere.split_sizes(nlat, grid.npolar)[grid.polar_rank]
    w = mpisphere.split_sizes(nlon, grid.nazimuth)[grid.azimuth_rank]
    b_az = mpisphere.split_sizes(batch, grid.nazimuth)[grid.azimuth_rank]
    # B: azimuth transpose (batch split, longitudes whole); A: polar gather of latitudes
    B = Transpose(azimuth, axes=(0, -1), extents=(batch, nlon))
    A = GatherFromCopyTo(polar, axis=-2, extent=nlat)
    AB = A @ B
    local = rank_rng(grid.cart)
    x = local.standard_normal((batch, h, w))
    y = local.standard_normal((b_az, nlat, nlon))
    numpy.testing.assert_array_equal(AB.forward(x), A.forward(B.forward(x)))
    numpy.testing.assert_array_equal(AB.H.forward(y), (B.H @ A.H).forward(y))
    numpy.testing.assert_array_equal(AB.adjoint(y), B.adjoint(A.adjoint(y)))
    assert AB.H.H is not None and AB.H.domain.kind == AB.range.kind
    # the operators on the row and on the column both sum over the whole grid
    assert AB.domain.space is grid.cart and AB.range.space is grid.cart
    assert dottest(AB, x, y) <= 1e-15


def _cross_communicator_chain(grid, batch, nlat, nlon):
    """A chain through grid.azimuth, grid.polar and grid.cart: (batch, h, w) -> (b_polar, nlat, nlon)."""
    to_lon = Transpose(grid.azimuth, axes=(0, -1), extents=(batch, nlon))  # (b_az, h, nlon)
    back = Transpose(grid.azimuth, axes=(-1, 0), extents=(nlon, batch))    # (batch, h, w)
    to_lat = Transpose(grid.polar, axes=(0, -2), extents=(batch, nlat))    # (b_polar, nlat, w)
    summed = ReduceScatter(grid.cart, axis=0, extent=batch)                # whole batch, partial sums -> own chunk
    spread = GatherFromCopyTo(grid.cart, axis=0, extent=batch)             # own chunk -> a copy of the whole
    return to_lat @ back @ to_lon, summed @ spread


def test_compositions_across_the_grid_communicators(grid):
    """Operators on grid.polar, grid.azimuth and grid.cart compose; their dot tests sum over the grid.

    Before layouts knew their space, each part summed over its own
    communicator and these dot tests failed on every multi-rank grid.
    """
    batch, nlat, nlon = 7, 11, 10
    chain, on_cart = _cross_communicator_chain(grid, batch, nlat, nlon)
    h, w = grid.local_shape(nlat, nlon)
    local = rank_rng(grid.cart, seed=9)
    x = local.standard_normal((batch, h, w))
    y = local.standard_normal(chain.forward(x).shape)
    assert dottest(chain, x, y) <= 1e-15
    z = local.standard_normal((mpisphere.split_sizes(batch, grid.size)[grid.rank], 3))
    assert dottest(on_cart, z, local.standard_normal(z.shape)) <= 1e-15
    # cart and polar operators mixed in one chain
    gather_rows = GatherFrom(grid.polar, axis=-2, extent=nlat)  # (batch, nlat, w), replicated over the column
    copy_back = CopyTo(grid.polar)
    mixed = copy_back @ gather_rows
    y = local.standard_normal((batch, nlat, w))
    assert dottest(mixed, x, y) <= 1e-15


def test_compositions_with_the_sht(grid):
    from mpisphere import DistributedInverseRealSHT, DistributedRealSHT
    nlat, nlon = 13, 24
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    # a spectral filter applied in grid space, then gathered along latitudes on each column
    filtered = GatherFromCopyTo(grid.polar, axis=-2, extent=nlat) @ isht @ sht
    local = rank_rng(grid.cart, seed=4)
    x = local.standard_normal((2,) + sht.tile_shape)
    y = local.standard_normal(filtered.forward(x).shape)
    assert dottest(filtered, x, y, rtol=1e-13) <= 1e-13


def test_composition_of_mismatched_layouts_is_an_error(grid):
    with raises(ValueError, match=r"cannot compose ReduceScatter @ GatherFrom: GatherFrom returns "
                                         r"Layout\('replicated', grid.polar .*\) but ReduceScatter takes "
                                         r"Layout\('distributed', grid.polar .*\); replicated arrays cannot be used "
                                         r"as distributed ones"):
        ReduceScatter(grid.polar, 0, grid.npolar) @ GatherFrom(grid.polar, 0, grid.npolar)
    if grid.npolar > 1 and grid.nazimuth > 1:
        # copies along a column are not copies along a row
        with raises(ValueError, match=r"GatherFrom returns Layout\('replicated', grid.polar .* but ScatterTo "
                                             r"takes Layout\('replicated', grid.azimuth .*; their arrays are "
                                             r"replicated over different ranks"):
            ScatterTo(grid.azimuth, 0, grid.nazimuth) @ GatherFrom(grid.polar, 0, grid.npolar)
    if grid.size > 1:
        with raises(ValueError, match=r"CopyTo takes Layout\('replicated', .*\); their inner products sum "
                                             r"over different ranks"):
            CopyTo(MPI.COMM_SELF) @ ReduceFrom(grid.cart)


def test_gather_scatter_composition_round_trip(grid, rng):
    comm = grid.polar
    p, r = comm.Get_size(), comm.Get_rank()
    g = rng.standard_normal((7, 4))
    S, G = ScatterTo(comm, 0, 7), GatherFrom(comm, 0, 7)
    numpy.testing.assert_array_equal((G @ S).forward(g), g)
    numpy.testing.assert_array_equal((S @ G).forward(chunk(g, 0, p, r)), chunk(g, 0, p, r))


# --- bad input ----------------------------------------------------------------------

def test_wrong_local_extent_names_operator_rank_expected_got(grid):
    """Every rank is wrong here: each raises one error quoting the first four ranks' findings."""
    comm = grid.cart
    p, r = comm.Get_size(), comm.Get_rank()
    op = Transpose(comm, axes=(0, 1), extents=(p + 2, 2 * p + 1))
    good = mpisphere.split_sizes(2 * p + 1, p)
    mine = rf"rank {r} of {p}: expected {p + 2} entries along axis 0 \(whole\) and {good[r]} along axis 1 " \
           rf"\(chunk {r} of {2 * p + 1} split over {p} ranks\), got input shape \({p + 2}, {good[r] + 1}\)"
    with raises(ValueError, match=r"^Transpose.forward: rank 0 of") as caught:
        op.forward(numpy.zeros((p + 2, good[r] + 1)))
    assert re.search(quoted(mine.split(": ", 1)[1], r, p), whole_message(caught.value))
    with raises(ValueError, match=rf"^GatherFrom.forward: rank 0 of {p}: expected 3 entries along axis -1 "
                                         rf"\(chunk 0 of {3 * p} split over {p} ranks\), got 4"):
        GatherFrom(comm, -1, 3 * p).forward(numpy.zeros((2, 4)))
    with raises(ValueError, match=rf"^ReduceScatter.forward: {every_rank(p)}: expected {3 * p} entries .*whole"):
        ReduceScatter(comm, 0, 3 * p).forward(numpy.zeros((3 * p + 1, 2)))


def test_axis_out_of_range(grid):
    comm = grid.cart
    with raises(ValueError, match="axis 3 is out of range for an array of shape \\(4, 4\\)"):
        GatherFrom(comm, 3, comm.Get_size()).forward(numpy.zeros((4, 4)))
    with raises(ValueError, match="axis -3 is out of range"):
        Transpose(comm, (-3, -1), (comm.Get_size(), comm.Get_size())).forward(numpy.zeros((4, 4)))
    with raises(ValueError, match="name the same axis"):
        Transpose(comm, (-1, 1), (comm.Get_size(), comm.Get_size())).forward(numpy.zeros((4, 4)))


def test_extent_smaller_than_comm(grid):
    comm = grid.cart
    p = comm.Get_size()
    if p == 1:
        with raises(ValueError, match="extent=0 is smaller than the communicator size 1"):
            ScatterTo(comm, 0, 0)
        return
    with raises(ValueError, match=rf"ScatterTo: extent={p - 1} is smaller than the communicator size {p}"):
        ScatterTo(comm, 0, p - 1)
    with raises(ValueError, match=rf"Transpose: extents\[1\]={p - 1} is smaller"):
        Transpose(comm, (0, 1), (p, p - 1))


def test_bad_construction_arguments(grid):
    with raises(TypeError, match="comm must be an mpi4py Intracomm"):
        CopyTo(grid)
    with raises(ValueError, match="axes must differ"):
        Transpose(grid.cart, (1, 1), (4, 4))
    with raises(TypeError, match="axes must be a pair of integers"):
        Transpose(grid.cart, (0,), (4, 4))
    with raises(TypeError, match=r"Transpose: extents must be a pair of integers, got \(4, 4, 4\)"):
        Transpose(grid.cart, (0, 1), (4, 4, 4))
    with raises(TypeError, match="axis must be an integer"):
        GatherFrom(grid.cart, 0.5, 4)


@pytest.mark.parametrize("dtype", [numpy.int32, numpy.bool_, numpy.float128 if hasattr(numpy, "float128") else object])
def test_unsupported_dtype(grid, dtype):
    comm = grid.cart
    p = comm.Get_size()
    x = numpy.zeros((p, 3), dtype=dtype)
    with raises(TypeError, match=rf"^ReduceFrom.forward: {every_rank(p)}: unsupported dtype"):
        ReduceFrom(comm).forward(x)
    with raises(TypeError, match="unsupported dtype"):
        Transpose(comm, (0, 1), (p, 3 * p)).forward(numpy.zeros((p, 3), dtype=dtype))


def test_out_argument_is_checked(grid):
    comm = grid.cart
    x = numpy.zeros((2, 3))
    with raises(ValueError, match=r"out has shape \(3, 3\) float64, expected \(2, 3\) float64"):
        CopyTo(comm).forward(x, out=numpy.zeros((3, 3)))
    with raises(ValueError, match="expected \\(2, 3\\) float64"):
        ReduceFrom(comm).forward(x, out=numpy.zeros((2, 3), numpy.float32))
    with raises(ValueError, match="out overlaps the input"):
        CopyTo(comm).forward(x, out=x)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_mismatch_on_one_rank_raises_on_every_rank(grid, debug):
    """Only the last rank is wrong; every rank raises the same error, debug mode or not."""
    comm = grid.cart
    p, r = comm.Get_size(), comm.Get_rank()
    extent = 2 * p + 1
    op = GatherFrom(comm, 0, extent)
    n = mpisphere.split_sizes(extent, p)[r] + (1 if r == p - 1 else 0)
    with config.override(debug=debug):
        with raises(ValueError, match=rf"^GatherFrom.forward: rank {p - 1} of {p}: expected"):
            op.forward(numpy.zeros((n, 3)))
        # a mismatch no single rank can see: trailing shapes differ between ranks
        x = numpy.zeros((mpisphere.split_sizes(extent, p)[r], 3 + (r == 1)))
        with raises(ValueError, match=r"the \d ranks disagree on what they are about to do: input: .*shape \('\*', "
                                             r"3\) float64 on host, rank 1 shape \('\*', 4\) float64 on host\n"
                                             r"(.*\n)+  rank 1 has: .*shape \('\*', 4\)"):
            op.forward(x)
        y = numpy.zeros((4, 4), numpy.float32 if r == 1 else numpy.float64)
        with raises(ValueError, match=r"  rank 1 has: ReduceFrom\(comm=grid.cart \(\d ranks?\)\) forward: shape "
                                             r"\(4, 4\) float32"):
            ReduceFrom(comm).forward(y)
    assert config.debug is False


# --- resources ---------------------------------------------------------------------

def test_repeated_calls_do_not_grow_memory(grid, rng):
    if grid.size > 2:
        pytest.skip("run at 1 and 2 ranks: what a call keeps does not depend on the rank count, and tracing "
                    "allocations on oversubscribed cores takes ten seconds a grid")
    comm = grid.azimuth
    p, r = comm.Get_size(), comm.Get_rank()
    g = rng.standard_normal((6, 5, 11))
    ops = [(Transpose(comm, (1, -1), (5, 11)), chunk(g, -1, p, r)),
           (GatherFromCopyTo(comm, 1, 5), chunk(g, 1, p, r)),
           (ReduceFrom(comm), g)]
    for op, x in ops:
        op.forward(x)  # warm up: scratch buffers are allocated once
        op.adjoint(op.forward(x))
    # count only what mpisphere's own code allocated and still holds (pytest allocates too)
    mine = [tracemalloc.Filter(True, "*mpisphere/*", all_frames=True)]
    tracemalloc.start(8)
    try:
        for _ in range(100):  # let Python's and NumPy's own (bounded) caches settle while traced
            for op, x in ops:
                op.adjoint(op.forward(x))
        gc.collect()
        start = tracemalloc.take_snapshot().filter_traces(mine)
        for _ in range(300):
            for op, x in ops:
                op.adjoint(op.forward(x))
        gc.collect()
        end = tracemalloc.take_snapshot().filter_traces(mine)
    finally:
        tracemalloc.stop()
    # Python's small-object allocator keeps a bounded number of freed strings alive (NumPy's dtype.name
    # alone shows tens of them); a leak keeps at least one object per call: 1800 calls here
    kept = sum(stat.count_diff for stat in end.compare_to(start, "filename"))
    grown = sum(stat.size_diff for stat in end.compare_to(start, "filename"))
    assert kept < 600, f"{kept} more objects ({grown} bytes) alive after 1800 calls: a leak"


def test_size_one_communicator_makes_no_mpi_call(rng, monkeypatch):
    from mpisphere import collectives
    calls = []
    for name in ("alltoallv", "allgatherv", "reduce_scatter", "allreduce"):
        monkeypatch.setattr(collectives, name, lambda *a, _n=name, **k: calls.append(_n))
    comm = MPI.COMM_SELF
    g = rng.standard_normal((3, 4))
    for op in (Transpose(comm, (0, 1), (3, 4)), GatherFrom(comm, 1, 4), ReduceScatter(comm, 0, 3),
               GatherFromCopyTo(comm, 0, 3), ReduceFrom(comm), CopyTo(comm), ScatterTo(comm, 0, 3)):
        numpy.testing.assert_array_equal(op.forward(g), g)
        numpy.testing.assert_array_equal(op.adjoint(g), g)
    assert calls == []


# --- non-blocking transposes ------------------------------------------------------------------------

@pytest.mark.parametrize("which", COMMS)
@pytest.mark.parametrize("order", ["in-order", "reversed"])
@pytest.mark.parametrize("shared", [False, True], ids=["own-pools", "one-pool"])
def test_two_transposes_in_flight_complete_in_either_order(grid, which, rng, order, shared):
    """Two exchanges on one operator and one on another are in flight at once; every result is exact (also
    when the two operators take their buffers from one pool: each exchange in flight has a set of its own)."""
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    g1, g2 = rng.standard_normal((7, 6, 11)), rng.standard_normal((7, 6, 11)) + 1j
    pool = BufferPool() if shared else None
    op = Transpose(comm, axes=(0, -1), extents=(7, 11), pool=pool)
    other = Transpose(comm, axes=(1, 0), extents=(6, 7), pool=pool)
    x1, x2 = chunk(g1, -1, p, r), chunk(g2.real.copy(), -1, p, r)
    x3 = chunk(g1, 0, p, r)
    first = op.start_forward(x1)
    second = op.start_forward(x2)
    third = other.start_forward(x3)
    handles = [first, second, third] if order == "in-order" else [third, second, first]
    results = {id(h): h.wait() for h in handles}
    numpy.testing.assert_array_equal(results[id(first)], chunk(g1, 0, p, r))
    numpy.testing.assert_array_equal(results[id(second)], chunk(g2.real, 0, p, r))
    numpy.testing.assert_array_equal(results[id(third)], chunk(g1, 1, p, r))
    assert first.wait() is results[id(first)]  # waiting again returns the result at once
    back = op.start_adjoint(results[id(first)], out=numpy.empty_like(x1))
    assert back.test() in (True, False)
    numpy.testing.assert_array_equal(back.wait(), x1)
    numpy.testing.assert_array_equal(op.forward(x1), results[id(first)])  # blocking calls still fine


@pytest.mark.parametrize("which", COMMS)
def test_transposes_run_one_after_another_share_one_buffer_set(grid, which, rng):
    """Real and complex, packed sends and packed receives: one set of buffers serves them all, results exact."""
    comm = _comm(grid, which)
    p, r = comm.Get_size(), comm.Get_rank()
    pool = BufferPool()
    there = Transpose(comm, axes=(0, 2), extents=(7, 13), pool=pool)    # receives packed
    back = Transpose(comm, axes=(2, 0), extents=(13, 7), pool=pool)     # sends packed
    for dtype in (numpy.float32, numpy.complex128, numpy.float64):
        g = rng.standard_normal((7, 3, 13)).astype(dtype)
        if dtype == numpy.complex128:
            g = g + 1j * rng.standard_normal(g.shape)
        y = there.forward(chunk(g, 2, p, r))
        numpy.testing.assert_array_equal(y, chunk(g, 0, p, r))
        numpy.testing.assert_array_equal(back.forward(y), chunk(g, 2, p, r))
    assert len(pool._free) == (1 if p > 1 else 0)   # (one rank: a local copy, no buffers)


def test_an_exchange_dropped_without_wait_is_an_error_at_the_next_call(grid, rng):
    comm = grid.azimuth
    p, r = comm.Get_size(), comm.Get_rank()
    g = rng.standard_normal((4, 6))
    op = Transpose(comm, axes=(0, 1), extents=(4, 6))
    handle = op.start_forward(chunk(g, 1, p, r))
    if p == 1:
        assert handle.done  # one rank: a local copy, nothing in flight
        return
    handle._request.Wait()  # the collective itself completes on every rank (MPI needs that) ...
    del handle              # ... but the exchange is dropped without wait()
    with raises(RuntimeError, match=rf"Transpose.forward: {every_rank(p)}: an exchange started with "
                                           r"start_forward on this operator was dropped without wait\(\)"):
        op.forward(chunk(g, 1, p, r))
