"""What a halo exchange moves: its widths, the blocks of a tile each phase moves, and between which ranks.

A ``HaloPattern`` is built once per exchange. It knows the four direct
neighbours (none past a pole, none on a one-rank ring, which wraps locally),
the message tags (by the direction the data travels), and for a tile of
``h`` x ``w`` the blocks of each phase, in the order the phases run:

* gathering (``update``, ``forward``): the interior columns travel along the
  azimuth ring into the neighbours' halo columns, then full padded-width rows
  (which carry the corners) along the polar axis;
* accumulating (``accumulate``, ``adjoint``): the other way round, halo rows
  first, each added onto the rows it copies, then halo columns.

A move is ``(tag, send region, receive region)``: the block this rank sends
with ``tag`` and the block of this rank that the data arriving with ``tag``
(from the other side) fills or is added onto. The regions are pairs of
slices of the last two axes of the padded tile.
"""

import collections
import functools

import numpy

from .plan import copier

__all__ = ["TO_NORTH", "TO_SOUTH", "TO_WEST", "TO_EAST", "FROM", "OPPOSITE", "RECORD", "TAGS", "HaloPattern"]

# message tags, by the direction the data travels
TO_NORTH, TO_SOUTH, TO_WEST, TO_EAST = 11, 12, 13, 14
TAGS = (TO_NORTH, TO_SOUTH, TO_WEST, TO_EAST)
FROM = {TO_EAST: "west", TO_WEST: "east", TO_SOUTH: "north", TO_NORTH: "south"}
OPPOSITE = {TO_EAST: TO_WEST, TO_WEST: TO_EAST, TO_SOUTH: TO_NORTH, TO_NORTH: TO_SOUTH}
RECORD = 10  # a record (header alone) of a halo without extents travels with tag + RECORD, before the data

Move = collections.namedtuple("Move", "tag send recv")


class HaloPattern:
    """Halo widths on a grid: the neighbours, the moves of a tile, the one-rank ring, clearing the halo.

    Parameters
    ----------
    grid : ProcessGrid
    rows, cols : int
        Halo widths in latitude rows and longitude columns (each side).

    Attributes
    ----------
    sends, receives : dict of tag -> cart rank
        The neighbour each tag's message goes to, and the one it comes from:
        the same in every call whatever the widths (a zero width sends a
        header alone), so any two halo calls on neighbouring ranks exchange
        the same messages.
    ring : bool
        One azimuth rank and columns to move: the ring wraps onto itself.
    """

    def __init__(self, grid, rows, cols):
        self.rows, self.cols = rows, cols
        self.sends, self.receives = _neighbours(grid)
        self.ring = cols > 0 and grid.nazimuth == 1
        self.npolar, self.nazimuth = grid.npolar, grid.nazimuth
        self._phases = {}

    def width_error(self, min_h, min_w, lat_detail, lon_detail, whose):
        """Why the widths do not fit tiles of at least ``min_h`` rows and ``min_w`` columns, or ``None``.

        The exchange reaches only the immediate neighbours; ``whose`` names the tiles in the message
        ("the smallest", "this rank's"), the details say how they were split.
        """
        if self.npolar > 1 and self.rows > min_h:
            return (f"a halo of {self.rows} rows is wider than {whose} polar tile ({min_h} rows; {lat_detail}); "
                    f"the exchange reaches only the immediate neighbours, so use at most {min_h} halo rows, "
                    "fewer polar ranks or more latitudes")
        if self.cols > min_w:
            if self.nazimuth == 1:
                return (f"a halo of {self.cols} columns is wider than the whole ring of {min_w} longitudes; "
                        f"use at most {min_w} halo columns")
            return (f"a halo of {self.cols} columns is wider than {whose} azimuth tile ({min_w} columns; "
                    f"{lon_detail}); the exchange reaches only the immediate neighbours, so use at most "
                    f"{min_w} halo columns, fewer azimuth ranks or more longitudes")
        return None

    def phases(self, h, w, gather):
        """The moves of a ``h`` x ``w`` tile, one list per phase, in the order they run."""
        key = (h, w, gather)
        found = self._phases.get(key)
        if found is None:
            found = self._phases[key] = _phases(h, w, self.rows, self.cols, gather)
        return found

    def send_region(self, tag, h, w, gather):
        """The block a rank of tile ``h`` x ``w`` sends with ``tag`` (a neighbour's, read from its memory)."""
        for phase in self.phases(h, w, gather):
            for move in phase:
                if move.tag == tag:
                    return move.send
        raise KeyError(tag)

    def neighbour_tiles(self, grid, extents):
        """``{cart rank: (h, w)}`` of the neighbours' tiles of an ``extents`` field."""
        nlat, nlon = extents
        lat, lon = grid.lat_sizes(nlat), grid.lon_sizes(nlon)
        tiles = {}
        for rank in set(self.sends.values()) | set(self.receives.values()):
            p, a = divmod(rank, grid.nazimuth)
            tiles[rank] = (lat[p], lon[a])
        return tiles

    def ring_blocks(self, h, w):
        """A one-rank ring's ``(interior block, halo block)`` pairs (none otherwise): :meth:`wrap` copies each
        interior block into its halo block, :meth:`unwrap` adds the halo block back onto it."""
        if not self.ring:
            return ()
        r, c = self.rows, self.cols
        inner = slice(r, r + h)
        return (((inner, slice(w, w + c)), (inner, slice(0, c))),
                ((inner, slice(c, 2 * c)), (inner, slice(c + w, w + 2 * c))))

    def wrap_steps(self, P, h, w):
        """:meth:`wrap` on ``P`` as functions of no arguments, planned once (a planned call keeps them)."""
        return tuple(copier(P, halo, P, interior) for interior, halo in self.ring_blocks(h, w))

    def unwrap_steps(self, P, h, w):
        """:meth:`unwrap` on ``P`` as functions of no arguments, planned once."""
        return tuple(functools.partial(numpy.add, P[(Ellipsis,) + interior], P[(Ellipsis,) + halo],
                                       out=P[(Ellipsis,) + interior]) for interior, halo in self.ring_blocks(h, w))

    def wrap(self, P, h, w):
        """A one-rank ring: the halo columns of the interior rows from the rank's own tile."""
        for step in self.wrap_steps(P, h, w):
            step()

    def unwrap(self, P, h, w):
        """The adjoint of :meth:`wrap`: a one-rank ring adds its halo columns onto the columns they copy."""
        for step in self.unwrap_steps(P, h, w):
            step()

    def halo_blocks(self, h, w):
        """The blocks of the halo: rows at full padded width, then the columns of the interior rows."""
        r, c = self.rows, self.cols
        H, W = h + 2 * r, w + 2 * c
        rows = ((slice(0, r), slice(0, W)), (slice(r + h, H), slice(0, W))) if r else ()
        cols = ((slice(r, r + h), slice(0, c)), (slice(r, r + h), slice(c + w, W))) if c else ()
        return rows + cols

    def clear(self, P, h, w):
        """Zero the halo (rows at full padded width, then the columns of the interior rows)."""
        for block in self.halo_blocks(h, w):
            P[(Ellipsis,) + block] = 0


