"""The stages a transform is made of, and the pipeline that runs them.

A transform is a list of stages, each a :class:`~mpisphere.LinearOperator`
with its own forward and adjoint; the adjoint of the transform is the
reversed list of adjoints. The stages that move data are
:class:`~mpisphere.Transpose` operators (a one-rank communicator is a local
copy, or nothing at all when the layouts agree); the local ones are here:

:class:`FourierStage`
    the real FFT along longitudes (analysis: ``rfft / nlon``; synthesis:
    the unnormalised ``irfft``), with exact adjoints.
:class:`Truncation`
    keep the first ``mmax`` orders of a spectrum (a view), adjoint: pad with
    zeros.
:class:`LegendreStage`
    the contraction with a rank's parity-split Legendre tables
    (:mod:`mpisphere.sht.contraction`); synthesis is its adjoint.
:class:`VectorCoupling`
    the vector transforms' combination of neighbouring degrees of the two
    components (their derivatives of Legendre functions are such
    combinations), forward and adjoint.

:class:`Pipeline` runs a list of stages on one rank's data, keeping every
intermediate in a buffer it owns and reuses, in the memory layout the next
stage wants (``physical`` orders: the Legendre step wants latitudes or
degrees first and the batch innermost). The stages of a pipeline are run
without their own checks and agreement: the transform that owns the pipeline
checked and agreed once for all of them.
"""

import math

import numpy

from .. import backend, dtypes
from ..operators import ADJOINT, FORWARD, AdjointOperator, InputError, LinearOperator
from . import contraction

__all__ = ["FourierStage", "Truncation", "LegendreStage", "VectorCoupling", "Pipeline"]

# numpy.fft functions take out= from NumPy 2.0; with it the FFTs write into reused buffers
_FFT_TAKES_OUT = int(numpy.__version__.split(".")[0]) >= 2

FFT_BACKENDS = ("auto", "numpy", "ducc0")


def resolve_fft(name):
    """The FFT library for host arrays: ``"ducc0"`` or ``"numpy"`` (``"auto"``: ducc0 when it is installed).

    ducc0's real FFTs into given outputs take about half NumPy's time on one
    core (docs/benchmarks.md); CuPy arrays always use ``cupy.fft``.
    """
    if name not in FFT_BACKENDS:
        raise ValueError(f"fft must be one of {', '.join(map(repr, FFT_BACKENDS))}, got {name!r}")
    if name == "numpy":
        return "numpy"
    try:
        import ducc0.fft  # noqa: F401
    except ImportError:
        if name == "ducc0":
            raise ImportError("fft='ducc0' needs ducc0: pip install 'mpisphere[ducc0]'") from None
        return "numpy"
    return "ducc0"


def _numpy_out(x, out):
    return _FFT_TAKES_OUT and isinstance(x, numpy.ndarray) and isinstance(out, numpy.ndarray)


class _LocalStage(LinearOperator):
    """A stage that does not communicate: domain and range are the transform's layouts."""

    def __init__(self, layout):
        self.domain = self.range = layout


