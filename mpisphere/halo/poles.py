"""What lies past the poles: the boundaries of a halo exchange, one class each.

``ZeroPoles`` (``poles="zero"``, the default) leaves zeros there.
``AcrossPoles`` (``poles="across"``) continues the field: the halo
row at distance ``k`` past a pole mirrors the row at the same colatitude
distance inside it, at the opposite longitude (``+ 180`` degrees), times a
sign per field. Which rows those are comes from the
grid's latitudes: on a grid whose outermost rows are the poles (equiangular,
Lobatto) the pole row itself is not repeated. The rows belong to the ranks
of the first (last) polar row that hold the opposite longitudes: those
ranks gather them over ``grid.azimuth`` (``Allgatherv``; the adjoint sums
them back with ``Reduce_scatter``).
"""

import math

import numpy

from .. import backend
from ..operators import ADJOINT, FORWARD
from ..primitives import GatherFromCopyTo
from ..quadrature import latitudes, rule

__all__ = ["ZeroPoles", "AcrossPoles"]

_POLE_TOLERANCE = 1e-12  # a colatitude this close to 0 or pi is a pole row


class ZeroPoles:
    """Zeros past the poles: the halo rows of the first and last polar ranks are zeroed, and dropped going home.

    A boundary has ``collective`` (whether a call must agree over the whole
    grid before it runs: it communicates beyond the four neighbours),
    :meth:`check` (this rank's input), :meth:`fill` (after the neighbours'
    phases of a gathering call) and :meth:`give_back` (before those of an
    accumulating call).
    """

    collective = False
    quadrature = None

    def __init__(self, grid, rows):
        self.rows = rows
        self.north = rows > 0 and grid.polar_rank == 0
        self.south = rows > 0 and grid.polar_rank == grid.npolar - 1

    def check(self, shape):
        return None

    def blocks(self, h, W):
        """The halo rows past a pole of a tile of ``h`` rows and ``W`` padded columns (none on the inner polar
        ranks)."""
        r, full = self.rows, slice(0, W)
        return (((slice(0, r), full),) if self.north else ()) + (((slice(r + h, h + 2 * r), full),) if self.south
                                                                 else ())

    def fill(self, P, h, w, context):
        """Zero the halo rows past a pole."""
        for block in self.blocks(h, P.shape[-1]):
            P[(Ellipsis,) + block] = 0

    def give_back(self, P, h, w, context):
        """Nothing goes home from past a pole (the halo is zeroed at the end of the call)."""


