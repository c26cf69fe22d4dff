"""The three Legendre strategies: each against the serial reference, against each other, dot tests, the choice."""

import numpy
import pytest
from mpi4py import MPI

import mpisphere
from mpisphere import (DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedRealVectorSHT, dottest)
from mpisphere.sht import costs
from mpisphere.sht.orders import order_assignment

from helpers import raises, random_array, rank_rng, tile
from test_sht import QUADRATURES, reference_forward, reference_inverse

pytestmark = pytest.mark.mpi

STRATEGIES = ["transpose", "reduce-scatter", "table-free"]
TOLERANCE = {numpy.dtype(numpy.float64): 1e-12, numpy.dtype(numpy.float32): 2e-5}


def global_max(comm, a):
    return comm.allreduce(float(abs(a).max()) if a.size else 0.0, op=MPI.MAX)


def assert_close(grid, got, want, dtype, what):
    """``|got - want|`` within the dtype's rounding times the largest entry anywhere (a bound that cannot cancel)."""
    bound = TOLERANCE[numpy.dtype(dtype)] * global_max(grid.cart, want)
    error = float(abs(got - want).max()) if got.size else 0.0
    assert error <= bound, f"{what}: error {error:.2e} > {bound:.2e}"


def whole_coefficients(sht, rng, batch):
    """Random coefficients of a real field on the whole ``(lmax, mmax)``: triangular, real at m = 0."""
    c = rng.standard_normal((batch, sht.lmax, sht.mmax)) + 1j * rng.standard_normal((batch, sht.lmax, sht.mmax))
    c *= numpy.tril(numpy.ones((sht.lmax, sht.mmax)))
    c[..., 0] = c[..., 0].real
    return c


def my_block(sht, whole):
    return whole[..., sht.local_degrees, :][..., sht.local_orders]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("orders", ["contiguous", "balanced"])
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=["float64", "float32"])
def test_scalar_strategies_match_the_serial_reference(grid, rng, strategy, quadrature, orders, dtype):
    nlat, nlon = 19, 36  # uneven over 2, 3, 4 and 6 polar ranks
    options = dict(quadrature=quadrature, orders=orders, dtype=dtype, legendre=strategy)
    sht = DistributedRealSHT(grid, nlat, nlon, **options)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, **options)
    assert sht.legendre == isht.legendre == strategy
    field = rng.standard_normal((2, nlat, nlon))
    c = sht.forward(tile(field, grid).astype(dtype))
    expected = reference_forward(field, sht.lmax, sht.mmax, quadrature)
    assert_close(grid, c, my_block(sht, expected), dtype, f"forward, {strategy}")
    coeffs = whole_coefficients(sht, rng, 2)
    x = isht.forward(my_block(isht, coeffs).astype(isht.cdtype))
    expected = reference_inverse(coeffs, nlat, nlon, quadrature)
    assert_close(grid, x, tile(expected, grid), dtype, f"inverse, {strategy}")


@pytest.mark.parametrize("norm, csphase", [("ortho", True), ("schmidt", False), ("four-pi", True)])
def test_norms_and_phases_of_the_table_free_path(grid, rng, norm, csphase):
    """ducc0's functions are the orthonormal ones with the Condon-Shortley phase: the others come from factors."""
    nlat, nlon = 16, 30
    field = rng.standard_normal((3, nlat, nlon))
    options = dict(quadrature="legendre-gauss", norm=norm, csphase=csphase, legendre="table-free")
    sht = DistributedRealSHT(grid, nlat, nlon, **options)
    expected = reference_forward(field, sht.lmax, sht.mmax, "legendre-gauss", norm, csphase)
    assert_close(grid, sht.forward(tile(field, grid)), my_block(sht, expected), numpy.float64, "forward")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, **options)
    coeffs = whole_coefficients(isht, rng, 3)
    expected = reference_inverse(coeffs, nlat, nlon, "legendre-gauss", norm, csphase)
    assert_close(grid, isht.forward(my_block(isht, coeffs)), tile(expected, grid), numpy.float64, "inverse")


@pytest.mark.parametrize("strategy", ["reduce-scatter", "table-free"])
@pytest.mark.parametrize("cls", [DistributedRealVectorSHT, DistributedInverseRealVectorSHT])
@pytest.mark.parametrize("orders", ["contiguous", "balanced"])
@pytest.mark.parametrize("quadrature, csphase", [("equiangular", True), ("lobatto", False),
                                                 ("legendre-gauss", True)])