class FourierStage(_LocalStage):
    """The real FFT along the last axis, as one stage of a transform.

    Parameters
    ----------
    nlon : int
        Longitudes.
    dtype : float32 or float64
        Of the real side.
    synthesis : bool
        ``False`` (analysis): ``forward`` maps ``(..., nlon)`` real to the
        ``(..., nlon // 2 + 1)`` complex spectrum ``X = rfft(x) / nlon``.
        ``True`` (synthesis): ``forward`` maps a spectrum to the real field
        ``x = irfft(X)`` unnormalised (a coefficient at ``0 < m < nlon / 2``
        stands for ``X e^{i m phi}`` plus its conjugate).
    layout : Layout
    fft : {"numpy", "ducc0"}
        The library for NumPy arrays (see :func:`resolve_fft`).

    Notes
    -----
    The adjoints in the real inner product: of the analysis,
    ``x = irfft(Y / c) `` with ``c_m = 2`` for the orders a real signal holds
    twice and 1 for ``m = 0`` and ``m = nlon / 2``; of the synthesis,
    ``Y = c rfft(x)`` unnormalised.
    """

    def __init__(self, nlon, dtype, synthesis, layout, fft="numpy"):
        super().__init__(layout)
        self.fft = fft
        self.nlon = nlon
        self.half = nlon // 2 + 1
        self.real = numpy.dtype(dtype)
        self.complex = dtypes.complex_of(self.real)
        self.synthesis = synthesis
        # c_m: how often a real signal holds order m (2, but 1 for m = 0 and m = nlon / 2)
        self._host_multiplicity = numpy.full(self.half, 2.0, self.real)
        self._host_multiplicity[0] = 1.0
        if self.nlon % 2 == 0:
            self._host_multiplicity[-1] = 1.0
        self._device = {}
        self._workspace = backend.Workspace()

    def _takes_real(self, direction):
        return (direction == FORWARD) != self.synthesis

    def _output(self, direction, spec):
        real_in = self._takes_real(direction)
        want = (self.real, self.nlon) if real_in else (self.complex, self.half)
        if spec.dtype != want[0] or not spec.shape or spec.shape[-1] != want[1]:
            raise InputError(f"expected (..., {want[1]}) {want[0].name}, got {spec.shape} {spec.dtype.name}")
        other = (self.complex, self.half) if real_in else (self.real, self.nlon)
        return spec.but(shape=spec.shape[:-1] + (other[1],), dtype=other[0]), spec.describe()

    def _shapes(self, lead):
        real, spectrum = lead + (self.nlon,), lead + (self.half,)
        return (spectrum, real) if self.synthesis else (real, spectrum)

    def multiplicity(self, like):
        """``c_m`` (see the class notes), ``(half,)`` real, where ``like`` lives."""
        return backend.on_device_of(like, self._host_multiplicity, self._device)

    def _rfft(self, x, norm, out):
        if self.fft == "ducc0" and isinstance(x, numpy.ndarray) and isinstance(out, numpy.ndarray):
            import ducc0.fft
            ducc0.fft.r2c(x, axes=(-1,), forward=True, inorm=2 if norm == "forward" else 0, out=out, nthreads=1)
        elif _numpy_out(x, out):
            numpy.fft.rfft(x, axis=-1, norm=norm, out=out)
        else:
            out[...] = backend.array_module(x).fft.rfft(x, axis=-1, norm=norm)

    def _irfft(self, spectrum, norm, out):
        """``out = irfft(spectrum)``; a ``spectrum`` with fewer than ``half`` orders is zero-padded."""
        if self.fft == "ducc0" and isinstance(spectrum, numpy.ndarray) and isinstance(out, numpy.ndarray) \
                and out.dtype == self.real:
            import ducc0.fft
            # like NumPy's irfft, c2r uses only the real parts of the m = 0 and m = nlon / 2 terms
            options = dict(axes=(-1,), lastsize=self.nlon, forward=False, inorm=2 if norm == "backward" else 0,
                           nthreads=1)
            if spectrum.shape[-1] == self.half and spectrum.strides[-1] == spectrum.itemsize:
                ducc0.fft.c2r(spectrum, out=out, **options)
                return
            # orders not contiguous (the batch-innermost layout) or missing: one row (latitude) at a time,
            # about half the time of one c2r reading the strided layout; with orders missing through a
            # contiguous zero-padded copy of the row that stays in cache
            rows = spectrum.shape[-2] if spectrum.ndim > 1 else 1
            spectrum = spectrum.reshape((1, -1)) if spectrum.ndim == 1 else spectrum
            target = out.reshape((1, -1)) if out.ndim == 1 else out
            n = spectrum.shape[-1]
            if n == self.half:  # nothing to pad: the row as it lies (1.5-3 ms less at 32 x 361 x 720)
                for k in range(rows):
                    ducc0.fft.c2r(spectrum[..., k, :], out=target[..., k, :], **options)
                return
            row = self._workspace.scratch("row", spectrum, math.prod(spectrum.shape[:-2]) * self.half)
            row = row.reshape(spectrum.shape[:-2] + (self.half,))
            row[..., n:] = 0
            for k in range(rows):
                row[..., :n] = spectrum[..., k, :]
                ducc0.fft.c2r(row, out=target[..., k, :], **options)
        elif _numpy_out(spectrum, out) and out.dtype == self.real:
            numpy.fft.irfft(spectrum, n=self.nlon, axis=-1, norm=norm, out=out)
        else:
            out[...] = backend.array_module(spectrum).fft.irfft(spectrum, n=self.nlon, axis=-1, norm=norm)

    def _run(self, direction, x, out, context):
        if self._takes_real(direction):
            if self.synthesis:  # adjoint of the synthesis: c rfft(x), unnormalised
                self._rfft(x, "backward", out)
                out *= self.multiplicity(out)
            else:  # analysis: rfft(x) / nlon
                self._rfft(x, "forward", out)
            return
        if self.synthesis:  # synthesis: irfft unnormalised
            self._irfft(x, "forward", out)
            return
        # adjoint of the analysis: irfft(Y / c) / nlon
        scratch = self._workspace.scratch("divided", x, x.size).reshape(x.shape)
        scratch[...] = x
        self._run_consuming(direction, scratch, out, context)

    def _run_consuming(self, direction, x, out, context, nonzero=None):
        """:meth:`_run` allowed to overwrite ``x`` (a pipeline's own buffer), whose orders from ``nonzero`` on are 0.

        Only the adjoint of the analysis gains: it divides by ``c_m`` in place
        instead of in a copy.
        """
        if self.synthesis or self._takes_real(direction):
            self._run(direction, x, out, context)
            return
        nonzero = min(self.half if nonzero is None else nonzero, x.shape[-1])
        x[..., 1:nonzero] /= self.multiplicity(x)[1:nonzero]
        self._irfft(x, "backward", out)


