"""Bilinear resampling of distributed tiles between grids (torch-harmonics' ``ResampleS2``).

Each output point interpolates linearly between two input latitudes, then
between two input longitudes (periodic), with torch-harmonics 0.9.3's
indices and weights (its weights are held in float32; so are these, for the
same numbers). Output latitudes beyond the input's outermost ones
interpolate towards the pole, whose value is the mean of the outermost input
ring. Distributed, a rank's output points read input rows of its polar
neighbours and columns of its azimuth neighbours through one
:class:`~mpisphere.HaloExchange` (widths from the geometry), and the pole
means come from one sum over the azimuth ranks; the interpolation itself is
two gathers per axis and output point (latitudes, then longitudes), so the
adjoint is the transposed gathers, the sum again and the halo's adjoint.
``mode="bilinear-spherical"`` interpolates angles along the shorter arc, the
poles as circular means (nonlinear: ``ResampleS2.vjp`` is its backward).
"""

import math

import numpy

from . import backend, collectives
from .agreement import agree_construction, collective
from .grid import check_tile
from .halo import HaloExchange
from .operators import ADJOINT, DISTRIBUTED, FORWARD, Layout, ParametrisedOperator
from .quadrature import latitudes
from .strided import strided_pieces
from .tiling import RegularTiling
from .validation import check_choice, check_dtype, check_int

__all__ = ["ResampleS2"]


def _lerp_table(points_in, points_out, periodic):
    """torch-harmonics' ``(left, right, weight)`` of each output point (weights rounded to float32)."""
    left = numpy.searchsorted(points_in, points_out, side="right") - 1
    if periodic:
        right = numpy.where(points_out >= points_in[-1], 0, left + 1)
        gap = points_in[right] - points_in[left]
        gap = numpy.where(gap <= 0.0, gap + 2.0 * math.pi, gap)
    else:
        left = numpy.where(points_out == points_in[-1], left - 1, left)
        right = left + 1
        gap = numpy.diff(points_in)[left]
    weight = ((points_out - points_in[left]) / gap).astype(numpy.float32).astype(numpy.float64)
    return left, right, weight


