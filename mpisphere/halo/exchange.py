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
  message carries a header of twelve integers in front of its data (this
  rank's verdict on its own input, a digest of the call, its tile's height
  and width, the size of the data that follows; see
  ``mpisphere.agreement.NeighbourRound``). Every call exchanges a
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
``extents`` there.

Two paths for the data
----------------------
Each block goes one of two ways, chosen by its sender, message by message:

* **shared memory**: the sender's padded tile comes from :meth:`~mpisphere.HaloExchange.zeros`
  or :meth:`~mpisphere.HaloExchange.empty` (a window shared by the ranks of the node,
  :mod:`.shared`) and the receiver is on the same node. The header goes
  alone; the receiver copies the block from the sender's memory into its
  halo, or adds it onto its own cells (rows straight from the sender's tile;
  the thin column blocks from where the sender packed them behind its tile,
  which reads contiguously), and acknowledges; the sender leaves the call
  once its blocks are acknowledged. No MPI transfer, no message buffers.
* **messages**: anything else (plain arrays, device arrays, neighbours on
  other nodes, ``config.shared_memory = False``): the block is packed into
  a buffer a per-shape plan holds (NumPy packing beats MPI subarray
  datatypes on these thin blocks, measured with MPICH: 0.43 against 0.88 ms
  for the two column messages of a (32, 361, 360) tile) and sent behind the
  header by a persistent send.

The receiver reads the header first either way, so the two kinds mix in one
call and the agreement is the same. Results are bitwise the same on both
paths: the same values are copied, and the same sums made in the same order.