class Truncation(_LocalStage):
    """Keep ``mmax`` of ``half`` orders: ``forward`` a restriction, ``adjoint`` zero padding.

    Parameters
    ----------
    mmax, half : int
    layout : Layout
    orders : int array, optional
        The orders kept, in the order the output holds them (a permutation
        of ``0 .. mmax - 1``: the balanced order layout puts each azimuth
        rank's orders together). Default: the first ``mmax`` in order.

    Notes
    -----
    Without ``orders``, in a pipeline the restriction is a view and the
    padding writes the previous stage's output straight into the padded
    buffer: no copy. With a permutation both are a gather/scatter.
    """

    _per_rank = ("orders",)  # this azimuth rank's orders (balanced layout)

    def __init__(self, mmax, half, layout, orders=None):
        super().__init__(layout)
        self.mmax, self.half = mmax, half
        if orders is not None:
            orders = numpy.asarray(orders, dtype=numpy.int64)
            if sorted(orders.tolist()) != list(range(mmax)):
                raise ValueError(f"Truncation: orders must be a permutation of 0 .. {mmax - 1}")
            if numpy.array_equal(orders, numpy.arange(mmax)):
                orders = None
        self.orders = orders
        self._inverse = None if orders is None else numpy.argsort(orders)
        self._device = {}

    @property
    def permuted(self):
        """Whether the kept orders are reordered (then no view/embed shortcuts)."""
        return self.orders is not None

    def _output(self, direction, spec):
        n_in, n_out = (self.half, self.mmax) if direction == FORWARD else (self.mmax, self.half)
        if not spec.shape or spec.shape[-1] != n_in:
            raise InputError(f"expected {n_in} orders in the last axis, got shape {spec.shape}")
        return spec.but(shape=spec.shape[:-1] + (n_out,)), spec.describe()

    def _shapes(self, lead):
        return lead + (self.half,), lead + (self.mmax,)

    def _index(self, like, which):
        """The kept orders (``which=0``) or their inverse permutation (1), where ``like`` lives."""
        return backend.on_device_of(like, self.orders if which == 0 else self._inverse, self._device, which)

    @staticmethod
    def _take(x, index, out):
        """``out = x[..., index]`` without a temporary (a fresh 10-100 MB one costs its page faults)."""
        if isinstance(x, numpy.ndarray):
            numpy.take(x, index, axis=-1, out=out, mode="clip")  # "clip": unbuffered; the index is valid
        else:
            backend.array_module(x).take(x, index, axis=-1, out=out)

    def _run(self, direction, x, out, context):
        if direction == FORWARD:
            if self.permuted:
                self._take(x, self._index(x, 0), out)
            else:
                out[...] = x[..., :self.mmax]
        else:
            out[..., self.mmax:] = 0
            if self.permuted:  # out[..., orders] = x, as a gather by the inverse permutation (faster than a scatter)
                self._take(x, self._index(x, 1), out[..., :self.mmax])
            else:
                out[..., :self.mmax] = x

    def view(self, x):
        """The forward result as a view of ``x`` (not permuted only)."""
        return x[..., :self.mmax]

    def embed(self, padded):
        """Zero the padding of ``padded``; returns the view the adjoint's input must be written into."""
        padded[..., self.mmax:] = 0
        return padded[..., :self.mmax]


