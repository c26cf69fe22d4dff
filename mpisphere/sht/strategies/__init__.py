"""The Legendre strategies: each one registered record in a file of its own (see :mod:`.base`).

======================  =========================================================
strategy                exchange, tables, kernels
======================  =========================================================
``"transpose"``         polar transposes; parity-split tables at every latitude
``"reduce-scatter"``    a polar Reduce_scatter; tables of a rank's own latitudes
``"table-free"``        a polar Reduce_scatter; ducc0's recurrence, no tables
======================  =========================================================

``STRATEGIES`` is the registry (a tuple: nothing registers at run time);
``strategy`` finds a record by name. :mod:`.machine` holds the rates the
cost model is calibrated with.
"""

from .base import LegendreStrategy
from .machine import MachineModel
from .reduce_scatter import REDUCE_SCATTER
from .table_free import TABLE_FREE
from .transpose import TRANSPOSE

__all__ = ["STRATEGIES", "NAMES", "strategy", "LegendreStrategy", "MachineModel"]

STRATEGIES = (TRANSPOSE, REDUCE_SCATTER, TABLE_FREE)
"""Every Legendre strategy, in the order ``auto`` prefers them when their modelled times tie."""

NAMES = tuple(s.name for s in STRATEGIES)


def strategy(name):
    """The registered :class:`LegendreStrategy` called ``name``; a ``ValueError`` listing the names otherwise."""
    for record in STRATEGIES:
        if record.name == name:
            return record
    raise ValueError(f"no Legendre strategy {name!r}; the strategies are {', '.join(map(repr, NAMES))}")