class AcrossPoles:
    """The field continued across the poles: checks, indices, fill and give back (its adjoint).

    Parameters
    ----------
    grid : ProcessGrid
    rows, cols : int
        The exchange's halo widths.
    extents : (int, int) or None
        Global ``(nlat, nlon)`` (required).
    quadrature : str or None
        The latitude rule (required): whether the outermost rows are the poles.
    signs : ndarray or None
        The factor of each field (axis ``-3``) as it crosses a pole.
    who : str
        The exchange's name, for messages.

    Notes
    -----
    Built identically on every rank (no message). ``active`` is False for
    an exchange of zero rows: nothing lies past the poles to fill. Its
    calls gather over ``grid.azimuth``, so they agree over the whole grid
    first (``collective``).
    """

    collective = True

    def __init__(self, grid, rows, cols, extents, quadrature, signs, who):
        if extents is None:
            raise ValueError(f"{who}: poles='across' needs extents=(nlat, nlon): the rows past a pole "
                             "come from the opposite longitudes, which only the global grid locates")
        if quadrature is None:
            raise ValueError(f"{who}: poles='across' needs quadrature= (e.g. 'equiangular', "
                             "'legendre-gauss', as the transforms take it): the row at a given distance past a pole "
                             "depends on whether the outermost rows are the poles")
        nlat, nlon = extents
        try:
            self.quadrature = rule(quadrature).name
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
        theta, _ = latitudes(nlat, self.quadrature)
        self.grid, self.rows, self.cols, self.extents, self.signs = grid, rows, cols, extents, signs
        # a pole row is not mirrored onto itself: the rows past it start one further in
        self.shift = (int(abs(theta[0]) < _POLE_TOLERANCE), int(abs(theta[-1] - math.pi) < _POLE_TOLERANCE))
        self.active = rows > 0
        if not self.active:
            return
        if nlon % 2:
            raise ValueError(f"{who}: poles='across' needs an even nlon (the longitude half way round "
                             f"must be a grid column), got nlon={nlon}")
        sizes = grid.lat_sizes(nlat)
        north, south = rows + self.shift[0], rows + self.shift[1]
        if north > sizes[0] or south > sizes[-1]:
            raise ValueError(f"{who}: poles='across' takes the {rows} rows nearest each pole "
                             f"({'not counting the pole rows, ' if any(self.shift) else ''}on this "
                             f"{self.quadrature} grid) from the first and last polar tiles, which have {sizes[0]} "
                             f"and {sizes[-1]} rows (nlat={nlat} split as {sizes}); use fewer halo rows or fewer "
                             "polar ranks")
        _, lon = grid.local_slices(nlat, nlon)
        # global columns of the padded tile, moved half way round
        self.opposite = (numpy.arange(lon.start - cols, lon.stop + cols) + nlon // 2) % nlon
        self.band = GatherFromCopyTo(grid.azimuth, -1, nlon)

    def pole_rows(self, h):
        """``[(halo rows, nearest rows)]`` in padded coordinates, for the poles this rank's tiles touch.

        The nearest rows leave out a pole row (``shift``): the halo row at
        distance ``k`` past the pole mirrors the row at distance ``k`` inside it.
        """
        r, g = self.rows, self.grid
        north, south = self.shift
        found = []
        if g.polar_rank == 0:
            found.append((slice(0, r), slice(r + north, 2 * r + north)))
        if g.polar_rank == g.npolar - 1:
            found.append((slice(r + h, 2 * r + h), slice(h - south, h + r - south)))
        return found

    def _signs(self, P):
        if self.signs is None:
            return 1
        xp = backend.array_module(P)
        return xp.asarray(self.signs, dtype=P.dtype).reshape(-1, 1, 1)

    def check(self, shape):
        """Why an input of ``shape`` cannot cross the poles (one sign per field on axis -3), or None."""
        if self.signs is not None and (len(shape) < 3 or shape[-3] != self.signs.size):
            return (f"signs has {self.signs.size} entries, one per field on axis -3, but the input has "
                    f"shape {shape}")
        return None

    def fill(self, P, h, w, context):
        """Fill the rows past the poles from the rows nearest them, half way round (after the neighbours' phase)."""
        poles = self.pole_rows(h) if self.active else None
        if not poles:
            return
        xp, c = backend.array_module(P), self.cols
        band = xp.stack([P[..., near, c:c + w] for _, near in poles], axis=-3)   # (..., poles, r, w)
        whole = xp.empty(band.shape[:-1] + (self.extents[1],), dtype=P.dtype)
        self.band.run_agreed(FORWARD, band, whole, context)                           # (..., poles, r, nlon)
        opposite = xp.asarray(self.opposite)
        signs = self._signs(P)
        for k, (halo, _) in enumerate(poles):
            # halo row i lies as far past the pole as row r - 1 - i of the band lies inside it
            P[..., halo, :] = signs * xp.take(whole[..., k, ::-1, :], opposite, axis=-1)

    def give_back(self, P, h, w, context):
        """The adjoint of :meth:`fill`: the rows past the poles go home and are added; zeroed."""
        poles = self.pole_rows(h) if self.active else None
        if not poles:
            return
        xp, c, nlon = backend.array_module(P), self.cols, self.extents[1]
        whole = xp.zeros(P.shape[:-2] + (len(poles), self.rows, nlon), dtype=P.dtype)
        signs = self._signs(P)
        for k, (halo, _) in enumerate(poles):
            values = (signs * P[..., halo, :])[..., ::-1, :]
            target = whole[..., k, :, :]
            # the opposite columns run in at most a few unbroken stretches (they wrap round at nlon)
            breaks = numpy.flatnonzero(numpy.diff(self.opposite) != 1) + 1
            for a, b in zip(numpy.r_[0, breaks], numpy.r_[breaks, self.opposite.size]):
                start = int(self.opposite[a])
                target[..., start:start + (b - a)] += values[..., a:b]
            P[..., halo, :] = 0
        band = xp.empty(whole.shape[:-1] + (w,), dtype=P.dtype)
        self.band.run_agreed(ADJOINT, whole, band, context)
        for k, (_, near) in enumerate(poles):
            P[..., near, c:c + w] += band[..., k, :, :]