@pytest.mark.parametrize("real", [numpy.float64, numpy.float32], ids=["float64", "float32"])
def test_vector_strategies_equal_the_transpose_strategy(grid, strategy, cls, orders, quadrature, csphase, real):
    """The degree coupling is linear: applied to each rank's partial sums before the Reduce_scatter, it is exact.

    The table-free vector functions are ducc0's spin-0 ones over ``sin(theta)``
    with the limits at the poles (equiangular and Lobatto grids hold them).
    """
    options = dict(quadrature=quadrature, orders=orders, csphase=csphase, dtype=real)
    reference = cls(grid, 19, 36, legendre="transpose", **options)
    op = cls(grid, 19, 36, legendre=strategy, **options)
    dtype = reference.cdtype if cls._synthesis else reference.dtype
    x = random_array(rank_rng(grid.cart, 5), reference.domain_shape((3,)), dtype)
    assert_close(grid, op.forward(x), reference.forward(x), real, "forward")
    y = random_array(rank_rng(grid.cart, 6), reference.range_shape((3,)), reference.dtype if cls._synthesis
                     else reference.cdtype)
    assert_close(grid, op.adjoint(y), reference.adjoint(y), real, "adjoint")


SCALAR = [DistributedRealSHT, DistributedInverseRealSHT]
VECTOR = [DistributedRealVectorSHT, DistributedInverseRealVectorSHT]


