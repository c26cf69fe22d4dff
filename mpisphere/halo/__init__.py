"""Halo (ghost-cell) exchange on the process grid and its adjoint.

:mod:`.exchange` holds :class:`~mpisphere.HaloExchange` and
:mod:`.reduce` :class:`~mpisphere.HaloReduce`; :mod:`mpisphere.halo.call` runs one call
(the neighbour agreement in its messages, its phases); :mod:`.pattern`
what a call moves (widths, neighbours, the moves of each phase),
:mod:`.poles` what lies past the poles (one boundary class each),
:mod:`.plan` the message path (packed buffers, persistent sends, copies by
runs), :mod:`.shared` the tiles in memory shared on the node. The halo widths a localized operator
needs come from :mod:`mpisphere.geometry`.
"""

from .exchange import HaloExchange
from .reduce import HaloReduce

__all__ = ["HaloExchange", "HaloReduce"]
