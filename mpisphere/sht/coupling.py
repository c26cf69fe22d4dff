"""The vector transforms' coupling of neighbouring degrees of their two components, as a pipeline stage."""

import math

import numpy

from .. import backend
from ..operators import FORWARD, Abilities, InputError
from .contraction import BATCH_INNERMOST, holds_columns
from ..stages.pipeline import LocalStage

__all__ = ["VectorCoupling"]


class _Stencil:
    """One direction of the coupling as a three-row stencil over degrees.

    Output row ``r`` (both components ``c``, this rank's orders ``j``)::

        out[r, j, c] = up[r, j, c] in[r + 1, j, c] + down[r, j, c] in[r - 1, j, c]
                       + diag[r, j, c] in[r, j, c] + swap[r, j] in[r, j, 1 - c]

    ``up``, ``down``, ``diag``: ``(n_out, m_loc, 2, 1)``, the component signs
    folded in; ``swap``: ``(n_out, m_loc, 1, 1)``; all of the transform's
    complex dtype (a product of two arrays of one dtype needs no casting
    buffer, which NumPy's mixed real-complex loops do). Each term is taken
    on the output rows whose input row exists.
    """

    def __init__(self, up, down, diag, swap, n_in, diagonal_columns):
        self.up, self.down, self.diag, self.swap = up, down, diag, swap
        n_out = up.shape[0]
        self.n_in, self.n_out = n_in, n_out
        self.same_rows = min(n_out, n_in)        # rows r with an input row r
        self.up_rows = min(n_out, n_in - 1)      # rows r with an input row r + 1
        self.down_rows = min(n_out, n_in + 1)    # rows r >= 1 with an input row r - 1
        self.diagonal_columns = diagonal_columns