The call goes down once: the pattern (:mod:`.pattern`: widths, neighbours,
the moves of a tile's phases) and the boundary (:mod:`.poles`: zeros past
the poles, or the field across them) plan it, and ``HaloExchange._run``
runs the phases with the neighbours' round. :func:`~mpisphere.polar_halo_radius`
(:mod:`mpisphere.geometry`) derives the halo width of a localized operator
from the latitudes and the grid.
"""
import numpy

from .. import backend, dtypes
from ..agreement import REFUSED, Call, Context, InputError, NeighbourRound, Spec, agree, agree_construction, \
    call_description, cause_first, collective, raise_everywhere
from ..agreement.collective import printed_once
from ..operators import ADJOINT, DISTRIBUTED, FORWARD, AdjointOperator, Layout, LinearOperator
from ..settings import config
from ..validation import check_choice, check_int
from .pattern import FROM, RECORD, TO_EAST, TO_WEST, HaloPattern
from .plan import MessagePlan, add_runs
from .poles import AcrossPoles, ZeroPoles
from .shared import NodeMemory, SharedLink

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
    array, for codes that keep ghost cells inside their fields; on arrays
    from :meth:`zeros` or :meth:`empty` (memory shared on the node) they
    read the neighbours' blocks straight from their tiles.

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
        if poles == "across":
            across = AcrossPoles(grid, self.rows, self.cols, self.extents, quadrature, self.signs, self._label)
            self.quadrature = across.quadrature
            self.boundary = across if across.active else ZeroPoles(grid, self.rows)
        else:
            self.boundary = ZeroPoles(grid, self.rows)
        self.pattern = HaloPattern(grid, self.rows, self.cols)
        self._workspace = backend.Workspace()
        self._plans = backend.BoundedCache(4, drop=MessagePlan.free)
        self._link = SharedLink(self.pattern, self.rows, self.cols, self._workspace)

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
            nlat, nlon = self.extents
            cause = (f"got the whole {nlat} x {nlon} field where this rank's {what} belongs"
                     if (H, W) == (nlat, nlon) and self.grid.size > 1 else
                     f"the last two axes {(H, W)} are not this rank's {what} of the {nlat} x {nlon} field")
            fix = (f"grid.scatter(field) gives each rank its tile, of grid.local_shape({nlat}, {nlon})"
                   + (f" plus {2 * self.rows} rows and {2 * self.cols} columns of halo (HaloExchange.zeros gives "
                      "one)" if padded else ""))
            raise InputError(f"{cause}\n  fix: {fix}\n  rank {self.grid.rank}: expected {expected}, got {(H, W)}")
        if min(tile) < 1:
            raise InputError(f"a {what} of {(H, W)} holds no interior for halo {self.rows} x {self.cols}")
        message = self._width_error(tile[0], tile[1], f"this rank's tile is {tile}", f"this rank's tile is {tile}",
                                    "this rank's")
        if message is not None:
            raise InputError(message)
        problem = self.boundary.check(spec.shape)
        if problem is not None:
            raise InputError(problem)
        return tile

    def _output(self, direction, spec):
        h, w = self._tile_of(spec, direction == ADJOINT)
        if direction == FORWARD:
            return spec.but(shape=spec.shape[:-2] + (h + 2 * self.rows, w + 2 * self.cols)), spec.describe((-2, -1))
        return spec.but(shape=spec.shape[:-2] + (h, w)), spec.describe((-2, -1))

    def _output_in_place(self, direction, spec):
        self._tile_of(spec, True)
        return spec, spec.describe((-2, -1))

    def _reserve(self, direction, x, out):
        self._message_plan(out if direction == FORWARD else x)
        if direction == ADJOINT and out is not x:
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

    @collective
    def zeros(self, lead=(), dtype=numpy.float64):
        """This rank's padded tile, zeroed, in memory shared by the ranks of its node (collective).

        Parameters
        ----------
        lead : int or tuple of int
            The leading axes (e.g. the number of fields); the same on every rank.
        dtype : dtype, optional
            The same on every rank. Default float64.

        Returns
        -------
        numpy.ndarray
            Shape ``lead + (h + 2*rows, w + 2*cols)`` for this rank's tile
            ``(h, w)`` of the ``extents`` field, C-contiguous, host memory.

        Notes
        -----
        :meth:`update` and :meth:`accumulate` on this array (the array
        itself, not a view of it) leave the blocks the neighbours of the same
        node need for them to read: the rows straight from the tile, the thin
        column blocks packed behind it; no MPI transfer (see the module
        notes). Any halo exchange of the same grid and widths can use it.
        The memory is a window of ``MPI_Win_allocate_shared`` (one per call:
        on each rank its tile and its two column blocks) and lives until
        ``grid.free()``, or, where the program still holds the array then,
        until the process ends (the array stays readable; no halo call can
        use it once the grid is freed).
        Collective over ``grid.cart``: every rank calls it with the same
        ``lead`` and ``dtype``, or every rank raises.
        """
        return self._allocate("zeros", lead, dtype, fill=True)

    @collective
    def empty(self, lead=(), dtype=numpy.float64):
        """As :meth:`zeros`, without zeroing the memory (collective)."""
        return self._allocate("empty", lead, dtype, fill=False)

    def _allocate(self, what, lead, dtype, fill):
        who = f"{self._label}.{what}"
        _check_grid(self.grid, who)   # freed together on every rank (free agrees): the same error everywhere
        call = Call(self.grid.cart, who)
        shape = dtype_str = None
        with call.local():
            if self.tile is None:
                raise TypeError("a halo without extents does not know this rank's tile; build it with "
                                "extents=(nlat, nlon) to allocate from it")
            lead = (lead,) if isinstance(lead, (int, numpy.integer)) and not isinstance(lead, bool) else lead
            if not isinstance(lead, (tuple, list)):
                raise TypeError(f"lead must be an int or a tuple of ints, got {type(lead).__name__}")
            try:
                lead = tuple(check_int(n, "lead", who, minimum=0) for n in lead)
            except (TypeError, ValueError) as exc:  # the call adds who and which rank
                raise type(exc)(str(exc).removeprefix(f"{who}: ")) from None
            dtype = numpy.dtype(dtype)
            problem = dtypes.refusal(dtype, "moved")
            if problem:
                raise TypeError(problem)
            h, w = self.tile
            shape, dtype_str = lead + (h + 2 * self.rows, w + 2 * self.cols), dtype.str
        call.agree(lead=None if shape is None else list(shape[:-2]), dtype=dtype_str)
        memory = self.grid.node_memory
        if memory is None:
            with call.local("cannot set up memory shared on the node"):
                memory = NodeMemory(self.grid.cart)
            call.agree()
            self.grid.node_memory = memory
        record = None
        h, c = self.tile[0], self.cols
        staging = [(tag, shape[:-2] + (h, c)) for tag in (TO_EAST, TO_WEST) if c and tag in self.pattern.sends]
        with call.local(f"cannot allocate {shape} {dtype.name} in memory shared on the node"):
            record = memory.allocate(shape, dtype, staging)
        call.agree()
        if fill:
            record.array[...] = 0
        return record.array

    def _agreement(self, comm, who, error, description, spec, signature):
        """Across the poles: over the whole grid first. Otherwise nothing yet: the headers carry it."""
        if self.boundary.collective:
            context = agree(self.grid.cart, who, error, description, spec, signature)
            return _HaloContext(context.staged, None, call_description(f"{signature}: {description}"), who)
        return _HaloContext(Context.local(spec).staged, error, call_description(f"{signature}: {description}"), who)

    def _refuse(self, comm, who, description, spec, signature):
        """A call refused on this rank: its messages still go out (headers only) and come in (dropped)."""
        error = InputError(REFUSED, RuntimeError)
        if self.boundary.collective:
            raise_everywhere(self.grid.cart, who, error)
            return
        self._round(who, None, error, (0, 0), False, 0)[1]()

    def _round(self, who, description, error, tile, staged, order):
        """A :class:`NeighbourRound` for one call, and the function that ends it (raises on a problem).

        The function takes the number of the call when this rank left
        blocks in shared memory: it waits for their acknowledgements first.
        """
        sends, receives = self.pattern.sends, self.pattern.receives
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

        memory = g.node_memory
        acknowledge = None if memory is None else (lambda source, tag, where: memory.acknowledge(source, tag, where[1]))
        text = description if description is not None else f"{self._describe()} (refused)"
        round_ = NeighbourRound(g.cart, who, text, tile, error, expected, fits, order=order, staged=staged,
                                workspace=self._workspace, pattern=int(records),
                                optional={(rank, tag + RECORD): 1 for tag, rank in receives.items()},
                                acknowledge=acknowledge)
        number = g.cart.failures.next_round()
        every = [(rank, tag) for tag, rank in sends.items()]
        every += [(rank, tag + RECORD) for tag, rank in sends.items()] if records else []

        def finish(sequence=None):
            problems = round_.finish(every)
            if round_.published:  # blocks left in shared memory: not changed before the neighbours have read them
                memory.await_acknowledgements(round_.published, sequence, who)
            if problems is None:
                return
            after = []  # the findings' lines after their causes (what to do, details): at the end, each once
            cause = lambda text: cause_first(text, after)  # noqa: E731
            lines = [] if error is None else [f"this rank: {cause(error.text)}"]
            for (source, tag), found in problems:
                line = f"{FROM[tag if tag in FROM else tag - RECORD]} neighbour rank {source}: {cause(found)}"
                if line not in lines:
                    lines.append(line)
            details = round_.details()
            shown = "" if not details else " [" + " | ".join(
                [f"this rank: {cause(text)}"] + [f"rank {r}: {cause(e) if e else d}" for r, (e, d) in details.items()]
            ) + "]"
            # one class on every rank the failure reaches: the mistake's own (a mismatch is a ValueError)
            kind = error.kind if error is not None else round_.culprit[1] if round_.culprit else ValueError
            culprit = round_.culprit[0] if round_.culprit else None
            cause = f"rank {g.rank} of {g.size} (polar {g.polar_rank}, azimuth {g.azimuth_rank}) cannot exchange " \
                    "its halo: " + "; ".join(lines)
            own = bool(round_.culprit and round_.culprit[2])
            g.cart.failures.announce(number, who, culprit, kind, cause, own)  # the ranks farther away raise next
            exc = kind(f"{who}: {cause}{shown}" + "".join(f"\n{line}" for line in after))
            # each rank's message is its own view (its neighbours); where the mistake is one rank's own input, that
            # rank prints its message in full and the others one line naming it (a pair of calls that do not
            # match has no one culprit: each rank prints its own)
            if error is None and round_.culprit and round_.culprit[2]:
                brief = f"rank {g.rank} of {g.size} cannot exchange its halo: the mistake at rank {culprit} " \
                        "reached it through its neighbours"
                raise printed_once(exc, who, g.rank, culprit, brief, everywhere=False)
            exc.mpisphere_message, exc.mpisphere_reporter = str(exc), None
            raise exc

        return round_, finish

    def _run(self, direction, x, out, context):
        """Plan the call from the pattern and the boundary, then run it with the neighbours' round.

        ``out is x``: in place (:meth:`update`, :meth:`accumulate`).
        """
        error = getattr(context, "error", None)
        description = getattr(context, "description", None)
        who = getattr(context, "who", None) or f"{self.name}.{direction}"
        if description is None:  # inside an agreed composition: every rank makes this call
            description = call_description(f"{self._describe()} {direction} (composed): "
                                           f"{Spec.of(x).describe((-2, -1))}")
        gather, in_place = direction == FORWARD, out is x
        r, c = self.rows, self.cols
        if error is not None:
            tile = (0, 0)
        elif gather and not in_place:
            tile = (x.shape[-2], x.shape[-1])
        else:
            tile = (x.shape[-2] - 2 * r, x.shape[-1] - 2 * c)
        round_, finish = self._round(who, description, error, tile, context.staged, 0 if gather else 1)
        if error is not None:
            finish()  # raises: headers only, everything that arrives dropped
        h, w = tile
        if in_place:
            P = x
        elif gather:  # the halo is written whole below (neighbours, the ring, the boundary)
            P = out
            P[..., r:r + h, c:c + w] = x
        else:
            P = self._workspace.scratch("adjoint", x, x.size).reshape(x.shape)
            P[...] = x
        plan = self._message_plan(P)
        for tag, rank in self.pattern.receives.items():  # where each message lands, known before any arrives
            round_.expect((rank, tag), plan.incoming[tag][0])
        if self.extents is None:  # the records first: tiles that do not fit anywhere around poison the data
            for tag, rank in self.pattern.sends.items():
                round_.send(rank, tag + RECORD, None)
            for tag, rank in self.pattern.receives.items():
                round_.expect((rank, tag + RECORD), None)
            round_.collect([(rank, tag + RECORD) for tag, rank in self.pattern.receives.items()], records=True)
            if round_.poisoned:
                finish()
        sender = self._link.sender(self.grid.node_memory, P, config.shared_memory)
        first, second = self.pattern.phases(h, w, gather)
        if gather:
            self.pattern.wrap(P, h, w)
            if self._phase(P, first, True, round_, plan, sender):
                self._phase(P, second, True, round_, plan, sender)
            finish(None if sender is None else sender[1])
            self.boundary.fill(P, h, w, context)
        else:
            self.boundary.give_back(P, h, w, context)
            if self._phase(P, first, False, round_, plan, sender):
                self.pattern.unwrap(P, h, w)
                self._phase(P, second, False, round_, plan, sender)
            finish(None if sender is None else sender[1])
            self.pattern.clear(P, h, w)
            if not in_place:
                out[...] = P[..., r:r + h, c:c + w]

    # --- the plan ---------------------------------------------------------------------

    def _message_plan(self, P):
        key = (tuple(P.shape), P.dtype.str, backend.is_device_array(P), getattr(getattr(P, "device", None), "id", None))
        h, w = P.shape[-2] - 2 * self.rows, P.shape[-1] - 2 * self.cols
        return self._plans.get(key, lambda: MessagePlan(P, self.pattern, h, w, self.grid.cart)).claim(P)

    def _phase(self, P, moves, gather, round_, plan, sender):
        """Send this phase's blocks (or leave them in shared memory), then fill or add what arrives.

        Returns False when the round is poisoned (the caller stops and finishes).
        """
        sends, receives = self.pattern.sends, self.pattern.receives
        memory = self.grid.node_memory
        incoming = []
        for move in moves:
            dest = sends.get(move.tag)
            if dest is not None:
                message, buf = plan.outgoing[move.tag]
                if sender is not None and buf is not None and not round_.poisoned and memory.on_node(dest):
                    round_.send(dest, move.tag, None, shared=(buf.nbytes, self._link.leave(P, move, sender, buf)))
                else:
                    if buf is not None and not round_.poisoned:
                        plan.pack(move.tag, move.send)
                    round_.send(dest, move.tag, message, request=plan.request(move.tag, dest))
            source = receives.get(move.tag)
            if source is not None:
                incoming.append(((source, move.tag), move.recv, plan.incoming[move.tag][1]))
        arrived = round_.collect([key for key, _, _ in incoming])
        if round_.poisoned:
            return False
        for key, region, buf in incoming:
            where = round_.shared.get(key)
            if where is not None:
                self._link.read(memory, P, key, where, region, gather, round_, sender)
            elif key in arrived:
                if gather:
                    plan.unpack(key[1], region)
                else:
                    add_runs(P, buf, region, self._workspace)
        return not round_.poisoned

    def free(self):
        """Drop the cached plans, their persistent requests and the scratch buffers (rebuilt on the next call).

        Arrays from :meth:`zeros` and :meth:`empty` stay: they are freed with the grid.
        """
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
