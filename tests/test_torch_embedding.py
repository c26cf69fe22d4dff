"""Position embeddings on tiles: the serial module's fixed and learnable embeddings, distributed, add the tile of
the serial tensor, load the serial state_dict, and give the learnable one its whole-sphere gradient on every
rank. CI (``.ci/torch``) sets ``MPISPHERE_REQUIRE_TORCH=1``."""

import os

import numpy
import pytest

if os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1":
    import torch
    from torch_harmonics.examples.models import _layers
else:
    torch = pytest.importorskip("torch")
    _layers = pytest.importorskip("torch_harmonics.examples.models._layers")

import mpisphere.torch_harmonics as thd  # noqa: E402 (after the check above)

pytestmark = pytest.mark.mpi

SHAPE = (9, 16)


def serial_embedding(kind):
    if kind == "sequence":
        return _layers.SequencePositionEmbedding(SHAPE, num_chans=4)
    if kind == "spectral":
        return _layers.SpectralPositionEmbedding(SHAPE, num_chans=4)
    module = _layers.LearnablePositionEmbedding(SHAPE, num_chans=4, embed_type=kind.split("-")[1])
    with torch.no_grad():
        module.position_embeddings.copy_(torch.randn(module.position_embeddings.shape,
                                                     generator=torch.Generator().manual_seed(4)))
    return module


@pytest.mark.parametrize("kind", ["sequence", "spectral", "learnable-lat", "learnable-latlon"])
def test_the_distributed_embedding_adds_the_serial_tile(grid, kind):
    serial = serial_embedding(kind)
    ours = thd.DistributedPositionEmbedding(serial, process_grid=grid)
    assert set(ours.state_dict()) == set(serial.state_dict())
    ours.load_state_dict(serial.state_dict())
    x = torch.randn(2, 4, *SHAPE, generator=torch.Generator().manual_seed(5))
    g = torch.randn(2, 4, *SHAPE, generator=torch.Generator().manual_seed(6))
    y = serial(x)
    lat, lon = grid.local_slices(*SHAPE)
    mine = ours(x[..., lat, lon].contiguous())
    assert torch.equal(mine, y.detach()[..., lat, lon])
    if kind.startswith("learnable"):
        (y * g).sum().backward()
        (mine * g[..., lat, lon]).sum().backward()
        found = ours.position_embeddings.grad
        # the exact gradient (float64 sums of the cotangent over the batch, and the longitudes for "lat"), and a
        # bound on float32 summation that cannot cancel: terms times eps, summed in absolute value
        axes = (0, 3) if kind == "learnable-lat" else (0,)
        exact = g.double().sum(dim=axes, keepdim=True)
        bound = g.numel() / exact.numel() * 2.0 ** -23 * g.double().abs().sum(dim=axes, keepdim=True)
        assert bool(((found.double() - exact).abs() <= bound).all())
        assert bool(((serial.position_embeddings.grad.double() - exact).abs() <= bound).all())
        numpy.testing.assert_array_equal(numpy.array(grid.cart.allgather(found.numpy())),
                                         numpy.array([found.numpy()] * grid.size))