class VectorCoupling(LocalStage):
    """Couple neighbouring degrees of the two components of a vector field's coefficients.

    With ``A``, ``B`` the two input components (``Lin`` degrees) and ``S``,
    ``T`` the outputs (``Lout`` degrees), per order::

        S_l = alpha_l A_{l+1} + beta_l A_{l-1} + delta_l A_l + i g_l B_l
        T_l = i g_l A_l - alpha_l B_{l+1} - beta_l B_{l-1} - delta_l B_l

    with real coefficients of shape ``(Lout, m_loc)`` (degrees outside
    ``0 .. Lin - 1`` count as zero). The vector transforms are a Legendre
    contraction of both components with ``P(l, m) / sin(theta)`` followed
    (analysis) or preceded (synthesis) by such a coupling: ``d P / d theta``
    and ``m P / sin(theta)`` are combinations of ``P / sin(theta)`` at
    neighbouring degrees. ``forward``: ``(B, 2, Lin, m_loc)`` ->
    ``(B, 2, Lout, m_loc)``; ``adjoint`` the transpose with conjugated
    coefficients. Fastest in the batch-innermost layout ``(L, m, 2, B)``.

    ``starts`` (increasing, one per order) is the first degree of each
    order's family: the transforms' Legendre step writes zeros below it and
    reads nothing there, so on the host the coupling skips the orders whose
    family starts above a block of rows (half of a triangular truncation) and
    writes zeros there.
    """

    _per_rank = ("alpha", "beta", "delta", "g", "starts")  # coefficients of this rank's orders

    def __init__(self, alpha, beta, delta, g, lin, dtype, layout, starts):
        super().__init__(layout)
        self.lin = lin
        self.lout, self.count = numpy.shape(alpha)
        self.dtype = numpy.dtype(dtype)
        self.alpha, self.beta, self.delta, self.g = (numpy.asarray(c, dtype=float) for c in (alpha, beta, delta, g))
        self.starts = numpy.asarray(starts, numpy.int64)
        if self.starts.shape != (self.count,) or numpy.any(numpy.diff(self.starts) < 0):
            raise ValueError(f"VectorCoupling: starts must be {self.count} increasing degrees")
        self._device = {}
        self._stencils = {}
        self._workspace = backend.Workspace()

    def _output(self, direction, spec):
        n_in, n_out = (self.lin, self.lout) if direction == FORWARD else (self.lout, self.lin)
        if len(spec.shape) != 4 or spec.shape[1:] != (2, n_in, self.count) or spec.dtype != self.dtype:
            raise InputError(f"expected (B, 2, {n_in}, {self.count}) {self.dtype.name}, got {spec.shape} "
                             f"{spec.dtype.name}")
        return spec.but(shape=(spec.shape[0], 2, n_out, self.count)), spec.describe()

    def _shapes(self, lead):
        return lead + (2, self.lin, self.count), lead + (2, self.lout, self.count)

    def abilities(self, direction):
        # adapts: a side in the caller's layout is copied through a cache-sized block (only the orders each
        # degree has), cheaper than a whole-array layout change next to the stage
        return Abilities(prefers=BATCH_INNERMOST, adapts=True)

    def _stencil(self, direction):
        """The :class:`_Stencil` of ``direction`` (host arrays), built once."""
        if direction not in self._stencils:
            self._stencils[direction] = self._build_stencil(direction)
        return self._stencils[direction]

    def _build_stencil(self, direction):
        lout, lin = self.lout, self.lin
        sign = numpy.array([1.0, -1.0])[None, None, :, None]
        alpha, beta, delta, g = (c[:, :, None, None] for c in (self.alpha, self.beta, self.delta, self.g))
        if direction == FORWARD:  # S_l from A_{l+1}, A_{l-1}, A_l and B_l
            n_out, n_in = lout, lin
            up, down, diag, swap = alpha * sign, beta * sign, delta * sign, 1j * g
        else:  # the transpose: result_k from s_{k-1} (alpha_{k-1}), s_{k+1} (beta_{k+1}), s_k and t_k
            n_out, n_in = lin, lout
            up = numpy.zeros((n_out, self.count, 2, 1))
            down = numpy.zeros_like(up)
            rows = min(n_out, n_in - 1)
            up[:rows] = beta[1:rows + 1] * sign
            rows = min(n_out, n_in + 1)
            down[1:rows] = alpha[:rows - 1] * sign
            diag, swap = numpy.zeros_like(up), numpy.zeros((n_out, self.count, 1, 1), complex)
            rows = min(n_out, n_in)
            diag[:rows], swap[:rows] = delta[:rows] * sign, -1j * g[:rows]
        columns = numpy.flatnonzero(numpy.any(diag != 0, axis=(0, 2, 3)))
        diagonal = slice(int(columns.min()), int(columns.max()) + 1) if columns.size else slice(0, 0)
        up, down, diag, swap = (numpy.ascontiguousarray(c[:n_out], dtype=self.dtype) for c in (up, down, diag, swap))
        return _Stencil(up, down, diag, swap, n_in, diagonal)

    # bytes of output per block on the host: a block's four passes stay in cache (about 4x faster at 361 x 720,
    # 32 winds, than whole arrays); on a GPU one block (fewer kernel launches)
    _HOST_BLOCK_BYTES = 1 << 20

    def _run(self, direction, x, out, context):
        stencil = self._stencil(direction)
        device = backend.device_kernels(x)  # one block: a fixed number of launches
        coefficients = backend.on_device_of(x, (stencil.up, stencil.down, stencil.diag, stencil.swap),
                                            self._device, direction)
        # (L, m, 2, B) views: rows are degrees, a (row, order) holds both components of the batch
        source, target = x.transpose(BATCH_INNERMOST), out.transpose(BATCH_INNERMOST)
        # a side in another layout (the caller's C order) is copied through a block of the batch-innermost one
        stage_in, stage_out = (not holds_columns(a) for a in (source, target))
        n_out, count = target.shape[:2]
        cell = target.shape[2] * target.shape[3] * target.itemsize
        if device:
            rows, columns = n_out, count
        else:
            columns = max(1, min(count, self._HOST_BLOCK_BYTES // max(cell, 1)))
            rows = max(1, self._HOST_BLOCK_BYTES // max(cell * count, 1)) if columns == count else 1
        for r0 in range(0, n_out, rows):
            r1 = min(r0 + rows, n_out)
            # orders whose family starts above row r1 (the last row's upper neighbour) have only zeros here
            held = count if device else int(numpy.searchsorted(self.starts, r1, side="right"))
            if held < count:
                target[r0:r1, held:] = 0
            for c0 in range(0, held, columns):
                cols = slice(c0, min(c0 + columns, held))
                src, first, src_cols = source, 0, cols
                if stage_in:  # the input rows this block reads: r0 - 1 .. r1
                    first, last = max(r0 - 1, 0), min(r1 + 1, stencil.n_in)
                    src, src_cols = self._block_buffer("in", source, max(last - first, 0), cols), slice(None)
                    backend.copy_into(src, source[first:last, cols])
                dst = self._block_buffer("out", target, r1 - r0, cols) if stage_out else target[r0:r1, cols]
                self._block(stencil, coefficients, (src, first, src_cols), dst, (r0, r1), cols)
                if stage_out:
                    backend.copy_into(target[r0:r1, cols], dst)

    def _block(self, stencil, coefficients, source, dst, rows, cols):
        """The stencil on output rows ``rows`` (a ``(start, stop)`` pair) and orders ``cols``, into ``dst``.

        ``source``: ``(array, first, columns)``, input row ``r`` of the
        orders ``cols`` being ``array[r - first, columns]``; ``dst[i]`` is
        output row ``rows[0] + i`` of those orders.
        """
        up, down, diag, swap = coefficients
        src, first, src_cols = source
        r0, r1 = rows
        hi = min(r1, stencil.same_rows)
        if hi > r0:
            numpy.multiply(swap[r0:hi, cols], src[r0 - first:hi - first, src_cols][:, :, ::-1], out=dst[:hi - r0])
        if hi < r1:
            dst[max(hi - r0, 0):] = 0
        d0 = max(cols.start, stencil.diagonal_columns.start)
        d1 = min(cols.stop, stencil.diagonal_columns.stop)
        if hi > r0 and d1 > d0:  # the diagonal term of order 0
            local = slice(d0 - cols.start, d1 - cols.start)
            dst[:hi - r0, local] += diag[r0:hi, d0:d1] * src[r0 - first:hi - first, src_cols][:, local]
        scratch = self._block_buffer("products", dst, r1 - r0, cols)
        for coefficient, shift, stop in ((up, 1, stencil.up_rows), (down, -1, stencil.down_rows)):
            lo, hi = max(r0, -shift), min(r1, stop)
            if hi > lo:
                part = scratch[:hi - lo]
                numpy.multiply(coefficient[lo:hi, cols], src[lo + shift - first:hi + shift - first, src_cols],
                               out=part)
                dst[lo - r0:hi - r0] += part

    def _block_buffer(self, name, like, rows, cols):
        """A reused batch-innermost ``(rows, len(cols), 2, B)`` buffer (``like``'s array type and device)."""
        shape = (rows, cols.stop - cols.start) + tuple(like.shape[2:])
        return self._workspace.scratch(name, like, math.prod(shape), like.dtype).reshape(shape)

