"""torch-harmonics' distributed primitives and module attributes in mpisphere.torch_harmonics, on tiles.

Each primitive's forward is compared with what it must give on this rank
(computed here from the whole field, which every rank draws alike), and its
backward likewise: the gradient of ``sum(out * g)`` for a cotangent ``g``
that differs between ranks. CI (``.ci/torch``) sets
``MPISPHERE_REQUIRE_TORCH=1``: a missing PyTorch then fails these tests.
"""

import os

import numpy
import pytest

from helpers import raises

if os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import mpisphere.torch_harmonics as thd  # noqa: E402 (after the check above)
from mpisphere import split_sizes  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture
def initialised(grid):
    thd.init(grid)
    yield grid
    thd.finalize()


def chunk(whole, dim, comm):
    """This rank's balanced chunk of ``whole`` along ``dim`` over ``comm``."""
    sizes = split_sizes(whole.shape[dim], comm.size)
    start = sum(sizes[:comm.rank])
    return whole.narrow(dim, start, sizes[comm.rank])


def backward_of(out, g, x):
    (out * g).sum().backward()
    return x.grad


def test_the_names_of_torch_harmonics_distributed_are_here():
    names = ["polar_group", "azimuth_group", "is_distributed_polar", "is_distributed_azimuth", "get_group_neighbors",
             "split_tensor_along_dim", "flatten_and_pad_leading_dims", "unpad_and_unflatten_leading_dims",
             "compute_polar_halo_radius", "copy_to_polar_region", "copy_to_azimuth_region",
             "reduce_from_polar_region", "reduce_from_azimuth_region", "scatter_to_polar_region",
             "gather_from_polar_region", "reduce_from_scatter_to_polar_region",
             "reduce_from_scatter_to_azimuth_region", "gather_from_copy_to_polar_region",
             "distributed_transpose_polar", "distributed_transpose_azimuth", "polar_halo_exchange",
             "polar_halo_reduce", "config", "init", "finalize", "is_initialized", "compute_split_shapes",
             "polar_group_size", "azimuth_group_size", "polar_group_rank", "azimuth_group_rank"]
    assert not [n for n in names if not hasattr(thd, n)]


def test_split_and_the_leading_axes():
    parts = thd.split_tensor_along_dim(torch.arange(10).unsqueeze(0), 1, 3)
    assert [p.shape[1] for p in parts] == [4, 3, 3]
    with pytest.raises(ValueError, match="cannot split dimension 1 of size 2 into 3 chunks"):
        thd.split_tensor_along_dim(torch.zeros(1, 2), 1, 3)
    x = torch.randn(2, 3, 5, 6)
    flat, lead, size = thd.flatten_and_pad_leading_dims(x, 8)
    assert flat.shape == (8, 5, 6) and size == 6 and tuple(lead) == (2, 3)
    assert torch.equal(flat[6:], torch.zeros(2, 5, 6))
    assert torch.equal(thd.unpad_and_unflatten_leading_dims(flat, lead, size), x)


def test_the_groups_and_their_neighbours(initialised):
    grid = initialised
    assert thd.polar_group() is grid.polar and thd.azimuth_group() is grid.azimuth
    assert thd.is_distributed_polar() == (grid.npolar > 1) and thd.is_distributed_azimuth() == (grid.nazimuth > 1)
    p, a = grid.polar_rank, grid.azimuth.rank
    assert thd.get_group_neighbors(thd.polar_group()) == (((p - 1) % grid.npolar) * grid.nazimuth + a,
                                                          ((p + 1) % grid.npolar) * grid.nazimuth + a)
    assert thd.get_group_neighbors(thd.azimuth_group()) == (p * grid.nazimuth + (a - 1) % grid.nazimuth,
                                                            p * grid.nazimuth + (a + 1) % grid.nazimuth)


@pytest.mark.parametrize("group", ["polar", "azimuth"])
def test_copy_and_reduce(initialised, group):
    grid = initialised
    comm = grid.polar if group == "polar" else grid.azimuth
    copy = getattr(thd, f"copy_to_{group}_region")
    reduce = getattr(thd, f"reduce_from_{group}_region")
    total = comm.size * (comm.size + 1) / 2
    x = torch.ones(3, 4, dtype=torch.float64, requires_grad=True)
    out = copy(x)
    assert torch.equal(out, x.detach())
    assert torch.equal(backward_of(out, float(comm.rank + 1), x), torch.full((3, 4), total, dtype=torch.float64))
    x = torch.full((3, 4), float(comm.rank + 1), dtype=torch.float64, requires_grad=True)
    out = reduce(x)
    assert torch.equal(out, torch.full((3, 4), total, dtype=torch.float64))
    g = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(backward_of(out, g, x), g)


