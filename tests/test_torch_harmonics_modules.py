"""mpisphere.torch_harmonics against torch-harmonics 0.9.3's serial modules, on the CPU in float64.

Each test builds the serial module on every rank (the same seed everywhere),
loads its ``state_dict`` into the distributed module, runs both on the same
field (the distributed one on this rank's tile) and compares the gathered
outputs, the input gradients and the parameters' gradients (which are
whole-sphere gradients on every rank). The spectral convolution is compared
with torch-harmonics' own steps in float64 (its module computes in float32).

CI (``.ci/torch``) sets ``MPISPHERE_REQUIRE_TORCH=1``: a missing PyTorch or
torch-harmonics then fails these tests instead of skipping them.
"""

import os
import warnings

import numpy
import pytest

from mpisphere import CopyTo

from helpers import raises

REQUIRED = os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1"
if REQUIRED:
    import torch
    import torch_harmonics as th
else:
    torch = pytest.importorskip("torch")
    th = pytest.importorskip("torch_harmonics")

import mpisphere.torch as mt  # noqa: E402 (after the checks above)
import mpisphere.torch_harmonics as thd  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
    torch.set_default_dtype(before)


def tile_of(grid, whole):
    lat, lon = grid.local_slices(*whole.shape[-2:])
    return whole[..., lat, lon].detach().clone().contiguous()


def gathered(grid, t):
    return torch.from_numpy(numpy.asarray(grid.cart.bcast(grid.gather(t.detach().numpy()), root=0)))


def close(a, b, rtol):
    """``|a - b| <= rtol * max |b|``: rounding measured against the largest value, which cannot cancel."""
    return float((a - b).abs().max()) <= rtol * float(b.abs().max())


def run_both(grid, serial, ours, x):
    """Forward and backward of the serial module on ``x`` and of ours on this rank's tile, with one cotangent.

    Returns ``(y, x_grad, our y gathered, our x grad gathered)``.
    """
    x = x.detach().requires_grad_(True)
    y = serial(x)
    y_bar = torch.randn_like(y)
    y.backward(y_bar)
    x_tile = tile_of(grid, x).requires_grad_(True)
    y_tile = ours(x_tile)
    y_tile.backward(tile_of(grid, y_bar))
    return y.detach(), x.grad, gathered(grid, y_tile), gathered(grid, x_tile.grad)


DISCO = [
    # kernel_shape, basis_type, basis_norm_mode, groups, grid_in, grid_out, in_shape, out_shape, transposed, cutoff
    ((3,), "piecewise linear", "nodal", 1, "equiangular", "equiangular", (16, 32), (16, 32), False, None),
    ((3, 4), "piecewise linear", "mean", 2, "equiangular", "equiangular", (16, 32), (16, 32), False, None),
    ((2, 3), "harmonic", "modal", 1, "equiangular", "equiangular", (16, 32), (16, 32), False, None),
    (3, "zernike", "support", 2, "equiangular", "equiangular", (16, 32), (16, 32), False, None),
    (2, "morlet", "geometric", 1, "legendre-gauss", "legendre-gauss", (16, 32), (16, 32), False, None),
    ((3,), "piecewise linear", "none", 1, "equiangular", "legendre-gauss", (16, 32), (8, 16), False, None),
    ((3, 2), "piecewise linear", "nodal", 2, "legendre-gauss", "lobatto", (8, 16), (16, 32), True, None),
    ((4,), "piecewise linear", "nodal", 1, "lobatto", "equiangular", (13, 24), (13, 24), False, 0.3),
    ((3,), "zernike", "support", 1, "equiangular", "equiangular", (13, 24), (13, 24), True, 0.3),
]


