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
true value is representable, at any degree (tested to ``lmax`` 1024 and
beyond).
"""

import math

import numpy

__all__ = ["NORMS", "associated_legendre", "degree_factors"]

NORMS = ("ortho", "schmidt", "four-pi")

# mantissas above 2**_RESCALE_AT are scaled down by 2**_RESCALE_BY every few degrees
_RESCALE_AT = 400
_RESCALE_BY = 600
_CHECK_EVERY = 16


def _check_norm(norm):
    if norm not in NORMS:
        raise ValueError(f"unknown normalisation {norm!r}; choose one of {', '.join(NORMS)}")


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


def associated_legendre(lmax, orders, theta, norm="ortho", csphase=True, inverse=False):
    """Associated Legendre functions ``P(l, m, theta)`` for ``l < lmax``.

    Parameters
    ----------
    lmax : int
        Number of degrees (``l = 0 .. lmax - 1``).
    orders : sequence of int
        The orders ``m`` to compute (any subset, e.g. one rank's own orders).
    theta : array_like, shape ``(n,)``
        Colatitudes in radians.
    norm : {"ortho", "schmidt", "four-pi"}
    csphase : bool
        Include the Condon-Shortley phase ``(-1)^m``.
    inverse : bool
        Table for the inverse transform (``"schmidt"``/``"four-pi"`` factors
        inverted, see :func:`degree_factors`).

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
    out = numpy.zeros((len(orders), lmax, len(theta)))
    if len(orders) == 0 or lmax == 0:
        return out
    x = numpy.cos(theta)
    sin = numpy.sin(theta)
    m = orders.astype(numpy.float64)[:, None]

    # log2 of the diagonal P(m, m) = sqrt(1/(4 pi)) prod_k sqrt((2k+1)/(2k)) sin^m
    k = numpy.arange(1, int(orders.max()) + 1, dtype=numpy.float64)
    log_gain = numpy.concatenate([[0.0], numpy.cumsum(0.5 * numpy.log2((2 * k + 1) / (2 * k)))])
    with numpy.errstate(divide="ignore", invalid="ignore"):
        log_sin = numpy.log2(sin)
        sin_power = numpy.where(m == 0, 0.0, m * log_sin[None, :])  # sin^0 = 1, also at the poles
    log_diag = -0.5 * math.log2(4 * math.pi) + log_gain[orders][:, None] + sin_power
    zero_diag = ~numpy.isfinite(log_diag)  # sin(theta) = 0 and m > 0: P(m, m) = 0
    log_diag = numpy.where(zero_diag, 0.0, log_diag)
    exponent = numpy.floor(log_diag)
    diag = numpy.where(zero_diag, 0.0, numpy.exp2(log_diag - exponent))

    p_prev = numpy.zeros((len(orders), len(theta)))  # mantissas of P(l-2, m)
    p_curr = numpy.zeros_like(p_prev)                # mantissas of P(l-1, m)
    for l in range(int(orders.min()), lmax):
        lf = float(l)
        with numpy.errstate(divide="ignore", invalid="ignore"):
            a = numpy.sqrt((2 * lf - 1) * (2 * lf + 1) / ((lf - m) * (lf + m)))
            b = numpy.sqrt((lf + m - 1) * (lf - m - 1) * (2 * lf + 1) / ((lf - m) * (lf + m) * (2 * lf - 3)))
        below = m < lf  # the three-term recurrence (at l = m + 1, b = 0 and a = sqrt(2m + 3))
        a = numpy.where(below, a, 0.0)
        b = numpy.where(below & (m < lf - 1), b, 0.0)
        p_next = a * x * p_curr - b * p_prev
        p_next = numpy.where(m == lf, diag, p_next)  # start of each order's column
        p_prev, p_curr = p_curr, p_next
        if (l - int(orders.min())) % _CHECK_EVERY == 0:
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
