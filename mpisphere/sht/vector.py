"""The distributed vector transforms: the scalar Legendre kernel on both components, then a degree coupling.

``DistributedRealVectorSHT`` maps this rank's tile of tangent vector fields
``(..., 2, h, w)`` to its block of the two coefficient components ``(...,
2, l_loc, m_loc)``; ``DistributedInverseRealVectorSHT`` maps back. Values as
torch-harmonics 0.9's ``RealVectorSHT``/``InverseRealVectorSHT``; every
other argument and the Legendre strategies as for the scalar transforms
(:mod:`mpisphere.sht.transforms`).

What the slots hold, read two ways (one transform):

* fed a wind ``(u, v)``, eastward and northward, as torch-harmonics'
  shallow-water example and :mod:`mpisphere.calculus` feed it: slot 0 is
  the rotational part (times ``l (l + 1) / radius`` it is the vorticity),
  slot 1 the divergent part (the divergence likewise);
* fed the (colatitude, longitude) components ``(-v, u)``, as
  torch-harmonics' docstring reads it: slot 0 is the spheroidal
  (divergent) part, slot 1 the toroidal (rotational) part.

``tests/test_vector_sht.py`` pins both with a solid-body rotation and the
gradient of a scalar.
"""

import functools

import numpy

from ..legendre import degree_factors
from .coupling import VectorCoupling
from .tables import first_degrees
from .transforms import Transform

__all__ = ["DistributedRealVectorSHT", "DistributedInverseRealVectorSHT"]


def _epsilon(l, m):
    """``sqrt((l^2 - m^2) / (4 l^2 - 1))`` for ``l > m``, 0 otherwise (orthonormal recurrence coefficients)."""
    l, m = numpy.broadcast_arrays(numpy.asarray(l, dtype=float), numpy.asarray(m, dtype=float))
    out = numpy.zeros(l.shape)
    above = l > m
    out[above] = numpy.sqrt((l[above] ** 2 - m[above] ** 2) / (4.0 * l[above] ** 2 - 1.0))
    return out


class _VectorTransform(Transform):
    """A vector transform: the scalar Legendre kernel on both components, then a degree coupling.

    The derivatives torch-harmonics' vector transforms use are combinations
    of ``Q(l) = P(l, m) / sin(theta)`` (orthonormal, ``m >= 1``) at
    neighbouring degrees::

        d P(l, m) / d theta = l eps(l+1, m) Q(l+1) - (l+1) eps(l, m) Q(l-1)
        m P(l, m) / sin(theta) = m Q(l)

    with ``eps(l, m) = sqrt((l^2 - m^2) / (4 l^2 - 1))``; for ``m = 0``,
    ``d P(l, 0) / d theta = -sqrt(l (l + 1)) P(l, 1)``. So both components are
    contracted with one table of ``Q`` (``P(l, 1)`` for ``m = 0``) up to
    degree ``lmax``, and the degree coupling (:class:`VectorCoupling`)
    applies the recurrence, the norm's degree factors ``f(l)`` and, in the
    analysis, torch-harmonics' ``1 / (l (l + 1))``. The Legendre work is two
    scalar transforms' worth, not four.
    """

    _components = 2

    _tables_kind = "vector"

    @functools.cached_property
    def _coupling(self):
        """The degree coupling of this transform, built once and shared by its pipelines."""
        m = self.local_orders[None, :].astype(float)
        analysis = self._table_kind == "analysis"
        if analysis:  # S_l from A_{l+1}, A_{l-1}, A_l, B_l for l < lmax
            l = numpy.arange(self.lmax, dtype=float)[:, None]
            f = degree_factors(self.lmax, self.norm, inverse=False)[:, None]
            nf = numpy.ones_like(l)
            nf[1:] = 1.0 / (l[1:] * (l[1:] + 1.0))
            scale = nf * f
            alpha = scale * l * _epsilon(l + 1, m)
            beta = -scale * (l + 1) * _epsilon(l, m)
            g = -scale * m
            delta = numpy.where(m == 0, -scale * numpy.sqrt(l * (l + 1)), 0.0)
            lin = self.lmax + 1
        else:  # S'_j from S_{j-1}, S_{j+1}, S_j, T_j for j <= lmax
            j = numpy.arange(self.lmax + 1, dtype=float)[:, None]
            f = numpy.zeros((self.lmax + 2, 1))
            f[:self.lmax] = degree_factors(self.lmax, self.norm, inverse=True)[:, None]
            f_at = f[:self.lmax + 1]
            f_below = numpy.vstack([[[0.0]], f[:self.lmax]])  # f(j - 1), zero at j = 0
            f_above = f[1:self.lmax + 2]                      # f(j + 1), zero beyond lmax - 1
            alpha = -(j + 2) * _epsilon(j + 1, m) * f_above
            beta = (j - 1) * _epsilon(j, m) * f_below
            g = m * f_at
            delta = numpy.where(m == 0, -f_at * numpy.sqrt(j * (j + 1)), 0.0)
            lin = self.lmax
        zero_order = m[0] == 0
        alpha, beta, g = (numpy.where(zero_order, 0.0, c) for c in (alpha, beta, g))
        alpha, beta, delta, g = numpy.broadcast_arrays(alpha, beta, delta, g)
        return VectorCoupling(alpha, beta, delta, g, lin, self.cdtype, self._layout,
                              first_degrees(self.local_orders, vector=True))

    def _degree_stages(self):
        return [self._coupling]


class DistributedRealVectorSHT(_VectorTransform):
    """Forward real vector SHT of distributed tiles of tangent vector fields.

    Parameters
    ----------
    grid : ProcessGrid
    nlat, nlon : int
    lmax, mmax : int, optional
        Resolved by :func:`~mpisphere.truncate_sht`.
    quadrature, norm, csphase, dtype, contraction, orders, fft
        As for :class:`DistributedRealSHT` (the same signature).

    Notes
    -----
    ``forward``: ``(..., 2, h, w)`` real (this rank's tile of both
    components) -> ``(..., 2, l_loc, m_loc)`` complex (the two coefficient
    components of torch-harmonics' ``RealVectorSHT``, in its order): fed
    ``(u, v)`` (eastward, northward), slot 0 is the rotational part and slot
    1 the divergent part; fed the (colatitude, longitude) components ``(-v,
    u)``, slot 0 is spheroidal and slot 1 toroidal (see the module).
    ``adjoint``: the exact adjoint. The two components are never split over
    ranks.
    """

    _table_kind = "analysis"


class DistributedInverseRealVectorSHT(_VectorTransform):
    """Inverse real vector SHT: coefficient blocks ``(..., 2, l_loc, m_loc)`` to tiles ``(..., 2, h, w)``.

    Same parameters as :class:`DistributedRealVectorSHT`; values as
    torch-harmonics' ``InverseRealVectorSHT``.
    """

    _synthesis = True
    _table_kind = "synthesis"
