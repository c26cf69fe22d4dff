"""Latitude grids and quadrature weights: one record per rule.

All grids are returned as colatitudes ``theta`` in radians, increasing
(north pole first), with weights for integrals over ``x = cos(theta)`` on
``[-1, 1]`` (they sum to 2), matching the layout of a ``(..., nlat, nlon)``
field:

``equiangular``
    Clenshaw-Curtis: ``theta_j = pi j / (n - 1)``, poles included; exact for
    polynomials in ``x`` of degree ``n - 1`` (``n`` when ``n`` is odd).
``legendre-gauss``
    Gauss-Legendre: the roots of ``P_n``; exact to degree ``2n - 1``.
``lobatto``
    Gauss-Lobatto-Legendre: the poles and the roots of ``P'_{n-1}``; exact to
    degree ``2n - 3``.

Each rule is one ``QuadratureRule`` record in ``RULES`` (nodes and
weights, exact degree, torch-harmonics 0.9's default truncation, aliases,
fewest points); a new rule is one more record. Nothing here communicates;
every rank computes the same numbers.
"""

import dataclasses
from typing import Callable, Tuple

import numpy

from .validation import check_choice, check_int

__all__ = [
    "QuadratureRule",
    "RULES",
    "QUADRATURES",
    "rule",
    "latitudes",
    "exact_degree",
    "default_lmax",
    "truncate_sht",
    "clenshaw_curtis",
    "legendre_gauss",
    "lobatto",
]


def _points(n, minimum, who, rule_name=None):
    n = check_int(n, "the number of latitudes", who)
    if n < minimum:
        what = f"the {rule_name} rule" if rule_name else who
        raise ValueError(f"{who}: {what} needs at least {minimum} latitudes, got {n}")
    return n


def _legendre_pair(n, x):
    """``(P_n(x), P_{n-1}(x))`` by the three-term recurrence (``n >= 1``)."""
    p_prev, p = numpy.ones_like(x), x.copy()
    for k in range(2, n + 1):
        p_prev, p = p, ((2 * k - 1) * x * p - (k - 1) * p_prev) / k
    return p, p_prev


def clenshaw_curtis(n):
    """Equiangular (Clenshaw-Curtis) colatitudes and weights, poles included.

    Parameters
    ----------
    n : int
        Number of latitudes, at least 2.

    Returns
    -------
    theta : ndarray, shape ``(n,)``
        ``pi * j / (n - 1)``.
    weights : ndarray, shape ``(n,)``
        Weights for ``x = cos(theta)``, summing to 2.
    """
    n = _points(n, 2, "clenshaw_curtis")
    order = n - 1
    theta = numpy.pi * numpy.arange(n) / order
    half = order // 2
    k = numpy.arange(1, half + 1)
    b = numpy.where(2 * k == order, 1.0, 2.0)
    series = (b / (4.0 * k * k - 1.0)) @ numpy.cos(2.0 * numpy.outer(k, theta)) if half else numpy.zeros(n)
    c = numpy.full(n, 2.0)
    c[0] = c[-1] = 1.0
    weights = c / order * (1.0 - series)
    weights = 0.5 * (weights + weights[::-1])  # exact symmetry; cos(2k theta) rounds differently at each end
    theta[-1] = numpy.pi
    return theta, weights


def legendre_gauss(n):
    """Gauss-Legendre colatitudes (roots of ``P_n``) and weights.

    Newton's method from Tricomi's asymptotic guesses, all roots at once; the
    roots are symmetrised about the equator so that the grid is exactly
    symmetric.
    """
    n = _points(n, 1, "legendre_gauss")
    k = numpy.arange(n)
    x = numpy.cos(numpy.pi * (k + 0.75) / (n + 0.5))  # descending: north first
    for _ in range(100):
        p, p_prev = _legendre_pair(n, x) if n > 1 else (x.copy(), numpy.ones_like(x))
        dp = n * (x * p - p_prev) / (x * x - 1.0)
        step = p / dp
        x = x - step
        if numpy.max(numpy.abs(step)) < 1e-15:
            break
    x = 0.5 * (x - x[::-1])  # exact symmetry x_k = -x_{n-1-k}
    p, p_prev = _legendre_pair(n, x) if n > 1 else (x.copy(), numpy.ones_like(x))
    dp = n * (x * p - p_prev) / (x * x - 1.0)
    weights = 2.0 / ((1.0 - x * x) * dp * dp)
    return numpy.arccos(x), weights


def lobatto(n):
    """Gauss-Lobatto-Legendre colatitudes (poles and roots of ``P'_{n-1}``) and weights.

    Iterates ``x <- x - (x P_N - P_{N-1}) / ((N + 1) P_N)`` with ``N = n - 1``
    from the Chebyshev-Gauss-Lobatto points (a Newton-type iteration that
    leaves the poles fixed), weights ``2 / (N (N + 1) P_N(x)^2)``.
    """
    n = _points(n, 2, "lobatto")
    order = n - 1
    x = numpy.cos(numpy.pi * numpy.arange(n) / order)
    if order > 1:
        for _ in range(100):
            p, p_prev = _legendre_pair(order, x)
            step = (x * p - p_prev) / ((order + 1) * p)
            x = x - step
            if numpy.max(numpy.abs(step)) < 1e-15:
                break
        x = 0.5 * (x - x[::-1])
        x[0], x[-1] = 1.0, -1.0
    p, _ = _legendre_pair(order, x)
    weights = 2.0 / (order * (order + 1) * p * p)
    return numpy.arccos(numpy.clip(x, -1.0, 1.0)), weights


