"""The input points a rank's neighbourhoods reach, brought by one ``Alltoallv`` over the grid, and its adjoint.

A rank's output tile reaches, on each input ring ``hi``, one window of
longitudes (the hull of its points' arcs: :mod:`mpisphere.attention.arcs`),
the whole ring where the window covers it. Every rank computes every rank's
windows from the split alone, so each sends exactly the points of its own
input tile that another rank's windows hold, and receives each point it
reaches once: the minimum, with no halo of a fixed width and no ring of all
azimuth ranks. A cutoff of any width is served (rows of far polar ranks
come the same way).

The received points sit in an *extended row* per input ring: the window's
longitudes in ring order (``first`` at offset 0), the points past a whole
ring repeated locally, so that the output points of one phase read each
arc as a strided view (``attention.kernels``). The adjoint folds the
repeats, sends every point's gradient back to its owner and sums there.
"""

import numpy

from .. import backend, collectives
from ..tiling import RegularTiling

__all__ = ["NeighbourGather"]


def _windows(arcs, lat, lon):
    """``{hi: (first longitude, span)}``: the window of ring ``hi`` reached from the output tile ``lat x lon``."""
    found = {}
    for ho in range(lat.start, lat.stop):
        for phase, ring_arcs in enumerate(arcs.rows[ho]):
            columns = numpy.arange(lon.start, lon.stop)
            columns = columns[columns % arcs.period == phase]
            if not columns.size:
                continue
            low, high = (int(a) for a in arcs.anchor(columns[[0, -1]]))
            for hi, first, length in ring_arcs:
                start, stop = low + first, high + first + length
                if hi in found:
                    start, stop = min(start, found[hi][0]), max(stop, found[hi][0] + found[hi][1])
                found[hi] = (start, stop - start)
    return dict(sorted(found.items()))


class NeighbourGather:
    """One rank's extended rows of the input grid: their layout, the ``Alltoallv`` that fills them, its adjoint.

    Parameters
    ----------
    grid : ProcessGrid
    arcs : Arcs
        The neighbourhoods (:func:`~mpisphere.attention.arcs.neighbourhood_arcs`).

    Attributes
    ----------
    rows : dict
        ``{hi: (offset, first, span)}``: extended row ``hi`` holds the
        longitudes ``first + t`` (modulo ``nlon_in``) at ``offset + t``, ``t < span``.
    length : int
        The extended rows' points, repeats included.
    received : int
        The points received from other ranks (each once).
    """

    def __init__(self, grid, arcs):
        self.grid = grid
        nlon = arcs.in_shape[1]
        tiles_in, tiles_out = RegularTiling(grid, *arcs.in_shape), RegularTiling(grid, *arcs.out_shape)
        windows = [_windows(arcs, *tiles_out.slices(rank)) for rank in range(grid.size)]
        self.rows, offset = {}, 0
        for hi, (first, span) in windows[grid.rank].items():
            self.rows[hi] = (offset, first, span)
            offset += span
        self.length = offset
        lat, lon = tiles_in.slices()
        width = lon.stop - lon.start
        send, self.send_counts = [], []
        for rank in range(grid.size):                       # what each rank reaches in this rank's tile
            part = []
            for hi, (first, span) in windows[rank].items():
                if lat.start <= hi < lat.stop:
                    columns = (first + numpy.arange(min(span, nlon))) % nlon
                    own = columns[(columns >= lon.start) & (columns < lon.stop)]
                    part.append((hi - lat.start) * width + own - lon.start)
            send.append(numpy.concatenate(part) if part else numpy.zeros(0, dtype=numpy.int64))
            self.send_counts.append(send[-1].size)
        receive, self.receive_counts = [], []
        for rank in range(grid.size):                       # what this rank reaches in each rank's tile
            their_lat, their_lon = tiles_in.slices(rank)
            part = []
            for hi, (offset, first, span) in self.rows.items():
                if their_lat.start <= hi < their_lat.stop:
                    t = numpy.arange(min(span, nlon))
                    columns = (first + t) % nlon
                    part.append(offset + t[(columns >= their_lon.start) & (columns < their_lon.stop)])
            receive.append(numpy.concatenate(part) if part else numpy.zeros(0, dtype=numpy.int64))
            self.receive_counts.append(receive[-1].size)
        self._send = [index.astype(numpy.int64) for index in send]
        self._send_all = numpy.concatenate(self._send)
        self._receive = numpy.concatenate(receive).astype(numpy.int64)
        self.received = int(sum(self.receive_counts) - self.receive_counts[grid.rank])
        repeats = [(offset + t, offset + t % nlon) for offset, _, span in self.rows.values()
                   for t in range(nlon, span)]
        self._repeat_to = numpy.array([r[0] for r in repeats], dtype=numpy.int64)
        self._repeat_from = numpy.array([r[1] for r in repeats], dtype=numpy.int64)
        if max((span for _, _, span in self.rows.values()), default=0) > 2 * nlon:
            raise ValueError("an extended row longer than two rings")   # anchors span at most one ring
        self._device = {}

    def _indices(self, like):
        host = (self._send_all, self._receive, self._repeat_to, self._repeat_from) + tuple(self._send)
        return backend.on_device_of(like, host, self._device)

    def _displacements(self, counts, fields):
        counts = [c * fields for c in counts]
        return counts, [int(v) for v in numpy.concatenate([[0], numpy.cumsum(counts)[:-1]])]

    def forward(self, tile, staged=False):
        """``tile`` ``(F, h * w)`` (this rank's input points, F fields) -> its extended rows ``(F, length)``."""
        xp = backend.array_module(tile)
        send_all, receive, repeat_to, repeat_from = self._indices(tile)[:4]
        fields = tile.shape[0]
        outgoing = xp.ascontiguousarray(tile[:, send_all].T)
        incoming = xp.empty((self._receive.size, fields), dtype=tile.dtype)
        send_counts, send_displs = self._displacements(self.send_counts, fields)
        receive_counts, receive_displs = self._displacements(self.receive_counts, fields)
        collectives.alltoallv(self.grid.cart, outgoing.reshape(-1), send_counts, send_displs, incoming.reshape(-1),
                              receive_counts, receive_displs, staged=staged)
        rows = xp.zeros((fields, self.length), dtype=tile.dtype)
        rows[:, receive] = incoming.T
        if repeat_to.size:
            rows[:, repeat_to] = rows[:, repeat_from]
        return rows

    def adjoint(self, rows, tile, staged=False):
        """Add the adjoint of :meth:`forward` applied to ``rows`` ``(F, length)`` into ``tile`` ``(F, h * w)``.

        ``rows`` is consumed (its repeats are folded in place).
        """
        xp = backend.array_module(rows)
        indices = self._indices(rows)
        receive, repeat_to, repeat_from = indices[1:4]
        fields = rows.shape[0]
        if repeat_to.size:
            rows[:, repeat_from] += rows[:, repeat_to]
        outgoing = xp.ascontiguousarray(rows[:, receive].T)
        incoming = xp.empty((self._send_all.size, fields), dtype=rows.dtype)
        send_counts, send_displs = self._displacements(self.receive_counts, fields)
        receive_counts, receive_displs = self._displacements(self.send_counts, fields)
        collectives.alltoallv(self.grid.cart, outgoing.reshape(-1), send_counts, send_displs, incoming.reshape(-1),
                              receive_counts, receive_displs, staged=staged)
        start = 0
        for index in indices[4:]:       # a point reached by several ranks comes back once from each
            tile[:, index] += incoming[start:start + index.size].T
            start += index.size
