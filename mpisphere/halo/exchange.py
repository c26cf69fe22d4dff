"""Halo (ghost-cell) exchange on the process grid and its adjoint.

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

The rows past the poles are :mod:`.poles`' (:class:`~.poles.PoleCrossing`),
the blocks, buffers and run-by-run copies :mod:`.plan`'s;
:func:`~mpisphere.polar_halo_radius` (:mod:`mpisphere.geometry`) derives
the halo width of a localized operator from the latitudes and the grid.
"""
import numpy

from .. import backend, dtypes
from ..agreement import REFUSED, Context, InputError, NeighbourRound, Spec, agree, agree_construction, \
    call_description, raise_everywhere
from ..operators import ADJOINT, DISTRIBUTED, FORWARD, AdjointOperator, Layout, LinearOperator
from ..validation import check_choice, check_int
from .plan import FROM, OPPOSITE, RECORD, TO_EAST, TO_NORTH, TO_SOUTH, TO_WEST, HaloPlan, add_runs, copy_runs, \
    move_runs
from .poles import PoleCrossing

__all__ = ["HaloExchange", "HaloReduce"]


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
        self.poles = check_choice(poles, ("zero", "across"), "poles", self._label)
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
        self._poles = None
        if poles == "across":
            self._poles = PoleCrossing(grid, self.rows, self.cols, self.extents, quadrature, self.signs, self._label)
            self.quadrature = self._poles.quadrature
        self._across = self._poles is not None and self._poles.active
        self._workspace = backend.Workspace()
        self._plans = backend.BoundedCache(4)
        self._neighbours = self._find_neighbours()

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
            sends.update({TO_EAST: east, TO_WEST: west})
            receives.update({TO_EAST: west, TO_WEST: east})
        if p > 0:
            sends[TO_NORTH] = (p - 1) * g.nazimuth + a
            receives[TO_SOUTH] = (p - 1) * g.nazimuth + a
        if p < g.npolar - 1:
            sends[TO_SOUTH] = (p + 1) * g.nazimuth + a
            receives[TO_NORTH] = (p + 1) * g.nazimuth + a
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
            expected += [(rank, tag + RECORD) for tag, rank in receives.items()]

        def fits(header, source, tag):
            (ha, wa), (hb, wb) = tile, (int(header[3]), int(header[4]))
            if tag % RECORD in (TO_EAST % RECORD, TO_WEST % RECORD):
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
                                optional={(rank, tag + RECORD): 1 for tag, rank in receives.items()})
        every = [(rank, tag) for tag, rank in sends.items()]
        every += [(rank, tag + RECORD) for tag, rank in sends.items()] if records else []

        def finish():
            problems = round_.finish(every)
            if problems is None:
                return
            lines = [] if error is None else [f"this rank: {error.text}"]
            for (source, tag), found in problems:
                line = f"{FROM[tag if tag in FROM else tag - RECORD]} neighbour rank {source}: {found}"
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
                round_.send(rank, tag + RECORD, None)
            for tag, rank in receives.items():
                round_.expect((rank, tag + RECORD), None)
            round_.collect([(rank, tag + RECORD) for tag, rank in receives.items()], records=True)
            if round_.poisoned:
                finish()
        r, c = self.rows, self.cols
        h, w = tile
        if direction == FORWARD:  # the halo is written whole by _fill_halo (neighbours, the ring, zeros past a pole)
            out[..., r:r + h, c:c + w] = x
            self._fill_halo(out, h, w, round_, finish)
            if self._across:
                self._poles.forward(out, h, w, context)
        elif direction == "update":
            self._fill_halo(x, h, w, round_, finish)
            if self._across:
                self._poles.forward(x, h, w, context)
        elif direction == ADJOINT:
            work = self._workspace.scratch("adjoint", x, x.size).reshape(x.shape)
            work[...] = x
            if self._across:
                self._poles.adjoint(work, h, w, context)
            self._return_halo(work, h, w, round_, finish)
            out[...] = work[..., r:r + h, c:c + w]
        else:  # accumulate
            if self._across:
                self._poles.adjoint(x, h, w, context)
            self._return_halo(x, h, w, round_, finish)

    # --- the two phases -------------------------------------------------------------------

    def _plan(self, P):
        key = (tuple(P.shape), P.dtype.str, backend.is_device_array(P), getattr(getattr(P, "device", None), "id", None))
        h, w = P.shape[-2] - 2 * self.rows, P.shape[-1] - 2 * self.cols
        return self._plans.get(key, lambda: HaloPlan(P, h, w, self.rows, self.cols)).claim(P)

    def _phase(self, P, plan, moves, add, round_):
        """Send this phase's blocks (headers first), receive the neighbours', then unpack or add them."""
        sends, receives = self._neighbours
        keys = []
        for tag, interior, halo in moves:
            send_region, recv_region = interior, halo
            if add:  # the halo goes home: data travelling with ``tag`` is the opposite move's halo, added inside
                _, interior, halo = next(m for m in moves if m[0] == OPPOSITE[tag])
                send_region, recv_region = halo, interior
            dest = sends.get(tag)
            if dest is not None:
                message, out_buf = plan.outgoing[tag]
                if out_buf is not None and not round_.poisoned:
                    copy_runs(out_buf, P, send_region)
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
                    add_runs(P, buf, region, self._workspace)
                else:
                    copy_runs(P, buf, region, into_region=True)
        return True

    def _fill_halo(self, P, h, w, round_, finish):
        """``update``: the columns from the azimuth neighbours, then full rows (corners) from the polar ones."""
        plan = self._plan(P)
        r, c = self.rows, self.cols
        if c and self.grid.nazimuth == 1:  # a one-rank ring wraps onto itself
            inner = slice(r, r + h)
            move_runs(P, (inner, slice(w, w + c)), (inner, slice(0, c)))
            move_runs(P, (inner, slice(c, 2 * c)), (inner, slice(c + w, w + 2 * c)))
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
