"""The 2-D Cartesian grid of MPI ranks that fields on the sphere are spread over.

Latitudes (rows of a ``(..., nlat, nlon)`` field) are split over the polar
axis of the grid, longitudes (columns) over the azimuth axis. The polar axis
is not periodic (there is nothing north of the north pole); the azimuth axis
is (longitude wraps around). Ranks are numbered row-major, so rank ``r`` of
the grid has polar index ``r // nazimuth`` and azimuth index
``r % nazimuth``.
"""

import operator

import numpy
from mpi4py import MPI

from . import backend, collectives
from .partition import check_int, chunk_slice, offsets_of, split_sizes

__all__ = ["ProcessGrid", "GridComm"]


class GridComm(MPI.Cartcomm):
    """A communicator of a :class:`ProcessGrid`: an mpi4py ``Cartcomm`` that knows its grid.

    ``grid.cart``, ``grid.polar`` and ``grid.azimuth`` are instances. They
    behave as the ``Cartcomm`` handles they wrap, and add ``space``: the
    grid's whole communicator, over which the inner products of operators
    built on any of them sum (an operator on ``grid.polar`` runs as one copy
    per column of the grid; together the copies map the whole field).
    """

    @classmethod
    def _wrap(cls, comm, name, space=None):
        wrapped = cls(comm)
        wrapped.space = wrapped if space is None else space
        wrapped.Set_name(name)
        return wrapped


def _grid_dims(size, npolar, nazimuth):
    npolar = None if npolar is None else check_int(npolar, "npolar", "ProcessGrid", minimum=1)
    nazimuth = None if nazimuth is None else check_int(nazimuth, "nazimuth", "ProcessGrid", minimum=1)
    if npolar is None and nazimuth is None:
        npolar, nazimuth = MPI.Compute_dims(size, 2)
    elif npolar is None or nazimuth is None:
        given_name, given = ("npolar", npolar) if nazimuth is None else ("nazimuth", nazimuth)
        if size % given:
            raise ValueError(
                f"ProcessGrid: {given_name}={given} does not divide the communicator size {size}")
        other = size // given
        npolar, nazimuth = (given, other) if nazimuth is None else (other, given)
    if npolar * nazimuth != size:
        raise ValueError(
            f"ProcessGrid: npolar x nazimuth = {npolar} x {nazimuth} = {npolar * nazimuth} ranks, "
            f"but the communicator has {size}")
    return npolar, nazimuth


