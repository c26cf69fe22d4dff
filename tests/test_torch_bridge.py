"""Operators as PyTorch autograd functions: gradcheck on whole-field functions, torch-harmonics' gradients.

``torch.autograd.gradcheck`` compares a function's numerical Jacobian with
its backward on one process. A distributed operator maps each rank's piece
to each rank's piece, so the tests check it inside a function that every
rank evaluates alike: whole replicated inputs are cut into this rank's piece
(``ScatterTo``, whose adjoint gathers), the operator runs, and a fixed random
matrix per rank maps its output to a few numbers that ``ReduceFrom`` sums over
the grid. Every step goes through :func:`mpisphere.torch.apply`, so the
backward of each is its adjoint; the perturbations gradcheck makes are the
same on every rank, and so are its collective calls.

CI (``.ci/torch``) installs the ``torch`` extra and torch-harmonics and sets
``MPISPHERE_REQUIRE_TORCH=1``, which turns a missing PyTorch or torch-harmonics
into a failure instead of a skip.
"""

import os

import numpy
import pytest
from mpi4py import MPI

from mpisphere import (CopyTo, DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedRealVectorSHT, GatherFromCopyTo, HaloExchange, HaloReduce, ProcessGrid, ReduceFrom,
                       ReduceScatter, ScatterTo, Transpose)

from helpers import raises, rank_rng

REQUIRED = os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1"
if REQUIRED:
    import torch
else:
    torch = pytest.importorskip("torch")

import mpisphere.torch as mt  # noqa: E402 (after the check above)


def _scatter_tiles(grid, nlat, nlon):
    return [ScatterTo(grid.polar, -2, nlat), ScatterTo(grid.azimuth, -1, nlon)]


def whole_field_function(grid, op, scatter, outputs=3, seed=5):
    """``x_whole -> sum over ranks of W_r vec(op(piece of x_whole))``: whole and replicated on both sides."""
    weights = {}

    def function(x_whole):
        x = x_whole
        for cut in scatter:
            x = mt.apply(cut, x)
        y = mt.apply(op, x)
        v = (torch.view_as_real(y) if y.is_complex() else y).reshape(-1)
        if "w" not in weights:
            rng = rank_rng(grid.cart, seed)
            weights["w"] = torch.from_numpy(rng.standard_normal((outputs, v.numel())))
        return mt.apply(ReduceFrom(grid.cart), weights["w"] @ v)

    return function


def _whole(shape, complex_=False, seed=3):
    """The same random whole input on every rank (float64 or complex128), requiring gradients."""
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
    return torch.from_numpy(x).requires_grad_(True)


def _coefficients(shape, seed=4):
    """Whole coefficient arrays (any complex values: the inverse transforms are real-linear in them)."""
    return _whole(shape, complex_=True, seed=seed)


def _gradcheck(function, x):
    assert torch.autograd.gradcheck(function, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.mpi
def test_gradcheck_of_the_scalar_transforms_on_real_and_complex_sides(grid):
    nlat, nlon = 7, 10
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    coefficient_cut = [ScatterTo(grid.polar, -2, isht.lmax), ScatterTo(grid.azimuth, -1, isht.mmax)]
    first = coefficient_cut[0].offsets[grid.polar.rank]  # the cut is the transform's own block of degrees
    assert list(isht.local_degrees) == list(range(first, first + len(isht.local_degrees)))
    _gradcheck(whole_field_function(grid, sht, _scatter_tiles(grid, nlat, nlon)), _whole((nlat, nlon)))
    _gradcheck(whole_field_function(grid, isht, coefficient_cut), _coefficients((isht.lmax, isht.mmax)))


@pytest.mark.mpi
def test_gradcheck_of_the_vector_transforms(grid):
    nlat, nlon = 6, 10
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature="equiangular")
    ivsht = DistributedInverseRealVectorSHT(grid, nlat, nlon, quadrature="equiangular")
    _gradcheck(whole_field_function(grid, vsht, _scatter_tiles(grid, nlat, nlon)), _whole((2, nlat, nlon)))
    cut = [ScatterTo(grid.polar, -2, ivsht.lmax), ScatterTo(grid.azimuth, -1, ivsht.mmax)]
    _gradcheck(whole_field_function(grid, ivsht, cut), _coefficients((2, ivsht.lmax, ivsht.mmax)))


