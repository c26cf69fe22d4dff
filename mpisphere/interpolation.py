"""Bilinear interpolation of distributed fields to scattered points, with its adjoint (an observation operator).

One operator, :class:`PointInterpolation`, for every kind of grid: it takes
the grid's tiling (``grid.tiling(nlat, nlon)``, or the
:class:`~mpisphere.RingTiles` of a ring grid) and runs the stencil of that
kind:

* **rectangular tiles** (``_TileStencil``): a point at latitude ``lat``,
  longitude ``lon`` lies in the cell whose north-west corner is grid point
  ``(i, j)``: ring ``i`` the last ring at or north of it, column ``j`` the
  last column at or west of it. The rank whose tile holds ``(i, j)`` owns
  the point; the other three corners may sit on its southern and eastern
  neighbours, so the values come through a one-row, one-column
  :class:`~mpisphere.HaloExchange` (neighbours only, however many ranks).
  Bilinear in colatitude and longitude (periodic).
* **rings** (``_RingStencil``): the point lies between ring ``i`` and ring
  ``i + 1``; on each the value is interpolated linearly between the two
  points of that ring around its longitude, then linearly in colatitude
  between the rings. Rings have no halos: the four values come from their
  owners in one ``Alltoallv`` (each needed value once), and the adjoint
  sends the weighted point values back in another.

Points poleward of the outermost rings (the polar caps of a Gauss grid) have
no enclosing cell and are refused.
"""

import math

import numpy

from . import backend, collectives, dtypes
from .agreement import agree_construction
from .halo import HaloExchange
from .operators import DISTRIBUTED, FORWARD, InputError, Layout, LinearOperator
from .partition import offsets_of, split_sizes
from .quadrature import latitudes, rule
from .rings import RingGeometry
from .tiling import Tiling
from .validation import check_int, is_process_grid

__all__ = ["PointInterpolation"]


class PointInterpolation(LinearOperator):
    """Values of distributed fields at scattered points; the adjoint spreads point values back onto the fields.

    ``PointInterpolation(tiling, lats, lons)``, or for a regular grid
    ``PointInterpolation(grid, nlat, nlon, lats, lons)``.

    Parameters
    ----------
    tiling : Tiling
        The grid of the fields, as its ranks hold it: ``grid.tiling(nlat,
        nlon)`` (rectangular tiles ``(..., h, w)``) or ``RingTiles(grid,
        rings)`` (this rank's points of a ring grid, ``(..., npoints)``).
    grid : ProcessGrid
        With ``nlat, nlon``: the same as ``grid.tiling(nlat, nlon)``.
    nlat, nlon : int
        The global extents of a regular grid.
    lats, lons : array_like, shape ``(npoints,)``
        The points, in radians (latitude north positive, longitude east of
        0, any range: taken modulo ``2 pi``). The same on every rank (checked
        at construction; a rank that differs raises on every rank).
    quadrature : str, keyword-only
        The latitude rule of a regular grid (``equiangular``,
        ``legendre-gauss``, ``lobatto``); rings carry their own latitudes.

    Attributes
    ----------
    indices : ndarray of int
        Which of the points this rank owns, in increasing order: entry ``k``
        of this rank's output is point ``indices[k]``.
    tiling : Tiling
    tile : tuple of int
        The trailing shape of this rank's part of a field.

    Notes
    -----
    ``forward``: this rank's part ``(..., *tile)`` -> its points' values
    ``(..., len(indices))``; ``adjoint``: point values -> the part holding
    their bilinear spread, summed over every rank's points. Both
    distributed over ``grid.cart``; collective.

    Construction is collective over ``grid.cart``: the ranks compare every
    argument, the points by a hash of their bytes (so two different point
    sets never pass as one, and identical sets with NaNs in them are the same).
    ``PointInterpolation(grid, rings, None, lats, lons)`` (a
    :class:`~mpisphere.RingGeometry` in place of ``nlat``, deprecated in
    0.4.0) is refused since 0.4.3: pass ``RingTiles(grid, rings)``.

    Raises
    ------
    ValueError
        On every rank: points that differ between ranks (naming the ranks
        and what each passed), a point that is not finite or lies poleward of
        the outermost latitude ring, an unknown quadrature.
    TypeError
        ``nlat`` or ``nlon`` that is not an integer, arguments of no form above.
    """

    def __init__(self, grid, *args, quadrature="equiangular"):
        who = "PointInterpolation"
        tiling, lats, lons = _tiling_and_points(who, grid, args, quadrature)
        grid = tiling.grid
        # what the ranks compare: the tiling's points by value, the points by their bytes, the latitude rule
        self._arguments_are(grid=grid, tiling=tiling.description(), lats=lats, lons=lons, quadrature=quadrature)
        # the points decide which rank owns what: every rank must pass the same (compared by their bytes)
        agree_construction(self, grid.cart, who=who)
        self.grid, self.tiling = grid, tiling
        lats, lons = _check_points(who, lats, lons)
        self.npoints = lats.size
        self.stencil = tiling.stencil(_STENCILS, who, quadrature, lats, lons)  # the tiling names its kind's stencil
        self.__dict__.update(self.stencil.attributes)  # the attributes of the last releases (halo, rings, ...)
        self.indices = self.stencil.indices
        self.tile = tuple(tiling.local_shape())
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart

    def _output(self, direction, spec):
        if dtypes.refusal(spec.dtype, "real field"):
            raise InputError(f"expected real fields: {dtypes.refusal(spec.dtype, 'real field')}", TypeError)
        grid_axes = len(self.tile)
        if direction == FORWARD:
            if spec.shape[len(spec.shape) - grid_axes:] != self.tile:
                raise InputError(f"expected this rank's {self.stencil.holds}, got shape {spec.shape}")
            return spec.but(shape=spec.shape[:len(spec.shape) - grid_axes] + (self.indices.size,)), \
                spec.describe(masked=range(-grid_axes, 0))
        if spec.shape[-1:] != (self.indices.size,):
            raise InputError(f"expected the values at this rank's {self.indices.size} points (..., "
                             f"{self.indices.size}), got shape {spec.shape}")
        return spec.but(shape=spec.shape[:-1] + self.tile), spec.describe(masked=(-1,))

    def _shapes(self, lead):
        return lead + self.tile, lead + (self.indices.size,)

    def _run(self, direction, x, out, context):
        self.stencil.run(direction, x, out, context)