class ResampleS2(ParametrisedOperator):
    """Bilinear resampling from ``in_shape`` to ``out_shape`` of distributed tiles.

    Parameters
    ----------
    grid : ProcessGrid
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the two grids.
    quadrature_in, quadrature_out : str
        Their latitude rules (torch-harmonics' ``grid_in``, ``grid_out``).
    mode : {"bilinear", "bilinear-spherical"}
        ``"bilinear-spherical"`` (torch-harmonics') interpolates angle-valued
        fields along the shorter arc, the poles as circular means: a
        nonlinear map, with no adjoint; ``vjp`` gives the adjoint of its
        derivative (what a backward pass needs).
    dtype : float32 or float64, keyword-only

    Notes
    -----
    ``forward``: ``(..., h, w)`` (this rank's tile of ``in_shape``) ->
    ``(..., h', w')`` (its tile of ``out_shape``); ``adjoint``: the exact
    adjoint. Collective over ``grid.cart``; construction too.

    Raises
    ------
    ValueError
        At construction on every rank: output points that read rows or
        columns beyond the neighbouring ranks (too many ranks for the grids).
    """

    def __init__(self, grid, in_shape, out_shape, quadrature_in="equiangular", quadrature_out="equiangular",
                 mode="bilinear", *, dtype=numpy.float64):
        agree_construction(self, grid.cart, who="ResampleS2")
        who = self.name
        self.mode = check_choice(mode, ("bilinear", "bilinear-spherical"), "mode", who)
        self.grid = grid
        self.in_shape = tuple(check_int(v, "in_shape", who, minimum=2) for v in in_shape)
        self.out_shape = tuple(check_int(v, "out_shape", who, minimum=1) for v in out_shape)
        self.dtype = check_dtype(dtype, "transformed", "dtype", who)
        (nlat_in, nlon_in), (nlat_out, nlon_out) = self.in_shape, self.out_shape
        theta_in, _ = latitudes(nlat_in, quadrature_in)
        theta_out, _ = latitudes(nlat_out, quadrature_out)
        self.expand_poles = bool((theta_out > theta_in[-1]).any() or (theta_out < theta_in[0]).any())
        extended = numpy.concatenate([[0.0], theta_in, [math.pi]]) if self.expand_poles else theta_in
        lat_left, lat_right, lat_weight = _lerp_table(extended, theta_out, periodic=False)
        lons_in = numpy.linspace(0.0, 2.0 * math.pi, nlon_in + 1)[:-1]
        lons_out = numpy.linspace(0.0, 2.0 * math.pi, nlon_out + 1)[:-1]
        lon_left, lon_right, lon_weight = _lerp_table(lons_in, lons_out, periodic=True)
        # input rows by their index in the input grid; the poles are -1 (north) and nlat_in (south)
        shift = 1 if self.expand_poles else 0
        rows = numpy.stack([lat_left, lat_right]) - shift
        self.rows, self.cols = self._widths(rows, numpy.stack([lon_left, lon_right]))
        self.halo = HaloExchange(grid, self.rows, self.cols, extents=self.in_shape) if self.rows or self.cols else None
        self.tiling_in, self.tiling_out = RegularTiling(grid, nlat_in, nlon_in), RegularTiling(grid, nlat_out, nlon_out)
        lat_in, lon_in = self.tiling_in.slices()
        lat_out, lon_out = self.tiling_out.slices()
        self.tile_in = (lat_in.stop - lat_in.start, lon_in.stop - lon_in.start)
        self.tile_out = (lat_out.stop - lat_out.start, lon_out.stop - lon_out.start)
        padded_rows = self.tile_in[0] + 2 * self.rows
        padded_cols = self.tile_in[1] + 2 * self.cols
        # latitudes: each own output row from two rows of (padded rows + the north and south pole rows)
        lat_index, lat_weights = [], []
        for t in range(lat_out.start, lat_out.stop):
            pair = [padded_rows if row < 0 else padded_rows + 1 if row >= nlat_in else row - lat_in.start + self.rows
                    for row in rows[:, t]]
            lat_index.append(pair)
            lat_weights.append((1.0 - lat_weight[t], lat_weight[t]))
        # longitudes: each own output column from two padded columns (the needed column nearest this rank's own)
        lon_index, lon_weights = [], []
        for q in range(lon_out.start, lon_out.stop):
            lon_index.append([_nearest(col, lon_in.start, lon_in.stop, nlon_in) - lon_in.start + self.cols
                              for col in (lon_left[q], lon_right[q])])
            lon_weights.append((1.0 - lon_weight[q], lon_weight[q]))
        self._rows = _Stencil(numpy.array(lat_index).reshape(-1, 2), numpy.array(lat_weights).reshape(-1, 2),
                              padded_rows + 2, self.dtype)
        self._cols = _Stencil(numpy.array(lon_index).reshape(-1, 2), numpy.array(lon_weights).reshape(-1, 2),
                              padded_cols, self.dtype)
        uses = numpy.array(lat_index).reshape(-1, 2)
        self.north = bool(grid.polar_rank == 0 and (uses == padded_rows).any())
        self.south = bool(grid.polar_rank == grid.npolar - 1 and (uses == padded_rows + 1).any())
        self._workspace = backend.Workspace()
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self._init_parameters()

    def _widths(self, rows, cols):
        """The halo's rows and columns: the furthest any rank's output points read past its own input."""
        g = self.grid
        (nlat_in, nlon_in), (nlat_out, nlon_out) = self.in_shape, self.out_shape
        lat_in_sizes, lat_out_sizes = g.lat_sizes(nlat_in), g.lat_sizes(nlat_out)
        lon_in_sizes, lon_out_sizes = g.lon_sizes(nlon_in), g.lon_sizes(nlon_out)
        need_rows = need_cols = 0
        start_in = start_out = 0
        for p, (n_in, n_out) in enumerate(zip(lat_in_sizes, lat_out_sizes)):
            read = rows[:, start_out:start_out + n_out]
            inside = read[(read >= 0) & (read < nlat_in)]
            if inside.size:
                need_rows = max(need_rows, start_in - inside.min(), inside.max() - (start_in + n_in - 1))
            poles = read[(read < 0) | (read >= nlat_in)]
            if ((poles < 0).any() and p != 0) or ((poles >= nlat_in).any() and p != g.npolar - 1):
                raise ValueError(f"{self.name}: output latitudes split as {lat_out_sizes} put rows beyond the "
                                 f"input's outermost latitude on a polar rank that does not hold it; use fewer polar "
                                 "ranks")
            start_in += n_in
            start_out += n_out
        start_in = start_out = 0
        for n_in, n_out in zip(lon_in_sizes, lon_out_sizes):
            for col in cols[:, start_out:start_out + n_out].reshape(-1):
                j = _nearest(col, start_in, start_in + n_in, nlon_in)
                need_cols = max(need_cols, start_in - j, j - (start_in + n_in - 1))
            start_in += n_in
            start_out += n_out
        smallest_rows, smallest_cols = min(lat_in_sizes), min(lon_in_sizes)
        if g.npolar > 1 and need_rows > smallest_rows or g.nazimuth > 1 and need_cols > smallest_cols:
            raise ValueError(f"{self.name}: the output points read {need_rows} rows and {need_cols} columns past "
                             f"their rank's input tile, more than the smallest tile ({smallest_rows} x "
                             f"{smallest_cols}) holds; use fewer ranks")
        return int(need_rows), int(need_cols)

    def _shapes(self, lead):
        return lead + self.tile_in, lead + self.tile_out

    def _not_linear(self):
        return ("bilinear-spherical resampling interpolates angles: it is not linear and has no adjoint\n"
                "  fix: ResampleS2.vjp(x, y_bar) gives the adjoint of its derivative at x")

    def _call_output(self, direction, spec):
        other, whole = (self.tile_out, self.in_shape) if direction == FORWARD else (self.tile_in, self.out_shape)
        check_tile(self.grid, spec, whole, self.dtype)
        return spec.but(shape=tuple(spec.shape[:-2]) + other), spec.describe((-2, -1))

    def _pole_sums(self, rows, context):
        """Sum over the azimuth ranks of ``rows`` ``(..., 2)`` (the north and south values), in place."""
        if self.grid.nazimuth > 1:
            send = rows.copy()
            collectives.allreduce(self.grid.azimuth, send.reshape(-1), rows.reshape(-1), staged=context.staged,
                                  workspace=self._workspace)

    @property
    def linear(self):
        """False for ``"bilinear-spherical"`` (angles): no adjoint, ``vjp`` instead."""
        return self.mode == "bilinear"

    def _ring_sums(self, x, context):
        """The outermost rings' sums over all longitudes, ``(B, 2)`` (bilinear: the values) or ``(B, 4)``
        (angles: north sin, cos, south sin, cos), on the ranks that use the poles (zeros elsewhere)."""
        xp = backend.array_module(x)
        per_ring = (lambda ring: (ring,)) if self.linear else (lambda ring: (xp.sin(ring), xp.cos(ring)))
        width = 1 if self.linear else 2
        sums = xp.zeros((x.shape[0], 2 * width), dtype=self.dtype)
        for k, (used, ring) in enumerate(((self.north, x[:, 0]), (self.south, x[:, -1]))):
            if used:
                for i, values in enumerate(per_ring(ring)):
                    sums[:, width * k + i] = values.sum(axis=-1)
        self._pole_sums(sums, context)
        return sums

    def _extended(self, x, context):
        """``x`` (B, h, w) with its halo and the two pole rows: ``(B, rows + 2, cols)``.

        The pole rows hold the outermost rings' means (torch-harmonics' circular means for angles: the
        direction of the mean unit vector).
        """
        xp = backend.array_module(x)
        batch, h, w = x.shape
        rows_padded, cols_padded = h + 2 * self.rows, w + 2 * self.cols
        extended = xp.zeros((batch, rows_padded + 2, cols_padded), dtype=self.dtype)
        if self.rows or self.cols:
            self.halo.run_agreed(FORWARD, x, extended[:, :rows_padded], context)
        else:
            extended[:, :rows_padded] = x
        means = self._ring_sums(x, context) / self.in_shape[1]
        extended[:, rows_padded:] = (means if self.linear else xp.arctan2(means[:, 0::2], means[:, 1::2]))[:, :, None]
        return extended

    def _run(self, direction, x, out, context):
        xp = backend.array_module(x)
        batch = math.prod(x.shape[:-2])
        h, w = self.tile_in
        if direction == FORWARD:
            extended = self._extended(xp.ascontiguousarray(x).reshape(batch, h, w), context)
            if self.linear:
                result = self._cols.apply(self._rows.apply(extended, 1), 2)
            else:
                result = self._cols.slerp(self._rows.slerp(extended, 1), 2)
            out[...] = result.reshape(out.shape)
            return
        self._pullback(xp.ascontiguousarray(x).reshape((batch,) + self.tile_out), None,
                       out.reshape(batch, h, w), context)

    def _pullback(self, y, x, target, context):
        """``target`` = the adjoint of the derivative at ``x`` applied to ``y`` (``x`` unused when linear)."""
        xp = backend.array_module(y)
        h, w = self.tile_in
        rows_padded = h + 2 * self.rows
        n = self.in_shape[1]
        extended = self._rows.adjoint(self._cols.adjoint(y, 2), 1)     # (B, rows + 2, cols)
        poles = xp.ascontiguousarray(extended[:, rows_padded:].sum(axis=-1))
        self._pole_sums(poles, context)
        if self.rows or self.cols:
            self.halo.run_agreed(ADJOINT, xp.ascontiguousarray(extended[:, :rows_padded]), target, context)
        else:
            target[...] = extended[:, :rows_padded]
        if self.linear:
            slopes = [None, None]
        else:   # d atan2(S, C) / dx_j = (C cos x_j + S sin x_j) / (n (S^2 + C^2)), S and C the ring's means
            means = self._ring_sums(x, context) / n
            slopes = []
            for k, ring in ((0, x[:, 0]), (1, x[:, -1])):
                S, C = means[:, 2 * k:2 * k + 1], means[:, 2 * k + 1:2 * k + 2]
                slopes.append((C * xp.cos(ring) + S * xp.sin(ring)) / (n * (S * S + C * C)))
        for k, (used, row) in enumerate(((self.north, 0), (self.south, -1))):
            if used:
                target[:, row] += poles[:, k:k + 1] * (1.0 / n if slopes[k] is None else slopes[k])

    def _gradient_parts(self, x, y_bar, input_gradient, context):
        if not input_gradient:
            return None, {}
        xp = backend.array_module(y_bar)
        lead = tuple(x.shape[:-2])
        batch = math.prod(lead)
        out = xp.empty(lead + self.tile_in, dtype=self.dtype)
        self._pullback(xp.ascontiguousarray(y_bar).reshape((batch,) + self.tile_out),
                       xp.ascontiguousarray(x).reshape((batch,) + self.tile_in), out.reshape((batch,) + self.tile_in),
                       context)
        return out, {}

    @collective
    def vjp(self, x, y_bar):
        """The adjoint of the derivative at ``x`` applied to ``y_bar`` (``adjoint(y_bar)`` when bilinear).

        Parameters
        ----------
        x : array ``(..., h, w)``, this rank's input tile
        y_bar : array ``(..., h', w')``, this rank's output tile's cotangent

        Returns
        -------
        array ``(..., h, w)``: this rank's tile of the input's gradient (``gradients(x, y_bar)[0]``).
        Collective over ``grid.cart``.
        """
        return self.gradients(x, y_bar)[0]


