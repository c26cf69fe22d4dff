"""The DISCO contraction of one rank, along its orders: banded in latitude, diagonal in the order (no MPI).

Along a latitude row the convolution is a circular correlation in longitude,
so after a real FFT it is a product per order ``m``. Each output row draws on
a band of input rows (those within the cutoff), so one rank's contraction is,
per basis function ``k``,

    ``out[..., t, m] = sum_j table[k, j, t, m] * source[..., start[t] + j, m]``

over its own orders. A ``BandTable`` holds ``table`` and ``start`` for
one direction; the adjoint reads the same entries from the other side
(``band_tables`` builds both). Every table is a handful of rows wide,
whatever the resolution, and the loop runs over ``k`` and ``j`` only: the
operations issued do not grow with rows, channels or batch.
"""

import dataclasses

import numpy

from .. import backend
from ..strided import strided_pieces

__all__ = ["BandTable", "band_tables", "apply_band"]


@dataclasses.dataclass
class BandTable:
    """One direction's table.

    Attributes
    ----------
    table : ndarray, complex, shape ``(K, J, T, M)``
        Basis function, offset in the band, target row, order.
    start : ndarray of int, shape ``(T,)``
        The first source row (local) of each target row's band;
        ``start + J <= `` the number of source rows.
    """

    table: numpy.ndarray
    start: numpy.ndarray
    _device: dict = dataclasses.field(default_factory=dict)
    _blocks: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.pieces = strided_pieces(self.start)

    @property
    def width(self):
        return self.table.shape[1]

    @property
    def nbytes(self):
        return self.table.nbytes + self.start.nbytes

    def blocks(self, rows):
        """The table cut into blocks of at most ``rows`` target rows: ``[(targets, sources, table)]``.

        Block ``table`` writes the target rows ``targets`` (a slice) reading the source rows ``sources``
        (a slice), its ``start`` counted from ``sources.start``. A block of rows keeps a contraction's
        working set in the cache; the blocks are made once per ``rows``.
        """
        ntargets = self.table.shape[2]
        if rows >= ntargets:
            return [(slice(0, ntargets), slice(0, None), self)]
        if rows not in self._blocks:
            found = []
            for t0 in range(0, ntargets, rows):
                t1 = min(t0 + rows, ntargets)
                s0 = int(self.start[t0:t1].min())
                s1 = int(self.start[t0:t1].max()) + self.width
                found.append((slice(t0, t1), slice(s0, s1), BandTable(self.table[:, :, t0:t1], self.start[t0:t1] - s0)))
            self._blocks[rows] = found
        return self._blocks[rows]

    def on(self, like):
        """``(table, row indices (J, T))`` where ``like`` lives (copied to a GPU once)."""
        if "rows" not in self._device:
            self._device["rows"] = self.start[None, :] + numpy.arange(self.width)[:, None]
        return backend.on_device_of(like, (self.table, self._device["rows"]), self._device)


def _one_side(targets, sources, kernel, cols, values, kernel_size, ntargets, nsources, nfft, orders, conjugate,
              cdtype):
    """The table of the targets ``0 .. ntargets - 1`` reading sources ``0 .. nsources - 1`` (all local indices)."""
    lo = numpy.full(ntargets, numpy.iinfo(numpy.int64).max)
    hi = numpy.full(ntargets, -1)
    numpy.minimum.at(lo, targets, sources)
    numpy.maximum.at(hi, targets, sources)
    empty = hi < 0
    lo[empty], hi[empty] = 0, 0
    width = max(int((hi - lo).max()) + 1, 1) if ntargets else 1
    if width > nsources:
        raise AssertionError(f"a band of {width} rows in a window of {nsources}")
    # slide each band's window inside the source rows (the rows past a band get zero entries)
    start = numpy.minimum(lo, nsources - width)
    dense = numpy.zeros((kernel_size, width, ntargets, nfft))
    numpy.add.at(dense, (kernel, sources - start[targets], targets, cols), values)
    spectrum = numpy.fft.rfft(dense, axis=-1)[..., orders]
    if conjugate:
        spectrum = spectrum.conj()
    return BandTable(numpy.ascontiguousarray(spectrum, dtype=cdtype), start.astype(numpy.int64))


def band_tables(tensor, targets_of, sources_of, target_range, source_first, nsources, nfft, orders, convolve,
                cdtype):
    """The forward and adjoint tables of one rank.

    Parameters
    ----------
    tensor : ConvolutionTensor
    targets_of, sources_of : {"out_row", "in_row"}
        Which of the tensor's row indices are the rows the forward writes
        (targets) and reads (sources): a convolution writes ``out_row``
        reading ``in_row``; the transposed convolution the other way round.
    target_range : (int, int)
        The global target rows this rank writes, ``[t0, t1)``.
    source_first, nsources : int
        The global row of local source row 0 (halo included) and how many
        the rank holds.
    nfft : int
        Longitudes of the FFT (the tensor's ``in_shape[1]``).
    orders : ndarray of int
        The orders this rank holds.
    convolve : bool
        The forward is a convolution in longitude (the transposed
        convolution) rather than a correlation: its table is not conjugated.
    cdtype : complex dtype

    Returns
    -------
    forward, adjoint : BandTable
        ``adjoint`` writes the source rows reading the target rows.
    """
    t0, t1 = target_range
    targets = getattr(tensor, targets_of) - t0
    keep = (targets >= 0) & (targets < t1 - t0)
    targets = targets[keep]
    sources = getattr(tensor, sources_of)[keep] - source_first
    if sources.size and (sources.min() < 0 or sources.max() >= nsources):
        raise AssertionError("an entry reads a row outside this rank's rows and halo")
    kernel, cols, values = tensor.kernel[keep], tensor.in_col[keep], tensor.values[keep]
    forward = _one_side(targets, sources, kernel, cols, values, tensor.kernel_size, t1 - t0, nsources, nfft, orders,
                        not convolve, cdtype)
    adjoint = _one_side(sources, targets, kernel, cols, values, tensor.kernel_size, nsources, t1 - t0, nfft, orders,
                        convolve, cdtype)
    return forward, adjoint


def apply_band(band, k, source, out, scratch):
    """``out[..., t, m] = sum_j table[k, j, t, m] * source[..., start[t] + j, m]`` (overwrites ``out``).

    ``source``: ``(..., S, M)``; ``out`` and ``scratch``: ``(..., T, M)`` with the same leading axes,
    complex (``out`` may be a view). The source rows are read as strided views (``strided_pieces``), so no rows
    are copied; where the band's starts have no such structure they are gathered.
    """
    table, rows = band.on(source)
    xp = backend.array_module(source)
    for j in range(band.width):
        weights = table[k, j]
        if band.pieces is None:
            gathered = xp.take(source, rows[j], axis=-2, out=scratch) if xp is numpy else source[..., rows[j], :]
            if j == 0:
                xp.multiply(gathered, weights, out=out)
            else:
                gathered *= weights
                out += gathered
            continue
        for target, first, step in band.pieces:
            count = len(range(target.start, target.stop, target.step))
            view = source[..., first + j:first + j + step * (count - 1) + 1:step, :] if step else \
                source[..., first + j:first + j + 1, :]
            if j == 0:
                xp.multiply(view, weights[target], out=out[..., target, :])
            else:
                part = scratch[..., target, :]
                xp.multiply(view, weights[target], out=part)
                out[..., target, :] += part