def _tiling_and_points(who, grid, args, quadrature):
    """``(tiling, lats, lons)`` from the forms ``(tiling, lats, lons)`` and ``(grid, nlat, nlon, lats, lons)``."""
    if isinstance(grid, Tiling):
        if len(args) != 2:
            raise TypeError(f"{who}(tiling, lats, lons): expected the points after the tiling, got {len(args)} "
                            "more arguments")
        return (grid,) + tuple(args)
    if not is_process_grid(grid):
        raise TypeError(f"{who}: the first argument must be a tiling (grid.tiling(nlat, nlon), RingTiles) or a "
                        f"ProcessGrid, got {type(grid).__name__}")
    if len(args) != 4:
        raise TypeError(f"{who}(grid, nlat, nlon, lats, lons): expected four arguments after the grid, got "
                        f"{len(args)}")
    nlat, nlon, lats, lons = args
    if isinstance(nlat, RingGeometry):
        raise TypeError(f"{who}(grid, rings, None, lats, lons) was removed in 0.4.3 (deprecated since 0.4.0): pass "
                        "the grid's tiling, PointInterpolation(RingTiles(grid, rings), lats, lons)")
    nlat = check_int(nlat, "nlat", who, minimum=2)
    nlon = check_int(nlon, "nlon", who, minimum=1)
    return grid.tiling(nlat, nlon), lats, lons


def _check_points(who, lats, lons):
    """The points as flat float64 arrays; a ValueError for lengths that differ or values that are not finite."""
    lats = numpy.asarray(lats, dtype=numpy.float64).reshape(-1)
    lons = numpy.asarray(lons, dtype=numpy.float64).reshape(-1)
    if lons.shape != lats.shape:
        raise ValueError(f"{who}: lats and lons differ in length: {lats.size} and {lons.size}")
    bad = numpy.flatnonzero(~(numpy.isfinite(lats) & numpy.isfinite(lons)))
    if bad.size:
        raise ValueError(f"{who}: {bad.size} of {lats.size} points are not finite (first: point {bad[0]}, "
                         f"lat {lats[bad[0]]}, lon {lons[bad[0]]})")
    return lats, lons


def _refuse_the_caps(who, theta, colat, where, rings="rings"):
    outside = (colat < theta[0]) | (colat > theta[-1])
    if outside.any():
        raise ValueError(f"{who}: {int(outside.sum())} of {colat.size} points lie poleward of the outermost "
                         f"{rings} ({90 - math.degrees(theta[0]):.4f} and "
                         f"{90 - math.degrees(theta[-1]):.4f} degrees on {where}); there is no enclosing cell to "
                         "interpolate in")


