"""Halo (ghost-cell) exchange on the process grid, its adjoint, and halo widths from geometry.

A tile ``(..., h, w)`` is padded to ``(..., h + 2*rows, w + 2*cols)``:

* ``rows`` latitude rows from the polar neighbours, zeros past the poles (the
  polar axis of the grid is not periodic);
* ``cols`` longitude columns from the azimuth neighbours, periodic (on a
  one-rank ring the halo comes from the rank's own tile);
* the four corner blocks from the diagonal neighbours (zeros past the poles).

With ``poles="across"`` the rows past a pole are not zeros but the field
continued across it, half way round (longitude + 180 degrees), times a sign
per field (``signs``: -1 for the components of a vector, which turn round as
they cross the pole). Which row lies at which distance past the pole comes
from the grid's latitudes (``quadrature=``): the halo row at distance ``k``
beyond the pole mirrors the row at the same colatitude distance inside it.
On a grid without a pole row (Legendre-Gauss) that is row ``k - 1`` counted
from the pole; on a grid whose outermost rows are the poles (equiangular,
Lobatto) it is row ``k``, and the pole row itself is not repeated. A pole
row holds one point of the sphere repeated along the ring, so a stencil
centred on it sees the same value at every longitude and, across the pole,
the rows of the opposite meridian at their true distances. Those rows belong
to the ranks of the first (last) polar row that hold the opposite
longitudes: the ranks of that polar row gather them over ``grid.azimuth``
(``Allgatherv``; the adjoint sums them back with ``Reduce_scatter``), so a
call across the poles also agrees over the whole grid.

The exchange runs in two phases on the Cartesian neighbours, never a
collective over the grid: first the columns of the interior rows along the
azimuth ring, then full padded-width rows along the polar axis, which carries
the corners. The adjoint (``accumulate``) runs the phases in reverse: halo
rows go home first and are added onto the owner's rows at full padded width,
then halo columns (now holding the corner contributions) go home and are
added onto the owner's columns; what lies past a pole is dropped.

Agreement with the neighbours
-----------------------------
The ranks agree twice:

* **at construction**, collectively over ``grid.cart``: every rank built the
  exchange from the same arguments (widths, extents, poles, signs,
  quadrature), or every rank raises;
* **in every call**, with the neighbours only, at no extra round trip: each
  message carries a header of eight integers in front of its data (this
  rank's verdict on its own input, a digest of the call, its tile's height
  and width, the size of the data that follows; see
  :class:`~mpisphere.agreement.NeighbourRound`). Every call exchanges a
  message with each of the four direct neighbours in both phases, whatever
  its widths (a zero width sends a header and no data), so any two halo calls
  on neighbouring ranks exchange the same messages and every mismatch (another
  operator, widths, direction, batch shape, dtype, tiles that do not fit) is
  seen on both sides. A rank that sees one stops using data, sends its
  remaining headers marked so, receives and drops what still arrives, and
  raises; its neighbours learn it from those headers and raise too. The
  ranks involved raise, naming the neighbours and their own descriptions;
  ranks farther away exchanged nothing wrong and return correct results.

Composed with other operators (``@``), a halo exchange takes part in the
composition's agreement over the whole grid, which is why it needs
``extents`` there. Packing with NumPy beats MPI subarray datatypes on these
thin blocks (measured with MPICH: 0.43 against 0.88 ms for the two column
messages of a (32, 361, 360) tile), so each block is packed into a buffer
that a per-shape plan allocates once.

:func:`polar_halo_radius` derives the halo width of a localized operator
(a convolution of a given angular radius) from the latitudes and the grid.
"""

import math

import numpy

from . import backend, dtypes
from .agreement import REFUSED, Context, InputError, NeighbourRound, Spec, agree, agree_construction, \
    call_description, message_buffer, raise_everywhere
from .operators import ADJOINT, DISTRIBUTED, FORWARD, AdjointOperator, Layout, LinearOperator
from .partition import split_sizes
from .validation import check_int
from .primitives import GatherFromCopyTo
from .quadrature import latitudes, rule

__all__ = ["HaloExchange", "HaloReduce", "latitude_support_band", "polar_halo_radius"]

# message tags, by the direction the data travels
_TO_NORTH, _TO_SOUTH, _TO_WEST, _TO_EAST = 11, 12, 13, 14
_FROM = {_TO_EAST: "west", _TO_WEST: "east", _TO_SOUTH: "north", _TO_NORTH: "south"}
_OPPOSITE = {_TO_EAST: _TO_WEST, _TO_WEST: _TO_EAST, _TO_SOUTH: _TO_NORTH, _TO_NORTH: _TO_SOUTH}
_RECORD = 10  # a record (header alone) of a halo without extents travels with tag + _RECORD, before the data
_POLE_TOLERANCE = 1e-12  # a colatitude this close to 0 or pi is a pole row


def _check_grid(grid, who):
    if not (hasattr(grid, "cart") and hasattr(grid, "polar") and hasattr(grid, "polar_neighbors")):
        hint = (" (a communicator; pass the ProcessGrid it belongs to)" if hasattr(grid, "Get_size") else "")
        raise TypeError(f"{who}: grid must be a ProcessGrid, got {type(grid).__name__}{hint}")
    if getattr(grid, "freed", False):
        raise RuntimeError(f"{who}: the grid was freed (grid.free())")


