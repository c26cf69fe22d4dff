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

Agreement
---------
The ranks agree at construction, collectively over ``grid.cart`` (the
same widths, extents, poles, signs and quadrature on every rank), and in
every call with the neighbours only, by a header in front of each message
(:mod:`mpisphere.halo.call`): the ranks whose result would use wrong data raise, naming
the mistake's rank, and the others raise at the end of their next call
(:mod:`mpisphere.agreement.failures`). Composed with other operators
(``@``), an exchange takes part in the composition's agreement over the
whole grid, which is why it needs ``extents`` there.

Where the parts live: the pattern (:mod:`.pattern`: widths, neighbours, the
moves of a tile's phases), the boundary (:mod:`.poles`), the call
(:mod:`mpisphere.halo.call`: the round and its phases), the links (:mod:`.plan` for
messages, :mod:`.shared` for tiles shared on the node).
:func:`~mpisphere.polar_halo_radius` (:mod:`mpisphere.geometry`) derives
the halo width of a localized operator from the latitudes and the grid.
"""
import numpy

from .. import backend, dtypes
from ..agreement import REFUSED, Context, InputError, agree, agree_construction, \
    call_description, collective, raise_everywhere
from ..operators import ADJOINT, DISTRIBUTED, FORWARD, Layout, LinearOperator
from ..validation import check_choice, check_int, check_process_grid
from .absent import answer_skipped_calls
from .call import HaloCall
from .pattern import HaloPattern
from .poles import AcrossPoles, ZeroPoles
from .links import Links
from .message_link import MessageLink
from .shared import allocate_padded
from .shared_link import SharedLink

__all__ = ["HaloExchange"]


def _check_grid(grid, who):
    check_process_grid(grid, "grid", who)
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
        self.pattern = HaloPattern(grid, self.rows, self.cols)
        answer_skipped_calls(grid, self.pattern)  # while this rank waits in an agreement, its neighbours' halo calls
        self.domain = Layout(DISTRIBUTED, grid.cart)
        self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self.tile = None
        self.extents = None
        if extents is not None:
            nlat, nlon = _check_extents(extents, self._label)
            lat_sizes, lon_sizes = grid.lat_sizes(nlat), grid.lon_sizes(nlon)
            error = self.pattern.width_error(min(lat_sizes), min(lon_sizes),
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
        self._workspace = backend.Workspace()
        self._checked = backend.BoundedCache(8)  # (direction, in place, input spec) -> (output spec, description)
        # the links in the order a sender tries them: the message link, last, carries every block
        links = Links([SharedLink(self.pattern, self.rows, self.cols, self._workspace), MessageLink(self._workspace)])
        self._call = HaloCall(grid, self.pattern, self.boundary, self.rows, self.cols, self.extents, self._workspace,
                              links, self._describe, self.name)

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
        detail = f"this rank's tile is {tile}"
        message = self.pattern.width_error(tile[0], tile[1], detail, detail, "this rank's")
        if message is not None:
            raise InputError(message)
        problem = self.boundary.check(spec.shape)
        if problem is not None:
            raise InputError(problem)
        return tile

    def _output(self, direction, spec):
        # the checks depend on the input's spec alone: a model calling its halo step after step checks once
        return self._checked.get((direction, False, spec), lambda: self._check(direction, spec))

    def _output_in_place(self, direction, spec):
        return self._checked.get((direction, True, spec), lambda: self._check(None, spec))

    def _check(self, direction, spec):
        """The output's spec and the call's description; ``direction`` None: in place (the output is the input)."""
        h, w = self._tile_of(spec, direction != FORWARD)
        if direction is None:
            return spec, spec.describe((-2, -1))
        padded = (h + 2 * self.rows, w + 2 * self.cols) if direction == FORWARD else (h, w)
        return spec.but(shape=spec.shape[:-2] + padded), spec.describe((-2, -1))

    def _reserve(self, direction, x, out):
        self._call.message_plan(out if direction == FORWARD else x)
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
        return allocate_padded(self.grid, self.pattern, self.tile, who, lead, dtype, fill)

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
            return raise_everywhere(self.grid.cart, who, error)
        self._call.round(who, None, error, (0, 0), False, 0)[1]()

    def _run(self, direction, x, out, context):
        self._call.run(direction, x, out, context)

    def _replay(self, direction, x):
        return self._call.replay(direction, x)

    def free(self):
        """Drop the cached plans, their persistent requests and the scratch buffers (rebuilt on the next call).

        Arrays from :meth:`zeros` and :meth:`empty` stay: they are freed with the grid.
        """
        self._call.free()
        self._workspace.clear()
