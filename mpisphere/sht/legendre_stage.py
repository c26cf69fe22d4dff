"""The Legendre step of a transform as a pipeline stage (the contraction itself: :mod:`.contraction`)."""

import functools

import numpy

from .. import backend, dtypes
from ..operators import ADJOINT, FORWARD, Abilities, InputError
from . import contraction
from .contraction import BATCH_INNERMOST
from ..stages.pipeline import LocalStage

__all__ = ["LegendreStage"]


class LegendreStage(LocalStage):
    """The Legendre contraction of a rank's orders as a stage.

    ``forward``: ``(B, C, nlat, m_loc)`` complex -> ``(B, C, L, m_loc)``,
    ``c[l] = sum_k T[l, k] X[k]`` per order; ``adjoint`` its transpose. Both
    sides are fastest held as ``(n, m_loc, C, B)`` in memory (the batch and
    component columns of one order contiguous); other layouts are copied in.

    Parameters
    ----------
    tables : LegendreTables
    nlat : int
    dtype : complex64 or complex128
    method : {"auto", "per-order", "batched"}
    layout : Layout
    weights : ndarray ``(nlat,)``, optional
        Latitude weights applied in the contraction (an analysis: ``2 pi``
        times the quadrature weights), so that the tables themselves are
        unweighted and shared with the synthesis.
    """

    _per_rank = ("tables", "weights")  # this rank's orders' functions

    def __init__(self, tables, nlat, dtype, method, layout, weights=None):
        super().__init__(layout)
        self.tables = tables
        real = dtypes.real_of(dtype)
        self.weights = None if weights is None else numpy.ascontiguousarray(weights, dtype=real)
        self._device = {}
        self.nlat = nlat
        self.dtype = numpy.dtype(dtype)
        self.method = method
        self._workspace = backend.Workspace()
        self._triangular = contraction.degrees_are_triangular(tables)

    def _output(self, direction, spec):
        n_in, n_out = (self.nlat, self.tables.degrees) if direction == FORWARD else (self.tables.degrees, self.nlat)
        count = len(self.tables.orders)
        if len(spec.shape) != 4 or spec.shape[2:] != (n_in, count) or spec.dtype != self.dtype:
            raise InputError(f"expected (B, C, {n_in}, {count}) {self.dtype.name}, got {spec.shape} {spec.dtype.name}")
        return spec.but(shape=spec.shape[:2] + (n_out, count)), spec.describe()

    def _shapes(self, lead):
        count = len(self.tables.orders)
        return lead + (self.nlat, count), lead + (self.tables.degrees, count)

    def _weights(self, like):
        """The weights where ``like`` lives, or None."""
        return None if self.weights is None else backend.on_device_of(like, self.weights, self._device)

    def abilities(self, direction):
        # in place: the contraction reads all of an order's input column before it writes that order's output
        # column; adapts: an input or output in another layout is copied through the other side's memory
        return Abilities(prefers=BATCH_INNERMOST, adapts=True, in_place=True,
                         consume=functools.partial(self._run_consuming, direction))

    def _contract(self, direction, source, target, like, zero=True):
        if direction == FORWARD:
            contraction.analyze(self.tables, source, target, self._workspace, self.method, self._weights(like),
                                zero)
        else:
            contraction.synthesize(self.tables, source, target, self._workspace, self.method, self._weights(like))

    def _run(self, direction, x, out, context):
        self._run_consuming(direction, x, out, context, consuming=False)

    def _run_consuming(self, direction, x, out, context, nonzero=None, consuming=True):
        """:meth:`_run`, allowed to overwrite ``x`` when ``consuming`` (a pipeline's own buffer).

        An input or output in another layout (the caller's C order, on a
        grid where the degree transpose is an identity) is copied through
        the other side's memory rather than a buffer of its own: the
        synthesis copies its input into its output's memory and contracts
        in place; the analysis contracts in place in its input and copies
        out. Both copy only the degrees each order has.
        """
        source, target = contraction.columns_of(x), contraction.columns_of(out)
        # half a copy where the degrees of the orders form a triangle (per-row copies: host only)
        triangle = self._triangular and not backend.device_kernels(x)
        if source is not None and target is not None:
            self._contract(direction, source, target, x)
            return
        if source is None and target is not None and x.shape[2] <= out.shape[2]:
            staged = backend.as_strided(out, x.shape, out.strides)
            if triangle and direction == ADJOINT:  # the input's rows are degrees
                contraction.copy_degrees(self.tables, x, staged, zero=False)
            else:
                backend.copy_into(staged, x)
            self._contract(direction, contraction.columns_of(staged), target, x)
            return
        if target is None and source is not None and consuming and out.shape[2] <= x.shape[2]:
            result = backend.as_strided(x, out.shape, x.strides)
            triangle = triangle and direction == FORWARD  # the output's rows are degrees
            self._contract(direction, source, contraction.columns_of(result), x, zero=not triangle)
            if triangle:
                contraction.copy_degrees(self.tables, result, out)
            else:
                backend.copy_into(out, result)
            return
        # neither side can lend its memory: a buffer of this stage's own
        if source is None:
            staged = self._workspace.scratch("in", x, x.size).reshape(x.transpose(BATCH_INNERMOST).shape)
            backend.copy_into(staged, x.transpose(BATCH_INNERMOST))
            source = contraction.real_columns(staged)
        scratch = None
        if target is None:
            scratch = self._workspace.scratch("out", out, out.size).reshape(out.transpose(BATCH_INNERMOST).shape)
            target = contraction.real_columns(scratch)
        self._contract(direction, source, target, x)
        if scratch is not None:
            backend.copy_into(out.transpose(BATCH_INNERMOST), scratch)
