"""Global attention of distributed tiles (torch-harmonics' ``AttentionS2``).

The projected keys and values of every rank pass once round a ring of the
grid's ranks (``Sendrecv``), one tile at a time, and each rank's queries
take them in blocks of queries and keys with a running softmax; the
backward sends their gradients round with them. No rank holds more than two
tiles of keys and values at once.
"""

import math

import numpy

from .. import backend, collectives
from .base import Attention
from .kernels import OnlineSoftmax, block_scores, softmax_backward

__all__ = ["AttentionS2"]


class AttentionS2(Attention):
    """Global attention of distributed tiles (torch-harmonics' ``AttentionS2``): every input point, weighted.

    Parameters as :class:`NeighborhoodAttentionS2` without ``theta_cutoff``
    (the default ``scale`` is the same, PyTorch's).

    Notes
    -----
    The projected keys and values pass round the ranks of ``grid.cart``
    (``Sendrecv`` to the previous rank), one tile at a time, and each rank's
    queries take them in blocks with a running softmax; the backward sends
    their gradients round with them (one more step brings them home).
    """

    def __init__(self, grid, in_channels, in_shape, out_shape, num_heads=1, **options):
        super().__init__(grid, in_channels, in_shape, out_shape, num_heads, **options)
        if self.in_shape[1] % self.out_shape[1]:
            raise ValueError(f"{self.name}: nlon_in={self.in_shape[1]} must be a multiple of nlon_out="
                             f"{self.out_shape[1]} (torch-harmonics' AttentionS2 refuses it too)")

    def _key_inputs(self, key, value, same, context):
        xp = backend.array_module(key)
        b, c = key.shape[:2]
        keys = xp.ascontiguousarray(key).reshape(b, c, -1)
        return keys, keys if same else xp.ascontiguousarray(value).reshape(b, c, -1)

    def _key_inputs_adjoint(self, bar, context):
        return bar.reshape(bar.shape[:2] + self.tile_in)

    def _weights(self, rank, like):
        lat, lon = self.tiling_in.slices(rank)
        host = numpy.repeat(self.quad_weights[lat], lon.stop - lon.start).astype(self.dtype)
        return backend.on_device_of(like, host, self._device_weights, key=rank)

    def _ring(self):
        size, rank = self.grid.size, self.grid.rank
        return size, rank, (rank - 1) % size, (rank + 1) % size

    def _points(self, rank):
        return math.prod(self.tiling_in.local_shape(rank))

    def _pass(self, block, owner, context, channels):
        """Send ``block`` (rank ``owner``'s) to the previous rank; the next rank's block ``owner + 1`` arrives."""
        xp = backend.array_module(block)
        size, _, previous, following = self._ring()
        incoming = xp.empty(block.shape[:2] + (channels, self._points((owner + 1) % size)), dtype=block.dtype)
        collectives.sendrecv(self.grid.cart, xp.ascontiguousarray(block[:, :, :channels]).reshape(-1), previous,
                             incoming.reshape(-1), following, staged=context.staged, workspace=self._workspace)
        return incoming

    def _chunks(self, b, heads, queries, keys):
        per = max(1, self.block_elements // max(1, b * heads))
        q_size = min(queries, max(1, int(math.isqrt(per))))
        k_size = max(1, per // q_size)
        for q0 in range(0, queries, q_size):
            for k0 in range(0, keys, k_size):
                yield slice(q0, min(q0 + q_size, queries)), slice(k0, min(k0 + k_size, keys))

    def _attend(self, qh, kh, vh, context):
        xp = backend.array_module(qh)
        b, heads, dk = qh.shape[:3]
        dv = vh.shape[2]
        query = qh.reshape(b, heads, dk, -1)
        points = query.shape[-1]
        maximum = xp.full((b, heads, points), -numpy.inf, dtype=self.dtype)
        total = xp.zeros((b, heads, points), dtype=self.dtype)
        values = xp.zeros((b, heads, dv, points), dtype=self.dtype)
        size, rank = self._ring()[:2]
        block = xp.concatenate([kh, vh], axis=2)
        for s in range(size):
            owner = (rank + s) % size
            weights = self._weights(owner, qh)
            for qs, ks in self._chunks(b, heads, points, block.shape[-1]):
                state = OnlineSoftmax.over(xp, maximum[..., qs], total[..., qs], values[..., qs])
                keyed = block[:, :, dk:, ks]
                state.add(block_scores(query[..., qs], block[:, :, :dk, ks]), weights[ks][:, None],
                          lambda p, keyed=keyed: xp.matmul(keyed, p))
            if s < size - 1:
                block = self._pass(block, owner, context, dk + dv)
        attended = values / total[:, :, None]
        lse = maximum + xp.log(total)
        return attended.reshape((b, heads, dv) + self.tile_out), lse

    def _attend_backward(self, saved, a_bar, context):
        xp = backend.array_module(a_bar)
        qh, kh, vh, lse = saved["qh"], saved["kh"], saved["vh"], saved["lse"]
        b, heads, dk = qh.shape[:3]
        dv = vh.shape[2]
        query = qh.reshape(b, heads, dk, -1)
        y_bar = a_bar.reshape(b, heads, dv, -1)
        d = (y_bar * saved["attended"].reshape(y_bar.shape)).sum(axis=2)
        q_bar = xp.zeros_like(query)
        points = query.shape[-1]
        size, rank = self._ring()[:2]
        block = xp.concatenate([kh, vh, xp.zeros_like(kh), xp.zeros_like(vh)], axis=2)
        width = dk + dv
        for s in range(size):
            owner = (rank + s) % size
            weights = self._weights(owner, qh)
            keys, values = block[:, :, :dk], block[:, :, dk:width]
            k_bar, v_bar = block[:, :, width:width + dk], block[:, :, width + dk:]
            for qs, ks in self._chunks(b, heads, points, block.shape[-1]):
                ds, p = softmax_backward(block_scores(query[..., qs], keys[..., ks]), weights[ks][:, None],
                                         lse[..., qs], block_scores(y_bar[..., qs], values[..., ks]), d[..., qs])
                q_bar[..., qs] += xp.matmul(keys[..., ks], ds)
                k_bar[..., ks] += xp.matmul(query[..., qs], ds.swapaxes(-1, -2))
                v_bar[..., ks] += xp.matmul(y_bar[..., qs], p.swapaxes(-1, -2))
            if s < size - 1:
                block = self._pass(block, owner, context, 2 * width)
        if size > 1:   # the gradients of the previous rank's keys and values go home; ours come back
            block = self._pass(xp.ascontiguousarray(block[:, :, width:]), (rank - 1) % size, context, width)
        else:
            block = block[:, :, width:]
        return q_bar.reshape(qh.shape), block[:, :, :dk], block[:, :, dk:]
