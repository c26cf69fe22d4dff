"""Which points of a whole field each rank holds, and the one scatter and gather of whole fields.

A *tiling* says, for every rank of a process grid, which points of a whole
field ``(..., *whole)`` the rank holds and in which order: its part is
``(..., *tiling.local_shape(rank))``. Two kinds exist:

* :class:`RegularTiling`: the rectangle of a regular ``(nlat, nlon)``
  field, latitudes over the polar ranks and longitudes over the azimuth
  ranks (``split_sizes`` of each), a part ``(..., h, w)``;
* :class:`~mpisphere.RingTiles`: the rings of a reduced grid, rings over the
  polar ranks and each ring's longitudes over the azimuth ranks, a part
  ``(..., npoints)``.

A tiling only has to say how to take a rank's part out of a whole field
(``Tiling.piece``) and how to put it back (``Tiling.place``):
``scatter_parts`` and ``gather_parts`` move whole fields for every
kind (one ``MPI_Scatterv`` / ``MPI_Gatherv`` over ``grid.cart``), so a new
kind of grid is one class.
"""

import math
from typing import NamedTuple

import numpy

from . import backend, collectives, dtypes
from .agreement import Call, InputError, collective
from .partition import offsets_of, split_sizes
from .quadrature import latitudes, rule
from .validation import check_int

__all__ = ["Tiling", "RegularTiling", "Points", "scatter_parts", "gather_parts", "check_root", "check_whole",
           "check_part"]


def check_root(grid, root, who):
    """``root`` as an int of ``grid``'s ranks, or an InputError (agreed on by every rank before it raises).

    ``who``: the operation, ``"scatter"`` or ``"gather"``.
    """
    try:
        root = check_int(root, "root", f"{type(grid).__name__}.{who}")
    except TypeError as exc:
        raise InputError(str(exc).removeprefix(f"{type(grid).__name__}.{who}: "), TypeError) from None
    if not 0 <= root < grid.size:
        raise InputError(f"root {root} out of range for {grid.size} ranks")
    return root


def check_whole(field, axes, root):
    """Root's own checks of a whole field it scatters: an array with at least ``axes`` axes, of a dtype that
    moves (an InputError: TypeError for a non-array or a dtype, ValueError for too few axes)."""
    if not backend.is_array(field) or field.ndim < axes:
        wanted = f" with at least {axes} axes" if axes > 1 else ""
        raise InputError(f"root {root} must pass an array{wanted}, got {type(field).__name__} "
                         f"{getattr(field, 'shape', '')}".rstrip(),
                         ValueError if backend.is_array(field) else TypeError)
    if dtypes.refusal(field.dtype, "moved"):
        raise InputError(f"root {root}'s field: {dtypes.refusal(field.dtype, 'moved')}", TypeError)


def check_part(part, axes, what, trailing=None):
    """A rank's own checks of the part it gathers: an array with at least ``axes`` axes (ending in ``trailing``
    when given), of a dtype that moves; ``what`` names the part expected, for the message."""
    if not backend.is_array(part) or part.ndim < axes or \
            trailing is not None and tuple(part.shape[-axes:]) != tuple(trailing):
        raise InputError(f"expected this rank's {what}, got {type(part).__name__} "
                         f"{getattr(part, 'shape', '')}".rstrip(), ValueError if backend.is_array(part) else TypeError)
    if dtypes.refusal(part.dtype, "moved"):
        raise InputError(dtypes.refusal(part.dtype, "moved"), TypeError)


class Points(NamedTuple):
    """This rank's points of a tiling, each array broadcast against the trailing shape of its part.

    On rectangular tiles ``(h, w)``: ``colatitudes``, ``weights`` and
    ``rings`` are ``(h, 1)``, ``longitudes`` ``(w,)``, ``spacing`` a float;
    on rings ``(npoints,)`` each (every ring its own spacing).
    """

    colatitudes: object  #: radians, 0 at the north pole
    longitudes: object   #: radians, east of the first meridian
    weights: object      #: the latitude rule's weight of each point's ring (for ``x = cos(theta)``)
    spacing: object      #: the longitude spacing of each point's ring (radians)
    rings: object        #: the global index of each point's ring (a latitude row)
    nrings: int          #: the whole grid's rings (latitudes)


