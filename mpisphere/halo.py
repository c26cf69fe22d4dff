"""Halo (ghost-cell) exchange on the process grid, and its adjoint.

A tile ``(..., h, w)`` is padded to ``(..., h + 2*rows, w + 2*cols)``:

* ``rows`` latitude rows from the polar neighbours, zeros past the poles (the
  polar axis of the grid is not periodic);
* ``cols`` longitude columns from the azimuth neighbours, periodic (on a
  one-rank ring the halo comes from the rank's own tile);
* the four corner blocks from the diagonal neighbours (zeros past the poles).

The exchange runs in two phases on the Cartesian neighbours, never a
collective over the grid: first the columns of the interior rows along the
azimuth ring, then full padded-width rows along the polar axis, which carries
the corners. The adjoint (``accumulate``) runs the phases in reverse: halo
rows go home first and are added onto the owner's rows at full padded width,
then halo columns (now holding the corner contributions) go home and are
added onto the owner's columns; what lies past a pole is dropped.

Messages are ``Sendrecv`` pairs. Host arrays move through MPI subarray
datatypes (no packing); device arrays, and host arrays under
``config.force_staging``, through packed scratch buffers reused across
calls. A width of 0 in a direction posts no message in that direction.
"""

import operator

import numpy
from mpi4py import MPI

from . import backend, collectives
from .operators import DISTRIBUTED, Layout, LinearOperator, check_input, output_array
from .primitives import SUPPORTED_DTYPES

__all__ = ["HaloExchange"]

# message tags, one per direction of travel
_TO_NORTH, _TO_SOUTH, _TO_WEST, _TO_EAST = 11, 12, 13, 14


def _width(value, name):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"HaloExchange: {name} must be a non-negative integer, got {value!r}") from None
    if value < 0:
        raise ValueError(f"HaloExchange: {name} must be non-negative, got {name}={value}")
    return value