class _Stencil:
    """Each of ``n`` targets from ``r`` sources along one axis: ``out[t] = sum_s weight[t, s] src[index[t, s]]``.

    ``block_bytes``: on host arrays, the bytes of output computed at a time (sized for the cache).

    The adjoint reads the same entries from the sources' side (each source
    from the few targets that read it, zero weights padding), so both
    directions are ``r`` gathers of whole slabs whatever the grid's size.
    """

    def __init__(self, index, weights, nsources, dtype):
        self.index = numpy.ascontiguousarray(index.T)                         # (r, n)
        self.weights = numpy.ascontiguousarray(weights.T, dtype=dtype)
        readers = [[] for _ in range(nsources)]
        for t, (sources, ws) in enumerate(zip(index, weights)):
            for source, w in zip(sources, ws):
                readers[source].append((t, w))
        width = max(1, max(len(r) for r in readers))
        back_index = numpy.zeros((width, nsources), dtype=numpy.int64)
        back_weights = numpy.zeros((width, nsources), dtype=dtype)
        for source, entries in enumerate(readers):
            for s, (t, w) in enumerate(entries):
                back_index[s, source], back_weights[s, source] = t, w
            # the padding (weight 0) reads the source's last reader: runs stay arithmetic where they can
            back_index[len(entries):, source] = entries[-1][0] if entries else 0
        self.back_index, self.back_weights = back_index, back_weights
        self._pieces = {id(i): _all_pieces(i) for i in (self.index, self.back_index)}
        self.block_bytes = 1 << 19
        self._device = {}
        self._workspace = backend.Workspace()

    def _run(self, x, axis, index, weights):
        xp = backend.array_module(x)
        pieces = self._pieces[id(index)]
        index, weights = backend.on_device_of(x, (index, weights), self._device, key=id(index))
        shape = [1] * x.ndim
        shape[axis] = -1
        if pieces is None or backend.device_kernels(x):   # one gather per source (one kernel each)
            out = None
            for s in range(index.shape[0]):
                part = xp.take(x, index[s], axis=axis) * weights[s].reshape(shape)
                out = part if out is None else out + part
            return out
        # strided views of x instead of gathers (a vectorised pass per view), a cache-sized block of fields at
        # a time: the products and sums of a block stay in the cache (3x faster along longitudes than whole)
        out_shape = x.shape[:axis] + (index.shape[1],) + x.shape[axis + 1:]
        out = xp.empty(out_shape, dtype=numpy.result_type(x.dtype, weights.dtype))
        lines = math.prod(x.shape[:axis])
        x3 = x.reshape(lines, x.shape[axis], -1)               # (lines before the axis, axis, after)
        out3 = out.reshape(lines, index.shape[1], -1)
        block = max(1, self.block_bytes // max(out3[:1].nbytes, 1))
        part = self._workspace.scratch("part", x, min(block, lines) * out3[0].size, out.dtype)
        for first_line in range(0, lines, block):
            rows = slice(first_line, first_line + block)
            self._run_block(xp, x3[rows], out3[rows], part, pieces, weights)
        return out

    @staticmethod
    def _run_block(xp, x, out, part, pieces, weights):
        """``out (L, n, K) = `` the stencil along axis 1 of ``x (L, n_sources, K)`` (``part``: scratch)."""
        part = part[:out.size].reshape(out.shape)
        for s, runs in enumerate(pieces):
            for targets, first, step in runs:
                count = len(range(targets.start, targets.stop, targets.step))
                view = x[:, slice(first, first + step * (count - 1) + 1, step) if step else slice(first, first + 1)]
                w = weights[s][targets][:, None]
                if s == 0:
                    xp.multiply(view, w, out=out[:, targets])
                else:
                    xp.multiply(view, w, out=part[:, targets])
                    out[:, targets] += part[:, targets]

    def apply(self, x, axis):
        return self._run(x, axis, self.index, self.weights)

    def slerp(self, x, axis):
        """torch-harmonics' interpolation of angles along the shorter arc (two sources per target)."""
        xp = backend.array_module(x)
        index, weights = backend.on_device_of(x, (self.index, self.weights), self._device, key=id(self.index))
        shape = [1] * x.ndim
        shape[axis] = -1
        start, end = xp.take(x, index[0], axis=axis), xp.take(x, index[1], axis=axis)
        delta = xp.remainder(end - start + math.pi, 2.0 * math.pi) - math.pi
        return start + weights[1].reshape(shape) * delta

    def adjoint(self, y, axis):
        return self._run(y, axis, self.back_index, self.back_weights)


def _all_pieces(index):
    """``strided_pieces`` of each row of ``index`` ``(r, n)``, or None when some row has no such structure."""
    pieces = [strided_pieces(row) for row in index]
    return None if any(p is None for p in pieces) else pieces


def _nearest(col, start, stop, n):
    """The representative of column ``col`` (mod ``n``) nearest the range ``[start, stop)``."""
    best = None
    for candidate in (col - n, col, col + n):
        distance = start - candidate if candidate < start else candidate - (stop - 1) if candidate >= stop else 0
        if best is None or distance < best[0]:
            best = (distance, candidate)
    return best[1]