@pytest.mark.parametrize("strategy, cls", [(s, c) for s in STRATEGIES for c in SCALAR + VECTOR],
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
@pytest.mark.parametrize("quadrature", ["equiangular", "lobatto"])
def test_dottest_of_every_strategy(grid, strategy, cls, quadrature):
    op = cls(grid, 17, 33, quadrature=quadrature, legendre=strategy)
    assert dottest(op, lead=(2,), dtype=op.cdtype if cls._synthesis else op.dtype, seed=3) <= 1e-13


def test_reduce_scatter_tables_shrink_with_every_polar_rank(grid):
    nlat, nlon = 41, 80
    for strategy in ("transpose", "reduce-scatter"):
        sht = DistributedRealSHT(grid, nlat, nlon, legendre=strategy)
        largest = grid.cart.allreduce(sht.table_bytes(), op=MPI.MAX)
        counted = costs.legendre_table_bytes(strategy, nlat, sht.lmax, sht.mmax, grid.npolar, grid.nazimuth)
        assert largest == counted, strategy
    # the same orders' functions at every latitude, unsplit (on one polar rank the tables are parity-split: half)
    whole = max(8 * costs.row_table_entries(sht.lmax, mine, nlat)
                for mine in order_assignment(sht.mmax, sht.lmax, grid.nazimuth))
    if grid.npolar > 1:
        assert counted <= whole / grid.npolar + whole / nlat * grid.npolar  # the own latitudes of the tallest tile
    else:
        assert counted == costs.legendre_table_bytes("transpose", nlat, sht.lmax, sht.mmax, 1, grid.nazimuth)
    assert DistributedRealSHT(grid, nlat, nlon, legendre="table-free").table_bytes() == 0


def test_auto_keeps_the_transpose_where_its_tables_fit_and_shrinks_them_where_not(grid):
    assert DistributedRealSHT(grid, 41, 80).legendre == "transpose"  # the default budget: half a core's memory
    tight = DistributedRealSHT(grid, 41, 80, max_table_bytes=0)
    assert tight.legendre == "table-free" and "exceed" in tight.legendre_reason
    vector = DistributedRealVectorSHT(grid, 41, 80, max_table_bytes=0)
    assert vector.legendre == "table-free"
    lmax, mmax = vector.lmax, vector.mmax
    between = costs.legendre_table_bytes("reduce-scatter", 41, lmax, mmax, grid.npolar, grid.nazimuth, vector=True)
    chosen = DistributedRealVectorSHT(grid, 41, 80, max_table_bytes=between).legendre
    transpose = costs.legendre_table_bytes("transpose", 41, lmax, mmax, grid.npolar, grid.nazimuth, vector=True)
    assert chosen == ("transpose" if transpose <= between else "reduce-scatter")


def test_bad_strategies_raise(grid):
    with raises(ValueError, match="legendre must be one of 'auto', 'transpose', 'reduce-scatter', "
                                         "'table-free', got 'fast'"):
        DistributedRealSHT(grid, 17, 32, legendre="fast")
    with raises(ValueError, match="max_table_bytes is the budget legendre='auto' chooses by"):
        DistributedRealSHT(grid, 17, 32, legendre="transpose", max_table_bytes=10)
    with raises(ValueError, match="max_table_bytes must be non-negative"):
        DistributedRealSHT(grid, 17, 32, max_table_bytes=-1)


@pytest.mark.mpi(min_size=2)
def test_ranks_that_resolve_auto_differently_raise_on_every_rank(grid):
    """The resolved strategy is part of what a call agrees on: unlike nodes raise instead of hanging."""
    budget = 0 if grid.rank == 0 else 1 << 40
    sht = DistributedRealSHT(grid, 17, 32, max_table_bytes=budget)
    assert sht.legendre == ("table-free" if grid.rank == 0 else "transpose")
    with raises(ValueError, match="legendre resolved='table-free'"):
        sht.forward(numpy.zeros(sht.domain_shape((2,))))


def test_ranks_that_differ_in_overlap_raise_on_every_rank(grid):
    """``overlap`` decides the order of the exchanges: it is part of what a call agrees on."""
    if grid.size == 1:
        pytest.skip("one rank has no other to differ from")
    sht = DistributedRealSHT(grid, 17, 32, overlap=grid.rank == 0)
    with raises(ValueError, match="overlap=(True|False)"):
        sht.forward(numpy.zeros(sht.domain_shape((2 * grid.size,))))


def test_strategies_give_the_same_shallow_water_step(grid):
    """A model built on reduce-scatter transforms steps like the default one (to rounding)."""
    from mpisphere.examples import ShallowWaterSolver
    swe = ShallowWaterSolver(grid, 16, 32, dt=300.0, quadrature="legendre-gauss")
    u = swe.timestep(swe.galewsky_initial_condition(), 2)
    for op in (swe.sht, swe.isht):
        assert op.legendre == "transpose"
    other = DistributedRealSHT(grid, 16, 32, quadrature="legendre-gauss", csphase=False, legendre="reduce-scatter")
    fields = swe.spec2grid(u)
    assert_close(grid, other.forward(fields), swe.grid2spec(fields), numpy.float64, "grid2spec")
    assert mpisphere.DistributedRealSHT is DistributedRealSHT


def test_free_drops_the_buffers_and_the_next_call_rebuilds_them(grid):
    sht = DistributedRealSHT(grid, 17, 32, legendre="table-free")
    x = random_array(rank_rng(grid.cart, 8), sht.domain_shape((2,)), numpy.float64)
    before = sht.forward(x)
    assert grid.scratch.nbytes() > 0
    sht.free()
    assert grid.scratch.nbytes() == 0
    numpy.testing.assert_array_equal(sht.forward(x), before)


@pytest.mark.parametrize("strategy", ["transpose", "reduce-scatter"])
@pytest.mark.parametrize("cls", SCALAR + VECTOR, ids=lambda c: c.__name__)
def test_overlapped_chunks_give_the_same_result_and_keep_the_adjoint(grid, strategy, cls):
    """overlap=True runs two chunks in turns with their transposes in flight: the same map, to rounding."""
    options = dict(quadrature="legendre-gauss", legendre=strategy)
    plain = cls(grid, 18, 32, **options)
    overlapped = cls(grid, 18, 32, overlap=True, **options)
    batch = 2 * max(grid.npolar, grid.nazimuth) + 1  # two uneven chunks
    dtype = plain.cdtype if cls._synthesis else plain.dtype
    x = random_array(rank_rng(grid.cart, 9), plain.domain_shape((batch,)), dtype)
    assert_close(grid, overlapped.forward(x), plain.forward(x), numpy.float64, "forward")
    y = random_array(rank_rng(grid.cart, 10), plain.range_shape((batch,)), plain.dtype if cls._synthesis
                     else plain.cdtype)
    assert_close(grid, overlapped.adjoint(y), plain.adjoint(y), numpy.float64, "adjoint")
    assert dottest(overlapped, lead=(batch,), dtype=dtype, seed=4) <= 1e-13


def test_overlap_with_a_batch_too_small_to_split_runs_as_one_chunk(grid):
    sht = DistributedRealSHT(grid, 18, 32, overlap=True)
    x = random_array(rank_rng(grid.cart, 11), sht.domain_shape((1,)), numpy.float64)
    assert_close(grid, sht.forward(x), DistributedRealSHT(grid, 18, 32).forward(x), numpy.float64, "forward")


def test_a_device_array_is_refused_by_the_table_free_strategy_before_the_ranks_agree(grid):
    """The refusal is part of the call's checks (every rank raises the TypeError), not of its run.

    A CuPy array is described by its spec; the check needs no GPU.
    """
    from mpisphere.agreement import InputError, Spec
    from mpisphere.operators import FORWARD
    for options, hint in ((dict(legendre="table-free"), "legendre='transpose' or 'reduce-scatter'"),
                          (dict(max_table_bytes=0), "max_table_bytes")):
        sht = DistributedRealSHT(grid, 17, 32, **options)
        assert sht.legendre == "table-free"
        with raises(InputError) as found:
            sht._output(FORWARD, Spec(sht.domain_shape((2,)), numpy.dtype(numpy.float64), True))
        assert found.value.kind is TypeError and "runs on host arrays only" in found.value.text
        assert hint in found.value.text
    held = DistributedRealSHT(grid, 17, 32, legendre="transpose")
    spec = Spec(held.domain_shape((2,)), numpy.dtype(numpy.float64), True)
    assert held._output(FORWARD, spec)[0].device


def test_auto_runs_each_batch_with_the_strategy_the_cost_model_gives(grid, monkeypatch):
    """Few fields read a whole table for little work: auto runs them table-free; many fields with the tables."""
    from mpisphere.sht.strategies import MachineModel
    from mpisphere.sht.strategies.machine import MODEL_VARIABLE
    monkeypatch.delenv(MODEL_VARIABLE, raising=False)  # the defaults, whatever model this machine was given
    sht = DistributedRealSHT(grid, 61, 120, 61, 61)
    assert sht.legendre == "transpose" and sht.machine == MachineModel()
    # a machine whose tables stream slowly: one field runs table-free, many with the tables
    slow = MachineModel(scalar_analysis_table_bandwidth=1e6, cache_bytes=0)
    sht.machine = slow
    assert sht.legendre_for(1)[0] == "table-free"
    many = sht.legendre_for(10 ** 6)
    assert many[0] == "transpose" and "modelled Legendre step" in many[1]
    # every batch gives the same numbers to rounding, whichever strategy runs it
    x = random_array(rank_rng(grid.cart, 3), sht.domain_shape((1,)), numpy.float64)
    reference = DistributedRealSHT(grid, 61, 120, 61, 61, legendre="transpose").forward(x)
    assert_close(grid, sht.forward(x), reference, numpy.float64, "one field, table-free")
    assert sht.legendre_for(1, device=True)[0] == "transpose"  # ducc0 runs on the host only
    assert DistributedRealSHT(grid, 61, 120, legendre="transpose").legendre_for(1) == ("transpose", "chosen")


def test_a_machine_model_file_is_read_and_checked(grid, tmp_path, monkeypatch):
    from mpisphere.sht.strategies import MachineModel
    from mpisphere.sht.strategies.machine import MODEL_VARIABLE
    path = tmp_path / f"machine-{grid.rank}.json"
    model = MachineModel(scalar_analysis_on_the_fly_rate=1.0)
    path.write_text(model.as_json())
    monkeypatch.setenv(MODEL_VARIABLE, str(path))
    loaded = DistributedRealSHT(grid, 17, 32).machine
    assert loaded.scalar_analysis_on_the_fly_rate == 1.0 and loaded.source == str(path)
    path.write_text("{}")
    with raises(ValueError, match="not a machine model written by 'python -m mpisphere calibrate"):
        DistributedRealSHT(grid, 17, 32)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("where", ["last", "first"])
def test_a_machine_model_missing_on_one_rank_raises_on_every_rank_at_construction(grid, tmp_path, monkeypatch, where):
    """Reading the model is part of building the transform: one finding on every rank (it hung the others in the
    first forward)."""
    from mpisphere.sht.strategies.machine import MODEL_VARIABLE
    odd = grid.size - 1 if where == "last" else 0
    if grid.rank == odd:
        monkeypatch.setenv(MODEL_VARIABLE, str(tmp_path / "no-such-model.json"))
    else:
        monkeypatch.delenv(MODEL_VARIABLE, raising=False)
    with raises(ValueError, match=f"rank {odd}.*not a machine model written by 'python -m mpisphere calibrate"):
        DistributedRealSHT(grid, 17, 32)
    DistributedRealSHT(grid, 17, 32, legendre="transpose")   # a named strategy reads no model
