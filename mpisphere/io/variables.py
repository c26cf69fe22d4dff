"""One variable of a store as Zarr holds it: what a write asks for, its checks, its array and coordinates.

A ``WriteRequest`` is what a ``FieldStore`` write is about (the
variable's name and kind, the metadata a reader must match, which part
each rank holds, the leading axes' names, coordinates and attributes);
``check_write`` is this rank's check of its part against it, and
``prepare`` (rank 0) creates or extends the Zarr array, its CF
coordinates (``lat``/``lon``, ``point``, ``l``/``m``) and its metadata.
No MPI: the store's collective calls (:mod:`.store`) run these inside
their agreed steps.
"""

import dataclasses
import math

import numpy

from .. import backend
from ..agreement import InputError
from ..dtypes import refusal
from ..quadrature import latitudes
from . import zarr_files
from .chunks import band_rows

__all__ = ["WriteRequest", "PLANE", "check_write", "prepare"]

PLANE = {"tiles": ("lat", "lon"), "coefficients": ("l", "m"), "points": ("point",)}  # each kind's trailing axes


@dataclasses.dataclass
class WriteRequest:
    """What one write of a variable is about.

    ``name``, ``kind`` (``"tiles"``, ``"coefficients"``, ``"points"``),
    ``meta`` (what a reader must match), ``parts`` (a ``chunks.Parts``:
    which part each rank holds), ``expected`` (the trailing shape of this
    rank's part), ``layout`` (coefficient blocks' order layout, agreed),
    ``rings`` (points: their geometry, for the coordinates), and the
    caller's ``dims``, ``coords``, ``attrs``, ``append``. The write fills in
    ``lead``, ``dtype`` and ``shaped`` (the checked coordinates) once this
    rank's part passed ``check_write``.
    """

    name: str
    kind: str
    meta: dict = None
    parts: object = None
    expected: tuple = None
    layout: object = None
    rings: object = None
    dims: tuple = None
    coords: dict = None
    attrs: dict = None
    append: bool = False
    lead: tuple = None
    dtype: object = None
    shaped: dict = dataclasses.field(default_factory=dict)


def check_write(request, part):
    """This rank's findings about a write's arguments (InputErrors); returns ``(host array, dims, coords)``."""
    name, kind, expected, dims = request.name, request.kind, request.expected, request.dims
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
            len(set(dims)) != len(dims) or set(dims) & set(PLANE[kind]):
        raise InputError(f"dims must name the {len(lead)} leading axes once each (not "
                         f"{', '.join(PLANE[kind])}), got {dims!r}")
    shaped = {}
    for dim, given in (request.coords or {}).items():
        values, extra = given if isinstance(given, tuple) else (given, {})
        values = numpy.asarray(values)
        if dim not in dims or values.ndim != 1 or len(values) != lead[dims.index(dim)] or \
                values.dtype.kind not in "iuf":
            raise InputError(f"coords[{dim!r}] must be numbers along a leading axis of {dims!r} "
                             f"({dict(zip(dims, lead))}), got {values.dtype} of shape {values.shape}")
        shaped[dim] = (values, zarr_files.json_safe(dict(extra), f"the attributes of coords[{dim!r}]"))
    zarr_files.json_safe(request.attrs or {}, "attrs")
    host = part.get() if backend.is_device_array(part) else numpy.asarray(part)
    return numpy.ascontiguousarray(host), dims, shaped


def prepare(path, grid, request):
    """Rank 0: the coordinates and the variable's metadata; returns the first leading index to write."""
    name, kind, meta, lead, dtype, dims = request.name, request.kind, request.meta, request.lead, request.dtype, \
        request.dims
    coords, attrs, append, parts = request.shaped, request.attrs, request.append, request.parts
    full_meta = {**meta, "grid_shape": [grid.npolar, grid.nazimuth], "complete": False}
    group = zarr_files.open_group(path, "r+")
    _write_plane_coordinates(group, kind, meta, request.rings)
    plane = PLANE[kind]
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
        rows = band_rows(parts.n0, parts.n1, dtype.itemsize, math.prod(lead), grid.size)
        chunks = (1,) * len(lead) + ((rows,) if flat else (rows, parts.n1))
        cf = {"coordinates": "lat lon"} if flat else {}  # the points' latitude and longitude (CF)
        zarr_files.create_array(group, name, shape, chunks, dtype, dims + plane,
                                {**(attrs or {}), **cf, "mpisphere": full_meta})
    for dim, (values, extra) in coords.items():
        _write_lead_coordinate(group, dim, values, extra, offset if dims.index(dim) == 0 else 0,
                               append and exists and dims.index(dim) == 0)
    return offset


def _write_lead_coordinate(group, dim, values, extra, offset, extend):
    """A leading axis's coordinate: written, extended by an append at ``offset``, or kept when equal."""
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


def _write_plane_coordinates(group, kind, meta, rings=None):
    """The trailing axes' CF coordinates of ``kind``; an InputError when the store holds another grid's."""
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
