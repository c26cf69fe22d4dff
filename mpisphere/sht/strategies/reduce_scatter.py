"""The ``"reduce-scatter"`` Legendre strategy: each rank contracts its own latitudes; tables shrink with the ranks.

No polar transposes: each rank contracts its own latitudes into every degree
(a partial sum) with tables of its orders at its latitudes only, and a
``Reduce_scatter`` over ``grid.polar`` completes the sums and splits the
degrees (the synthesis: an ``Allgatherv`` of the degrees, then each rank
evaluates its own latitudes). torch-harmonics 0.9.3's distributed
transforms do the same. On one polar rank a rank's latitudes are all of
them, symmetric about the equator: the tables are then the parity-split ones
of the ``"transpose"`` strategy (half the bytes and arithmetic).

Kernels: ``OwnLatitudeTables``, on the host one matrix product per
order ``(L - m, h) @ (h, 2 C B)`` (each order's slice stays in cache), on a
device one batched product over tables zero-padded to ``(m_loc, L, h)`` (a
fixed number of launches, whatever ``nlat``, ``lmax`` and the batch).
"""

import numpy

from ... import backend, dtypes
from ...legendre import associated_legendre
from ...operators import FORWARD, Abilities
from ..contraction import BATCH_INNERMOST, columns_or_copy
from ..tables import first_degrees
from .base import LegendreStrategy, OwnLatitudeStage, row_entries, triangle_entries
from .transpose import TRANSPOSE

__all__ = ["REDUCE_SCATTER", "ReduceScatter", "OwnLatitudeTables", "own_latitude_tables"]

_CHUNK = 16  # orders per recurrence run: bounds the temporary full table


class _RowTables:
    """Per order ``j``: ``tables[j]`` of shape ``(L - starts[j], nlat)``, degrees ``starts[j] .. L - 1``."""

    def __init__(self, degrees, orders, starts, dtype):
        self.degrees = degrees
        self.orders = list(orders)
        self.starts = list(starts)
        self.dtype = numpy.dtype(dtype)
        self.tables = []
        self._padded = None
        self._device = {}

    def nbytes(self):
        return sum(t.nbytes for t in self.tables)

    def padded(self, like):
        """All orders' tables zero-padded to one ``(m_loc, L, nlat)`` array where ``like`` lives (made once).

        Row ``l`` of order ``j`` is degree ``l`` (zero below ``starts[j]``):
        a batched product writes every degree of every order at once.
        """
        if self._padded is None:
            nlat = self.tables[0].shape[1] if self.tables else 0
            self._padded = numpy.zeros((len(self.orders), self.degrees, nlat), self.dtype)
            for j, (start, table) in enumerate(zip(self.starts, self.tables)):
                self._padded[j, start:] = table
        return backend.on_device_of(like, self._padded, self._device, "padded")


def own_latitude_tables(kind, lmax, orders, theta, norm, csphase, inverse, dtype):
    """Tables of ``orders`` at the colatitudes ``theta`` (any subset of a grid's), without weights.

    ``kind="scalar"``: ``P(l, m)`` in ``norm``, degrees ``m .. lmax - 1``.
    ``kind="vector"``: as :func:`mpisphere.sht.tables.vector_tables` (``P /
    sin(theta)``, orthonormal, degrees ``max(m, 1) .. lmax``).
    """
    orders = [int(m) for m in orders]
    vector = kind == "vector"
    starts = first_degrees(orders, vector).tolist()
    top = lmax + 1 if vector else lmax
    tables = _RowTables(top, orders, starts, dtype)
    for first in range(0, len(orders), _CHUNK):
        block = orders[first:first + _CHUNK]
        if vector:
            positive = [m for m in block if m > 0]
            divided = associated_legendre(top, positive, theta, "ortho", csphase, divide_by_sin=True) \
                if positive else None
            rows = [divided[positive.index(m)] if m > 0 else
                    associated_legendre(top, [1], theta, "ortho", csphase=False)[0] for m in block]
        else:
            rows = list(associated_legendre(top, block, theta, norm, csphase, inverse))
        for start, values in zip(starts[first:first + _CHUNK], rows):
            tables.tables.append(numpy.ascontiguousarray(values[start:], dtype=tables.dtype))
    return tables


