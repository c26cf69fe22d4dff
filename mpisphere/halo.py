"""Halo (ghost-cell) exchange on the process grid, its adjoint, and halo widths from geometry.

A tile ``(..., h, w)`` is padded to ``(..., h + 2*rows, w + 2*cols)``:

* ``rows`` latitude rows from the polar neighbours, zeros past the poles (the
  polar axis of the grid is not periodic);
* ``cols`` longitude columns from the azimuth neighbours, periodic (on a
  one-rank ring the halo comes from the rank's own tile);
* the four corner blocks from the diagonal neighbours (zeros past the poles).

With ``poles="across"`` the rows past a pole are not zeros but the field
continued across it: the row at distance ``k`` beyond the pole is the row at
distance ``k`` inside it, half way round (longitude + 180 degrees), times a
sign per field (``signs``: -1 for the components of a vector, which turn
round as they cross the pole). Those rows belong to the ranks of the first
(last) polar row that hold the opposite longitudes: the ranks of that polar
row gather the ``rows`` rows nearest the pole over ``grid.azimuth``
(``Allgatherv``; the adjoint sums them back with ``Reduce_scatter``), and a
call agrees over the whole grid rather than with the neighbours only.

The exchange runs in two phases on the Cartesian neighbours, never a
collective over the grid: first the columns of the interior rows along the
azimuth ring, then full padded-width rows along the polar axis, which carries
the corners. The adjoint (``accumulate``) runs the phases in reverse: halo
rows go home first and are added onto the owner's rows at full padded width,
then halo columns (now holding the corner contributions) go home and are
added onto the owner's columns; what lies past a pole is dropped.

Agreement with the neighbours
-----------------------------
A halo exchange talks only to its (up to eight) neighbours, so it agrees
with them, not with the whole grid: before the data moves, each rank sends
every neighbour a record of four integers (its own verdict on its input, a
digest of the call: operator, widths, direction, leading shape, dtype, and
its tile's height and width) and receives theirs. A pair of neighbours
exchanges data only when both records are clean and fit together (same
digest, equal heights along a row of the grid and equal widths along a
column, halos no wider than the tiles they come from); both sides decide
alike, so no message is left unmatched. A rank raises when anything in its
3x3 neighbourhood is wrong (its own input, a neighbour's, or a pair whose
data reaches its halo), with the neighbours' own descriptions in the
message; ranks farther from a mistake exchanged nothing with it and return
correct results. Composed with other operators (``@``), a halo exchange
takes part in the composition's agreement over the whole grid instead,
which is why it needs ``extents`` there.

Each phase posts its messages together (``Isend``/``Irecv`` on the
neighbours), packed into buffers that a per-shape plan allocates once.
(Measured with MPICH: packing with NumPy beats MPI subarray datatypes on
these thin blocks, 0.12 against 0.22 ms for a column exchange.) A width of 0
in a direction posts no message in that direction.

:func:`polar_halo_radius` derives the halo width of a localized operator
(a convolution of a given angular radius) from the latitudes and the grid.
"""


import numpy
from mpi4py import MPI

from . import backend, collectives, dtypes
from .settings import config
from .operators import (ADJOINT, DISTRIBUTED, FORWARD, AdjointOperator, Context, InputError, Layout, LinearOperator,
                        Spec, agree, call_description, check_out, digest)
from .partition import check_int, split_sizes
from .primitives import GatherFromCopyTo

__all__ = ["HaloExchange", "HaloReduce", "latitude_support_band", "polar_halo_radius"]

# message tags of the data, one per direction of travel
_TO_NORTH, _TO_SOUTH, _TO_WEST, _TO_EAST = 11, 12, 13, 14
# the eight neighbours: (polar step, azimuth step); records travel with tag _META, details with _META + 1
_DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))
_NAMES = ("north", "south", "west", "east", "north-west", "north-east", "south-west", "south-east")
_META = 100
_GATHER = {FORWARD: True, ADJOINT: False, "update": True, "accumulate": False}


