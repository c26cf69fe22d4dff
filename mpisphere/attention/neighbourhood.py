"""Neighbourhood attention of distributed tiles (torch-harmonics' ``NeighborhoodAttentionS2``).

Each rank receives the input points its output points' neighbourhoods
reach, each once, by one ``Alltoallv`` of the key and value inputs
(``NeighbourGather`` (:mod:`mpisphere.attention.gather`); its adjoint in the
backward): a cutoff of any width is served. Each output row's phases then
read their arcs of every input ring as strided views of the extended rows,
ring by ring with a running softmax: the scores of a whole tile are never
held.
"""

import math

import numpy

from .. import backend
from .arcs import default_attention_cutoff, neighbourhood_arcs
from .base import Attention
from .gather import NeighbourGather
from .kernels import OnlineSoftmax, softmax_backward

__all__ = ["NeighborhoodAttentionS2"]


class _Arc:
    """One arc of one input ring as read by the output points of one phase of a row.

    Output point ``j`` (of ``points``) reads the keys and values at
    ``start + d + step * j`` of the extended rows, ``d < count``. A short
    arc is read as a strided view (no copy); a long one (near the poles,
    whole rings) through its window ``start + [0, span)`` by matrix
    products, the scores taken out of the product's rows as a strided view
    and the weights laid out skewed (row ``j`` shifted by ``step * j``), so
    its cost is a few BLAS calls whatever its length.
    """

    LONG = 16

    def __init__(self, ring, start, count, points, step):
        self.ring, self.start, self.count, self.points, self.step = ring, start, count, points, step
        self.span = count + step * (points - 1)
        self.long = count > self.LONG and points > 1

    def _view(self, a):
        """``a[..., start + d + step * j]`` as ``(..., count, points)`` (a view)."""
        xp = backend.array_module(a)
        item = a.strides[-1]
        return xp.lib.stride_tricks.as_strided(a[..., self.start:], shape=a.shape[:-1] + (self.count, self.points),
                                               strides=a.strides[:-1] + (item, self.step * item))

    def _skewed(self, p):
        """``p`` ``(B, H, count, points)`` as ``(B, H, points, span)`` with ``[j, d + step * j] = p[d, j]``."""
        xp = backend.array_module(p)
        width = self.span + self.step
        padded = xp.zeros(p.shape[:2] + (self.points, width), dtype=p.dtype)
        padded[..., :self.count] = p.swapaxes(-1, -2)
        item = padded.strides[-1]    # row j read from j * span on: shifted by step * j
        return xp.lib.stride_tricks.as_strided(padded, shape=p.shape[:2] + (self.points, self.span),
                                               strides=padded.strides[:2] + (self.span * item, item))

    def scores(self, query, keys):
        """``s[b, h, d, j] = query[b, h, :, j] . keys[b, h, :, start + d + step * j]``."""
        xp = backend.array_module(query)
        if not self.long:
            return xp.einsum("bhcq,bhcnq->bhnq", query, self._view(keys))
        full = xp.matmul(query.swapaxes(-1, -2), keys[..., self.start:self.start + self.span])
        item = full.strides[-1]
        return xp.lib.stride_tricks.as_strided(
            full, shape=full.shape[:2] + (self.points, self.count),
            strides=full.strides[:2] + ((self.span + self.step) * item, item)).swapaxes(-1, -2)

    def weighted(self, p, values):
        """``sum_d p[b, h, d, j] values[b, h, :, start + d + step * j]``: ``(B, H, c, points)``."""
        xp = backend.array_module(p)
        if not self.long:
            return xp.einsum("bhnq,bhcnq->bhcq", p, self._view(values))
        return xp.matmul(values[..., self.start:self.start + self.span], self._skewed(p).swapaxes(-1, -2))

    def scatter(self, target, coefficients, vectors):
        """``target[..., start + d + step * j] += coefficients[:, :, d, j] * vectors[..., j]``, every ``d``, ``j``."""
        xp = backend.array_module(target)
        if self.long:
            target[..., self.start:self.start + self.span] += xp.matmul(vectors, self._skewed(coefficients))
            return
        last = self.step * (self.points - 1) + 1
        for d in range(self.count):     # the slices of one d never overlap
            target[..., self.start + d:self.start + d + last:self.step] += coefficients[:, :, None, d] * vectors


