"""The ``"table-free"`` Legendre strategy: ducc0 evaluates the functions on the fly, no tables at all (host arrays).

The polar exchange of ``"reduce-scatter"`` (each rank contracts its own
latitudes into every degree, a ``Reduce_scatter`` completes the sums), with
no tables: ducc0's ``leg2alm``/``alm2leg`` evaluate the associated Legendre
functions by their recurrence for any set of latitudes and orders, so memory
is the batch only. For grids whose tables fit nowhere (2049 x 4096 and
finer), and on one rank for a few fields, where a table product reads the
whole table for little work (``legendre="auto"`` picks it per batch there,
see :mod:`mpisphere.sht.costs`).

ducc0 has no batch axis and takes each order once per call, so the kernel
calls it once per field and vector component: a host strategy (CuPy arrays
are refused before any rank communicates).

ducc0's AVX2 build raises the overflow flag in SIMD lanes whose values it
discards (its AVX-512 build does not): the kernel runs under
``mpisphere.fpenv.HeldTraps``, so a caller with floating-point traps
on (a Fortran debug build) sees its own environment back, and a flag only
where an output is not finite.
"""

import numpy

from ... import backend, dtypes
from ...fpenv import HeldTraps
from ...legendre import associated_legendre, degree_factors
from ...operators import FORWARD
from ..tables import first_degrees
from .base import LegendreStrategy, OwnLatitudeStage, row_entries

__all__ = ["TABLE_FREE", "TableFree", "TableFreeLegendre"]


