"""Spectral calculus on coefficient blocks: Laplacian, vorticity and divergence, winds, gradients, filters.

Each function returns a :class:`~mpisphere.LinearOperator` (with its
adjoint) built for the blocks of a given transform: the operators that act
on coefficients are diagonal in ``(l, m)`` and need no communication (each
rank scales its own block, whose global degrees the transform knows:
``transform.local_degrees``); those that reach grid space are compositions
with the transforms. ``radius`` is the sphere's radius (1 for the unit
sphere; 6.37122e6 m for the Earth).

Conventions follow torch-harmonics' shallow-water solver: winds are
``(u, v)`` (eastward, northward) fields ``(..., 2, h, w)`` handed to the
vector transforms as they are, and

* ``uv_to_vrtdiv(vsht, r)(uv) = -l (l + 1) / r * vsht(uv)``: coefficients
  ``(..., 2, l, m)`` of the vorticity (component 0) and divergence
  (component 1);
* ``vrtdiv_to_uv(ivsht, r)(vrtdiv) = ivsht(-r / (l (l + 1)) * vrtdiv)``.

The inverse Laplacian sets the ``l = 0`` coefficient to zero (the global mean
is not determined by a Laplacian): it is the inverse on the fields of zero
mean, and the pseudo-inverse (still its own adjoint) on all.

Building any of these operators is collective over the transform's grid: the
ranks agree once on what they were built from (the transform, the factors
per degree, which carry ``radius``, ``dt`` and the other parameters by
value), so a parameter given differently on one rank raises on every rank
instead of scaling one rank's block differently.
"""

import numpy

from .. import dtypes
from ..agreement import Call, agree_construction
from ..operators import FORWARD, Diagonal, InputError, LinearOperator

__all__ = [
    "laplacian",
    "inverse_laplacian",
    "spectral_filter",
    "hyperdiffusion",
    "truncation",
    "uv_to_vrtdiv",
    "vrtdiv_to_uv",
    "gradient",
    "DegreeDiagonal",
]


def _degrees(transform):
    """``l`` of each entry of this rank's block, shape ``(l_loc, 1)`` (broadcasts over the orders)."""
    return transform.local_degrees.astype(float)[:, None]


class DegreeDiagonal(Diagonal):
    """Each coefficient ``c(l, m)`` of a transform's blocks times a real factor of its degree, ``factors[l]``.

    Parameters
    ----------
    transform : a distributed transform
        Whose coefficient blocks (``transform.block_shape``, order layout
        included) the operator acts on.
    factors_by_degree : array_like, shape ``(lmax,)``
        Real factors, one per global degree.

    Notes
    -----
    ``forward = adjoint``: ``(..., l_loc, m_loc) -> (..., l_loc, m_loc)``,
    no communication when called. Construction is collective over the
    transform's grid: the ranks agree on the transform and the factors (by
    value), once.
    """

    def __init__(self, transform, factors_by_degree):
        agree_construction(self, transform.grid.cart)
        factors = numpy.asarray(factors_by_degree, dtype=float)
        if factors.shape != (transform.lmax,):
            raise ValueError(f"expected one factor per degree, shape ({transform.lmax},), got {factors.shape}")
        weights = numpy.broadcast_to(factors[transform.local_degrees][:, None], transform.block_shape).copy()
        super().__init__(weights.astype(dtypes.real_of(transform.cdtype)), transform.spectral_layout)
        self.factors = factors
        # a point of the domain: the transform's coefficient block, both components of a vector transform's
        self._core = transform._core("spectral")

    def _shapes(self, lead):
        return lead + self._core, lead + self._core


def _block_diagonal(transform, factors_by_degree):
    """A :class:`DegreeDiagonal` on this rank's blocks from real factors per global degree (shape ``(lmax,)``)."""
    return DegreeDiagonal(transform, factors_by_degree)


def _by_degree(transform, fn):
    l = numpy.arange(transform.lmax, dtype=float)
    return fn(l)


def _checked_factors(transform, who, fn, **parameters):
    """``fn(l)`` for the degrees of ``transform``, its parameters checked on every rank first. Collective.

    ``parameters``: ``name=(value, minimum, strict)``; each must be a
    finite real number above (``strict``) or at ``minimum``. A bad one on
    any rank, or factors that overflow or are not finite, raise on every
    rank naming it (a check on one rank alone would leave the others
    waiting in the operator's construction).
    """
    call = Call(transform.grid.cart, who)
    factors = None
    with call.local():
        for name, (value, minimum, strict) in parameters.items():
            number = float(value) if isinstance(value, (int, float, numpy.integer, numpy.floating)) and \
                not isinstance(value, bool) else None
            if number is None or not numpy.isfinite(number) or number < minimum or (strict and number == minimum):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {minimum:g}, got "
                                 f"{value!r}")
        with numpy.errstate(over="raise", invalid="raise", divide="raise"):
            try:
                factors = _by_degree(transform, fn)
            except (FloatingPointError, OverflowError, ZeroDivisionError) as exc:
                shown = ", ".join(f"{name}={value!r}" for name, (value, _, _) in parameters.items())
                raise ValueError(f"{shown}: the factors are not finite ({exc})") from None
    call.agree()
    return factors


