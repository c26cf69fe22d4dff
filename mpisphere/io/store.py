"""A store of distributed fields: tiles and coefficient blocks in one Zarr v3 directory that xarray opens.

Every rank writes its own share and no rank gathers a field: the pieces of
the tiles move in one all-to-all to the ranks that store each chunk
(:mod:`.chunks`), and reading runs the same steps backwards onto any grid
of any number of ranks. (one job: the store's collective calls)
"""

import math
import os

import numpy

from .. import __version__, backend, collectives
from ..agreement import Call, InputError, collective
from ..dtypes import refusal
from ..quadrature import latitudes, rule
from ..ring_tiles import RingTiles
from ..tiling import RegularTiling
from ..validation import check_choice, check_int
from . import zarr_files
from .chunks import ChunkPlan, Parts, band_rows

__all__ = ["FieldStore"]

_MODES = ("r", "r+", "w", "a")
_PLANE = {"tiles": ("lat", "lon"), "coefficients": ("l", "m"), "points": ("point",)}


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
        meta = parts = expected = None
        with call.local():
            nlat, nlon, found = self._plane_of_tiles(call.who, nlat, nlon, quadrature)
            meta = {"mpisphere": "tiles", "nlat": nlat, "nlon": nlon, "quadrature": found}
            expected = self.grid.local_shape(nlat, nlon)
            parts = Parts.of_grid(self.grid.npolar, self.grid.nazimuth, nlat, nlon)
        self._write(call, name, tile, expected, parts, meta, "tiles", dims, coords, attrs, append, layout=None)

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
        if isinstance(tiling, RegularTiling):
            return self.write_tiles(name, part, *tiling.whole, quadrature, dims=dims, coords=coords, attrs=attrs,
                                    append=append)
        # rings, or anything else: write_points refuses what is not a RingTiles, on every rank
        return self.write_points(name, part, tiling, dims=dims, coords=coords, attrs=attrs, append=append)

    @collective
    def read_field(self, name, tiling, quadrature="equiangular"):
        """This rank's part on ``tiling`` of variable ``name`` (as :meth:`read_tiles` or :meth:`read_points`).

        Collective.
        """
        if isinstance(tiling, RegularTiling):
            return self.read_tiles(name, *tiling.whole, quadrature)
        return self.read_points(name, tiling)

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
        meta = parts = expected = layout = None
        with call.local():
            meta, parts, layout = self._of_transform(sht)
            expected = tuple(sht.block_shape)
        self._write(call, name, block, expected, parts, meta, "coefficients", dims, coords, attrs, append, layout)

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
        meta = parts = expected = None
        with call.local():
            meta, parts = self._of_rings(tiles)
            expected = (tiles.npoints,)
        self._write(call, name, points, expected, parts, meta, "points", dims, coords, attrs, append, layout=None,
                    rings=tiles.rings if isinstance(tiles, RingTiles) else None)

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
        if not isinstance(tiles, RingTiles):
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

    def _check_part(self, part, expected, dims, coords, attrs, kind, name):
        """This rank's findings about a write's arguments; returns ``(host array, dims, coords)``."""
        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") \
                or name in ("lat", "lon", "l", "m"):
            raise InputError(f"name must be a nonempty string without '/', not a coordinate's, got {name!r}",
                             TypeError if not isinstance(name, str) else ValueError)
        if not backend.is_array(part):
            raise InputError(f"expected a NumPy or CuPy array, got {type(part).__name__}", TypeError)
        problem = refusal(part.dtype, "moved")
        if problem is not None:
            raise InputError(problem, TypeError)
        plane = len(expected)
        if part.ndim < plane or tuple(part.shape[-plane:]) != tuple(expected):
            raise InputError(f"expected this rank's {kind} (..., {', '.join(map(str, expected))}), got shape "
                             f"{tuple(part.shape)}")
        lead = tuple(part.shape[:-plane])
        dims = tuple(f"{name}_dim{i}" for i in range(len(lead))) if dims is None else tuple(dims)
        if len(dims) != len(lead) or not all(isinstance(d, str) and d for d in dims) or \
                len(set(dims)) != len(dims) or set(dims) & set(_PLANE[kind]):
            raise InputError(f"dims must name the {len(lead)} leading axes once each (not "
                             f"{', '.join(_PLANE[kind])}), got {dims!r}")
        shaped = {}
        for dim, given in (coords or {}).items():
            values, extra = given if isinstance(given, tuple) else (given, {})
            values = numpy.asarray(values)
            if dim not in dims or values.ndim != 1 or len(values) != lead[dims.index(dim)] or \
                    values.dtype.kind not in "iuf":
                raise InputError(f"coords[{dim!r}] must be numbers along a leading axis of {dims!r} "
                                 f"({dict(zip(dims, lead))}), got {values.dtype} of shape {values.shape}")
            shaped[dim] = (values, zarr_files.json_safe(dict(extra), f"the attributes of coords[{dim!r}]"))
        zarr_files.json_safe(attrs or {}, "attrs")
        host = part.get() if backend.is_device_array(part) else numpy.asarray(part)
        return numpy.ascontiguousarray(host), dims, shaped

    def _write(self, call, name, part, expected, parts, meta, kind, dims, coords, attrs, append, layout, rings=None):
        """The steps of a write, after the caller's own checks (in ``call``): agree, create, move, write, finish."""
        host, lead, shaped = None, None, {}
        if call.error is None:
            with call.local():
                self._check_writable()
                host, dims, shaped = self._check_part(part, expected, dims, coords, attrs, kind, name)
                lead = tuple(host.shape[:host.ndim - len(expected)])
                if append and not lead:
                    raise InputError("append=True extends the first leading axis; the field has none")
        # what every rank must hold alike, by value (attrs in any key order); the layout of coefficient blocks
        # decides which columns each rank's part holds
        call.agree(write=name, meta=meta, layout=layout, lead=lead, dtype=None if host is None else host.dtype,
                   dims=dims, coords={d: v[0] for d, v in shaped.items()}, attrs=attrs, append=append)
        dtype = host.dtype
        full_meta = {**meta, "grid_shape": [self.grid.npolar, self.grid.nazimuth], "complete": False}
        lead_offset = call.root(lambda: self._prepare(name, kind, meta, full_meta, lead, dtype, dims, shaped, attrs,
                                                      append, parts, rings), f"cannot create {name!r} in {self.path!r}")
        flat = kind == "points"  # a 1-D plane: the plan's (rows, 1) regions are stored as (rows,)
        exchange = None
        with call.local(f"cannot write {name!r} to {self.path!r}"):  # every buffer allocated before the data moves
            array = zarr_files.open_array(self.path, name)
            plan = ChunkPlan(parts, lead, int(array.chunks[-1 if flat else -2]), lead_offset)
            exchange = _Exchange(plan, self.grid.rank, dtype, to_owners=True)
        call.agree()
        regions = exchange.to_owners(self._comm, host.reshape((math.prod(lead),) + parts.shape(self.grid.rank)))
        with call.local(f"cannot write {name!r} to {self.path!r}"):
            mine = plan.regions(self.grid.rank)
            for region, data in zip(mine, regions):
                array[_stored(plan.selection(region), flat)] = data[:, 0] if flat else data
            if self.durable:
                zarr_files.sync_files([f for _, f in zarr_files.chunk_files(
                    self.path, name, array, [_stored(plan.selection(r), flat) for r in mine])])
        call.agree()

        def finish():
            finished = zarr_files.open_array(self.path, name)
            finished.attrs["mpisphere"] = {**finished.attrs["mpisphere"], "complete": True}
            zarr_files.consolidate(self.path)
            self._sync_metadata()
        call.root(finish, f"cannot finish {name!r} in {self.path!r}")

    def _prepare(self, name, kind, meta, full_meta, lead, dtype, dims, coords, attrs, append, parts, rings=None):
        """Rank 0: the coordinates and the variable's metadata; returns the first leading index to write."""
        group = zarr_files.open_group(self.path, "r+")
        self._write_plane_coordinates(group, kind, meta, rings)
        plane = _PLANE[kind]
        flat = kind == "points"
        shape = lead + ((parts.n0,) if flat else (parts.n0, parts.n1))
        exists = name in group and "mpisphere" in group[name].attrs
        if append and exists:
            array = group[name]
            old = dict(array.attrs["mpisphere"])
            old_meta = {k: old.get(k) for k in meta}
            if old_meta != meta or tuple(array.shape[1:]) != shape[1:] or numpy.dtype(array.dtype) != dtype \
                    or tuple(array.metadata.dimension_names) != dims + plane:
                raise InputError(f"cannot append: {name!r} holds {tuple(array.shape)} {array.dtype} "
                                 f"{array.metadata.dimension_names} {old_meta}, the new part is "
                                 f"{shape} {dtype} {dims + plane} {meta}")
            if not old.get("complete"):
                raise InputError(f"cannot append to {name!r}: an earlier write did not finish")
            offset = int(array.shape[0])
            array.attrs["mpisphere"] = {**old, "complete": False}
            array.resize((offset + shape[0],) + shape[1:])
        else:
            offset = 0
            rows = band_rows(parts.n0, parts.n1, dtype.itemsize, math.prod(lead), self.grid.size)
            chunks = (1,) * len(lead) + ((rows,) if flat else (rows, parts.n1))
            cf = {"coordinates": "lat lon"} if flat else {}  # the points' latitude and longitude (CF)
            zarr_files.create_array(group, name, shape, chunks, dtype, dims + plane,
                                    {**(attrs or {}), **cf, "mpisphere": full_meta})
        for dim, (values, extra) in coords.items():
            self._write_lead_coordinate(group, dim, values, extra, offset if dims.index(dim) == 0 else 0,
                                        append and exists and dims.index(dim) == 0)
        return offset

    @staticmethod
    def _write_lead_coordinate(group, dim, values, extra, offset, extend):
        if dim in group and extend:
            array = group[dim]
            array.resize((offset + len(values),))
            array[offset:] = values
            return
        if dim in group and not extend:
            old = numpy.asarray(group[dim][...])
            if old.shape == values.shape and numpy.array_equal(old, values):
                return
        zarr_files.create_array(group, dim, values.shape, (max(1, len(values)),), values.dtype, (dim,), extra)
        group[dim][...] = values

    def _write_plane_coordinates(self, group, kind, meta, rings=None):
        if kind == "points":
            values = {"lat": (90.0 - numpy.degrees(rings.colatitudes), {
                          "units": "degrees_north", "standard_name": "latitude", "long_name": "latitude",
                          "grid": rings.name}),
                      "lon": (numpy.degrees(rings.longitudes), {
                          "units": "degrees_east", "standard_name": "longitude", "long_name": "longitude"})}
            dimension = {"lat": ("point",), "lon": ("point",)}
        elif kind == "tiles":
            theta, _ = latitudes(meta["nlat"], meta["quadrature"])
            values = {"lat": (90.0 - numpy.degrees(theta), {
                          "units": "degrees_north", "standard_name": "latitude", "long_name": "latitude",
                          "axis": "Y", "quadrature": meta["quadrature"]}),
                      "lon": (360.0 * numpy.arange(meta["nlon"]) / meta["nlon"], {
                          "units": "degrees_east", "standard_name": "longitude", "long_name": "longitude",
                          "axis": "X"})}
        else:
            values = {"l": (numpy.arange(meta["lmax"]), {"long_name": "spherical harmonic degree"}),
                      "m": (numpy.arange(meta["mmax"]), {"long_name": "spherical harmonic order"})}
        if kind != "points":
            dimension = {dim: (dim,) for dim in values}
        for dim, (v, extra) in values.items():
            if dim in group:
                old = numpy.asarray(group[dim][...])
                if old.shape != v.shape or not numpy.allclose(old, v, rtol=0, atol=1e-12):
                    rule_of = group[dim].attrs.get("quadrature", "")
                    raise InputError(f"the store's {dim!r} has {old.size} points{' of ' + rule_of if rule_of else ''}"
                                     f", this {kind} {v.size}{' of ' + meta['quadrature'] if kind == 'tiles' else ''}"
                                     ": one store holds one grid; write this one to another store")
                continue
            zarr_files.create_array(group, dim, v.shape, v.shape, v.dtype, dimension[dim], extra)
            group[dim][...] = v

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
            missing = zarr_files.missing_chunks(self.path, name, array, [_stored(plan.selection(r), flat)
                                                                         for r in mine])
            if missing:
                raise InputError(f"{len(missing)} chunk file(s) of {name!r} are missing (a truncated or damaged "
                                 f"store): {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
            regions = [numpy.ascontiguousarray(array[_stored(plan.selection(r), flat)]).reshape(plan.region_shape(r))
                       for r in mine]
            part = numpy.empty((math.prod(lead),) + parts.shape(self.grid.rank), dtype)
            exchange = _Exchange(plan, self.grid.rank, dtype, to_owners=False)
        call.agree()
        exchange.from_owners(self._comm, regions, part)
        return part.reshape(lead + (part.shape[1:2] if flat else part.shape[1:]))

    def __repr__(self):
        return f"FieldStore({self.path!r}, {self.grid!r}, mode={self.mode!r})"


class _Exchange:
    """The buffers of one all-to-all between the ranks' parts and the chunks' owners, allocated up front.

    Made inside the call's local step, so that a rank that cannot allocate
    them raises with the others before any rank enters the all-to-all.
    """

    def __init__(self, plan, rank, dtype, to_owners):
        self.plan, self.rank = plan, rank
        parts_side, owners_side = plan.counts_to_owners(rank), plan.counts_from_parts(rank)
        self.send_counts, self.recv_counts = (parts_side, owners_side) if to_owners else (owners_side, parts_side)
        self.send = numpy.empty(sum(self.send_counts), dtype)
        self.recv = numpy.empty(sum(self.recv_counts), dtype)
        self.regions = [numpy.empty(plan.region_shape(r), dtype) for r in plan.regions(rank)] if to_owners else None

    def _alltoallv(self, comm):
        collectives.alltoallv(comm, self.send, self.send_counts, _displacements(self.send_counts), self.recv,
                              self.recv_counts, _displacements(self.recv_counts))

    def to_owners(self, comm, part):
        """The owners' regions, assembled from every rank's ``part`` (``(lead_size, rows, cols)``)."""
        self.plan.pack_parts(self.rank, part, self.send)
        self._alltoallv(comm)
        self.plan.copy_own(self.rank, part, self.regions)
        self.plan.unpack_regions(self.rank, self.recv, self.regions)
        return self.regions

    def from_owners(self, comm, regions, part):
        """Every rank's ``part``, from the owners' ``regions``."""
        self.plan.pack_regions(self.rank, regions, self.send)
        self.plan.copy_own(self.rank, part, regions, to_regions=False)
        self._alltoallv(comm)
        self.plan.unpack_parts(self.rank, self.recv, part)


def _stored(selection, flat):
    """A plan's selection ``(lead..., rows, columns)`` in the stored array (points: no column axis)."""
    return selection[:-1] if flat else selection


def _displacements(counts):
    return numpy.concatenate([[0], numpy.cumsum(counts)[:-1]]).astype(numpy.int64) if counts else []
