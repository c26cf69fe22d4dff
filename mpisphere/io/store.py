"""A store of distributed fields: tiles and coefficient blocks in one Zarr v3 directory that xarray opens.

Every rank writes its own share and no rank gathers a field: the pieces of
the tiles move in one all-to-all to the ranks that store each chunk
(:mod:`.chunks`), and reading runs the same steps backwards onto any grid
of any number of ranks. (one job: the store's collective calls)
"""

import functools
import math
import os

import numpy

from .. import __version__, backend, collectives
from ..agreement import InputError, settle
from ..dtypes import refusal
from ..quadrature import latitudes, rule
from ..validation import check_choice, check_int
from . import zarr_files
from .chunks import ChunkPlan, Parts, band_rows

__all__ = ["FieldStore"]

_MODES = ("r", "r+", "w", "a")
_PLANE = {"tiles": ("lat", "lon"), "coefficients": ("l", "m")}


def _collective(method):
    """Run a store's method holding its grid's guard (a second thread's call is refused on every rank)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.grid.holding(f"FieldStore.{method.__name__}"):
            return method(self, *args, **kwargs)
    return call


def _finding(exc, what):
    """An exception raised on this rank as an :class:`InputError` naming ``what`` was being done."""
    if isinstance(exc, InputError):
        return exc
    kind = type(exc) if isinstance(exc, (OSError, TypeError, MemoryError)) else ValueError
    return InputError(f"{what}: {type(exc).__name__}: {exc}", kind)


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
        self.mode = check_choice(mode, _MODES, "mode", "FieldStore")
        self.durable = bool(durable)
        self._comm = grid.cart
        with grid.holding("FieldStore"):
            self._open(mode)

    def _open(self, mode):
        who = f"FieldStore({self.path!r}, mode={mode!r})"
        error = None
        try:
            zarr_files.import_zarr()
        except ImportError as exc:
            error = InputError(str(exc), ImportError)
        self._settle(who, error, f"open {self.path} {mode}")
        if self.grid.rank == 0:
            try:
                group = zarr_files.open_group(self.path, {"r": "r", "r+": "r", "w": "w", "a": "a"}[mode])
                if mode in ("w", "a") and "mpisphere" not in group.attrs:
                    group.attrs.update({"mpisphere": {"version": __version__, "format": 1},
                                        "Conventions": "CF-1.10"})
                    zarr_files.consolidate(self.path)
            except Exception as exc:  # noqa: BLE001 -- every failure is this rank's finding, raised everywhere
                error = _finding(exc, f"cannot open {self.path!r} with mode {mode!r}")
        self._settle(who, error, f"open {self.path} {mode}")

    # --- errors ----------------------------------------------------------------------------

    def _settle(self, who, error, description=""):
        settle(self._comm, who, error, description)

    def _on_root(self, who, what, fn):
        """Run ``fn()`` on rank 0 and raise its failure on every rank."""
        error = None
        if self.grid.rank == 0:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                error = _finding(exc, what)
        self._settle(who, error)

    # --- what is in the store --------------------------------------------------------------------

    @_collective
    def variables(self):
        """Names of the field variables (tiles and coefficients) in the store, sorted. Collective."""
        def names():
            group = zarr_files.open_group(self.path, "r")
            return sorted(name for name, a in group.arrays() if "mpisphere" in a.attrs)
        return self._everywhere("FieldStore.variables", "cannot list the store", names)

    @_collective
    def attrs(self, name=None):
        """The attributes of the store (``name=None``) or of variable ``name``, a dict. Collective."""
        def read():
            if name is None:
                return dict(zarr_files.open_group(self.path, "r").attrs)
            return dict(zarr_files.open_array(self.path, name).attrs)
        return self._everywhere("FieldStore.attrs", f"cannot read the attributes of {name or 'the store'}", read)

    @_collective
    def set_attrs(self, attrs):
        """Add ``attrs`` (JSON) to the store's attributes. Collective; rank 0 writes."""
        who = "FieldStore.set_attrs"
        error = self._writable(who)
        try:
            zarr_files.json_safe(attrs, "attrs")
        except TypeError as exc:
            error = error or InputError(str(exc), TypeError)
        self._settle(who, error, f"set_attrs {sorted(attrs) if isinstance(attrs, dict) else attrs!r}")

        def write():
            zarr_files.open_group(self.path, "r+").attrs.update(attrs)
            zarr_files.consolidate(self.path)
            self._sync_metadata()
        self._on_root(who, f"cannot write the attributes of {self.path!r}", write)

    def _sync_metadata(self):
        """Rank 0, ``durable``: sync the metadata files (the root's, with the consolidated copy, and each array's)."""
        if self.durable:
            zarr_files.sync_files([os.path.join(root, "zarr.json") for root, _, files in os.walk(self.path)
                                   if "zarr.json" in files])

    def _everywhere(self, who, what, fn):
        """``fn()`` on rank 0, its result on every rank, its failure raised on every rank."""
        value, error = None, None
        if self.grid.rank == 0:
            try:
                value = fn()
            except Exception as exc:  # noqa: BLE001
                error = _finding(exc, what)
        self._settle(who, error)
        return collectives.bcast_object(self._comm, value)

    def _writable(self, who):
        return None if self.mode != "r" else InputError(f"the store {self.path!r} is open read-only (mode='r')",
                                                        PermissionError)

    # --- tiles ----------------------------------------------------------------------------------

    @_collective
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
        who = f"FieldStore.write_tiles({name!r})"
        error = None
        try:
            nlat, nlon, found = self._plane_of_tiles(who, nlat, nlon, quadrature)
        except (TypeError, ValueError) as exc:
            nlat = nlon = found = None
            error = InputError(str(exc), type(exc))
        meta = {"mpisphere": "tiles", "nlat": nlat, "nlon": nlon, "quadrature": found}
        expected = None if error else self.grid.local_shape(nlat, nlon)
        parts = None if error else Parts.of_grid(self.grid.npolar, self.grid.nazimuth, nlat, nlon)
        self._write(who, name, tile, expected, parts, meta, "tiles", dims, coords, attrs, append, error)

    @_collective
    def read_tiles(self, name, nlat, nlon, quadrature="equiangular"):
        """This rank's tile ``(*lead, h, w)`` of variable ``name``, on this store's grid (any shape). Collective.

        Refused on every rank when the variable is not tiles of an ``nlat x
        nlon`` grid of ``quadrature``'s latitudes. Returns a NumPy array of
        the stored dtype.
        """
        who = f"FieldStore.read_tiles({name!r})"
        error = None
        try:
            nlat, nlon, found = self._plane_of_tiles(who, nlat, nlon, quadrature)
        except (TypeError, ValueError) as exc:
            error = InputError(str(exc), type(exc))
            nlat = nlon = found = None
        self._settle(who, error, f"read_tiles {name!r} {nlat} {nlon} {found}")
        parts = Parts.of_grid(self.grid.npolar, self.grid.nazimuth, nlat, nlon)
        return self._read(who, name, parts, {"mpisphere": "tiles", "nlat": nlat, "nlon": nlon, "quadrature": found})

    @staticmethod
    def _plane_of_tiles(who, nlat, nlon, quadrature):
        nlat = check_int(nlat, "nlat", who, minimum=1)
        nlon = check_int(nlon, "nlon", who, minimum=1)
        return nlat, nlon, rule(quadrature).name

    # --- coefficients -------------------------------------------------------------------------------

    @_collective
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
        who = f"FieldStore.write_coefficients({name!r})"
        meta, parts, expected, error = None, None, None, None
        try:
            meta = self._coefficient_meta(sht)
            expected = tuple(sht.block_shape)
            parts = self._coefficient_parts(sht)
        except (AttributeError, TypeError, ValueError) as exc:
            error = InputError(f"sht must be a distributed transform of this store's grid: {exc}", TypeError)
        self._write(who, name, block, expected, parts, meta, "coefficients", dims, coords, attrs, append, error)

    @_collective
    def read_coefficients(self, name, sht):
        """This rank's block ``(*lead, l_loc, m_loc)`` of variable ``name``, in ``sht``'s order layout. Collective.

        Refused on every rank when the stored truncation, norm,
        Condon-Shortley phase, quadrature or grid differ from ``sht``'s.
        """
        who = f"FieldStore.read_coefficients({name!r})"
        error, meta = None, None
        try:
            meta = self._coefficient_meta(sht)
            parts = self._coefficient_parts(sht)
        except (AttributeError, TypeError, ValueError) as exc:
            error = InputError(f"sht must be a distributed transform of this store's grid: {exc}", TypeError)
        self._settle(who, error, f"read_coefficients {name!r} {meta}")
        return self._read(who, name, parts, meta)

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
        if part.ndim < 2 or tuple(part.shape[-2:]) != tuple(expected):
            raise InputError(f"expected this rank's {kind} (..., {expected[0]}, {expected[1]}), got shape "
                             f"{tuple(part.shape)}")
        lead = tuple(part.shape[:-2])
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

    def _write(self, who, name, part, expected, parts, meta, kind, dims, coords, attrs, append, error):
        host, lead, shaped = None, None, {}
        if error is None:
            error = self._writable(who)
        if error is None:
            try:
                host, dims, shaped = self._check_part(part, expected, dims, coords, attrs, kind, name)
                lead = tuple(host.shape[:-2])
                if append and not lead:
                    raise InputError("append=True extends the first leading axis; the field has none")
            except InputError as exc:
                error = exc
            except (TypeError, ValueError) as exc:  # attributes that are not JSON: this rank's finding too
                error = InputError(str(exc), type(exc))
        described = (f"write {name!r} {meta} lead={lead} dtype={None if host is None else host.dtype} dims={dims} "
                     f"coords={ {d: v[0].tolist() for d, v in shaped.items()} } attrs={attrs} append={append}")
        self._settle(who, error, described)
        dtype = host.dtype
        full_meta = {**meta, "grid_shape": [self.grid.npolar, self.grid.nazimuth], "complete": False}
        offset = [0]

        def prepare():
            offset[0] = self._prepare(name, kind, meta, full_meta, lead, dtype, dims, shaped, attrs, append, parts)
        self._on_root(who, f"cannot create {name!r} in {self.path!r}", prepare)
        lead_offset = collectives.bcast_object(self._comm, offset[0])

        error = None
        try:
            array = zarr_files.open_array(self.path, name)
            rows = int(array.chunks[-2])
            plan = ChunkPlan(parts, lead, rows, lead_offset)
            regions = self._to_owners(plan, host.reshape((math.prod(lead),) + host.shape[-2:]))
            mine = plan.regions(self.grid.rank)
            for region, data in zip(mine, regions):
                array[plan.selection(region)] = data
            if self.durable:
                zarr_files.sync_files([f for _, f in zarr_files.chunk_files(
                    self.path, name, array, [plan.selection(r) for r in mine])])
        except Exception as exc:  # noqa: BLE001
            error = _finding(exc, f"cannot write {name!r} to {self.path!r}")
        self._settle(who, error)

        def finish():
            array = zarr_files.open_array(self.path, name)
            array.attrs["mpisphere"] = {**array.attrs["mpisphere"], "complete": True}
            zarr_files.consolidate(self.path)
            self._sync_metadata()
        self._on_root(who, f"cannot finish {name!r} in {self.path!r}", finish)

    def _prepare(self, name, kind, meta, full_meta, lead, dtype, dims, coords, attrs, append, parts):
        """Rank 0: the coordinates and the variable's metadata; returns the first leading index to write."""
        group = zarr_files.open_group(self.path, "r+")
        self._write_plane_coordinates(group, kind, meta)
        plane = _PLANE[kind]
        shape = lead + (parts.n0, parts.n1)
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
            chunks = (1,) * len(lead) + (rows, parts.n1)
            zarr_files.create_array(group, name, shape, chunks, dtype, dims + plane,
                                    {**(attrs or {}), "mpisphere": full_meta})
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

    def _write_plane_coordinates(self, group, kind, meta):
        if kind == "tiles":
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
        for dim, (v, extra) in values.items():
            if dim in group:
                old = numpy.asarray(group[dim][...])
                if old.shape != v.shape or not numpy.allclose(old, v, rtol=0, atol=1e-12):
                    rule_of = group[dim].attrs.get("quadrature", "")
                    raise InputError(f"the store's {dim!r} has {old.size} points{' of ' + rule_of if rule_of else ''}"
                                     f", this {kind} {v.size}{' of ' + meta['quadrature'] if kind == 'tiles' else ''}"
                                     ": one store holds one grid; write this one to another store")
                continue
            zarr_files.create_array(group, dim, v.shape, v.shape, v.dtype, (dim,), extra)
            group[dim][...] = v

    def _read(self, who, name, parts, expect):
        error, array, lead, rows = None, None, (), 1
        try:
            array = zarr_files.open_array(self.path, name)
            stored = dict(array.attrs.get("mpisphere", {}))
            if not stored:
                raise InputError(f"{name!r} was not written by mpisphere.io (no 'mpisphere' attribute)")
            differ = {k: (stored.get(k), v) for k, v in expect.items() if stored.get(k) != v}
            if differ:
                raise InputError("the stored variable does not fit the reader: " + ", ".join(
                    f"{k} is {s!r} in the store, {v!r} here" for k, (s, v) in differ.items()))
            if not stored.get("complete"):
                raise InputError(f"{name!r} is incomplete: a write of it did not finish (interrupted?)")
            lead = tuple(int(n) for n in array.shape[:-2])
            rows = int(array.chunks[-2])
            if tuple(array.chunks) != (1,) * len(lead) + (rows, parts.n1):
                raise InputError(f"{name!r} has chunks {array.chunks}, not mpisphere's bands of whole rows")
        except KeyError:
            error = InputError(f"no variable {name!r} in {self.path!r}")
        except Exception as exc:  # noqa: BLE001
            error = _finding(exc, f"cannot open {name!r} in {self.path!r}")
        self._settle(who, error)
        plan = ChunkPlan(parts, lead, rows)
        error, regions = None, []
        try:
            mine = plan.regions(self.grid.rank)
            missing = zarr_files.missing_chunks(self.path, name, array, [plan.selection(r) for r in mine])
            if missing:
                raise InputError(f"{len(missing)} chunk file(s) of {name!r} are missing (a truncated or damaged "
                                 f"store): {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
            regions = [numpy.ascontiguousarray(array[plan.selection(r)]).reshape(plan.region_shape(r))
                       for r in mine]
        except Exception as exc:  # noqa: BLE001
            error = _finding(exc, f"cannot read {name!r} from {self.path!r}")
        self._settle(who, error)
        dtype = numpy.dtype(array.dtype)
        part = numpy.empty((math.prod(lead),) + parts.shape(self.grid.rank), dtype)
        self._from_owners(plan, regions, part, dtype)
        return part.reshape(lead + part.shape[1:])

    # --- the all-to-alls ---------------------------------------------------------------------------

    def _to_owners(self, plan, part):
        """The owners' regions, assembled from every rank's ``part`` (``(lead_size, rows, cols)``)."""
        me = self.grid.rank
        send_counts = plan.counts_to_owners(me)
        recv_counts = plan.counts_from_parts(me)
        send = numpy.empty(sum(send_counts), part.dtype)
        recv = numpy.empty(sum(recv_counts), part.dtype)
        plan.pack_parts(me, part, send)
        collectives.alltoallv(self._comm, send, send_counts, _displacements(send_counts), recv, recv_counts,
                              _displacements(recv_counts))
        regions = [numpy.empty(plan.region_shape(r), part.dtype) for r in plan.regions(me)]
        plan.copy_own(me, part, regions)
        plan.unpack_regions(me, recv, regions)
        return regions

    def _from_owners(self, plan, regions, part, dtype):
        me = self.grid.rank
        send_counts = plan.counts_from_parts(me)
        recv_counts = plan.counts_to_owners(me)
        send = numpy.empty(sum(send_counts), dtype)
        recv = numpy.empty(sum(recv_counts), dtype)
        plan.pack_regions(me, regions, send)
        plan.copy_own(me, part, regions, to_regions=False)
        collectives.alltoallv(self._comm, send, send_counts, _displacements(send_counts), recv, recv_counts,
                              _displacements(recv_counts))
        plan.unpack_parts(me, recv, part)

    def __repr__(self):
        return f"FieldStore({self.path!r}, {self.grid!r}, mode={self.mode!r})"


def _displacements(counts):
    return numpy.concatenate([[0], numpy.cumsum(counts)[:-1]]).astype(numpy.int64) if counts else []
