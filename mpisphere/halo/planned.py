"""A halo call planned once and replayed: one padded array's call over both links, nothing decided per call.

The first in-place calls (``update`` or ``accumulate``) on a padded host
array run the whole protocol (:mod:`mpisphere.halo.call`): the input
checked, the neighbours' round, each header read word by word. When the
second went through without a problem (an array used once is not planned),
it leaves a ``PlannedCall`` for the same array, made from what the call did
block by block:

* a block sent as a message: its packing as NumPy views, its header, its
  persistent send;
* a block left in this rank's shared window (an array from
  ``HaloExchange.zeros``, a neighbour on the node): its packing behind the
  tile, the window's memory barrier, its header with where the block lies;
  at the end, the wait for the neighbours' acknowledgements;
* a block received as a message: the header expected in front of it (the
  neighbours' tiles follow from ``extents``), its unpacking or its sum;
* a block a neighbour left in shared memory: the header expected (but the
  word that numbers the neighbour's call), the copy or sum straight from
  the neighbour's memory as views, the acknowledgement.

The next calls on the same array (the same object, shape, strides and
dtype, still writeable; ``debug`` and ``force_staging`` not set since, and
``shared_memory`` as it was for a shared window) replay it and compare each
header they receive with the expected one as 96 bytes. Nothing is allocated
and no description is built.

Anything else hands the call over to the full round where it stands, with
what was sent and received so far (``NeighbourRound.adopt``): a message of
another size, a header that differs (another call, a neighbour's own
finding, a poisoned round, a neighbour that changed how it sends, the
phases in the other order). The messages are the round's own, so a
neighbour cannot tell which path a rank took, and what the round guarantees
(every rank whose result would use wrong data raises, no message is left
behind, a rank's failure is noted for the grid) holds for both.
"""

import numpy

from .. import collectives
from .round import EPOCH_TAGS, HEADER_BYTES, current_epoch
from ..agreement.stall import Watch
from ..operators import FORWARD
from ..settings import config
from .plan import zeroer

__all__ = ["PlannedCall"]

_CALL_WORD = 9  # the header word that numbers the sender's calls leaving data in shared memory


