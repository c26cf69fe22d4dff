"""Which points of a ring grid each rank holds, and whole fields scattered and gathered.

:class:`RingTiles` spreads a :class:`~mpisphere.RingGeometry` over a
:class:`~mpisphere.ProcessGrid`: the rings in contiguous runs over the
polar ranks, balanced by points (``balanced_ring_split``),
and each ring's longitudes over the azimuth ranks
(:func:`~mpisphere.split_sizes` of its length). A rank's field is
``(..., npoints)``: its share of each of its rings, ring after ring.
"""

import math

import numpy

from .agreement.description import digest
from .partition import offsets_of, split_offsets, split_sizes
from .rings import RingGeometry, balanced_ring_split
from .tiling import Points, Tiling

__all__ = ["RingTiles", "is_ring_tiles"]


class RingTiles(Tiling):
    """The points of a ring grid that every rank of a process grid holds.

    Parameters
    ----------
    grid : ProcessGrid
    rings : RingGeometry

    Attributes
    ----------
    ring_counts : list of int
        Rings per polar rank (balanced by points).
    local_rings : ndarray of int
        Global indices of this rank's rings, increasing.
    counts : ndarray of int
        This rank's points on each of its rings (its azimuth chunk).
    offsets : ndarray of int
        Where each of its rings starts in its flat points (``len(local_rings) + 1``
        entries, the last is ``npoints``).
    npoints : int
        This rank's points: the last axis of its fields.

    Notes
    -----
    Building it does not communicate (every rank computes the same split);
    ``scatter`` and ``gather`` (of :class:`~mpisphere.Tiling`: a whole field ``(..., npoints)``)
    are collective over ``grid.cart``.
    """

    def __init__(self, grid, rings):
        if not isinstance(rings, RingGeometry):
            raise TypeError(f"RingTiles: rings must be a RingGeometry (e.g. RingGeometry.octahedral(32)), got "
                            f"{type(rings).__name__}")
        if int(rings.nlon.min()) < grid.nazimuth:
            raise ValueError(f"RingTiles: the shortest ring of {rings.name} has {int(rings.nlon.min())} points, fewer "
                             f"than the {grid.nazimuth} azimuth ranks that split every ring; use at most "
                             f"{int(rings.nlon.min())} azimuth ranks")
        self.grid, self.rings = grid, rings
        self.ring_counts = balanced_ring_split(rings.nlon, grid.npolar)
        self._ring_starts = offsets_of(self.ring_counts)
        self.local_rings = self.rings_of(grid.polar_rank)
        self.counts = numpy.array([split_sizes(int(rings.nlon[j]), grid.nazimuth)[grid.azimuth_rank]
                                   for j in self.local_rings], dtype=numpy.int64)
        self.offsets = numpy.asarray(offsets_of(self.counts.tolist()) + [int(self.counts.sum())], dtype=numpy.int64)
        self.npoints = int(self.offsets[-1])
        self.whole, self.name = (int(rings.npoints),), rings.name

    def local_shape(self, rank=None):
        """``(npoints,)`` of grid rank ``rank`` (default: this rank)."""
        if rank is None:
            return (self.npoints,)
        polar, azimuth = divmod(rank, self.grid.nazimuth)
        return (sum(split_sizes(int(self.rings.nlon[j]), self.grid.nazimuth)[azimuth] for j in self.rings_of(polar)),)

    def piece(self, field, rank):
        return field[..., self.point_indices(rank)]

    def place(self, field, rank, part):
        field[..., self.point_indices(rank)] = part

    def points(self, quadrature=None):
        """This rank's ``Points``, each ``(npoints,)``: the rings' own colatitudes and
        Gauss weights (``quadrature`` is not used: a ring grid has its rule)."""
        ring = numpy.repeat(self.local_rings, self.counts)
        return Points(self.rings.theta[ring], self.longitudes, self.rings.weights[ring],
                      2 * math.pi / self.rings.nlon[ring], ring, int(self.rings.nrings))

    def parameters(self, quadrature=None):
        return {"rings": repr(self.rings)}

    def transforms(self, family, lmax=None, mmax=None, quadrature=None, **options):
        kinds = (family.DistributedReducedRealSHT, family.DistributedInverseReducedRealSHT,
                 family.DistributedReducedRealVectorSHT, family.DistributedInverseReducedRealVectorSHT)
        return tuple(kind(self.grid, self.rings, lmax, mmax, **options) for kind in kinds)

    def write_to(self, store, name, part, quadrature=None, **options):
        return store.write_points(name, part, self, **options)

    def read_from(self, store, name, quadrature=None):
        return store.read_points(name, self)

    def stencil(self, stencils, who, quadrature, lats, lons):
        return stencils.rings(who, self, lats, lons)

    def rings_of(self, polar_rank):
        """Global indices of the rings polar rank ``polar_rank`` holds."""
        start = self._ring_starts[polar_rank]
        return numpy.arange(start, start + self.ring_counts[polar_rank])

    def point_indices(self, rank=None):
        """Indices into the whole field's points of grid rank ``rank``'s points, in its order (default: this rank)."""
        if rank is None:
            polar, azimuth = self.grid.polar_rank, self.grid.azimuth_rank
        else:
            polar, azimuth = divmod(rank, self.grid.nazimuth)  # grid ranks are polar-major (tile_slices)
        pieces = []
        for j in self.rings_of(polar):
            n = int(self.rings.nlon[j])
            start = int(self.rings.offsets[j]) + split_offsets(n, self.grid.nazimuth)[azimuth]
            pieces.append(numpy.arange(start, start + split_sizes(n, self.grid.nazimuth)[azimuth]))
        return numpy.concatenate(pieces)

    @property
    def colatitudes(self):
        """Colatitude (radians) of each of this rank's points, ``(npoints,)``."""
        return self.rings.theta[numpy.repeat(self.local_rings, self.counts)]

    @property
    def longitudes(self):
        """Longitude (radians) of each of this rank's points, ``(npoints,)``."""
        return self.rings.longitudes[self.point_indices()]

    @property
    def ring_colatitudes(self):
        """Colatitude (radians) of each of this rank's rings."""
        return self.rings.theta[self.local_rings]

    def __repr__(self):
        return f"RingTiles({self.rings!r}, grid {self.grid.npolar} x {self.grid.nazimuth})"

    def description(self):
        """The kind and the rings' points per ring, colatitudes and first longitudes (a digest of their bytes)."""
        rings = self.rings
        layout = b"".join(numpy.ascontiguousarray(a, dtype=numpy.float64).tobytes()
                          for a in (rings.nlon, rings.theta, rings.phi0))
        return {**super().description(), "rings": int(rings.nrings), "layout": digest(layout.hex())}

    def _whole_problem(self, field, root):
        return (f"root {root}'s field has {field.shape[-1]} points in its last axis, {self.rings.name} has "
                f"{self.rings.npoints}")

    def _part_name(self):
        return f"points (..., {self.npoints}) of {self.rings.name}"


def is_ring_tiles(value):
    """Whether ``value`` is a :class:`RingTiles` (the one test of this kind, for arguments that take only it)."""
    return isinstance(value, RingTiles)
