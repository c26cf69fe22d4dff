"""The vector transforms' coupling of neighbouring degrees of their two components, as a pipeline stage."""

import math

import numpy

from .. import backend, dtypes
from ..operators import FORWARD, Abilities, InputError
from .contraction import BATCH_INNERMOST
from .pipeline import LocalStage

__all__ = ["VectorCoupling"]


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
    """

    _per_rank = ("alpha", "beta", "delta", "g")  # coefficients of this rank's orders

    def __init__(self, alpha, beta, delta, g, lin, dtype, layout):
        super().__init__(layout)
        self.lin = lin
        self.lout, self.count = alpha.shape
        self.dtype = numpy.dtype(dtype)
        real = dtypes.real_of(self.dtype)
        self.alpha, self.beta, self.delta, self.g = (numpy.asarray(c, dtype=real)[:, :, None]
                                                     for c in (alpha, beta, delta, g))
        self._device = {}
        self._workspace = backend.Workspace()
        nonzero = numpy.flatnonzero(numpy.any(self.delta[:, :, 0] != 0, axis=0))
        self._delta_columns = slice(int(nonzero.min()), int(nonzero.max()) + 1) if nonzero.size else slice(0, 0)

    def _output(self, direction, spec):
        n_in, n_out = (self.lin, self.lout) if direction == FORWARD else (self.lout, self.lin)
        if len(spec.shape) != 4 or spec.shape[1:] != (2, n_in, self.count) or spec.dtype != self.dtype:
            raise InputError(f"expected (B, 2, {n_in}, {self.count}) {self.dtype.name}, got {spec.shape} "
                             f"{spec.dtype.name}")
        return spec.but(shape=(spec.shape[0], 2, n_out, self.count)), spec.describe()

    def _shapes(self, lead):
        return lead + (2, self.lin, self.count), lead + (2, self.lout, self.count)

    def abilities(self, direction):
        return Abilities(prefers=BATCH_INNERMOST)

    def _coefficients(self, like):
        """``(alpha, beta, delta, g)`` where ``like`` lives."""
        return backend.on_device_of(like, (self.alpha, self.beta, self.delta, self.g), self._device)

    # orders per block on the host: the six passes of a block stay in cache instead of six passes over memory
    # (about 4x faster at 361 x 720, 32 winds); on a GPU one block (fewer kernel launches)
    _HOST_BLOCK_BYTES = 1 << 20

    def _run(self, direction, x, out, context):
        # component c of a (B, 2, L, m) array as (L, m, B): a view in the batch-innermost layout
        a, b = (x[:, c].transpose(1, 2, 0) for c in (0, 1))
        s, t = (out[:, c].transpose(1, 2, 0) for c in (0, 1))
        coefficients = self._coefficients(x)
        per_order = max(self.lin, self.lout) * x.shape[0] * x.itemsize
        step = self.count if backend.is_device_array(x) else max(1, self._HOST_BLOCK_BYTES // max(per_order, 1))
        for first in range(0, self.count, step):
            orders = slice(first, min(first + step, self.count))
            alpha, beta, delta, g = (c[:, orders] for c in coefficients)
            ab, bb, sb, tb = (v[:, orders] for v in (a, b, s, t))
            if direction == FORWARD:
                self._couple(ab, bb, sb, alpha, beta, delta, g, +1, orders)
                self._couple(bb, ab, tb, alpha, beta, delta, g, -1, orders)
            else:
                self._transpose(ab, bb, sb, alpha, beta, delta, g, +1, orders)
                self._transpose(bb, ab, tb, alpha, beta, delta, g, -1, orders)

    def _couple(self, same, other, result, alpha, beta, delta, g, sign, orders):
        """``result_l = sign (alpha_l same_{l+1} + beta_l same_{l-1} + delta_l same_l) + i g_l other_l``."""
        lin, lout = self.lin, self.lout
        n = min(lin, lout)
        numpy.multiply(1j * g[:n], other[:n], out=result[:n])
        result[n:] = 0
        self._add_diagonal(result[:n], same[:n], delta[:n], sign, orders)
        scratch = self._scratch(result)
        for coef, shift in ((alpha, 1), (beta, -1)):
            lo, hi = max(0, -shift), min(lout, lin - shift)  # l with 0 <= l + shift < lin
            if hi > lo:
                part = scratch[lo:hi]
                numpy.multiply(sign * coef[lo:hi], same[lo + shift:hi + shift], out=part)
                result[lo:hi] += part

    def _transpose(self, s, t, result, alpha, beta, delta, g, sign, orders):
        """The adjoint of :meth:`_couple`: ``result_k = sign (alpha_{k-1} s_{k-1} + beta_{k+1} s_{k+1} +
        delta_k s_k) - i g_k t_k`` (``s`` the same output component, ``t`` the other)."""
        lin, lout = self.lin, self.lout
        n = min(lin, lout)
        numpy.multiply(-1j * g[:n], t[:n], out=result[:n])
        result[n:] = 0
        self._add_diagonal(result[:n], s[:n], delta[:n], sign, orders)
        scratch = self._scratch(result)
        for coef, shift in ((alpha, 1), (beta, -1)):
            lo, hi = max(0, -shift), min(lout, lin - shift)  # output degree l feeds input degree l + shift
            if hi > lo:
                part = scratch[lo:hi]
                numpy.multiply(sign * coef[lo:hi], s[lo:hi], out=part)
                result[lo + shift:hi + shift] += part

    def _add_diagonal(self, result, same, delta, sign, orders):
        """``result += sign delta same``, on the orders where ``delta`` is not zero (``m = 0`` only).

        The arrays hold the block of orders ``orders`` (a slice of this rank's orders).
        """
        start = max(self._delta_columns.start, orders.start) - orders.start
        stop = min(self._delta_columns.stop, orders.stop) - orders.start
        if stop > start:
            columns = slice(start, stop)
            result[:, columns] += (sign * delta[:, columns]) * same[:, columns]

    def _scratch(self, like):
        """A reused ``(L, orders, B)`` buffer for the products (the backend's array type, ``like``'s device)."""
        shape = (max(self.lin, self.lout),) + tuple(like.shape[1:])
        return self._workspace.scratch("coupling", like, math.prod(shape), like.dtype).reshape(shape)
