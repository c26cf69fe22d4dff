"""The Legendre step on a rank's own latitudes, for the strategies that complete it with a polar Reduce_scatter.

With ``legendre="reduce-scatter"`` or ``"table-free"`` no polar rank ever
holds every latitude: each contracts its own latitudes into every degree
(a partial sum), and a ``Reduce_scatter`` over ``grid.polar`` completes the
sums and splits the degrees (the synthesis: an ``Allgatherv`` of the
degrees, then each rank evaluates its own latitudes). Two stages compute the
local part, with the same map:

:class:`OwnLatitudeTables`
    tables of this rank's orders at this rank's latitudes, ``(m_loc, L,
    nlat_loc)`` (no parity split: a rank's latitudes are not symmetric about
    the equator), one matrix product per order on NumPy or CuPy arrays;
:class:`TableFreeLegendre`
    no tables at all: ducc0's ``leg2alm``/``alm2leg`` evaluate the functions
    on the fly for any set of latitudes and orders (host arrays), with the
    norm's degree factors and torch-harmonics' sign convention applied
    around them. Memory: the batch only.

Both map ``(B, C, nlat_loc, m_loc)`` complex to ``(B, C, L, m_loc)``:
``c[l, m] = sum_k T(l, m, theta_k) w_k X[k, m]`` (``w``: ``2 pi`` times the
quadrature weights in an analysis, 1 in a synthesis's tables), and their
adjoints are the transposed maps.
"""

import numpy

from .. import backend, dtypes
from ..legendre import associated_legendre, degree_factors
from ..operators import FORWARD, Abilities, InputError
from .contraction import BATCH_INNERMOST
from .legendre_stage import LegendreStage
from .pipeline import LocalStage
from .tables import first_degrees

__all__ = ["OwnLatitudeTables", "TableFreeLegendre", "own_latitude_tables", "table_free_available"]

_CHUNK = 16  # orders per recurrence run: bounds the temporary full table


class _RowTables:
    """Per order ``j``: ``tables[j]`` of shape ``(L - starts[j], nlat)``, degrees ``starts[j] .. L - 1``."""

    def __init__(self, degrees, orders, starts, dtype):
        self.degrees = degrees
        self.orders = list(orders)
        self.starts = list(starts)
        self.dtype = numpy.dtype(dtype)
        self.tables = []

    def nbytes(self):
        return sum(t.nbytes for t in self.tables)


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
            values = associated_legendre(top, block, theta, norm, csphase, inverse)
            rows = list(values)
        for m, start, values in zip(block, starts[first:first + _CHUNK], rows):
            tables.tables.append(numpy.ascontiguousarray(values[start:], dtype=tables.dtype))
    return tables


class _OwnLatitudeStage(LocalStage):
    """Shapes and checks shared by the two stages: ``(B, C, nlat_loc, m_loc) <-> (B, C, L, m_loc)`` complex."""

    def _output(self, direction, spec):
        n_in, n_out = (self.nlat, self.degrees) if direction == FORWARD else (self.degrees, self.nlat)
        count = len(self.orders)
        if len(spec.shape) != 4 or spec.shape[2:] != (n_in, count) or spec.dtype != self.dtype:
            raise InputError(f"expected (B, C, {n_in}, {count}) {self.dtype.name}, got {spec.shape} {spec.dtype.name}")
        return spec.but(shape=spec.shape[:2] + (n_out, count)), spec.describe()

    def _shapes(self, lead):
        return lead + (self.nlat, len(self.orders)), lead + (self.degrees, len(self.orders))


class OwnLatitudeTables(_OwnLatitudeStage):
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
    One matrix product per order, ``(L - m, nlat) @ (nlat, 2 C B)``, on the
    batch-innermost layout (the batch and component columns of an order
    contiguous): NumPy or CuPy, the tables uploaded once per device.
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

    def _device_tables(self, like):
        return backend.on_device_of(like, tuple(self.tables.tables), self._device, "tables")

    def _run(self, direction, x, out, context):
        xp = backend.array_module(x)
        source, _ = _real_columns(x, self._workspace, "in", copy_in=True)
        target, staged = _real_columns(out, self._workspace, "out", copy_in=False)
        tables = self._device_tables(x)
        weights = None if self.weights is None else backend.on_device_of(x, self.weights, self._device, "weights")
        if direction == FORWARD:
            if weights is not None:
                scaled = self._workspace.scratch("scaled", source, source.size, source.dtype).reshape(source.shape)
                xp.multiply(source, weights[:, None, None], out=scaled)
                source = scaled
            for j, (start, table) in enumerate(zip(self.tables.starts, tables)):
                target[:start, j] = 0
                xp.matmul(table, source[:, j], out=target[start:, j])
        else:
            for j, (start, table) in enumerate(zip(self.tables.starts, tables)):
                xp.matmul(table.T, source[start:, j], out=target[:, j])
            if weights is not None:
                target *= weights[:, None, None]
        if staged is not None:
            backend.copy_into(out.transpose(BATCH_INNERMOST), staged)