def _check_grid(grid, who):
    if not (hasattr(grid, "cart") and hasattr(grid, "polar") and hasattr(grid, "polar_neighbors")):
        hint = (" (a communicator; pass the ProcessGrid it belongs to)" if isinstance(grid, MPI.Comm) else "")
        raise TypeError(f"{who}: grid must be a ProcessGrid, got {type(grid).__name__}{hint}")
    if getattr(grid, "freed", False):
        raise RuntimeError(f"{who}: the grid was freed (grid.free())")


def _check_extents(extents, who):
    try:
        nlat, nlon = extents
    except (TypeError, ValueError):
        raise TypeError(f"{who}: extents must be a pair (nlat, nlon) of integers, got {extents!r}") from None
    return check_int(nlat, "extents[0] (nlat)", who, minimum=1), check_int(nlon, "extents[1] (nlon)", who, minimum=1)


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
        and every call checks its tile shape against this rank's tile; it is
        needed to compose the exchange with other operators. Without it, the
        neighbours check each other's tiles when they agree.

    Notes
    -----
    ``forward``: ``(..., h, w)`` -> ``(..., h + 2*rows, w + 2*cols)``.
    ``adjoint``: ``(..., h + 2*rows, w + 2*cols)`` -> ``(..., h, w)``, the
    interior plus the halo contributions that other ranks hold for this
    rank's cells. Both distributed over ``grid.cart``.

    :meth:`update` and :meth:`accumulate` do the same in place on a padded
    array, for codes that keep ghost cells inside their fields.

    poles : {"zero", "across"}, keyword-only
        What lies past the poles: zeros (default, as torch-harmonics), or the
        field continued across the pole (see the module notes; needs
        ``extents`` and an even ``nlon``).
    signs : sequence of +1 / -1, keyword-only
        With ``poles="across"``: the factor for each entry of the input's
        axis ``-3`` (the fields) as it crosses a pole, e.g. ``(1, -1, -1)``
        for ``(h, u, v)``. Default: +1 for every field.

    Raises
    ------
    ValueError
        A halo wider than the smallest tile in its direction (the exchange
        would have to reach past the neighbour), raised before any message.
    """

    _label = "HaloExchange"

    def __init__(self, grid, rows, cols=0, *, extents=None, poles="zero", signs=None):
        _check_grid(grid, self._label)
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
        if self._across:
            self._prepare_across()
        self._workspace = backend.Workspace()
        self._plans = {}
        self._neighbours = self._find_neighbours()

    def _prepare_across(self):
        """Checks and index arrays of ``poles="across"`` (identical on every rank: no message yet)."""
        if self.extents is None:
            raise ValueError(f"{self._label}: poles='across' needs extents=(nlat, nlon): the rows past a pole "
                             "come from the opposite longitudes, which only the global grid locates")
        nlat, nlon = self.extents
        if nlon % 2:
            raise ValueError(f"{self._label}: poles='across' needs an even nlon (the longitude half way round "
                             f"must be a grid column), got nlon={nlon}")
        sizes = self.grid.lat_sizes(nlat)
        if self.rows > min(sizes[0], sizes[-1]):
            raise ValueError(f"{self._label}: poles='across' takes the {self.rows} rows nearest each pole from the "
                             f"first and last polar tiles, which have {sizes[0]} and {sizes[-1]} rows "
                             f"(nlat={nlat} split as {sizes}); use fewer halo rows or fewer polar ranks")
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

    def _describe(self):
        across = "" if self.poles == "zero" else \
            f", poles='across', signs={None if self.signs is None else self.signs.astype(int).tolist()}"
        return f"{self._label}(rows={self.rows}, cols={self.cols}, extents={self.extents}{across})"

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
        """``{direction: cart rank}`` of the neighbours whose data this exchange moves (not itself)."""
        g = self.grid
        found = {}
        for d, (dp, da) in enumerate(_DIRECTIONS):
            if dp and not (self.rows and g.npolar > 1):
                continue
            if da and not (self.cols and g.nazimuth > 1):
                continue
            p = g.polar_rank + dp
            if not 0 <= p < g.npolar:
                continue
            found[d] = p * g.nazimuth + (g.azimuth_rank + da) % g.nazimuth
        return found

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
        problem = dtypes.unsupported(spec.dtype)
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

    # --- calls ------------------------------------------------------------------------

    def update(self, padded):
        """Fill the halo of ``padded`` (``(..., h + 2*rows, w + 2*cols)``) in place.

        The interior is read, never written; nothing is allocated after the
        first call for a shape. Returns ``padded``.
        """
        return self._call("update", padded, None)

    def accumulate(self, padded):
        """Adjoint of :meth:`update`, in place: add the halo onto its owners, zero it.

        Returns ``padded``.
        """
        return self._call("accumulate", padded, None)

    def _apply(self, direction, x, out, label=None, runner=None):
        return self._call(direction, x, out)

    def _call(self, label, x, out, who=None):
        """One call: local checks, agreement with the neighbours, then the exchange."""
        who = who or f"{self.name}.{label}"
        if getattr(self.grid, "freed", False):
            raise RuntimeError(f"{who}: the grid was freed (grid.free()); build the operator on a live grid")
        in_place = label in ("update", "accumulate")
        error, spec, result, tile = None, None, None, (0, 0)
        try:
            spec = Spec.of(x, "padded array" if in_place else "input")
            result, _ = self._output(label, spec)
            tile = self._tile_of(spec, label != FORWARD)
            if in_place and not backend.is_writeable(x):
                raise InputError("the padded array is read-only; update and accumulate write into it")
            if out is not None:
                check_out(out, result, x)
        except InputError as exc:
            error = exc
        lock = self._guard_lock()
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"{who}: another thread is running an mpisphere operation on the same grid now; give "
                               "each thread its own grid: grid.dup()")
        try:
            if self._across:  # it talks to a whole polar row: agree over the grid, every rank raises alike
                description = "(input not understood)" if spec is None else spec.describe((-2, -1))
                context = agree(self.grid.cart, who, error, description, spec, f"{self._describe()} {label}")
                pairs, failure = set(self._neighbours), None
            else:
                pairs, failure = self._agree(who, label, error, spec, tile)
                context = Context.local(spec)
            if error is None:
                out = self._exchange(label, x, out, result, tile, pairs, context)
            if failure is not None:
                raise failure()
            return out
        finally:
            lock.release()

    def _exchange(self, label, x, out, result, tile, pairs, context):
        """The data movement of one call, with the agreed neighbour ``pairs``."""
        h, w = tile
        r, c = self.rows, self.cols
        if label == FORWARD:
            if out is None:
                with backend.device_of(x):
                    out = backend.array_module(x).empty(result.shape, result.dtype)
            out[..., r:r + h, c:c + w] = x
            self._gather(out, h, w, pairs, context)
            self._across_forward(out, h, w, context)
            return out
        if label == ADJOINT:
            work = self._workspace.scratch("adjoint", x, x.size).reshape(x.shape)
            work[...] = x
            self._across_adjoint(work, h, w, context)
            self._scatter_add(work, h, w, pairs, context)
            if out is None:
                with backend.device_of(x):
                    out = backend.array_module(x).empty(result.shape, result.dtype)
            out[...] = work[..., r:r + h, c:c + w]
            return out
        if _GATHER[label]:
            self._gather(x, h, w, pairs, context)
            self._across_forward(x, h, w, context)
        else:
            self._across_adjoint(x, h, w, context)
            self._scatter_add(x, h, w, pairs, context)
        return x

    def _run(self, direction, x, out, context):
        """The exchange inside an agreed composition: every neighbour pair is known to fit."""
        pairs = set(self._neighbours)
        h, w = self.tile
        r, c = self.rows, self.cols
        if direction == FORWARD:
            out[...] = 0
            out[..., r:r + h, c:c + w] = x
            self._gather(out, h, w, pairs, context)
            self._across_forward(out, h, w, context)
        else:
            work = self._workspace.scratch("adjoint", x, x.size).reshape(x.shape)
            work[...] = x
            self._across_adjoint(work, h, w, context)
            self._scatter_add(work, h, w, pairs, context)
            out[...] = work[..., r:r + h, c:c + w]

    # --- across the poles -------------------------------------------------------------------

    def _pole_rows(self, h):
        """``[(halo rows, nearest rows)]`` in padded coordinates, for the poles this rank's tiles touch."""
        r, g = self.rows, self.grid
        found = []
        if g.polar_rank == 0:
            found.append((slice(0, r), slice(r, 2 * r)))
        if g.polar_rank == g.npolar - 1:
            found.append((slice(r + h, 2 * r + h), slice(h, h + r)))
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

    # --- agreement with the neighbours --------------------------------------------------

    def _agree(self, who, label, error, spec, tile):
        """Exchange records with the neighbours: ``(pairs to exchange data with, failure or None)``.

        A rank that must fail still exchanges with every neighbour whose pair
        fits, because that neighbour, two steps from the mistake, may see
        nothing wrong and wait for the data; ``failure()`` builds the
        exception (exchanging the details with the neighbours concerned).
        """
        description = call_description(f"{self._describe()} {label}: "
                                       + ("(input not understood)" if spec is None else spec.describe((-2, -1))))
        mine = numpy.array([0 if error is None else 1, digest(description), tile[0], tile[1]], dtype=numpy.int64)
        neighbours = self._neighbours
        if not neighbours or not config.agreement:
            if error is not None:
                raise error.kind(f"{who}: rank {self.grid.rank} of {self.grid.size}: {error.text}")
            return set(neighbours), None
        cart = self.grid.cart
        # one record per distinct neighbour (on small grids one rank is the neighbour in several directions)
        distinct = sorted(set(neighbours.values()))
        received = {rank: numpy.empty(4, numpy.int64) for rank in distinct}
        requests = [cart.Irecv([received[rank], MPI.INT64_T], source=rank, tag=_META) for rank in distinct]
        requests += [cart.Isend([mine, MPI.INT64_T], dest=rank, tag=_META) for rank in distinct]
        MPI.Request.Waitall(requests)
        records = {d: received[rank] for d, rank in neighbours.items()}
        fits = {d: self._fit(mine, records[d], d) for d in neighbours}
        problems = [] if error is None else [f"this rank: {error.text}"]
        for d in neighbours:
            if records[d][0]:
                problems.append(f"{_NAMES[d]} neighbour rank {neighbours[d]} has an input it cannot use")
            elif fits[d] is not None:
                problems.append(f"{_NAMES[d]} neighbour rank {neighbours[d]}: {fits[d]}")
        # the neighbours among themselves: data reaches this rank's corners through them, and tiles
        # that do not fit together anywhere in the block mean the field is not one field
        at = {(0, 0): (mine, "this rank")}
        at.update({_DIRECTIONS[d]: (records[d], f"rank {neighbours[d]}") for d in neighbours})
        positions = sorted(at)
        for i, u in enumerate(positions):
            for v in positions[i + 1:]:
                step = (v[0] - u[0], v[1] - u[1])
                if (0, 0) in (u, v) or max(abs(step[0]), abs(step[1])) > 1 or at[u][0][0] or at[v][0][0]:
                    continue
                found = self._fit(at[u][0], at[v][0], _DIRECTIONS.index(step))
                if found is not None:
                    problems.append(f"{at[u][1]} and {at[v][1]}, neighbours of this rank: {found}")
        pairs = {d for d in neighbours if fits[d] is None and not records[d][0] and error is None}
        if not problems:
            return pairs, None

        def fail():
            details = self._details(who, error, description, neighbours, records, fits)
            g = self.grid
            return (error.kind if error is not None else ValueError)(
                f"{who}: rank {g.rank} of {g.size} (polar {g.polar_rank}, azimuth {g.azimuth_rank}) cannot exchange "
                "its halo: " + "; ".join(problems) + details)
        return pairs, fail

    def _fit(self, a, b, d):
        """Why records ``a`` and ``b`` of neighbours in direction ``d`` cannot exchange, or ``None`` (symmetric)."""
        if a[0] or b[0]:
            return "an input it cannot use"
        if a[1] != b[1]:
            return "the two ranks are not making the same call (another operator, direction, batch shape or dtype)"
        dp, da = _DIRECTIONS[d]
        (ha, wa), (hb, wb) = a[2:4], b[2:4]
        if dp and not da and wa != wb:
            return f"tiles of widths {wa} and {wb} in one column of the grid"
        if da and not dp and ha != hb:
            return f"tiles of heights {ha} and {hb} in one row of the grid"
        if dp and min(ha, hb) < self.rows:
            return f"a halo of {self.rows} rows is wider than a tile of {min(ha, hb)} rows"
        if da and min(wa, wb) < self.cols:
            return f"a halo of {self.cols} columns is wider than a tile of {min(wa, wb)} columns"
        return None

    def _details(self, who, error, description, neighbours, records, fits):
        """The neighbours' own descriptions, exchanged with every neighbour of a failing pair (both sides do)."""
        partners = {d: rank for d, rank in neighbours.items() if fits[d] is not None or records[d][0] or error}
        if not partners:
            return ""
        cart = self.grid.cart
        mine = (None if error is None else error.text, description)
        ranks = sorted(set(partners.values()))
        sends = [cart.isend(mine, dest=rank, tag=_META + 1) for rank in ranks]
        theirs = {rank: cart.recv(source=rank, tag=_META + 1) for rank in ranks}
        MPI.Request.Waitall(sends)
        lines = [f"this rank: {description}"]
        for rank, (text, their_description) in theirs.items():
            where = "/".join(_NAMES[d] for d, r in partners.items() if r == rank)
            lines.append(f"rank {rank} ({where}): " + (text if text else their_description))
        return " [" + " | ".join(lines) + "]"

    # --- the two phases -------------------------------------------------------------------

    def _plan(self, P, h, w):
        key = (tuple(P.shape), P.dtype.str, backend.is_device_array(P), getattr(getattr(P, "device", None), "id", None))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 4:
                self._plans.pop(next(iter(self._plans)))
            plan = self._plans[key] = _HaloPlan(self.grid, P, h, w, self.rows, self.cols)
        return plan

    def _gather(self, P, h, w, pairs, context):
        plan = self._plan(P, h, w)
        r, c = self.rows, self.cols
        if c:
            if self.grid.nazimuth == 1:
                inner = slice(r, r + h)
                P[..., inner, 0:c] = P[..., inner, w:w + c]
                P[..., inner, c + w:w + 2 * c] = P[..., inner, c:2 * c]
            else:
                plan.run(P, self.grid.azimuth, plan.columns, False, pairs, context, self._workspace)
        if r:
            plan.run(P, self.grid.polar, plan.rows, False, pairs, context, self._workspace)
            north, south = self.grid.polar_neighbors
            if north == MPI.PROC_NULL:
                P[..., 0:r, :] = 0
            if south == MPI.PROC_NULL:
                P[..., r + h:, :] = 0

    def _scatter_add(self, P, h, w, pairs, context):
        plan = self._plan(P, h, w)
        r, c = self.rows, self.cols
        if r:
            plan.run(P, self.grid.polar, plan.rows, True, pairs, context, self._workspace)
            P[..., 0:r, :] = 0
            P[..., r + h:, :] = 0
        if c:
            inner = slice(r, r + h)
            if self.grid.nazimuth == 1:
                P[..., inner, w:w + c] += P[..., inner, 0:c]
                P[..., inner, c:2 * c] += P[..., inner, c + w:w + 2 * c]
            else:
                plan.run(P, self.grid.azimuth, plan.columns, True, pairs, context, self._workspace)
            P[..., inner, 0:c] = 0
            P[..., inner, c + w:w + 2 * c] = 0

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
    :class:`HaloExchange`; ``.H`` is that exchange.
    """

    def __init__(self, grid, rows, cols=0, *, extents=None, poles="zero", signs=None):
        super().__init__(_NamedHaloExchange(grid, rows, cols, extents=extents, poles=poles, signs=signs))

    @property
    def name(self):
        return "HaloReduce"

    @property
    def needs_own_agreement(self):
        return self.op.needs_own_agreement

    def _apply(self, direction, x, out, label=None, runner=None):
        return self.op._call(self._flip[direction], x, out, who=f"HaloReduce.{direction}")

    def _describe(self):
        return self.op._describe()


class _NamedHaloExchange(HaloExchange):
    """The exchange inside a :class:`HaloReduce`: its messages say HaloReduce and its directions."""

    _label = "HaloReduce"  # in construction errors: the user built a HaloReduce

    @property
    def name(self):
        return "HaloExchange"


class _HaloPlan:
    """Regions, neighbours and packed buffers of one padded shape, built once.

    A move is ``(interior_region, neighbour, halo_region, source, tag)``: in
    the gathering direction the interior block travels to ``neighbour`` and
    the block arriving from ``source`` fills ``halo_region``; in the
    accumulating direction (the adjoint) the halo block travels home and
    what arrives is added onto ``interior_region``.
    """

    def __init__(self, grid, P, h, w, r, c):
        H, W = h + 2 * r, w + 2 * c
        inner, full = slice(r, r + h), slice(0, W)
        west, east = grid.azimuth_neighbors
        north, south = grid.polar_neighbors
        # (interior block, where it goes, the halo block filled from the other side, whence that comes,
        #  tag, the direction indices of (where it goes, whence it comes))
        self.columns = [((inner, slice(w, w + c)), east, (inner, slice(0, c)), west, _TO_EAST, (3, 2)),
                        ((inner, slice(c, 2 * c)), west, (inner, slice(c + w, W)), east, _TO_WEST, (2, 3))]
        self.rows = [((slice(r, 2 * r), full), north, (slice(r + h, H), full), south, _TO_NORTH, (0, 1)),
                     ((slice(h, h + r), full), south, (slice(0, r), full), north, _TO_SOUTH, (1, 0))]
        lead = tuple(P.shape[:-2])
        xp = backend.array_module(P)
        with backend.device_of(P):
            self.buffers = {}
            for moves in (self.columns, self.rows):
                for interior, _, halo, _, tag, _ in moves:
                    shape = lead + (interior[0].stop - interior[0].start, interior[1].stop - interior[1].start)
                    self.buffers[tag] = (xp.empty(shape, P.dtype), xp.empty(shape, P.dtype))

    def run(self, P, comm, moves, add, pairs, context, workspace):
        """One phase: every message of ``moves`` to and from an agreed neighbour in flight at once."""
        sends, recvs, filled = [], [], []
        for interior, to, halo, whence, tag, (d_to, d_whence) in moves:
            out_buf, in_buf = self.buffers[tag]
            if add:  # adjoint: the halo goes home, contributions to the interior come in
                interior, halo, to, whence, d_to, d_whence = halo, interior, whence, to, d_whence, d_to
            if to != MPI.PROC_NULL and d_to in pairs:
                _copy_runs(out_buf, P, interior)
                sends.append((out_buf.reshape(-1), to, tag))
            if whence != MPI.PROC_NULL and d_whence in pairs:
                recvs.append((in_buf.reshape(-1), whence, tag))
                filled.append((halo, in_buf))
        collectives.exchange(comm, sends, recvs, staged=context.staged, workspace=workspace)
        for halo, in_buf in filled:
            if add:
                P[(Ellipsis,) + halo] += in_buf
            else:
                _copy_runs(P, in_buf, halo, into_region=True)


def _runs(a, region):
    """``a[..., rows, cols]`` seen as an array of its contiguous runs (one void item each).

    NumPy copies a run of ``k`` doubles as one ``k * 8``-byte item, about
    twice as fast as element by element for the thin column blocks of a
    halo. Returns ``None`` when ``a`` is not a C-contiguous host array.
    """
    if not isinstance(a, numpy.ndarray) or not a.flags.c_contiguous:
        return None
    block = a[(Ellipsis,) + region]
    if block.size == 0:
        return None
    item, axis = block.itemsize, block.ndim
    while axis > 0 and block.strides[axis - 1] == item:
        item *= block.shape[axis - 1]
        axis -= 1
    offset = block.__array_interface__["data"][0] - a.__array_interface__["data"][0]
    return numpy.ndarray(block.shape[:axis], dtype=numpy.dtype((numpy.void, item)), buffer=a, offset=offset,
                         strides=block.strides[:axis])


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
