"""Latitude grids and quadrature weights, latitude support bands, halo radii.

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

Nothing here communicates; every rank computes the same numbers.
"""

import operator

import numpy

__all__ = [
    "GRIDS",
    "canonical_grid",
    "clenshaw_curtis",
    "legendre_gauss",
    "lobatto",
    "latitudes",
    "exact_degree",
    "default_lmax",
    "truncate_sht",
    "latitude_support_band",
    "polar_halo_radius",
]

GRIDS = ("equiangular", "legendre-gauss", "lobatto")
_ALIASES = {"equiangular": "equiangular", "equidistant": "equiangular", "clenshaw-curtis": "equiangular",
            "legendre-gauss": "legendre-gauss", "gauss": "legendre-gauss", "lobatto": "lobatto",
            "legendre-gauss-lobatto": "lobatto"}


def _points(n, minimum, name):
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"{name}: the number of latitudes must be an integer, got {n!r}") from None
    if n < minimum:
        raise ValueError(f"{name}: needs at least {minimum} latitudes, got {n}")
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


def canonical_grid(grid):
    """The name in :data:`GRIDS` that ``grid`` (or one of its aliases) stands for."""
    key = _ALIASES.get(str(grid).lower())
    if key is None:
        raise ValueError(f"unknown quadrature grid {grid!r}; choose one of {', '.join(GRIDS)}")
    return key


def latitudes(nlat, grid="equiangular"):
    """Colatitudes and weights of a named grid (see the module docstring)."""
    rule = {"equiangular": clenshaw_curtis, "legendre-gauss": legendre_gauss, "lobatto": lobatto}
    return rule[canonical_grid(grid)](nlat)


def exact_degree(nlat, grid):
    """Highest polynomial degree in ``cos(theta)`` the ``nlat``-point rule integrates exactly."""
    key = canonical_grid(grid)
    if key == "equiangular":
        return nlat if nlat % 2 else nlat - 1
    if key == "legendre-gauss":
        return 2 * nlat - 1
    return 2 * nlat - 3


def default_lmax(nlat, quadrature="equiangular"):
    """torch-harmonics 0.9's default number of degrees for ``nlat`` latitudes of a grid.

    ``legendre-gauss``: ``nlat``; ``lobatto``: ``nlat - 1``; ``equiangular``:
    ``(nlat + 1) // 2`` (the degrees whose squares the Clenshaw-Curtis rule
    integrates exactly).
    """
    key = canonical_grid(quadrature)
    nlat = _points(nlat, 1, "default_lmax")
    if key == "legendre-gauss":
        return nlat
    if key == "lobatto":
        return nlat - 1
    return (nlat + 1) // 2


def truncate_sht(nlat, nlon, lmax=None, mmax=None, quadrature="equiangular"):
    """Number of degrees and orders of a transform, resolved as torch-harmonics 0.9 resolves them.

    Parameters
    ----------
    nlat, nlon : int
        The grid.
    lmax, mmax : int, optional
        Requested numbers of degrees and orders (exclusive bounds). Default:
        :func:`default_lmax` and the Nyquist limit ``nlon // 2 + 1``.
    quadrature : {"equiangular", "legendre-gauss", "lobatto"}

    Returns
    -------
    (int, int)
        ``(lmax, mmax)`` after triangular truncation: both are
        ``min(lmax, mmax)``, also when both were given, so every degree kept
        has all its orders.

    Examples
    --------
    >>> truncate_sht(33, 64)
    (17, 17)
    >>> truncate_sht(32, 64, quadrature="legendre-gauss")
    (32, 32)
    >>> truncate_sht(32, 64, lmax=20, mmax=17, quadrature="legendre-gauss")
    (17, 17)
    """
    for name, value in (("lmax", lmax), ("mmax", mmax)):
        if value is not None and (not isinstance(value, (int, numpy.integer)) or isinstance(value, bool)
                                  or value < 1):
            raise ValueError(f"truncate_sht: {name} must be a positive integer or None, got {value!r}")
    lmax = default_lmax(nlat, quadrature) if lmax is None else int(lmax)
    mmax = _points(nlon, 1, "truncate_sht") // 2 + 1 if mmax is None else int(mmax)
    lmax = mmax = min(lmax, mmax)
    return lmax, mmax