@pytest.mark.parametrize("case", DISCO, ids=[f"{c[1]}-{c[2]}-{'T' if c[8] else 'F'}{i}" for i, c in enumerate(DISCO)])
def test_disco_layers_match_the_serial_module(grid, case):
    kernel_shape, basis, mode, groups, grid_in, grid_out, in_shape, out_shape, transposed, cutoff = case
    torch.manual_seed(0)
    serial_class = th.DiscreteContinuousConvTransposeS2 if transposed else th.DiscreteContinuousConvS2
    ours_class = (thd.DistributedDiscreteContinuousConvTransposeS2 if transposed
                  else thd.DistributedDiscreteContinuousConvS2)
    options = dict(basis_type=basis, basis_norm_mode=mode, groups=groups, grid_in=grid_in, grid_out=grid_out,
                   theta_cutoff=cutoff)
    serial = serial_class(4, 6, in_shape, out_shape, kernel_shape, optimized_kernel=False, **options)
    with torch.no_grad():
        serial.bias.normal_()
    ours = ours_class(4, 6, in_shape, out_shape, kernel_shape, process_grid=grid, **options)
    ours.load_state_dict(serial.state_dict())
    y, x_grad, found, found_grad = run_both(grid, serial, ours, torch.randn(2, 4, *in_shape))
    assert close(found, y, 1e-12)
    assert close(found_grad, x_grad, 1e-11)
    assert close(ours.weight.grad, serial.weight.grad, 1e-11)
    assert close(ours.bias.grad, serial.bias.grad, 1e-11)


def test_transforms_and_quadrature_match_the_serial_modules(grid):
    torch.manual_seed(1)
    nlat, nlon = 17, 32
    x = torch.randn(3, nlat, nlon)
    sht = thd.DistributedRealSHT(nlat, nlon, grid="legendre-gauss", process_grid=grid)
    serial = th.RealSHT(nlat, nlon, grid="legendre-gauss").double()
    assert sht.l_shapes == thd.compute_split_shapes(sht.lmax, grid.npolar)
    assert close(gathered(grid, sht(tile_of(grid, x))), serial(x), 1e-12)
    isht = thd.DistributedInverseRealSHT(nlat, nlon, grid="legendre-gauss", process_grid=grid)
    c = serial(x)
    block = c[..., grid.local_slices(sht.lmax, sht.mmax)[0], grid.local_slices(sht.lmax, sht.mmax)[1]]
    assert close(gathered(grid, isht(block.contiguous())), th.InverseRealSHT(nlat, nlon, grid="legendre-gauss")
                 .double()(c), 1e-12)
    vector = torch.randn(2, 2, nlat, nlon)
    vsht = thd.DistributedRealVectorSHT(nlat, nlon, grid="legendre-gauss", process_grid=grid)
    serial_vector = th.RealVectorSHT(nlat, nlon, grid="legendre-gauss").double()
    assert close(gathered(grid, vsht(tile_of(grid, vector))), serial_vector(vector), 1e-12)
    ivsht = thd.DistributedInverseRealVectorSHT(nlat, nlon, grid="legendre-gauss", process_grid=grid)
    cv = serial_vector(vector)
    vblock = cv[..., grid.local_slices(vsht.lmax, vsht.mmax)[0], grid.local_slices(vsht.lmax, vsht.mmax)[1]]
    assert close(gathered(grid, ivsht(vblock.contiguous())),
                 th.InverseRealVectorSHT(nlat, nlon, grid="legendre-gauss").double()(cv), 1e-12)
    for normalize in (False, True):
        quad = thd.DistributedQuadratureS2((nlat, nlon), grid="lobatto", normalize=normalize, process_grid=grid)
        reference = th.QuadratureS2((nlat, nlon), grid="lobatto", normalize=normalize)
        expected = (x * reference.quad_weight.double()).sum(dim=(-2, -1))  # its weights, in float64
        assert close(quad(tile_of(grid, x)), expected, 1e-6)   # torch-harmonics' weights are float32
        assert quad(tile_of(grid, x)).shape == (3,)