class _Batch:
    """The short arcs of one row's phase together: their keys and values gathered by one ``take`` each.

    ``index`` ``(n, points)``: the extended-row positions of each arc
    longitude ``n`` for each output point; ``weights`` ``(n, 1)``: their
    rings' quadrature weights.
    """

    def __init__(self, arcs, weights):
        self.arcs = arcs
        self.points = arcs[0].points
        rows = [arc.start + numpy.arange(arc.count)[:, None] + arc.step * numpy.arange(arc.points)[None, :]
                for arc in arcs]
        self.index = numpy.concatenate(rows).reshape(-1)
        self.count = sum(arc.count for arc in arcs)
        self.weights = numpy.concatenate([numpy.full(arc.count, weights[arc.ring]) for arc in arcs])[:, None]
        self._device = {}

    def on(self, like):
        """``(index, weights)`` on ``like``'s device, ``weights`` in its dtype."""
        return backend.on_device_of(like, (self.index, self.weights.astype(like.dtype)), self._device,
                                    key=like.dtype.str)

    def gathered(self, a):
        """``a`` ``(B, H, c, L)`` at the arcs' positions: ``(B, H, c, n, points)``."""
        xp = backend.array_module(a)
        index, _ = self.on(a)
        return xp.take(a, index, axis=-1).reshape(a.shape[:-1] + (self.count, self.points))

    def scatter(self, target, coefficients, vectors):
        """``target[..., index[n, j]] += coefficients[:, :, n, j] * vectors[..., j]`` for every ``n``, ``j``."""
        start = 0
        for arc in self.arcs:
            arc.scatter(target, coefficients[:, :, start:start + arc.count], vectors)
            start += arc.count