class Tiling:
    """Which points of a whole field each rank of ``grid`` holds (the base of every kind).

    Subclasses set ``grid``, ``whole`` (the trailing shape of a whole field)
    and ``name`` (for messages), and define :meth:`local_shape`,
    :meth:`piece` and :meth:`place`. Building one never communicates.
    """

    grid = None
    whole = ()
    name = "a tiling"

    def local_shape(self, rank=None):
        """The trailing shape of grid rank ``rank``'s part (default: this rank)."""
        raise NotImplementedError

    def piece(self, field, rank):
        """Rank ``rank``'s part of the whole ``field`` ``(..., *whole)``: ``(..., *local_shape(rank))``."""
        raise NotImplementedError

    def place(self, field, rank, part):
        """Write rank ``rank``'s ``part`` into its points of the whole ``field``."""
        raise NotImplementedError

    # --- what serves the points of this kind (asked, so that no caller tests a tiling's kind) ---------------

    def points(self, quadrature="equiangular"):
        """This rank's ``Points``; ``quadrature``: a regular grid's latitude rule (a ring grid has its own)."""
        raise NotImplementedError

    def parameters(self, quadrature="equiangular"):
        """The plain values (a JSON dict) that identify these points' grid, for a checkpoint's parameters."""
        raise NotImplementedError

    def transforms(self, family, lmax=None, mmax=None, quadrature="equiangular", **options):
        """The four transforms of fields on these points: scalar and vector, forward and inverse.

        ``family``: the namespace of the transform classes
        (``mpisphere.sht``), passed in so that a tiling imports nothing
        above it; ``options``: the transforms' keywords.
        """
        raise NotImplementedError

    def write_to(self, store, name, part, quadrature="equiangular", **options):
        """Write this rank's ``part`` as variable ``name`` of ``store`` (a ``FieldStore``) as this kind is stored."""
        raise NotImplementedError

    def read_from(self, store, name, quadrature="equiangular"):
        """This rank's part of variable ``name`` of ``store``, as this kind is stored."""
        raise NotImplementedError

    def stencil(self, stencils, who, quadrature, lats, lons):
        """The interpolation stencil of this kind from ``stencils`` (``mpisphere.interpolation``'s table of them)."""
        raise TypeError(f"{who}: no interpolation stencil for {type(self).__name__}")

    def description(self):
        """What the ranks compare before a whole field moves: the kind, the whole shape, and what else decides which
        points each rank holds (a subclass adds its own, by value)."""
        return {"kind": type(self).__name__, "name": self.name, "whole": list(self.whole)}

    def _whole_problem(self, field, root):
        """Why root's ``field`` is not a whole field of this tiling (its trailing shape differs)."""
        return f"root {root}'s field ends in {tuple(field.shape[-len(self.whole):])}, {self.name} is {self.whole}"

    def _part_name(self):
        """This rank's part, for messages."""
        return f"part (..., {', '.join(map(str, self.local_shape()))}) of {self.name}"

    @collective
    def scatter(self, field, root=0):
        """This rank's part of the whole field ``(..., *whole)`` held on ``root`` (collective over ``grid.cart``).

        ``field`` is ignored on the other ranks (pass ``None``, or an array
        of the module the part should live in). Returns
        ``(..., *local_shape())``, C-contiguous.
        """
        grid, k = self.grid, len(self.whole)
        call = Call(grid.cart, f"{type(self).__name__}.scatter")
        with call.local():
            root = check_root(grid, root, "scatter")
            if grid.rank == root:
                check_whole(field, k, root)
                if tuple(field.shape[-k:]) != tuple(self.whole):
                    raise InputError(self._whole_problem(field, root))
        # a tiling of other extents or rings on some rank would send or receive parts of other sizes there
        call.agree(root=root, tiling=self.description(), mismatch="hold different tilings")
        meta = (tuple(field.shape), numpy.dtype(field.dtype).str) if grid.rank == root else None
        shape, dtype = call.share(meta, root=root)
        return scatter_parts(self, call, field, shape, dtype, root)

    @collective
    def gather(self, part, root=0):
        """The whole field ``(..., *whole)`` on ``root`` from every rank's part (collective over ``grid.cart``).

        Leading shapes and dtypes must be the same on every rank. Returns
        ``None`` on the other ranks.
        """
        grid, k = self.grid, len(self.whole)
        call = Call(grid.cart, f"{type(self).__name__}.gather")
        with call.local():
            root = check_root(grid, root, "gather")
            check_part(part, k, self._part_name(), self.local_shape())
        # a rank whose part failed its checks has no shape to compare: its finding is what the others meet
        held = None if call.error is not None else (list(part.shape[:-k]), numpy.dtype(part.dtype).name)
        call.agree(root=root, part=held, tiling=self.description(), mismatch="hold different tilings")
        return gather_parts(self, call, part, root)