def _real_columns(a, workspace, name, copy_in):
    """``a`` (``(B, C, n, m)`` complex) as real ``(n, m, 2 C B)`` columns, and the scratch used (or None).

    A view when ``a`` is held batch-innermost (the Legendre stage's own
    test); otherwise a scratch buffer of that layout (holding a copy of
    ``a`` when ``copy_in``).
    """
    columns = LegendreStage._columns(a)
    if columns is not None:
        return columns, None
    phys = a.transpose(BATCH_INNERMOST)
    staged = workspace.scratch(name, a, a.size).reshape(phys.shape)
    if copy_in:
        backend.copy_into(staged, phys)
    return LegendreStage._real(staged), staged


class TableFreeLegendre(_OwnLatitudeStage):
    """The same partial contraction with no tables: ducc0 evaluates the functions on the fly (host arrays).

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
        As for :class:`OwnLatitudeTables`.
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
    each other's transposes). The vector functions are spin-0 ones too:
    ``1 / sin(theta)`` joins the latitude weights, and order 0 asks ducc0 for
    order 1. At a pole ``P(l, m) / sin(theta)`` is a limit (not zero for
    ``m = 1``) that no product gives: those latitudes take their values from
    :func:`~mpisphere.legendre.associated_legendre` (``L`` numbers per pole for
    order 1, the only order whose limit is not zero: the only values kept).
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
        self.scale = (factors[:, None] * signs[None, :]).astype(real)
        self.weights = self._latitude_factors(weights, orders, vector).astype(real)
        self._poles = self._pole_values(orders, csphase, weights) if vector else []
        # ducc0 takes each order once: the vector transforms' order 0 (whose functions are order 1's) is its own call
        split = 1 if vector and len(orders) > 1 and orders[0] == 0 else 0
        self._groups = [slice(0, split), slice(split, len(orders))] if split else [slice(0, len(orders))]
        self._mval = functions.astype(numpy.uintp)
        self._lower = numpy.arange(lmax)[:, None] < functions[None, :]  # no function below its order
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

    def _at_pole(self):
        return numpy.abs(numpy.sin(self.theta)) < 1e-12

    def _pole_values(self, orders, csphase, weights):
        """``[(k, w_k, j, Q)]`` per pole latitude ``k`` of this rank and column ``j`` whose limit is not zero.

        ``Q`` ``(L,)``: ``P(l, m_j) / sin(theta)`` in the limit at the pole
        (not zero for ``m = 1`` only).
        """
        positive = numpy.flatnonzero(orders > 0)
        poles = []
        for k in numpy.flatnonzero(self._at_pole()):
            weight = 1.0 if weights is None else float(weights[k])
            limits = associated_legendre(self.degrees, orders[positive].tolist(), self.theta[k:k + 1], "ortho",
                                         csphase, divide_by_sin=True)[:, :, 0] if positive.size else []
            for j, values in zip(positive, limits):
                if numpy.any(values != 0):
                    poles.append((int(k), weight, int(j), values.astype(dtypes.real_of(self.dtype))))
        return poles

    def _run(self, direction, x, out, context):
        if backend.is_device_array(x):
            raise InputError("legendre='table-free' runs on host arrays (ducc0); use 'reduce-scatter' on a GPU",
                             TypeError)
        for columns in self._groups:
            self._run_columns(direction, x[..., columns], out[..., columns], columns)
        for k, weight, j, values in self._poles:  # the limits at the poles, which no product with 1 / sin gives
            if direction == FORWARD:
                out[:, :, :, j] += (weight * x[:, :, k, j])[:, :, None] * values
            else:
                out[:, :, k, j] += weight * (x[:, :, :, j] @ values)

    def _run_columns(self, direction, x, out, columns):
        """ducc0 on the orders ``columns`` of ``x`` and ``out`` (views of those columns), field by field."""
        import ducc0.sht
        count = columns.stop - columns.start
        options = dict(lmax=self.degrees - 1, theta=self.theta, spin=0, mval=self._mval[columns],
                       mstart=numpy.arange(count, dtype=numpy.uintp), lstride=count, nthreads=1)
        leg = self._workspace.scratch("leg", x, self.nlat * count).reshape(1, self.nlat, count)
        alm = self._workspace.scratch("alm", x, self.degrees * count).reshape(self.degrees, count)
        weights, scale, lower = self.weights[:, columns], self.scale[:, columns], self._lower[:, columns]
        for b, c in numpy.ndindex(*x.shape[:2]):
            if direction == FORWARD:
                numpy.multiply(x[b, c], weights, out=leg[0])
                alm[lower] = 0
                ducc0.sht.leg2alm(leg=leg, alm=alm.reshape(1, -1), **options)
                numpy.multiply(alm, scale, out=out[b, c])
            else:
                numpy.multiply(x[b, c], scale, out=alm)
                ducc0.sht.alm2leg(alm=alm.reshape(1, -1), leg=leg, **options)
                numpy.multiply(leg[0], weights, out=out[b, c])


def table_free_available():
    """Whether ducc0's Legendre building blocks can be imported."""
    try:
        import ducc0.sht  # noqa: F401
    except ImportError:
        return False
    return True
