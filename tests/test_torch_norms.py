"""Instance, layer and batch normalisation over the whole sphere on tiles, against torch's own modules on the
whole field (float64): outputs, input gradients, parameter gradients and running statistics within rounding,
in training and in eval mode. CI (``.ci/torch``) sets ``MPISPHERE_REQUIRE_TORCH=1``."""

import os

import numpy
import pytest

if os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import mpisphere.torch_harmonics as thd  # noqa: E402 (after the check above)

pytestmark = pytest.mark.mpi

SHAPE = (9, 16)


def tile_of(grid, whole):
    lat, lon = grid.local_slices(*whole.shape[-2:])
    return whole[..., lat, lon].detach().clone().contiguous().requires_grad_(whole.requires_grad)


def gathered(grid, t):
    return torch.from_numpy(numpy.asarray(grid.cart.bcast(grid.gather(t.detach().numpy()), root=0)))


def close(a, b, rtol=1e-12):
    """``|a - b| <= rtol * max |b|`` (float64 sums in another order: rounding against the largest value)."""
    return float((a - b).abs().max()) <= rtol * max(float(b.abs().max()), 1e-300)


def pair(grid, kind):
    torch.manual_seed(1)
    if kind == "instance":
        serial = torch.nn.InstanceNorm2d(3, eps=1e-6, affine=True)
        ours = thd.DistributedInstanceNorm2d(3, eps=1e-6, affine=True, process_grid=grid)
    elif kind == "layer":
        serial = torch.nn.LayerNorm(SHAPE, eps=1e-6)
        ours = thd.DistributedLayerNorm(SHAPE, eps=1e-6, process_grid=grid)
    else:
        serial = torch.nn.BatchNorm2d(3)
        ours = thd.DistributedBatchNorm2d(3, process_grid=grid)
    serial = serial.double()
    with torch.no_grad():
        for p in serial.parameters():
            p.copy_(torch.randn_like(p))
    ours.double().load_state_dict(serial.state_dict())
    return serial, ours


@pytest.mark.parametrize("kind", ["instance", "layer", "batch"])
def test_training_steps_match_the_serial_module(grid, kind):
    serial, ours = pair(grid, kind)
    for step in range(2):
        torch.manual_seed(10 + step)
        x = (3.0 + 2.0 * torch.randn(2, 3, *SHAPE, dtype=torch.float64)).requires_grad_(True)
        g = torch.randn(2, 3, *SHAPE, dtype=torch.float64)
        y = serial(x)
        (y * g).sum().backward()
        tile = tile_of(grid, x)
        mine = ours(tile)
        (mine * tile_of(grid, g)).sum().backward()
        assert close(gathered(grid, mine), y.detach())
        assert close(gathered(grid, tile.grad), x.grad)
    theirs = dict(serial.named_parameters())
    for name, p in ours.named_parameters():
        assert close(p.grad, theirs[name].grad), name
        numpy.testing.assert_array_equal(numpy.array(grid.cart.allgather(p.grad.numpy())),
                                         numpy.array([p.grad.numpy()] * grid.size))
    for name, b in serial.named_buffers():
        assert close(dict(ours.named_buffers())[name].double(), b.double()), name
    serial.eval(), ours.eval()
    x = torch.randn(1, 3, *SHAPE, dtype=torch.float64)
    assert close(gathered(grid, ours(tile_of(grid, x))), serial(x).detach())


def test_a_batch_that_differs_on_the_last_rank_raises_on_every_rank(grid):
    if grid.size == 1:
        return      # nothing to differ from
    from helpers import raises
    _, ours = pair(grid, "instance")
    batch = 2 if grid.rank == grid.size - 1 else 1
    with raises(ValueError, match="disagree"):
        ours(tile_of(grid, torch.randn(batch, 3, *SHAPE, dtype=torch.float64)))