@pytest.mark.mpi
def test_gradcheck_of_a_halo_a_transpose_and_a_composition(grid):
    nlat, nlon = 7, 10
    halo = HaloExchange(grid, 1, 1, extents=(nlat, nlon), poles="across", quadrature="legendre-gauss")
    _gradcheck(whole_field_function(grid, halo, _scatter_tiles(grid, nlat, nlon)), _whole((nlat, nlon)))
    # a transpose of the polar axis: latitudes split -> longitudes split, within each polar column
    lon_piece = grid.lon_sizes(nlon)[grid.azimuth.rank]
    transpose = Transpose(grid.polar, (-1, -2), (lon_piece, nlat))
    cut = [ScatterTo(grid.polar, -2, nlat), ScatterTo(grid.azimuth, -1, nlon)]
    _gradcheck(whole_field_function(grid, transpose, cut), _whole((2, nlat, nlon), seed=8))
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="equiangular")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature="equiangular")
    composition = sht @ (isht @ sht) + 0.5 * sht
    _gradcheck(whole_field_function(grid, composition, _scatter_tiles(grid, nlat, nlon)), _whole((nlat, nlon)))


@pytest.mark.mpi
def test_gradcheck_of_the_other_primitives(grid):
    """``ReduceScatter``, ``GatherFromCopyTo``, ``CopyTo`` and ``HaloReduce``, each inside a whole-field function."""
    n, size = 7, grid.size
    cart = grid.cart
    # every rank's own partial array of the whole extent, summed and split
    reduce_scatter = [ScatterTo(cart, -2, size)], ReduceScatter(cart, -1, n)
    _gradcheck(whole_field_function(grid, reduce_scatter[1], reduce_scatter[0]), _whole((2, size, n)))
    # a chunk per rank, gathered into every rank's private copy
    _gradcheck(whole_field_function(grid, GatherFromCopyTo(cart, -1, n), [ScatterTo(cart, -1, n)]), _whole((3, n)))
    # a replicated parameter into per-rank copies (its adjoint sums them)
    _gradcheck(whole_field_function(grid, CopyTo(cart), []), _whole((4,)))
    # padded tiles weighted per rank, then the halo's adjoint sums the ghost cells into their owners
    nlat, nlon = 7, 10
    exchange = HaloExchange(grid, 1, 1, extents=(nlat, nlon), poles="across", quadrature="equiangular")
    reduce = HaloReduce(grid, 1, 1, extents=(nlat, nlon), poles="across", quadrature="equiangular")
    padded = exchange.range_shape(())
    mask = torch.from_numpy(rank_rng(grid.cart, 12).standard_normal(padded))

    def halo_then_reduce(x_whole):
        x = x_whole
        for cut in _scatter_tiles(grid, nlat, nlon):
            x = mt.apply(cut, x)
        return mt.apply(exchange, x) * mask

    function = whole_field_function(grid, reduce, [])
    _gradcheck(lambda x: function(halo_then_reduce(x)), _whole((nlat, nlon)))


@pytest.mark.mpi
def test_gradcheck_of_the_tangent_linear_model_in_fast_mode(grid):
    """``ShallowWaterSolver.linearize`` as a torch function (gradcheck's fast mode: a few random projections)."""
    from mpisphere.examples import ShallowWaterSolver
    swe = ShallowWaterSolver(grid, 12, 24, dt=150.0, quadrature="legendre-gauss")
    model = swe.linearize(swe.random_initial_condition(), 2)
    cut = [ScatterTo(grid.polar, -2, swe.lmax), ScatterTo(grid.azimuth, -1, swe.mmax)]
    torch.manual_seed(0)  # gradcheck's projections: the same on every rank
    x = _coefficients((3, swe.lmax, swe.mmax))
    assert torch.autograd.gradcheck(whole_field_function(grid, model, cut), (x,), eps=1e-6, atol=1e-8,
                                    rtol=1e-6, fast_mode=True)


@pytest.mark.mpi
def test_second_derivatives_and_the_adjoint_module(grid):
    nlat, nlon = 6, 8
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    function = whole_field_function(grid, sht, _scatter_tiles(grid, nlat, nlon))
    assert torch.autograd.gradgradcheck(function, (_whole((nlat, nlon)),), eps=1e-6, atol=1e-8, rtol=1e-6)
    module = mt.TorchOperator(sht)
    x = torch.from_numpy(rank_rng(grid.cart, 2).standard_normal(sht.tile_shape))
    c = module(x)
    numpy.testing.assert_array_equal(c.numpy(), sht.forward(x.numpy()))
    numpy.testing.assert_array_equal(module.H(c).numpy(), sht.adjoint(c.numpy()))
    assert "DistributedRealSHT.H" in repr(module.H)