# the Legendre step's layout: logical (B, C, n, m) held as physical (n, m, C, B)
BATCH_INNERMOST = (2, 3, 1, 0)


class LegendreStage(_LocalStage):
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

    # the pipeline may hand this stage an output that shares the input's memory (see Pipeline): the
    # contraction reads all of an order's input column before it writes that order's output column
    in_place = True

    @staticmethod
    def _columns(a):
        """``a`` as a real ``(n, m, 2 C B)`` view in the batch-innermost layout, or None if it is not held so.

        The rows (latitudes or degrees) may be further apart than one row
        (a view of a wider buffer); the columns of an order must be contiguous.
        """
        phys = a.transpose(BATCH_INNERMOST)
        item = phys.itemsize
        _, m, c, b = phys.shape
        if not ((phys.strides[3] == item or b == 1) and (phys.strides[2] == b * item or c == 1)
                and (phys.strides[1] == c * b * item or m == 1)):
            return None
        return LegendreStage._real(phys)

    @staticmethod
    def _real(phys):
        """A ``(n, m, C, B)`` complex array with contiguous columns as real ``(n, m, 2 C B)``."""
        return phys.reshape(phys.shape[0], phys.shape[1], -1).view(dtypes.real_of(phys.dtype))

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
        source, target = self._columns(x), self._columns(out)
        # half a copy where the degrees of the orders form a triangle (per-row copies: host only)
        triangle = self._triangular and not backend.is_device_array(x)
        if source is not None and target is not None:
            self._contract(direction, source, target, x)
            return
        if source is None and target is not None and x.shape[2] <= out.shape[2]:
            staged = backend.as_strided(out, x.shape, out.strides)
            if triangle and direction == ADJOINT:  # the input's rows are degrees
                contraction.copy_degrees(self.tables, x, staged, zero=False)
            else:
                backend.copy_into(staged, x)
            self._contract(direction, self._columns(staged), target, x)
            return
        if target is None and source is not None and consuming and out.shape[2] <= x.shape[2]:
            result = backend.as_strided(x, out.shape, x.strides)
            triangle = triangle and direction == FORWARD  # the output's rows are degrees
            self._contract(direction, source, self._columns(result), x, zero=not triangle)
            if triangle:
                contraction.copy_degrees(self.tables, result, out)
            else:
                backend.copy_into(out, result)
            return
        # neither side can lend its memory: a buffer of this stage's own
        if source is None:
            staged = self._workspace.scratch("in", x, x.size).reshape(x.transpose(BATCH_INNERMOST).shape)
            backend.copy_into(staged, x.transpose(BATCH_INNERMOST))
            source = self._real(staged)
        scratch = None
        if target is None:
            scratch = self._workspace.scratch("out", out, out.size).reshape(out.transpose(BATCH_INNERMOST).shape)
            target = self._real(scratch)
        self._contract(direction, source, target, x)
        if scratch is not None:
            backend.copy_into(out.transpose(BATCH_INNERMOST), scratch)


class VectorCoupling(_LocalStage):
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


