"""The Fourier side of a transform: the real FFT along longitudes and the truncation of its orders.

``FourierStage``
    the real FFT along longitudes (analysis: ``rfft / nlon``; synthesis:
    the unnormalised ``irfft``), with exact adjoints.
``Truncation``
    keep the first ``mmax`` orders of a spectrum (a view), adjoint: pad with
    zeros (the other way round when ``mmax`` exceeds the spectrum's orders).
"""

import functools
import math

import numpy

from .. import backend, dtypes
from ..operators import FORWARD, Abilities, InputError
from ..validation import check_choice
from .pipeline import BATCH_INNERMOST, LocalStage

__all__ = ["FFT_BACKENDS", "resolve_fft", "FourierStage", "Truncation"]

_FFT_TAKES_OUT = int(numpy.__version__.split(".")[0]) >= 2

FFT_BACKENDS = ("auto", "numpy", "ducc0")


def resolve_fft(name):
    """The FFT library for host arrays: ``"ducc0"`` or ``"numpy"`` (``"auto"``: ducc0 when it is installed).

    ducc0's real FFTs into given outputs take about half NumPy's time on one
    core (docs/benchmarks.md); CuPy arrays always use ``cupy.fft``.
    """
    check_choice(name, FFT_BACKENDS, "fft")
    if name == "numpy":
        return "numpy"
    try:
        import ducc0.fft  # noqa: F401
    except ImportError:
        if name == "ducc0":
            raise ImportError("fft='ducc0' needs ducc0: pip install '.[ducc0]' in the mpisphere clone") from None
        return "numpy"
    return "ducc0"


def _numpy_out(x, out):
    return _FFT_TAKES_OUT and isinstance(x, numpy.ndarray) and isinstance(out, numpy.ndarray)