@pytest.mark.mpi
def test_tensors_reach_the_operators_without_copies(grid):
    x = torch.zeros(3, 4, dtype=torch.float64)
    a = mt.as_array(x)
    assert a.ctypes.data == x.data_ptr() and a.shape == (3, 4)
    back = mt.as_tensor(a)
    assert back.data_ptr() == x.data_ptr()
    z = torch.zeros(2, 2, dtype=torch.complex128)
    assert mt.as_array(z).ctypes.data == z.data_ptr()
    # a lazily conjugated view is resolved (a copy) so the operator sees the conjugated values
    w = torch.tensor([1 + 2j]).conj()
    assert mt.as_array(w)[0] == 1 - 2j
    with raises(TypeError, match="expected a torch.Tensor"):
        mt.apply(DistributedRealSHT(grid, 6, 8), numpy.zeros((1, 1)))
    with raises(TypeError, match="tensors on meta are not supported"):
        mt.as_array(torch.empty(2, device="meta"))


@pytest.mark.mpi
def test_a_shape_mistake_on_one_rank_raises_on_every_rank(grid):
    sht = DistributedRealSHT(grid, 8, 12)
    shape = sht.tile_shape if grid.rank != grid.size - 1 else (sht.tile_shape[0] + 1, sht.tile_shape[1])
    with raises(ValueError):
        mt.apply(sht, torch.zeros(shape, dtype=torch.float64))


@pytest.mark.mpi
def test_a_non_tensor_on_the_last_rank_raises_on_every_rank(grid):
    """A list where a tensor belongs, on the last rank only: every rank raises a TypeError naming it (no rank waits)."""
    sht = DistributedRealSHT(grid, 12, 24)
    x = torch.zeros(sht.domain_shape((2,)), dtype=torch.float64)
    given = x.tolist() if grid.rank == grid.size - 1 else x
    with raises(TypeError, match=rf"^DistributedRealSHT.forward: rank {grid.size - 1} of {grid.size}: expected "
                                        r"a torch.Tensor, got list$"):
        mt.apply(sht, given)
    assert mt.apply(sht, x).shape == sht.range_shape((2,))  # the ranks are in step afterwards


@pytest.mark.mpi
def test_gradients_of_a_loss_equal_torch_harmonics_serial_autograd(grid):
    """A loss of the coefficients and of the synthesised field, on the grid and in torch-harmonics on one rank."""
    if REQUIRED:
        import torch_harmonics as th
    else:
        th = pytest.importorskip("torch_harmonics")
    nlat, nlon = 12, 24
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="equiangular")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature="equiangular")
    rng = numpy.random.default_rng(9)
    whole = rng.standard_normal((2, nlat, nlon))
    weights = rng.standard_normal((sht.lmax, sht.mmax))
    lat, lon = grid.local_slices(nlat, nlon)
    tile = torch.from_numpy(whole[:, lat, lon].copy()).requires_grad_(True)
    local_weights = torch.from_numpy(weights[sht.local_degrees][:, sht.local_orders].copy())
    coeffs = mt.apply(sht, tile)
    field = mt.apply(isht, coeffs * local_weights)
    local_loss = (coeffs.abs() ** 2 * local_weights).sum() + (field ** 3).sum()
    local_loss.backward()
    loss = grid.cart.allreduce(float(local_loss.detach()), op=MPI.SUM)
    gradient = grid.gather(tile.grad.numpy())
    reference = None
    if grid.rank == 0:
        x = torch.from_numpy(whole).requires_grad_(True)
        forward = th.RealSHT(nlat, nlon, lmax=sht.lmax, mmax=sht.mmax, grid="equiangular").double()
        inverse = th.InverseRealSHT(nlat, nlon, lmax=sht.lmax, mmax=sht.mmax, grid="equiangular").double()
        c = forward(x)
        w = torch.from_numpy(weights)
        serial_loss = (c.abs() ** 2 * w).sum() + (inverse(c * w) ** 3).sum()
        serial_loss.backward()
        reference = (float(serial_loss.detach()), x.grad.numpy())
    reference = grid.cart.bcast(reference, root=0)
    scale = abs(reference[1]).max()
    assert abs(loss - reference[0]) <= 1e-10 * abs(reference[0])
    if grid.rank == 0:
        assert abs(gradient - reference[1]).max() <= 1e-10 * scale