class PlannedCall:
    """One in-place call on one padded host array, planned from a call that went through, and replayed.

    Parameters
    ----------
    call : HaloCall
        The exchange's calls (its pattern, boundary, plans, link and rounds).
    direction : {"forward", "adjoint"}
        ``update`` (gathering) or ``accumulate``.
    P : numpy.ndarray
        The padded array, ``(..., h + 2*rows, w + 2*cols)``.
    who, description : str
        The call's name and description, as the round that planned it had them.
    code : int
        The digest of ``description`` (the headers' word 2).
    arrived : dict
        ``(source, tag) -> (location, the sender's tile)`` of the blocks
        that call read in shared memory (``NeighbourRound.shared``).

    Notes
    -----
    Holds ``P`` (and views of it and of the neighbours' shared tiles) until
    it is dropped: the exchange keeps the planned calls of its last few
    arrays (``HaloCall.replay``) and drops them with ``HaloExchange.free``.
    """

    def __init__(self, call, direction, P, who, description, code, arrived):
        grid, pattern = call.grid, call.pattern
        gather = direction == FORWARD
        h, w = P.shape[-2] - 2 * call.rows, P.shape[-1] - 2 * call.cols
        self.call, self.direction, self.who, self.description = call, direction, who, description
        self.array, self.shape, self.strides, self.dtype = P, P.shape, P.strides, P.dtype
        self.generation = config.generation
        self.tile, self.order = (h, w), 0 if gather else 1
        self.comm, self.failures = grid.cart, grid.cart.failures
        self.plan = call.message_plan(P)
        self.status = collectives.status()
        self.memory = memory = grid.node_memory
        self.record = record = None if memory is None else memory.find(P)
        self.shared_memory = None if record is None else config.shared_memory  # checked again for a window
        leaves = record is not None and config.shared_memory
        tiles = pattern.neighbour_tiles(grid, call.extents)
        self._own_requests = []  # the persistent sends of headers that go alone
        self.expect = {}         # key -> (landing buffer, its first 96 bytes, the header expected, its words or None)
        self.arrived = {}        # key -> (location, tile) of a block read in shared memory, this call's
        self.phases = []         # (sends, keys received, steps after the phase)
        self.published = []      # (dest, tag) of the blocks left in shared memory
        self.complete = True     # False: a block could not be planned; the call is left to the full round
        self.before = pattern.wrap_steps(P, h, w) if gather else ()
        sender = (record, 0) if leaves else None  # blocks are left in the window only when the call that planned did
        for index, moves in enumerate(pattern.phases(h, w, gather)):
            sends, keys, after = [], [], []
            for move in moves:
                dest = pattern.sends.get(move.tag)
                if dest is not None:
                    link = call.links.sending(call, dest, self.plan.outgoing[move.tag][1], sender, False)
                    sends.append(link.send_steps(self, P, move, dest, code))
                source = pattern.receives.get(move.tag)
                if source is not None:
                    key, where = (source, move.tag), arrived.get((source, move.tag))
                    keys.append(key)
                    steps = call.links.receiving(where).receive_steps(self, P, move, key, code, tiles[source],
                                                                      where, gather)
                    if steps is None:  # a block that cannot be planned: the call is left to the full round
                        self.complete = False
                        steps = []
                    after += steps
            if not gather and index == 0:  # the one-rank ring's halo columns go home between the phases
                after += pattern.unwrap_steps(P, h, w)
            self.phases.append((tuple(sends), tuple(keys), tuple(after)))
        blocks = call.boundary.blocks(h, P.shape[-1]) if gather else pattern.halo_blocks(h, w)
        self.end = tuple(zeroer(P, block) for block in blocks)
        self.keys = tuple(key for _, keys, _ in self.phases for key in keys)

    def own_header(self, dest, tag):
        """A header that goes alone (a link's block left elsewhere, or of zero width), and its persistent sends
        (one per epoch, both made here)."""
        message = numpy.zeros(HEADER_BYTES, numpy.uint8)
        requests = tuple(collectives.send_init_bytes(self.comm, message, dest, tag + epoch)
                         for epoch in (0, EPOCH_TAGS))
        self._own_requests += requests
        return message, requests

    def expect_header(self, key, landing, head, words, stamp):
        """The header a replay expects for ``key``: received into ``landing`` (its first bytes ``head``), compared
        with ``words``; ``stamp``: its int64 words when the neighbour's call number is to be read from it."""
        self.expect[key] = (landing, head, words, stamp)

    def acknowledge(self, key):
        """Tell the neighbour of ``key`` that its block of this call has been read."""
        (serial, call, offset), _ = self.arrived[key]
        self.memory.acknowledge(key[0], key[1], call)

    def current(self, P):
        """Whether ``P`` is the array planned, unchanged, under the same switches, on a grid not freed."""
        return (P is self.array and P.shape == self.shape and P.strides == self.strides and P.dtype == self.dtype
                and P.flags.writeable and config.generation == self.generation and not self.plan.freed
                and not self.failures.closed)

    def fits(self, P):
        """Whether this plan can replay a call on ``P`` now (:meth:`current`, and for a shared window the same
        ``config.shared_memory``: it decides whether the blocks are left there or sent)."""
        return self.current(P) and (self.shared_memory is None or config.shared_memory == self.shared_memory)

    def run(self):
        """The call, replayed; hands over to the full round (which raises where it must) at the first surprise."""
        number = self.failures.next_round()
        epoch = current_epoch(self.comm)
        which = 1 if epoch else 0
        sequence = None if not self.published else self.memory.publish(self.record)
        for step in self.before:
            step()
        pending, started = list(self.keys), []
        for index, (sends, keys, after) in enumerate(self.phases):
            for steps, head, words, requests, _, _, _, stamp in sends:
                for step in steps:
                    step()
                head[:] = words
                if stamp is not None:
                    stamp[_CALL_WORD] = sequence
                request = requests[which]
                collectives.start(request)
                started.append(request)
            if keys:
                surprise = self._arrive(keys, pending, epoch)
                if surprise is not None:
                    return self._hand_over(number, sequence, index, pending, which, *surprise)
            for step in after:
                step()
        collectives.waitall(started)
        if self.published:  # the blocks left in the window stay as they are until the neighbours have read them
            self.memory.await_acknowledgements(self.published, sequence, self.who)
        for step in self.end:
            step()

    def _arrive(self, keys, pending, epoch):
        """Receive until every message of ``keys`` has arrived with the header expected of it.

        Returns ``None``, or ``(key, probed message or None, size)`` of the first message that did not fit
        (``None``: received into its buffer, the header differs). Every pending message is probed, not only
        this phase's: a neighbour whose phases run the other way round is seen (its header differs), and the
        round then breaks the cycle.
        """
        comm, status, expect = self.comm, self.status, self.expect
        watch = None
        while any(key in pending for key in keys):
            found = False
            for key in tuple(pending):
                probed, nbytes = collectives.improbe_bytes(comm, key[0], key[1] + epoch, status)
                if probed is None:
                    continue
                found = True
                landing, head, words, stamp = expect[key]
                if nbytes != landing.size:
                    return key, probed, nbytes
                collectives.mrecv_bytes(probed, landing, nbytes)
                if stamp is not None:  # the neighbour's call number is the one word not known in advance
                    call, stamp[_CALL_WORD] = int(stamp[_CALL_WORD]), 0
                    if head.tobytes() != words:
                        stamp[_CALL_WORD] = call
                        return key, None, nbytes
                    location, tile = self.arrived[key]
                    self.arrived[key] = ((location[0], call, location[2]), tile)
                elif head.tobytes() != words:
                    return key, None, nbytes
                pending.remove(key)
            if found:
                continue
            watch = watch or Watch(comm, self.who)
            watch.idle({k[0] for k in pending}, {k[0] for k in self.keys if k not in pending})
        return None

    def _hand_over(self, number, sequence, index, pending, which, key, probed, nbytes):
        """Go on with the full round from phase ``index``: it takes what was sent (every message of the phases up
        to ``index``) and received (what is not ``pending``), then ``key``."""
        call, P = self.call, self.array
        sent = [(dest, tag, requests[which], message) for sends, _, _ in self.phases[:index + 1]
                for _, _, _, requests, dest, tag, message, _ in sends]
        published = [(dest, tag) for dest, tag, _, _ in sent if (dest, tag) in self.published]
        received = [k for k in self.keys if k not in pending]
        unread = {k for _, keys, _ in self.phases[index:] for k in keys}  # earlier phases' blocks are read already
        round_, finish = call.round(self.who, self.description, None, self.tile, False, self.order, number=number)
        for tag, rank in call.pattern.receives.items():
            round_.expect((rank, tag), self.plan.incoming[tag][0])
        round_.adopt(sent, received, published,
                     {k: self.arrived[k] for k in received if k in self.arrived and k in unread})
        if probed is not None:
            round_.receive(key, probed, nbytes)
        else:
            landing = self.expect[key][0]
            round_.landed(key, landing, nbytes, landing is self.plan.incoming[key[1]][0])
        sender = None if sequence is None else (self.record, sequence)
        call.steps(P, self.tile, self.direction == FORWARD, round_, finish, self.plan, sender, None, start=index)
        # went through (a neighbour changed how it sends, e.g. from a shared window): plan from this call instead
        call.replan(self, round_.code, round_.shared)

    def free(self):
        """Free the persistent sends of the headers that go alone (the message plan's own are the plan's)."""
        requests, self._own_requests = self._own_requests, []
        collectives.free_requests(requests)