class NeighborhoodAttentionS2(Attention):
    """Neighbourhood attention of distributed tiles (torch-harmonics' ``NeighborhoodAttentionS2``).

    Each output point attends the input points within ``theta_cutoff`` of
    it (torch-harmonics' neighbourhoods, :mod:`~mpisphere.attention.arcs`).

    Parameters
    ----------
    grid : ProcessGrid
    in_channels : int
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the key/value grid and of the query/output grid;
        one ``nlon`` a multiple of the other (down- or up-sampling).
    num_heads : int
    quadrature_in, quadrature_out : str, keyword-only
        torch-harmonics' ``grid_in``, ``grid_out``.
    scale : float, keyword-only
        Default ``1 / sqrt(k_channels / num_heads)``.
    theta_cutoff : float, keyword-only
        Radians; default one latitude gap of the coarser grid (torch-harmonics').
    k_channels, out_channels : int, keyword-only
        Default ``in_channels``.
    dtype : float32 or float64, keyword-only

    Notes
    -----
    Parameters (``set_parameters``, torch-harmonics' names): ``q_weights``,
    ``k_weights`` ``(k_channels, in_channels)``, ``v_weights``
    ``(out_channels, in_channels)``, ``proj_weights`` ``(out_channels,
    out_channels)`` (or with torch-harmonics' trailing ``(1, 1)``), the
    biases ``q_bias``, ``k_bias``, ``v_bias``, ``proj_bias`` and the q/k
    normalisation gains ``q_norm_weights``, ``k_norm_weights`` ``(k_channels
    // num_heads,)`` (None: no bias, no normalisation). Construction and
    every call are collective over ``grid.cart``.
    """

    def __init__(self, grid, in_channels, in_shape, out_shape, num_heads=1, *, quadrature_in="equiangular",
                 quadrature_out="equiangular", scale=None, theta_cutoff=None, k_channels=None, out_channels=None,
                 dtype=numpy.float64):
        super().__init__(grid, in_channels, in_shape, out_shape, num_heads, quadrature_in=quadrature_in,
                         quadrature_out=quadrature_out, scale=scale, k_channels=k_channels,
                         out_channels=out_channels, dtype=dtype)
        (_, nlon_in), (_, nlon_out) = self.in_shape, self.out_shape
        if nlon_in % nlon_out and nlon_out % nlon_in:
            raise ValueError(f"{self.name}: one of nlon_in={nlon_in} and nlon_out={nlon_out} must be a multiple of "
                             "the other")
        self.theta_cutoff = default_attention_cutoff(self.in_shape, self.out_shape, quadrature_in, quadrature_out) \
            if theta_cutoff is None else float(theta_cutoff)
        if not self.theta_cutoff > 0:
            raise ValueError(f"{self.name}: theta_cutoff must be positive, got {theta_cutoff!r}")
        self.arcs = neighbourhood_arcs(self.in_shape, self.out_shape, quadrature_in, quadrature_out,
                                       self.theta_cutoff)
        self.neighbours = NeighbourGather(grid, self.arcs)
        self._block_list = None

    def _key_inputs(self, key, value, same, context):
        xp = backend.array_module(key)
        b, c = key.shape[:2]

        def extended(x):
            return self.neighbours.forward(xp.ascontiguousarray(x).reshape(b * c, -1),
                                           staged=context.staged).reshape(b, c, -1)
        keys = extended(key)
        return keys, keys if same else extended(value)

    def _key_inputs_adjoint(self, rows_bar, context):
        xp = backend.array_module(rows_bar)
        b, c, length = rows_bar.shape
        tile = xp.zeros((b * c, math.prod(self.tile_in)), dtype=self.dtype)
        self.neighbours.adjoint(xp.ascontiguousarray(rows_bar).reshape(b * c, length), tile, staged=context.staged)
        return tile.reshape((b, c) + self.tile_in)

    def _blocks(self):
        """Each output row's phases: ``(i, columns, short arcs as one _Batch or None, [long _Arc])``, built once."""
        if self._block_list is None:
            self._block_list = list(self._build_blocks())
        return self._block_list

    def _build_blocks(self):
        lat, lon = self.tiling_out.slices()
        arcs, width = self.arcs, lon.stop - lon.start
        for i, ho in enumerate(range(lat.start, lat.stop)):
            for phase, ring_arcs in enumerate(arcs.rows[ho]):
                j0 = (phase - lon.start) % arcs.period
                if j0 >= width:
                    continue
                points = len(range(j0, width, arcs.period))
                anchor = int(arcs.anchor(lon.start + j0))
                pieces = []
                for hi, first, length in ring_arcs:
                    offset, window, _ = self.neighbours.rows[hi]
                    pieces.append(_Arc(hi, offset + anchor + first - window, length, points, arcs.step))
                short = [arc for arc in pieces if not arc.long]
                yield (i, slice(j0, width, arcs.period), _Batch(short, self.quad_weights) if short else None,
                       [arc for arc in pieces if arc.long])

    def _attend(self, qh, kh, vh, context):
        xp = backend.array_module(qh)
        b, heads, dv = qh.shape[0], qh.shape[1], vh.shape[2]
        attended = xp.empty((b, heads, dv) + self.tile_out, dtype=self.dtype)
        lse = xp.empty((b, heads) + self.tile_out, dtype=self.dtype)
        weights = self.quad_weights.astype(self.dtype)
        for i, columns, batch, long in self._blocks():
            query = qh[:, :, :, i, columns]
            state = OnlineSoftmax(xp, (b, heads), query.shape[-1], dv, self.dtype)
            if batch is not None:
                keys, values = batch.gathered(kh), batch.gathered(vh)
                state.add(xp.einsum("bhcq,bhcnq->bhnq", query, keys), batch.on(qh)[1],
                          lambda p, values=values: xp.einsum("bhnq,bhcnq->bhcq", p, values))
            for arc in long:
                state.add(arc.scores(query, kh), weights[arc.ring], lambda p, arc=arc: arc.weighted(p, vh))
            attended[:, :, :, i, columns], lse[:, :, i, columns] = state.result()
        return attended, lse

    def _attend_backward(self, saved, a_bar, context):
        xp = backend.array_module(a_bar)
        qh, kh, vh, lse = saved["qh"], saved["kh"], saved["vh"], saved["lse"]
        d = (a_bar * saved["attended"]).sum(axis=2)
        q_bar, k_bar, v_bar = xp.zeros_like(qh), xp.zeros_like(kh), xp.zeros_like(vh)
        weights = self.quad_weights.astype(self.dtype)
        for i, columns, batch, long in self._blocks():
            query, y_bar = qh[:, :, :, i, columns], a_bar[:, :, :, i, columns]
            row_lse, row_d = lse[:, :, i, columns], d[:, :, i, columns]
            if batch is not None:
                keys, values = batch.gathered(kh), batch.gathered(vh)
                ds, p = softmax_backward(xp.einsum("bhcq,bhcnq->bhnq", query, keys), batch.on(qh)[1], row_lse,
                                         xp.einsum("bhcq,bhcnq->bhnq", y_bar, values), row_d)
                q_bar[:, :, :, i, columns] += xp.einsum("bhnq,bhcnq->bhcq", ds, keys)
                batch.scatter(k_bar, ds, query)
                batch.scatter(v_bar, p, y_bar)
            for arc in long:
                ds, p = softmax_backward(arc.scores(query, kh), weights[arc.ring], row_lse, arc.scores(y_bar, vh),
                                         row_d)
                q_bar[:, :, :, i, columns] += arc.weighted(ds, kh)
                arc.scatter(k_bar, ds, query)
                arc.scatter(v_bar, p, y_bar)
        return q_bar, k_bar, v_bar
