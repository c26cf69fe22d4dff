"""The integral over the sphere of distributed fields (torch-harmonics' ``QuadratureS2``), replicated on every rank."""

import math

import numpy

from . import backend, collectives
from .agreement import InputError, agree_construction
from .grid import check_tile
from .operators import ADJOINT, DISTRIBUTED, FORWARD, REPLICATED, Layout, ParametrisedOperator
from .quadrature import latitudes, rule
from .tiling import RegularTiling
from .validation import check_dtype, check_int

__all__ = ["QuadratureS2"]


class QuadratureS2(ParametrisedOperator):
    """The integral over the sphere of each field of distributed tiles, the same on every rank.

    ``sum_{i,j} w_i (2 pi / nlon) x[..., i, j]`` over the whole grid.

    Parameters
    ----------
    grid : ProcessGrid
    shape : (int, int)
        ``(nlat, nlon)`` of the whole grid.
    quadrature : str
        The latitude rule (torch-harmonics' ``grid=``).
    normalize : bool
        Divide by ``4 pi``: the mean over the sphere instead of the integral.
    dtype : float32 or float64, keyword-only

    Notes
    -----
    ``forward``: ``(..., h, w)`` distributed (this rank's tile) ->
    ``(...)`` replicated (each rank's partial sum, summed over
    ``grid.cart`` by ``Allreduce``). ``adjoint``: ``(...)`` replicated ->
    ``(..., h, w)``, the value times each point's weight. No parameters:
    ``gradients(x, y_bar)`` is ``(adjoint(y_bar),)``.
    """

    def __init__(self, grid, shape, quadrature="equiangular", normalize=False, *, dtype=numpy.float64):
        agree_construction(self, grid.cart, who="QuadratureS2")
        self.grid = grid
        nlat, nlon = (check_int(v, "shape", "QuadratureS2", minimum=1) for v in shape)
        self.shape = (nlat, nlon)
        self.quadrature = rule(quadrature).name
        self.normalize = bool(normalize)
        self.dtype = check_dtype(dtype, "transformed", "dtype", "QuadratureS2")
        _, weights = latitudes(nlat, self.quadrature)
        weights = weights * (2.0 * math.pi / nlon) / (4.0 * math.pi if normalize else 1.0)
        self.tiling_in = RegularTiling(grid, nlat, nlon)   # the output is replicated: no tiling_out
        lat, lon = self.tiling_in.slices()
        self.tile = (lat.stop - lat.start, lon.stop - lon.start)
        self._weights = numpy.ascontiguousarray(weights[lat], dtype=self.dtype)
        self._device = {}
        self._workspace = backend.Workspace()
        self.domain = Layout(DISTRIBUTED, grid.cart)
        self.range = Layout(REPLICATED, grid.cart)
        self._comm = grid.cart
        self._init_parameters()

    def _shapes(self, lead):
        return lead + self.tile, lead

    def row_weights(self, like):
        """This rank's row weights ``(h,)``: ``w_i 2 pi / nlon`` (over ``4 pi`` if normalised), on like's device."""
        return backend.on_device_of(like, self._weights, self._device)

    def _call_output(self, direction, spec):
        if direction == FORWARD:
            check_tile(self.grid, spec, self.shape, self.dtype)
            return spec.but(shape=spec.shape[:-2]), spec.describe((-2, -1))
        if spec.dtype != self.dtype:
            raise InputError(f"expected {self.dtype.name}, got {spec.dtype.name}", TypeError)
        return spec.but(shape=tuple(spec.shape) + self.tile), spec.describe()

    def _run(self, direction, x, out, context):
        xp = backend.array_module(x)
        weights = self.row_weights(x)
        if direction == ADJOINT:
            out[...] = x[..., None, None] * weights[:, None]
            return
        partial = xp.ascontiguousarray(xp.einsum("...ij,i->...", x, weights)).reshape(-1)
        target = out.reshape(-1) if out.flags.c_contiguous else xp.empty_like(partial)
        collectives.allreduce(self.grid.cart, partial, target, staged=context.staged, workspace=self._workspace)
        if not out.flags.c_contiguous:
            out[...] = target.reshape(out.shape)
