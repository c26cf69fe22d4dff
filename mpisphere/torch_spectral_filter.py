"""torch-harmonics' example ``SpectralConvS2`` (the SFNO's filter) on tiles (the ``torch`` extra).

The example models' spectral convolution (``torch_harmonics.examples.models.
_layers.SpectralConvS2``, not the library's) takes its two transforms as
arguments and multiplies the coefficients by a complex weight over the
degrees ``l`` (``"driscoll-healy"``), over ``l`` and ``m`` (``"diagonal"``)
or over ``l`` with a matrix in ``m`` (``"block-diagonal"``). Given
distributed transforms, each rank holds the block ``(l_local, m_local)`` of
the coefficients (torch-harmonics' layout: ``l`` split over the polar ranks,
``m`` over the azimuth ranks) and multiplies it by its block of the weight:
no communication beyond the transforms'. The weight stays whole (the serial
module's parameter, its ``state_dict`` unchanged); its gradient on a rank is
its block's, and the model's ``replicate`` sums the blocks over the grid.
A block-diagonal weight mixes the orders ``m``, which lie on other azimuth
ranks: it is refused when the azimuth is split.
"""

import torch

__all__ = ["DistributedSpectralFilter"]


def _start(shapes, rank):
    return sum(shapes[:rank])


class DistributedSpectralFilter(torch.nn.Module):
    """The example ``SpectralConvS2`` over distributed transforms: ``(B, C_in, h, w)`` tile -> ``(tile, residual)``.

    Parameters
    ----------
    serial : torch.nn.Module
        The example module, whose ``forward_transform`` and ``inverse_transform``
        are already distributed (:class:`~mpisphere.torch_harmonics.DistributedRealSHT`
        and its inverse); its ``weight`` (and ``bias``) are copied.
    process_grid : ProcessGrid, keyword-only

    Notes
    -----
    Returns ``(y, residual)`` as the serial module does: ``y`` is this rank's
    tile of the output grid, ``residual`` the input tile in float32 (or, where
    the two transforms' grids differ, the input carried to the output grid
    through the transforms).
    """

    def __init__(self, serial, *, process_grid=None):
        super().__init__()
        forward, inverse = serial.forward_transform, serial.inverse_transform
        for name, transform in (("forward_transform", forward), ("inverse_transform", inverse)):
            if not hasattr(transform, "l_shapes"):
                raise TypeError(f"DistributedSpectralFilter: its {name} must be a distributed transform "
                                f"(mpisphere.torch_harmonics), got {type(transform).__name__}")
        self.forward_transform, self.inverse_transform = forward, inverse
        self.process_grid = forward.process_grid if process_grid is None else process_grid
        self.modes_lat, self.modes_lon = serial.modes_lat, serial.modes_lon
        self.scale_residual, self.operator_type = serial.scale_residual, serial.operator_type
        self.contract_func = serial.contract_func
        if self.operator_type == "block-diagonal" and self.process_grid.nazimuth > 1:
            raise ValueError("DistributedSpectralFilter: operator_type='block-diagonal' mixes the orders m, which "
                             f"lie on the {self.process_grid.nazimuth} azimuth ranks; use 'driscoll-healy' or "
                             "'diagonal', or a grid without an azimuth split")
        self.weight = torch.nn.Parameter(serial.weight.detach().clone())
        if hasattr(serial, "bias"):
            self.bias = torch.nn.Parameter(serial.bias.detach().clone())
        pg = self.process_grid
        l0 = _start(inverse.l_shapes, pg.polar_rank)
        m0 = _start(inverse.m_shapes, pg.azimuth.rank)
        degrees = slice(l0, l0 + inverse.lmax_local)
        orders = slice(m0, m0 + inverse.mmax_local)
        self._block = {"driscoll-healy": (Ellipsis, degrees), "diagonal": (Ellipsis, degrees, orders),
                       "block-diagonal": (Ellipsis, degrees, slice(None), slice(None))}[self.operator_type]

    def extra_repr(self):
        return f"modes=({self.modes_lat}, {self.modes_lon}), operator_type={self.operator_type!r}"

    def forward(self, x):
        """``(B, C_in, h, w)`` tile -> ``(B, C_out, h', w')`` tile and the residual (see the class)."""
        dtype = x.dtype
        x = x.float()
        residual = x
        x = self.forward_transform(x)
        if self.scale_residual:
            residual = self.inverse_transform(x)
        x = torch.einsum(self.contract_func, x, self.weight[self._block])
        x = self.inverse_transform(x)
        if hasattr(self, "bias"):
            x = x + self.bias
        return x.type(dtype), residual
