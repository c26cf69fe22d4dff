"""Grids as latitude rings of their own lengths: octahedral and classic reduced Gaussian grids, HEALPix (no MPI).

A :class:`RingGeometry` is the data of a ring grid: for each ring (north
pole first) its colatitude, quadrature weight, number of points and the
longitude of its first point. A field on it is the points ring after ring,
a flat last axis; ring ``j`` holds ``nlon[j]`` points at longitudes
``phi0[j] + 2 pi k / nlon[j]``, ``k = 0 .. nlon[j] - 1``.

Constructors:

:meth:`~mpisphere.RingGeometry.octahedral`
    ``O<N>``, ECMWF's octahedral reduced Gaussian grid: ``2 N`` Gaussian
    latitudes, ring ``j`` from either pole (``j = 1 .. N``) with
    ``20 + 4 (j - 1)`` points (O1280: 6 599 680 points).
:meth:`~mpisphere.RingGeometry.reduced_gaussian`
    a classic reduced Gaussian grid from its ring lengths (GRIB's ``pl``
    array of a ``reduced_gg`` grid), on the Gaussian latitudes of as many
    rings.
:meth:`~mpisphere.RingGeometry.healpix`
    HEALPix's ``12 nside^2`` equal-area pixels on ``4 nside - 1`` rings.
:meth:`~mpisphere.RingGeometry.regular`
    a regular grid (every ring ``nlon`` points) on any latitude rule: the
    special case, with the same default truncation as the regular
    transforms.

``balanced_ring_split`` splits the rings into contiguous runs with
nearly equal numbers of points (the polar ranks' shares).
"""

import hashlib
import warnings

import numpy

from .partition import offsets_of
from .quadrature import latitudes, rule, truncate_sht
from .validation import check_int

__all__ = ["RingGeometry", "balanced_ring_split"]