class HaloExchange(LinearOperator):
    """Pad each tile with its neighbours' rows and columns.

    Parameters
    ----------
    grid : ProcessGrid
    rows : int
        Halo width in latitude rows (each side). 0 skips the polar exchange.
    cols : int, optional
        Halo width in longitude columns (each side). 0 skips the azimuth
        exchange.
    extents : (int, int), optional
        Global ``(nlat, nlon)``. When given, the halo widths are checked
        against the smallest tile at construction (identically on every rank)
        and every call checks its tile shape against this rank's tile.
        Without it each rank can only check its own tile.

    Notes
    -----
    ``forward``: ``(..., h, w)`` -> ``(..., h + 2*rows, w + 2*cols)``.
    ``adjoint``: ``(..., h + 2*rows, w + 2*cols)`` -> ``(..., h, w)``, the
    interior plus the halo contributions that other ranks hold for this
    rank's cells. Both distributed over ``grid.cart``.

    :meth:`update` and :meth:`accumulate` do the same in place on a padded
    array, for codes that keep ghost cells inside their fields.

    Raises
    ------
    ValueError
        A halo wider than the smallest tile in its direction (the exchange
        would have to reach past the neighbour), raised before any message.
    """

    def __init__(self, grid, rows, cols=0, *, extents=None):
        self.grid = grid
        self.rows = _width(rows, "rows")
        self.cols = _width(cols, "cols")
        self.domain = Layout(DISTRIBUTED, grid.cart)
        self.range = Layout(DISTRIBUTED, grid.cart)
        self.tile = None
        self.extents = None
        if extents is not None:
            nlat, nlon = extents
            lat_sizes, lon_sizes = grid.lat_sizes(nlat), grid.lon_sizes(nlon)
            error = self._width_error(min(lat_sizes), min(lon_sizes),
                                      f"nlat={nlat} split over {grid.npolar} polar ranks as {lat_sizes}",
                                      f"nlon={nlon} split over {grid.nazimuth} azimuth ranks as {lon_sizes}",
                                      "the smallest")
            if error is not None:
                raise ValueError(f"HaloExchange: {error}")
            self.extents = (nlat, nlon)
            self.tile = grid.local_shape(nlat, nlon)
        self._workspace = backend.Workspace()
        self._types = collectives.DatatypeCache()

    def _width_error(self, min_h, min_w, lat_detail, lon_detail, whose):
        if self.grid.npolar > 1 and self.rows > min_h:
            return (f"a halo of {self.rows} rows is wider than {whose} polar tile ({min_h} rows; {lat_detail}); "
                    f"the exchange reaches only the immediate neighbours, so use at most {min_h} halo rows, "
                    "fewer polar ranks or more latitudes")
        if self.cols > min_w:
            if self.grid.nazimuth == 1:
                return (f"a halo of {self.cols} columns is wider than the whole ring of {min_w} longitudes; "
                        f"use at most {min_w} halo columns")
            return (f"a halo of {self.cols} columns is wider than {whose} azimuth tile ({min_w} columns; "
                    f"{lon_detail}); the exchange reaches only the immediate neighbours, so use at most "
                    f"{min_w} halo columns, fewer azimuth ranks or more longitudes")
        return None

    # --- validation ---------------------------------------------------------

    def _check(self, who, a, padded):
        """This rank's tile ``(h, w)`` for input ``a``, after the checks (collective in debug mode)."""
        error = None
        tile = None
        dtype = getattr(a, "dtype", None)
        if dtype is None or getattr(a, "ndim", 0) < 2:
            error = TypeError, f"expected an array with at least 2 axes, got {type(a).__name__} {getattr(a, 'shape', '')}"
        elif numpy.dtype(dtype) not in SUPPORTED_DTYPES:
            error = TypeError, f"unsupported dtype {numpy.dtype(dtype)}"
        else:
            H, W = a.shape[-2:]
            tile = (H - 2 * self.rows, W - 2 * self.cols) if padded else (H, W)
            what = "padded tile" if padded else "tile"
            if self.tile is not None and tile != self.tile:
                expected = (self.tile[0] + 2 * self.rows, self.tile[1] + 2 * self.cols) if padded else self.tile
                error = ValueError, (f"expected a {what} of {expected} in the last two axes for this rank of a "
                                     f"{self.extents[0]} x {self.extents[1]} field, got {(H, W)}")
            elif min(tile) < 1:
                error = ValueError, f"a {what} of {(H, W)} holds no interior for halo {self.rows} x {self.cols}"
            else:
                message = self._width_error(tile[0], tile[1], f"this rank's tile is {tile}",
                                            f"this rank's tile is {tile}", "this rank's")
                if message is not None:
                    error = ValueError, message
        shape = tuple(getattr(a, "shape", ()))
        check_input(self.grid.cart, f"HaloExchange.{who}", error,
                    lambda: (f"leading shape {shape[:-2]}", f"dtype {dtype}"))
        return tile

    # --- operator interface ---------------------------------------------------

    def _forward(self, x, out):
        h, w = self._check("forward", x, padded=False)
        r, c = self.rows, self.cols
        out = output_array("HaloExchange.forward", self.grid.cart, x, out,
                           tuple(x.shape[:-2]) + (h + 2 * r, w + 2 * c))
        out[..., r:r + h, c:c + w] = x
        self._gather(out, h, w)
        return out

    def _adjoint(self, y, out):
        h, w = self._check("adjoint", y, padded=True)
        r, c = self.rows, self.cols
        out = output_array("HaloExchange.adjoint", self.grid.cart, y, out, tuple(y.shape[:-2]) + (h, w))
        work = self._workspace.scratch("adjoint", y, y.size).reshape(y.shape)
        work[...] = y
        self._scatter_add(work, h, w)
        out[...] = work[..., r:r + h, c:c + w]
        return out

    def update(self, padded):
        """Fill the halo of ``padded`` (``(..., h + 2*rows, w + 2*cols)``) in place.

        The interior is read, never written; nothing is allocated after the
        first call for a shape. Returns ``padded``.
        """
        h, w = self._check("update", padded, padded=True)
        self._gather(padded, h, w)
        return padded

    def accumulate(self, padded):
        """Adjoint of :meth:`update`, in place: add the halo onto its owners, zero it.

        Returns ``padded``.
        """
        h, w = self._check("accumulate", padded, padded=True)
        self._scatter_add(padded, h, w)
        return padded

    # --- the two phases -------------------------------------------------------

    def _gather(self, P, h, w):
        r, c = self.rows, self.cols
        H, W = h + 2 * r, w + 2 * c
        inner = slice(r, r + h)
        if c:
            west, east = self.grid.azimuth_neighbors
            if self.grid.nazimuth == 1:
                P[..., inner, 0:c] = P[..., inner, w:w + c]
                P[..., inner, c + w:W] = P[..., inner, c:2 * c]
            else:
                self._move(P, self.grid.azimuth, (inner, slice(w, w + c)), east, (inner, slice(0, c)), west,
                           _TO_EAST)
                self._move(P, self.grid.azimuth, (inner, slice(c, 2 * c)), west, (inner, slice(c + w, W)), east,
                           _TO_WEST)
        if r:
            north, south = self.grid.polar_neighbors
            full = slice(0, W)
            self._move(P, self.grid.polar, (slice(r, 2 * r), full), north, (slice(r + h, H), full), south,
                       _TO_NORTH)
            self._move(P, self.grid.polar, (slice(h, h + r), full), south, (slice(0, r), full), north, _TO_SOUTH)
            if north == MPI.PROC_NULL:
                P[..., 0:r, :] = 0
            if south == MPI.PROC_NULL:
                P[..., r + h:H, :] = 0

    def _scatter_add(self, P, h, w):
        r, c = self.rows, self.cols
        H, W = h + 2 * r, w + 2 * c
        if r:
            north, south = self.grid.polar_neighbors
            full = slice(0, W)
            self._move(P, self.grid.polar, (slice(0, r), full), north, (slice(h, h + r), full), south,
                       _TO_NORTH, add=True)
            self._move(P, self.grid.polar, (slice(r + h, H), full), south, (slice(r, 2 * r), full), north,
                       _TO_SOUTH, add=True)
            P[..., 0:r, :] = 0
            P[..., r + h:H, :] = 0
        if c:
            inner = slice(r, r + h)
            west, east = self.grid.azimuth_neighbors
            if self.grid.nazimuth == 1:
                P[..., inner, w:w + c] += P[..., inner, 0:c]
                P[..., inner, c:2 * c] += P[..., inner, c + w:W]
            else:
                self._move(P, self.grid.azimuth, (inner, slice(0, c)), west, (inner, slice(w, w + c)), east,
                           _TO_WEST, add=True)
                self._move(P, self.grid.azimuth, (inner, slice(c + w, W)), east, (inner, slice(c, 2 * c)), west,
                           _TO_EAST, add=True)
            P[..., inner, 0:c] = 0
            P[..., inner, c + w:W] = 0

    def _move(self, P, comm, send_region, dest, recv_region, source, tag, add=False):
        """One ``Sendrecv``: ``P[send_region]`` to ``dest``, ``source``'s block into (or onto) ``P[recv_region]``."""
        if dest == MPI.PROC_NULL and source == MPI.PROC_NULL:
            return
        by_type = isinstance(P, numpy.ndarray) and P.flags.c_contiguous and not collectives.staging_active(P, comm)
        block_shape = P[(Ellipsis,) + send_region].shape
        if by_type:
            P3 = P.reshape((-1,) + P.shape[-2:])
            send, send_type = P3, self._subarray(P3, send_region)
        else:
            send = self._workspace.scratch(f"send{tag}", P, _size(block_shape))
            send.reshape(block_shape)[...] = P[(Ellipsis,) + send_region]
            send_type = None
        if by_type and not add:
            recv, recv_type = P3, self._subarray(P3, recv_region)
        else:
            recv_shape = P[(Ellipsis,) + recv_region].shape
            recv, recv_type = self._workspace.scratch(f"recv{tag}", P, _size(recv_shape)), None
        collectives.sendrecv(comm, send, dest, recv, source, sendtag=tag, recvtag=tag, send_type=send_type,
                             recv_type=recv_type, workspace=self._workspace)
        if recv_type is None and source != MPI.PROC_NULL:
            block = recv.reshape(P[(Ellipsis,) + recv_region].shape)
            if add:
                P[(Ellipsis,) + recv_region] += block
            else:
                P[(Ellipsis,) + recv_region] = block

    def _subarray(self, P3, region):
        rows, cols = region
        key = (P3.shape, P3.dtype.str, rows.start, rows.stop, cols.start, cols.stop)
        return self._types.get(key, lambda: collectives.subarray_type(
            P3.shape, (P3.shape[0], rows.stop - rows.start, cols.stop - cols.start), (0, rows.start, cols.start),
            P3.dtype))

    def free(self):
        """Release the cached MPI datatypes and scratch buffers (also done on garbage collection)."""
        self._types.free()
        self._workspace.clear()


def _size(shape):
    n = 1
    for extent in shape:
        n *= int(extent)
    return n