class RegularTiling(Tiling):
    """The rectangular tiles of a regular ``(nlat, nlon)`` field (``grid.tiling(nlat, nlon)``).

    Parameters
    ----------
    grid : ProcessGrid
    nlat, nlon : int
        The whole field's extents; every rank's tile must hold a point.

    Notes
    -----
    ``grid.scatter`` and ``grid.gather`` use it for any ``(nlat, nlon)``
    (they learn the extents from the field or the tiles); its own
    :meth:`~Tiling.scatter` and :meth:`~Tiling.gather` check the
    extents it was built with.
    """

    def __init__(self, grid, nlat, nlon):
        self.grid = grid
        self.whole = grid._check_extents(nlat, nlon, "tiling")
        self.name = f"the {nlat} x {nlon} field"
        self._lat = offsets_of(split_sizes(self.whole[0], grid.npolar)) + [self.whole[0]]
        self._lon = offsets_of(split_sizes(self.whole[1], grid.nazimuth)) + [self.whole[1]]

    def __repr__(self):
        return f"RegularTiling({self.whole[0]} x {self.whole[1]}, grid {self.grid.npolar} x {self.grid.nazimuth})"

    def slices(self, rank=None):
        """``(lat_slice, lon_slice)`` of grid rank ``rank``'s tile (default: this rank)."""
        p, a = divmod(self.grid.rank if rank is None else rank, self.grid.nazimuth)
        return slice(self._lat[p], self._lat[p + 1]), slice(self._lon[a], self._lon[a + 1])

    def local_shape(self, rank=None):
        lat, lon = self.slices(rank)
        return (lat.stop - lat.start, lon.stop - lon.start)

    def piece(self, field, rank):
        return field[(Ellipsis,) + self.slices(rank)]

    def place(self, field, rank, part):
        field[(Ellipsis,) + self.slices(rank)] = part

    def points(self, quadrature="equiangular"):
        nlat, nlon = self.whole
        theta, weights = latitudes(nlat, quadrature)
        lat, lon = self.slices()
        return Points(theta[lat].reshape(-1, 1), 2.0 * math.pi * numpy.arange(lon.start, lon.stop) / nlon,
                      weights[lat].reshape(-1, 1), 2 * math.pi / nlon,
                      numpy.arange(lat.start, lat.stop).reshape(-1, 1), nlat)

    def parameters(self, quadrature="equiangular"):
        return {"nlat": int(self.whole[0]), "nlon": int(self.whole[1]), "quadrature": rule(quadrature).name}

    def transforms(self, family, lmax=None, mmax=None, quadrature="equiangular", **options):
        kinds = (family.DistributedRealSHT, family.DistributedInverseRealSHT, family.DistributedRealVectorSHT,
                 family.DistributedInverseRealVectorSHT)
        return tuple(kind(self.grid, *self.whole, lmax, mmax, quadrature=quadrature, **options) for kind in kinds)

    def write_to(self, store, name, part, quadrature="equiangular", **options):
        return store.write_tiles(name, part, *self.whole, quadrature, **options)

    def read_from(self, store, name, quadrature="equiangular"):
        return store.read_tiles(name, *self.whole, quadrature)

    def stencil(self, stencils, who, quadrature, lats, lons):
        return stencils.rectangles(who, self, quadrature, lats, lons)


