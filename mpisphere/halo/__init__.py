"""Halo (ghost-cell) exchange on the process grid and its adjoint.

:mod:`.exchange` holds :class:`HaloExchange` and :class:`HaloReduce` (with
the neighbour agreement in their messages), :mod:`.plan` the blocks and
buffers of one padded shape, :mod:`.poles` the rows past the poles. The
halo widths a localized operator needs come from :mod:`mpisphere.geometry`.
"""

from .exchange import HaloExchange, HaloReduce

__all__ = ["HaloExchange", "HaloReduce"]
