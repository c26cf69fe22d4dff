"""Bilinear interpolation of distributed fields to scattered points, with its adjoint (an observation operator).

A point at latitude ``lat``, longitude ``lon`` lies in the cell whose
north-west corner is grid point ``(i, j)``: ring ``i`` is the last ring at or
north of it, column ``j`` the last column at or west of it. The rank whose
tile holds ``(i, j)`` owns the point; the other three corners may sit on
its southern and eastern neighbours, so the values come through a
one-row, one-column :class:`~mpisphere.HaloExchange`. Interpolation is
bilinear in colatitude and longitude (periodic). Points poleward of the
outermost rings (the polar caps of a Gauss grid) have no enclosing cell and
are refused.
"""

import math

import numpy

from . import backend, dtypes
from .agreement import agree_construction
from .halo import HaloExchange
from .operators import DISTRIBUTED, FORWARD, InputError, Layout, LinearOperator
from .validation import check_int
from .quadrature import latitudes, rule

__all__ = ["PointInterpolation"]


class PointInterpolation(LinearOperator):
    """Values of distributed tiles at scattered points; the adjoint spreads point values back onto the tiles.

    Parameters
    ----------
    grid : ProcessGrid
    nlat, nlon : int
        The global grid of the fields.
    lats, lons : array_like, shape ``(npoints,)``
        The points, in radians (latitude north positive, longitude east of
        0, any range: taken modulo ``2 pi``). The same on every rank (checked
        at construction; a rank that differs raises on every rank).
    quadrature : str, keyword-only
        The latitude rule of the grid (``equiangular``, ``legendre-gauss``,
        ``lobatto``).

    Attributes
    ----------
    indices : ndarray of int
        Which of the points this rank owns, in increasing order: entry ``k``
        of this rank's output is point ``indices[k]``.

    Notes
    -----
    ``forward``: this rank's tile ``(..., h, w)`` -> its points' values
    ``(..., len(indices))``; ``adjoint``: point values -> a tile holding
    their bilinear spread, summed over every rank's points. Both
    distributed over ``grid.cart``; collective.

    Construction is collective over ``grid.cart``: the ranks compare every
    argument, the points by a hash of their bytes (so two different point
    sets never pass as one, and identical sets with NaNs in them are the same).

    Raises
    ------
    ValueError
        On every rank: points that differ between ranks (naming the ranks
        and what each passed), a point that is not finite or lies poleward of
        the outermost latitude ring, an unknown quadrature.
    TypeError
        ``nlat`` or ``nlon`` that is not an integer.
    """

    def __init__(self, grid, nlat, nlon, lats, lons, *, quadrature="equiangular"):
        who = "PointInterpolation"
        if not (hasattr(grid, "cart") and hasattr(grid, "local_slices")):
            raise TypeError(f"{who}: grid must be a ProcessGrid, got {type(grid).__name__}")
        # the points decide which rank owns what: every rank must pass the same (compared by their bytes)
        agree_construction(self, grid.cart, who=who)
        self.grid = grid
        self.nlat = check_int(nlat, "nlat", who, minimum=2)
        self.nlon = check_int(nlon, "nlon", who, minimum=1)
        try:
            self.quadrature = rule(quadrature).name
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
        lats = numpy.asarray(lats, dtype=numpy.float64).reshape(-1)
        lons = numpy.asarray(lons, dtype=numpy.float64).reshape(-1)
        if lons.shape != lats.shape:
            raise ValueError(f"{who}: lats and lons differ in length: {lats.size} and {lons.size}")
        self.npoints = lats.size
        bad = numpy.flatnonzero(~(numpy.isfinite(lats) & numpy.isfinite(lons)))
        if bad.size:
            raise ValueError(f"{who}: {bad.size} of {lats.size} points are not finite (first: point {bad[0]}, "
                             f"lat {lats[bad[0]]}, lon {lons[bad[0]]})")
        theta, _ = latitudes(self.nlat, self.quadrature)
        colat = 0.5 * math.pi - lats
        outside = (colat < theta[0]) | (colat > theta[-1])
        if outside.any():
            raise ValueError(f"{who}: {int(outside.sum())} of {lats.size} points lie poleward of the outermost "
                             f"latitude rings ({90 - math.degrees(theta[0]):.4f} and "
                             f"{90 - math.degrees(theta[-1]):.4f} degrees on this {self.quadrature} grid); "
                             "there is no enclosing cell to interpolate in")

        i = numpy.clip(numpy.searchsorted(theta, colat, side="right") - 1, 0, self.nlat - 2)
        fy = (colat - theta[i]) / (theta[i + 1] - theta[i])
        position = numpy.mod(lons, 2 * math.pi) * self.nlon / (2 * math.pi)
        j = numpy.minimum(numpy.floor(position).astype(numpy.int64), self.nlon - 1)
        fx = position - j
        lat, lon = grid.local_slices(self.nlat, self.nlon)
        mine = (i >= lat.start) & (i < lat.stop) & (j >= lon.start) & (j < lon.stop)
        self.indices = numpy.flatnonzero(mine)
        # rows and columns in the padded tile (one halo row and column on each side)
        r = i[mine] - lat.start + 1
        c = j[mine] - lon.start + 1
        fy, fx = fy[mine], fx[mine]
        self._rows = numpy.stack([r, r, r + 1, r + 1])
        self._cols = numpy.stack([c, c + 1, c, c + 1])
        self._weights = numpy.stack([(1 - fy) * (1 - fx), (1 - fy) * fx, fy * (1 - fx), fy * fx])
        self.halo = HaloExchange(grid, rows=1, cols=1, extents=(self.nlat, self.nlon))
        self.tile = grid.local_shape(self.nlat, self.nlon)
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart

    def _output(self, direction, spec):
        if dtypes.refusal(spec.dtype, "real field"):
            raise InputError(f"expected real fields: {dtypes.refusal(spec.dtype, 'real field')}", TypeError)
        if direction == FORWARD:
            if spec.shape[-2:] != self.tile:
                raise InputError(f"expected this rank's tile (..., {self.tile[0]}, {self.tile[1]}), got shape "
                                 f"{spec.shape}")
            return spec.but(shape=spec.shape[:-2] + (self.indices.size,)), spec.describe(masked=(-2, -1))
        if spec.shape[-1:] != (self.indices.size,):
            raise InputError(f"expected the values at this rank's {self.indices.size} points (..., "
                             f"{self.indices.size}), got shape {spec.shape}")
        return spec.but(shape=spec.shape[:-1] + self.tile), spec.describe(masked=(-1,))

    def _shapes(self, lead):
        return lead + self.tile, lead + (self.indices.size,)

    def _run(self, direction, x, out, context):
        xp = backend.array_module(x)
        rows, cols, weights = (xp.asarray(a) for a in (self._rows, self._cols, self._weights))
        if direction == FORWARD:
            padded = self.halo.forward(x)  # the halo agrees with its neighbours, in its own messages
            out[...] = xp.sum(padded[..., rows, cols] * weights.astype(x.dtype), axis=-2)
            return
        padded = xp.zeros(x.shape[:-1] + (self.tile[0] + 2, self.tile[1] + 2), dtype=x.dtype)
        flat = padded.reshape(x.shape[:-1] + (-1,))
        index = (rows * (self.tile[1] + 2) + cols).reshape(-1)
        spread = (x[..., None, :] * weights.astype(x.dtype)).reshape(x.shape[:-1] + (-1,))
        for lead in numpy.ndindex(*x.shape[:-1]):
            xp.add.at(flat[lead], index, spread[lead])  # points that share a corner add up
        self.halo.adjoint(padded, out=out)
