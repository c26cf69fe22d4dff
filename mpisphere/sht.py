"""Distributed real spherical harmonic transforms with exact adjoints.

``DistributedRealSHT`` maps this rank's tile of real fields ``(..., nlat,
nlon)`` to its block of complex coefficients ``(..., lmax, mmax)`` (degrees
split over ``grid.polar``, orders over ``grid.azimuth``);
``DistributedInverseRealSHT`` maps back. Values, ordering, default truncation
and normalisation follow torch-harmonics' ``RealSHT``/``InverseRealSHT``:

* forward: ``c[l, m] = sum_k W[m, l, k] X[k, m]``, ``X = 2 pi rfft(x) / nlon``
  (``W`` = Legendre functions times quadrature weights);
* inverse: ``x = irfft(sum_l P[m, l, k] c[l, m])`` without scaling (so a
  coefficient at ``m > 0`` stands for ``c e^{i m phi}`` plus its conjugate);
* truncation resolved by :func:`~mpisphere.truncate_sht`, torch-harmonics
  0.9's rule: default ``lmax`` from the quadrature (``(nlat + 1) // 2``
  equiangular, ``nlat`` Gauss, ``nlat - 1`` Lobatto), default ``mmax = nlon
  // 2 + 1``, then triangular: ``lmax = mmax = min(lmax, mmax)``.

The data path is torch-harmonics' (azimuth transpose, real FFT, azimuth
transpose, polar transpose, Legendre contraction, polar transpose), built
from :class:`~mpisphere.Transpose` operators; ``adjoint`` runs the adjoint
of every step in reverse order, so it is the exact adjoint of the map (not
its inverse).

Between the transposes, Fourier and spectral data are kept with the batch
axis innermost (physical layouts ``(nlat, m_loc, batch)`` and ``(lmax,
m_loc, batch)``): the contraction for one order is then a plain matrix
product over a strided view, and the transposes write these layouts
directly while unpacking. The Legendre functions are split by equatorial
parity (``P(l, m, pi - theta) = (-1)^(l + m) P(l, m, theta)``), which halves
both the tables and the arithmetic; the tables hold only this rank's orders.
"""

import math

import numpy

from . import backend
from .legendre import NORMS, associated_legendre
from .operators import DISTRIBUTED, Layout, LinearOperator, check_input, output_array
from .partition import check_int, flatten_leading, split_offsets, split_sizes, unflatten_leading
from .primitives import Transpose
from .quadrature import canonical_grid, latitudes, truncate_sht

__all__ = ["DistributedRealSHT", "DistributedInverseRealSHT"]

_CONTRACTIONS = ("auto", "per-order", "batched")

# numpy.fft functions take out= from NumPy 2.0; with it the FFTs write into reused buffers
_FFT_TAKES_OUT = int(numpy.__version__.split(".")[0]) >= 2