def _square(radius):
    """``radius ** 2``, refused (FloatingPointError) where it overflows or underflows to zero."""
    square = numpy.square(numpy.float64(radius))
    if not 0.0 < square < numpy.inf:
        raise FloatingPointError(f"radius ** 2 is {square}")
    return square


def laplacian(transform, radius=1.0):
    """``c(l, m) -> -l (l + 1) / radius^2 c(l, m)`` on the blocks of ``transform``'s coefficients.

    ``radius`` must be a positive finite number whose square is finite;
    anything else raises a ValueError on every rank.
    """
    return _block_diagonal(transform, _checked_factors(
        transform, "laplacian", lambda l: -l * (l + 1) / _square(radius),
        radius=(radius, 0.0, True)))


def inverse_laplacian(transform, radius=1.0):
    """``c(l, m) -> -radius^2 / (l (l + 1)) c(l, m)``, and 0 at ``l = 0`` (see the module notes)."""
    def factors(l):
        out = numpy.zeros_like(l)
        out[1:] = -_square(radius) / (l[1:] * (l[1:] + 1))
        return out
    return _block_diagonal(transform, _checked_factors(transform, "inverse_laplacian", factors,
                                                       radius=(radius, 0.0, True)))


def spectral_filter(transform, factors_by_degree):
    """Multiply each degree ``l`` by ``factors_by_degree[l]`` (a real array of ``lmax`` factors)."""
    return _block_diagonal(transform, factors_by_degree)


def hyperdiffusion(transform, dt, efolding=3600.0, order=4):
    """torch-harmonics' implicit hyperdiffusion: ``exp(-dt / (2 efolding) (l (l + 1) / (L (L + 1)))^order)``.

    ``L = lmax - 1``, the highest degree: it is damped by ``exp(-dt / (2 efolding))`` per step. ``dt`` must
    be finite and non-negative, ``efolding`` positive and ``order`` non-negative (a ValueError on every
    rank otherwise).
    """
    top = max((transform.lmax - 1) * transform.lmax, 1)
    return _block_diagonal(transform, _checked_factors(
        transform, "hyperdiffusion", lambda l: numpy.exp(-float(dt) / 2.0 / float(efolding) *
                                                         (l * (l + 1) / top) ** float(order)),
        dt=(dt, 0.0, False), efolding=(efolding, 0.0, True), order=(order, 0.0, False)))


def truncation(transform, lmax):
    """Keep the degrees below ``lmax``, zero the others (a projection: its own adjoint)."""
    return _block_diagonal(transform, _by_degree(transform, lambda l: (l < lmax).astype(float)))


def uv_to_vrtdiv(vector_sht, radius=1.0):
    """Winds ``(u, v)`` ``(..., 2, h, w)`` -> coefficients of vorticity and divergence ``(..., 2, l, m)``.

    ``u`` eastward and ``v`` northward, in that order (torch-harmonics'
    shallow-water example's ``vrtdivspec``); slot 0 of the result is the
    vorticity, slot 1 the divergence.
    """
    return laplacian(vector_sht, radius) * radius @ vector_sht


def vrtdiv_to_uv(inverse_vector_sht, radius=1.0):
    """Coefficients of vorticity and divergence ``(..., 2, l, m)`` -> winds ``(u, v)`` ``(..., 2, h, w)``.

    The inverse of :func:`uv_to_vrtdiv` (zero at ``l = 0``): ``u`` eastward,
    ``v`` northward.
    """
    return inverse_vector_sht @ (inverse_laplacian(inverse_vector_sht, radius) * (1.0 / radius))


class _IntoComponent(LinearOperator):
    """``(..., l, m) -> (..., 2, l, m)``: ``scale`` times the input in component ``index``, zeros in the other."""

    def __init__(self, transform, index, scale):
        agree_construction(self, transform.grid.cart, who="gradient")
        self.domain = self.range = transform.spectral_layout
        self.index, self.scale = index, scale
        self.block = tuple(transform.block_shape)

    def _output(self, direction, spec):
        if direction == FORWARD:
            if spec.shape[-2:] != self.block:
                raise InputError(f"expected a coefficient block of {self.block}, got shape {spec.shape}")
            return spec.but(shape=spec.shape[:-2] + (2,) + self.block), spec.describe()
        if spec.shape[-3:] != (2,) + self.block:
            raise InputError(f"expected a vector block of {(2,) + self.block}, got shape {spec.shape}")
        return spec.but(shape=spec.shape[:-3] + self.block), spec.describe()

    def _run(self, direction, x, out, context):
        if direction == FORWARD:
            out[..., 1 - self.index, :, :] = 0
            numpy.multiply(x, self.scale, out=out[..., self.index, :, :])
        else:
            numpy.multiply(x[..., self.index, :, :], self.scale, out=out)

    def _shapes(self, lead):
        return lead + self.block, lead + (2,) + self.block


def gradient(inverse_vector_sht, radius=1.0):
    """Coefficients of a scalar ``psi`` ``(..., l, m)`` -> its gradient ``(u, v)`` on the grid ``(..., 2, h, w)``.

    The gradient has no vorticity and the divergence ``lap(psi)``, so it is
    ``vrtdiv_to_uv([0, lap(psi)]) = ivsht([0, psi / radius])``.
    """
    return inverse_vector_sht @ _IntoComponent(inverse_vector_sht, 1, 1.0 / radius)