@pytest.mark.mpi
def test_the_shallow_water_model_matches_torch_harmonics_in_float64_and_to_float32_in_float32(comm):
    """What "the same model as torch-harmonics' example" means, measured: Galewsky's jet, 50 steps at 64 x 128.

    With torch in float64 the states agree to rounding (measured: relative 1.8e-15 geopotential, 1.6e-14
    vorticity, 1.9e-11 divergence, whose values are small); with torch's default float32 (torch-harmonics
    builds its constants and the state in float32) to float32's precision (3.9e-8, 1.2e-6 and 6.6e-4).
    Both models on one process: it runs in the one-rank launch.
    """
    if comm.Get_size() > 1:
        pytest.skip("a serial comparison: it runs in the one-rank launch")
    if REQUIRED:
        from torch_harmonics.examples import ShallowWaterSolver as Reference
    else:
        Reference = pytest.importorskip("torch_harmonics.examples").ShallowWaterSolver
    from mpisphere.examples import ShallowWaterSolver
    nlat, nlon, dt, steps = 64, 128, 300.0, 50
    grid = ProcessGrid(comm)
    ours = ShallowWaterSolver(grid, nlat, nlon, dt, quadrature="equiangular")
    start = ours.galewsky_initial_condition()
    state = ours.timestep(start, steps)
    default = torch.get_default_dtype()
    try:
        for dtype, bounds in ((torch.float64, (1e-13, 1e-12, 1e-9)), (torch.float32, (1e-6, 1e-5, 1e-2))):
            torch.set_default_dtype(dtype)
            reference = Reference(nlat, nlon, dt, lmax=ours.lmax, mmax=ours.mmax, grid="equiangular")
            complex_dtype = numpy.complex128 if dtype == torch.float64 else numpy.complex64
            with torch.no_grad():
                theirs = reference.timestep(torch.from_numpy(start.astype(complex_dtype)), steps).numpy()
            for field, bound in enumerate(bounds):
                error = abs(theirs[field] - state[field]).max() / abs(state[field]).max()
                assert error <= bound, (dtype, field, error)
    finally:
        torch.set_default_dtype(default)
        grid.free()


def test_the_module_imports_torch_only_when_asked():
    """``import mpisphere`` does not import torch (a fresh interpreter)."""
    import subprocess
    import sys
    code = "import sys, mpisphere; mpisphere.DistributedRealSHT; print('torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPIR_", "OMPI_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.mpi
def test_a_one_rank_grid_of_comm_self_inside_a_launch():
    with ProcessGrid(MPI.COMM_SELF) as grid:
        sht = DistributedRealSHT(grid, 6, 8)
        x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
        (mt.apply(sht, x).abs() ** 2).sum().backward()
        assert x.grad.shape == (6, 8)


@pytest.mark.mpi(min_size=2)
def test_an_input_that_requires_grad_on_some_ranks_only_raises_on_every_rank_at_the_forward(grid):
    """Otherwise the backward (the adjoint, a collective) would run on the last rank only and wait there."""
    sht = DistributedRealSHT(grid, 8, 12)
    last = grid.size - 1
    x = torch.zeros(sht.tile_shape, dtype=torch.float64, requires_grad=grid.rank == last)
    first = "rank 0" if last == 1 else f"ranks 0-{last - 1}" if last > 2 else "ranks 0, 1"
    with raises(ValueError, match=rf"^DistributedRealSHT.forward: the {grid.size} ranks disagree on what they are "
                                  rf"about to do: call: {first} forward, rank {last} forward \[recorded by autograd: "
                                  r"requires grad\]\n  fix: make requires_grad \(and torch.no_grad\) the same on every "
                                  r"rank"):
        mt.apply(sht, x)
    # the same inside torch.no_grad() on the last rank only
    x = torch.zeros(sht.tile_shape, dtype=torch.float64, requires_grad=True)
    with raises(ValueError, match=r"recorded by autograd"):
        if grid.rank == last:
            with torch.no_grad():
                mt.apply(sht, x)
        else:
            mt.apply(sht, x)
    # alike on every rank: runs, and so does the backward
    (mt.apply(sht, x).abs() ** 2).sum().backward()
    assert x.grad.shape == sht.tile_shape