class _LegendreTables:
    """Parity-split Legendre tables for one rank's orders.

    For local order ``j`` (global ``m``): ``even[j]`` has the degrees ``l =
    m, m+2, ...`` (shape ``(n_even, nlat_north + equator)``), ``odd[j]`` the
    degrees ``l = m+1, m+3, ...`` over the northern latitudes only (odd
    functions vanish on the equator).
    """

    def __init__(self, lmax, orders, theta, row_weights, norm, csphase, inverse, dtype):
        nlat = len(theta)
        self.n_north = nlat // 2
        self.n_half = self.n_north + nlat % 2
        self.orders = list(orders)
        self.lmax = lmax
        self.even, self.odd = [], []
        chunk = 16  # orders per recurrence run: bounds the temporary table
        for start in range(0, len(self.orders), chunk):
            block = self.orders[start:start + chunk]
            table = associated_legendre(lmax, block, theta[:self.n_half], norm, csphase, inverse)
            if row_weights is not None:
                table *= row_weights[:self.n_half]
            for i, m in enumerate(block):
                self.even.append(numpy.ascontiguousarray(table[i, m::2, :], dtype=dtype))
                self.odd.append(numpy.ascontiguousarray(table[i, m + 1::2, :self.n_north], dtype=dtype))
        self.dtype = numpy.dtype(dtype)
        self._device = {}

    def nbytes(self):
        return sum(t.nbytes for t in self.even) + sum(t.nbytes for t in self.odd)

    def padded(self, xp, device_id):
        """Tables stacked and zero-padded to equal shapes, for batched products (cached per device)."""
        key = (xp.__name__, device_id)
        if key not in self._device:
            count = len(self.orders)
            n_even = max([t.shape[0] for t in self.even] + [0])
            n_odd = max([t.shape[0] for t in self.odd] + [0])
            even = numpy.zeros((count, n_even, self.n_half), self.dtype)
            odd = numpy.zeros((count, n_odd, self.n_north), self.dtype)
            rows_even, rows_odd = [], []
            for j, m in enumerate(self.orders):
                even[j, :self.even[j].shape[0]] = self.even[j]
                odd[j, :self.odd[j].shape[0]] = self.odd[j]
                rows_even += [(m + 2 * i, j, i) for i in range(self.even[j].shape[0])]
                rows_odd += [(m + 1 + 2 * i, j, i) for i in range(self.odd[j].shape[0])]
            index_even = numpy.array(rows_even, dtype=numpy.int64).reshape(-1, 3).T
            index_odd = numpy.array(rows_odd, dtype=numpy.int64).reshape(-1, 3).T
            self._device[key] = tuple(xp.asarray(a) for a in (even, odd)) + \
                (tuple(xp.asarray(a) for a in index_even), tuple(xp.asarray(a) for a in index_odd))
        return self._device[key]


