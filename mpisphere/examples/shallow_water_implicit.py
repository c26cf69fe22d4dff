"""The semi-implicit scheme's linear part: gravity waves about a resting depth, solved per degree.

``L (phi, zeta, delta) = (-depth delta, 0, eigen phi)`` with ``depth = g H``
the reference geopotential and ``eigen = l (l + 1) / radius^2``, so
``(I - tau L)`` is a 2 x 2 system per coefficient with the determinant ``1
+ tau^2 depth eigen``; its inverse and the adjoints are written out.
"""

import numpy

from . import time_stepping

__all__ = ["gravity_waves"]


def gravity_waves(depth, eigen):
    """The ``ImplicitPart`` of the gravity waves on the state's block ``(..., 3, l_loc, m_loc)``.

    Parameters
    ----------
    depth : float
        ``gravity * reference_depth`` (m^2/s^2).
    eigen : ndarray, shape ``(l_loc, m_loc)``
        ``l (l + 1) / radius^2`` on the block (minus the Laplacian's weights).
    """

    def apply(x):  # L x
        out = numpy.zeros_like(x)
        out[..., 0, :, :] = -depth * x[..., 2, :, :]
        out[..., 2, :, :] = eigen * x[..., 0, :, :]
        return out

    def apply_adjoint(x):
        out = numpy.zeros_like(x)
        out[..., 0, :, :] = eigen * x[..., 2, :, :]
        out[..., 2, :, :] = -depth * x[..., 0, :, :]
        return out

    determinants = {}  # tau -> 1 + tau^2 depth eigen per coefficient: two taus (dt and dt/2), made once each

    def determinant(tau):
        if tau not in determinants:
            determinants[tau] = 1.0 + tau * tau * depth * eigen
        return determinants[tau]

    def solve(r, tau):  # (I - tau L)^-1 r
        out = r.copy()
        out[..., 2, :, :] = (r[..., 2, :, :] + tau * eigen * r[..., 0, :, :]) / determinant(tau)
        out[..., 0, :, :] = r[..., 0, :, :] - tau * depth * out[..., 2, :, :]
        return out

    def solve_adjoint(r, tau):  # (I - tau L)^-T r
        out = r.copy()
        out[..., 2, :, :] = (r[..., 2, :, :] - tau * depth * r[..., 0, :, :]) / determinant(tau)
        out[..., 0, :, :] = r[..., 0, :, :] + tau * eigen * out[..., 2, :, :]
        return out

    return time_stepping.ImplicitPart(apply, apply_adjoint, solve, solve_adjoint)
