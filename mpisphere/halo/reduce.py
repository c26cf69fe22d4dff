"""``HaloReduce``: the adjoint of the halo exchange as an operator of its own."""

from ..operators import AdjointOperator
from .exchange import HaloExchange

__all__ = ["HaloReduce"]


class HaloReduce(AdjointOperator):
    """The adjoint of :class:`HaloExchange` as an operator of its own.

    ``forward``: ``(..., h + 2*rows, w + 2*cols)`` -> ``(..., h, w)``, the
    interior plus the halo contributions the neighbours hold for this rank's
    cells (what a scatter-shaped stencil writes across tile borders).
    ``adjoint``: the halo exchange. Same parameters as
    :class:`HaloExchange` (construction is collective over ``grid.cart``);
    ``.H`` is that exchange.
    """

    def __init__(self, grid, rows, cols=0, *, extents=None, poles="zero", signs=None, quadrature=None):
        super().__init__(_NamedHaloExchange(grid, rows, cols, extents=extents, poles=poles, signs=signs,
                                            quadrature=quadrature))

    @property
    def name(self):
        return "HaloReduce"

    @property
    def needs_own_agreement(self):
        return self.op.needs_own_agreement


class _NamedHaloExchange(HaloExchange):
    """The exchange inside a :class:`HaloReduce`: its construction errors say HaloReduce."""

    _label = "HaloReduce"

    @property
    def name(self):
        return "HaloExchange"
