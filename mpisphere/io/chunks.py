"""Which rank stores which chunk of a variable, and which piece of whose part goes into it (no MPI, no Zarr).

A variable is a global array ``(*lead, n0, n1)`` spread over ``P`` ranks by
its last two axes: rank ``r`` holds the rows ``parts.rows[r]`` and the
columns ``parts.cols[r]`` (global indices, increasing) of every leading
index. Tiles spread rows (latitudes) and columns (longitudes) in
contiguous ranges; coefficient blocks spread rows (degrees) in ranges and
columns (orders) in any set (the balanced order layout).

The store's chunks are ``(1, ..., 1, rows, n1)``: one leading index, a band
of whole rows. Chunk ``k`` (C order over the leading indices, then the
bands) is stored by one rank, the owner: the chunks are split among the
``P`` ranks in contiguous runs (:func:`~mpisphere.split_sizes`), so no two
ranks ever write one chunk, whatever the splits of the parts. Moving the
pieces between parts and owners is one all-to-all: every rank cuts its
part into one piece per chunk it meets, in the owners' chunk order
(``ChunkPlan.pack_parts``), and every owner assembles its chunks from
the pieces of each rank in rank order (``ChunkPlan.unpack_regions``);
the pieces a rank keeps for its own chunks skip the exchange
(``ChunkPlan.copy_own``);
reading runs the same steps backwards. Both sides compute every offset from
the parts and the chunking alone, so no counts travel.
"""

import math

import numpy

from ..partition import split_offsets, split_sizes

__all__ = ["Parts", "ChunkPlan", "band_rows"]

# 4 MiB chunks: large enough that a file per chunk costs little, small enough that a band of a
# kilometre-scale field is still many chunks; Zarr's guidance is 1-100 MB.
TARGET_CHUNK_BYTES = 4 << 20


def _as_slice(index):
    """``index`` (increasing ints) as a slice when it is a contiguous range, else the array itself."""
    if len(index) == 0:
        return slice(0, 0)
    if index[-1] - index[0] + 1 == len(index):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


class Parts:
    """Who holds what of a ``(*lead, n0, n1)`` array: per rank, its global rows and columns.

    Parameters
    ----------
    n0, n1 : int
        Global extents of the two spread axes.
    rows, cols : list of int arrays
        One per rank, increasing global indices along axis ``-2`` and ``-1``;
        together the rank pairs cover the ``n0 x n1`` plane once.
    """

    def __init__(self, n0, n1, rows, cols):
        self.n0, self.n1 = int(n0), int(n1)
        self.rows = [numpy.asarray(r, dtype=numpy.int64) for r in rows]
        self.cols = [numpy.asarray(c, dtype=numpy.int64) for c in cols]
        self.size = len(self.rows)

    @classmethod
    def of_grid(cls, npolar, nazimuth, n0, n1, col_sets=None):
        """The parts of a ``npolar x nazimuth`` process grid (rank ``r`` at ``divmod(r, nazimuth)``).

        Rows are split by :func:`~mpisphere.split_sizes` over the polar
        ranks; columns too, unless ``col_sets`` gives each azimuth rank's
        columns (an order assignment).
        """
        row_sets = [numpy.arange(o, o + n) for o, n in zip(split_offsets(n0, npolar), split_sizes(n0, npolar))]
        if col_sets is None:
            col_sets = [numpy.arange(o, o + n) for o, n in zip(split_offsets(n1, nazimuth), split_sizes(n1, nazimuth))]
        rows, cols = [], []
        for r in range(npolar * nazimuth):
            p, a = divmod(r, nazimuth)
            rows.append(row_sets[p])
            cols.append(col_sets[a])
        return cls(n0, n1, rows, cols)

    def shape(self, rank):
        """``(rows, columns)`` of rank ``rank``'s part."""
        return len(self.rows[rank]), len(self.cols[rank])