class ProcessGrid:
    """A ``npolar x nazimuth`` Cartesian grid of ranks over a communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Communicator to build the grid on; default ``MPI.COMM_WORLD``. The
        grid's communicators are new ones (``Create_cart``), so traffic on
        ``comm`` never matches mpisphere's messages.
    npolar, nazimuth : int, optional
        Grid dimensions; their product must equal ``comm``'s size. Either or
        both may be omitted: ``MPI.Compute_dims`` (or the division of the size
        by the one given) fills them in.

    Attributes
    ----------
    cart : GridComm
        Cartesian communicator, dims ``[npolar, nazimuth]``, periods
        ``[False, True]``, ranks in ``comm`` order (no reordering).
    polar : GridComm
        The ranks that share this rank's azimuth index (a column of the grid);
        its rank is :attr:`polar_rank`. Latitude splits use it.
    azimuth : GridComm
        The ranks that share this rank's polar index (a row of the grid); its
        rank is :attr:`azimuth_rank`. Longitude splits use it.
    npolar, nazimuth : int
    polar_rank, azimuth_rank : int
    polar_neighbors : (int, int)
        ``(north, south)`` ranks in :attr:`polar`, ``MPI.PROC_NULL`` past the poles.
    azimuth_neighbors : (int, int)
        ``(west, east)`` ranks in :attr:`azimuth`, periodic.

    Raises
    ------
    ValueError
        If the dims do not multiply to the communicator size or one is not
        positive. Raised on every rank before any collective call.

    Notes
    -----
    Construction is collective over ``comm``. Free the grid with
    :meth:`free` or use it as a context manager.
    """

    def __init__(self, comm=None, npolar=None, nazimuth=None):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"ProcessGrid: comm must be an mpi4py Intracomm, got {type(comm).__name__}")
        self.npolar, self.nazimuth = _grid_dims(comm.Get_size(), npolar, nazimuth)
        self.cart = GridComm._wrap(comm.Create_cart([self.npolar, self.nazimuth], periods=[False, True],
                                                    reorder=False), "grid.cart")
        self.polar = GridComm._wrap(self.cart.Sub([True, False]), "grid.polar", self.cart)
        self.azimuth = GridComm._wrap(self.cart.Sub([False, True]), "grid.azimuth", self.cart)
        self.polar_rank = self.polar.Get_rank()
        self.azimuth_rank = self.azimuth.Get_rank()
        self.rank = self.cart.Get_rank()
        self.size = self.cart.Get_size()
        north = self.polar_rank - 1 if self.polar_rank > 0 else MPI.PROC_NULL
        south = self.polar_rank + 1 if self.polar_rank < self.npolar - 1 else MPI.PROC_NULL
        self.polar_neighbors = (north, south)
        self.azimuth_neighbors = ((self.azimuth_rank - 1) % self.nazimuth,
                                  (self.azimuth_rank + 1) % self.nazimuth)
        self._freed = False
        # One collective decision for the whole grid, so operators on its
        # sub-communicators never need a collective of their own for it.
        collectives.cuda_aware(self.cart)

    @classmethod
    def from_fortran(cls, handle, npolar=None, nazimuth=None):
        """Build a grid from a Fortran ``MPI_Comm`` handle (an integer).

        Use it when a Fortran model owns the communicator, e.g. passed through
        f2py or ctypes as ``comm%MPI_VAL`` / ``INTEGER comm``.
        """
        try:
            handle = operator.index(handle)
        except TypeError:
            raise TypeError(f"ProcessGrid.from_fortran: handle must be an integer, got {handle!r}") from None
        comm = MPI.Intracomm.f2py(handle)
        if comm == MPI.COMM_NULL:
            raise ValueError(f"ProcessGrid.from_fortran: handle {handle} is MPI_COMM_NULL")
        return cls(comm, npolar, nazimuth)

    # --- tiles ---------------------------------------------------------------

    def _check_extents(self, nlat, nlon, who):
        nlat = operator.index(nlat)
        nlon = operator.index(nlon)
        if nlat < self.npolar:
            raise ValueError(
                f"ProcessGrid.{who}: {self.npolar} polar ranks cannot split {nlat} latitudes "
                f"(every rank needs at least one); use at most {nlat} polar ranks")
        if nlon < self.nazimuth:
            raise ValueError(
                f"ProcessGrid.{who}: {self.nazimuth} azimuth ranks cannot split {nlon} longitudes "
                f"(every rank needs at least one); use at most {nlon} azimuth ranks")
        return nlat, nlon

    def lat_sizes(self, nlat):
        """Latitudes held by each polar rank (``split_sizes(nlat, npolar)``)."""
        return split_sizes(self._check_extents(nlat, self.nazimuth, "lat_sizes")[0], self.npolar)

    def lon_sizes(self, nlon):
        """Longitudes held by each azimuth rank (``split_sizes(nlon, nazimuth)``)."""
        return split_sizes(self._check_extents(self.npolar, nlon, "lon_sizes")[1], self.nazimuth)

    def tile_slices(self, nlat, nlon, rank=None):
        """``(lat_slice, lon_slice)`` of grid rank ``rank``'s tile (default: this rank)."""
        nlat, nlon = self._check_extents(nlat, nlon, "tile_slices")
        rank = self.rank if rank is None else operator.index(rank)
        if not 0 <= rank < self.size:
            raise ValueError(f"ProcessGrid.tile_slices: rank {rank} out of range for {self.size} ranks")
        p, a = divmod(rank, self.nazimuth)
        return chunk_slice(nlat, self.npolar, p), chunk_slice(nlon, self.nazimuth, a)

    def local_slices(self, nlat, nlon):
        """``(lat_slice, lon_slice)`` of this rank's tile of a ``(nlat, nlon)`` field."""
        return self.tile_slices(nlat, nlon)

    def local_shape(self, nlat, nlon):
        """``(h, w)``: this rank's tile of a ``(nlat, nlon)`` field."""
        lat, lon = self.local_slices(nlat, nlon)
        return lat.stop - lat.start, lon.stop - lon.start

    # --- whole fields (I/O, tests) ----------------------------------------------

    def scatter(self, field, root=0):
        """Cut a whole field on ``root`` into tiles, one per rank.

        Parameters
        ----------
        field : array, shape ``(..., nlat, nlon)``
            On ``root``: the whole field (NumPy or CuPy; any strides). On the
            other ranks it is ignored (pass ``None``).
        root : int
            Grid rank holding the field.

        Returns
        -------
        array, shape ``(..., h, w)``
            This rank's tile, C-contiguous, in the field's array module
            (NumPy on ranks other than root unless they pass a CuPy array as
            ``field`` to say where the tile should live).
        """
        self._check_alive()
        root = self._check_root(root)
        meta = None
        error = None
        if self.rank == root:
            if field is None or getattr(field, "ndim", 0) < 2:
                error = f"root {root} must pass an array with at least 2 axes, got {type(field).__name__}"
            else:
                meta = (tuple(field.shape), numpy.dtype(field.dtype).str)
                try:
                    self._check_extents(field.shape[-2], field.shape[-1], "scatter")
                except ValueError as exc:
                    error = str(exc)
        meta, error = collectives.bcast_object(self.cart, (meta, error), root=root)
        if error:
            raise ValueError(f"ProcessGrid.scatter: {error}")
        shape, dtype = meta
        lead, nlat, nlon = shape[:-2], shape[-2], shape[-1]
        xp = backend.array_module(field) if field is not None else numpy
        h, w = self.local_shape(nlat, nlon)
        tile = xp.empty(lead + (h, w), dtype=dtype)
        counts, displs, send = [], [], None
        if self.rank == root:
            send = xp.empty(field.size, dtype=dtype)
            start = 0
            for r in range(self.size):
                lat, lon = self.tile_slices(nlat, nlon, r)
                block = field[..., lat, lon]
                send[start:start + block.size].reshape(block.shape)[...] = block
                counts.append(block.size)
                displs.append(start)
                start += block.size
        collectives.scatterv(self.cart, send, counts, displs, tile.reshape(-1), root=root)
        return tile

    def gather(self, tile, root=0):
        """Assemble the tiles of all ranks into the whole field on ``root``.

        Parameters
        ----------
        tile : array, shape ``(..., h, w)``
            This rank's tile; leading shape and dtype equal on all ranks.
        root : int
            Grid rank that receives the field.

        Returns
        -------
        array of shape ``(..., nlat, nlon)`` on ``root``, ``None`` elsewhere.

        Raises
        ------
        ValueError
            On every rank, if the tiles do not fit together as the
            :func:`~mpisphere.partition.split_sizes` tiles of one field.
        """
        self._check_alive()
        root = self._check_root(root)
        mine = (tuple(tile.shape), numpy.dtype(tile.dtype).str) if getattr(tile, "ndim", 0) >= 2 else None
        everyone = collectives.allgather_object(self.cart, mine)
        shape = self._fit_tiles(everyone)
        lead, nlat, nlon = shape[:-2], shape[-2], shape[-1]
        dtype = everyone[0][1]
        xp = backend.array_module(tile)
        tile = xp.ascontiguousarray(tile)
        counts = [int(numpy.prod(s)) for s, _ in everyone]
        displs = offsets_of(counts)
        recv = xp.empty(sum(counts), dtype=dtype) if self.rank == root else None
        collectives.gatherv(self.cart, tile.reshape(-1), recv, counts, displs, root=root)
        if self.rank != root:
            return None
        field = xp.empty(lead + (nlat, nlon), dtype=dtype)
        for r in range(self.size):
            lat, lon = self.tile_slices(nlat, nlon, r)
            field[..., lat, lon] = recv[displs[r]:displs[r] + counts[r]].reshape(everyone[r][0])
        return field

    def _fit_tiles(self, everyone):
        """Global shape from all ranks' ``(shape, dtype)``; ValueError (same on all ranks) if they do not fit."""
        bad = [r for r, m in enumerate(everyone) if m is None]
        if bad:
            raise ValueError(f"ProcessGrid.gather: ranks {bad} passed no array with at least 2 axes")
        lead, dtype = everyone[0][0][:-2], everyone[0][1]
        odd = [r for r, (s, d) in enumerate(everyone) if s[:-2] != lead or d != dtype]
        if odd:
            raise ValueError(
                "ProcessGrid.gather: tiles disagree in leading shape or dtype: rank 0 has "
                f"{everyone[0][0]} {dtype}, "
                + ", ".join(f"rank {r} has {everyone[r][0]} {everyone[r][1]}" for r in odd))
        heights = [everyone[p * self.nazimuth][0][-2] for p in range(self.npolar)]
        widths = [everyone[a][0][-1] for a in range(self.nazimuth)]
        nlat, nlon = sum(heights), sum(widths)
        for r, (s, _) in enumerate(everyone):
            p, a = divmod(r, self.nazimuth)
            expected = (split_sizes(nlat, self.npolar)[p], split_sizes(nlon, self.nazimuth)[a])
            if tuple(s[-2:]) != expected:
                raise ValueError(
                    f"ProcessGrid.gather: rank {r} has a tile of {tuple(s[-2:])}, expected {expected} "
                    f"for a {nlat} x {nlon} field on a {self.npolar} x {self.nazimuth} grid")
        return lead + (nlat, nlon)

    # --- housekeeping ---------------------------------------------------------------

    def _check_root(self, root):
        root = operator.index(root)
        if not 0 <= root < self.size:
            raise ValueError(f"ProcessGrid: root {root} out of range for {self.size} ranks")
        return root

    def _check_alive(self):
        if self._freed:
            raise RuntimeError("ProcessGrid: used after free()")

    def free(self):
        """Free the communicators (collective). Safe to call twice."""
        if self._freed:
            return
        self._freed = True
        if not MPI.Is_finalized():
            for comm in (self.azimuth, self.polar, self.cart):
                comm.Free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    def __repr__(self):
        return (f"ProcessGrid({self.npolar} x {self.nazimuth}, rank {self.rank} at "
                f"(polar {self.polar_rank}, azimuth {self.azimuth_rank}))")