class Pipeline:
    """Run stages in order with reused intermediate buffers; the adjoint runs their adjoints in reverse.

    Parameters
    ----------
    stages : list of LinearOperator
        In forward order; each must implement ``_output`` and ``_run``.
    spec : Spec
        The forward input (one batch size: a pipeline is built per batch).
    physical : dict, optional
        ``{boundary: order}``: the memory layout of the intermediate after
        stage ``boundary - 1`` (``order`` as in ``numpy.transpose``: the
        logical axes in memory order). Default: C order.

    workspace : Workspace, optional
        Where the intermediates live (default: a workspace of its own).
        The transforms pass their grid's ``grid.scratch``, shared by every
        transform on the grid: runs on one grid never overlap (the grid's
        lock), and a run leaves nothing in its buffers that a later run needs.

    Notes
    -----
    A stage whose map is the identity (a one-rank :class:`~mpisphere.Transpose`)
    is skipped when its input already has the layout its output needs; a
    :class:`Truncation` is a view forward and writes the previous stage's
    output into its padded buffer in the adjoint, or leaves the padding to a
    :class:`FourierStage` that reads the batch-innermost layout (it copies
    row by row anyway). The intermediates take turns in two byte buffers (a
    stage reads one and writes the other), sized for the largest
    intermediate, whatever their dtypes: at most two batch-sized buffers per
    grid, not one per intermediate and operator. A stage with ``in_place``
    (the Legendre step) writes its output into the buffer its input is in,
    with the input's strides; a scalar transform on one rank then needs only
    one buffer.
    """

    _SLOTS = ("pipeline-a", "pipeline-b")

    def __init__(self, stages, spec, physical=None, workspace=None):
        self.stages = list(stages)
        self.physical = dict(physical or {})
        self.specs = [spec]
        for stage in self.stages:
            self.specs.append(stage._output(FORWARD, self.specs[-1])[0])
        self._workspace = backend.Workspace() if workspace is None else workspace
        self._slot_bytes = max(math.prod(sp.shape) * sp.dtype.itemsize for sp in self.specs)

    def _order(self, boundary):
        return self.physical.get(boundary, tuple(range(len(self.specs[boundary].shape))))

    def _buffer(self, boundary, like, slot):
        """The intermediate at ``boundary`` in byte buffer ``slot`` (0 or 1), in its physical order."""
        spec = self.specs[boundary]
        order = self._order(boundary)
        raw = self._workspace.scratch(self._SLOTS[slot], like, self._slot_bytes, numpy.uint8)
        count = math.prod(spec.shape)
        flat = raw[:count * spec.dtype.itemsize].view(spec.dtype)
        buf = flat.reshape(tuple(spec.shape[i] for i in order))
        return buf.transpose(numpy.argsort(order))

    def _in_place(self, boundary, current, slot):
        """The intermediate at ``boundary`` in the memory of ``current`` (in byte buffer ``slot``), or None.

        Same strides as ``current``, only the extents differ (the Legendre
        step turns latitudes into degrees or back): possible when ``current``
        starts the buffer and the result fits in it.
        """
        spec = self.specs[boundary]
        shape, strides = tuple(spec.shape), current.strides
        if spec.dtype != current.dtype or len(shape) != current.ndim or 0 in shape or min(strides) < 0:
            return None
        extent = current.itemsize + sum((n - 1) * step for n, step in zip(shape, strides))
        raw = self._workspace.scratch(self._SLOTS[slot], current, self._slot_bytes, numpy.uint8)
        if extent > self._slot_bytes or backend.data_address(current) != backend.data_address(raw):
            return None
        return backend.as_strided(current, shape, strides)

    def nbytes(self):
        """Bytes of the buffers held now in this pipeline's workspace (shared with others on the grid)."""
        return self._workspace.nbytes()

    @staticmethod
    def _truncation(stage, direction):
        """``(truncation, "restrict" | "pad")`` when ``stage`` run in ``direction`` is a truncation or its adjoint."""
        flipped = isinstance(stage, AdjointOperator)
        inner = stage.op if flipped else stage
        if not isinstance(inner, Truncation) or inner.permuted:
            return None, None
        return inner, "restrict" if (direction == FORWARD) != flipped else "pad"

    def _actions(self, direction):
        """``[(stage index, action)]`` in running order.

        Actions: ``run``; ``view`` (a restriction); ``skip`` (an identity);
        ``fused`` (a zero padding left to the next stage that runs, a
        :class:`FourierStage` reading a layout it copies row by row anyway).
        """
        n = len(self.stages)
        steps = range(n) if direction == FORWARD else range(n - 1, -1, -1)
        actions = []
        for k in steps:
            stage = self.stages[k]
            src, dst = (k, k + 1) if direction == FORWARD else (k + 1, k)
            role = self._truncation(stage, direction)[1]
            if role == "restrict":
                actions.append((k, "view"))
            elif getattr(stage, "is_identity", False) and self._order(src) == self._order(dst):
                actions.append((k, "skip"))
            else:
                actions.append((k, "run"))
        # a padding whose next running stage is an FFT taking complex input in the batch-innermost layout
        for i, (k, action) in enumerate(actions):
            src = k if direction == FORWARD else k + 1
            if action != "run" or self._truncation(self.stages[k], direction)[1] != "pad" \
                    or self._order(src) != BATCH_INNERMOST:
                continue
            following = next((j for j, a in actions[i + 1:] if a != "skip"), None)
            if following is not None:
                inner, run_direction = self._unwrap(self.stages[following], direction)
                if isinstance(inner, FourierStage) and not inner._takes_real(run_direction):
                    actions[i] = (k, "fused")
        return actions

    @staticmethod
    def _unwrap(stage, direction):
        """``(operator, direction)`` that running ``stage`` in ``direction`` runs (``op.H`` forward: ``op`` adjoint)."""
        if isinstance(stage, AdjointOperator):
            return stage.op, ADJOINT if direction == FORWARD else FORWARD
        return stage, direction

    def run(self, direction, x, out, context):
        """Apply the pipeline (``FORWARD``) or its adjoint (``ADJOINT``) to ``x``, writing ``out``."""
        actions = self._actions(direction)
        runs = [i for i, (_, action) in enumerate(actions) if action == "run"]
        # the last stage that does work writes into out when only skipped stages follow it
        into_out = runs[-1] if runs and all(a == "skip" for _, a in actions[runs[-1] + 1:]) else None
        current = x
        slot = None  # the byte buffer current lives in; None: the caller's x (or a view of it)
        nonzero = None  # orders from here on are zero (after a zero padding)
        i = 0
        while i < len(actions):
            k, action = actions[i]
            stage = self.stages[k]
            following_slot = 0 if slot is None else 1 - slot
            if action == "view":
                current = self._truncation(stage, direction)[0].view(current)
            elif action == "fused":
                nonzero = self._truncation(stage, direction)[0].mmax
            elif action == "run":
                # the next stage that does anything pads (a Truncation's adjoint): write into its padded buffer
                j = i + 1
                while j < len(actions) and actions[j][1] == "skip":
                    j += 1
                following, role = self._truncation(self.stages[actions[j][0]], direction) \
                    if j < len(actions) and actions[j][1] == "run" else (None, None)
                if role == "pad":
                    dst = actions[j][0] + 1 if direction == FORWARD else actions[j][0]
                    padded = out if j == into_out else self._buffer(dst, current, following_slot)
                    stage._run(direction, current, following.embed(padded), context)
                    current, slot = padded, None if padded is out else following_slot
                    i = j
                    nonzero = following.mmax
                else:
                    inner, inner_direction = self._unwrap(stage, direction)
                    dst = k + 1 if direction == FORWARD else k
                    target, target_slot = None, following_slot
                    if i == into_out:
                        target, target_slot = out, None
                    elif slot is not None and getattr(inner, "in_place", False):
                        # one batch-sized buffer instead of two (the Legendre step)
                        target, target_slot = self._in_place(dst, current, slot), slot
                    if target is None:
                        target, target_slot = self._buffer(dst, current, following_slot), following_slot
                    if slot is not None and hasattr(inner, "_run_consuming"):
                        # the input is this pipeline's own buffer: the stage may overwrite it
                        inner._run_consuming(inner_direction, current, target, context, nonzero)
                    else:
                        stage._run(direction, current, target, context)
                    current, slot = target, target_slot
            i += 1
        if current is not out:
            backend.copy_into(out, current)
        return out
