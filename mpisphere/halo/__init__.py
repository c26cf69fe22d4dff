"""Halo (ghost-cell) exchange on the process grid and its adjoint.

:mod:`.exchange` holds :class:`~mpisphere.HaloExchange` and :class:`~mpisphere.HaloReduce` (with
the neighbour agreement in their messages); :mod:`.pattern` what a call
moves (widths, neighbours, the moves of each phase), :mod:`.poles` what lies
past the poles (one boundary class each), :mod:`.plan` the message path
(packed buffers, persistent sends, copies by runs), :mod:`.shared` the
tiles in memory shared on the node. The halo widths a localized operator
needs come from :mod:`mpisphere.geometry`.
"""

from .exchange import HaloExchange, HaloReduce

__all__ = ["HaloExchange", "HaloReduce"]