class _Contraction:
    """The Legendre step on real views of the batch-innermost layouts.

    ``analyze``: fourier ``(nlat, m_loc, 2b)`` -> spectral ``(lmax, m_loc, 2b)``,
    ``c[l] = sum_k T[l, k] X[k]``. ``synthesize``: the transpose,
    ``X[k] = sum_l T[l, k] c[l]``. (Complex data as pairs of reals: the tables
    are real, so one real product handles both parts.)
    """

    def __init__(self, tables, method, workspace):
        self.tables = tables
        self.method = method
        self.workspace = workspace

    def _batched(self, like):
        if self.method == "batched":
            return True
        return self.method == "auto" and backend.is_device_array(like)

    def analyze(self, fourier, spectral):
        t = self.tables
        if self._batched(fourier):
            sym, anti = self._parity_split(fourier)
            self._analyze_batched(sym, anti, spectral)
            return
        n_north, n_half = t.n_north, t.n_half
        rows = fourier.shape[0]
        # per order: the parity split of one (nlat, 2b) slice, small enough to stay in cache
        sym = self.workspace.scratch("sym", fourier, n_half * fourier.shape[2]).reshape(n_half, fourier.shape[2])
        anti = self.workspace.scratch("anti", fourier, n_north * fourier.shape[2]).reshape(n_north, -1)
        for j, m in enumerate(t.orders):
            spectral[:min(m, t.lmax), j] = 0
            even, odd = t.even[j], t.odd[j]
            if not even.shape[0]:
                continue
            column = fourier[:, j]
            north, south = column[:n_north], column[rows - n_north:][::-1]
            numpy.add(north, south, out=sym[:n_north])
            if n_half > n_north:
                sym[n_north] = column[n_north]
            numpy.matmul(even, sym, out=spectral[m::2, j][:even.shape[0]])
            if odd.shape[0]:
                numpy.subtract(north, south, out=anti)
                numpy.matmul(odd, anti, out=spectral[m + 1::2, j][:odd.shape[0]])

    def _parity_split(self, fourier):
        t = self.tables
        n_north, n_half = t.n_north, t.n_half
        rows = fourier.shape[0]
        ws = self.workspace
        sym = ws.scratch("sym", fourier, n_half * fourier[0].size).reshape((n_half,) + fourier.shape[1:])
        anti = ws.scratch("anti", fourier, n_north * fourier[0].size).reshape((n_north,) + fourier.shape[1:])
        south = fourier[rows - n_north:][::-1]
        numpy.add(fourier[:n_north], south, out=sym[:n_north])
        if n_half > n_north:
            sym[n_north] = fourier[n_north]
        numpy.subtract(fourier[:n_north], south, out=anti)
        return sym, anti

    def _analyze_batched(self, sym, anti, spectral):
        xp = backend.array_module(spectral)
        even, odd, (l_e, j_e, i_e), (l_o, j_o, i_o) = self.tables.padded(xp, _device_id(spectral))
        spectral[...] = 0
        if even.shape[1]:
            spectral[l_e, j_e] = xp.matmul(even, sym.transpose(1, 0, 2))[j_e, i_e]
        if odd.shape[1]:
            spectral[l_o, j_o] = xp.matmul(odd, anti.transpose(1, 0, 2))[j_o, i_o]

    def synthesize(self, spectral, fourier):
        t = self.tables
        n_north, n_half = t.n_north, t.n_half
        rows = fourier.shape[0]
        ws = self.workspace
        if self._batched(spectral):
            even_part = ws.scratch("sym", fourier, n_half * fourier[0].size).reshape((n_half,) + fourier.shape[1:])
            odd_part = ws.scratch("anti", fourier, n_north * fourier[0].size).reshape((n_north,) + fourier.shape[1:])
            self._synthesize_batched(spectral, even_part, odd_part)
            numpy.add(even_part[:n_north], odd_part, out=fourier[:n_north])
            numpy.subtract(even_part[:n_north], odd_part, out=fourier[rows - n_north:][::-1])
            if n_half > n_north:
                fourier[n_north] = even_part[n_north]
            return
        # per order: both parity parts of one (nlat, 2b) slice stay in cache until combined
        cols = fourier.shape[2]
        even_part = ws.scratch("sym", fourier, n_half * cols).reshape(n_half, cols)
        odd_part = ws.scratch("anti", fourier, n_north * cols).reshape(n_north, cols)
        for j, m in enumerate(t.orders):
            even, odd = t.even[j], t.odd[j]
            column = fourier[:, j]
            if not even.shape[0]:
                column[...] = 0
                continue
            numpy.matmul(even.T, spectral[m::2, j][:even.shape[0]], out=even_part)
            north, south = column[:n_north], column[rows - n_north:][::-1]
            if odd.shape[0]:
                numpy.matmul(odd.T, spectral[m + 1::2, j][:odd.shape[0]], out=odd_part)
                numpy.add(even_part[:n_north], odd_part, out=north)
                numpy.subtract(even_part[:n_north], odd_part, out=south)
            else:
                north[...] = even_part[:n_north]
                south[...] = even_part[:n_north]
            if n_half > n_north:
                column[n_north] = even_part[n_north]

    def _synthesize_batched(self, spectral, even_part, odd_part):
        xp = backend.array_module(spectral)
        even, odd, (l_e, j_e, i_e), (l_o, j_o, i_o) = self.tables.padded(xp, _device_id(spectral))
        count, cols = spectral.shape[1], spectral.shape[2]
        if even.shape[1]:
            gathered = xp.zeros((count, even.shape[1], cols), spectral.dtype)
            gathered[j_e, i_e] = spectral[l_e, j_e]
            even_part[...] = xp.matmul(even.transpose(0, 2, 1), gathered).transpose(1, 0, 2)
        else:
            even_part[...] = 0
        if odd.shape[1]:
            gathered = xp.zeros((count, odd.shape[1], cols), spectral.dtype)
            gathered[j_o, i_o] = spectral[l_o, j_o]
            odd_part[...] = xp.matmul(odd.transpose(0, 2, 1), gathered).transpose(1, 0, 2)
        else:
            odd_part[...] = 0


def _device_id(a):
    return a.device.id if backend.is_device_array(a) else None


