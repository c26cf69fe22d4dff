"""Models built only from mpisphere's public API, as torch-harmonics' examples are built from its own.

:class:`ShallowWaterSolver`: a distributed spectral shallow-water model;
:class:`AdamsBashforthHistory` and :class:`LeapfrogHistory`: the memory
of its explicit and semi-implicit schemes, for runs split into calls and
restarts from checkpoints.
"""

from .shallow_water import ShallowWaterSolver
from .time_stepping import AdamsBashforthHistory, LeapfrogHistory

__all__ = ["ShallowWaterSolver", "AdamsBashforthHistory", "LeapfrogHistory"]
