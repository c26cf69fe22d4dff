"""DISCO convolutions of distributed tiles (torch-harmonics' ``DiscreteContinuousConvS2`` and its transpose).

A rank's output rows read the input rows within the filter's radius: the
polar halo (:class:`~mpisphere.HaloExchange`, ``polar_halo_radius`` rows
from the geometry) brings them. Along longitude the filter is the same at
every output longitude, so the contraction is a circular correlation, which
the real FFT makes a product per order, and near the poles, where the filter
covers whole rings, costs no more than elsewhere. The stages of one call::

    (B, C, h, w) tile --halo--> (B C, h + 2 r, w)
      --azimuth transpose--> (B C / A, h + 2 r, nlon)    longitudes whole
      --real FFT--> (B C / A, h + 2 r, nlon / 2 + 1)
      --azimuth transpose--> (B C, h + 2 r, M / A)       all channels, this rank's orders
      --contraction (per basis function: a band of rows per order, the weights over channels)-->
      (B O, h_out, M / A) --> back the same way --> (B, O, h_out, w_out) tile

The contraction never holds the expansion over the basis functions of the
whole batch: one basis function at a time is expanded and contracted with
the weights. A bias (a declared parameter) is added per output channel after the stages.

Why the FFT rather than the sparse ``psi`` of torch-harmonics: the sparse
form visits every entry once per output longitude (near the poles a whole
ring per entry), the FFT form does ``O(J M)`` work per output row and order
for a band of ``J`` rows, and its loop runs over basis functions and band
offsets only (docs/benchmarks.md has the measurements).
"""

import math

import numpy

from .. import backend, dtypes
from ..agreement import Spec, agree_construction
from ..geometry import polar_halo_radius
from ..grid import check_finite
from ..halo import HaloExchange
from ..operators import ADJOINT, DISTRIBUTED, FORWARD, Layout, ParametrisedOperator, parameter
from ..partition import split_sizes
from ..quadrature import latitudes
from ..stages.fourier import FourierStage, resolve_fft
from ..stages.pipeline import Pipeline
from ..tiling import RegularTiling
from ..transpose import BufferPool, Transpose
from ..validation import check_dtype, check_int
from .bands import apply_band, band_tables
from .bases import filter_basis
from .psi import check_norm_mode, convolution_tensor, default_theta_cutoff, effective_cutoff
from .reach import shape_pair, widest_cutoff
from .stride import LongitudeStride

__all__ = ["DiscoConvS2", "DiscoConvTransposeS2"]


