"""A store of distributed fields: tiles and coefficient blocks in one Zarr v3 directory that xarray opens.

Every rank writes its own share and no rank gathers a field: the pieces of
the tiles move in one all-to-all to the ranks that store each chunk
(:mod:`.chunks`), and reading runs the same steps backwards onto any grid
of any number of ranks. (one job: the store's collective calls)
"""

import math
import os

import numpy

from .. import __version__
from ..agreement import Call, InputError, collective
from ..quadrature import rule
from ..ring_tiles import is_ring_tiles
from ..tiling import Tiling
from ..validation import check_choice, check_int
from . import zarr_files
from .chunks import ChunkPlan, Parts
from .owners import OwnerExchange, stored_selection
from .variables import WriteRequest, check_write, prepare

__all__ = ["FieldStore"]

_MODES = ("r", "r+", "w", "a")


class FieldStore:
    """A Zarr v3 store of distributed fields, opened collectively by the ranks of a grid.

    Parameters
    ----------
    path : str or os.PathLike
        A directory every rank sees (a parallel filesystem on a cluster).
    grid : ProcessGrid
        The ranks that write and read; every method is collective over
        ``grid.cart``.
    mode : {"r", "r+", "w", "a"}
        ``"r"`` read an existing store, ``"r+"`` read and write one, ``"w"``
        create (replacing what is there), ``"a"`` open or create.
    durable : bool, keyword-only
        Sync every file written (chunks, metadata and their folders) to the
        disk before a write returns, not only to the page cache: what a
        checkpoint needs to survive a node that loses power, at the cost of
        one ``fsync`` per file. Off by default; :func:`checkpoint` turns it
        on.

    Notes
    -----
    Variables are named arrays of the store, ``(*lead, nlat, nlon)`` for
    tiles and ``(*lead, lmax, mmax)`` for coefficients (orders in increasing
    global order, whatever the writer's order layout), chunked in bands of
    whole rows, one leading index deep: each chunk is one file with a
    CRC-32C checksum that every read verifies. Coordinates follow the CF
    conventions (``lat`` in ``degrees_north``, ``lon`` in ``degrees_east``,
    ``l`` and ``m`` the degree and order), so ``xarray.open_zarr(path)``
    opens the store on one process without mpisphere. A variable is marked
    complete when its last chunk is written; reading an incomplete one, a
    chunk whose checksum fails, or a missing chunk raises on every rank.

    Every error (bad input on one rank, a file that cannot be written or
    read) is raised on every rank with the rank that found it.
    """

    def __init__(self, path, grid, mode="r", *, durable=False):
        self.path = os.fspath(path)
        self.grid = grid
        self.mode = mode
        self.durable = bool(durable)
        self._comm = grid.cart
        with grid.holding("FieldStore"):
            self._open(mode)

    def _open(self, mode):
        call = Call(self._comm, f"FieldStore({self.path!r}, mode={mode!r})")
        with call.local():
            self.mode = check_choice(mode, _MODES, "mode", "FieldStore")
            zarr_files.import_zarr()
        # one store: the same path and mode on every rank (a store opened "w" on some ranks and "r" on others
        # would be replaced under the readers' feet)
        call.agree(path=self.path, mode=mode, durable=self.durable)

        def create():
            group = zarr_files.open_group(self.path, {"r": "r", "r+": "r", "w": "w", "a": "a"}[mode])
            if mode in ("w", "a") and "mpisphere" not in group.attrs:
                group.attrs.update({"mpisphere": {"version": __version__, "format": 1}, "Conventions": "CF-1.10"})
                zarr_files.consolidate(self.path)
        call.root(create, f"cannot open {self.path!r} with mode {mode!r}")

    # --- what is in the store --------------------------------------------------------------------

    @collective
    def variables(self):
        """Names of the field variables (tiles and coefficients) in the store, sorted. Collective."""
        def names():
            group = zarr_files.open_group(self.path, "r")
            return sorted(name for name, a in group.arrays() if "mpisphere" in a.attrs)
        return Call(self._comm, "FieldStore.variables").root(names, "cannot list the store")

    @collective
    def attrs(self, name=None):
        """The attributes of the store (``name=None``) or of variable ``name``, a dict. Collective."""
        call = Call(self._comm, "FieldStore.attrs")
        call.agree(name=name)

        def read():
            if name is None:
                return dict(zarr_files.open_group(self.path, "r").attrs)
            return dict(zarr_files.open_array(self.path, name).attrs)
        return call.root(read, f"cannot read the attributes of {name or 'the store'}")

    @collective
    def set_attrs(self, attrs):
        """Add ``attrs`` (JSON) to the store's attributes. Collective; rank 0 writes.

        Every rank must pass equal ``attrs`` (compared by value: the key
        order does not matter); differing ones raise on every rank.
        """
        call = Call(self._comm, "FieldStore.set_attrs")
        with call.local():
            self._check_writable()
            if not isinstance(attrs, dict):
                raise TypeError(f"attrs must be a dict, got {type(attrs).__name__}")
            zarr_files.json_safe(attrs, "attrs")
        call.agree(attrs=attrs if call.error is None else None)

        def write():
            zarr_files.open_group(self.path, "r+").attrs.update(attrs)
            zarr_files.consolidate(self.path)
            self._sync_metadata()
        call.root(write, f"cannot write the attributes of {self.path!r}")

    def _sync_metadata(self):
        """Rank 0, ``durable``: sync the metadata files (the root's, with the consolidated copy, and each array's)."""
        if self.durable:
            zarr_files.sync_files([os.path.join(root, "zarr.json") for root, _, files in os.walk(self.path)
                                   if "zarr.json" in files])

    def _check_writable(self):
        if self.mode == "r":
            raise InputError(f"the store {self.path!r} is open read-only (mode='r')", PermissionError)

    # --- tiles ----------------------------------------------------------------------------------

    @collective
    def write_tiles(self, name, tile, nlat, nlon, quadrature="equiangular", *, dims=None, coords=None,
                    attrs=None, append=False):
        """Write this rank's tile of a distributed field as variable ``name``. Collective.

        Parameters
        ----------
        name : str
        tile : array, shape ``(*lead, h, w)``
            This rank's tile of the ``(*lead, nlat, nlon)`` field (NumPy, or
            CuPy: copied to the host first); float16/32/64 or complex64/128.
        nlat, nlon : int
        quadrature : str
            The latitude rule (``"equiangular"``, ``"legendre-gauss"``, ...):
            the ``lat`` coordinate and what a reader must match.
        dims : sequence of str, optional
            Names of the leading axes (default ``name_dim0``, ...).
        coords : dict, optional
            Values of leading coordinates, ``{dim: 1-D values}`` (stored as
            coordinate variables); ``{dim: (values, attrs)}`` adds their
            attributes (``units``, ...).
        attrs : dict, optional
            The variable's own attributes (JSON).
        append : bool
            Extend an existing variable along its first axis instead of
            replacing it (a time series written once a day); its other axes,
            grid and dtype must match.
        """
        call = Call(self._comm, f"FieldStore.write_tiles({name!r})")
        request = WriteRequest(name, "tiles", dims=dims, coords=coords, attrs=attrs, append=append)
        with call.local():
            nlat, nlon, found = self._plane_of_tiles(call.who, nlat, nlon, quadrature)
            request.meta = {"mpisphere": "tiles", "nlat": nlat, "nlon": nlon, "quadrature": found}
            request.expected = self.grid.local_shape(nlat, nlon)
            request.parts = Parts.of_grid(self.grid.npolar, self.grid.nazimuth, nlat, nlon)
        self._write(call, request, tile)

    @collective
    def read_tiles(self, name, nlat, nlon, quadrature="equiangular"):
        """This rank's tile ``(*lead, h, w)`` of variable ``name``, on this store's grid (any shape). Collective.

        Refused on every rank when the variable is not tiles of an ``nlat x
        nlon`` grid of ``quadrature``'s latitudes. Returns a NumPy array of
        the stored dtype.
        """
        call = Call(self._comm, f"FieldStore.read_tiles({name!r})")
        meta = parts = None
        with call.local():
            nlat, nlon, found = self._plane_of_tiles(call.who, nlat, nlon, quadrature)
            meta = {"mpisphere": "tiles", "nlat": nlat, "nlon": nlon, "quadrature": found}
            parts = Parts.of_grid(self.grid.npolar, self.grid.nazimuth, nlat, nlon)
        call.agree(read=name, meta=meta)
        return self._read(call, name, parts, meta)

    @staticmethod
    def _plane_of_tiles(who, nlat, nlon, quadrature):
        nlat = check_int(nlat, "nlat", who, minimum=1)
        nlon = check_int(nlon, "nlon", who, minimum=1)
        return nlat, nlon, rule(quadrature).name

    # --- any tiling -----------------------------------------------------------------------------------

    @collective
    def write_field(self, name, part, tiling, quadrature="equiangular", *, dims=None, coords=None, attrs=None,
                    append=False):
        """Write this rank's part of a field on ``tiling`` as variable ``name``. Collective.

        ``tiling``: ``grid.tiling(nlat, nlon)`` (tiles, stored as :meth:`write_tiles` stores them, with
        ``quadrature``'s latitudes) or a :class:`~mpisphere.RingTiles` (points, as :meth:`write_points`).
        The other arguments as in :meth:`write_tiles`.
        """
        if not isinstance(tiling, Tiling):  # write_points refuses it on every rank, naming what it takes
            return self.write_points(name, part, tiling, dims=dims, coords=coords, attrs=attrs, append=append)
        return tiling.write_to(self, name, part, quadrature, dims=dims, coords=coords, attrs=attrs, append=append)

    @collective
    def read_field(self, name, tiling, quadrature="equiangular"):
        """This rank's part on ``tiling`` of variable ``name`` (as :meth:`read_tiles` or :meth:`read_points`).

        Collective.
        """
        if not isinstance(tiling, Tiling):
            return self.read_points(name, tiling)
        return tiling.read_from(self, name, quadrature)

    # --- coefficients -------------------------------------------------------------------------------

    @collective
    def write_coefficients(self, name, block, sht, *, dims=None, coords=None, attrs=None, append=False):
        """Write this rank's coefficient block as variable ``name`` (orders stored in global order). Collective.

        Parameters
        ----------
        block : array, shape ``(*lead, l_loc, m_loc)``
            This rank's block of ``sht``'s coefficients, in either order
            layout (a vector transform's ``(..., 2, l_loc, m_loc)`` too: the
            component axis is a leading axis; name it in ``dims``).
        sht : a distributed transform
            Any of the four transforms of the grid the block is on: its
            truncation, norm, Condon-Shortley phase and quadrature are stored
            with the variable, and a reader must match them.
        dims, coords, attrs, append
            As in :meth:`write_tiles`.
        """
        call = Call(self._comm, f"FieldStore.write_coefficients({name!r})")
        request = WriteRequest(name, "coefficients", dims=dims, coords=coords, attrs=attrs, append=append)
        with call.local():
            request.meta, request.parts, request.layout = self._of_transform(sht)
            request.expected = tuple(sht.block_shape)
        self._write(call, request, block)

    @collective
    def read_coefficients(self, name, sht):
        """This rank's block ``(*lead, l_loc, m_loc)`` of variable ``name``, in ``sht``'s order layout. Collective.

        Refused on every rank when the stored truncation, norm,
        Condon-Shortley phase, quadrature or grid differ from ``sht``'s.
        """
        call = Call(self._comm, f"FieldStore.read_coefficients({name!r})")
        meta = parts = layout = None
        with call.local():
            meta, parts, layout = self._of_transform(sht)
        # the order layout decides which columns each rank reads: ranks with different layouts must not read
        call.agree(read=name, meta=meta, layout=layout)
        return self._read(call, name, parts, meta)

    def _of_transform(self, sht):
        """``(meta, parts, order layout)`` of ``sht``'s coefficient blocks; a TypeError for anything else."""
        try:
            # the order layout (as the blocks hold it) decides which columns each rank's block holds
            return self._coefficient_meta(sht), self._coefficient_parts(sht), sht.spectral_layout.blocks
        except (AttributeError, TypeError, ValueError) as exc:
            raise InputError(f"sht must be a distributed transform of this store's grid: {exc}", TypeError) from None

    def _coefficient_meta(self, sht):
        if sht.grid.cart.Get_size() != self.grid.size or (sht.grid.npolar, sht.grid.nazimuth) != \
                (self.grid.npolar, self.grid.nazimuth):
            raise ValueError(f"the transform's grid is {sht.grid.npolar} x {sht.grid.nazimuth}, the store's "
                             f"{self.grid.npolar} x {self.grid.nazimuth}")
        return {"mpisphere": "coefficients", "lmax": int(sht.lmax), "mmax": int(sht.mmax), "norm": sht.norm,
                "csphase": bool(sht.csphase), "quadrature": sht.quadrature, "nlat": int(sht.nlat),
                "nlon": int(sht.nlon)}

    def _coefficient_parts(self, sht):
        from ..sht.orders import order_assignment
        assignment = order_assignment(sht.mmax, sht.lmax, self.grid.nazimuth, sht.orders)
        return Parts.of_grid(self.grid.npolar, self.grid.nazimuth, sht.lmax, sht.mmax, assignment)

    # --- points of a reduced grid ---------------------------------------------------------------------

    @collective
    def write_points(self, name, points, tiles, *, dims=None, coords=None, attrs=None, append=False):
        """Write this rank's points ``(*lead, tiles.npoints)`` of a ring-grid field as variable ``name``. Collective.

        Stored as ``(*lead, point)``, the whole grid's points ring after ring,
        with ``lat`` and ``lon`` coordinates per point (CF ``coordinates``), so
        xarray opens it. ``tiles``: the :class:`~mpisphere.RingTiles` of the
        store's grid that says which points this rank holds. ``dims``,
        ``coords``, ``attrs``, ``append`` as in :meth:`write_tiles`.
        """
        call = Call(self._comm, f"FieldStore.write_points({name!r})")
        request = WriteRequest(name, "points", dims=dims, coords=coords, attrs=attrs, append=append)
        with call.local():
            request.meta, request.parts = self._of_rings(tiles)
            request.expected, request.rings = (tiles.npoints,), tiles.rings
        self._write(call, request, points)

    @collective
    def read_points(self, name, tiles):
        """This rank's points ``(*lead, tiles.npoints)`` of variable ``name``, on this store's grid. Collective.

        Refused on every rank when the variable holds another grid's points.
        """
        call = Call(self._comm, f"FieldStore.read_points({name!r})")
        meta = parts = None
        with call.local():
            meta, parts = self._of_rings(tiles)
        call.agree(read=name, meta=meta)
        return self._read(call, name, parts, meta)

    def _of_rings(self, tiles):
        """``(meta, parts)`` of a ring grid's points: each rank's part is a set of rows of an ``(npoints, 1)`` plane."""
        if not is_ring_tiles(tiles):
            raise InputError(f"tiles must be the RingTiles of the field's rings (or, for write_field and read_field, "
                             f"a grid.tiling(nlat, nlon)), got {type(tiles).__name__}",
                             TypeError)
        if tiles.grid.size != self.grid.size or (tiles.grid.npolar, tiles.grid.nazimuth) != \
                (self.grid.npolar, self.grid.nazimuth):
            raise InputError(f"the tiles' grid is {tiles.grid.npolar} x {tiles.grid.nazimuth}, the store's "
                             f"{self.grid.npolar} x {self.grid.nazimuth}")
        rings = tiles.rings
        meta = {"mpisphere": "points", "rings": repr(rings), "npoints": int(rings.npoints)}
        parts = Parts(rings.npoints, 1, [tiles.point_indices(r) for r in range(self.grid.size)],
                      [numpy.zeros(1, numpy.int64)] * self.grid.size)
        return meta, parts

    # --- the two directions ----------------------------------------------------------------------

    def _write(self, call, request, part):
        """The steps of a write, after the caller's own checks (in ``call``): agree, create, move, write, finish."""
        host = None
        if call.error is None:
            with call.local():
                self._check_writable()
                host, request.dims, request.shaped = check_write(request, part)
                request.lead = tuple(host.shape[:host.ndim - len(request.expected)])
                if request.append and not request.lead:
                    raise InputError("append=True extends the first leading axis; the field has none")
        # what every rank must hold alike, by value (attrs in any key order); the layout of coefficient blocks
        # decides which columns each rank's part holds
        name, parts, lead = request.name, request.parts, request.lead
        call.agree(write=name, meta=request.meta, layout=request.layout, lead=lead,
                   dtype=None if host is None else host.dtype, dims=request.dims,
                   coords={d: v[0] for d, v in request.shaped.items()}, attrs=request.attrs, append=request.append)
        request.dtype = host.dtype
        lead_offset = call.root(lambda: prepare(self.path, self.grid, request), f"cannot create {name!r} in "
                                f"{self.path!r}")
        flat = request.kind == "points"  # a 1-D plane: the plan's (rows, 1) regions are stored as (rows,)
        exchange = None
        with call.local(f"cannot write {name!r} to {self.path!r}"):  # every buffer allocated before the data moves
            array = zarr_files.open_array(self.path, name)
            plan = ChunkPlan(parts, lead, int(array.chunks[-1 if flat else -2]), lead_offset)
            exchange = OwnerExchange(plan, self.grid.rank, host.dtype, to_owners=True)
        call.agree()
        regions = exchange.to_owners(self._comm, host.reshape((math.prod(lead),) + parts.shape(self.grid.rank)))
        with call.local(f"cannot write {name!r} to {self.path!r}"):
            mine = plan.regions(self.grid.rank)
            for region, data in zip(mine, regions):
                array[stored_selection(plan.selection(region), flat)] = data[:, 0] if flat else data
            if self.durable:
                zarr_files.sync_files([f for _, f in zarr_files.chunk_files(
                    self.path, name, array, [stored_selection(plan.selection(r), flat) for r in mine])])
        call.agree()

        def finish():
            finished = zarr_files.open_array(self.path, name)
            finished.attrs["mpisphere"] = {**finished.attrs["mpisphere"], "complete": True}
            zarr_files.consolidate(self.path)
            self._sync_metadata()
        call.root(finish, f"cannot finish {name!r} in {self.path!r}")

    def _read(self, call, name, parts, expect):
        """The steps of a read, after the agreement on what to read: open and check, read chunks, move."""
        array, lead, rows = None, (), 1
        with call.local(f"cannot open {name!r} in {self.path!r}"):
            try:
                array = zarr_files.open_array(self.path, name)
            except KeyError:
                raise InputError(f"no variable {name!r} in {self.path!r}") from None
            stored = dict(array.attrs.get("mpisphere", {}))
            if not stored:
                raise InputError(f"{name!r} was not written by mpisphere.io (no 'mpisphere' attribute)")
            differ = {k: (stored.get(k), v) for k, v in expect.items() if stored.get(k) != v}
            if differ:
                raise InputError("the stored variable does not fit the reader: " + ", ".join(
                    f"{k} is {s!r} in the store, {v!r} here" for k, (s, v) in differ.items()))
            if not stored.get("complete"):
                raise InputError(f"{name!r} is incomplete: a write of it did not finish (interrupted?)")
            flat = stored.get("mpisphere") == "points"
            lead = tuple(int(n) for n in array.shape[:-1 if flat else -2])
            rows = int(array.chunks[-1 if flat else -2])
            if tuple(array.chunks) != (1,) * len(lead) + ((rows,) if flat else (rows, parts.n1)):
                raise InputError(f"{name!r} has chunks {array.chunks}, not mpisphere's bands of whole rows")
        call.agree()
        plan = ChunkPlan(parts, lead, rows)
        dtype = numpy.dtype(array.dtype)
        regions = part = exchange = None
        with call.local(f"cannot read {name!r} from {self.path!r}"):  # buffers allocated before the data moves
            mine = plan.regions(self.grid.rank)
            missing = zarr_files.missing_chunks(self.path, name, array, [stored_selection(plan.selection(r), flat)
                                                                         for r in mine])
            if missing:
                raise InputError(f"{len(missing)} chunk file(s) of {name!r} are missing (a truncated or damaged "
                                 f"store): {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
            regions = [numpy.ascontiguousarray(array[stored_selection(plan.selection(r), flat)])
                       .reshape(plan.region_shape(r)) for r in mine]
            part = numpy.empty((math.prod(lead),) + parts.shape(self.grid.rank), dtype)
            exchange = OwnerExchange(plan, self.grid.rank, dtype, to_owners=False)
        call.agree()
        exchange.from_owners(self._comm, regions, part)
        return part.reshape(lead + (part.shape[1:2] if flat else part.shape[1:]))

    def __repr__(self):
        return f"FieldStore({self.path!r}, {self.grid!r}, mode={self.mode!r})"