class _TileStencil:
    """Rectangular tiles: the four corners of a point's cell through a one-row, one-column halo."""

    def __init__(self, who, tiling, quadrature, lats, lons):
        try:
            quadrature = rule(quadrature).name
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
        grid = tiling.grid
        nlat, nlon = tiling.whole
        theta, _ = latitudes(nlat, quadrature)
        colat = 0.5 * math.pi - lats
        _refuse_the_caps(who, theta, colat, f"this {quadrature} grid", "latitude rings")
        i = numpy.clip(numpy.searchsorted(theta, colat, side="right") - 1, 0, nlat - 2)
        fy = (colat - theta[i]) / (theta[i + 1] - theta[i])
        position = numpy.mod(lons, 2 * math.pi) * nlon / (2 * math.pi)
        j = numpy.minimum(numpy.floor(position).astype(numpy.int64), nlon - 1)
        fx = position - j
        lat, lon = tiling.slices()
        mine = (i >= lat.start) & (i < lat.stop) & (j >= lon.start) & (j < lon.stop)
        self.indices = numpy.flatnonzero(mine)
        # rows and columns in the padded tile (one halo row and column on each side)
        r = i[mine] - lat.start + 1
        c = j[mine] - lon.start + 1
        fy, fx = fy[mine], fx[mine]
        self._rows = numpy.stack([r, r, r + 1, r + 1])
        self._cols = numpy.stack([c, c + 1, c, c + 1])
        self._weights = numpy.stack([(1 - fy) * (1 - fx), (1 - fy) * fx, fy * (1 - fx), fy * fx])
        self.halo = HaloExchange(grid, rows=1, cols=1, extents=(nlat, nlon))
        self.tile = tuple(tiling.local_shape())
        self.holds = f"tile (..., {self.tile[0]}, {self.tile[1]})"
        self.attributes = {"quadrature": quadrature, "nlat": nlat, "nlon": nlon, "halo": self.halo}

    def run(self, direction, x, out, context):
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