class _DiscoBase(ParametrisedOperator):
    """What the convolution and its transpose share: geometry, tables, halo, pipelines, the call."""

    parameter_names = ("weight", "bias")
    _transposed = False
    block_bytes = 1 << 20
    """Host arrays: the bytes of a row block's expansion (sized for the cache; tests make it tiny)."""

    def __init__(self, grid, in_shape, out_shape, kernel_shape, weight, *, basis_type="piecewise linear",
                 basis_norm_mode="nodal", groups=1, quadrature_in="equiangular", quadrature_out="equiangular",
                 theta_cutoff=None, bias=None, dtype=numpy.float64, fft="auto"):
        who = self.name
        agree_construction(self, grid.cart, who=who)
        self.grid = grid
        self.in_shape = shape_pair(in_shape, "in_shape", who)
        self.out_shape = shape_pair(out_shape, "out_shape", who)
        self.groups = check_int(groups, "groups", who, minimum=1)
        self.dtype = check_dtype(dtype, "transformed", "dtype", who)
        self.cdtype = dtypes.complex_of(self.dtype)
        self.basis = filter_basis(kernel_shape, basis_type)
        self.basis_norm_mode = check_norm_mode(basis_norm_mode, who)
        self.quadrature_in, self.quadrature_out = quadrature_in, quadrature_out
        (nlat_in, nlon_in), (nlat_out, nlon_out) = self.in_shape, self.out_shape
        small, big = sorted((nlon_in, nlon_out))
        if big % small:
            raise ValueError(f"{who}: the longitudes must be a multiple of each other ("
                             + ("nlon_out of nlon_in" if self._transposed else "nlon_in of nlon_out")
                             + f"), got in_shape={self.in_shape}, out_shape={self.out_shape}")
        if (nlon_out > nlon_in) != self._transposed and nlon_out != nlon_in:
            direction = "at least" if self._transposed else "at most"
            raise ValueError(f"{who}: the {'transposed ' if self._transposed else ''}convolution maps to {direction} "
                             f"as many longitudes, got in_shape={self.in_shape}, out_shape={self.out_shape}")
        self.nfft, self.stride = big, big // small
        coarse = (nlat_in, quadrature_in) if self._transposed else (nlat_out, quadrature_out)
        self.theta_cutoff = default_theta_cutoff(*coarse) if theta_cutoff is None else float(theta_cutoff)
        if not self.theta_cutoff > 0:
            raise ValueError(f"{who}: theta_cutoff must be positive, got {theta_cutoff!r}")
        self._init_parameters(weight=weight, bias=bias)
        theta_in, _ = latitudes(nlat_in, quadrature_in)
        theta_out, _ = latitudes(nlat_out, quadrature_out)
        try:
            self.halo_rows = polar_halo_radius(grid, theta_in, theta_out, effective_cutoff(self.theta_cutoff))
        except ValueError:
            widest = widest_cutoff(grid, theta_in, theta_out, self.theta_cutoff)
            raise ValueError(
                f"{who}: theta_cutoff={self.theta_cutoff:.6g} reaches past the neighbouring polar rank (input "
                f"latitudes split as {grid.lat_sizes(nlat_in)}); the widest cutoff this split serves is "
                f"{widest:.6f} (mpisphere.disco.widest_theta_cutoff computes it)\n  fix: a smaller theta_cutoff, "
                "fewer polar ranks or more latitudes") from None
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self.halo = HaloExchange(grid, self.halo_rows, extents=self.in_shape) if self.halo_rows else None
        self.tiling_in, self.tiling_out = RegularTiling(grid, nlat_in, nlon_in), RegularTiling(grid, nlat_out, nlon_out)
        lat_in, lon_in = self.tiling_in.slices()
        lat_out, lon_out = self.tiling_out.slices()
        self.tile_in = (lat_in.stop - lat_in.start, lon_in.stop - lon_in.start)
        self.tile_out = (lat_out.stop - lat_out.start, lon_out.stop - lon_out.start)
        self.half = self.nfft // 2 + 1
        sizes = split_sizes(self.half, grid.nazimuth)
        first = sum(sizes[:grid.azimuth.rank])
        self.orders = numpy.arange(first, first + sizes[grid.azimuth.rank])
        if self._transposed:
            tensor = convolution_tensor(self.basis, self.out_shape, self.in_shape, quadrature_out, quadrature_in,
                                        self.theta_cutoff, self.basis_norm_mode, transpose_normalization=True)
            targets_of, sources_of = "in_row", "out_row"
        else:
            tensor = convolution_tensor(self.basis, self.in_shape, self.out_shape, quadrature_in, quadrature_out,
                                        self.theta_cutoff, self.basis_norm_mode)
            targets_of, sources_of = "out_row", "in_row"
        self.source_rows = self.tile_in[0] + 2 * self.halo_rows
        self.bands = band_tables(tensor, targets_of, sources_of, (lat_out.start, lat_out.stop),
                                 lat_in.start - self.halo_rows, self.source_rows, self.nfft, self.orders,
                                 self._transposed, self.cdtype)
        self.fft = resolve_fft(fft)
        self._pipelines = backend.BoundedCache(4)
        self._exchange_buffers = BufferPool()
        self._workspace = backend.Workspace()

    # --- the parameters --------------------------------------------------------------------------

    weight = parameter("weight", "``(out_channels, in_channels // groups, kernel_size)``, the same on every rank; "
                       "settable.")
    bias = parameter("bias", "``(out_channels,)`` or None: added to every point of each output channel; settable.")

    @property
    def linear(self):
        """False with a bias: the map is then affine, with no adjoint (``gradients`` serves the backward)."""
        return self._parameter_values["bias"] is None

    def _prepare_parameters(self, values):
        host = values["weight"]
        if host is None or host.ndim != 3 or host.shape[2] != self.basis.kernel_size or host.shape[0] % self.groups:
            raise ValueError(f"{self.name}: weight must be (out_channels, in_channels // groups, kernel_size="
                             f"{self.basis.kernel_size}) with out_channels a multiple of groups={self.groups}, "
                             f"got {'None' if host is None else f'shape {host.shape}'}")
        weight = numpy.array(host, dtype=self.dtype)
        bias = values["bias"]
        if bias is not None:
            if bias.shape != (host.shape[0],):
                raise ValueError(f"{self.name}: bias must be (out_channels={host.shape[0]},) or None, got shape "
                                 f"{bias.shape}")
            bias = numpy.array(bias, dtype=self.dtype)
        self.out_channels = host.shape[0]
        self.in_channels = host.shape[1] * self.groups
        g, og, cg, K = self.groups, self.out_channels // self.groups, host.shape[1], self.basis.kernel_size
        per_kernel = weight.reshape(g, og, cg, K).transpose(0, 3, 1, 2)   # (g, K, og, cg)
        mixing = []
        for m in (per_kernel, per_kernel.swapaxes(-1, -2)):                # forward, adjoint: (g, K, b, a)
            b, a = m.shape[2:]
            mixing += [numpy.ascontiguousarray(m.transpose(0, 2, 1, 3).reshape(g, b, K * a)),  # flat (g, b, K a)
                       numpy.ascontiguousarray(m.reshape(g, K * b, a))]                        # stacked (g, K b, a)
        self._mixing = tuple(mixing)
        self._device_weights, self._device_bias = {}, {}
        return {"weight": weight, "bias": bias}

    def _mixers(self, like, direction):
        """``(flat, stacked)``: ``direction``'s weights (a -> b channels) as ``(g, b, K a)`` and ``(g, K b, a)``."""
        mixing = backend.on_device_of(like, self._mixing, self._device_weights)
        return mixing[:2] if direction == FORWARD else mixing[2:]

    # --- shapes and checks -----------------------------------------------------------------------

    def _sides(self):
        return (self.in_channels,) + self.tile_in, (self.out_channels,) + self.tile_out

    def _shapes(self, lead):
        side_in, side_out = self._sides()
        return lead + side_in, lead + side_out

    def _side_channels(self, side):
        return self.in_channels if side == "in" else self.out_channels

    def _call_output(self, direction, spec):
        side_in, side_out = self._sides()
        if direction == ADJOINT:
            side_in, side_out = side_out, side_in
        self._check_side(spec, "in" if direction == FORWARD else "out", "input")
        return spec.but(shape=spec.shape[:-3] + side_out), f"input={spec.describe((-2, -1))}"

    def _check_values(self, direction, x):
        check_finite(self.grid, x, self.out_shape if direction == ADJOINT else self.in_shape,
                     "input" if direction == FORWARD else "the adjoint's input")

    # --- the call --------------------------------------------------------------------------------

    def _pipeline_pair(self, batch, device):
        """The stages before and after the contraction for ``batch`` fields (built once per batch)."""
        def build():
            g, layout, pool = self.grid, self.domain, self._exchange_buffers
            items_in, items_out = self._items(batch * self.in_channels), self._items(batch * self.out_channels)
            nlon_in, nlon_out = self.in_shape[1], self.out_shape[1]
            front = [Transpose(g.azimuth, axes=(0, 2), extents=(items_in, nlon_in), pool=pool)]
            if self._transposed and self.stride > 1:
                front.append(LongitudeStride(self.nfft, self.stride, layout).H)
            # the FFTs of float32 data in float64: in float32 their rounding was most of the layer's error
            front += [FourierStage(self.nfft, self.dtype, False, layout, self.fft, float64_arithmetic=True),
                      Transpose(g.azimuth, axes=(2, 0), extents=(self.half, items_in), pool=pool)]
            back = [Transpose(g.azimuth, axes=(0, 2), extents=(items_out, self.half), pool=pool),
                    FourierStage(self.nfft, self.dtype, True, layout, self.fft, float64_arithmetic=True)]
            if not self._transposed and self.stride > 1:
                back.append(LongitudeStride(self.nfft, self.stride, layout))
            back.append(Transpose(g.azimuth, axes=(2, 0), extents=(nlon_out, items_out), pool=pool))
            spec_front = Spec((items_in, self.source_rows, self.tile_in[1]), self.dtype, device)
            spec_back = Spec((items_out, self.tile_out[0], len(self.orders)), self.cdtype, device)
            # the two run one after the other, never at once: they take turns in the grid's pipeline buffers,
            # which the transforms on the grid share too, and their four transposes in one buffer set
            return Pipeline(front, spec_front, self.grid.scratch), Pipeline(back, spec_back, self.grid.scratch)
        return self._pipelines.get((batch, device), build)

    def _buffer(self, name, like, shape, dtype):
        return self._workspace.scratch(name, like, math.prod(shape), dtype).reshape(shape)

    def _spectra(self, like, batch):
        """This call's spectral buffers: the input's ``(B C, S, M_a)`` and the output's ``(B O, T, M_a)``."""
        m = len(self.orders)
        return (self._buffer("input spectrum", like, (batch * self.in_channels, self.source_rows, m), self.cdtype),
                self._buffer("output spectrum", like, (batch * self.out_channels, self.tile_out[0], m), self.cdtype))

    def _items(self, n):
        """The fields the transposes move for ``n``: at least one per azimuth rank (zeros added)."""
        return max(n, self.grid.nazimuth)

    def _front(self, x, batch, spectrum, context):
        """``x`` (B C, h, w) -> its spectrum on this rank's orders (B C, S, M_a), halo rows included."""
        front, _ = self._pipeline_pair(batch, backend.is_device_array(x))
        n = x.shape[0]
        items = self._items(n)
        padded = x
        if self.halo is not None or items > n:
            padded = self._buffer("padded", x, (items, self.source_rows, x.shape[2]), self.dtype)
            padded[n:] = 0
            if self.halo is not None:
                self.halo.run_agreed(FORWARD, x, padded[:n], context)
            else:
                padded[:n] = x
        target = spectrum
        if items > n:
            target = self._buffer("padded spectrum", x, (items,) + spectrum.shape[1:], self.cdtype)
        front.run(FORWARD, padded, target, context)
        if target is not spectrum:
            spectrum[...] = target[:n]

    def _front_adjoint(self, spectrum, batch, out, context):
        """The adjoint of :meth:`_front`: a spectrum (B C, S, M_a) -> ``out`` (B C, h, w)."""
        front, _ = self._pipeline_pair(batch, backend.is_device_array(spectrum))
        n = out.shape[0]
        items = self._items(n)
        if items > n:
            source = self._buffer("padded spectrum", spectrum, (items,) + spectrum.shape[1:], self.cdtype)
            source[:n] = spectrum
            source[n:] = 0
            spectrum = source
        # the spectrum is this operator's scratch: the FFT's adjoint may scale it in place
        if self.halo is None and items == n:
            front.run(ADJOINT, spectrum, out, context, consume=True)
            return
        padded = self._buffer("padded", out, (items, self.source_rows, out.shape[2]), self.dtype)
        front.run(ADJOINT, spectrum, padded, context, consume=True)
        if self.halo is not None:
            self.halo.run_agreed(ADJOINT, padded[:n], out, context)
        else:
            out[...] = padded[:n]

    def _back(self, direction, source, target, batch, context):
        """The stages after the contraction: a spectrum (B O, T, M_a) -> the tile (B O, h', w') (or adjoint)."""
        _, back = self._pipeline_pair(batch, backend.is_device_array(source))
        n = (source if direction == FORWARD else target).shape[0]
        items = self._items(n)
        if items == n:
            back.run(direction, source, target, context)
            return
        dtype = self.cdtype if direction == FORWARD else self.dtype
        widened = self._buffer("padded back", source, (items,) + source.shape[1:], dtype)
        widened[:n] = source
        widened[n:] = 0
        result = self._buffer("padded result", source, (items,) + target.shape[1:], target.dtype)
        back.run(direction, widened, result, context)
        target[...] = result[:n]

    def _split(self, a, batch, channels):
        """A ``(B c, rows, M)`` array as ``(B, g, c / g, rows, M)`` (a view)."""
        return a.reshape((batch, self.groups, channels // self.groups) + a.shape[1:])

    def _flat_real(self, a):
        """A complex ``(..., rows, M)`` array as real ``(..., 2 rows M)`` (a view where the layout allows)."""
        return a.view(self.dtype).reshape(a.shape[:-2] + (-1,))

    def _blocks(self, band, like, row_bytes):
        """``band``'s blocks of target rows, as many as keep ``row_bytes`` a target row near ``block_bytes``.

        Host arrays: the block's expansion and products stay in the cache, so the contraction's passes
        over the spectrum cost one trip through memory. Device kernels: one block per basis function
        whatever the size (the operations issued do not grow with rows; the expansion of all basis
        functions together is then about one spectrum's size).
        """
        ntargets = band.table.shape[2]
        if backend.device_kernels(like):
            return band.blocks(-(-ntargets // self.basis.kernel_size))
        return band.blocks(max(1, self.block_bytes // max(row_bytes, 1)))

    def _expand(self, band, sub, source, expanded):
        """``expanded[:, :, k] = `` the band of basis function ``k`` applied to ``source`` (each ``k``)."""
        scratch = self._buffer("band scratch", source, expanded[:, :, 0].shape, self.cdtype)
        for k in range(self.basis.kernel_size):
            apply_band(sub, k, source, expanded[:, :, k], scratch)

    def _contract(self, direction, source, target, batch):
        """The contraction stage: ``target`` = the contraction (``direction``) of ``source``.

        ``y = sum_k W_k B_k x``: the band ``B_k`` of each basis function acts on rows and orders alike
        for every channel, so it commutes with the weights' mixing of channels and runs on the side with
        fewer channels. Row block by row block (``_blocks``), all basis functions of a block at once: the
        mixing is then one product with ``K`` times the channels.
        """
        xp = backend.array_module(source)
        flat, stacked = self._mixers(source, direction)
        band = self.bands[0] if direction == FORWARD else self.bands[1]
        a, b = (self.in_channels, self.out_channels) if direction == FORWARD else (self.out_channels,
                                                                                  self.in_channels)
        g, K, m = self.groups, self.basis.kernel_size, source.shape[2]
        src, tgt = self._split(source, batch, a), self._split(target, batch, b)
        csize = numpy.dtype(self.cdtype).itemsize
        for rows, sources, sub in self._blocks(band, source, batch * min(a, b) * K * m * csize):
            count = len(range(*rows.indices(tgt.shape[3])))
            block = self._buffer("block", source, (batch, g, b // g, count, m), self.cdtype)
            if a <= b:        # band, then mix
                expanded = self._buffer("expanded", source, (batch, g, K, a // g, count, m), self.cdtype)
                self._expand(band, sub, src[..., sources, :], expanded)
                xp.matmul(flat, self._flat_real(expanded.reshape(batch, g, K * (a // g), count, m)),
                          out=self._flat_real(block))
            else:             # mix, then band
                part = src[..., sources, :]
                mixed = self._buffer("mixed", source, (batch, g, K, b // g) + part.shape[-2:], self.cdtype)
                xp.matmul(stacked, self._flat_real(part),
                          out=self._flat_real(mixed.reshape((batch, g, K * (b // g)) + part.shape[-2:])))
                scratch = self._buffer("band scratch", source, block.shape, self.cdtype)
                term = self._buffer("term", source, block.shape, self.cdtype)
                for k in range(K):
                    apply_band(sub, k, mixed[:, :, k], block if k == 0 else term, scratch)
                    if k:
                        block += term
            tgt[..., rows, :] = block

    def _run(self, direction, x, out, context):
        side_in, side_out = self._sides() if direction == FORWARD else self._sides()[::-1]
        batch = math.prod(x.shape[:x.ndim - 3])
        xp = backend.array_module(x)
        xb = xp.ascontiguousarray(x).reshape((batch * side_in[0],) + side_in[1:])
        direct = out.flags.c_contiguous
        target = out.reshape((batch * side_out[0],) + side_out[1:]) if direct else \
            self._buffer("result", out, (batch * side_out[0],) + side_out[1:], self.dtype)
        spectrum_in, spectrum_out = self._spectra(x, batch)
        if direction == FORWARD:
            self._front(xb, batch, spectrum_in, context)
            self._contract(FORWARD, spectrum_in, spectrum_out, batch)
            self._back(FORWARD, spectrum_out, target, batch, context)
        else:
            self._back(ADJOINT, xb, spectrum_out, batch, context)
            self._contract(ADJOINT, spectrum_out, spectrum_in, batch)
            self._front_adjoint(spectrum_in, batch, target, context)
        if direction == FORWARD and self.bias is not None:
            bias = backend.on_device_of(target, self.bias, self._device_bias)
            target.reshape((batch, self.out_channels, -1))[...] += bias[:, None]
        if not direct:
            out[...] = target.reshape(out.shape)

    # --- gradients -------------------------------------------------------------------------------

    def _check_gradient_values(self, x, y_bar):
        check_finite(self.grid, x, self.in_shape, "x")
        check_finite(self.grid, y_bar, self.out_shape, "y_bar")

    def _gradient_parts(self, x, y_bar, input_gradient, context):
        """The input's gradient and this rank's parts of the weights' and the bias's (see ``gradients``)."""
        xp = backend.array_module(x)
        lead = tuple(x.shape[:-3])
        batch = math.prod(lead)
        xb = xp.ascontiguousarray(x).reshape((batch * self.in_channels,) + self.tile_in)
        yb = xp.ascontiguousarray(y_bar).reshape((batch * self.out_channels,) + self.tile_out)
        spectrum_in, spectrum_out = self._spectra(x, batch)
        self._front(xb, batch, spectrum_in, context)
        self._back(ADJOINT, yb, spectrum_out, batch, context)
        grad = self._gradient_pass(spectrum_in, spectrum_out, batch, input_gradient)
        cg, K = self.in_channels // self.groups, self.basis.kernel_size
        x_bar = None
        if input_gradient:
            x_bar = xp.empty(lead + (self.in_channels,) + self.tile_in, dtype=self.dtype)
            self._front_adjoint(spectrum_in, batch, x_bar.reshape(xb.shape), context)
        parts = {"weight": grad.transpose(0, 2, 3, 1).reshape(self.out_channels, cg, K)}
        if self.bias is not None:
            per_channel = yb.reshape(batch, self.out_channels, -1).sum(axis=(0, 2))
            parts["bias"] = backend.to_host(per_channel).astype(numpy.float64)
        return x_bar, parts

    def _gradient_pass(self, spectrum_in, spectrum_out, batch, input_gradient):
        """The weights' gradient ``(g, K, og, cg)`` (float64, this rank's part) and, with ``input_gradient``,
        the input's cotangent spectrum written over ``spectrum_in``.

        ``y = sum_k W_k B_k x``: with ``U_k = B_k^H y_bar`` the weights' gradient is ``<U_k, x>`` and the
        input's ``sum_k W_k^T U_k`` (one band per basis function serves both). Block by block of the
        input's rows; a block's input rows are read for the gradient before its cotangent replaces them.
        """
        xp = backend.array_module(spectrum_in)
        flat, _ = self._mixers(spectrum_in, ADJOINT)
        g, K, m = self.groups, self.basis.kernel_size, spectrum_in.shape[2]
        og, cg = self.out_channels // g, self.in_channels // g
        x = self._split(spectrum_in, batch, self.in_channels)
        y_bar = self._split(spectrum_out, batch, self.out_channels)
        grad = numpy.zeros((g, K * og, cg), dtype=numpy.float64)
        csize = numpy.dtype(self.cdtype).itemsize
        for rows, sources, sub in self._blocks(self.bands[1], spectrum_in, batch * self.out_channels * K * m * csize):
            count = len(range(*rows.indices(x.shape[3])))
            expanded = self._buffer("expanded", spectrum_in, (batch, g, K, og, count, m), self.cdtype)
            self._expand(self.bands[1], sub, y_bar[..., sources, :], expanded)
            u = self._flat_real(expanded.reshape(batch, g, K * og, count, m))
            block = self._buffer("block", spectrum_in, (batch, g, cg, count, m), self.cdtype)
            block[...] = x[..., rows, :]
            # (B, g, K og, Z) @ (B, g, Z, cg), summed over the batch
            grad += backend.to_host(xp.matmul(u, self._flat_real(block).swapaxes(-1, -2)).sum(axis=0))
            if input_gradient:
                xp.matmul(flat, u, out=self._flat_real(block))
                x[..., rows, :] = block
        return grad.reshape(g, K, og, cg)


    def weight_gradient(self, x, y_bar):
        """The whole-sphere gradient of ``<y_bar, forward(x)>`` with respect to the weights (see ``gradients``)."""
        return self.gradients(x, y_bar, input_gradient=False)[1]


class DiscoConvS2(_DiscoBase):
    """DISCO convolution of distributed tiles (torch-harmonics' ``DiscreteContinuousConvS2``).

    Parameters
    ----------
    grid : ProcessGrid
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the input and output grids; ``nlon_in`` a
        multiple of ``nlon_out``.
    kernel_shape : int or tuple of int
        See ``mpisphere.disco.filter_basis``.
    weight : array, ``(out_channels, in_channels // groups, kernel_size)``
        The same on every rank; settable (``op.weight = new``).
    basis_type : {"piecewise linear", "harmonic", "morlet", "zernike"}, keyword-only
    basis_norm_mode : {"nodal", "modal", "mean", "support", "geometric", "none"}, keyword-only
    groups : int, keyword-only
    quadrature_in, quadrature_out : str, keyword-only
        The latitude rules (torch-harmonics' ``grid_in``, ``grid_out``).
    theta_cutoff : float, keyword-only
        The filter's radius (default: the largest latitude gap of the output
        grid, torch-harmonics' default).
    bias : array ``(out_channels,)`` or None, keyword-only
        Added to each output channel (torch-harmonics' ``bias``); settable.
    dtype : float32 or float64, keyword-only
    fft : {"auto", "numpy", "ducc0"}, keyword-only

    Notes
    -----
    ``forward``: ``(..., in_channels, h, w)`` (this rank's tile of
    ``in_shape``) -> ``(..., out_channels, h', w')`` (its tile of
    ``out_shape``); ``adjoint``: the exact adjoint (without a bias; with
    one the map is affine and has none). Both distributed over
    ``grid.cart``. ``gradients(x, y_bar)`` gives ``(x_bar, weight_bar,
    bias_bar)``, the parameters' whole-sphere gradients the same on every
    rank (:class:`~mpisphere.ParametrisedOperator`). Every call
    compares the parameters across the ranks (a digest of each).

    Construction is collective over ``grid.cart``.

    Raises
    ------
    ValueError
        On every rank at construction: different arguments on some rank, a
        cutoff that reaches past the neighbouring polar rank (the message
        names the widest this split serves), longitudes that are not a
        multiple of each other.
    """


class DiscoConvTransposeS2(_DiscoBase):
    """The transposed DISCO convolution (torch-harmonics' ``DiscreteContinuousConvTransposeS2``).

    Same parameters as :class:`DiscoConvS2`, with ``nlon_out`` a multiple of
    ``nlon_in`` and the default cutoff from the input grid. The filter is
    applied in the adjoint direction of a convolution from ``out_shape`` to
    ``in_shape``, normalised as torch-harmonics does for its transpose.
    """

    _transposed = True
