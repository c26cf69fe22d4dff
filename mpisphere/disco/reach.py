"""How far a DISCO convolution reaches across the polar ranks: the widest ``theta_cutoff`` a split serves.

The rows within the cutoff come through the polar halo from the
neighbouring polar ranks only (``mpisphere.geometry.polar_halo_radius``);
these functions find the widest cutoff whose rows they hold. Local: every
rank computes the same from the split.
"""

import math

from ..geometry import polar_halo_radius
from ..quadrature import latitudes
from ..validation import check_int
from .psi import effective_cutoff

__all__ = ["widest_theta_cutoff", "widest_cutoff", "shape_pair"]


def shape_pair(value, what, who):
    """``value`` as a pair ``(nlat, nlon)`` of positive ints; a ValueError naming ``what`` otherwise."""
    try:
        a, b = value
        return check_int(a, what, who, minimum=1), check_int(b, what, who, minimum=1)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {what} must be a pair (nlat, nlon) of positive integers, got {value!r}") from None


def widest_theta_cutoff(grid, in_shape, out_shape, quadrature_in="equiangular", quadrature_out="equiangular"):
    """The widest ``theta_cutoff`` (radians) a DISCO convolution from ``in_shape`` to ``out_shape`` serves on ``grid``.

    The rows within the cutoff come through the polar halo from the
    neighbouring polar ranks only; this is the widest cutoff whose rows they
    hold (``pi``, the whole sphere, on one polar rank), rounded down to six
    decimals, so the value returned is served. Local: every rank computes
    the same from the split. The transposed convolution reads the same rows:
    pass its ``in_shape`` and ``out_shape`` as given to it.

    Parameters
    ----------
    grid : ProcessGrid
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the input and output grids.
    quadrature_in, quadrature_out : str
        Their latitude rules (torch-harmonics' ``grid_in``, ``grid_out``).

    Returns
    -------
    float
    """
    who = "widest_theta_cutoff"
    (nlat_in, _), (nlat_out, _) = shape_pair(in_shape, "in_shape", who), shape_pair(out_shape, "out_shape", who)
    theta_in, _ = latitudes(nlat_in, quadrature_in)
    theta_out, _ = latitudes(nlat_out, quadrature_out)
    return widest_cutoff(grid, theta_in, theta_out, math.pi)


def widest_cutoff(grid, theta_in, theta_out, cutoff):
    """The widest cutoff (radians) up to ``cutoff`` whose halo reaches no further than the neighbouring polar ranks."""
    try:
        polar_halo_radius(grid, theta_in, theta_out, effective_cutoff(cutoff))
        return cutoff  # served whole (one polar rank: every latitude is this rank's)
    except ValueError:
        pass
    lo, hi = 0.0, cutoff
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        try:
            polar_halo_radius(grid, theta_in, theta_out, effective_cutoff(mid))
            lo = mid
        except ValueError:
            hi = mid
    return math.floor(lo * 1e6) / 1e6   # printed with 6 decimals: rounded down, so the value named is served