class FourierStage(LocalStage):
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
    float64_arithmetic : bool, keyword-only
        For float32 data: transform in float64 (the data widened, the result
        rounded once to the float32/complex64 output). The FFT's own rounding
        in float32 is then gone; what is left is one rounding of each
        output. The DISCO convolutions use it: their error in float32 was
        1.1-1.8x torch-harmonics' direct sums, almost all of it the FFTs'.

    Notes
    -----
    The adjoints in the real inner product: of the analysis,
    ``x = irfft(Y / c) `` with ``c_m = 2`` for the orders a real signal holds
    twice and 1 for ``m = 0`` and ``m = nlon / 2``; of the synthesis,
    ``Y = c rfft(x)`` unnormalised.
    """

    def __init__(self, nlon, dtype, synthesis, layout, fft="numpy", *, float64_arithmetic=False):
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
        # the orders 1 .. _doubled - 1 have c_m = 2 (all but m = 0 and, for even nlon, m = nlon / 2)
        self._doubled = self.half - 1 if self.nlon % 2 == 0 else self.half
        self._device = {}
        self._workspace = backend.Workspace()
        self._widened = bool(float64_arithmetic) and self.real == numpy.float32

    def _widen(self, name, a, dtype):
        """``a`` in ``dtype`` (a scratch array of this stage)."""
        wide = self._workspace.scratch(name, a, a.size, dtype).reshape(a.shape)
        wide[...] = a
        return wide

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

    def _ducc0(self, x, out):
        """Whether ducc0 transforms these host arrays (its strided inverse runs row by row: a host loop)."""
        return self.fft == "ducc0" and isinstance(x, numpy.ndarray) and isinstance(out, numpy.ndarray) \
            and not backend.device_kernels(x)

    def _rfft(self, x, norm, out):
        if self._widened and x.dtype == self.real:
            wide = self._workspace.scratch("wide spectrum", out, out.size, numpy.complex128).reshape(out.shape)
            self._rfft_of(self._widen("wide field", x, numpy.float64), norm, wide)
            out[...] = wide
            return
        self._rfft_of(x, norm, out)

    def _rfft_of(self, x, norm, out):
        if self._ducc0(x, out):
            import ducc0.fft
            ducc0.fft.r2c(x, axes=(-1,), forward=True, inorm=2 if norm == "forward" else 0, out=out, nthreads=1)
        elif _numpy_out(x, out):
            numpy.fft.rfft(x, axis=-1, norm=norm, out=out)
        else:
            out[...] = backend.array_module(x).fft.rfft(x, axis=-1, norm=norm)

    def _irfft(self, spectrum, norm, out):
        """``out = irfft(spectrum)``; a ``spectrum`` with fewer than ``half`` orders is zero-padded."""
        if self._widened and out.dtype == self.real:
            wide = self._workspace.scratch("wide field", out, out.size, numpy.float64).reshape(out.shape)
            self._irfft_of(self._widen("wide spectrum", spectrum, numpy.complex128), norm, wide)
            out[...] = wide
            return
        self._irfft_of(spectrum, norm, out)

    def _irfft_of(self, spectrum, norm, out):
        if self._ducc0(spectrum, out) and out.dtype in dtypes.TRANSFORM:
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
        elif _numpy_out(spectrum, out) and out.dtype.kind == "f":
            numpy.fft.irfft(spectrum, n=self.nlon, axis=-1, norm=norm, out=out)
        else:
            out[...] = backend.array_module(spectrum).fft.irfft(spectrum, n=self.nlon, axis=-1, norm=norm)

    def abilities(self, direction):
        if self._takes_real(direction):
            return Abilities()
        # a spectrum held batch-innermost is read row by row anyway: a short one is padded in that copy
        consume = None if self.synthesis else functools.partial(self._run_consuming, direction)
        return Abilities(pads_short_input_in=frozenset({BATCH_INNERMOST}), consume=consume)

    def _run(self, direction, x, out, context):
        if self._takes_real(direction):
            if self.synthesis:  # adjoint of the synthesis: c rfft(x), unnormalised
                self._rfft(x, "backward", out)
                out[..., 1:self._doubled] *= 2   # c_m (a scalar: 5x faster than the (half,) array on 8 MB)
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
        x[..., 1:min(nonzero, self._doubled)] *= 0.5   # / c_m, exactly (a power of two)
        self._irfft(x, "backward", out)


class Truncation(LocalStage):
    """Keep ``mmax`` of ``half`` orders: ``forward`` a restriction, ``adjoint`` zero padding.

    With ``mmax > half`` (more orders asked for than the longitudes resolve)
    the roles swap, as torch-harmonics does it: ``forward`` pads the orders
    past ``half`` with zeros, ``adjoint`` drops them.

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
    padding lets the previous stage write straight into the padded buffer
    (see :meth:`abilities`): no copy. With a permutation both are a
    gather/scatter.
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
        # host index arrays, uploaded once per device by _index: the kept orders, their inverse permutation,
        # and with mmax > half the orders clamped into the spectrum and the positions that are padding
        self._indices = None if orders is None else (
            orders, numpy.argsort(orders), numpy.minimum(orders, half - 1), numpy.flatnonzero(orders >= half))
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
        """``_indices[which]`` (kept orders, inverse, clamped, padding) where ``like`` lives."""
        return backend.on_device_of(like, self._indices[which], self._device, which)

    @staticmethod
    def _take(x, index, out):
        """``out = x[..., index]`` without a temporary (a fresh 10-100 MB one costs its page faults)."""
        if isinstance(x, numpy.ndarray):
            numpy.take(x, index, axis=-1, out=out, mode="clip")  # "clip": unbuffered; the index is valid
        else:
            backend.array_module(x).take(x, index, axis=-1, out=out)

    def _run(self, direction, x, out, context):
        kept = min(self.mmax, self.half)  # with mmax > half the orders past half are zeros (torch-harmonics pads)
        if direction == FORWARD:
            if self.permuted:
                self._take(x, self._index(x, 0 if kept == self.mmax else 2), out)
                if kept < self.mmax:
                    out[..., self._index(x, 3)] = 0
            else:
                out[..., :kept] = x[..., :kept]
                out[..., kept:] = 0
        else:
            out[..., kept:] = 0
            if self.permuted:  # out[..., orders] = x, as a gather by the inverse permutation (faster than a scatter)
                self._take(x, self._index(x, 1)[:kept], out[..., :kept])
            else:
                out[..., :kept] = x[..., :kept]

    def abilities(self, direction):
        if self.permuted or self.mmax > self.half:
            return Abilities()
        if direction == FORWARD:
            return Abilities(view=self.view)
        return Abilities(embed=self.embed, kept=self.mmax)

    def view(self, x):
        """The forward result as a view of ``x`` (not permuted only)."""
        return x[..., :self.mmax]

    def embed(self, padded):
        """Zero the padding of ``padded``; returns the view the adjoint's input must be written into."""
        padded[..., self.mmax:] = 0
        return padded[..., :self.mmax]
