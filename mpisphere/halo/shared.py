"""Tiles shared on the node (MPI-3 windows) for the halo's shared link: their allocation, views, acknowledgements.

A grid's ``NodeMemory`` is made by the first allocation from a halo
(:meth:`~mpisphere.HaloExchange.zeros`, collective over ``grid.cart``) and
freed with the grid. It holds:

* the node communicator (``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` of
  ``grid.cart``) and which grid ranks share this node;
* one window per allocation (``MPI_Win_allocate_shared``, every rank of the
  node its own segment, page aligned): this rank's padded tile is a NumPy
  array on its segment, and the neighbours' tiles of the same allocation are
  NumPy arrays on theirs (``MPI_Win_shared_query``); behind the tile, room
  for the blocks its owner packs for the neighbours (the thin column blocks,
  which read better contiguous than straight from another core's tile);
* a control window: a counter per message tag in each rank's segment,
  where the neighbour that read a block writes the number of the call it
  read it in.

Ordering. A rank whose block is read by a neighbour sends the header of
that message as on the message path, without the data; the neighbour
copies (or adds) the block straight from this rank's tile (or from where
this rank packed it), then writes the call number into this rank's counter
for that tag. A rank leaves a call
only when every block it left in shared memory has been acknowledged, so it
cannot change its tile while a neighbour still reads it. ``MPI_Win_sync``
(a memory barrier inside the windows' shared lock epochs) orders the writes
before the header or the acknowledgement that announces them.
"""

import math
import sys

import numpy

from .. import collectives, dtypes
from ..agreement import Call
from ..agreement.stall import Watch
from ..validation import check_int
from .pattern import TAGS, TO_EAST, TO_WEST

__all__ = ["NodeMemory", "SharedArray", "allocate_padded"]

_SLOT = 64  # bytes: one cache line per acknowledgement counter (no false sharing between writers)
_TAG_SLOTS = {tag: slot for slot, tag in enumerate(TAGS)}  # message tag -> counter


