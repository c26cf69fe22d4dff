"""Halo widths from geometry: the latitudes a localized operator reaches, and the rows a polar rank borrows.

:func:`~mpisphere.latitude_support_band` gives, for each output latitude, the band of
input latitudes within an angular radius; :func:`~mpisphere.polar_halo_radius` turns
it into the halo width (in rows) a :class:`~mpisphere.HaloExchange` needs
on a given split of the latitudes. No communication: the same on every rank.
"""

import numpy

from .partition import split_sizes

__all__ = ["latitude_support_band", "polar_halo_radius"]


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