def band_rows(n0, n1, itemsize, lead_size, ranks, target=TARGET_CHUNK_BYTES):
    """Rows per chunk: bands of whole rows near ``target`` bytes, and at least ``ranks`` chunks when possible.

    Parameters
    ----------
    n0, n1 : int
        The plane.
    itemsize : int
        Bytes per element.
    lead_size : int
        Product of the leading extents (chunks are one leading index deep).
    ranks : int
        Ranks that will share the chunks.
    """
    rows = max(1, min(n0, target // max(1, n1 * itemsize)))
    wanted_bands = math.ceil(ranks / max(1, lead_size))
    if math.ceil(n0 / rows) < wanted_bands:
        rows = max(1, math.ceil(n0 / wanted_bands))
    return rows


class ChunkPlan:
    """The chunks of one variable, their owners among ``owners`` ranks, and the pieces each part sends them.

    Parameters
    ----------
    parts : Parts
        Who holds what (``parts.size`` ranks; the owners are the same ranks).
    lead_shape : tuple of int
        The leading extents.
    rows : int
        Rows per chunk (bands of whole rows).
    lead_offset : int
        First leading index (along axis 0) of the parts within the stored
        variable: an append writes the chunks after the ones already there.
    """

    def __init__(self, parts, lead_shape, rows, lead_offset=0):
        self.parts = parts
        self.lead_shape = tuple(int(n) for n in lead_shape)
        self.lead_size = math.prod(self.lead_shape)
        self.rows = int(rows)
        self.lead_offset = int(lead_offset)
        self.bands = math.ceil(parts.n0 / self.rows) if parts.n0 else 0
        self.nchunks = self.lead_size * self.bands
        counts = split_sizes(self.nchunks, parts.size) if self.nchunks >= parts.size else \
            [1] * self.nchunks + [0] * (parts.size - self.nchunks)
        self.first = list(split_offsets(self.nchunks, parts.size)) if self.nchunks >= parts.size else \
            list(range(self.nchunks)) + [self.nchunks] * (parts.size - self.nchunks)
        self.counts = list(counts)
        # per band and rank: the part's local rows and the chunk rows they fill (slices or arrays)
        self._cuts = [[self._cut(band, r) for r in range(parts.size)] for band in range(self.bands)]
        self._cols = [_as_slice(c) for c in parts.cols]

    def _cut(self, band, r):
        lo, hi = band * self.rows, min((band + 1) * self.rows, self.parts.n0)
        rows = self.parts.rows[r]
        local = numpy.nonzero((rows >= lo) & (rows < hi))[0]
        return _as_slice(local), _as_slice(rows[local] - lo), len(local)

    # --- which chunks -----------------------------------------------------------------------

    def owned(self, rank):
        """Chunk numbers ``rank`` stores, increasing."""
        return range(self.first[rank], self.first[rank] + self.counts[rank])

    def chunk(self, k):
        """``(lead index (flat), band)`` of chunk ``k``."""
        return divmod(k, self.bands)

    def regions(self, rank):
        """``rank``'s chunks as regions: ``(lead index (flat), first band, last band + 1)``, runs of bands."""
        out = []
        for k in self.owned(rank):
            b, band = self.chunk(k)
            if out and out[-1][0] == b and out[-1][2] == band:
                out[-1][2] = band + 1
            else:
                out.append([b, band, band + 1])
        return [tuple(r) for r in out]

    def region_shape(self, region):
        """``(rows, n1)`` of a region."""
        _, first, stop = region
        return min(stop * self.rows, self.parts.n0) - first * self.rows, self.parts.n1

    def selection(self, region):
        """The region as an index into the stored variable (a tuple of ints and slices)."""
        b, first, stop = region
        lead = numpy.unravel_index(b, self.lead_shape) if self.lead_shape else ()
        lead = tuple(int(i) for i in lead)
        if lead:
            lead = (lead[0] + self.lead_offset,) + lead[1:]
        return lead + (slice(first * self.rows, min(stop * self.rows, self.parts.n0)), slice(None))

    # --- the all-to-all -----------------------------------------------------------------------

    def _pieces(self, owner, r):
        """The pieces between ``owner``'s chunks and rank ``r``'s part, in order: ``(b, band, cut)``."""
        for k in self.owned(owner):
            b, band = self.chunk(k)
            cut = self._cuts[band][r]
            if cut[2]:
                yield b, band, cut

    def counts_to_owners(self, rank):
        """Elements rank ``rank`` sends to each owner (and receives from each, reading); 0 to itself."""
        width = len(self.parts.cols[rank])
        return [0 if o == rank else sum(cut[2] for _, _, cut in self._pieces(o, rank)) * width
                for o in range(self.parts.size)]

    def counts_from_parts(self, rank):
        """Elements owner ``rank`` receives from each rank's part (and sends to each, reading); 0 from itself."""
        return [0 if r == rank else sum(cut[2] for _, _, cut in self._pieces(rank, r)) * len(self.parts.cols[r])
                for r in range(self.parts.size)]

    def _part_moves(self, rank, width):
        """The pieces of ``rank``'s part bound for other owners, in order: ``(b, local rows, buffer slice, n)``."""
        at = 0
        for o in range(self.parts.size):
            if o == rank:
                continue
            for b, _, (local, _, n) in self._pieces(o, rank):
                yield b, local, slice(at, at + n * width), n
                at += n * width

    def pack_parts(self, rank, part, buffer):
        """Cut ``part`` (``(lead_size, rows, cols)``, rank ``rank``'s) into ``buffer`` in the owners' order.

        The pieces of ``rank``'s own chunks are not packed: :meth:`copy_own`
        moves them without the exchange.
        """
        width = part.shape[-1]
        packed = 0
        for b, local, where, n in self._part_moves(rank, width):
            buffer[where].reshape(n, width)[...] = part[b, local]
            packed = where.stop
        return packed

    def unpack_parts(self, rank, buffer, part):
        """The reverse of :meth:`pack_parts`: fill ``part`` from ``buffer`` (all but the own pieces)."""
        width = part.shape[-1]
        for b, local, where, n in self._part_moves(rank, width):
            part[b, local] = buffer[where].reshape(n, width)

    def _region_of(self, rank):
        """``{k: (region index, row offset of chunk k inside its region)}`` for ``rank``'s chunks."""
        where = {}
        for i, (b, first, stop) in enumerate(self.regions(rank)):
            for band in range(first, stop):
                where[b * self.bands + band] = (i, (band - first) * self.rows)
        return where

    def _region_moves(self, rank, sources=None):
        """The pieces of ``rank``'s regions from ``sources`` (default: every other rank), in order.

        Yields ``(region, index into it, n, width, b, local rows)``; the index
        is a pair of slices or arrays, or an ``ix_`` pair when both are arrays.
        """
        where = self._region_of(rank)
        for r in (r for r in range(self.parts.size) if r != rank) if sources is None else sources:
            cols = self._cols[r]
            width = len(self.parts.cols[r])
            for b, band, (local, chunk_rows, n) in self._pieces(rank, r):
                i, offset = where[b * self.bands + band]
                rows = slice(chunk_rows.start + offset, chunk_rows.stop + offset) \
                    if isinstance(chunk_rows, slice) else chunk_rows + offset
                index = (rows, cols) if isinstance(rows, slice) or isinstance(cols, slice) else numpy.ix_(rows, cols)
                yield i, index, n, width, b, local

    def copy_own(self, rank, part, regions, to_regions=True):
        """The pieces of ``rank``'s part that go into its own chunks, copied directly (no exchange).

        ``to_regions``: from ``part`` into ``regions`` (writing), else back
        (reading).
        """
        for i, index, _, _, b, local in self._region_moves(rank, [rank]):
            if to_regions:
                regions[i][index] = part[b, local]
            else:
                part[b, local] = regions[i][index]

    def unpack_regions(self, rank, buffer, regions):
        """Assemble owner ``rank``'s ``regions`` (arrays of :meth:`region_shape`) from ``buffer``."""
        at = 0
        for i, index, n, width, _, _ in self._region_moves(rank):
            regions[i][index] = buffer[at:at + n * width].reshape(n, width)
            at += n * width
        return at

    def pack_regions(self, rank, regions, buffer):
        """The reverse of :meth:`unpack_regions`: cut owner ``rank``'s ``regions`` into ``buffer``."""
        at = 0
        for i, index, n, width, _, _ in self._region_moves(rank):
            buffer[at:at + n * width].reshape(n, width)[...] = regions[i][index]
            at += n * width
        return at