class TableFreeLegendre(OwnLatitudeStage):
    """The partial contraction of a rank's own latitudes with no tables: ducc0 evaluates the functions (host arrays).

    Parameters
    ----------
    lmax : int
        Degrees ``0 .. lmax - 1`` (a vector transform's ``lmax + 1``).
    orders : int array
        This rank's orders.
    theta : ndarray
        This rank's colatitudes.
    norm : {"ortho", "schmidt", "four-pi"}
    csphase : bool
    inverse : bool
        The norm's synthesis factors (the table of an inverse transform).
    dtype : complex64 or complex128
    layout : Layout
    weights : ndarray, optional
        Latitude weights applied in the contraction (an analysis: ``2 pi``
        times the quadrature weights).
    vector : bool
        The vector transforms' functions instead (see
        :func:`~mpisphere.sht.tables.vector_tables`): ``P(l, m) / sin(theta)``
        for ``m >= 1``, ``P(l, 1)`` without the Condon-Shortley phase for
        order 0, orthonormal (the norm is the degree coupling's).

    Notes
    -----
    ducc0's functions are the orthonormal ones with the Condon-Shortley
    phase, ``P(l, m)`` of torch-harmonics' ``"ortho"`` norm to the last bits:
    the norm's degree factors and, without ``csphase``, ``(-1)^m`` are
    applied to the coefficients. Forward: ``c = f(l) s_m leg2alm(w X)``;
    adjoint: ``X = w alm2leg(f(l) s_m c)`` (``leg2alm`` and ``alm2leg`` are
    each other's transposes). Where ``f(l) s_m`` or ``w`` are all ones (the
    default norm and phase; a synthesis) ducc0 reads and writes the caller's
    arrays in place, strided, with no pass of its own. The vector functions
    are spin-0 ones too: ``1 / sin(theta)`` joins the latitude weights, and
    order 0 asks ducc0 for order 1. At a pole ``P(l, m) / sin(theta)`` is a
    limit (not zero for ``m = 1``) that no product gives: those latitudes
    take their values from :func:`~mpisphere.legendre.associated_legendre`.
    """

    _per_rank = ("orders", "theta", "weights")  # this rank's orders and latitudes

    def __init__(self, lmax, orders, theta, norm, csphase, inverse, dtype, layout, weights=None, vector=False):
        super().__init__(layout)
        import ducc0.sht  # noqa: F401 -- fail at construction, not in the first call
        self.degrees, self.nlat = lmax, len(theta)
        self.orders = [int(m) for m in orders]
        self.theta = numpy.ascontiguousarray(theta, dtype=numpy.float64)
        self.dtype = numpy.dtype(dtype)
        real = dtypes.real_of(self.dtype)
        orders = numpy.array(self.orders, dtype=numpy.int64)
        functions = first_degrees(orders, vector)  # the order of each column's functions (its first degree)
        if vector:  # P(l, 1) of order 0 without the phase ducc0 includes
            signs = numpy.where(orders == 0, -1.0, 1.0 if csphase else (-1.0) ** orders)
            factors = numpy.ones(lmax)
        else:
            signs = numpy.where((orders % 2 == 0) | csphase, 1.0, -1.0)
            factors = degree_factors(lmax, norm, inverse)
        # zero below each column's first degree, where ducc0 writes nothing: a product with it writes those zeros
        self._lower = numpy.arange(lmax)[:, None] < functions[None, :]
        scale = factors[:, None] * signs[None, :]
        self._unit_scale = bool(numpy.all(scale == 1.0))
        self.scale = numpy.where(self._lower, 0.0, scale).astype(real)
        self.weights = self._latitude_factors(weights, orders, vector).astype(real)
        self._unit_weights = bool(numpy.all(self.weights == 1.0))
        # the factors as real pairs, (rows, 2 m) or one column where every order has the same: a complex array
        # seen as reals times a real array of its own dtype (NumPy's mixed real-complex loops go through a
        # casting buffer, about twice as slow)
        self._pairs = {"weights": self._as_pairs(self.weights), "scale": self._as_pairs(self.scale)}
        self._poles = self._pole_values(orders, csphase, weights) if vector else []
        # ducc0 takes each order once: the vector transforms' order 0 (whose functions are order 1's) is its own call
        split = 1 if vector and len(orders) > 1 and orders[0] == 0 else 0
        self._groups = [slice(0, split), slice(split, len(orders))] if split else [slice(0, len(orders))]
        self._mval = functions.astype(numpy.uintp)
        self._workspace = backend.Workspace()

    def _latitude_factors(self, weights, orders, vector):
        """``(nlat_loc, m_loc)``: the weights, and ``1 / sin(theta)`` for the vector functions (0 at a pole)."""
        w = numpy.ones(self.nlat) if weights is None else numpy.asarray(weights, dtype=numpy.float64)
        factors = numpy.repeat(w[:, None], len(orders), axis=1)
        if vector:
            sin = numpy.sin(self.theta)
            inverse_sin = numpy.zeros_like(sin)
            inside = ~self._at_pole()
            inverse_sin[inside] = 1.0 / sin[inside]
            factors[:, orders > 0] *= inverse_sin[:, None]
        return factors

    @staticmethod
    def _as_pairs(factors):
        if numpy.all(factors == factors[:, :1]):
            return numpy.ascontiguousarray(factors[:, :1])
        return numpy.repeat(factors, 2, axis=1)

    def _times(self, a, which, columns, out):
        """``out = a * factors`` (complex ``a`` and ``out``), as reals of one dtype where the columns are contiguous."""
        if a.strides[-1] != a.itemsize or out.strides[-1] != out.itemsize:  # a layout of the pipeline's own
            numpy.multiply(a, (self.weights if which == "weights" else self.scale)[:, columns], out=out)
            return
        pairs = self._pairs[which]
        if pairs.shape[1] > 1:
            pairs = pairs[:, 2 * columns.start:2 * columns.stop]
        real = dtypes.real_of(a.dtype)
        numpy.multiply(a.view(real), pairs, out=out.view(real))

    def _at_pole(self):
        return numpy.abs(numpy.sin(self.theta)) < 1e-12

    def _pole_values(self, orders, csphase, weights):
        """``[(k, w_k, columns, Q)]`` per pole latitude ``k`` of this rank, for the columns of order 1.

        ``Q`` ``(L, len(columns))``: ``P(l, 1) / sin(theta)`` in the limit at
        the pole. For every other order the limit is zero (``sin(theta)^(m - 1)``
        vanishes there); computed at ``theta = pi`` those values are rounding
        (``sin(pi)`` is 1.2e-16), which would make the correction depend on
        the grid: only order 1 takes part.
        """
        ones = numpy.flatnonzero(orders == 1)
        poles = []
        for k in numpy.flatnonzero(self._at_pole()) if ones.size else ():
            weight = 1.0 if weights is None else float(weights[k])
            limits = associated_legendre(self.degrees, [1], self.theta[k:k + 1], "ortho", csphase,
                                         divide_by_sin=True)[0, :, 0]  # (L,)
            values = numpy.repeat(limits[:, None], ones.size, axis=1).astype(dtypes.real_of(self.dtype))
            poles.append((int(k), weight, ones, values))
        return poles

    def _run(self, direction, x, out, context):
        # CuPy arrays never get here: the transforms refuse them for this strategy before agreeing
        if direction == FORWARD and self._unit_scale:
            self._zero_below_first_degrees(out)  # ducc0 writes the degrees each order has straight into out
        with HeldTraps((out,)):  # ducc0's AVX2 build overflows in lanes it discards: the caller's traps held off
            for columns in self._groups:
                self._run_columns(direction, x[..., columns], out[..., columns], columns)
        for k, weight, columns, values in self._poles:  # the limits at the poles, which no product with 1 / sin gives
            if direction == FORWARD:
                out[:, :, :, columns] += (weight * x[:, :, k, columns])[:, :, None, :] * values
            else:
                out[:, :, k, columns] += weight * numpy.einsum("bclj,lj->bcj", x[:, :, :, columns], values)

    def _zero_below_first_degrees(self, out):
        """``out[..., l, j] = 0`` where degree ``l`` is below order ``j``'s functions.

        ``copyto`` with a ``where`` mask writes only there, without the index
        list a masked assignment builds first (sixteen times faster for one
        field of 361 x 361).
        """
        numpy.copyto(out, 0, where=self._lower)

    @staticmethod
    def _flat(a):
        """A ``(rows, m)`` view with contiguous columns as ducc0's ``(1, n)`` alm and its row stride, or None."""
        if a.strides[-1] != a.itemsize or a.strides[-2] % a.itemsize:
            return None, None
        stride = a.strides[-2] // a.itemsize
        length = (a.shape[0] - 1) * stride + a.shape[1]
        return backend.as_strided(a, (1, length), (0, a.itemsize)), stride

    def _run_columns(self, direction, x, out, columns):
        """ducc0 on the orders ``columns`` of ``x`` and ``out`` (views of those columns), field by field."""
        import ducc0.sht
        count = columns.stop - columns.start
        options = dict(lmax=self.degrees - 1, theta=self.theta, spin=0, mval=self._mval[columns],
                       mstart=numpy.arange(count, dtype=numpy.uintp), nthreads=1)
        leg = alm = None
        if not self._unit_weights:
            leg = self._workspace.scratch("leg", x, self.nlat * count).reshape(1, self.nlat, count)
        if not self._unit_scale:
            alm = self._workspace.scratch("alm", x, self.degrees * count).reshape(self.degrees, count)
            if direction == FORWARD:
                alm[...] = 0  # below each order's first degree ducc0 writes nothing: zero once a call
        for b, c in numpy.ndindex(*x.shape[:2]):
            if direction == FORWARD:
                source = x[b, c][None]
                if leg is not None:
                    self._times(x[b, c], "weights", columns, leg[0])
                    source = leg
                flat, stride = self._flat(out[b, c]) if alm is None else (None, None)
                if flat is not None:
                    ducc0.sht.leg2alm(leg=source, alm=flat, lstride=stride, **options)
                else:
                    target = alm if alm is not None else self._zeroed_alm(x, count)
                    ducc0.sht.leg2alm(leg=source, alm=target.reshape(1, -1), lstride=count, **options)
                    self._times(target, "scale", columns, out[b, c])
            else:
                flat, stride = self._flat(x[b, c]) if alm is None else (None, None)
                if flat is None:
                    target = alm if alm is not None else self._workspace.scratch(
                        "alm", x, self.degrees * count).reshape(self.degrees, count)
                    self._times(x[b, c], "scale", columns, target)
                    flat, stride = target.reshape(1, -1), count
                if leg is None:
                    ducc0.sht.alm2leg(alm=flat, leg=out[b, c][None], lstride=stride, **options)
                else:
                    ducc0.sht.alm2leg(alm=flat, leg=leg, lstride=stride, **options)
                    self._times(leg[0], "weights", columns, out[b, c])

    def _zeroed_alm(self, like, count):
        """The alm scratch with zeros below each order's first degree (an output ducc0 cannot write in place)."""
        alm = self._workspace.scratch("alm", like, self.degrees * count).reshape(self.degrees, count)
        alm[...] = 0
        return alm