def row_weights(nlat, nlon, grid="equiangular"):
    """torch-harmonics' quadrature weights in float64 (its QuadratureS2 holds them in float32), ``(nlat, 1)``."""
    _, w = th.quadrature.precompute_latitudes(nlat, grid=grid)
    return w.double()[:, None] * (2 * numpy.pi / nlon)


@pytest.mark.parametrize("mode", ["bilinear", "bilinear-spherical"])
@pytest.mark.parametrize("shapes", [((12, 24), (17, 36), "equiangular", "equiangular"),
                                    ((10, 20), (13, 24), "legendre-gauss", "equiangular"),
                                    ((16, 32), (9, 20), "equiangular", "lobatto")])
def test_resampling_matches_the_serial_module(grid, shapes, mode):
    (nlat_in, nlon_in), (nlat_out, nlon_out), grid_in, grid_out = shapes
    serial = th.ResampleS2(nlat_in, nlon_in, nlat_out, nlon_out, grid_in=grid_in, grid_out=grid_out, mode=mode)
    ours = thd.DistributedResampleS2(nlat_in, nlon_in, nlat_out, nlon_out, grid_in, grid_out, mode,
                                     process_grid=grid)
    torch.manual_seed(5)
    scale = numpy.pi if mode == "bilinear-spherical" else 1.0   # angles: across the branch cut too
    y, x_grad, found, found_grad = run_both(grid, serial, ours, scale * torch.randn(2, 3, nlat_in, nlon_in))
    if mode == "bilinear-spherical":
        # angles, each a lift from the arc's start: where an output longitude falls on an input one, the two
        # libraries' longitudes (torch.linspace's and NumPy's last bits) pick the arc's other end, the same
        # angle 2 pi k away
        found = y + torch.remainder(found - y + numpy.pi, 2 * numpy.pi) - numpy.pi
    assert close(found, y, 1e-12)
    assert close(found_grad, x_grad, 1e-12)


