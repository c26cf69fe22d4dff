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
        self.received = int(sum(self.receive_counts) - self.receive_counts[grid.rank])
        if max((span for _, _, span in self.rows.values()), default=0) > 2 * nlon:
            raise ValueError("an extended row longer than two rings")   # anchors span at most one ring
        self._send = [index.astype(numpy.int64) for index in send]
        self._tables = self._gather_tables(receive, nlon, width * (lat.stop - lat.start))
        self._device = {}
        self._workspace = backend.Workspace()   # the staged exchange's host buffers

    def _gather_tables(self, receive, nlon, points):
        """Every scatter of the exchange as gathers (``take`` is several times faster than a fancy ``+=``).

        ``ext``: for each extended-row position, its column among the received blocks (sources in rank
        order; a repeat reads its ring's first copy). ``back``: for each received point, its two positions
        in the extended rows (the second a repeat, or ``length``: a column of zeros). ``home``: for each
        point of this rank's tile, its columns among the blocks sent back (as many rows as ranks reach
        one point, the rest the zero column ``sum(send_counts)``).
        """
        received = numpy.concatenate(receive).astype(numpy.int64) if receive else numpy.zeros(0, numpy.int64)
        ext = numpy.full(self.length, -1, dtype=numpy.int64)
        ext[received] = numpy.arange(received.size)
        second = numpy.full(received.size, self.length, dtype=numpy.int64)
        for offset, _, span in self.rows.values():
            for t in range(nlon, span):
                ext[offset + t] = ext[offset + t % nlon]
                second[ext[offset + t % nlon]] = offset + t
        if (ext < 0).any():
            raise ValueError("an extended row's point that no rank sends")   # the windows are split by the tiles
        sent = numpy.concatenate(self._send) if self._send else numpy.zeros(0, numpy.int64)
        depth = int(numpy.bincount(sent, minlength=points).max()) if sent.size else 0
        home = numpy.full((depth, points), sent.size, dtype=numpy.int64)
        filled = numpy.zeros(points, dtype=numpy.int64)
        for j, t in enumerate(sent):
            home[filled[t], t] = j
            filled[t] += 1
        return ext, numpy.stack([received, second]) if received.size else numpy.zeros((2, 0), numpy.int64), home

    def _indices(self, like):
        return backend.on_device_of(like, tuple(self._send) + self._tables, self._device)

    def _exchange(self, blocks, counts_out, counts_in, fields, like, staged):
        """Each rank's block ``(F, n)`` to it, this rank's own kept: the received blocks side by side."""
        xp = backend.array_module(like)
        rank, size = self.grid.rank, self.grid.size
        if size == 1:
            return blocks[0]
        outgoing = xp.concatenate([blocks[r].reshape(-1) for r in range(size) if r != rank])
        incoming = xp.empty(fields * (sum(counts_in) - counts_in[rank]), dtype=like.dtype)
        send = [0 if r == rank else c * fields for r, c in enumerate(counts_out)]
        receive = [0 if r == rank else c * fields for r, c in enumerate(counts_in)]
        collectives.alltoallv(self.grid.cart, outgoing, send, _offsets(send), incoming, receive, _offsets(receive),
                              staged=staged, workspace=self._workspace)
        found, start = [], 0
        for r, count in enumerate(counts_in):
            if r == rank:
                found.append(blocks[rank])
            else:
                found.append(incoming[start:start + count * fields].reshape(fields, count))
                start += count * fields
        return xp.concatenate(found, axis=1)

    def forward(self, tile, staged=False):
        """``tile`` ``(F, h * w)`` (this rank's input points, F fields) -> its extended rows ``(F, length)``."""
        xp = backend.array_module(tile)
        indices = self._indices(tile)
        blocks = [xp.take(tile, index, axis=1) for index in indices[:self.grid.size]]
        received = self._exchange(blocks, self.send_counts, self.receive_counts, tile.shape[0], tile, staged)
        return xp.take(received, indices[self.grid.size], axis=1)

    def adjoint(self, rows, tile, staged=False):
        """Add the adjoint of :meth:`forward` applied to ``rows`` ``(F, length)`` into ``tile`` ``(F, h * w)``."""
        xp = backend.array_module(rows)
        indices = self._indices(rows)
        back, home = indices[self.grid.size + 1:]
        fields = rows.shape[0]
        padded = xp.concatenate([rows, xp.zeros((fields, 1), dtype=rows.dtype)], axis=1)
        received = xp.take(padded, back[0], axis=1) + xp.take(padded, back[1], axis=1)
        blocks, start = [], 0
        for count in self.receive_counts:
            blocks.append(received[:, start:start + count])
            start += count
        returned = self._exchange(blocks, self.receive_counts, self.send_counts, fields, rows, staged)
        returned = xp.concatenate([returned, xp.zeros((fields, 1), dtype=rows.dtype)], axis=1)
        for columns in home:         # a point reached by several ranks: one row of columns per rank
            tile += xp.take(returned, columns, axis=1)


def _offsets(counts):
    return [int(v) for v in numpy.concatenate([[0], numpy.cumsum(counts)[:-1]])]