def ducc0_available():
    """Whether ducc0's Legendre building blocks can be imported."""
    try:
        import ducc0.sht  # noqa: F401
    except ImportError:
        return False
    return True


class TableFree(LegendreStrategy):
    name = "table-free"
    polar_transposes = False
    runs_on_device = False
    holds_tables = False
    summary = ("the reduce-scatter exchange with no tables: ducc0 evaluates the functions on the fly (host "
               "arrays; memory: the batch only)")

    def available(self):
        if ducc0_available():
            return True, ""
        return False, "legendre='table-free' needs ducc0: pip install '.[ducc0]' in the mpisphere clone"

    def build_tables(self, request):
        return None

    def stage(self, request, tables):
        r = request  # the vector functions go up to degree lmax (the coupling's neighbours)
        return TableFreeLegendre(r.lmax + r.vector, r.orders, r.own_theta, r.norm, r.csphase, r.synthesis, r.cdtype,
                                 r.layout, r.own_weights(), vector=r.vector)

    def table_bytes(self, nlat, lmax, mmax, npolar, nazimuth, *, vector=False, dtype=numpy.float64,
                    orders="contiguous"):
        return 0

    def values(self, lmax, orders, nlat, h, npolar, vector=False):
        return row_entries(lmax, orders, h, vector)

    def seconds(self, model, nlat, lmax, mmax, npolar, nazimuth, batch, *, vector=False, dtype=numpy.float64,
                orders="contiguous", synthesis=False):
        values = self.largest(nlat, lmax, mmax, npolar, nazimuth, orders,
                              lambda mine, h: row_entries(lmax, mine, h, vector))
        return model.on_the_fly_seconds(values, (2 if vector else 1) * batch, vector, synthesis)


TABLE_FREE = TableFree()