@dataclasses.dataclass(frozen=True)
class QuadratureRule:
    """Everything mpisphere knows about one latitude rule.

    Attributes
    ----------
    name : str
        The name transforms take as ``quadrature=``.
    aliases : tuple of str
        Other names accepted for it (case does not matter).
    min_points : int
        Fewest latitudes the rule is defined for.
    nodes : callable
        ``nodes(n) -> (theta, weights)``.
    exact_degree : callable
        ``exact_degree(n)``: highest polynomial degree in ``cos(theta)`` the
        ``n``-point rule integrates exactly.
    default_lmax : callable
        ``default_lmax(n)``: torch-harmonics 0.9's default number of degrees.
    """

    name: str
    aliases: Tuple[str, ...]
    min_points: int
    nodes: Callable
    exact_degree: Callable
    default_lmax: Callable


RULES = {r.name: r for r in (
    QuadratureRule("equiangular", ("equidistant", "clenshaw-curtis"), 2, clenshaw_curtis,
                   lambda n: n if n % 2 else n - 1, lambda n: (n + 1) // 2),
    QuadratureRule("legendre-gauss", ("gauss", "gauss-legendre"), 1, legendre_gauss,
                   lambda n: 2 * n - 1, lambda n: n),
    QuadratureRule("lobatto", ("legendre-gauss-lobatto", "gauss-lobatto"), 2, lobatto,
                   lambda n: 2 * n - 3, lambda n: n - 1),
)}
"""The rules by name; :func:`rule` also resolves aliases."""

QUADRATURES = tuple(RULES)


def rule(quadrature):
    """The ``QuadratureRule`` named ``quadrature`` (or one of its aliases)."""
    aliases = {alias: r.name for r in RULES.values() for alias in (r.name,) + tuple(r.aliases)}
    return RULES[check_choice(quadrature, QUADRATURES, "quadrature", aliases=aliases)]


def _rule_points(quadrature, nlat, who):
    found = rule(quadrature)
    return found, _points(nlat, found.min_points, who, found.name)


def latitudes(nlat, quadrature="equiangular"):
    """Colatitudes and weights of ``nlat`` points of a rule (see the module docstring)."""
    found, nlat = _rule_points(quadrature, nlat, "latitudes")
    return found.nodes(nlat)


def exact_degree(nlat, quadrature):
    """Highest polynomial degree in ``cos(theta)`` the ``nlat``-point rule integrates exactly."""
    found, nlat = _rule_points(quadrature, nlat, "exact_degree")
    return found.exact_degree(nlat)


def default_lmax(nlat, quadrature="equiangular"):
    """torch-harmonics 0.9's default number of degrees for ``nlat`` latitudes of a rule.

    ``legendre-gauss``: ``nlat``; ``lobatto``: ``nlat - 1``; ``equiangular``:
    ``(nlat + 1) // 2`` (the degrees whose products the rule integrates
    exactly).
    """
    found, nlat = _rule_points(quadrature, nlat, "default_lmax")
    return found.default_lmax(nlat)


def truncate_sht(nlat, nlon, lmax=None, mmax=None, quadrature="equiangular"):
    """Number of degrees and orders of a transform, resolved as torch-harmonics 0.9 resolves them.

    Parameters
    ----------
    nlat, nlon : int
        The grid.
    lmax, mmax : int, optional
        Requested numbers of degrees and orders (exclusive bounds). Default:
        ``default_lmax`` and the Nyquist limit ``nlon // 2 + 1``.
    quadrature : {"equiangular", "legendre-gauss", "lobatto"}

    Returns
    -------
    (int, int)
        ``(lmax, mmax)`` after triangular truncation: both are
        ``min(lmax, mmax)``, also when both were given, so every degree kept
        has all its orders. Requests beyond the grid are kept, as
        torch-harmonics keeps them: ``mmax`` above ``nlon // 2 + 1`` makes
        the transforms zero-pad the orders the longitudes cannot hold
        (analysis) and drop them (synthesis); ``lmax`` above the rule's
        exact degree gives degrees the quadrature does not integrate exactly.

    Examples
    --------
    >>> truncate_sht(33, 64)
    (17, 17)
    >>> truncate_sht(32, 64, quadrature="legendre-gauss")
    (32, 32)
    >>> truncate_sht(32, 64, lmax=20, mmax=17, quadrature="legendre-gauss")
    (17, 17)
    >>> truncate_sht(32, 64, lmax=64, mmax=64, quadrature="legendre-gauss")  # orders 33-63 zero-padded
    (64, 64)
    """
    for name, value in (("lmax", lmax), ("mmax", mmax)):
        if value is not None and (not isinstance(value, (int, numpy.integer)) or isinstance(value, bool)
                                  or value < 1):
            raise ValueError(f"truncate_sht: {name} must be a positive integer or None, got {value!r}")
    lmax = default_lmax(nlat, quadrature) if lmax is None else int(lmax)
    mmax = check_int(nlon, "nlon", "truncate_sht", minimum=1) // 2 + 1 if mmax is None else int(mmax)
    lmax = mmax = min(lmax, mmax)
    return lmax, mmax
