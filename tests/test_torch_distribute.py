"""``distribute(model)``: torch-harmonics 0.9.3's five example models, built serially with a seed, distributed,
and trained a few optimizer steps with a loss through the quadrature, against the same serial training (float32,
the examples' own dtype): losses, every parameter and the eval-mode output within 1e-4 of the largest value; the
``state_dict`` both ways; dropout and drop-path masks the serial model's for the same seed; refusals by path on
every rank. CI (``.ci/torch``) sets ``MPISPHERE_REQUIRE_TORCH=1``."""

import os
import re

import numpy
import pytest

if os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1":
    import torch
    import torch_harmonics as th
    from torch_harmonics.examples import models
else:
    torch = pytest.importorskip("torch")
    th = pytest.importorskip("torch_harmonics")
    models = pytest.importorskip("torch_harmonics.examples.models")

import mpisphere.torch_harmonics as thd  # noqa: E402 (after the checks above)
from helpers import raises  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore::UserWarning")]

SHAPE = (32, 64)
RTOL = 1e-4      # float32 through a model and three steps: rounding of order 1e-6 of the largest value


def _sfno(num_layers=2, **options):
    return models.SphericalFourierNeuralOperator(img_size=SHAPE, in_chans=2, out_chans=2, embed_dim=8,
                                                 num_layers=num_layers, scale_factor=2, **options)


MODELS = {
    "sfno-instance-norm": lambda: _sfno(normalization_layer="instance_norm"),
    "sfno-layer-norm-learnable-embedding": lambda: _sfno(normalization_layer="layer_norm",
                                                         pos_embed="learnable latlon", bias=True),
    "lsno": lambda: models.LocalSphericalNeuralOperator(img_size=SHAPE, in_chans=2, out_chans=2, embed_dim=8,
                                                        num_layers=2, scale_factor=2,
                                                        normalization_layer="instance_norm"),
    "transformer-neighbourhood": lambda: models.SphericalTransformer(
        img_size=SHAPE, in_chans=2, out_chans=2, embed_dim=8, num_layers=2, scale_factor=2, num_heads=2,
        normalization_layer="instance_norm", attention_mode="neighborhood"),
    "transformer-global": lambda: models.SphericalTransformer(
        img_size=SHAPE, in_chans=2, out_chans=2, embed_dim=8, num_layers=2, scale_factor=2,
        attention_mode="global", pos_embed="sequence"),
    "unet": lambda: models.SphericalUNet(img_size=SHAPE, in_chans=2, out_chans=2, embed_dims=[8, 16],
                                         depths=[1, 1], scale_factor=2),
    "segformer-neighbourhood": lambda: models.SphericalSegformer(
        img_size=SHAPE, in_chans=2, out_chans=2, embed_dims=[8, 16], heads=[1, 2], depths=[1, 1], scale_factor=2,
        attention_mode="neighborhood"),
    "segformer-global": lambda: models.SphericalSegformer(
        img_size=SHAPE, in_chans=2, out_chans=2, embed_dims=[8, 16], heads=[1, 2], depths=[1, 1], scale_factor=2,
        attention_mode="global"),
}


def tile_of(grid, whole):
    lat, lon = grid.local_slices(*whole.shape[-2:])
    return whole[..., lat, lon].contiguous()


def gathered(grid, t):
    return torch.from_numpy(numpy.asarray(grid.cart.bcast(grid.gather(t.detach().numpy()), root=0)))


def assert_close(mine, theirs, what, floor=0.0):
    scale = max(float(theirs.abs().max()), floor, 1e-30)
    error = float((mine - theirs).abs().max())
    assert error <= RTOL * scale, f"{what}: {error:.3g} > {RTOL} x {scale:.3g}"


def train(model, quadrature, x, target, steps=3):
    """``steps`` SGD steps on the quadrature's mean squared error; the losses. Seeds each step (dropout masks)."""
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        optimiser.zero_grad()
        loss = quadrature((model(x) - target) ** 2).mean()
        loss.backward()
        optimiser.step()
        losses.append(float(loss))
    return torch.tensor(losses)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_distributed_example_model_trains_as_the_serial_one(grid, name):
    torch.manual_seed(0)
    serial = MODELS[name]()
    before = {key: value.clone() for key, value in serial.state_dict().items()}
    distributed = thd.distribute(serial, process_grid=grid)
    torch.manual_seed(1)
    x = torch.randn(2, 2, *SHAPE)
    target = torch.randn(2, 2, *SHAPE)

    serial_losses = train(serial, th.QuadratureS2(SHAPE, normalize=True), x, target)
    losses = train(distributed, thd.DistributedQuadratureS2(SHAPE, normalize=True, process_grid=grid),
                   tile_of(grid, x), tile_of(grid, target))
    assert_close(losses, serial_losses, "losses")
    theirs = serial.state_dict()
    mine = distributed.state_dict()
    assert list(mine) == list(theirs)
    # a parameter whose gradient is zero but for rounding (a bias before a normalisation) holds rounding only:
    # it is measured against the largest change any parameter took in the steps, the scale of its rounding
    moved = max(float((value - before[key]).abs().max()) for key, value in theirs.items() if value.is_floating_point()
                or value.is_complex())
    for key, value in theirs.items():
        assert mine[key].shape == value.shape, key
        if value.is_floating_point() or value.is_complex():
            assert_close(mine[key], value, key, floor=moved)
        else:
            assert torch.equal(mine[key], value), key

    serial.eval(), distributed.eval()
    with torch.no_grad():
        assert_close(gathered(grid, distributed(tile_of(grid, x))), serial(x), "eval-mode output")

    MODELS[name]().load_state_dict(distributed.state_dict())   # the distributed checkpoint into a serial model
    distributed.load_state_dict(serial.state_dict())           # and a serial one into the distributed model