def _check_extents(extents, who):
    try:
        nlat, nlon = extents
    except (TypeError, ValueError):
        raise TypeError(f"{who}: extents must be a pair (nlat, nlon) of integers, got {extents!r}") from None
    return check_int(nlat, "extents[0] (nlat)", who, minimum=1), check_int(nlon, "extents[1] (nlon)", who, minimum=1)


class _HaloContext(Context):
    """A halo call's context: the staging decision, this rank's finding, and the call as the neighbours see it."""

    __slots__ = ("error", "description", "who")

    def __init__(self, staged, error, description, who):
        super().__init__(staged)
        self.error, self.description, self.who = error, description, who


class HaloExchange(LinearOperator):
    """Pad each tile with its neighbours' rows and columns.

    Parameters
    ----------
    grid : ProcessGrid
    rows : int
        Halo width in latitude rows (each side). 0 moves no rows.
    cols : int, optional
        Halo width in longitude columns (each side). 0 moves no columns.
    extents : (int, int), optional
        Global ``(nlat, nlon)``. When given, the halo widths are checked
        against the smallest tile at construction and every call checks its
        tile shape against this rank's tile; it is needed to compose the
        exchange with other operators. Without it, the neighbours check each
        other's tiles in every call.
    poles : {"zero", "across"}, keyword-only
        What lies past the poles: zeros (default, as torch-harmonics), or the
        field continued across the pole (see the module notes; needs
        ``extents``, ``quadrature`` and an even ``nlon``).
    signs : sequence of +1 / -1, keyword-only
        With ``poles="across"``: the factor for each entry of the input's
        axis ``-3`` (the fields) as it crosses a pole, e.g. ``(1, -1, -1)``
        for ``(h, u, v)``. Default: +1 for every field.
    quadrature : str, keyword-only
        With ``poles="across"``: the latitude rule of the grid
        (``"equiangular"``, ``"legendre-gauss"``, ``"lobatto"``), which says
        whether the outermost rows are the poles.

    Notes
    -----
    ``forward``: ``(..., h, w)`` -> ``(..., h + 2*rows, w + 2*cols)``.
    ``adjoint``: ``(..., h + 2*rows, w + 2*cols)`` -> ``(..., h, w)``, the
    interior plus the halo contributions that other ranks hold for this
    rank's cells. Both distributed over ``grid.cart``.

    :meth:`update` and :meth:`accumulate` do the same in place on a padded
    array, for codes that keep ghost cells inside their fields.

    Construction is collective over ``grid.cart``.

    Raises
    ------
    ValueError
        On every rank, at construction: ranks that pass different
        arguments, a halo wider than the smallest tile in its direction (the
        exchange would have to reach past the neighbour).
    """

    _label = "HaloExchange"

    def __init__(self, grid, rows, cols=0, *, extents=None, poles="zero", signs=None, quadrature=None):
        _check_grid(grid, self._label)
        agree_construction(self, grid.cart, who=self._label)  # widths and poles decide who talks to whom
        self.grid = grid
        self.rows = check_int(rows, "rows", self._label, minimum=0)
        self.cols = check_int(cols, "cols", self._label, minimum=0)
        if poles not in ("zero", "across"):
            raise ValueError(f"{self._label}: poles must be 'zero' or 'across', got {poles!r}")
        self.poles = poles
        self.signs = None if signs is None else numpy.asarray(signs, dtype=numpy.float64).reshape(-1)
        if self.signs is not None and not numpy.all(numpy.abs(self.signs) == 1):
            raise ValueError(f"{self._label}: signs must be +1 or -1 for each field, got {list(signs)}")
        if self.signs is not None and poles != "across":
            raise ValueError(f"{self._label}: signs apply across the poles; pass poles='across' with them")
        if quadrature is not None and poles != "across":
            raise ValueError(f"{self._label}: quadrature says where the poles are, for poles='across'; the zero "
                             "halo past the poles does not need it")
        self.domain = Layout(DISTRIBUTED, grid.cart)
        self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self.tile = None
        self.extents = None
        if extents is not None:
            nlat, nlon = _check_extents(extents, self._label)
            lat_sizes, lon_sizes = grid.lat_sizes(nlat), grid.lon_sizes(nlon)
            error = self._width_error(min(lat_sizes), min(lon_sizes),
                                      f"nlat={nlat} split over {grid.npolar} polar ranks as {lat_sizes}",
                                      f"nlon={nlon} split over {grid.nazimuth} azimuth ranks as {lon_sizes}",
                                      "the smallest")
            if error is not None:
                raise ValueError(f"{self._label}: {error}")
            self.extents = (nlat, nlon)
            self.tile = grid.local_shape(nlat, nlon)
        self._across = poles == "across" and self.rows > 0
        self._pole_shift = (0, 0)
        if poles == "across":
            self._prepare_across(quadrature)
        self._workspace = backend.Workspace()
        self._plans = backend.BoundedCache(4)
        self._neighbours = self._find_neighbours()

    def _prepare_across(self, quadrature):
        """Checks and index arrays of ``poles="across"`` (identical on every rank: no message yet)."""
        if self.extents is None:
            raise ValueError(f"{self._label}: poles='across' needs extents=(nlat, nlon): the rows past a pole "
                             "come from the opposite longitudes, which only the global grid locates")
        if quadrature is None:
            raise ValueError(f"{self._label}: poles='across' needs quadrature= (e.g. 'equiangular', "
                             "'legendre-gauss', as the transforms take it): the row at a given distance past a pole "
                             "depends on whether the outermost rows are the poles")
        nlat, nlon = self.extents
        try:
            theta, _ = latitudes(nlat, rule(quadrature).name)
        except ValueError as exc:
            raise ValueError(f"{self._label}: {exc}") from None
        self.quadrature = rule(quadrature).name
        # a pole row is not mirrored onto itself: the rows past it start one further in
        self._pole_shift = (int(abs(theta[0]) < _POLE_TOLERANCE), int(abs(theta[-1] - math.pi) < _POLE_TOLERANCE))
        if not self._across:
            return
        if nlon % 2:
            raise ValueError(f"{self._label}: poles='across' needs an even nlon (the longitude half way round "
                             f"must be a grid column), got nlon={nlon}")
        sizes = self.grid.lat_sizes(nlat)
        north, south = self.rows + self._pole_shift[0], self.rows + self._pole_shift[1]
        if north > sizes[0] or south > sizes[-1]:
            raise ValueError(f"{self._label}: poles='across' takes the {self.rows} rows nearest each pole "
                             f"({'not counting the pole rows, ' if any(self._pole_shift) else ''}on this "
                             f"{self.quadrature} grid) from the first and last polar tiles, which have {sizes[0]} "
                             f"and {sizes[-1]} rows (nlat={nlat} split as {sizes}); use fewer halo rows or fewer "
                             "polar ranks")
        _, lon = self.grid.local_slices(nlat, nlon)
        # global columns of the padded tile, moved half way round
        self._opposite = (numpy.arange(lon.start - self.cols, lon.stop + self.cols) + nlon // 2) % nlon
        self._band = GatherFromCopyTo(self.grid.azimuth, -1, nlon)

    @property
    def name(self):
        return self._label

    @property
    def needs_own_agreement(self):
        """Why this exchange cannot be composed with other operators, or ``None``."""
        if self.extents is None:
            return ("without extents each rank knows only its own tile, and the tiles can be checked only by the "
                    "neighbours' own agreement; build it with extents=(nlat, nlon)")
        return None

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

    def _find_neighbours(self):
        """``(sends, receives)``: ``[(cart rank, tag)]`` of every message of a call, whatever the widths.

        The four direct neighbours in both phases (none past a pole, none on
        a one-rank ring, which wraps locally): the same in every halo call,
        so that two different calls on neighbouring ranks still exchange the
        same messages and see each other's headers.
        """
        g = self.grid
        p, a = g.polar_rank, g.azimuth_rank
        sends, receives = {}, {}
        if g.nazimuth > 1:
            west, east = p * g.nazimuth + (a - 1) % g.nazimuth, p * g.nazimuth + (a + 1) % g.nazimuth
            sends.update({_TO_EAST: east, _TO_WEST: west})
            receives.update({_TO_EAST: west, _TO_WEST: east})
        if p > 0:
            sends[_TO_NORTH] = (p - 1) * g.nazimuth + a
            receives[_TO_SOUTH] = (p - 1) * g.nazimuth + a
        if p < g.npolar - 1:
            sends[_TO_SOUTH] = (p + 1) * g.nazimuth + a
            receives[_TO_NORTH] = (p + 1) * g.nazimuth + a
        return sends, receives

    # --- local checks ---------------------------------------------------------------

    def _shapes(self, lead):
        if self.tile is None:
            raise TypeError(f"{self._label} without extents does not know its tile; build it with extents=")
        h, w = self.tile
        return lead + (h, w), lead + (h + 2 * self.rows, w + 2 * self.cols)

    def _tile_of(self, spec, padded):
        """This rank's tile ``(h, w)`` for an input of ``spec``; :class:`InputError` when it cannot be used."""
        if len(spec.shape) < 2:
            raise InputError(f"expected an array with at least 2 axes, got shape {spec.shape}", TypeError)
        problem = dtypes.refusal(spec.dtype, "moved")
        if problem:
            raise InputError(problem, TypeError)
        H, W = spec.shape[-2:]
        tile = (H - 2 * self.rows, W - 2 * self.cols) if padded else (H, W)
        what = "padded tile" if padded else "tile"
        if self.tile is not None and tile != self.tile:
            expected = (self.tile[0] + 2 * self.rows, self.tile[1] + 2 * self.cols) if padded else self.tile
            raise InputError(f"expected a {what} of {expected} in the last two axes for this rank of a "
                             f"{self.extents[0]} x {self.extents[1]} field, got {(H, W)}")
        if min(tile) < 1:
            raise InputError(f"a {what} of {(H, W)} holds no interior for halo {self.rows} x {self.cols}")
        message = self._width_error(tile[0], tile[1], f"this rank's tile is {tile}", f"this rank's tile is {tile}",
                                    "this rank's")
        if message is not None:
            raise InputError(message)
        if self._across and self.signs is not None and (len(spec.shape) < 3 or spec.shape[-3] != self.signs.size):
            raise InputError(f"signs has {self.signs.size} entries, one per field on axis -3, but the input has "
                             f"shape {spec.shape}")
        return tile

    def _output(self, direction, spec):
        padded = direction in (ADJOINT, "accumulate", "update")
        h, w = self._tile_of(spec, padded)
        if direction == FORWARD:
            shape = spec.shape[:-2] + (h + 2 * self.rows, w + 2 * self.cols)
        elif direction == ADJOINT:
            shape = spec.shape[:-2] + (h, w)
        else:
            shape = spec.shape
        return spec.but(shape=shape), spec.describe((-2, -1))

    def _reserve(self, direction, x, out):
        padded = out if direction == FORWARD else x
        self._plan(padded)
        if direction == ADJOINT:
            self._workspace.scratch("adjoint", x, x.size)

    # --- calls ------------------------------------------------------------------------

    def update(self, padded):
        """Fill the halo of ``padded`` (``(..., h + 2*rows, w + 2*cols)``) in place.

        The interior is read, never written; nothing is allocated after the
        first call for a shape. Returns ``padded``.
        """
        return self._apply(FORWARD, padded, None, label="update", in_place=True)

    def accumulate(self, padded):
        """Adjoint of :meth:`update`, in place: add the halo onto its owners, zero it.

        Returns ``padded``.
        """
        return self._apply(ADJOINT, padded, None, label="accumulate", in_place=True)

    def _agreement(self, comm, who, error, description, spec, signature):
        """Across the poles: over the whole grid first. Otherwise nothing yet: the headers carry it."""
        if self._across:
            context = agree(self.grid.cart, who, error, description, spec, signature)
            return _HaloContext(context.staged, None, call_description(f"{signature}: {description}"), who)
        return _HaloContext(Context.local(spec).staged, error, call_description(f"{signature}: {description}"), who)

    def _refuse(self, comm, who, description, spec, signature):
        """A call refused on this rank: its messages still go out (headers only) and come in (dropped)."""
        error = InputError(REFUSED, RuntimeError)
        if self._across:
            raise_everywhere(self.grid.cart, who, error)
            return
        self._round(who, None, error, (0, 0), False, 0)[1]()

    def _round(self, who, description, error, tile, staged, order):
        """A :class:`NeighbourRound` for one call, and the function that ends it (raises on a problem)."""
        sends, receives = self._neighbours
        g = self.grid
        records = self.extents is None  # without extents, the tiles are checked in a round of records first
        expected = [(rank, tag) for tag, rank in receives.items()]
        if records:
            expected += [(rank, tag + _RECORD) for tag, rank in receives.items()]

        def fits(header, source, tag):
            (ha, wa), (hb, wb) = tile, (int(header[3]), int(header[4]))
            if tag % _RECORD in (_TO_EAST % _RECORD, _TO_WEST % _RECORD):
                if ha != hb:
                    return f"tiles of heights {ha} and {hb} in one row of the grid"
                if min(wa, wb) < self.cols:
                    return f"a halo of {self.cols} columns is wider than a tile of {min(wa, wb)} columns"
            else:
                if wa != wb:
                    return f"tiles of widths {wa} and {wb} in one column of the grid"
                if min(ha, hb) < self.rows:
                    return f"a halo of {self.rows} rows is wider than a tile of {min(ha, hb)} rows"
            return None

        text = description if description is not None else f"{self._describe()} (refused)"
        round_ = NeighbourRound(g.cart, who, text, tile, error, expected, fits, order=order, staged=staged,
                                workspace=self._workspace, pattern=int(records),
                                optional={(rank, tag + _RECORD): 1 for tag, rank in receives.items()})
        every = [(rank, tag) for tag, rank in sends.items()]
        every += [(rank, tag + _RECORD) for tag, rank in sends.items()] if records else []

        def finish():
            problems = round_.finish(every)
            if problems is None:
                return
            lines = [] if error is None else [f"this rank: {error.text}"]
            for (source, tag), found in problems:
                line = f"{_FROM[tag if tag in _FROM else tag - _RECORD]} neighbour rank {source}: {found}"
                if line not in lines:
                    lines.append(line)
            details = round_.details()
            shown = "" if not details else " [" + " | ".join(
                [f"this rank: {text}"] + [f"rank {r}: {e if e else d}" for r, (e, d) in details.items()]) + "]"
            raise (error.kind if error is not None else ValueError)(
                f"{who}: rank {g.rank} of {g.size} (polar {g.polar_rank}, azimuth {g.azimuth_rank}) cannot "
                "exchange its halo: " + "; ".join(lines) + shown)

        return round_, finish

    def _run(self, direction, x, out, context):
        """The exchange: the neighbours' round in two phases (headers with the data), then across the poles."""
        error = getattr(context, "error", None)
        description = getattr(context, "description", None)
        who = getattr(context, "who", None) or f"{self.name}.{direction}"
        if description is None:  # inside an agreed composition: every rank makes this call
            description = call_description(f"{self._describe()} {direction} (composed): "
                                           f"{Spec.of(x).describe((-2, -1))}")
        if error is None:
            tile = (x.shape[-2], x.shape[-1]) if direction == FORWARD else \
                (x.shape[-2] - 2 * self.rows, x.shape[-1] - 2 * self.cols)
        else:
            tile = (0, 0)
        order = 0 if direction in (FORWARD, "update") else 1  # columns first, or rows first
        round_, finish = self._round(who, description, error, tile, context.staged, order)
        if error is not None:
            finish()  # raises: headers only, everything that arrives dropped
        sends, receives = self._neighbours
        # where each neighbour's message lands, known before any arrives (a later phase's may come early)
        plan = self._plan(out if direction == FORWARD else x)
        for tag, rank in receives.items():
            round_.expect((rank, tag), plan.incoming[tag][0])
        if self.extents is None:  # the records first: tiles that do not fit anywhere around poison the data
            for tag, rank in sends.items():
                round_.send(rank, tag + _RECORD, None)
            for tag, rank in receives.items():
                round_.expect((rank, tag + _RECORD), None)
            round_.collect([(rank, tag + _RECORD) for tag, rank in receives.items()], records=True)
            if round_.poisoned:
                finish()
        r, c = self.rows, self.cols
        h, w = tile
        if direction == FORWARD:  # the halo is written whole by _fill_halo (neighbours, the ring, zeros past a pole)
            out[..., r:r + h, c:c + w] = x
            self._fill_halo(out, h, w, round_, finish)
            self._across_forward(out, h, w, context)
        elif direction == "update":
            self._fill_halo(x, h, w, round_, finish)
            self._across_forward(x, h, w, context)
        elif direction == ADJOINT:
            work = self._workspace.scratch("adjoint", x, x.size).reshape(x.shape)
            work[...] = x
            self._across_adjoint(work, h, w, context)
            self._return_halo(work, h, w, round_, finish)
            out[...] = work[..., r:r + h, c:c + w]
        else:  # accumulate
            self._across_adjoint(x, h, w, context)
            self._return_halo(x, h, w, round_, finish)

    # --- the two phases -------------------------------------------------------------------

    def _plan(self, P):
        key = (tuple(P.shape), P.dtype.str, backend.is_device_array(P), getattr(getattr(P, "device", None), "id", None))
        h, w = P.shape[-2] - 2 * self.rows, P.shape[-1] - 2 * self.cols
        return self._plans.get(key, lambda: _HaloPlan(P, h, w, self.rows, self.cols))

    def _phase(self, P, plan, moves, add, round_):
        """Send this phase's blocks (headers first), receive the neighbours', then unpack or add them."""
        sends, receives = self._neighbours
        keys = []
        for tag, interior, halo in moves:
            send_region, recv_region = interior, halo
            if add:  # the halo goes home: data travelling with ``tag`` is the opposite move's halo, added inside
                _, interior, halo = next(m for m in moves if m[0] == _OPPOSITE[tag])
                send_region, recv_region = halo, interior
            dest = sends.get(tag)
            if dest is not None:
                message, out_buf = plan.outgoing[tag]
                if out_buf is not None and not round_.poisoned:
                    _copy_runs(out_buf, P, send_region)
                round_.send(dest, tag, message)
            source = receives.get(tag)
            if source is not None:
                keys.append(((source, tag), recv_region, plan.incoming[tag][1]))
        arrived = round_.collect([k for k, _, _ in keys])
        if round_.poisoned:
            return False
        for key, region, buf in keys:
            if key in arrived:
                if add:
                    _add_runs(P, buf, region, self._workspace)
                else:
                    _copy_runs(P, buf, region, into_region=True)
        return True

    def _fill_halo(self, P, h, w, round_, finish):
        """``update``: the columns from the azimuth neighbours, then full rows (corners) from the polar ones."""
        plan = self._plan(P)
        r, c = self.rows, self.cols
        if c and self.grid.nazimuth == 1:  # a one-rank ring wraps onto itself
            inner = slice(r, r + h)
            _move_runs(P, (inner, slice(w, w + c)), (inner, slice(0, c)))
            _move_runs(P, (inner, slice(c, 2 * c)), (inner, slice(c + w, w + 2 * c)))
        if self._phase(P, plan, plan.columns, False, round_):
            self._phase(P, plan, plan.rows, False, round_)
        finish()
        if r and self.grid.polar_rank == 0:
            P[..., 0:r, :] = 0
        if r and self.grid.polar_rank == self.grid.npolar - 1:
            P[..., r + h:, :] = 0

    def _return_halo(self, P, h, w, round_, finish):
        """``accumulate``: the halo rows go home and are added, then the halo columns; the halo is zeroed."""
        plan = self._plan(P)
        r, c = self.rows, self.cols
        if self._phase(P, plan, plan.rows, True, round_):
            if r:
                P[..., 0:r, :] = 0
                P[..., r + h:, :] = 0
            inner = slice(r, r + h)
            if c and self.grid.nazimuth == 1:
                P[..., inner, w:w + c] += P[..., inner, 0:c]
                P[..., inner, c:2 * c] += P[..., inner, c + w:w + 2 * c]
            self._phase(P, plan, plan.columns, True, round_)
            if c:
                P[..., inner, 0:c] = 0
                P[..., inner, c + w:w + 2 * c] = 0
        finish()

    def free(self):
        """Drop the cached plans and scratch buffers (they are rebuilt on the next call)."""
        self._plans.clear()
        self._workspace.clear()

    # --- across the poles -------------------------------------------------------------------

    def _pole_rows(self, h):
        """``[(halo rows, nearest rows)]`` in padded coordinates, for the poles this rank's tiles touch.

        The nearest rows leave out a pole row (``_pole_shift``): the halo row
        at distance ``k`` past the pole mirrors the row at distance ``k``
        inside it.
        """
        r, g = self.rows, self.grid
        north, south = self._pole_shift
        found = []
        if g.polar_rank == 0:
            found.append((slice(0, r), slice(r + north, 2 * r + north)))
        if g.polar_rank == g.npolar - 1:
            found.append((slice(r + h, 2 * r + h), slice(h - south, h + r - south)))
        return found

    def _signs(self, P):
        if self.signs is None:
            return 1
        xp = backend.array_module(P)
        return xp.asarray(self.signs, dtype=P.dtype).reshape(-1, 1, 1)

    def _across_forward(self, P, h, w, context):
        """Fill the rows past the poles from the rows nearest them, half way round (after the neighbours' phase)."""
        poles = self._pole_rows(h) if self._across else None
        if not poles:
            return
        xp, c = backend.array_module(P), self.cols
        band = xp.stack([P[..., near, c:c + w] for _, near in poles], axis=-3)   # (..., poles, r, w)
        whole = xp.empty(band.shape[:-1] + (self.extents[1],), dtype=P.dtype)
        self._band._run(FORWARD, band, whole, context)                          # (..., poles, r, nlon)
        opposite = xp.asarray(self._opposite)
        signs = self._signs(P)
        for k, (halo, _) in enumerate(poles):
            # halo row i lies as far past the pole as row r - 1 - i of the band lies inside it
            P[..., halo, :] = signs * xp.take(whole[..., k, ::-1, :], opposite, axis=-1)

    def _across_adjoint(self, P, h, w, context):
        """The adjoint of :meth:`_across_forward`: the rows past the poles go home and are added; zeroed."""
        poles = self._pole_rows(h) if self._across else None
        if not poles:
            return
        xp, c, nlon = backend.array_module(P), self.cols, self.extents[1]
        whole = xp.zeros(P.shape[:-2] + (len(poles), self.rows, nlon), dtype=P.dtype)
        signs = self._signs(P)
        for k, (halo, _) in enumerate(poles):
            values = (signs * P[..., halo, :])[..., ::-1, :]
            target = whole[..., k, :, :]
            # the opposite columns run in at most a few unbroken stretches (they wrap round at nlon)
            breaks = numpy.flatnonzero(numpy.diff(self._opposite) != 1) + 1
            for a, b in zip(numpy.r_[0, breaks], numpy.r_[breaks, self._opposite.size]):
                start = int(self._opposite[a])
                target[..., start:start + (b - a)] += values[..., a:b]
            P[..., halo, :] = 0
        band = xp.empty(whole.shape[:-1] + (w,), dtype=P.dtype)
        self._band._run(ADJOINT, whole, band, context)
        for k, (_, near) in enumerate(poles):
            P[..., near, c:c + w] += band[..., k, :, :]


class HaloReduce(AdjointOperator):
    """The adjoint of :class:`HaloExchange` as an operator of its own.

    ``forward``: ``(..., h + 2*rows, w + 2*cols)`` -> ``(..., h, w)``, the
    interior plus the halo contributions the neighbours hold for this rank's
    cells (what a scatter-shaped stencil writes across tile borders).
    ``adjoint``: the halo exchange. Same parameters as
    :class:`HaloExchange` (construction is collective over ``grid.cart``);
    ``.H`` is that exchange.
    """

    def __init__(self, grid, rows, cols=0, *, extents=None, poles="zero", signs=None, quadrature=None):
        super().__init__(_NamedHaloExchange(grid, rows, cols, extents=extents, poles=poles, signs=signs,
                                            quadrature=quadrature))

    @property
    def name(self):
        return "HaloReduce"

    @property
    def needs_own_agreement(self):
        return self.op.needs_own_agreement


class _NamedHaloExchange(HaloExchange):
    """The exchange inside a :class:`HaloReduce`: its construction errors say HaloReduce."""

    _label = "HaloReduce"

    @property
    def name(self):
        return "HaloExchange"


class _HaloPlan:
    """The blocks and packed buffers of one padded shape, built once.

    A move is ``(tag, interior region, halo region)``, the tag naming the
    direction the data travels: gathering, the interior block travels with
    ``tag`` and the block arriving with the same tag from the other side
    fills the halo region. Accumulating (the adjoint), the data travelling
    with ``tag`` is the halo of the opposite move going home, and what
    arrives is added onto that move's interior. A zero width has no buffers
    (the message is a header alone).
    """

    def __init__(self, P, h, w, r, c):
        H, W = h + 2 * r, w + 2 * c
        inner, full = slice(r, r + h), slice(0, W)
        self.columns = [(_TO_EAST, (inner, slice(w, w + c)), (inner, slice(0, c))),
                        (_TO_WEST, (inner, slice(c, 2 * c)), (inner, slice(c + w, W)))]
        self.rows = [(_TO_NORTH, (slice(r, 2 * r), full), (slice(r + h, H), full)),
                     (_TO_SOUTH, (slice(h, h + r), full), (slice(0, r), full))]
        lead = tuple(P.shape[:-2])
        self.outgoing, self.incoming = {}, {}
        for width, moves in ((c, self.columns), (r, self.rows)):
            for tag, interior, _ in moves:  # (message with its header room, the data in it)
                shape = lead + (interior[0].stop - interior[0].start, interior[1].stop - interior[1].start)
                empty = width == 0 or math.prod(shape) == 0
                self.outgoing[tag] = (None, None) if empty else message_buffer(P, shape, P.dtype)
                self.incoming[tag] = (None, None) if empty else message_buffer(P, shape, P.dtype)


def _runs(a, region):
    """``a[..., rows, cols]`` seen as an array of its contiguous runs (one void item each).

    NumPy copies a run of ``k`` doubles as one ``k * 8``-byte item, about
    twice as fast as element by element for the thin column blocks of a
    halo. Returns ``None`` when ``a`` is not a C-contiguous host array.
    """
    if not isinstance(a, numpy.ndarray) or not a.flags.c_contiguous:
        return None
    rows, cols = region  # slices of the last two axes, steps of 1
    shape = a.shape[:-2] + (rows.stop - rows.start, cols.stop - cols.start)
    if 0 in shape:
        return None
    strides = a.strides
    item, axis = a.itemsize, len(shape)
    while axis > 0 and strides[axis - 1] == item and (axis == len(shape) or shape[axis] == a.shape[axis]):
        item *= shape[axis - 1]
        axis -= 1
    # C order: the block starts rows.start rows and cols.start columns into the array (computed, not asked for:
    # a view's __array_interface__ costs microseconds, and this runs several times a call)
    offset = rows.start * strides[-2] + cols.start * strides[-1]
    return numpy.ndarray(shape[:axis], dtype=numpy.dtype((numpy.void, item)), buffer=a, offset=offset,
                         strides=strides[:axis])


def _move_runs(P, source, target):
    """``P[target] = P[source]`` for two regions of one shape (they do not overlap), run by run when possible."""
    src, dst = _runs(P, source), _runs(P, target)
    if src is None or dst is None or src.dtype != dst.dtype:
        P[(Ellipsis,) + target] = P[(Ellipsis,) + source]
    else:
        numpy.copyto(dst, src)


def _add_runs(P, buf, region, workspace):
    """``P[region] += buf``, through a contiguous copy of the region when it is made of short runs.

    NumPy adds strided blocks of a few elements element by element; copying
    the runs out, adding contiguously into ``buf`` (the received data, free
    to overwrite) and copying them back was measured twice as fast for the
    column blocks of a (32, 361, 360) tile (91 against 172 us).
    """
    runs = _runs(P, region)
    if runs is None or runs.dtype.itemsize > 256:  # long runs: NumPy adds them at full speed in place
        P[(Ellipsis,) + region] += buf
        return
    own = workspace.scratch("add-runs", buf, buf.size).reshape(buf.shape)
    _copy_runs(own, P, region)
    buf += own
    _copy_runs(P, buf, region, into_region=True)


def _copy_runs(dst, src, region, into_region=False):
    """``dst[...] = src[region]`` (or ``dst[region] = src``), one contiguous run at a time when possible."""
    whole = dst if into_region else src
    runs = _runs(whole, region)
    if runs is None:
        if into_region:
            dst[(Ellipsis,) + region] = src
        else:
            dst[...] = src[(Ellipsis,) + region]
        return
    packed = (src if into_region else dst).reshape(-1).view(numpy.dtype((numpy.void, runs.dtype.itemsize)))
    packed = packed.reshape(runs.shape)
    if into_region:
        numpy.copyto(runs, packed)
    else:
        numpy.copyto(packed, runs)


# --- halo widths from geometry -----------------------------------------------------

def latitude_support_band(lats_in, lats_out, theta_cutoff):
    """For each output latitude, the input latitudes within ``theta_cutoff``.

    Two points on the sphere are at least ``|theta_in - theta_out|`` apart,
    with equality on the same meridian, so the input latitudes that a
    localized operator of radius ``theta_cutoff`` can reach from an output
    latitude form the contiguous band ``|theta_in - theta_out| <= theta_cutoff``.

    Parameters
    ----------
    lats_in, lats_out : array_like, shape ``(nlat_in,)``, ``(nlat_out,)``
        Colatitudes in radians, increasing.
    theta_cutoff : float
        Angular radius in radians.

    Returns
    -------
    lo, hi : ndarray of int, shape ``(nlat_out,)``
        First and last index into ``lats_in`` of the band; ``hi < lo`` where
        the band is empty. Both are non-decreasing.
    """
    lats_in = numpy.asarray(lats_in, dtype=numpy.float64)
    lats_out = numpy.asarray(lats_out, dtype=numpy.float64)
    if lats_in.ndim != 1 or lats_out.ndim != 1:
        raise ValueError("latitude_support_band: latitudes must be 1-D arrays")
    if numpy.any(numpy.diff(lats_in) < 0) or numpy.any(numpy.diff(lats_out) < 0):
        raise ValueError("latitude_support_band: latitudes must be increasing (north pole first)")
    if not theta_cutoff >= 0:
        raise ValueError(f"latitude_support_band: theta_cutoff must be non-negative, got {theta_cutoff}")
    n = len(lats_in)
    lo = numpy.searchsorted(lats_in, lats_out - theta_cutoff, side="left")
    hi = numpy.searchsorted(lats_in, lats_out + theta_cutoff, side="right") - 1

    # searchsorted compares theta_in with theta_out -/+ cutoff, which rounds
    # differently from |theta_in - theta_out| <= cutoff at the very edge of the
    # band; move each end by at most one so the band is exactly that predicate.
    def inside(i):
        return numpy.abs(lats_in[numpy.clip(i, 0, n - 1)] - lats_out) <= theta_cutoff

    for _ in range(2):
        lo = numpy.where((lo > 0) & inside(lo - 1), lo - 1, lo)
        lo = numpy.where((lo < n) & (lo <= hi) & ~inside(lo), lo + 1, lo)
        hi = numpy.where((hi < n - 1) & inside(hi + 1), hi + 1, hi)
        hi = numpy.where((hi >= 0) & (hi >= lo) & ~inside(hi), hi - 1, hi)
    return lo.astype(numpy.int64), hi.astype(numpy.int64)


def _polar_sizes(grid_or_sizes, nlat_in, nlat_out):
    npolar = getattr(grid_or_sizes, "npolar", None)
    if npolar is None and isinstance(grid_or_sizes, int):
        npolar = grid_or_sizes
    if npolar is not None:
        return split_sizes(nlat_in, npolar), split_sizes(nlat_out, npolar)
    try:
        sizes_in, sizes_out = (list(map(int, s)) for s in grid_or_sizes)
    except (TypeError, ValueError):
        raise TypeError("polar_halo_radius: grid_or_sizes must be a ProcessGrid, a number of polar ranks, "
                        "or a pair (input sizes, output sizes)") from None
    if sum(sizes_in) != nlat_in or sum(sizes_out) != nlat_out or len(sizes_in) != len(sizes_out):
        raise ValueError(f"polar_halo_radius: sizes {sizes_in} / {sizes_out} do not split "
                         f"{nlat_in} / {nlat_out} latitudes over the same number of ranks")
    return sizes_in, sizes_out


def polar_halo_radius(grid_or_sizes, lats_in, lats_out, theta_cutoff):
    """Latitude rows a polar rank must borrow from its neighbours.

    A polar rank owns a contiguous range of input and output latitudes; the
    rows it must borrow are where the support band of its output range runs
    past its own input range. The radius is the largest such overhang over
    all ranks, computed from the geometry alone (no communication, the same
    on every rank).

    Parameters
    ----------
    grid_or_sizes : ProcessGrid, int, or (list of int, list of int)
        The grid (or its number of polar ranks), whose ``split_sizes`` of the
        input and output latitudes are used; or the per-rank sizes
        themselves.
    lats_in, lats_out : array_like
        Input and output colatitudes, increasing.
    theta_cutoff : float
        Angular radius of the localized operator, radians.

    Returns
    -------
    int
        The halo width in rows, for ``HaloExchange(grid, rows=...)``; 0 on a
        single polar rank.

    Raises
    ------
    ValueError
        If the radius exceeds the smallest input chunk: the exchange only
        reaches the immediate neighbours.
    """
    lats_in = numpy.asarray(lats_in, dtype=numpy.float64)
    lats_out = numpy.asarray(lats_out, dtype=numpy.float64)
    sizes_in, sizes_out = _polar_sizes(grid_or_sizes, len(lats_in), len(lats_out))
    if len(sizes_in) <= 1:
        return 0
    lo, hi = latitude_support_band(lats_in, lats_out, theta_cutoff)
    radius = 0
    in_start = out_start = 0
    for n_in, n_out in zip(sizes_in, sizes_out):
        rows = numpy.arange(out_start, out_start + n_out)
        nonempty = rows[hi[rows] >= lo[rows]]
        if len(nonempty):
            # bands are monotone: the first and last non-empty rows bound the whole range
            need_lo, need_hi = lo[nonempty[0]], hi[nonempty[-1]]
            radius = max(radius, in_start - need_lo, need_hi - (in_start + n_in - 1))
        in_start += n_in
        out_start += n_out
    smallest = min(sizes_in)
    if radius > smallest:
        raise ValueError(
            f"polar_halo_radius: a halo of {radius} rows is wider than the smallest polar tile ({smallest} rows; "
            f"input latitudes split as {sizes_in}); the exchange reaches only the immediate neighbours, so use "
            "fewer polar ranks, more latitudes or a smaller theta_cutoff")
    return int(radius)