class OwnLatitudeTables(OwnLatitudeStage):
    """The partial Legendre contraction of this rank's latitudes, from its own tables.

    Parameters
    ----------
    tables : from :func:`own_latitude_tables`
    nlat : int
        This rank's latitudes.
    dtype : complex64 or complex128
    layout : Layout
    weights : ndarray ``(nlat,)``, optional
        Applied in the contraction (an analysis: ``2 pi`` times this rank's
        quadrature weights).

    Notes
    -----
    Works on the batch-innermost layout (the batch and component columns of
    an order contiguous, as real ``(n, m_loc, 2 C B)``). Host: one matrix
    product per order, ``(L - m, nlat) @ (nlat, 2 C B)``. Device (and
    :attr:`mpisphere.config.device_kernels`): one batched product over the
    zero-padded ``(m_loc, L, nlat)`` tables, uploaded once per device.
    """

    _per_rank = ("tables", "weights")  # this rank's latitudes and orders

    def __init__(self, tables, nlat, dtype, layout, weights=None):
        super().__init__(layout)
        self.tables, self.nlat = tables, nlat
        self.orders, self.degrees = tables.orders, tables.degrees
        self.dtype = numpy.dtype(dtype)
        real = dtypes.real_of(self.dtype)
        self.weights = None if weights is None else numpy.ascontiguousarray(weights, dtype=real)
        self._device = {}
        self._workspace = backend.Workspace()

    def abilities(self, direction):
        return Abilities(prefers=BATCH_INNERMOST)

    def _run(self, direction, x, out, context):
        xp = backend.array_module(x)
        source, _ = columns_or_copy(x, self._workspace, "in", copy_in=True)
        target, staged = columns_or_copy(out, self._workspace, "out", copy_in=False)
        weights = None if self.weights is None else backend.on_device_of(x, self.weights, self._device, "weights")
        if direction == FORWARD and weights is not None:
            scaled = self._workspace.scratch("scaled", source, source.size, source.dtype).reshape(source.shape)
            xp.multiply(source, weights[:, None, None], out=scaled)
            source = scaled
        if backend.device_kernels(x):
            self._batched(xp, direction, source, target)
        else:
            self._per_order(xp, direction, source, target)
        if direction != FORWARD and weights is not None:
            target *= weights[:, None, None]
        if staged is not None:
            backend.copy_into(out.transpose(BATCH_INNERMOST), staged)

    def _per_order(self, xp, direction, source, target):
        tables = self.tables
        for j, (start, table) in enumerate(zip(tables.starts, tables.tables)):
            if direction == FORWARD:
                target[:start, j] = 0
                xp.matmul(table, source[:, j], out=target[start:, j])
            else:
                xp.matmul(table.T, source[start:, j], out=target[:, j])

    def _batched(self, xp, direction, source, target):
        whole = self.tables.padded(source)  # (m, L, h), zero below each order's first degree
        if direction == FORWARD:  # (m, L, h) @ (m, h, K) -> (m, L, K)
            target[...] = xp.matmul(whole, source.transpose(1, 0, 2)).transpose(1, 0, 2)
        else:  # (m, h, L) @ (m, L, K) -> (m, h, K)
            target[...] = xp.matmul(whole.transpose(0, 2, 1), source.transpose(1, 0, 2)).transpose(1, 0, 2)


class ReduceScatter(LegendreStrategy):
    name = "reduce-scatter"
    polar_transposes = False
    runs_on_device = True
    summary = ("a polar Reduce_scatter of every degree's partial sums; tables of a rank's own latitudes only, "
               "which shrink with every polar rank")

    def build_tables(self, request):
        r = request
        if r.npolar == 1:  # every latitude, symmetric about the equator: the parity-split tables
            return TRANSPOSE.build_tables(r)
        return own_latitude_tables(r.kind, r.lmax, r.orders, r.own_theta, "ortho" if r.vector else r.norm,
                                   r.csphase, r.synthesis, r.dtype)

    def stage(self, request, tables):
        r = request
        if r.npolar == 1:
            return TRANSPOSE.stage(r, tables)
        return OwnLatitudeTables(tables, len(r.own_theta), r.cdtype, r.layout, r.own_weights())

    def _entries(self, lmax, mine, nlat, h, npolar, vector):
        return triangle_entries(lmax, mine, nlat, vector) if npolar == 1 else row_entries(lmax, mine, h, vector)

    def table_bytes(self, nlat, lmax, mmax, npolar, nazimuth, *, vector=False, dtype=numpy.float64,
                    orders="contiguous"):
        return numpy.dtype(dtype).itemsize * self.largest(
            nlat, lmax, mmax, npolar, nazimuth, orders,
            lambda mine, h: self._entries(lmax, mine, nlat, h, npolar, vector))

    def values(self, lmax, orders, nlat, h, npolar, vector=False):
        return self._entries(lmax, orders, nlat, h, npolar, vector)

    def seconds(self, model, nlat, lmax, mmax, npolar, nazimuth, batch, *, vector=False, dtype=numpy.float64,
                orders="contiguous", synthesis=False):
        entries = self.table_bytes(nlat, lmax, mmax, npolar, nazimuth, vector=vector, orders=orders,
                                   dtype=numpy.int8)
        fields = (2 if vector else 1) * batch
        return model.table_product_seconds(entries, 2 * fields, dtype, vector, synthesis)


REDUCE_SCATTER = ReduceScatter()