class SerialSpectralConv(torch.nn.Module):
    """torch-harmonics' SpectralConvS2 step by step in float64 (its module computes in float32)."""

    def __init__(self, module, in_shape, out_shape, grid_in, grid_out):
        super().__init__()
        lmax = module.lmax
        self.sht = th.RealSHT(*in_shape, lmax=lmax, mmax=lmax, grid=grid_in).double()
        self.isht = th.InverseRealSHT(*out_shape, lmax=lmax, mmax=lmax, grid=grid_out).double()
        self.grid_in = grid_in
        self.weight = torch.nn.Parameter(module.weight.detach().to(torch.complex128))
        bias = getattr(module, "spectral_bias", None)
        self.spectral_bias = None if bias is None else torch.nn.Parameter(bias.detach().to(torch.complex128))
        self.groups = module.num_groups

    def forward(self, x):
        c = self.sht(x)
        if self.spectral_bias is not None:
            c = c + (x * row_weights(*x.shape[-2:], self.grid_in)).sum(dim=(-2, -1))[..., None, None] \
                * self.spectral_bias
        B, C, L, M = c.shape
        c = c.reshape(B, self.groups, C // self.groups, L, M)
        out = torch.einsum("bgixy,giox->bgoxy", c, self.weight)
        return self.isht(out.reshape(B, -1, L, M))


@pytest.mark.parametrize("bias", [False, True])
def test_spectral_convolution_matches_torch_harmonics_steps(grid, bias):
    torch.manual_seed(2)
    in_shape, out_shape = (16, 32), (12, 24)
    module = th.SpectralConvS2(in_shape, out_shape, 4, 6, num_groups=2, grid_in="equiangular",
                               grid_out="legendre-gauss", bias=bias)
    if bias:
        with torch.no_grad():
            module.spectral_bias.normal_()
    ours = thd.DistributedSpectralConvS2(in_shape, out_shape, 4, 6, num_groups=2, grid_in="equiangular",
                                         grid_out="legendre-gauss", bias=bias, process_grid=grid)
    ours.load_state_dict(module.state_dict())     # the serial module's names and shapes
    serial = SerialSpectralConv(module, in_shape, out_shape, "equiangular", "legendre-gauss")
    y, x_grad, found, found_grad = run_both(grid, serial, ours, torch.randn(2, 4, *in_shape))
    assert close(found, y, 1e-12)
    assert close(found_grad, x_grad, 1e-11)
    assert close(ours.weight.grad, serial.weight.grad.to(ours.weight.dtype), 1e-6)   # parameters are complex64
    if bias:
        assert close(ours.spectral_bias.grad, serial.spectral_bias.grad.to(torch.complex64), 1e-6)


def test_a_parameter_loaded_on_one_rank_only_raises_on_every_rank(grid):
    torch.manual_seed(3)
    layer = thd.DistributedDiscreteContinuousConvS2(2, 2, (12, 24), (12, 24), (3,), process_grid=grid)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    if grid.rank == grid.size - 1:
        state["bias"] += 1
    layer.load_state_dict(state)
    x = torch.randn(1, 2, *grid.local_shape(12, 24))
    if grid.size > 1:
        with raises(ValueError, match="bias"):
            layer(x)
    # new parameters are the same on every rank whatever each rank's generator gives
    torch.manual_seed(grid.rank)
    fresh = thd.DistributedSpectralConvS2((12, 24), (12, 24), 2, 2, process_grid=grid)
    weights = grid.cart.allgather(fresh.weight.detach().numpy())
    assert all(numpy.array_equal(weights[0], w) for w in weights)


def test_a_dtype_on_the_last_rank_and_a_polar_mode_are_refused_on_every_rank(grid):
    conv = thd.DistributedDiscreteContinuousConvS2(2, 2, (12, 24), (12, 24), (3,), process_grid=grid)
    dtype = torch.float16 if grid.rank == grid.size - 1 else torch.float32
    with raises(TypeError, match="expected float32, got float16"):
        conv(torch.zeros(1, 2, *grid.local_shape(12, 24), dtype=dtype))
    with raises(ValueError, match="polar_mode='reduce-scatter'"):
        thd.DistributedDiscreteContinuousConvS2(2, 2, (12, 24), (12, 24), (3,), polar_mode="reduce-scatter",
                                                process_grid=grid)


def test_a_cutoff_wider_than_the_halo_is_refused_with_the_widest_served(grid):
    if grid.npolar == 1:  # one polar rank holds every latitude
        thd.DistributedDiscreteContinuousConvS2(1, 1, (25, 24), (25, 24), (3,), theta_cutoff=2.5, process_grid=grid)
        return
    with raises(ValueError, match="the widest cutoff this split serves is"):
        thd.DistributedDiscreteContinuousConvS2(1, 1, (25, 24), (25, 24), (3,), theta_cutoff=2.5, process_grid=grid)


class Network(torch.nn.Module):
    """A small SFNO-like network: a spectral convolution, a DISCO convolution, a pointwise layer."""

    def __init__(self, spectral, disco, pointwise, share=None):
        super().__init__()
        self.spectral, self.disco = spectral, disco
        self.pointwise = torch.nn.Parameter(pointwise)
        self.share = share

    def forward(self, x):
        h = torch.nn.functional.gelu(self.spectral(x))
        h = torch.nn.functional.gelu(self.disco(h))
        # the pointwise weights are replicated: on the ranks' tiles through CopyTo (its backward sums the ranks)
        w = self.pointwise if self.share is None else mt.apply(self.share, self.pointwise)
        return torch.einsum("oc,bcxy->boxy", w, h) + x[:, :1]


def train_side_by_side(optimisers, serial_loss, our_loss, steps):
    """``steps`` steps of the serial and the distributed model, each its own optimiser: ``[(loss, our loss)]``."""
    losses = []
    for _ in range(steps):
        for opt in optimisers:
            opt.zero_grad()
        a, b = serial_loss(), our_loss()
        a.backward()
        b.backward()
        losses.append((float(a), float(b)))
        for opt in optimisers:
            opt.step()
    return losses


def test_training_matches_the_serial_run(grid):
    torch.manual_seed(4)
    shape = (16, 32)
    spectral = th.SpectralConvS2(shape, shape, 2, 3, grid_in="equiangular", grid_out="equiangular")
    disco = th.DiscreteContinuousConvS2(3, 3, shape, shape, (3,), optimized_kernel=False)
    pointwise = torch.randn(1, 3)
    x = torch.randn(2, 2, *shape)
    target = torch.randn(2, 1, *shape)

    serial_spectral = SerialSpectralConv(spectral, shape, shape, "equiangular", "equiangular")
    serial = Network(serial_spectral, disco, pointwise.clone())
    ours_spectral = thd.DistributedSpectralConvS2(shape, shape, 2, 3, process_grid=grid)
    ours_spectral.weight = torch.nn.Parameter(spectral.weight.detach().to(torch.complex128))
    ours_disco = thd.DistributedDiscreteContinuousConvS2(3, 3, shape, shape, (3,), process_grid=grid)
    ours_disco.load_state_dict(disco.state_dict())
    ours = Network(ours_spectral, ours_disco, pointwise.clone(), share=CopyTo(grid.cart))
    quad = thd.DistributedQuadratureS2(shape, process_grid=grid)

    def serial_loss():
        return ((serial(x) - target) ** 2 * row_weights(*shape)).sum()

    optimisers = [torch.optim.SGD(serial.parameters(), lr=0.05), torch.optim.SGD(ours.parameters(), lr=0.05)]
    x_tile, target_tile = tile_of(grid, x), tile_of(grid, target)
    losses = train_side_by_side(optimisers, serial_loss, lambda: quad((ours(x_tile) - target_tile) ** 2).sum(), 5)
    for a, b in losses:
        assert abs(a - b) <= 1e-10 * abs(a)
    assert losses[-1][0] < losses[0][0]
    for (name, p), q in zip(serial.named_parameters(), ours.parameters()):
        assert close(q.detach().to(p.dtype), p.detach(), 1e-10), name


class PortedNetwork(torch.nn.Module):
    """The shape of a ported model: DISCO, a plain MLP over the channels, DISCO, a plain 1 x 1 output head."""

    def __init__(self, enc, dec):
        super().__init__()
        self.enc, self.dec = enc, dec
        self.mlp = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
        self.head = torch.nn.Conv2d(3, 1, 1)

    def forward(self, x):
        h = self.enc(x)
        h = h + self.mlp(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(torch.nn.functional.gelu(self.dec(h)))


def ported_pair(grid, shape):
    """The serial network (torch-harmonics' DISCO) and ours (the drop-in's) with the same parameters."""
    torch.manual_seed(6)
    serial = PortedNetwork(th.DiscreteContinuousConvS2(2, 3, shape, shape, (3,), optimized_kernel=False),
                           th.DiscreteContinuousConvS2(3, 3, shape, shape, (3,), optimized_kernel=False))
    ours = PortedNetwork(thd.DistributedDiscreteContinuousConvS2(2, 3, shape, shape, (3,), process_grid=grid),
                         thd.DistributedDiscreteContinuousConvS2(3, 3, shape, shape, (3,), process_grid=grid))
    ours.load_state_dict(serial.state_dict())       # the serial model's names, whole tensors
    return serial, ours


@pytest.mark.parametrize("replicated", [True, False], ids=["replicate", "plain"])
def test_a_ported_model_with_plain_layers_trains_as_the_serial_one_once_replicated(grid, replicated):
    """20 Adam steps: with replicate(model) the losses and parameters are the serial run's on every rank; without
    it the plain layers' gradients are one tile's (the hazard it closes, and the warning that says so)."""
    shape = (12, 24)
    serial, ours = ported_pair(grid, shape)
    if replicated:
        covered = thd.replicate(ours, process_grid=grid)
        assert set(covered.own) == {"enc.weight", "enc.bias", "dec.weight", "dec.bias"}
        assert set(covered.summed) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "head.weight",
                                       "head.bias"}
    torch.manual_seed(7)
    x, target = torch.randn(2, 2, *shape), torch.randn(2, 1, *shape)
    weights = row_weights(*shape)
    quad = thd.DistributedQuadratureS2(shape, process_grid=grid)
    x_tile, target_tile = tile_of(grid, x), tile_of(grid, target)
    optimisers = [torch.optim.Adam(serial.parameters(), lr=1e-2, eps=1e-6),
                  torch.optim.Adam(ours.parameters(), lr=1e-2, eps=1e-6)]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", thd.ReplicationWarning)
        losses = train_side_by_side(optimisers, lambda: ((serial(x) - target) ** 2 * weights).sum(),
                                    lambda: quad((ours(x_tile) - target_tile) ** 2).sum(), 20)
    warned = [w for w in said if issubclass(w.category, thd.ReplicationWarning)]
    mine = {name: p.detach().clone() for name, p in ours.named_parameters()}
    everyone = grid.cart.allgather({name: p.numpy() for name, p in mine.items()})
    same_everywhere = all(numpy.array_equal(theirs[name], everyone[0][name]) for theirs in everyone
                          for name in mine)
    matches = all(close(mine[name], p.detach(), 1e-8) for name, p in serial.named_parameters())
    if not replicated:
        assert len(warned) == 2 and "replicate(model)" in str(warned[0].message)  # once per drop-in module
        if grid.size > 1:
            assert not matches and not same_everywhere   # what a user got without a word before
        return
    assert not warned
    for a, b in losses:
        assert abs(a - b) <= 1e-9 * abs(a)
    assert losses[-1][0] < losses[0][0]
    assert matches and same_everywhere


def test_replicate_shares_rank_0s_values_and_refuses_a_parameter_changed_on_one_rank(grid):
    """Plain layers initialised differently per rank take rank 0's values; a parameter loaded on one rank only
    (a plain one or a drop-in's) raises at the next forward on every rank, naming its path in the model."""
    shape = (12, 24)
    _, ours = ported_pair(grid, shape)
    torch.manual_seed(100 + grid.rank)
    ours.mlp[0].reset_parameters()                      # a different start on every rank
    thd.replicate(ours, process_grid=grid)
    firsts = grid.cart.allgather(ours.mlp[0].weight.detach().numpy())
    assert all(numpy.array_equal(f, firsts[0]) for f in firsts)
    x = torch.randn(1, 2, *grid.local_shape(*shape))
    ours(x)
    for path in ("head.weight", "enc.weight"):
        state = {k: v.clone() for k, v in ours.state_dict().items()}
        if grid.rank == grid.size - 1:
            state[path] += 1
        ours.load_state_dict(state)
        if grid.size > 1:
            with raises(ValueError, match=rf"{path}: ranks? .* rank {grid.size - 1} "):
                ours(x)
        thd.replicate(ours, process_grid=grid)   # rank 0's values again, on every rank
        ours(x)


def test_replicate_sums_each_backward_so_accumulated_gradients_stay_whole(grid):
    shape = (12, 24)
    _, ours = ported_pair(grid, shape)
    thd.replicate(ours, process_grid=grid)
    torch.manual_seed(8)
    x = tile_of(grid, torch.randn(2, 2, *shape))
    quad = thd.DistributedQuadratureS2(shape, process_grid=grid)
    quad(ours(x[:1]) ** 2).sum().backward()
    first = ours.head.weight.grad.clone()
    quad(ours(x[1:]) ** 2).sum().backward()          # accumulated onto the first
    both = ours.head.weight.grad.clone()
    ours.zero_grad()
    quad(ours(x[1:]) ** 2).sum().backward()
    assert close(both, first + ours.head.weight.grad, 1e-12)
    grads = grid.cart.allgather(both.numpy())
    assert all(numpy.array_equal(g, grads[0]) for g in grads)


@pytest.mark.parametrize("layer, found", [
    (torch.nn.Conv2d(3, 3, 3, padding=1), r"kernel_size=\(3, 3\)"),
    (torch.nn.BatchNorm2d(3), "statistics"),
    (torch.nn.LayerNorm((12, 24)), r"normalized_shape=\(12, 24\)"),
    (torch.nn.AvgPool2d(2), "pooling")], ids=["conv3x3", "batchnorm", "layernorm", "pool"])
def test_replicate_refuses_a_layer_that_mixes_points_by_its_path(grid, layer, found):
    _, ours = ported_pair(grid, (12, 24))
    ours.mlp.append(torch.nn.Sequential(layer))
    with raises(ValueError, match=rf"mlp\.3\.0 \({type(layer).__name__}\) cannot run on a tile as it is: .*{found}"):
        thd.replicate(ours, process_grid=grid)
    assert getattr(ours, "mpisphere_replication", None) is None


@pytest.mark.parametrize("mistake", ["groups", "basis_type", "polar_mode", "in_shape", "spectral_groups",
                                     "transform_nlat", "quadrature_shape", "resample_mode"])
def test_a_construction_mistake_on_the_last_rank_raises_on_every_rank(grid, mistake):
    """The drop-in modules' own checks run before anything communicates and are agreed: every rank raises the
    last rank's error, naming it (they raised on that rank alone and left the others waiting)."""
    last = grid.rank == grid.size - 1
    disco = dict(in_channels=2, out_channels=2, in_shape=(12, 24), out_shape=(12, 24), kernel_shape=(3,))
    builds = {
        "groups": (lambda: thd.DistributedDiscreteContinuousConvS2(**disco, groups=3 if last else 1,
                                                                   process_grid=grid),
                   ValueError, "must be multiples of groups=3"),
        "basis_type": (lambda: thd.DistributedDiscreteContinuousConvS2(
            **disco, basis_type="piecewise-linear" if last else "piecewise linear", process_grid=grid),
            ValueError, "piecewise-linear"),
        "polar_mode": (lambda: thd.DistributedDiscreteContinuousConvS2(
            **disco, polar_mode="reduce-scatter" if last else "halo-exchange", process_grid=grid),
            ValueError, "polar_mode='reduce-scatter'"),
        "in_shape": (lambda: thd.DistributedDiscreteContinuousConvS2(
            **{**disco, "in_shape": 12 if last else (12, 24)}, process_grid=grid),
            ValueError, r"in_shape must be \(nlat, nlon\), two positive integers, got 12"),
        "spectral_groups": (lambda: thd.DistributedSpectralConvS2((12, 24), (12, 24), 4, 4,
                                                                  num_groups=3 if last else 1, process_grid=grid),
                            ValueError, "num_groups=3"),
        "transform_nlat": (lambda: thd.DistributedRealSHT(13 if last else 12, 24, process_grid=grid),
                           ValueError, "nlat"),
        "quadrature_shape": (lambda: thd.DistributedQuadratureS2((12,) if last else (12, 24), process_grid=grid),
                             ValueError, "img_shape"),
        "resample_mode": (lambda: thd.DistributedResampleS2(12, 24, 12, 24, mode="nearest" if last else "bilinear",
                                                            process_grid=grid),
                          ValueError, "nearest"),
    }
    build, kind, found = builds[mistake]
    if grid.size == 1:
        if mistake == "transform_nlat":
            build()   # legal on its own: only a difference between ranks is the mistake
            return
        with raises(kind, match=found):
            build()
        return
    with raises(kind, match=rf"rank {grid.size - 1}.*{found}|{found}.*rank {grid.size - 1}"):
        build()
    # every rank is still in step: a call on the grid goes through
    thd.DistributedRealSHT(12, 24, process_grid=grid)(torch.zeros(grid.local_shape(12, 24)))
