"""A halo call planned once and replayed: the message path of one padded array, nothing decided per call.

The first in-place call (``update`` or ``accumulate``) on a padded host
array runs the whole protocol (:mod:`mpisphere.halo.call`): the input
checked, the neighbours' round, each header read word by word. When that
call went through without a problem and every block went as a message, it
leaves a ``PlannedCall`` for the same array: its copies as NumPy views made
once, the header of each message it sends, the header it expects of each
message it receives (the neighbours' tiles follow from ``extents``) and
the persistent sends. The next calls on the same array (the same object,
shape, strides and dtype, still writeable, no switch of
``mpisphere.config`` set since) replay it: pack, start the sends, receive,
compare each header with the expected one as 96 bytes, unpack. Nothing is
allocated and no description is built.

Anything else hands the call over to the full round where it stands,
with what was sent and received so far (``NeighbourRound.adopt``): a
message of another size, a header that differs in any word (another call,
a neighbour's own finding, a poisoned round, data left in shared memory,
the phases in the other order). The messages are the round's own, so a
neighbour cannot tell which path a rank took, and what the round
guarantees (every rank whose result would use wrong data raises, no message
is left behind, a rank's failure is noted for the grid) holds for both.
"""

import functools
import os
import time

import numpy

from .. import collectives
from ..agreement import HEADER_BYTES, header_words
from ..agreement.stall import Watch
from ..operators import FORWARD
from ..settings import config
from .plan import adder, copier, packer, unpacker, zeroer

__all__ = ["PlannedCall"]

# a neighbour a few microseconds behind is waited for by yielding the core (as the wait loop's first 50 ms do);
# after this long the wait goes to the stall watch (``mpisphere.agreement.stall.Watch``), whose clock starts then
_YIELD_FIRST = 0.001


