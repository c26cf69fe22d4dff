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

On a ring grid (a :class:`~mpisphere.RingGeometry` in place of ``nlat``,
``nlon=None``: ``RingPointInterpolation``) the point lies between
ring ``i`` and ring ``i + 1``; on each the value is interpolated linearly
between the two points of that ring around its longitude, then linearly in
colatitude between the rings. There are no halos on ring grids: the four
values come from their owners in one ``Alltoallv`` (each needed value
once), and the adjoint sends the weighted point values back in another.
"""

import math

import numpy

from . import backend, collectives, dtypes
from .agreement import agree_construction
from .halo import HaloExchange
from .operators import DISTRIBUTED, FORWARD, InputError, Layout, LinearOperator
from .validation import check_int
from .partition import offsets_of, split_sizes
from .quadrature import latitudes, rule
from .ring_tiles import RingTiles
from .rings import RingGeometry

__all__ = ["PointInterpolation", "RingPointInterpolation"]


class PointInterpolation(LinearOperator):
    """Values of distributed tiles at scattered points; the adjoint spreads point values back onto the tiles.

    Parameters
    ----------
    grid : ProcessGrid
    nlat, nlon : int, or a RingGeometry and None
        The global grid of the fields: regular, or the rings of a reduced
        one (then the fields are this rank's points, see
        ``RingPointInterpolation``).
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

    def __new__(cls, grid=None, nlat=None, *args, **kwargs):
        if cls is PointInterpolation and isinstance(nlat, RingGeometry):
            return super().__new__(RingPointInterpolation)  # the rings' own interpolation
        return super().__new__(cls)

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
        lats, lons = _check_points(who, lats, lons)
        self.npoints = lats.size
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

    def _what_a_rank_holds(self):
        """How an error names this rank's input: its tile here, its points on rings."""
        return f"this rank's tile (..., {self.tile[0]}, {self.tile[1]})"

    def _output(self, direction, spec):
        if dtypes.refusal(spec.dtype, "real field"):
            raise InputError(f"expected real fields: {dtypes.refusal(spec.dtype, 'real field')}", TypeError)
        grid_axes = len(self.tile)
        if direction == FORWARD:
            if spec.shape[len(spec.shape) - grid_axes:] != self.tile:
                raise InputError(f"expected {self._what_a_rank_holds()}, got shape {spec.shape}")
            return spec.but(shape=spec.shape[:len(spec.shape) - grid_axes] + (self.indices.size,)), \
                spec.describe(masked=range(-grid_axes, 0))
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


class RingPointInterpolation(PointInterpolation):
    """:class:`PointInterpolation` on a ring grid: ``PointInterpolation(grid, rings, None, lats, lons)``.

    Parameters
    ----------
    grid : ProcessGrid
    rings : RingGeometry
    nlon : None
    lats, lons : array_like, shape ``(npoints,)``
        As for :class:`PointInterpolation`; points poleward of the outermost
        rings are refused.
    quadrature : ignored
        The rings carry their latitudes.

    Attributes
    ----------
    indices : ndarray of int
        The points this rank owns (those whose cell's north-west corner, the
        point of ring ``i`` at or west of it, is this rank's), increasing.
    tiles : RingTiles

    Notes
    -----
    ``forward``: this rank's points ``(..., tiles.npoints)`` -> its
    points' values ``(..., len(indices))``; ``adjoint``: the transpose.
    Distributed over ``grid.cart``; collective (one ``Alltoallv`` each way).
    """

    def __init__(self, grid, rings, nlon, lats, lons, *, quadrature=None):
        who = "PointInterpolation"
        if not (hasattr(grid, "cart") and hasattr(grid, "local_slices")):
            raise TypeError(f"{who}: grid must be a ProcessGrid, got {type(grid).__name__}")
        agree_construction(self, grid.cart, who=who)
        if nlon is not None:
            raise ValueError(f"{who}: pass nlon=None with a RingGeometry, got nlon={nlon!r}")
        self.grid, self.rings = grid, rings
        self.tiles = RingTiles(grid, rings)
        lats, lons = _check_points(who, lats, lons)
        self.npoints = lats.size
        theta = rings.theta
        colat = 0.5 * math.pi - lats
        outside = (colat < theta[0]) | (colat > theta[-1])
        if outside.any():
            raise ValueError(f"{who}: {int(outside.sum())} of {lats.size} points lie poleward of the outermost rings "
                             f"({90 - math.degrees(theta[0]):.4f} and {90 - math.degrees(theta[-1]):.4f} degrees on "
                             f"{rings.name}); there is no enclosing cell to interpolate in")
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
        self.tile = (self.tiles.npoints,)
        self._workspace = backend.Workspace()  # the exchanges' buffers, and their host copies where staged
        self._device = {}                       # index arrays and weights uploaded once per device
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart

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

    def _what_a_rank_holds(self):
        return f"this rank's points (..., {self.tile[0]}) of {self.rings.name}"

    def _exchange(self, widths, fill, recv_widths, batch, like, staged):
        """One Alltoallv of ``(batch, width)`` blocks, one per rank, in the operator's kept buffers.

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

    def _run(self, direction, x, out, context):
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
