"""Element dropout on tiles with the serial model's mask (the ``torch`` extra).

``torch.nn.Dropout`` draws one Bernoulli number per element of its input: on
a tile it would draw a tile's worth, a different mask from the serial
model's, and every rank's from the same random numbers. ``DistributedDropout``
draws the whole field's mask as the serial module does (the same generator
calls, so the same numbers for the same seed) and keeps this rank's tile of
it: the distributed model drops exactly the serial model's elements. Masks
that do not depend on the points need nothing of the kind and run on tiles
as they are: ``torch.nn.Dropout2d`` (one number per field and channel) and
the examples' ``DropPath`` (one per field), provided every rank's generator
is in the same state (the same seed on every rank, and the same draws
since).
"""

import torch

from .torch_layers import _grid_of

__all__ = ["DistributedDropout"]


class DistributedDropout(torch.nn.Module):
    """``torch.nn.Dropout(p)`` on ``(..., h, w)`` tiles of a ``(nlat, nlon)`` field, with the serial mask.

    Parameters
    ----------
    p : float
    shape : (int, int)
        ``(nlat, nlon)`` of the whole field (the mask is drawn for it).
    inplace : bool
        Accepted for torch's signature; the result is always a new tensor.
    process_grid : ProcessGrid, keyword-only

    Notes
    -----
    Local: no communication (the ranks' generators must agree, as for the
    serial model's other random layers). Costs the whole field's mask per
    call on every rank.
    """

    def __init__(self, p=0.5, shape=None, inplace=False, *, process_grid=None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"DistributedDropout: p must be in [0, 1], got {p}")
        if shape is None or len(tuple(shape)) != 2:
            raise ValueError(f"DistributedDropout: shape must be the whole field's (nlat, nlon), got {shape!r}")
        self.p, self.inplace, self.shape = float(p), inplace, tuple(int(v) for v in shape)
        self.process_grid = _grid_of(process_grid)
        self._slices = self.process_grid.local_slices(*self.shape)

    def extra_repr(self):
        return f"p={self.p}, shape={self.shape}"

    def forward(self, x):
        """``(..., h, w)`` tile -> the tile of the serial ``Dropout``'s output on the whole field."""
        if not self.training or self.p == 0.0:
            return x
        expected = self.process_grid.local_shape(*self.shape)
        if tuple(x.shape[-2:]) != tuple(expected):
            raise ValueError(f"DistributedDropout: expected this rank's tile {tuple(expected)} of the {self.shape} "
                             f"field, got {tuple(x.shape[-2:])}")
        if self.p == 1.0:
            return x * 0.0
        whole = torch.empty(tuple(x.shape[:-2]) + self.shape, dtype=x.dtype, device=x.device)
        mask = whole.bernoulli_(1.0 - self.p).div_(1.0 - self.p)      # torch's own order: the same numbers
        return x * mask[(Ellipsis,) + self._slices]