def _real_view(a):
    """``(..., n)`` complex -> ``(..., 2n)`` real, sharing memory (last axis contiguous)."""
    return a.view(a.real.dtype)


class _SHTEngine:
    """Everything the four maps share: splits, tables, transposes, scratch."""

    def __init__(self, grid, nlat, nlon, lmax, mmax, quadrature, norm, csphase, dtype, tables_for, contraction,
                 who):
        self.who = who
        self.grid = grid
        self.nlat, self.nlon = check_int(nlat, "nlat", who, minimum=1), check_int(nlon, "nlon", who, minimum=1)
        try:
            quadrature = canonical_grid(quadrature)
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
        lmax = None if lmax is None else check_int(lmax, "lmax", who, minimum=1)
        mmax = None if mmax is None else check_int(mmax, "mmax", who, minimum=1)
        self.lmax, self.mmax = truncate_sht(self.nlat, self.nlon, lmax, mmax, quadrature)
        if norm not in NORMS:
            raise ValueError(f"{who}: unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
        if contraction not in _CONTRACTIONS:
            raise ValueError(f"{who}: contraction must be one of {_CONTRACTIONS}, got {contraction!r}")
        self.dtype = numpy.dtype(dtype)
        if self.dtype not in (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64)):
            raise TypeError(f"{who}: dtype must be float32 or float64, got {self.dtype}")
        self.cdtype = numpy.result_type(self.dtype, numpy.complex64)
        if self.mmax > self.nlon // 2 + 1:
            raise ValueError(f"{who}: mmax={self.mmax} exceeds the nlon // 2 + 1 = {self.nlon // 2 + 1} orders "
                             f"a real FFT of {self.nlon} longitudes has")
        self._check_fits(grid)
        self.theta, self.weights = latitudes(self.nlat, quadrature)
        self.quadrature = quadrature
        self.lat_sizes = split_sizes(self.nlat, grid.npolar)
        self.lon_sizes = split_sizes(self.nlon, grid.nazimuth)
        self.l_sizes = split_sizes(self.lmax, grid.npolar)
        self.m_sizes = split_sizes(self.mmax, grid.nazimuth)
        self.tile = (self.lat_sizes[grid.polar_rank], self.lon_sizes[grid.azimuth_rank])
        self.block = (self.l_sizes[grid.polar_rank], self.m_sizes[grid.azimuth_rank])
        m_start = split_offsets(self.mmax, grid.nazimuth)[grid.azimuth_rank]
        orders = range(m_start, m_start + self.block[1])  # orders m >= lmax have no degrees: empty tables
        self.m_local = self.block[1]
        weights = 2.0 * math.pi * self.weights if tables_for == "analysis" else None
        self.tables = _LegendreTables(self.lmax, orders, self.theta, weights, norm, csphase,
                                      inverse=(tables_for == "synthesis"), dtype=self.dtype)
        self.workspace = backend.Workspace()
        self.contraction = _Contraction(self.tables, contraction, self.workspace)
        self._transposes = {}
        # c_m of the real FFT: orders 0 and nlon/2 appear once in a real signal, the others twice
        factor = numpy.full(self.mmax, 2.0)
        factor[0] = 1.0
        if self.nlon % 2 == 0 and self.mmax > self.nlon // 2:
            factor[self.nlon // 2] = 1.0
        self._multiplicity = {None: factor}

    def multiplicity(self, like):
        """The FFT's c_m, in ``like``'s module and device."""
        key = _device_id(like)
        if key not in self._multiplicity:
            xp = backend.array_module(like)
            self._multiplicity[key] = xp.asarray(self._multiplicity[None])
        return self._multiplicity[key]

    def _check_fits(self, grid):
        for name, extent, ranks, axis in (("nlat", self.nlat, grid.npolar, "polar"),
                                          ("nlon", self.nlon, grid.nazimuth, "azimuth"),
                                          ("lmax", self.lmax, grid.npolar, "polar"),
                                          ("mmax", self.mmax, grid.nazimuth, "azimuth")):
            if extent < ranks:
                raise ValueError(f"{self.who}: the grid is finer than the transform: {ranks} {axis} ranks cannot "
                                 f"split {name}={extent} (each needs at least one); use at most {extent} {axis} ranks")

    # --- transposes (their extents include the batch size) -------------------------

    def transposes(self, batch):
        found = self._transposes.get(batch)
        if found is None:
            g = self.grid
            found = {
                "lon": Transpose(g.azimuth, axes=(0, 2), extents=(batch, self.nlon)),  # (B, h, w) -> (Ba, h, nlon)
                "m": Transpose(g.azimuth, axes=(2, 0), extents=(self.mmax, batch)),    # (Ba, h, mmax) -> (B, h, m)
                "lat": Transpose(g.polar, axes=(0, 1), extents=(batch, self.nlat)),    # (B, h, m) -> (Bp, nlat, m)
                "l": Transpose(g.polar, axes=(1, 0), extents=(self.lmax, batch)),      # (Bp, lmax, m) -> (B, l, m)
            }
            if len(self._transposes) >= 4:
                self._transposes.pop(next(iter(self._transposes)))
            self._transposes[batch] = found
        return found

    def batch_parts(self, batch):
        g = self.grid
        return split_sizes(batch, g.npolar)[g.polar_rank], split_sizes(batch, g.nazimuth)[g.azimuth_rank]

    # --- the pieces of the four maps ----------------------------------------------------

    def grid_to_fourier(self, xb, adjoint_of_synthesis):
        """(B, h, w) real -> physical (nlat, m_loc, Bp) complex scratch.

        ``X = rfft(x) / nlon`` (the forward's 2 pi lives in its tables), or
        for the adjoint of the inverse ``X = c_m rfft(x)``.
        """
        g, batch = self.grid, xb.shape[0]
        t = self.transposes(batch)
        b_polar, b_azimuth = self.batch_parts(batch)
        xa = xb
        if g.nazimuth > 1:
            xa = t["lon"].forward(xb, out=self._longitudes(xb, b_azimuth))
        half = self.nlon // 2 + 1
        spectrum = self._scratch("spectrum", xb, (b_azimuth, self.tile[0], half), self.cdtype)
        spectrum = self._rfft(xa, "backward" if adjoint_of_synthesis else "forward", spectrum)[..., :self.mmax]
        if adjoint_of_synthesis:
            spectrum *= self.multiplicity(spectrum)
        xm = spectrum
        if g.nazimuth > 1:
            xm = t["m"].forward(spectrum, out=self._orders(xb, batch))
        fourier = self._scratch("fourier", xb, (self.nlat, self.m_local, b_polar), self.cdtype)
        logical = fourier.transpose(2, 0, 1)
        if g.npolar > 1:
            t["lat"].forward(xm, out=logical)
        else:
            _permute_copy(logical, xm)
        return fourier

    def fourier_to_grid(self, fourier, adjoint_of_analysis, batch, out):
        """Physical (nlat, m_loc, Bp) complex -> (B, h, w) real, into ``out``.

        ``x = irfft(X)`` unscaled, or for the adjoint of the forward
        ``x = irfft(X / c_m) / nlon``.
        """
        g = self.grid
        t = self.transposes(batch)
        _, b_azimuth = self.batch_parts(batch)
        logical = fourier.transpose(2, 0, 1)
        xm = t["lat"].adjoint(logical, out=self._orders(fourier, batch)) if g.npolar > 1 else logical
        half = self.nlon // 2 + 1
        spectrum = self._scratch("spectrum", fourier, (b_azimuth, self.tile[0], half), self.cdtype)
        spectrum[..., self.mmax:] = 0
        if g.nazimuth > 1:
            t["m"].adjoint(xm, out=spectrum[..., :self.mmax])
        else:
            _permute_copy(spectrum[..., :self.mmax], xm)
        if adjoint_of_analysis:
            spectrum[..., :self.mmax] /= self.multiplicity(spectrum)
        norm = "backward" if adjoint_of_analysis else "forward"
        if g.nazimuth > 1:
            return t["lon"].adjoint(self._irfft(spectrum, norm, self._longitudes(fourier, b_azimuth)), out=out)
        return self._irfft(spectrum, norm, out)

    def _longitudes(self, like, b_azimuth):
        """Scratch for real fields with whole longitudes, (Ba, h, nlon), on the azimuth side of a transpose."""
        return self._scratch("longitudes", like, (b_azimuth, self.tile[0], self.nlon), self.dtype)

    def _orders(self, like, batch):
        """Scratch for this rank's orders of the whole batch, (B, h, m_loc), between the transposes."""
        return self._scratch("orders", like, (batch, self.tile[0], self.m_local), self.cdtype)

    def spectral_to_block(self, spectral, out):
        """Physical (lmax, m_loc, Bp) -> this rank's block (B, l_loc, m_loc), into ``out``."""
        logical = spectral.transpose(2, 0, 1)
        if self.grid.npolar > 1:
            return self.transposes(out.shape[0])["l"].forward(logical, out=out)
        _permute_copy(out, logical)
        return out

    def block_to_spectral(self, cb):
        """(B, l_loc, m_loc) -> physical (lmax, m_loc, Bp) complex scratch."""
        b_polar, _ = self.batch_parts(cb.shape[0])
        spectral = self._scratch("spectral", cb, (self.lmax, self.m_local, b_polar), self.cdtype)
        logical = spectral.transpose(2, 0, 1)
        if self.grid.npolar > 1:
            self.transposes(cb.shape[0])["l"].adjoint(cb, out=logical)
        else:
            _permute_copy(logical, cb)
        return spectral

    def spectral_scratch(self, like, batch):
        b_polar, _ = self.batch_parts(batch)
        return self._scratch("spectral", like, (self.lmax, self.m_local, b_polar), self.cdtype)

    def fourier_scratch(self, like, batch):
        b_polar, _ = self.batch_parts(batch)
        return self._scratch("fourier", like, (self.nlat, self.m_local, b_polar), self.cdtype)

    def _scratch(self, name, like, shape, dtype):
        count = 1
        for extent in shape:
            count *= extent
        return self.workspace.scratch(name, like, count, dtype).reshape(shape)

    def _rfft(self, x, norm, out):
        """Real FFT along the last axis, into ``out`` where the library allows it (NumPy 2)."""
        if _FFT_TAKES_OUT and isinstance(x, numpy.ndarray) and x.dtype == self.dtype:
            return numpy.fft.rfft(x, axis=-1, norm=norm, out=out)
        xp = backend.array_module(x)
        out[...] = xp.fft.rfft(x, axis=-1, norm=norm)
        return out

    def _irfft(self, spectrum, norm, out=None):
        """Inverse real FFT along the last axis, into ``out`` when given and the library allows it."""
        if out is not None and _FFT_TAKES_OUT and isinstance(spectrum, numpy.ndarray) and out.dtype == self.dtype:
            return numpy.fft.irfft(spectrum, n=self.nlon, axis=-1, norm=norm, out=out)
        xp = backend.array_module(spectrum)
        result = xp.fft.irfft(spectrum, n=self.nlon, axis=-1, norm=norm).astype(self.dtype, copy=False)
        if out is None:
            return result
        out[...] = result
        return out

    # --- input handling ---------------------------------------------------------

    def prepare(self, who, a, block_shape, want_complex):
        """Validate ``a`` (collectively in debug mode) and flatten its batch axes.

        Returns ``(ab, lead_shape, lead_size)`` with ``ab`` of shape
        ``(B, *block_shape)``, ``B >= max(npolar, nazimuth)``.
        """
        error = None
        dtype = getattr(a, "dtype", None)
        expected_dtype = self.cdtype if want_complex else self.dtype
        if dtype is None or getattr(a, "ndim", 0) < 2:
            error = TypeError, f"expected an array with at least 2 axes, got {type(a).__name__}"
        elif numpy.dtype(dtype) != expected_dtype:
            kind = "complex coefficients" if want_complex else "real fields"
            hint = (" (real input to the inverse transform?)" if want_complex and numpy.dtype(dtype).kind != "c"
                    else " (complex input to the forward transform?)" if not want_complex and
                    numpy.dtype(dtype).kind == "c" else "; build the operator with the matching dtype")
            error = TypeError, f"expected {kind} of dtype {expected_dtype}, got {numpy.dtype(dtype)}{hint}"
        elif tuple(a.shape[-2:]) != tuple(block_shape):
            what = "coefficient block" if want_complex else "tile"
            error = ValueError, (f"expected a {what} of {tuple(block_shape)} in the last two axes for grid rank "
                                 f"{self.grid.rank} (polar {self.grid.polar_rank}, azimuth "
                                 f"{self.grid.azimuth_rank}) of "
                                 f"a {self.grid.npolar} x {self.grid.nazimuth} grid, got {tuple(a.shape[-2:])}")
        shape = tuple(getattr(a, "shape", ()))
        check_input(self.grid.cart, who, error, lambda: (f"leading shape {shape[:-2]}", f"dtype {dtype}"))
        minimum = max(self.grid.npolar, self.grid.nazimuth)
        flat, lead_shape, lead_size = flatten_leading(a, minimum, 2)
        return flat, lead_shape, lead_size


def _permute_copy(dst, src):
    """``dst[...] = src`` where one side has the batch axis innermost in memory.

    On the host, one latitude (or degree) slab at a time: each slab is a
    small 2-D transpose that stays in cache, where one whole-array strided
    copy would not. On a device, one kernel.
    """
    if backend.is_device_array(dst):
        dst[...] = src
        return
    for k in range(dst.shape[1]):
        dst[:, k] = src[:, k]


class _SHTBase(LinearOperator):
    _tables_for = None
    _name = None

    def __init__(self, grid, nlat, nlon, lmax=None, mmax=None, quadrature="equiangular", norm="ortho",
                 csphase=True, dtype=numpy.float64, *, contraction="auto"):
        self._engine = _SHTEngine(grid, nlat, nlon, lmax, mmax, quadrature, norm, csphase, dtype, self._tables_for,
                                  contraction, self._name)
        self.grid = grid
        self.domain = Layout(DISTRIBUTED, grid.cart)
        self.range = Layout(DISTRIBUTED, grid.cart)

    nlat = property(lambda self: self._engine.nlat)
    nlon = property(lambda self: self._engine.nlon)
    lmax = property(lambda self: self._engine.lmax)
    mmax = property(lambda self: self._engine.mmax)
    dtype = property(lambda self: self._engine.dtype)
    tile_shape = property(lambda self: self._engine.tile, doc="This rank's ``(h, w)`` of the ``(nlat, nlon)`` grid.")
    block_shape = property(lambda self: self._engine.block,
                           doc="This rank's ``(l_loc, m_loc)`` of the ``(lmax, mmax)`` coefficients.")

    def table_bytes(self):
        """Bytes of Legendre tables held on this rank (its own orders only)."""
        return self._engine.tables.nbytes()

    def _grid_to_spectral(self, who, x, out, adjoint):
        """Real tiles -> coefficient blocks: the forward SHT, or (``adjoint``) the inverse's adjoint."""
        e = self._engine
        xb, lead_shape, lead_size = e.prepare(who, x, e.tile, want_complex=False)
        with backend.device_of(xb):
            target, given = self._target(who, xb, out, (xb.shape[0],) + e.block, lead_shape, lead_size, e.cdtype)
            fourier = e.grid_to_fourier(xb, adjoint_of_synthesis=adjoint)
            spectral = e.spectral_scratch(xb, xb.shape[0])
            e.contraction.analyze(_real_view(fourier), _real_view(spectral))
            e.spectral_to_block(spectral, target)
        return self._finish(target, given, out, lead_shape, lead_size)

    def _spectral_to_grid(self, who, c, out, adjoint):
        """Coefficient blocks -> real tiles: the inverse SHT, or (``adjoint``) the forward's adjoint."""
        e = self._engine
        cb, lead_shape, lead_size = e.prepare(who, c, e.block, want_complex=True)
        with backend.device_of(cb):
            target, given = self._target(who, cb, out, (cb.shape[0],) + e.tile, lead_shape, lead_size, e.dtype)
            spectral = e.block_to_spectral(cb)
            fourier = e.fourier_scratch(cb, cb.shape[0])
            e.contraction.synthesize(_real_view(spectral), _real_view(fourier))
            e.fourier_to_grid(fourier, adjoint, cb.shape[0], target)
        return self._finish(target, given, out, lead_shape, lead_size)

    def _target(self, who, like, out, flat_shape, lead_shape, lead_size, dtype):
        """The flat-batch array the pipeline writes into: ``out`` itself when it can be, else a new one."""
        if out is not None:
            out = output_array(who, self.grid.cart, like, out, tuple(lead_shape) + tuple(flat_shape[1:]), dtype)
            if flat_shape[0] == lead_size and out.flags.c_contiguous:
                return out.reshape(flat_shape), out
        return output_array(who, self.grid.cart, like, None, flat_shape, dtype), None

    @staticmethod
    def _finish(target, given, out, lead_shape, lead_size):
        if given is not None:
            return given
        result = unflatten_leading(target, lead_shape, lead_size)
        if out is None:
            return result
        out[...] = result
        return out


class DistributedRealSHT(_SHTBase):
    """Forward real SHT of distributed tiles.

    Parameters
    ----------
    grid : ProcessGrid
    nlat, nlon : int
        Global grid: latitudes (north pole first) and longitudes.
    lmax, mmax : int, optional
        Number of degrees and orders kept (defaults as torch-harmonics).
    quadrature : {"equiangular", "legendre-gauss", "lobatto"}
    norm : {"ortho", "schmidt", "four-pi"}
    csphase : bool
        Condon-Shortley phase.
    dtype : numpy.float32 or numpy.float64
        Real dtype of the fields; coefficients are the matching complex type.
    contraction : {"auto", "per-order", "batched"}, keyword-only
        One matrix product per order (NumPy's default) or one batched product
        over zero-padded tables (CuPy's default: one kernel instead of
        hundreds).

    Notes
    -----
    ``forward``: ``(..., h, w)`` real (this rank's tile of ``(nlat, nlon)``)
    -> ``(..., l_loc, m_loc)`` complex (this rank's block of ``(lmax, mmax)``:
    degrees split over ``grid.polar``, orders over ``grid.azimuth``).
    ``adjoint``: the exact adjoint, ``(..., l_loc, m_loc)`` -> ``(..., h,
    w)``. Any number of leading axes, of any size (the same on every rank).
    Collective over ``grid.cart``.
    """

    _tables_for = "analysis"
    _name = "DistributedRealSHT"

    def _forward(self, x, out):
        return self._grid_to_spectral("DistributedRealSHT.forward", x, out, adjoint=False)

    def _adjoint(self, y, out):
        return self._spectral_to_grid("DistributedRealSHT.adjoint", y, out, adjoint=True)


class DistributedInverseRealSHT(_SHTBase):
    """Inverse real SHT: coefficient blocks to distributed tiles.

    Same parameters as :class:`DistributedRealSHT`.

    Notes
    -----
    ``forward``: ``(..., l_loc, m_loc)`` complex -> ``(..., h, w)`` real.
    ``adjoint``: the exact adjoint, ``(..., h, w)`` -> ``(..., l_loc, m_loc)``.
    """

    _tables_for = "synthesis"
    _name = "DistributedInverseRealSHT"

    def _forward(self, c, out):
        return self._spectral_to_grid("DistributedInverseRealSHT.forward", c, out, adjoint=False)

    def _adjoint(self, g, out):
        return self._grid_to_spectral("DistributedInverseRealSHT.adjoint", g, out, adjoint=True)
