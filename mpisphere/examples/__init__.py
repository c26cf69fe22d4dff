"""Models built only from mpisphere's public API, as torch-harmonics' examples are built from its own.

:class:`ShallowWaterSolver`: a distributed spectral shallow-water model.
"""

from .shallow_water import ShallowWaterSolver

__all__ = ["ShallowWaterSolver"]
