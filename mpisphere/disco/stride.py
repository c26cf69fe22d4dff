"""A DISCO convolution's longitude stride as a pipeline stage: every ``stride``-th longitude, and its adjoint."""

from ..agreement import InputError
from ..operators import ADJOINT, FORWARD
from ..stages.pipeline import LocalStage

__all__ = ["LongitudeStride"]


class LongitudeStride(LocalStage):
    """Every ``stride``-th longitude (forward); the adjoint puts them back between zeros."""

    def __init__(self, nlon, stride, layout):
        super().__init__(layout)
        self.nlon, self.stride = nlon, stride

    def _shapes(self, lead):
        return lead + (self.nlon,), lead + (self.nlon // self.stride,)

    def _output(self, direction, spec):
        n_in, n_out = self.nlon, self.nlon // self.stride
        if direction == ADJOINT:
            n_in, n_out = n_out, n_in
        if not spec.shape or spec.shape[-1] != n_in:
            raise InputError(f"expected (..., {n_in}), got {spec.shape}")
        return spec.but(shape=spec.shape[:-1] + (n_out,)), spec.describe()

    def _run(self, direction, x, out, context):
        if direction == FORWARD:
            out[...] = x[..., ::self.stride]
        else:
            out[...] = 0
            out[..., ::self.stride] = x
