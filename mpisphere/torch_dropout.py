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

from . import collectives
from .agreement import Call
from .torch_layers import _grid_of

__all__ = ["DistributedDropout"]


class DistributedDropout(torch.nn.Module):
    """``torch.nn.Dropout(p)`` on ``(..., h, w)`` tiles of a ``(nlat, nlon)`` field, with the serial mask.

    Parameters
    ----------
    p : float
    shape : (int, int) or None
        ``(nlat, nlon)`` of the whole field (the mask is drawn for it); None:
        found at each call from the ranks' tile shapes (one agreement, which
        compares ``p`` too, and one small all-gather per call in training; the
        tiles must be the grid's split of one field).
    inplace : bool
        Accepted for torch's signature; the result is always a new tensor.
    process_grid : ProcessGrid, keyword-only

    Notes
    -----
    With ``shape`` given, local: no communication (the ranks' generators must
    agree, as for the serial model's other random layers). Costs the whole
    field's mask per call on every rank.
    """

    def __init__(self, p=0.5, shape=None, inplace=False, *, process_grid=None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"DistributedDropout: p must be in [0, 1], got {p}")
        if shape is not None and len(tuple(shape)) != 2:
            raise ValueError(f"DistributedDropout: shape must be the whole field's (nlat, nlon) or None, got {shape!r}")
        self.p, self.inplace = float(p), inplace
        self.shape = None if shape is None else tuple(int(v) for v in shape)
        self.process_grid = _grid_of(process_grid)

    def extra_repr(self):
        return f"p={self.p}, shape={self.shape}"

    def forward(self, x):
        """``(..., h, w)`` tile -> the tile of the serial ``Dropout``'s output on the whole field."""
        if not self.training or self.p == 0.0:
            return x
        shape = self.shape if self.shape is not None else self._whole_shape(x)
        expected = self.process_grid.local_shape(*shape)
        if tuple(x.shape[-2:]) != tuple(expected):
            raise ValueError(f"DistributedDropout: expected this rank's tile {tuple(expected)} of the {shape} "
                             f"field, got {tuple(x.shape[-2:])}")
        if self.p == 1.0:
            return x * 0.0
        whole = torch.empty(tuple(x.shape[:-2]) + shape, dtype=x.dtype, device=x.device)
        mask = whole.bernoulli_(1.0 - self.p).div_(1.0 - self.p)      # torch's own order: the same numbers
        return x * mask[(Ellipsis,) + self.process_grid.local_slices(*shape)]

    def _whole_shape(self, x):
        """``(nlat, nlon)`` of the field whose tiles the ranks hold (collective); refused unless the tiles are the
        grid's split of it."""
        pg = self.process_grid
        who = "DistributedDropout.forward"
        with pg.holding(who):
            call = Call(pg.cart, who)
            with call.local():
                if x.dim() < 2:
                    raise ValueError(f"DistributedDropout: expected a (..., h, w) tile, got shape {tuple(x.shape)}")
            call.agree(p=self.p, leading=list(x.shape[:-2]), dtype=str(x.dtype))
            tiles = collectives.allgather_object(pg.cart, (pg.polar_rank, pg.azimuth.rank, *x.shape[-2:]))
            nlat = sum(h for polar, azimuth, h, _ in tiles if azimuth == 0)
            nlon = sum(w for polar, azimuth, _, w in tiles if polar == 0)
            with call.local():
                expected = tuple(pg.local_shape(nlat, nlon))
                if tuple(x.shape[-2:]) != expected:
                    raise ValueError(f"DistributedDropout: the ranks' tiles are not the grid's split of one "
                                     f"{(nlat, nlon)} field: this rank's should be {expected}, got "
                                     f"{tuple(x.shape[-2:])}")
            call.agree()
        return (nlat, nlon)
