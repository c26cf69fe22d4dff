"""Distributed transforms on ring grids (octahedral and classic reduced Gaussian grids), with exact adjoints.

The fields are this rank's points ``(..., npoints)`` (vector fields ``(...,
2, npoints)``) of a :class:`~mpisphere.RingGeometry` spread by
:class:`~mpisphere.RingTiles`; the coefficients are the blocks of the
regular transforms, ``(..., l_loc, m_loc)``, degrees over ``grid.polar``
and orders over ``grid.azimuth`` in either order layout. The stages::

    analysis                                   synthesis
    1. whole rings over the azimuth ranks      1. degrees whole (polar transpose or Allgatherv)
       (azimuth transpose, per-rank counts)    2. Legendre synthesis at the rings' latitudes
    2. RingFourier: one FFT per ring length,   3. latitudes split (polar transpose)
       each order from the frequency it        4. orders whole (azimuth transpose)
       aliases to (mmax orders)                5. RingFourier: each order onto the frequency
    3. orders split (azimuth transpose)           it aliases to, one inverse FFT per length
    4. rings whole (polar transpose, the       6. points back to their azimuth ranks
       ranks' rings as they hold them)            (the transpose of step 1, reversed)
    5. Legendre contraction (weights 2 pi w_j)
    6. degrees split (polar transpose or Reduce_scatter)

Steps 3-6 are the regular transform's, the three Legendre strategies
included; only the latitudes (the rings'), their split over the polar ranks
(balanced by points) and the Fourier step differ. The analysis weighs ring
``j`` by ``2 pi w_j / nlon_j`` (the quadrature weight of each of its
points); orders a ring cannot resolve alias onto the frequencies it holds
(:mod:`mpisphere.sht.ring_fourier` says why), so the synthesis gives the
band-limited field's values at the points and the analysis is its weighted
adjoint, as ducc0's ``synthesis``/``adjoint_synthesis`` with the same
geometry.
"""

import numpy

from ..ring_tiles import RingTiles
from ..rings import RingGeometry
from ..stages.fourier import Truncation
from .orders import order_permutation
from .ring_fourier import RingFourier, ring_transpose
from .transforms import Transform
from .vector import DistributedInverseRealVectorSHT, DistributedRealVectorSHT

__all__ = ["DistributedReducedRealSHT", "DistributedInverseReducedRealSHT", "DistributedReducedRealVectorSHT",
           "DistributedInverseReducedRealVectorSHT"]


class _OnRings(Transform):
    """What a transform on rings changes of its regular base: latitudes, its points, the Fourier stage."""

    def __init__(self, grid, rings, lmax=None, mmax=None, norm="ortho", csphase=True, dtype=numpy.float64, *,
                 contraction="auto", orders="contiguous", fft="auto", legendre="auto", max_table_bytes=None,
                 overlap=False):
        if not isinstance(rings, RingGeometry):
            raise TypeError(f"{self.name}: rings must be a RingGeometry (e.g. RingGeometry.octahedral(32)), got "
                            f"{type(rings).__name__}")
        self.rings = rings
        try:
            self.tiles = RingTiles(grid, rings)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {str(exc).removeprefix('RingTiles: ')}") from None
        lmax = rings.lmax if lmax is None else lmax
        super().__init__(grid, rings.nrings, int(rings.nlon.max()), lmax, lmax if mmax is None else mmax,
                         "legendre-gauss", norm, csphase, dtype, contraction=contraction, orders=orders, fft=fft,
                         legendre=legendre, max_table_bytes=max_table_bytes, overlap=overlap)

    def _latitudes(self):
        return self.rings.theta, self.rings.weights

    def _latitude_key(self):
        return repr(self.rings)

    def _tile_shape(self):
        return (self.tiles.npoints,)

    def _whole_shape(self):
        return (self.rings.npoints,)

    def _own_latitudes(self):
        rings = self.tiles.local_rings
        return slice(int(rings[0]), int(rings[-1]) + 1)

    @property
    def local_colatitudes(self):
        """Colatitude (radians) of each of this rank's points, ``(npoints,)``."""
        return self.tiles.colatitudes

    @property
    def local_longitudes(self):
        """Longitude (radians) of each of this rank's points, ``(npoints,)``."""
        return self.tiles.longitudes

    def _fourier_stages(self, batch):
        """Whole rings over the azimuth ranks, one FFT per ring length and the orders each ring aliases
        (``RingFourier``), the orders put in the layout's order; a synthesis the reverse."""
        rings = ring_transpose(self.tiles, batch)
        fourier = RingFourier(self.tiles, batch, self._components, self.mmax, self.dtype, self._synthesis,
                              self._layout, self.fft)
        permutation = order_permutation(self._assignment)
        reorder = [] if numpy.array_equal(permutation, numpy.arange(self.mmax)) else \
            [Truncation(self.mmax, self.mmax, self._layout, permutation)]
        return [*[r.H for r in reorder], fourier, rings.H] if self._synthesis else [rings, fourier, *reorder]

    def _latitude_chunks(self):
        return tuple(self.tiles.ring_counts)  # the rings split over the polar ranks, balanced by points


_RING_NOTES = """
    Parameters
    ----------
    grid : ProcessGrid
    rings : RingGeometry
        The grid's rings (:meth:`RingGeometry.octahedral`,
        :meth:`RingGeometry.reduced_gaussian`, :meth:`RingGeometry.regular`).
    lmax, mmax : int, optional
        Degrees and orders kept (default ``rings.lmax`` for both; triangular:
        both become ``min(lmax, mmax)``).
    norm, csphase, dtype, contraction, orders, fft, legendre, max_table_bytes, overlap
        As for :class:`DistributedRealSHT`.

    Notes
    -----
    Points ``(..., npoints)`` (this rank's, :class:`~mpisphere.RingTiles` ``tiles`` says which)
    {vector}and coefficient blocks ``(..., l_loc, m_loc)`` as the regular
    transforms'. See :mod:`mpisphere.sht.reduced`.
"""


class DistributedReducedRealSHT(_OnRings):
    __doc__ = "Forward real SHT of this rank's points of a ring grid (octahedral, reduced Gaussian, regular).\n" + \
        _RING_NOTES.format(vector="")
    _table_kind = "analysis"


class DistributedInverseReducedRealSHT(_OnRings):
    __doc__ = "Inverse real SHT: coefficient blocks to this rank's points of a ring grid.\n" + \
        _RING_NOTES.format(vector="")
    _synthesis = True
    _table_kind = "synthesis"


class DistributedReducedRealVectorSHT(_OnRings, DistributedRealVectorSHT):
    __doc__ = "Forward vector SHT of this rank's points of a ring grid, ``(..., 2, npoints)``.\n" + \
        _RING_NOTES.format(vector="(vector fields ``(..., 2, npoints)``, coefficients ``(..., 2, l_loc, m_loc)``) ")


class DistributedInverseReducedRealVectorSHT(_OnRings, DistributedInverseRealVectorSHT):
    __doc__ = "Inverse vector SHT: coefficient blocks to this rank's points of a ring grid, ``(..., 2, npoints)``.\n" \
        + _RING_NOTES.format(vector="(vector fields ``(..., 2, npoints)``, coefficients ``(..., 2, l_loc, m_loc)``) ")