def test_dropout_and_drop_path_draw_the_serial_masks(grid):
    torch.manual_seed(0)
    serial = _sfno(drop_rate=0.3, drop_path_rate=0.5, normalization_layer="instance_norm")
    distributed = thd.distribute(serial, process_grid=grid)
    x = torch.randn(3, 2, *SHAPE)
    for seed in (5, 6):
        torch.manual_seed(seed)
        expected = serial(x)
        torch.manual_seed(seed)
        assert_close(gathered(grid, distributed(tile_of(grid, x))), expected, f"training output, seed {seed}")
    assert "pos_drop" in distributed.mpisphere_replication.random


def test_generators_in_different_states_raise_on_every_rank(grid):
    if grid.size == 1:
        return      # nothing to differ from
    torch.manual_seed(0)
    distributed = thd.distribute(_sfno(drop_rate=0.3), process_grid=grid)
    torch.manual_seed(7 if grid.rank == grid.size - 1 else 5)
    with raises(ValueError, match="random generator"):
        distributed(tile_of(grid, torch.zeros(1, 2, *SHAPE)))


class _Smoother(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return torch.nn.functional.avg_pool2d(x, 3, 1, 1) * self.scale


@pytest.mark.parametrize("layer, path, said", [
    (lambda: torch.nn.Conv2d(8, 8, 3, padding=1), "blocks.1.inner", "kernel_size=(3, 3)"),
    (lambda: torch.nn.MaxPool2d(2), "blocks.1.inner", "depends on other points"),
    (_Smoother, "blocks.1.inner", "calls avg_pool2d"),
])
def test_a_layer_that_cannot_run_on_a_tile_is_refused_by_its_path_on_every_rank(grid, layer, path, said):
    torch.manual_seed(0)
    model = _sfno()
    model.blocks[1].inner = layer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with raises(ValueError, match=f"{re.escape(path)}.*{re.escape(said)}"):
        thd.distribute(model, process_grid=grid)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())   # the model is left unchanged


@pytest.mark.parametrize("setting, last, others, said", [("num_layers", 3, 2, "different models"),
                                                        ("drop_rate", 0.3, 0.2, "different models.*pos_drop")],
                         ids=["layers", "dropout-rate"])
def test_a_model_that_differs_on_the_last_rank_raises_on_every_rank(grid, setting, last, others, said):
    """Another number of layers, or only another dropout rate (a plain setting compared by value)."""
    if grid.size == 1:
        return
    torch.manual_seed(0)
    model = _sfno(**{setting: last if grid.rank == grid.size - 1 else others})
    with raises(ValueError, match=said):
        thd.distribute(model, process_grid=grid)


class _Filter(torch.nn.Module):
    """The examples' SpectralConvS2 alone, over its own transforms."""

    def __init__(self, operator_type):
        super().__init__()
        from torch_harmonics.examples.models._layers import SpectralConvS2
        forward = th.RealSHT(*SHAPE, grid="equiangular").float()
        inverse = th.InverseRealSHT(*SHAPE, lmax=forward.lmax, mmax=forward.mmax, grid="equiangular").float()
        self.conv = SpectralConvS2(forward, inverse, 3, 4, operator_type=operator_type, bias=True)

    def forward(self, x):
        return self.conv(x)[0]


@pytest.mark.parametrize("operator_type", ["diagonal", "block-diagonal"])
def test_the_examples_spectral_filter_multiplies_each_ranks_block(grid, operator_type):
    torch.manual_seed(0)
    serial = _Filter(operator_type)
    if operator_type == "block-diagonal" and grid.nazimuth > 1:
        with raises(ValueError, match="block-diagonal.*mixes the orders m"):
            thd.distribute(serial, process_grid=grid)
        return
    distributed = thd.distribute(serial, process_grid=grid)
    x = torch.randn(2, 3, *SHAPE)
    quadrature = thd.DistributedQuadratureS2(SHAPE, process_grid=grid)
    loss = quadrature(distributed(tile_of(grid, x)) ** 2).sum()
    loss.backward()
    expected = th.QuadratureS2(SHAPE)(serial(x) ** 2).sum()
    expected.backward()
    assert_close(loss.detach(), expected.detach(), "loss")
    for name, p in serial.named_parameters():
        mine = dict(distributed.named_parameters())[name].grad
        assert_close(mine, p.grad, f"the gradient of {name}")