def latitude_support_band(lats_in, lats_out, theta_cutoff):
    """For each output latitude, the input latitudes within ``theta_cutoff``.

    Two points on the sphere are at least ``|theta_in - theta_out|`` apart,
    with equality on the same meridian, so the input latitudes that a
    localized operator of radius ``theta_cutoff`` can reach from an output
    latitude form the contiguous band ``|theta_in - theta_out| <= theta_cutoff``.

    Parameters
    ----------
    lats_in, lats_out : array_like, shape ``(nlat_in,)``, ``(nlat_out,)``
        Colatitudes in radians, increasing.
    theta_cutoff : float
        Angular radius in radians.

    Returns
    -------
    lo, hi : ndarray of int, shape ``(nlat_out,)``
        First and last index into ``lats_in`` of the band; ``hi < lo`` where
        the band is empty. Both are non-decreasing.
    """
    lats_in = numpy.asarray(lats_in, dtype=numpy.float64)
    lats_out = numpy.asarray(lats_out, dtype=numpy.float64)
    if lats_in.ndim != 1 or lats_out.ndim != 1:
        raise ValueError("latitude_support_band: latitudes must be 1-D arrays")
    if numpy.any(numpy.diff(lats_in) < 0) or numpy.any(numpy.diff(lats_out) < 0):
        raise ValueError("latitude_support_band: latitudes must be increasing (north pole first)")
    if not theta_cutoff >= 0:
        raise ValueError(f"latitude_support_band: theta_cutoff must be non-negative, got {theta_cutoff}")
    n = len(lats_in)
    lo = numpy.searchsorted(lats_in, lats_out - theta_cutoff, side="left")
    hi = numpy.searchsorted(lats_in, lats_out + theta_cutoff, side="right") - 1

    # searchsorted compares theta_in with theta_out -/+ cutoff, which rounds
    # differently from |theta_in - theta_out| <= cutoff at the very edge of the
    # band; move each end by at most one so the band is exactly that predicate.
    def inside(i):
        return numpy.abs(lats_in[numpy.clip(i, 0, n - 1)] - lats_out) <= theta_cutoff

    for _ in range(2):
        lo = numpy.where((lo > 0) & inside(lo - 1), lo - 1, lo)
        lo = numpy.where((lo < n) & (lo <= hi) & ~inside(lo), lo + 1, lo)
        hi = numpy.where((hi < n - 1) & inside(hi + 1), hi + 1, hi)
        hi = numpy.where((hi >= 0) & (hi >= lo) & ~inside(hi), hi - 1, hi)
    return lo.astype(numpy.int64), hi.astype(numpy.int64)


def _polar_sizes(grid_or_sizes, nlat_in, nlat_out):
    from .partition import split_sizes
    npolar = getattr(grid_or_sizes, "npolar", None)
    if npolar is None and isinstance(grid_or_sizes, int):
        npolar = grid_or_sizes
    if npolar is not None:
        return split_sizes(nlat_in, npolar), split_sizes(nlat_out, npolar)
    try:
        sizes_in, sizes_out = (list(map(int, s)) for s in grid_or_sizes)
    except (TypeError, ValueError):
        raise TypeError("polar_halo_radius: grid_or_sizes must be a ProcessGrid, a number of polar ranks, "
                        "or a pair (input sizes, output sizes)") from None
    if sum(sizes_in) != nlat_in or sum(sizes_out) != nlat_out or len(sizes_in) != len(sizes_out):
        raise ValueError(f"polar_halo_radius: sizes {sizes_in} / {sizes_out} do not split "
                         f"{nlat_in} / {nlat_out} latitudes over the same number of ranks")
    return sizes_in, sizes_out


def polar_halo_radius(grid_or_sizes, lats_in, lats_out, theta_cutoff):
    """Latitude rows a polar rank must borrow from its neighbours.

    A polar rank owns a contiguous range of input and output latitudes; the
    rows it must borrow are where the support band of its output range runs
    past its own input range. The radius is the largest such overhang over
    all ranks, computed from the geometry alone (no communication, the same
    on every rank).

    Parameters
    ----------
    grid_or_sizes : ProcessGrid, int, or (list of int, list of int)
        The grid (or its number of polar ranks), whose ``split_sizes`` of the
        input and output latitudes are used; or the per-rank sizes
        themselves.
    lats_in, lats_out : array_like
        Input and output colatitudes, increasing.
    theta_cutoff : float
        Angular radius of the localized operator, radians.

    Returns
    -------
    int
        The halo width in rows, for ``HaloExchange(grid, rows=...)``; 0 on a
        single polar rank.

    Raises
    ------
    ValueError
        If the radius exceeds the smallest input chunk: the exchange only
        reaches the immediate neighbours.
    """
    lats_in = numpy.asarray(lats_in, dtype=numpy.float64)
    lats_out = numpy.asarray(lats_out, dtype=numpy.float64)
    sizes_in, sizes_out = _polar_sizes(grid_or_sizes, len(lats_in), len(lats_out))
    if len(sizes_in) <= 1:
        return 0
    lo, hi = latitude_support_band(lats_in, lats_out, theta_cutoff)
    radius = 0
    in_start = out_start = 0
    for n_in, n_out in zip(sizes_in, sizes_out):
        rows = numpy.arange(out_start, out_start + n_out)
        nonempty = rows[hi[rows] >= lo[rows]]
        if len(nonempty):
            # bands are monotone: the first and last non-empty rows bound the whole range
            need_lo, need_hi = lo[nonempty[0]], hi[nonempty[-1]]
            radius = max(radius, in_start - need_lo, need_hi - (in_start + n_in - 1))
        in_start += n_in
        out_start += n_out
    smallest = min(sizes_in)
    if radius > smallest:
        raise ValueError(
            f"polar_halo_radius: a halo of {radius} rows is wider than the smallest polar tile ({smallest} rows; "
            f"input latitudes split as {sizes_in}); the exchange reaches only the immediate neighbours, so use "
            "fewer polar ranks, more latitudes or a smaller theta_cutoff")
    return int(radius)
