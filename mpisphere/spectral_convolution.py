"""Spectral convolution of distributed tiles (torch-harmonics' ``SpectralConvS2``): SHT, l-wise mixing, inverse SHT.

Per degree ``l`` the weights mix the channels, the same for every order:
``Y[b, g, o, l, m] = sum_i W[g, i, o, l] X[b, g, i, l, m]`` with ``X`` the
SHT of the input; with a spectral bias ``X`` is first moved by the input's
integral over the sphere times the bias, ``X[b, c] += I[b, c] bias[c]``
(torch-harmonics' convention). For given weights and bias the whole map is
linear in the input: the operator has its exact adjoint, and
``SpectralConvS2.gradients`` gives the parameters' whole-sphere
gradients on every rank. The coefficient blocks stay where the transforms
leave them (degrees over the polar ranks, orders over the azimuth ranks), so
the mixing is local.
"""

import math

import numpy

from . import backend, collectives, dtypes
from .agreement import agree_construction
from .integral import QuadratureS2
from .operators import ADJOINT, DISTRIBUTED, FORWARD, Layout, ParametrisedOperator, parameter
from .quadrature import truncate_sht
from .sht import DistributedInverseRealSHT, DistributedRealSHT
from .tiling import RegularTiling
from .validation import check_dtype, check_int

__all__ = ["SpectralConvS2", "spectral_truncation"]


def spectral_truncation(in_shape, out_shape, quadrature_in="equiangular", quadrature_out="equiangular"):
    """torch-harmonics' degrees of a spectral convolution: the smaller truncation of both grids, triangular."""
    lmax_in, mmax_in = truncate_sht(*in_shape, quadrature=quadrature_in)
    lmax_out, mmax_out = truncate_sht(*out_shape, quadrature=quadrature_out)
    return min(lmax_in, lmax_out, mmax_in, mmax_out)


