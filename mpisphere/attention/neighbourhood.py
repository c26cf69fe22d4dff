"""Neighbourhood attention of distributed tiles (torch-harmonics' ``NeighborhoodAttentionS2``).

Each rank receives the input points its output points' neighbourhoods
reach, each once, by one ``Alltoallv`` of the key and value inputs
(:class:`~mpisphere.attention.gather.NeighbourGather`; its adjoint in the
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
from .kernels import OnlineSoftmax, block_backward, block_scores

__all__ = ["NeighborhoodAttentionS2"]


def _strided(a, start, count, points, step):
    """``a[..., start + d + step * j]`` for ``d < count``, ``j < points``: a view ``(..., count, points)``."""
    xp = backend.array_module(a)
    item = a.strides[-1]
    return xp.lib.stride_tricks.as_strided(a[..., start:], shape=a.shape[:-1] + (count, points),
                                           strides=a.strides[:-1] + (item, step * item))


def _scatter_add(target, start, step, coefficients, vectors):
    """``target[..., start + d + step * j] += coefficients[:, :, d, j] * vectors[..., j]`` for every ``d``, ``j``.

    One slice per ``d`` or per ``j``, whichever is fewer: the slices of one
    never overlap (``step >= 1``), those of different ones may.
    """
    count, points = coefficients.shape[2:]
    if count <= points:
        for d in range(count):
            target[..., start + d:start + d + step * (points - 1) + 1:step] += coefficients[:, :, None, d] * vectors
    else:
        for j in range(points):
            target[..., start + step * j:start + step * j + count] += coefficients[:, :, None, :, j] * \
                vectors[..., j:j + 1]


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
        """Each output row's phases: ``(i, columns, first anchor, [(hi, start in the extended rows, length)])``."""
        lat, lon = self.tiles_out.slices()
        arcs, width = self.arcs, lon.stop - lon.start
        for i, ho in enumerate(range(lat.start, lat.stop)):
            for phase, ring_arcs in enumerate(arcs.rows[ho]):
                j0 = (phase - lon.start) % arcs.period
                if j0 >= width:
                    continue
                columns = slice(j0, width, arcs.period)
                anchor = int(arcs.anchor(lon.start + j0))
                pieces = []
                for hi, first, length in ring_arcs:
                    offset, window, _ = self.neighbours.rows[hi]
                    pieces.append((hi, offset + anchor + first - window, length))
                yield i, columns, len(range(j0, width, arcs.period)), pieces

    def _attend(self, qh, kh, vh, context):
        xp = backend.array_module(qh)
        b, heads, dv = qh.shape[0], qh.shape[1], vh.shape[2]
        attended = xp.empty((b, heads, dv) + self.tile_out, dtype=self.dtype)
        lse = xp.empty((b, heads) + self.tile_out, dtype=self.dtype)
        weights = self.quad_weights.astype(self.dtype)
        step = self.arcs.step
        for i, columns, points, pieces in self._blocks():
            query = qh[:, :, :, i, columns]
            state = OnlineSoftmax(xp, (b, heads), points, dv, self.dtype)
            for hi, start, length in pieces:
                keys = _strided(kh, start, length, points, step)
                state.add(block_scores(query, keys), weights[hi], _strided(vh, start, length, points, step))
            attended[:, :, :, i, columns], lse[:, :, i, columns] = state.result()
        return attended, lse

    def _attend_backward(self, saved, a_bar, context):
        xp = backend.array_module(a_bar)
        qh, kh, vh, lse = saved["qh"], saved["kh"], saved["vh"], saved["lse"]
        d = (a_bar * saved["attended"]).sum(axis=2)
        q_bar, k_bar, v_bar = xp.zeros_like(qh), xp.zeros_like(kh), xp.zeros_like(vh)
        weights = self.quad_weights.astype(self.dtype)
        step = self.arcs.step
        for i, columns, points, pieces in self._blocks():
            query, y_bar = qh[:, :, :, i, columns], a_bar[:, :, :, i, columns]
            row_lse, row_d = lse[:, :, i, columns], d[:, :, i, columns]
            for hi, start, length in pieces:
                keys = _strided(kh, start, length, points, step)
                ds, p = block_backward(query, keys, _strided(vh, start, length, points, step), weights[hi],
                                       row_lse, y_bar, row_d)
                q_bar[:, :, :, i, columns] += xp.einsum("bhnq,bhcnq->bhcq", ds, keys)
                _scatter_add(k_bar, start, step, ds, query)
                _scatter_add(v_bar, start, step, p, y_bar)
        return q_bar, k_bar, v_bar
