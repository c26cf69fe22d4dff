"""Which points of a ring grid each rank holds, and whole fields scattered and gathered.

:class:`RingTiles` spreads a :class:`~mpisphere.RingGeometry` over a
:class:`~mpisphere.ProcessGrid`: the rings in contiguous runs over the
polar ranks, balanced by points (``balanced_ring_split``),
and each ring's longitudes over the azimuth ranks
(:func:`~mpisphere.split_sizes` of its length). A rank's field is
``(..., npoints)``: its share of each of its rings, ring after ring.
"""

import numpy

from . import backend, collectives, dtypes
from .agreement import Call, InputError, collective
from .partition import offsets_of, split_offsets, split_sizes
from .rings import RingGeometry, balanced_ring_split

__all__ = ["RingTiles"]


class RingTiles:
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
    :meth:`scatter` and :meth:`gather` are collective over ``grid.cart``.
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

    # --- whole fields ----------------------------------------------------------------------------

    @collective
    def scatter(self, field, root=0):
        """This rank's points of the whole field ``(..., npoints)`` held on ``root`` (collective).

        ``field`` is ignored on the other ranks (pass ``None``). Returns
        ``(..., self.npoints)``, C-contiguous.
        """
        grid = self.grid
        call = Call(grid.cart, "RingTiles.scatter")
        with call.local():
            root = grid._check_root(root, "scatter")
            if grid.rank == root:
                if not backend.is_array(field) or field.ndim < 1:
                    raise InputError(f"root {root} must pass an array, got {type(field).__name__}", TypeError)
                if dtypes.refusal(field.dtype, "moved"):
                    raise InputError(f"root {root}'s field: {dtypes.refusal(field.dtype, 'moved')}", TypeError)
                if field.shape[-1] != self.rings.npoints:
                    raise InputError(f"root {root}'s field has {field.shape[-1]} points in its last axis, "
                                     f"{self.rings.name} has {self.rings.npoints}")
        call.agree(root=root)
        meta = (tuple(field.shape), numpy.dtype(field.dtype).str) if grid.rank == root else None
        shape, dtype = call.share(meta, root=root)
        lead = shape[:-1]
        xp = backend.array_module(field) if backend.is_array(field) else numpy
        send = counts = displs = None
        with call.local(f"allocating {lead + (self.npoints,)} {numpy.dtype(dtype)}"):
            part = xp.empty(lead + (self.npoints,), dtype=dtype)
            if grid.rank == root:
                pieces = [field[..., self.point_indices(r)] for r in range(grid.size)]
                counts = [int(p.size) for p in pieces]
                displs = offsets_of(counts)
                send = xp.concatenate([p.reshape(-1) for p in pieces])
        call.agree(shape=shape, dtype=numpy.dtype(dtype).name)
        collectives.scatterv(grid.cart, send, counts, displs, part.reshape(-1), root=root,
                             staged=backend.is_device_array(part) and not grid.cuda_aware[0])
        return part

    @collective
    def gather(self, part, root=0):
        """The whole field ``(..., npoints)`` on ``root`` from every rank's ``(..., self.npoints)`` (collective).

        Returns ``None`` on the other ranks.
        """
        grid = self.grid
        call = Call(grid.cart, "RingTiles.gather")
        with call.local():
            root = grid._check_root(root, "gather")
            if not backend.is_array(part) or part.ndim < 1 or part.shape[-1] != self.npoints:
                raise InputError(f"expected this rank's points (..., {self.npoints}) of {self.rings.name}, got "
                                 f"{type(part).__name__} {getattr(part, 'shape', '')}".rstrip(),
                                 ValueError if backend.is_array(part) else TypeError)
            if dtypes.refusal(part.dtype, "moved"):
                raise InputError(dtypes.refusal(part.dtype, "moved"), TypeError)
        # a rank whose part failed its checks has no shape to compare: its finding is what the others meet
        held = None if call.error is not None else (list(part.shape[:-1]), numpy.dtype(part.dtype).name)
        call.agree(root=root, part=held)
        xp = backend.array_module(part)
        lead = tuple(part.shape[:-1])
        indices = [self.point_indices(r) for r in range(grid.size)] if grid.rank == root else None
        counts = [int(numpy.prod(lead, dtype=numpy.int64)) * len(i) for i in indices] if indices else None
        displs = offsets_of(counts) if counts else None
        recv = field = None
        with call.local(f"allocating the gathered field {lead + (self.rings.npoints,)}"):
            part = xp.ascontiguousarray(part)
            if grid.rank == root:
                recv = xp.empty(sum(counts), dtype=part.dtype)
                field = xp.empty(lead + (self.rings.npoints,), dtype=part.dtype)
        call.agree()
        collectives.gatherv(grid.cart, part.reshape(-1), recv, counts, displs, root=root,
                            staged=backend.is_device_array(part) and not grid.cuda_aware[0])
        if grid.rank != root:
            return None
        for r, index in enumerate(indices):
            field[..., index] = recv[displs[r]:displs[r] + counts[r]].reshape(lead + (len(index),))
        return field
