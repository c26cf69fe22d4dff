"""Dropout on tiles draws the serial model's mask: the same seed gives the serial output's tile, bit for bit;
the masks that do not depend on the points (Dropout2d, the examples' DropPath) agree on tiles as they are.
CI (``.ci/torch``) sets ``MPISPHERE_REQUIRE_TORCH=1``."""

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_on_tiles_is_the_serial_dropout(grid, dtype):
    x = torch.randn(2, 3, *SHAPE, generator=torch.Generator().manual_seed(1), dtype=dtype, requires_grad=True)
    torch.manual_seed(7)
    y = torch.nn.Dropout(0.3)(x)
    lat, lon = grid.local_slices(*SHAPE)
    tile = x.detach()[..., lat, lon].clone().requires_grad_(True)
    torch.manual_seed(7)
    mine = thd.DistributedDropout(0.3, SHAPE, process_grid=grid)(tile)
    assert torch.equal(mine, y.detach()[..., lat, lon])
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    (y * g).sum().backward()
    (mine * g[..., lat, lon]).sum().backward()
    assert torch.equal(tile.grad, x.grad[..., lat, lon])
    module = thd.DistributedDropout(0.3, SHAPE, process_grid=grid).eval()
    assert module(tile) is tile


def test_masks_without_points_agree_on_tiles_as_they_are(grid):
    x = torch.randn(2, 3, *SHAPE, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    lat, lon = grid.local_slices(*SHAPE)
    torch.manual_seed(9)
    whole = torch.nn.Dropout2d(0.5)(x)
    torch.manual_seed(9)
    tile = torch.nn.Dropout2d(0.5)(x[..., lat, lon])
    assert torch.equal(tile, whole[..., lat, lon])
    assert numpy.array_equal(numpy.array(grid.cart.allgather(torch.get_rng_state().numpy())),
                             numpy.array([torch.get_rng_state().numpy()] * grid.size))


def test_a_tile_of_another_field_is_refused(grid):
    module = thd.DistributedDropout(0.3, SHAPE, process_grid=grid)
    with pytest.raises(ValueError, match="expected this rank's tile"):
        module(torch.zeros(1, 1, SHAPE[0] + 1, SHAPE[1] + 1))


def test_without_a_shape_the_mask_is_the_serial_one_and_found_from_the_tiles(grid):
    x = torch.randn(2, 3, *SHAPE, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    lat, lon = grid.local_slices(*SHAPE)
    torch.manual_seed(11)
    y = torch.nn.Dropout(0.4)(x)
    torch.manual_seed(11)
    assert torch.equal(thd.DistributedDropout(0.4, process_grid=grid)(x[..., lat, lon]), y[..., lat, lon])


def test_without_a_shape_a_tile_that_fits_no_split_on_one_rank_raises_on_every_rank(grid):
    if grid.size == 1:
        return      # a lone tile is always the whole of some field
    from helpers import raises
    lat, lon = grid.local_slices(*SHAPE)
    # rank 0 two rows short: fewer rows than a later polar rank (or than its azimuth neighbours), which no split
    # gives (the first polar ranks hold the extra rows); one row short on the last rank would be a smaller field's
    rows = len(range(SHAPE[0])[lat]) - (2 if grid.rank == 0 else 0)
    with raises(ValueError, match="not the grid's split of one"):
        thd.DistributedDropout(0.4, process_grid=grid)(torch.zeros(1, 1, rows, len(range(SHAPE[1])[lon])))


def test_without_a_shape_a_rate_that_differs_on_the_last_rank_raises_on_every_rank(grid):
    if grid.size == 1:
        return
    from helpers import raises
    lat, lon = grid.local_slices(*SHAPE)
    p = 0.5 if grid.rank == grid.size - 1 else 0.4
    with raises(ValueError, match="disagree"):
        thd.DistributedDropout(p, process_grid=grid)(torch.zeros(1, 1, *torch.zeros(SHAPE)[lat, lon].shape))