class SpectralConvS2(ParametrisedOperator):
    """Spectral convolution of distributed tiles: the inverse SHT of the weights times the SHT plus bias.

    ``inverse_sht(W * (sht(x) + I(x) bias))``, ``W`` per degree.

    Parameters
    ----------
    grid : ProcessGrid
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the input and output grids.
    weight : complex array, ``(groups, in_channels // groups, out_channels // groups, lmax)``
        torch-harmonics' layout; ``lmax`` is ``spectral_truncation``'s.
        The same on every rank; settable.
    bias : complex array ``(1, in_channels, lmax, lmax)`` or None, keyword-only
        The spectral bias (torch-harmonics' ``spectral_bias``); settable.
    quadrature_in, quadrature_out : str, keyword-only
        The latitude rules (torch-harmonics' ``grid_in``, ``grid_out``).
    dtype : float32 or float64, keyword-only
        Of the fields (the weights are used in the matching complex type).

    Notes
    -----
    ``forward``: ``(..., in_channels, h, w)`` -> ``(..., out_channels, h', w')``,
    this rank's tiles; ``adjoint``: the exact adjoint. ``gradients(x,
    y_bar)`` gives ``(x_bar, weight_bar, bias_bar)``, the parameters'
    whole-sphere gradients the same on every rank
    (:class:`~mpisphere.ParametrisedOperator`). Collective over
    ``grid.cart``; construction too.
    """

    parameter_names = ("weight", "bias")

    def __init__(self, grid, in_shape, out_shape, weight, *, bias=None, quadrature_in="equiangular",
                 quadrature_out="equiangular", dtype=numpy.float64):
        agree_construction(self, grid.cart, who="SpectralConvS2")
        self.grid = grid
        self.in_shape = tuple(check_int(v, "in_shape", self.name, minimum=1) for v in in_shape)
        self.out_shape = tuple(check_int(v, "out_shape", self.name, minimum=1) for v in out_shape)
        self.dtype = check_dtype(dtype, "transformed", "dtype", self.name)
        self.cdtype = dtypes.complex_of(self.dtype)
        self.lmax = spectral_truncation(self.in_shape, self.out_shape, quadrature_in, quadrature_out)
        self.sht = DistributedRealSHT(grid, *self.in_shape, self.lmax, self.lmax, quadrature=quadrature_in,
                                      dtype=self.dtype)
        self.isht = DistributedInverseRealSHT(grid, *self.out_shape, self.lmax, self.lmax, quadrature=quadrature_out,
                                              dtype=self.dtype)
        self.quadrature = QuadratureS2(grid, self.in_shape, quadrature_in, dtype=self.dtype)
        self.tiling_in, self.tiling_out = RegularTiling(grid, *self.in_shape), RegularTiling(grid, *self.out_shape)
        self.degrees = numpy.asarray(self.sht.local_degrees)
        self.orders = numpy.asarray(self.sht.local_orders)
        self._init_parameters(weight=weight, bias=bias)
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self._workspace = backend.Workspace()

    # --- parameters ------------------------------------------------------------------------------

    weight = parameter("weight", "``(groups, in_channels // groups, out_channels // groups, lmax)`` complex, the same "
                       "on every rank; settable.")
    bias = parameter("bias", "``(1, in_channels, lmax, lmax)`` complex or None, the same on every rank; settable.")

    def _prepare_parameters(self, values):
        host = values["weight"]
        if host is None or host.ndim != 4 or host.shape[3] != self.lmax:
            raise ValueError(f"{self.name}: weight must be (groups, in_channels // groups, out_channels // groups, "
                             f"lmax={self.lmax}), got {'None' if host is None else f'shape {host.shape}'}")
        weight = numpy.array(host, dtype=self.cdtype)
        self.groups, cg, og, _ = host.shape
        self.in_channels, self.out_channels = self.groups * cg, self.groups * og
        self._local_weight = numpy.ascontiguousarray(weight[..., self.degrees])
        self._device = {}
        bias, self._local_bias = values["bias"], None
        if bias is not None:
            if bias.shape != (1, self.in_channels, self.lmax, self.lmax):
                raise ValueError(f"{self.name}: bias must be (1, in_channels={self.in_channels}, lmax={self.lmax}, "
                                 f"lmax={self.lmax}) or None, got shape {bias.shape}")
            bias = numpy.array(bias, dtype=self.cdtype)
            self._local_bias = numpy.ascontiguousarray(bias[0][:, self.degrees][:, :, self.orders])
        self._device_bias = {}
        return {"weight": weight, "bias": bias}

    def _parameters(self, like):
        weight = backend.on_device_of(like, self._local_weight, self._device)
        bias = None if self._local_bias is None else backend.on_device_of(like, self._local_bias, self._device_bias)
        return weight, bias

    # --- shapes and checks -----------------------------------------------------------------------

    def _sides(self):
        return ((self.in_channels,) + self.sht.tile_shape, (self.out_channels,) + self.isht.tile_shape)

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

    # --- the call --------------------------------------------------------------------------------

    def _buffer(self, name, like, shape, dtype):
        return self._workspace.scratch(name, like, math.prod(shape), dtype).reshape(shape)

    def _blocks(self, like, lead):
        block = self.sht.block_shape
        return (self._buffer("input coefficients", like, lead + (self.in_channels,) + block, self.cdtype),
                self._buffer("output coefficients", like, lead + (self.out_channels,) + block, self.cdtype))

    def _grouped(self, a, channels):
        return a.reshape(a.shape[:-3] + (self.groups, channels // self.groups) + a.shape[-2:])

    def _mix(self, direction, source, target, weight):
        xp = backend.array_module(source)
        options = {"optimize": True} if xp is numpy else {}
        if direction == FORWARD:
            mixed = xp.einsum("...gilm,giol->...golm", self._grouped(source, self.in_channels), weight, **options)
        else:
            mixed = xp.einsum("...golm,giol->...gilm", self._grouped(source, self.out_channels), weight.conj(),
                              **options)
        target[...] = mixed.reshape(target.shape)

    def _integral(self, x, context):
        """``I(x)``, ``(..., in_channels)``, replicated."""
        out = backend.array_module(x).empty(x.shape[:-2], dtype=self.dtype)
        self.quadrature.run_agreed(FORWARD, x, out, context)
        return out

    def _coefficients(self, x, coefficients, context):
        """The SHT of ``x`` moved by the bias: the contraction's input."""
        self.sht.run_agreed(FORWARD, x, coefficients, context)
        _, bias = self._parameters(x)
        if bias is not None:
            coefficients += self._integral(x, context)[..., None, None] * bias
        return coefficients

    def _adjoint_into(self, coefficients, out, context):
        """``out`` = the adjoint of :meth:`_coefficients` applied to ``coefficients``."""
        self.sht.run_agreed(ADJOINT, coefficients, out, context)
        _, bias = self._parameters(coefficients)
        if bias is not None:
            xp = backend.array_module(coefficients)
            partial = xp.ascontiguousarray((coefficients.conj() * bias).real.sum(axis=(-2, -1)))
            total = xp.empty_like(partial)
            collectives.allreduce(self.grid.cart, partial.reshape(-1), total.reshape(-1), staged=context.staged,
                                  workspace=self._workspace)
            out += total[..., None, None] * self.quadrature.row_weights(out)[:, None]

    def _run(self, direction, x, out, context):
        lead = tuple(x.shape[:-3])
        weight, _ = self._parameters(x)
        spectrum_in, spectrum_out = self._blocks(x, lead)
        if direction == FORWARD:
            self._coefficients(x, spectrum_in, context)
            self._mix(FORWARD, spectrum_in, spectrum_out, weight)
            self.isht.run_agreed(FORWARD, spectrum_out, out, context)
        else:
            self.isht.run_agreed(ADJOINT, x, spectrum_out, context)
            self._mix(ADJOINT, spectrum_out, spectrum_in, weight)
            self._adjoint_into(spectrum_in, out, context)

    def _gradient_parts(self, x, y_bar, input_gradient, context):
        """The input's gradient and this rank's parts of the weight's and the bias's (see ``gradients``)."""
        xp = backend.array_module(x)
        lead = tuple(x.shape[:-3])
        weight, bias = self._parameters(x)
        spectrum_in, spectrum_out = self._blocks(x, lead)
        self._coefficients(x, spectrum_in, context)
        self.isht.run_agreed(ADJOINT, y_bar, spectrum_out, context)
        options = {"optimize": True} if xp is numpy else {}
        local = xp.einsum("...gilm,...golm->giol", self._grouped(spectrum_in, self.in_channels).conj(),
                          self._grouped(spectrum_out, self.out_channels), **options)
        parts = {"weight": numpy.zeros(self.weight.shape, dtype=self.cdtype)}
        parts["weight"][..., self.degrees] = backend.to_host(local)
        x_bar = None
        if bias is not None or input_gradient:
            self._mix(ADJOINT, spectrum_out, spectrum_in, weight)   # the cotangent of the contraction's input
        if bias is not None:
            integral = self._integral(x, context)
            local_bias = (integral[..., None, None] * spectrum_in).reshape((-1, self.in_channels)
                                                                             + spectrum_in.shape[-2:]).sum(axis=0)
            parts["bias"] = numpy.zeros(self.bias.shape, dtype=self.cdtype)
            rows = numpy.ix_(numpy.arange(self.in_channels), self.degrees, self.orders)
            parts["bias"][0][rows] = backend.to_host(local_bias)
        if input_gradient:
            x_bar = xp.empty(lead + self._sides()[0], dtype=self.dtype)
            self._adjoint_into(spectrum_in, x_bar, context)
        return x_bar, parts
