"""Associated Legendre functions on given colatitudes, by a stable recurrence.

Values follow torch-harmonics' ``legpoly`` convention: for
``norm="ortho"``, ``P(l, m, theta)`` is the orthonormal function for which
``P(l, m, theta) * exp(i m phi)`` has unit norm on the sphere, i.e.
``2 pi * integral P(l, m)^2 d(cos theta) = 1``. ``"four-pi"`` multiplies the
forward table by ``sqrt(4 pi)`` (and divides the inverse one), ``"schmidt"``
does that and divides the forward table by ``sqrt(2l + 1)`` (multiplying the
inverse one). ``csphase=True`` includes the Condon-Shortley phase
``(-1)^m``, as ``scipy.special`` does.

The recurrence runs in degree ``l`` for all requested orders ``m`` at once,
from the diagonal ``P(m, m) ~ sin(theta)^m``. Near the poles and at high
order that diagonal underflows long before the functions grow back to
representable values, so each value is carried as a mantissa and a power of
two: the diagonal starts from its logarithm and the mantissas are rescaled
whenever they grow large. The result is accurate to rounding wherever the
true value is representable, at any degree (tested to ``lmax`` 3000).

``divide_by_sin=True`` gives ``P(l, m, theta) / sin(theta)`` for ``m >= 1``:
the same recurrence in ``l`` from the diagonal ``sin(theta)^(m - 1)``, finite
at the poles (the vector transforms need it).

No operation here forms an infinity or a NaN, even at the poles, so the
tables can be built in processes that trap floating-point exceptions
(``-ffpe-trap=invalid,zero,overflow``); only underflow to zero happens.
"""

import math

import numpy

from .validation import check_choice

__all__ = ["NORMS", "associated_legendre", "degree_factors"]

NORMS = ("ortho", "schmidt", "four-pi")

# mantissas above 2**_RESCALE_AT are scaled down by 2**_RESCALE_BY every few degrees
_RESCALE_AT = 400
_RESCALE_BY = 600
_CHECK_EVERY = 16


def _check_norm(norm):
    check_choice(norm, NORMS, "norm")


def degree_factors(lmax, norm, inverse):
    """Per-degree factor that turns the orthonormal functions into ``norm``'s.

    Returns
    -------
    ndarray, shape ``(lmax,)``
    """
    _check_norm(norm)
    l = numpy.arange(lmax, dtype=numpy.float64)
    if norm == "ortho":
        return numpy.ones(lmax)
    factor = numpy.full(lmax, math.sqrt(4.0 * math.pi))
    if norm == "schmidt":
        factor /= numpy.sqrt(2.0 * l + 1.0)
    return 1.0 / factor if inverse else factor


def _safe_ratio(numerator, denominator, where):
    """``numerator / denominator`` where ``where`` holds, 0 elsewhere; never divides by zero."""
    out = numpy.zeros(numpy.broadcast(numerator, denominator).shape)
    numpy.divide(numerator, denominator, out=out, where=where)
    return out


def associated_legendre(lmax, orders, theta, norm="ortho", csphase=True, inverse=False, divide_by_sin=False):
    """Associated Legendre functions ``P(l, m, theta)`` for ``l < lmax``.

    Parameters
    ----------
    lmax : int
        Number of degrees (``l = 0 .. lmax - 1``).
    orders : sequence of int
        The orders ``m`` to compute (any subset, e.g. one rank's own orders).
    theta : array_like, shape ``(n,)``
        Colatitudes in radians, in ``[0, pi]``.
    norm : {"ortho", "schmidt", "four-pi"}
    csphase : bool
        Include the Condon-Shortley phase ``(-1)^m``.
    inverse : bool
        Table for the inverse transform (``"schmidt"``/``"four-pi"`` factors
        inverted, see :func:`degree_factors`).
    divide_by_sin : bool
        Return ``P(l, m, theta) / sin(theta)`` instead (every order must be
        at least 1; the limit at the poles is returned there).

    Returns
    -------
    ndarray, shape ``(len(orders), lmax, n)``, float64
        Zero where ``l < m``.
    """
    _check_norm(norm)
    orders = numpy.asarray(orders, dtype=numpy.int64).reshape(-1)
    theta = numpy.asarray(theta, dtype=numpy.float64).reshape(-1)
    if numpy.any(orders < 0):
        raise ValueError("associated_legendre: orders must be non-negative")
    if divide_by_sin and numpy.any(orders < 1):
        raise ValueError("associated_legendre: P(l, 0) / sin(theta) is infinite at the poles; "
                         "divide_by_sin needs orders >= 1")
    out = numpy.zeros((len(orders), lmax, len(theta)))
    if len(orders) == 0 or lmax == 0:
        return out
    x = numpy.cos(theta)
    sin = numpy.abs(numpy.sin(theta))  # sin(theta) itself: 1 - cos^2 loses digits near the poles
    m = orders.astype(numpy.float64)[:, None]

    # log2 of the diagonal P(m, m) = sqrt(1/(4 pi)) prod_k sqrt((2k+1)/(2k)) sin^m (sin^(m-1) when divided)
    k = numpy.arange(1, int(orders.max()) + 1, dtype=numpy.float64)
    log_gain = numpy.concatenate([[0.0], numpy.cumsum(0.5 * numpy.log2((2 * k + 1) / (2 * k)))])
    power = m - (1.0 if divide_by_sin else 0.0)
    positive = sin > 0
    log_sin = numpy.zeros_like(sin)
    numpy.log2(sin, out=log_sin, where=positive)
    zero_diag = (~positive)[None, :] & (power > 0)  # sin = 0 and a positive power: the diagonal vanishes
    log_diag = -0.5 * math.log2(4 * math.pi) + log_gain[orders][:, None] + power * log_sin[None, :]
    exponent = numpy.floor(log_diag)
    diag = numpy.where(zero_diag, 0.0, numpy.exp2(log_diag - exponent))

    first = int(orders.min())
    p_prev = numpy.zeros((len(orders), len(theta)))  # mantissas of P(l-2, m)
    p_curr = numpy.zeros_like(p_prev)                # mantissas of P(l-1, m)
    for l in range(first, lmax):
        lf = float(l)
        below = m < lf          # the three-term recurrence applies (at l = m + 1, b = 0 and a = sqrt(2m + 3))
        deeper = m < lf - 1.0   # ... and reaches two degrees back
        a = numpy.sqrt(_safe_ratio((2 * lf - 1) * (2 * lf + 1), (lf - m) * (lf + m), below))
        b = numpy.sqrt(_safe_ratio(numpy.where(deeper, (lf + m - 1) * (lf - m - 1) * (2 * lf + 1), 0.0),
                                   (lf - m) * (lf + m) * (2 * lf - 3), deeper))
        p_next = a * x * p_curr - b * p_prev
        p_next = numpy.where(m == lf, diag, p_next)  # start of each order's column
        p_prev, p_curr = p_curr, p_next
        if (l - first) % _CHECK_EVERY == 0:
            big = numpy.abs(p_curr) > 2.0 ** _RESCALE_AT
            if big.any():
                p_curr = numpy.where(big, numpy.ldexp(p_curr, -_RESCALE_BY), p_curr)
                p_prev = numpy.where(big, numpy.ldexp(p_prev, -_RESCALE_BY), p_prev)
                exponent = numpy.where(big, exponent + _RESCALE_BY, exponent)
        out[:, l, :] = numpy.ldexp(p_curr, exponent.astype(numpy.int64))

    if csphase:
        out[orders % 2 == 1] *= -1.0
    out *= degree_factors(lmax, norm, inverse)[None, :, None]
    return out