def _aligned(nbytes):
    return -(-int(nbytes) // _SLOT) * _SLOT


class SharedArray:
    """One allocation: its window, its serial number on the grid, and this rank's array on it."""

    __slots__ = ("serial", "window", "array", "staging", "theirs", "copies")

    def __init__(self, serial, window, array, staging):
        self.serial, self.window, self.array = serial, window, array
        self.staging = staging  # tag -> (byte offset in this rank's segment, the block there as an array)
        self.theirs = {}    # (cart rank, offset, shape, dtype) -> that part of its segment as an array
        self.copies = {}    # the copies from the neighbours' arrays into this one, planned once (HaloExchange)


class NodeMemory:
    """The shared-memory tiles of one grid on this node.

    Parameters
    ----------
    cart : mpi4py.MPI.Cartcomm
        ``grid.cart``. Construction is collective over it.

    Notes
    -----
    Arrays from :meth:`allocate` live until :meth:`free` (``grid.free()``);
    using one after that reads memory that is gone.
    """

    def __init__(self, cart):
        self.node = collectives.split_shared(cart)
        self._node_rank = {c: i for i, c in enumerate(collectives.ranks_in(self.node, cart))}
        self.comm = cart
        self.records = []
        self._by_id = {}
        self.sequence = 0
        self.control = collectives.allocate_shared(_SLOT * len(_TAG_SLOTS), self.node)
        self.acks = collectives.shared_segment(self.control, self.node.Get_rank()).view(numpy.int64).reshape(
            len(_TAG_SLOTS), -1)
        self.acks[...] = 0
        self._their_acks = {}
        self.freed = False
        self.kept = []   # windows left mapped at free() because the program still held their arrays

    def on_node(self, cart_rank):
        """Whether grid rank ``cart_rank`` shares this node's memory."""
        return cart_rank in self._node_rank

    def allocate(self, shape, dtype, staging=()):
        """A new window with this rank's ``shape`` array of ``dtype`` on it (collective over the node).

        ``staging``: ``[(tag, block shape)]`` of the blocks this rank packs
        for its neighbours, placed behind the array (64-byte aligned).
        """
        dtype = numpy.dtype(dtype)
        offsets, end = [], _aligned(math.prod(shape) * dtype.itemsize)
        for tag, block in staging:
            offsets.append((tag, block, end))
            end = _aligned(end + math.prod(block) * dtype.itemsize)
        window = collectives.allocate_shared(end, self.node)
        segment = collectives.shared_segment(window, self.node.Get_rank())
        array = segment[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        blocks = {tag: (offset, segment[offset:offset + math.prod(block) * dtype.itemsize].view(dtype).reshape(block))
                  for tag, block, offset in offsets}
        record = SharedArray(len(self.records), window, array, blocks)
        self.records.append(record)
        self._by_id[id(array)] = record
        return record

    def find(self, P):
        """The allocation whose array ``P`` is (the array itself, not a view of it), or ``None``."""
        record = self._by_id.get(id(P))
        return record if record is not None and record.array is P else None

    def view(self, serial, cart_rank, shape, dtype=None, offset=0):
        """Rank ``cart_rank``'s memory of allocation ``serial`` from byte ``offset`` as an array of ``shape``.

        Its tile at offset 0, a block it packed at the offset it sent;
        ``None`` when that lies outside its segment.
        """
        if not 0 <= serial < len(self.records) or cart_rank not in self._node_rank or offset < 0:
            return None
        record = self.records[serial]
        dtype = record.array.dtype if dtype is None else numpy.dtype(dtype)
        key = (cart_rank, offset, tuple(shape), dtype.str)
        found = record.theirs.get(key)
        if found is None:
            segment = collectives.shared_segment(record.window, self._node_rank[cart_rank])
            nbytes = math.prod(shape) * dtype.itemsize
            if offset + nbytes > segment.size or offset % dtype.alignment:
                return None
            found = record.theirs[key] = segment[offset:offset + nbytes].view(dtype).reshape(shape)
        return found

    def sender(self, P):
        """``(allocation, call number)`` when ``P`` is one of this node's shared tiles (its next call that leaves
        data there numbered), else ``None``."""
        record = self.find(P)
        return None if record is None else (record, self.publish(record))

    def publish(self, record):
        """Number this rank's next call that leaves data in ``record``'s window."""
        self.sequence += 1
        return self.sequence

    def read_barrier(self, serial):
        """Before reading a neighbour's block of allocation ``serial``: a memory barrier."""
        collectives.window_sync(self.records[serial].window)

    def acknowledge(self, owner, tag, sequence):
        """Tell ``owner`` that this rank has read (or dropped) its block of ``tag`` in call ``sequence``."""
        counters = self._their_acks.get(owner)
        if counters is None:
            segment = collectives.shared_segment(self.control, self._node_rank[owner])
            counters = self._their_acks[owner] = segment.view(numpy.int64).reshape(len(_TAG_SLOTS), -1)
        collectives.window_sync(self.control)  # the reads of the block before the counter
        counters[_TAG_SLOTS[tag], 0] = sequence
        collectives.window_sync(self.control)

    def await_acknowledgements(self, published, sequence, who):
        """Wait until every ``(dest, tag)`` in ``published`` has acknowledged call ``sequence``."""
        slots = [(dest, _TAG_SLOTS[tag]) for dest, tag in published]
        watch = None
        while True:
            collectives.window_sync(self.control)
            waiting = [dest for dest, slot in slots if self.acks[slot, 0] != sequence]
            if not waiting:
                return
            watch = watch or Watch(self.comm, who)
            watch.idle(set(waiting), {dest for dest, _ in slots} - set(waiting))

    def free(self):
        """Free the windows and the node communicator (collective over ``grid.cart``).

        A window whose array is still referenced on some rank of the node (a tile from ``zeros()`` the program
        still holds) is not freed: its memory stays mapped until the process ends, so reading or writing that
        array afterwards touches memory that is still there (freeing it made such a read a segmentation fault
        on every rank). Which windows are kept is agreed over the node (``MPI_Win_free`` is collective there).
        """
        if self.freed:
            return
        self.freed = True
        for record in self.records:   # the planned copies hold views of the arrays: not the program's
            record.theirs.clear()
            record.copies.clear()
        # held elsewhere: more references than the record's own and getrefcount's argument
        held = numpy.array([int(sys.getrefcount(record.array) > 2) for record in self.records], dtype=numpy.int64)
        if held.size:
            collectives.allreduce_max_ints(self.node, held)
        self.kept = [record for record, keep in zip(self.records, held) if keep]
        for record, keep in zip(self.records, held):
            if not keep:
                collectives.free_window(record.window)
        collectives.free_window(self.control)
        collectives.free_comm(self.node)
        self.records, self._by_id, self._their_acks = [], {}, {}


def allocate_padded(grid, pattern, tile, who, lead, dtype, fill):
    """A padded tile ``lead + (h + 2 rows, w + 2 cols)`` of ``dtype`` in memory shared on the node (collective).

    ``HaloExchange.zeros`` / ``empty``: agrees ``lead`` and ``dtype`` over
    ``grid.cart`` (a finding on one rank raises on every rank), sets up the
    grid's ``NodeMemory`` on first use, and allocates one window with room
    behind the tile for the column blocks this rank sends (``fill``: zeroed).
    """
    rows, cols = pattern.rows, pattern.cols
    call = Call(grid.cart, who)
    shape = dtype_str = None
    with call.local():
        if tile is None:
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
        h, w = tile
        shape, dtype_str = lead + (h + 2 * rows, w + 2 * cols), dtype.str
    call.agree(lead=None if shape is None else list(shape[:-2]), dtype=dtype_str)
    memory = grid.node_memory
    if memory is None:
        with call.local("cannot set up memory shared on the node"):
            memory = NodeMemory(grid.cart)
        call.agree()
        grid.node_memory = memory
    record = None
    h, c = tile[0], cols
    staging = [(tag, shape[:-2] + (h, c)) for tag in (TO_EAST, TO_WEST) if c and tag in pattern.sends]
    with call.local(f"cannot allocate {shape} {dtype.name} in memory shared on the node"):
        record = memory.allocate(shape, dtype, staging)
    call.agree()
    if fill:
        record.array[...] = 0
    return record.array