class RingGeometry:
    """The rings of a grid on the sphere: colatitudes, weights, point counts, first longitudes.

    Parameters
    ----------
    nlon : sequence of int
        Points per ring, north pole first (``nrings`` entries, each at least 1).
    theta : sequence of float
        Colatitudes in radians, increasing, in ``(0, pi)`` or on the poles.
    weights : sequence of float
        Quadrature weights for integrals over ``cos(theta)`` (summing to 2
        for an exact rule): an analysis weighs ring ``j``'s points by
        ``2 pi weights[j] / nlon[j]``.
    phi0 : sequence of float, optional
        Longitude (radians) of each ring's first point; default 0.
    lmax : int, optional
        The default number of degrees of a transform on these rings.
        Default: :func:`~mpisphere.truncate_sht`'s for ``nrings`` latitudes
        and the longest ring, Gauss-Legendre.
    name : str, optional
        A label (``"O32"``, ``"N48 reduced"``) for messages and files.

    Attributes
    ----------
    nrings, npoints : int
    offsets : ndarray of int
        Start of each ring in the flat points array (``nrings + 1`` entries,
        the last is ``npoints``).
    """

    def __init__(self, nlon, theta, weights, phi0=None, lmax=None, name=None):
        who = "RingGeometry"
        nlon = numpy.array([check_int(n, "nlon", who, minimum=1) for n in numpy.ravel(nlon)], dtype=numpy.int64)
        theta = numpy.array(theta, dtype=numpy.float64).ravel()
        weights = numpy.array(weights, dtype=numpy.float64).ravel()
        phi0 = numpy.zeros(len(nlon)) if phi0 is None else numpy.array(phi0, dtype=numpy.float64).ravel()
        if not len(nlon):
            raise ValueError(f"{who}: a grid needs at least one ring")
        for label, values in (("theta", theta), ("weights", weights), ("phi0", phi0)):
            if len(values) != len(nlon):
                raise ValueError(f"{who}: {label} has {len(values)} entries for {len(nlon)} rings (nlon)")
            if not numpy.all(numpy.isfinite(values)):
                raise ValueError(f"{who}: {label} holds values that are not finite")
        if numpy.any(numpy.diff(theta) <= 0) or theta[0] < 0 or theta[-1] > numpy.pi:
            raise ValueError(f"{who}: theta must increase from the north pole, within [0, pi]")
        self.nlon, self.theta, self.weights, self.phi0 = nlon, theta, weights, phi0
        for array in (nlon, theta, weights, phi0):
            array.flags.writeable = False
        self.offsets = numpy.asarray(offsets_of(nlon.tolist()) + [int(nlon.sum())], dtype=numpy.int64)
        self.offsets.flags.writeable = False
        self.nrings, self.npoints = len(nlon), int(nlon.sum())
        if lmax is None:
            lmax = truncate_sht(self.nrings, int(nlon.max()), quadrature="legendre-gauss")[0]
        self.lmax = check_int(lmax, "lmax", who, minimum=1)
        self.name = name if name is not None else f"{self.nrings} rings"
        digest = hashlib.blake2b(digest_size=8)
        for array in (nlon, theta, weights, phi0):
            digest.update(numpy.ascontiguousarray(array).tobytes())
        self._digest = digest.hexdigest()

    # --- constructors ------------------------------------------------------------------------------

    @classmethod
    def octahedral(cls, n):
        """``O<n>``: ``2 n`` Gaussian rings of ``20 + 4 (j - 1)`` points, ``j`` counted from either pole.

        The default truncation is cubic, ``lmax = n`` degrees (``0 .. n - 1``,
        IFS's TCo(n - 1) on O(n)).
        """
        n = check_int(n, "n", "RingGeometry.octahedral", minimum=1)
        half = 20 + 4 * numpy.arange(n)
        theta, weights = latitudes(2 * n, "legendre-gauss")
        return cls(numpy.concatenate([half, half[::-1]]), theta, weights, lmax=n, name=f"O{n}")

    @classmethod
    def reduced_gaussian(cls, nlon, lmax=None, name=None):
        """A classic reduced Gaussian grid: ring lengths ``nlon`` (GRIB's ``pl``) on as many Gaussian latitudes.

        The default truncation is linear, ``lmax = len(nlon)`` degrees (TL(2N - 1)
        on an N grid of 2N rings).
        """
        nlon = numpy.ravel(nlon)
        theta, weights = latitudes(check_int(len(nlon), "len(nlon)", "RingGeometry.reduced_gaussian", minimum=1),
                                   "legendre-gauss")
        rings = len(nlon)
        return cls(nlon, theta, weights, lmax=rings if lmax is None else lmax,
                   name=name if name is not None else f"N{rings // 2} reduced")

    @classmethod
    def healpix(cls, nside, lmax=None):
        """HEALPix's ``12 nside^2`` pixel centres, its rings in RING order (Gorski et al. 2005, ApJ 622, 759).

        ``4 nside - 1`` rings of equal-area pixels: ``4 i`` points on the
        polar caps' ring ``i`` (counted from the nearer pole), ``4 nside`` on
        the equatorial belt's, every second belt ring shifted by half a pixel.
        The weights are the pixels' areas (``2 nlon_j / npix``), which
        integrate band-limited fields only approximately: synthesis and the
        adjoints are exact, an analysis is HEALPix's first-order estimate
        (no iterations). The default truncation is ``lmax = 2 nside``
        degrees, where a round trip of random band-limited coefficients comes
        back to 2e-2 (nside 16 and 32; 0.27 at ``3 nside``;
        docs/guide/reduced-grids.md). Its polar rings have 4 pixels, so
        :class:`~mpisphere.RingTiles`, which splits every ring over the
        azimuth ranks, takes at most 4 of them.
        """
        nside = check_int(nside, "nside", "RingGeometry.healpix", minimum=1)
        i = numpy.arange(1, 4 * nside)                       # ring, from the north pole
        cap = numpy.minimum(i, 4 * nside - i)                # its distance in rings from the nearer pole
        polar = cap < nside
        nlon = numpy.where(polar, 4 * cap, 4 * nside)
        # the caps' z = +-(1 - cap^2 / (3 nside^2)), as 2 asin(cap / (sqrt(6) nside)) from the nearer pole: arccos
        # of a z near 1 would lose digits there
        from_pole = 2.0 * numpy.arcsin(cap / (numpy.sqrt(6.0) * nside))
        theta = numpy.where(polar, numpy.where(i < 2 * nside, from_pole, numpy.pi - from_pole),
                            numpy.arccos(numpy.clip(4.0 / 3.0 - 2.0 * i / (3.0 * nside), -1.0, 1.0)))
        shifted = (i - nside + 1) % 2                        # belt rings whose first pixel is half a pixel on
        phi0 = numpy.where(polar, numpy.pi / nlon, shifted * numpy.pi / (4.0 * nside))
        npix = 12 * nside ** 2
        return cls(nlon, theta, 2.0 * nlon / npix, phi0=phi0,
                   lmax=2 * nside if lmax is None else lmax, name=f"HEALPix nside={nside}")

    @classmethod
    def regular(cls, nlat, nlon, quadrature="legendre-gauss"):
        """A regular ``(nlat, nlon)`` grid as rings (the default truncation of the regular transforms)."""
        nlat = check_int(nlat, "nlat", "RingGeometry.regular", minimum=1)
        nlon = check_int(nlon, "nlon", "RingGeometry.regular", minimum=1)
        theta, weights = latitudes(nlat, quadrature)
        lmax, mmax = truncate_sht(nlat, nlon, quadrature=quadrature)
        return cls(numpy.full(nlat, nlon), theta, weights, lmax=lmax,
                   name=f"{nlat} x {nlon} {rule(quadrature).name}")

    # --- what it holds -----------------------------------------------------------------------------

    @property
    def is_regular(self):
        """Whether every ring has the same number of points."""
        return bool(numpy.all(self.nlon == self.nlon[0]))

    def ring_of_points(self):
        """The ring index of every point, ``(npoints,)``."""
        return numpy.repeat(numpy.arange(self.nrings), self.nlon)

    @property
    def colatitudes(self):
        """Colatitude (radians) of every point, ``(npoints,)``: an array, as ``RingTiles.colatitudes``.

        (Called as a method until 0.4, which still works for one release with
        a ``DeprecationWarning``.)
        """
        return _FormerMethod.of(numpy.repeat(self.theta, self.nlon), "colatitudes")

    @property
    def longitudes(self):
        """Longitude (radians, eastward from ``phi0``) of every point, ``(npoints,)``: an array, as ``colatitudes``."""
        ring = self.ring_of_points()
        k = numpy.arange(self.npoints) - self.offsets[ring]
        return _FormerMethod.of(self.phi0[ring] + 2.0 * numpy.pi * k / self.nlon[ring], "longitudes")

    def __eq__(self, other):
        return isinstance(other, RingGeometry) and self._digest == other._digest and self.lmax == other.lmax

    def __hash__(self):
        return hash((self._digest, self.lmax))

    def __repr__(self):
        # what the ranks compare when they agree on a transform: the rings by value (a digest), not by identity
        return (f"RingGeometry({self.name!r}, nrings={self.nrings}, npoints={self.npoints}, lmax={self.lmax}, "
                f"rings={self._digest})")


