"""The halo's messages and blocks: tags, the per-shape plan of packed buffers, and copies run by run.

A :class:`HaloPlan` is built once per padded shape: the blocks each phase
moves (columns along the azimuth ring, then full rows along the polar axis)
and a message buffer per neighbour and direction, with room for the
agreement header in front of the data. The copies go by contiguous runs
where the layout allows (about twice as fast as element by element for the
thin column blocks of a halo).
"""

import math

import numpy

from .. import backend
from ..agreement import message_buffer

__all__ = ["TO_NORTH", "TO_SOUTH", "TO_WEST", "TO_EAST", "FROM", "OPPOSITE", "RECORD", "HaloPlan",
           "copy_runs", "move_runs", "add_runs"]

# message tags, by the direction the data travels
TO_NORTH, TO_SOUTH, TO_WEST, TO_EAST = 11, 12, 13, 14
FROM = {TO_EAST: "west", TO_WEST: "east", TO_SOUTH: "north", TO_NORTH: "south"}
OPPOSITE = {TO_EAST: TO_WEST, TO_WEST: TO_EAST, TO_SOUTH: TO_NORTH, TO_NORTH: TO_SOUTH}
RECORD = 10  # a record (header alone) of a halo without extents travels with tag + RECORD, before the data


class HaloPlan:
    """The blocks and packed buffers of one padded shape, built once.

    A move is ``(tag, interior region, halo region)``, the tag naming the
    direction the data travels: gathering, the interior block travels with
    ``tag`` and the block arriving with the same tag from the other side
    fills the halo region. Accumulating (the adjoint), the data travelling
    with ``tag`` is the halo of the opposite move going home, and what
    arrives is added onto that move's interior. A zero width has no buffers
    (the message is a header alone). The buffers are kept across calls:
    :meth:`claim` orders their reuse after another CUDA stream's work.
    """

    def __init__(self, P, h, w, r, c):
        H, W = h + 2 * r, w + 2 * c
        inner, full = slice(r, r + h), slice(0, W)
        self.columns = [(TO_EAST, (inner, slice(w, w + c)), (inner, slice(0, c))),
                        (TO_WEST, (inner, slice(c, 2 * c)), (inner, slice(c + w, W)))]
        self.rows = [(TO_NORTH, (slice(r, 2 * r), full), (slice(r + h, H), full)),
                     (TO_SOUTH, (slice(h, h + r), full), (slice(0, r), full))]
        lead = tuple(P.shape[:-2])
        self.outgoing, self.incoming = {}, {}
        for width, moves in ((c, self.columns), (r, self.rows)):
            for tag, interior, _ in moves:  # (message with its header room, the data in it)
                shape = lead + (interior[0].stop - interior[0].start, interior[1].stop - interior[1].start)
                empty = width == 0 or math.prod(shape) == 0
                self.outgoing[tag] = (None, None) if empty else message_buffer(P, shape, P.dtype)
                self.incoming[tag] = (None, None) if empty else message_buffer(P, shape, P.dtype)
        self._streams = backend.StreamOrder()

    def claim(self, P):
        """Ready the buffers for a call on ``P`` (on a device: after the last call's stream, see the stream rule)."""
        self._streams.claim(P)
        return self


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


def move_runs(P, source, target):
    """``P[target] = P[source]`` for two regions of one shape (they do not overlap), run by run when possible."""
    src, dst = _runs(P, source), _runs(P, target)
    if src is None or dst is None or src.dtype != dst.dtype:
        P[(Ellipsis,) + target] = P[(Ellipsis,) + source]
    else:
        numpy.copyto(dst, src)


def add_runs(P, buf, region, workspace):
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
    copy_runs(own, P, region)
    buf += own
    copy_runs(P, buf, region, into_region=True)


def copy_runs(dst, src, region, into_region=False):
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