def _neighbours(grid):
    """``(sends, receives)``: ``{tag: cart rank}`` of every message of a call."""
    p, a = grid.polar_rank, grid.azimuth_rank
    sends, receives = {}, {}
    if grid.nazimuth > 1:
        west = p * grid.nazimuth + (a - 1) % grid.nazimuth
        east = p * grid.nazimuth + (a + 1) % grid.nazimuth
        sends.update({TO_EAST: east, TO_WEST: west})
        receives.update({TO_EAST: west, TO_WEST: east})
    if p > 0:
        sends[TO_NORTH] = (p - 1) * grid.nazimuth + a
        receives[TO_SOUTH] = (p - 1) * grid.nazimuth + a
    if p < grid.npolar - 1:
        sends[TO_SOUTH] = (p + 1) * grid.nazimuth + a
        receives[TO_NORTH] = (p + 1) * grid.nazimuth + a
    return sends, receives


def _phases(h, w, r, c, gather):
    H, W = h + 2 * r, w + 2 * c
    inner, full = slice(r, r + h), slice(0, W)
    # (tag, the interior block that travels with it, the halo block the same tag fills on the other side)
    columns = [(TO_EAST, (inner, slice(w, w + c)), (inner, slice(0, c))),
               (TO_WEST, (inner, slice(c, 2 * c)), (inner, slice(c + w, W)))]
    rows = [(TO_NORTH, (slice(r, 2 * r), full), (slice(r + h, H), full)),
            (TO_SOUTH, (slice(h, h + r), full), (slice(0, r), full))]
    if gather:
        return tuple([Move(tag, interior, halo) for tag, interior, halo in phase] for phase in (columns, rows))
    # the halo goes home: the data travelling with a tag is the opposite move's halo, added onto its interior
    home = []
    for phase in (rows, columns):
        by_tag = {tag: (interior, halo) for tag, interior, halo in phase}
        home.append([Move(tag, by_tag[OPPOSITE[tag]][1], by_tag[OPPOSITE[tag]][0]) for tag, _, _ in phase])
    return tuple(home)