class _FormerMethod(numpy.ndarray):
    """The array a former method now is: calling it returns it, with a ``DeprecationWarning`` (for 0.4 only).

    Anything computed from it is a plain ``numpy.ndarray``.
    """

    @classmethod
    def of(cls, values, name):
        array = values.view(cls)
        array._name = name
        return array

    def __call__(self):
        warnings.warn(f"RingGeometry.{getattr(self, '_name', 'colatitudes')} is an array (a property) since 0.4, "
                      "as RingTiles' are: drop the call's parentheses; calling it stops working in the next release",
                      DeprecationWarning, stacklevel=2)
        return self.view(numpy.ndarray)

    def __array_wrap__(self, array, context=None, return_scalar=False):
        if return_scalar:
            return array[()]
        return array.view(numpy.ndarray) if isinstance(array, numpy.ndarray) else array


def balanced_ring_split(nlon, parts):
    """Contiguous runs of rings for ``parts`` ranks, with nearly equal numbers of points.

    Parameters
    ----------
    nlon : sequence of int
        Points per ring.
    parts : int
        Number of runs (the polar ranks); at most the number of rings.

    Returns
    -------
    list of int
        Rings per run, each at least 1, summing to ``len(nlon)``. Run ``k``
        ends at the ring boundary nearest to ``(k + 1) / parts`` of the points.
    """
    nlon = numpy.asarray(nlon, dtype=numpy.int64)
    parts = check_int(parts, "parts", "balanced_ring_split", minimum=1)
    rings = len(nlon)
    if rings < parts:
        raise ValueError(f"balanced_ring_split: cannot split {rings} rings into {parts} non-empty runs; use at "
                         f"most {rings} polar ranks")
    cumulative = numpy.concatenate([[0], numpy.cumsum(nlon)])
    total = cumulative[-1]
    ends = [0]
    for k in range(1, parts):
        target = total * k / parts
        end = int(numpy.argmin(numpy.abs(cumulative - target)))
        # keep one ring for every run before and after this boundary
        end = min(max(end, ends[-1] + 1), rings - (parts - k))
        ends.append(end)
    ends.append(rings)
    return [b - a for a, b in zip(ends[:-1], ends[1:])]