def scatter_parts(tiling, call, field, shape, dtype, root):
    """Every rank's part of the whole ``field`` on ``root`` (one ``MPI_Scatterv`` over ``grid.cart``).

    Parameters
    ----------
    tiling : Tiling
    call : mpisphere.agreement.Call
        The caller's collective call: its arguments and root's field were
        checked and agreed on; the allocations run inside it, so a rank that
        cannot allocate raises on every rank before any data moves.
    field : array ``(..., *tiling.whole)`` on ``root``, ignored elsewhere
        On the other ranks, a NumPy or CuPy array (or ``None``) says where
        the part should live.
    shape, dtype
        The whole field's shape and dtype, as every rank learnt them from root.
    root : int

    Returns
    -------
    array ``(..., *tiling.local_shape())``, C-contiguous.
    """
    grid = tiling.grid
    lead = tuple(shape[:len(shape) - len(tiling.whole)])
    xp = backend.array_module(field) if backend.is_array(field) else numpy
    local = lead + tuple(tiling.local_shape())
    part = send = counts = displs = None
    with call.local(f"allocating {local} {numpy.dtype(dtype)}"):
        part = xp.empty(local, dtype=dtype)
        if grid.rank == root:
            counts = [math.prod(lead + tuple(tiling.local_shape(r))) for r in range(grid.size)]
            displs = offsets_of(counts)
            send = xp.empty(sum(counts), dtype=dtype)
            for r in range(grid.size):
                piece = tiling.piece(field, r)
                send[displs[r]:displs[r] + counts[r]].reshape(piece.shape)[...] = piece
    call.agree(shape=list(shape), dtype=numpy.dtype(dtype).name)
    collectives.scatterv(grid.cart, send, counts, displs, part.reshape(-1), root=root,
                         staged=backend.is_device_array(part) and not grid.cuda_aware[0])
    return part


def gather_parts(tiling, call, part, root):
    """The whole field ``(..., *tiling.whole)`` on ``root`` from every rank's part (one ``MPI_Gatherv``).

    ``call``: as :func:`scatter_parts`; every rank's part was checked and
    the leading shapes and dtypes agreed on. Returns ``None`` on the other ranks.
    """
    grid = tiling.grid
    xp = backend.array_module(part)
    lead = tuple(part.shape[:part.ndim - len(tiling.whole)])
    shapes = [lead + tuple(tiling.local_shape(r)) for r in range(grid.size)] if grid.rank == root else None
    counts = [math.prod(s) for s in shapes] if shapes else None
    displs = offsets_of(counts) if counts else None
    recv = field = None
    with call.local(f"allocating the gathered field {lead + tuple(tiling.whole)} {numpy.dtype(part.dtype).name}"):
        part = xp.ascontiguousarray(part)
        if grid.rank == root:
            recv = xp.empty(sum(counts), dtype=part.dtype)
            field = xp.empty(lead + tuple(tiling.whole), dtype=part.dtype)
    call.agree()
    collectives.gatherv(grid.cart, part.reshape(-1), recv, counts, displs, root=root,
                        staged=backend.is_device_array(part) and not grid.cuda_aware[0])
    if grid.rank != root:
        return None
    for r in range(grid.size):
        tiling.place(field, r, recv[displs[r]:displs[r] + counts[r]].reshape(shapes[r]))
    return field