class PlannedCall:
    """One in-place call on one padded host array, planned from a call that went through, and replayed.

    Parameters
    ----------
    call : HaloCall
        The exchange's calls (its pattern, boundary, plans and rounds).
    direction : {"forward", "adjoint"}
        ``update`` (gathering) or ``accumulate``.
    P : numpy.ndarray
        The padded array, ``(..., h + 2*rows, w + 2*cols)``.
    who, description : str
        The call's name and description, as the round that planned it had them.
    code : int
        The digest of ``description`` (the headers' word 2).

    Notes
    -----
    Holds ``P`` (and views of it) until it is dropped: the exchange keeps
    the planned calls of its last few arrays (:meth:`HaloCall.replay`) and
    drops them with ``HaloExchange.free``.
    """

    def __init__(self, call, direction, P, who, description, code):
        grid, pattern = call.grid, call.pattern
        gather = direction == FORWARD
        r, c = call.rows, call.cols
        h, w = P.shape[-2] - 2 * r, P.shape[-1] - 2 * c
        self.call, self.direction, self.who, self.description = call, direction, who, description
        self.array, self.shape, self.strides, self.dtype = P, P.shape, P.strides, P.dtype
        self.generation = config.generation
        self.tile, self.order = (h, w), 0 if gather else 1
        self.comm, self.failures = grid.cart, grid.cart.failures
        self.plan = plan = call.message_plan(P)
        self.status = collectives.status()
        tiles = pattern.neighbour_tiles(grid, call.extents)
        self._own_requests = []  # the persistent sends of header-only messages (zero-width blocks)
        self.expect = {}         # key -> (landing buffer, its first 96 bytes, the header expected there)
        self.phases = []         # (sends, keys received, steps after the phase)
        ring = pattern.ring_blocks(h, w)
        before = [copier(P, halo, P, interior) for interior, halo in ring] if gather else []
        self.before = tuple(before)
        for index, moves in enumerate(pattern.phases(h, w, gather)):
            sends, keys, after = [], [], []
            for move in moves:
                dest = pattern.sends.get(move.tag)
                if dest is not None:
                    message, data = plan.outgoing[move.tag]
                    if message is None:  # a zero-width block: the header alone
                        message = numpy.empty(HEADER_BYTES, numpy.uint8)
                        request = collectives.send_init_bytes(self.comm, message, dest, move.tag)
                        self._own_requests.append(request)
                    else:
                        request = plan.request(move.tag, dest)
                    words = header_words(code, (h, w), self.order, 0, message.size - HEADER_BYTES)
                    pack = () if data is None else (packer(P, move.send, data),)
                    sends.append((pack, memoryview(message)[:HEADER_BYTES], words.tobytes(), request, dest,
                                  move.tag, message))
                source = pattern.receives.get(move.tag)
                if source is not None:
                    message, data = plan.incoming[move.tag]
                    landing = numpy.empty(HEADER_BYTES, numpy.uint8) if message is None else message
                    words = header_words(code, tiles[source], self.order, 0, landing.size - HEADER_BYTES)
                    self.expect[source, move.tag] = (landing, memoryview(landing)[:HEADER_BYTES], words.tobytes())
                    keys.append((source, move.tag))
                    if data is not None:
                        after += [unpacker(P, move.recv, data)] if gather else \
                            list(adder(P, data, move.recv, call.workspace))
            if not gather and index == 0:  # the one-rank ring's halo columns go home between the phases
                after += [functools.partial(numpy.add, P[(Ellipsis,) + interior], P[(Ellipsis,) + halo],
                                            out=P[(Ellipsis,) + interior]) for interior, halo in ring]
            self.phases.append((tuple(sends), tuple(keys), tuple(after)))
        blocks = call.boundary.blocks(h, P.shape[-1]) if gather else pattern.halo_blocks(h, w)
        self.end = tuple(zeroer(P, block) for block in blocks)
        self.keys = tuple(key for _, keys, _ in self.phases for key in keys)
        self.requests = [send[3] for sends, _, _ in self.phases for send in sends]

    def fits(self, P):
        """Whether this plan can replay a call on ``P`` (cheap: the same array as planned, nothing changed)."""
        return (P is self.array and P.shape == self.shape and P.strides == self.strides and P.dtype == self.dtype
                and P.flags.writeable and config.generation == self.generation and not self.plan.freed)

    def run(self):
        """The call, replayed; hands over to the full round (which raises where it must) at the first surprise."""
        number = self.failures.next_round()
        for step in self.before:
            step()
        pending = list(self.keys)
        for index, (sends, keys, after) in enumerate(self.phases):
            for pack, head, words, request, _, _, _ in sends:
                for step in pack:
                    step()
                head[:] = words
                collectives.start(request)
            if keys:
                surprise = self._arrive(keys, pending)
                if surprise is not None:
                    return self._hand_over(number, index, pending, *surprise)
            for step in after:
                step()
        collectives.waitall(self.requests)
        for step in self.end:
            step()

    def _arrive(self, keys, pending):
        """Receive until every message of ``keys`` has arrived with the header expected of it.

        Returns ``None``, or ``(key, probed message or None, size)`` of the first message that did not fit
        (``None``: received into its buffer, the header differs). Every pending message is probed, not only
        this phase's: a neighbour whose phases run the other way round is seen (its header differs), and the
        round then breaks the cycle.
        """
        comm, status, expect = self.comm, self.status, self.expect
        watch = started = None
        while any(key in pending for key in keys):
            found = False
            for key in tuple(pending):
                probed, nbytes = collectives.improbe_bytes(comm, key[0], key[1], status)
                if probed is None:
                    continue
                found = True
                landing, head, words = expect[key]
                if nbytes != landing.size:
                    return key, probed, nbytes
                collectives.mrecv_bytes(probed, landing, nbytes)
                if head.tobytes() != words:
                    return key, None, nbytes
                pending.remove(key)
            if found:
                continue
            if watch is None:  # the wait loop's own first steps: yield the core, without building its clock
                waited = 0.0 if started is None else time.monotonic() - started
                started = started or time.monotonic()
                if waited < _YIELD_FIRST:
                    os.sched_yield()
                    continue
                watch = Watch(comm, self.who)
            watch.idle({k[0] for k in pending}, {k[0] for k in self.keys if k not in pending})
        return None

    def _hand_over(self, number, index, pending, key, probed, nbytes):
        """Go on with the full round from phase ``index``: it takes what was sent (every message of the phases up
        to ``index``) and received (what is not ``pending``), then ``key``."""
        call, P = self.call, self.array
        sent = [(dest, tag, request, message) for sends, _, _ in self.phases[:index + 1]
                for _, _, _, request, dest, tag, message in sends]
        received = [k for k in self.keys if k not in pending and k != key]
        round_, finish = call.round(self.who, self.description, None, self.tile, False, self.order, number=number)
        for tag, rank in call.pattern.receives.items():
            round_.expect((rank, tag), self.plan.incoming[tag][0])
        round_.adopt(sent, received)
        if probed is not None:
            round_.receive(key, probed, nbytes)
        else:
            landing = self.expect[key][0]
            round_.landed(key, landing, nbytes, landing is self.plan.incoming[key[1]][0])
        call.steps(P, self.tile, self.direction == FORWARD, round_, finish, self.plan, None, None, start=index)

    def free(self):
        """Free the persistent sends of its header-only messages (the plan's own are the plan's)."""
        requests, self._own_requests = self._own_requests, []
        collectives.free_requests(requests)
