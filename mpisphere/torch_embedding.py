"""Position embeddings of the sphere for tiles (the ``torch`` extra): a serial embedding module, distributed.

torch-harmonics' example models add a position embedding over the whole grid
(``position_embeddings``, ``(1, C, nlat, nlon)`` or ``(1, C, nlat, 1)``): a
fixed buffer (the sequence and spectral embeddings; the spectral one is
normalised by its maximum over the sphere) or a learnable parameter.
``DistributedPositionEmbedding(embedding)`` keeps the serial module's
tensor whole, under the same name (a serial ``state_dict`` loads, and its
own loads into a serial model), and adds this rank's tile of it; a learnable
embedding's gradient is the whole sphere's on every rank (each rank's tile
of it, summed over the grid in one ``Allreduce``). Whatever the serial module
computed over the whole sphere (the spectral embedding's maximum) is
therefore the whole sphere's.
"""

import numpy
import torch

from .agreement import Call
from .operators.parametrised import sum_parts
from .torch_layers import _grid_of

__all__ = ["DistributedPositionEmbedding"]


class _AddTile(torch.autograd.Function):
    """``x + whole[..., rows, columns]``; the backward sums the tile's gradient into the whole tensor's, over the
    grid."""

    @staticmethod
    def forward(ctx, x, whole, module):
        ctx.module, ctx.shape = module, whole.shape
        return x + whole[module._index(whole)]

    @staticmethod
    def backward(ctx, grad):
        module = ctx.module
        local = numpy.zeros(tuple(ctx.shape))
        part = grad.sum(dim=0, keepdim=True)
        if ctx.shape[-1] == 1:
            part = part.sum(dim=-1, keepdim=True)
        local[module._index(local)] = part.detach().cpu().double().numpy()
        whole = torch.from_numpy(module._summed(local)).to(grad.device, grad.dtype)
        return grad, whole, None


class DistributedPositionEmbedding(torch.nn.Module):
    """A serial position embedding (``x + position_embeddings``) on ``(B, C, h, w)`` tiles.

    Parameters
    ----------
    embedding : torch.nn.Module
        The serial module: its ``position_embeddings`` (a buffer or a parameter, ``(1, C, nlat, nlon)`` or
        ``(1, C, nlat, 1)``) and ``img_shape`` ``(nlat, nlon)``; it is left unchanged.
    process_grid : ProcessGrid, keyword-only
    """

    mpisphere_sums_own_gradients = True  # (torch_replicate.SUMS_OWN_GRADIENTS) its backward sums them

    def __init__(self, embedding, *, process_grid=None):
        super().__init__()
        self.process_grid = _grid_of(process_grid)
        self.img_shape = tuple(embedding.img_shape)
        self.num_chans = getattr(embedding, "num_chans", None)
        self.grid = getattr(embedding, "grid", None)
        values = embedding.position_embeddings
        if values.dim() != 4 or tuple(values.shape[-2:]) not in (self.img_shape, (self.img_shape[0], 1)):
            raise ValueError(f"DistributedPositionEmbedding: position_embeddings must be (1, C, nlat, nlon) or "
                             f"(1, C, nlat, 1) of img_shape {self.img_shape}, got {tuple(values.shape)}")
        self._rows, self._columns = self.process_grid.local_slices(*self.img_shape)
        if isinstance(values, torch.nn.Parameter):
            self.position_embeddings = torch.nn.Parameter(values.detach().clone())
        else:
            persistent = "position_embeddings" not in getattr(embedding, "_non_persistent_buffers_set", set())
            self.register_buffer("position_embeddings", values.detach().clone(), persistent=persistent)

    def _summed(self, local):
        """``local`` (this rank's part of the embedding's gradient, host float64) summed over the grid, agreed."""
        call = Call(self.process_grid.cart, f"{type(self).__name__}.backward")
        call.agree(f"position embedding gradient {local.shape}")
        return sum_parts(self.process_grid.cart, [local])[0]

    def _index(self, whole):
        columns = slice(None) if whole.shape[-1] == 1 else self._columns
        return (Ellipsis, self._rows, columns)

    def forward(self, x):
        """``(B, C, h, w)`` tile -> the tile plus this rank's tile of the embedding."""
        values = self.position_embeddings
        if isinstance(values, torch.nn.Parameter) and torch.is_grad_enabled():
            return _AddTile.apply(x, values, self)
        return x + values[self._index(values)]