class _RingStencil:
    """Rings: the two points around a point's longitude on the rings north and south of it, in one Alltoallv."""

    def __init__(self, who, tiles, lats, lons):
        grid, rings = tiles.grid, tiles.rings
        self.grid, self.rings, self.tiles = grid, rings, tiles
        self.attributes = {"tiles": tiles, "rings": rings}
        theta = rings.theta
        colat = 0.5 * math.pi - lats
        _refuse_the_caps(who, theta, colat, rings.name)
        i = numpy.clip(numpy.searchsorted(theta, colat, side="right") - 1, 0, rings.nrings - 2)
        fy = (colat - theta[i]) / (theta[i + 1] - theta[i])
        corners, weights = [], []
        for ring, wy in ((i, 1 - fy), (i + 1, fy)):  # on each ring: the points at or west and east of lon
            n = rings.nlon[ring]
            position = numpy.mod(lons - rings.phi0[ring], 2 * math.pi) * n / (2 * math.pi)
            k = numpy.minimum(numpy.floor(position).astype(numpy.int64), n - 1)
            fx = position - k
            corners += [(ring, k), (ring, (k + 1) % n)]
            weights += [wy * (1 - fx), wy * fx]
        before = self._ring_starts_on_ranks()
        owner_of = [self._owner(ring, k, before) for ring, k in corners]   # (rank, local index) of every corner
        owners = owner_of[0][0]                                    # a point belongs to its north-west corner's rank
        self.indices = numpy.flatnonzero(owners == grid.rank)
        # what each rank needs from each other: the distinct local indices, per (requester, source)
        self._needs = {}
        for r in range(grid.size):
            theirs = owners == r
            for q in range(grid.size):
                wanted = numpy.unique(numpy.concatenate([local[theirs & (rank == q)] for rank, local in owner_of]))
                self._needs[r, q] = wanted
        me = grid.rank
        self._send = [self._needs[r, me] for r in range(grid.size)]            # what I send to each rank
        received = [self._needs[me, q] for q in range(grid.size)]              # what I get from each rank
        self._recv_offsets = offsets_of([len(v) for v in received])
        gathered = {}  # (source rank, local index) -> position among the values I receive
        for q, values in enumerate(received):
            for at, local in enumerate(values.tolist()):
                gathered[q, local] = self._recv_offsets[q] + at
        self._nreceived = sum(len(v) for v in received)
        mine = self.indices
        self._positions = numpy.array([[gathered[q, loc] for q, loc in zip(rank[mine].tolist(), local[mine].tolist())]
                                       for rank, local in owner_of], dtype=numpy.int64).reshape(4, mine.size)
        self._weights = numpy.stack([w[mine] for w in weights])
        self._workspace = backend.Workspace()  # the exchanges' buffers, and their host copies where staged
        self._device = {}                       # index arrays and weights uploaded once per device
        self._comm = grid.cart
        self.holds = f"points (..., {tiles.npoints}) of {rings.name}"

    def _ring_starts_on_ranks(self):
        """``(nrings, nazimuth)``: where each ring starts among the points of its polar rank's azimuth rank ``a``."""
        grid, tiles = self.grid, self.tiles
        before = numpy.zeros((self.rings.nrings, grid.nazimuth), dtype=numpy.int64)
        for a in range(grid.nazimuth):
            sizes = numpy.array([split_sizes(int(m), grid.nazimuth)[a] for m in self.rings.nlon])
            for p in range(grid.npolar):
                run = tiles.rings_of(p)
                before[run, a] = numpy.concatenate([[0], numpy.cumsum(sizes[run])[:-1]])
        return before

    def _owner(self, ring, k, before):
        """``(grid rank, local index)`` of point ``k`` of ring ``ring`` (arrays), from the split alone."""
        grid = self.grid
        polar = numpy.searchsorted(numpy.asarray(offsets_of(self.tiles.ring_counts)), ring, side="right") - 1
        n = self.rings.nlon[ring]
        # each ring's longitudes: split_sizes(n) over the azimuth ranks; the first n % nazimuth chunks one longer
        base, extra = n // grid.nazimuth, n % grid.nazimuth
        long_end = extra * (base + 1)
        azimuth = numpy.where(k < long_end, k // (base + 1), extra + (k - long_end) // numpy.maximum(base, 1))
        start_in_ring = numpy.where(azimuth < extra, azimuth * (base + 1), long_end + (azimuth - extra) * base)
        return polar * grid.nazimuth + azimuth, before[ring, azimuth] + k - start_in_ring

    def _exchange(self, widths, fill, recv_widths, batch, like, staged):
        """One Alltoallv of ``(batch, width)`` blocks, one per rank, in the stencil's kept buffers.

        ``fill(q, block)`` writes the block for rank ``q``; returns the
        blocks received from each rank (views of the receive buffer).
        """
        send_counts, recv_counts = [batch * w for w in widths], [batch * w for w in recv_widths]
        send = self._workspace.scratch("send", like, sum(send_counts))
        for q, (start, count) in enumerate(zip(offsets_of(send_counts), send_counts)):
            fill(q, send[start:start + count].reshape(batch, widths[q]))
        recv = self._workspace.scratch("recv", like, sum(recv_counts))
        collectives.alltoallv(self._comm, send, send_counts, offsets_of(send_counts), recv, recv_counts,
                              offsets_of(recv_counts), staged=staged, workspace=self._workspace)
        return [recv[start:start + count].reshape(batch, w)
                for start, count, w in zip(offsets_of(recv_counts), recv_counts, recv_widths)]

    def _sent(self, q, like):
        """The local indices this rank sends rank ``q`` (on ``like``'s device)."""
        return backend.on_device_of(like, self._send[q], self._device, ("sent", q))

    def run(self, direction, x, out, context):
        xp = backend.array_module(x)
        size, batch = self.grid.size, math.prod(x.shape[:-1])
        flat = x.reshape(batch, x.shape[-1])
        received_sizes = [len(self._needs[self.grid.rank, q]) for q in range(size)]
        weights = backend.on_device_of(x, self._weights.astype(x.dtype), self._device, ("weights", x.dtype.str))
        positions = backend.on_device_of(x, self._positions, self._device, "positions")
        widths = [len(idx) for idx in self._send]
        if direction == FORWARD:
            def gather(q, block):
                xp.take(flat, self._sent(q, x), axis=1, out=block)
            blocks = self._exchange(widths, gather, received_sizes, batch, x, context.staged)
            values = xp.concatenate(blocks, axis=1) if blocks else xp.zeros((batch, 0), x.dtype)
            out[...] = xp.sum(values[:, positions] * weights, axis=1).reshape(out.shape)
            return
        spread = xp.zeros((batch, self._nreceived), x.dtype)
        for corner in range(4):  # corners that share a value add up
            xp.add.at(spread, (slice(None), positions[corner]), flat * weights[corner])

        def back(q, block):
            block[...] = spread[:, self._recv_offsets[q]:self._recv_offsets[q] + received_sizes[q]]
        arrived = self._exchange(received_sizes, back, widths, batch, x, context.staged)
        target = out.reshape(batch, out.shape[-1])
        target[...] = 0
        for q, block in enumerate(arrived):
            target[:, self._sent(q, x)] += block  # the indices sent to one rank are distinct


class _STENCILS:
    """The stencils a tiling picks from (``Tiling.stencil``): one per kind of points, named by what they walk."""

    rectangles = _TileStencil
    rings = _RingStencil