def test_scatter_gather_and_reduce_scatter_over_the_polar_ranks(initialised):
    grid = initialised
    comm = grid.polar
    gen = torch.Generator().manual_seed(3)
    whole = torch.randn(2, 7 + comm.size, 3, generator=gen, dtype=torch.float64)
    cotangent = torch.randn(whole.shape, generator=gen, dtype=torch.float64)
    shapes = list(split_sizes(whole.shape[1], comm.size))
    x = whole.clone().requires_grad_(True)
    out = thd.scatter_to_polar_region(x, 1)
    assert torch.equal(out, chunk(whole, 1, comm))
    assert torch.equal(backward_of(out, chunk(cotangent, 1, comm), x), cotangent)
    x = chunk(whole, 1, comm).clone().requires_grad_(True)
    out = thd.gather_from_polar_region(x, 1, shapes)
    assert torch.equal(out, whole)
    assert torch.equal(backward_of(out, cotangent, x), chunk(cotangent, 1, comm))
    x = (whole * (comm.rank + 1)).requires_grad_(True)
    out = thd.reduce_from_scatter_to_polar_region(x, 1)
    total = comm.size * (comm.size + 1) / 2
    assert torch.allclose(out, chunk(whole * total, 1, comm), rtol=1e-14, atol=0)
    assert torch.equal(backward_of(out, chunk(cotangent, 1, comm), x), cotangent)
    x = chunk(whole, 1, comm).clone().requires_grad_(True)
    out = thd.gather_from_copy_to_polar_region(x, -2, shapes)
    assert torch.equal(out, whole)
    scaled = cotangent * (comm.rank + 1)
    assert torch.allclose(backward_of(out, scaled, x), chunk(cotangent * total, 1, comm), rtol=1e-14, atol=0)
    if comm.size > 1:     # sizes that are not the split's, on the last polar rank only: every rank raises
        wrong = [sum(shapes)] + [0] * (comm.size - 1) if comm.rank == comm.size - 1 else shapes
        with raises(ValueError, match=rf"rank {comm.size - 1} of {comm.size}: shapes_ \[.*\] are not the "
                                      "balanced split"):
            thd.gather_from_polar_region(x, 1, wrong)


@pytest.mark.parametrize("group", ["polar", "azimuth"])
def test_the_transposes_move_the_split(initialised, group):
    grid = initialised
    comm = grid.polar if group == "polar" else grid.azimuth
    transpose = getattr(thd, f"distributed_transpose_{group}")
    gen = torch.Generator().manual_seed(5)
    whole = torch.randn(2, 3 + comm.size, 5 + comm.size, generator=gen, dtype=torch.float64)
    cotangent = torch.randn(whole.shape, generator=gen, dtype=torch.float64)
    x = chunk(whole, 2, comm).clone().requires_grad_(True)
    out = transpose(x, (1, 2), list(split_sizes(whole.shape[2], comm.size)))
    assert torch.equal(out, chunk(whole, 1, comm))
    assert torch.equal(backward_of(out, chunk(cotangent, 1, comm), x), chunk(cotangent, 2, comm))


def test_the_polar_halo_and_its_reduction(initialised):
    grid = initialised
    nlat, nlon, r = 4 * grid.npolar + 1, 6, 1
    gen = torch.Generator().manual_seed(7)
    whole = torch.randn(1, 2, nlat, nlon, generator=gen, dtype=torch.float64)
    lat, lon = grid.local_slices(nlat, nlon)
    x = whole[..., lat, lon].clone().requires_grad_(True)
    out = thd.polar_halo_exchange(x, r)
    if grid.npolar == 1:
        assert out is x
        return
    padded = torch.nn.functional.pad(whole, (0, 0, r, r))           # zeros past the poles
    expected = padded[..., lat.start:lat.stop + 2 * r, lon]
    assert torch.equal(out, expected)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    reduced = thd.polar_halo_reduce(g, r, x.shape[-2])
    assert torch.equal(backward_of(out, g, x), reduced)             # the exchange's backward is the reduction


def test_the_polar_halo_radius_is_the_disco_convolutions(initialised):
    from mpisphere import DiscoConvS2
    from mpisphere.disco.psi import effective_cutoff
    from mpisphere.quadrature import latitudes
    grid = initialised
    shape = (8 * grid.npolar, 16)
    op = DiscoConvS2(grid, shape, shape, (3,), numpy.ones((1, 1, 2)))
    theta, _ = latitudes(shape[0], "equiangular")
    sizes = list(split_sizes(shape[0], grid.npolar))
    found = thd.compute_polar_halo_radius(torch.from_numpy(theta), torch.from_numpy(theta),
                                          effective_cutoff(op.theta_cutoff), sizes, sizes)
    assert found == (op.halo_rows if grid.npolar > 1 else 0)


def test_the_modules_carry_torch_harmonics_attributes(initialised):
    grid = initialised
    shape = (6 * grid.npolar + 1, 12)
    conv = thd.DistributedDiscreteContinuousConvS2(2, 2, shape, shape, (3,))
    assert (conv.comm_size_polar, conv.comm_rank_polar) == (grid.npolar, grid.polar_rank)
    assert (conv.comm_size_azimuth, conv.comm_rank_azimuth) == (grid.nazimuth, grid.azimuth.rank)
    assert conv.polar_mode == "halo-exchange" and conv.fused is False and conv.filter_basis.kernel_size == 2
    assert (conv.nlat_in_local, conv.nlon_in_local) == grid.local_shape(*shape)
    quadrature = thd.DistributedQuadratureS2(shape, normalize=True)
    assert quadrature.quad_weight.shape == (1, 1) + grid.local_shape(*shape)
    total = grid.cart.allreduce(float(quadrature.quad_weight.double().sum()))
    assert abs(total - 1.0) <= 1e-6                                  # float32 weights of the mean
    resample = thd.DistributedResampleS2(*shape, 2 * shape[0], 24, grid_in="equiangular", grid_out="legendre-gauss")
    assert (resample.grid_in, resample.grid_out) == ("equiangular", "legendre-gauss")
    spectral = thd.DistributedSpectralConvS2(shape, shape, 2, 2)
    assert (spectral.lmax_local, spectral.mmax_local) == (spectral.l_shapes[grid.polar_rank],
                                                          spectral.m_shapes[grid.azimuth.rank])
    assert isinstance(spectral.sht, thd.DistributedRealSHT) and spectral.isht.lmax == spectral.lmax
    assert set(spectral.state_dict()) == {"weight"}                  # the transforms add no state
