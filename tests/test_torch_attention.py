"""The drop-in attention modules against torch-harmonics 0.9.3's serial ``NeighborhoodAttentionS2`` and ``AttentionS2``.

float32 on the CPU, as torch-harmonics' own tests run them: the serial
module's ``state_dict`` loads into the distributed one, both run on the same
fields (ours on this rank's tiles), and the gathered output is within 1e-5
of the largest value, the query, key and value gradients and every
parameter's within 1e-4 (torch-harmonics' tolerances; its tests never check
the parameters' gradients). CI (``.ci/torch``) sets
``MPISPHERE_REQUIRE_TORCH=1``: a missing PyTorch or torch-harmonics fails
these tests instead of skipping them.
"""

import os

import numpy
import pytest

from helpers import raises

if os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1":
    import torch
    import torch_harmonics as th
else:
    torch = pytest.importorskip("torch")
    th = pytest.importorskip("torch_harmonics")

import mpisphere.torch_harmonics as thd  # noqa: E402 (after the checks above)

pytestmark = pytest.mark.mpi

CASES = {
    "self": dict(neighbourhood=True, in_shape=(8, 16), out_shape=(8, 16)),
    "gauss-heads2-qknorm": dict(neighbourhood=True, in_shape=(9, 18), out_shape=(9, 18), grid="legendre-gauss",
                                num_heads=2, use_qknorm=True),
    "wide-cutoff-kc-oc": dict(neighbourhood=True, in_shape=(8, 16), out_shape=(8, 16), theta_cutoff=1.1,
                              k_channels=6, out_channels=2, cross=True),
    "down": dict(neighbourhood=True, in_shape=(12, 24), out_shape=(6, 12), cross=True),
    "up": dict(neighbourhood=True, in_shape=(6, 12), out_shape=(12, 24), cross=True),
    "global-heads2-qknorm": dict(neighbourhood=False, in_shape=(8, 16), out_shape=(8, 16), num_heads=2,
                                 use_qknorm=True),
    "global-down": dict(neighbourhood=False, in_shape=(12, 24), out_shape=(6, 12), cross=True),
}


def tile_of(grid, whole):
    lat, lon = grid.local_slices(*whole.shape[-2:])
    return whole[..., lat, lon].detach().clone().contiguous().requires_grad_(whole.requires_grad)


def gathered(grid, t):
    return torch.from_numpy(numpy.asarray(grid.cart.bcast(grid.gather(t.detach().numpy()), root=0)))


def pair(grid, name):
    spec = dict(CASES[name])
    neighbourhood, cross = spec.pop("neighbourhood"), spec.pop("cross", False)
    quadrature = spec.pop("grid", "equiangular")
    common = dict(in_shape=spec.pop("in_shape"), out_shape=spec.pop("out_shape"), grid_in=quadrature,
                  grid_out=quadrature, **spec)
    torch.manual_seed(7)
    if neighbourhood:
        serial = th.NeighborhoodAttentionS2(4, **common)
        ours = thd.DistributedNeighborhoodAttentionS2(4, **common, process_grid=grid)
    else:
        heads = common.pop("num_heads", 1)
        serial = th.AttentionS2(4, heads, **common)
        ours = thd.DistributedAttentionS2(4, heads, **common, process_grid=grid)
    with torch.no_grad():   # biases and gains away from their zero start, so their gradients matter
        for p in serial.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours.load_state_dict(serial.state_dict())
    return serial, ours, common, cross


@pytest.mark.parametrize("name", list(CASES))
def test_the_modules_match_torch_harmonics_in_float32(grid, name):
    serial, ours, common, cross = pair(grid, name)
    torch.manual_seed(11)
    query = torch.randn(2, 4, *common["out_shape"], requires_grad=True)
    key = torch.randn(2, 4, *common["in_shape"], requires_grad=True) if cross else None
    value = torch.randn(2, 4, *common["in_shape"], requires_grad=True) if cross else None
    inputs = [t for t in (query, key, value) if t is not None]
    y = serial(*inputs)
    y_bar = torch.randn_like(y)
    (y * y_bar).sum().backward()
    tiles = [tile_of(grid, t) for t in inputs]
    mine = ours(*tiles)
    (mine * tile_of(grid, y_bar)).sum().backward()
    assert float((gathered(grid, mine) - y.detach()).abs().max()) <= 1e-5 * float(y.abs().max())
    for t, tile in zip(inputs, tiles):
        assert float((gathered(grid, tile.grad) - t.grad).abs().max()) <= 1e-4 * float(t.grad.abs().max())
    # k_bias's gradient is zero but for rounding without q/k normalisation (a shift of every key leaves each
    # softmax as it is): the gradients are measured against the largest of the projections'
    scale = max(float(p.grad.abs().max()) for n, p in serial.named_parameters() if n.endswith("_weights"))
    theirs = dict(serial.named_parameters())
    for n, p in ours.named_parameters():
        expected = theirs[n].grad
        floor = scale if n == "k_bias" and not common.get("use_qknorm") else float(expected.abs().max())
        assert float((p.grad - expected).abs().max()) <= 1e-4 * floor, n
        numpy.testing.assert_array_equal(numpy.array(grid.cart.allgather(p.grad.numpy())),
                                         numpy.array([p.grad.numpy()] * grid.size))


def test_a_parameter_loaded_on_one_rank_only_raises_on_every_rank(grid):
    if grid.size == 1:
        return      # nothing to differ from
    _, ours, common, _ = pair(grid, "self")
    if grid.rank == grid.size - 1:
        with torch.no_grad():
            ours.k_weights.mul_(2)
    query = tile_of(grid, torch.randn(1, 4, *common["out_shape"]))
    with raises(ValueError, match="k_weights"):
        ours(query)


def test_construction_mistakes_on_the_last_rank_raise_on_every_rank(grid):
    if grid.size == 1:
        return      # nothing to differ from
    last = grid.rank == grid.size - 1
    with raises(ValueError, match="theta_cutoff"):
        thd.DistributedNeighborhoodAttentionS2(4, (8, 16), (8, 16), theta_cutoff=0.9 if last else None,
                                               process_grid=grid)
    with raises(ValueError, match="num_heads"):
        thd.DistributedAttentionS2(4, 2 if last else 1, (8, 16), (8, 16), process_grid=grid)
    with raises(ValueError, match="drop_rate"):
        thd.DistributedAttentionS2(4, 1, (8, 16), (8, 16), drop_rate=0.1 if last else 0.0, process_grid=grid)
