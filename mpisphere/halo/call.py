"""One halo call: the neighbours' round opened for it, its phases run over the links, one error where it fails.

``HaloCall`` holds what an exchange built once (its pattern, its
boundary past the poles, the message plans and the links) and runs a call
from them:

* **the round** (``NeighbourRound``): each message carries a header in
  front of its data (this rank's verdict on its own input, a digest of the
  call, its tile, the size of the data), so a mismatch between neighbours
  (another operator, widths, direction, batch shape, dtype, tiles that do
  not fit) is seen on both sides at no extra round trip. A rank that sees
  one stops using data, sends its remaining headers marked so, drops what
  still arrives and raises; its neighbours learn it from those headers and
  raise too. Every rank that raises notes it for the rest of the grid
  (:mod:`mpisphere.agreement.failures`), whose ranks raise at the end of
  their next call.
* **the phases**: columns of the interior rows along the azimuth ring, then
  full padded-width rows along the polar axis (the corners ride along), or
  the reverse for the adjoint. Each block goes over the first of the
  exchange's links (:mod:`.links`) that carries it, chosen by its sender
  block by block: left in shared memory on the node (:mod:`.shared_link`)
  or sent as a message (:mod:`.message_link`). The receiver reads the
  header first either way and takes the block from the link it names, so
  the links mix in one call with the same agreement, and the results are
  bitwise the same: the same values are copied, and the same sums made in
  the same order.
"""

import numpy

from .. import backend
from ..agreement import Spec, call_description, cause_first, digest
from ..agreement.collective import printed_once
from ..operators import FORWARD
from ..settings import config
from .pattern import FROM, RECORD, TO_EAST, TO_WEST
from .plan import MessagePlan
from .round import NeighbourRound
from .planned import PlannedCall

__all__ = ["HaloCall"]

_PLANNED = 4  # arrays whose calls an exchange keeps planned (each plan holds its array)


class HaloCall:
    """The calls of one exchange: what it built once, and :meth:`run` for each call.

    Parameters
    ----------
    grid : ProcessGrid
    pattern : HaloPattern
    boundary : ZeroPoles or AcrossPoles
    rows, cols : int
    extents : (int, int) or None
    workspace : mpisphere.backend.Workspace
    links : Links
        The exchange's links (:mod:`.links`), in the order a sender tries them.
    describe : callable
        The exchange's description (its constructor arguments), for calls made inside a composition.
    name : str
    """

    def __init__(self, grid, pattern, boundary, rows, cols, extents, workspace, links, describe, name):
        self.grid, self.pattern, self.boundary = grid, pattern, boundary
        self.rows, self.cols, self.extents = rows, cols, extents
        self.workspace, self.links, self.describe, self.name = workspace, links, describe, name
        self.plans = backend.BoundedCache(4, drop=MessagePlan.free)
        self._codes = backend.BoundedCache(8)  # description -> its digest (the header's word 2)
        self.planned = {}  # (direction, id of the array) -> its PlannedCalls (one per shared_memory setting)
        self._seen = {}    # (direction, id of the array) of arrays that made one call: planned at their second
        # the messages of every call, the same whatever the tile: received, sent, sent only without extents
        sends, receives = pattern.sends, pattern.receives
        records = extents is None  # without extents, the tiles are checked in a round of records first
        expected = [(rank, tag) for tag, rank in receives.items()]
        every = [(rank, tag) for tag, rank in sends.items()]
        if records:
            expected += [(rank, tag + RECORD) for tag, rank in receives.items()]
            every += [(rank, tag + RECORD) for tag, rank in sends.items()]
        self._messages = (records, tuple(expected), tuple(every),
                          {(rank, tag + RECORD): 1 for tag, rank in receives.items()})

    def round(self, who, description, error, tile, staged, order, number=None):
        """A :class:`NeighbourRound` for one call, and the function that ends it (raises on a problem).

        The function takes the number of the call when this rank left
        blocks in shared memory: it waits for their acknowledgements first.
        ``number``: the call's number on the grid when a planned call
        counted it already.
        """
        g = self.grid
        records, expected, every, optional = self._messages

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
        text = description if description is not None else f"{self.describe()} (refused)"
        round_ = NeighbourRound(g.cart, who, text, tile, error, expected, fits, order=order, staged=staged,
                                workspace=self.workspace, pattern=int(records), optional=optional,
                                acknowledge=acknowledge, code=self._codes.get(text, lambda: digest(text)))
        number = g.cart.failures.next_round() if number is None else number

        def finish(sequence=None):
            problems = round_.finish(every)
            if round_.published:  # blocks left in shared memory: not changed before the neighbours have read them
                memory.await_acknowledgements(round_.published, sequence, who)
            if problems is None:
                return
            after = []  # the findings' lines after their causes (what to do, details): at the end, each once
            first = lambda text: cause_first(text, after)  # noqa: E731
            lines = [] if error is None else [f"this rank: {first(error.text)}"]
            for (source, tag), found in problems:
                line = f"{FROM[tag if tag in FROM else tag - RECORD]} neighbour rank {source}: {first(found)}"
                if line not in lines:
                    lines.append(line)
            details = round_.details()
            shown = "" if not details else " [" + " | ".join(
                [f"this rank: {first(text)}"]
                + [f"rank {r}: {first(e) if e else d}" for r, (e, d, _) in details.items()]
            ) + "]"
            # one class on every rank the failure reaches: the mistake's own (a mismatch is a ValueError)
            culprit, kind, own = round_.culprit or (None, ValueError, False)
            kind = error.kind if error is not None else kind
            cause = f"rank {g.rank} of {g.size} (polar {g.polar_rank}, azimuth {g.azimuth_rank}) cannot exchange " \
                    "its halo: " + "; ".join(lines)
            g.cart.failures.announce(number, who, culprit, kind, cause, own)  # the ranks farther away raise next
            exc = kind(f"{who}: {cause}{shown}" + "".join(f"\n{line}" for line in after))
            # each rank's message is its own view (its neighbours); where the mistake is one rank's own input, that
            # rank prints its message in full and the others one line naming it (a pair of calls that do not
            # match has no one culprit: each rank prints its own)
            if error is None and own:
                brief = f"rank {g.rank} of {g.size} cannot exchange its halo: the mistake at rank {culprit} " \
                        "reached it through its neighbours"
                raise printed_once(exc, who, g.rank, culprit, brief, everywhere=False)
            exc.mpisphere_message, exc.mpisphere_reporter = str(exc), None
            raise exc

        return round_, finish

    def run(self, direction, x, out, context):
        """Plan the call from the pattern and the boundary, then run it with the neighbours' round.

        ``out is x``: in place (:meth:`update`, :meth:`accumulate`).
        """
        error = getattr(context, "error", None)
        description = getattr(context, "description", None)
        who = getattr(context, "who", None) or f"{self.name}.{direction}"
        if description is None:  # inside an agreed composition: every rank makes this call
            description = call_description(f"{self.describe()} {direction} (composed): "
                                           f"{Spec.of(x).describe((-2, -1))}")
        gather, in_place = direction == FORWARD, out is x
        r, c = self.rows, self.cols
        if error is not None:
            tile = (0, 0)
        elif gather and not in_place:
            tile = (x.shape[-2], x.shape[-1])
        else:
            tile = (x.shape[-2] - 2 * r, x.shape[-1] - 2 * c)
        round_, finish = self.round(who, description, error, tile, context.staged, 0 if gather else 1)
        if error is not None:
            finish()  # raises: headers only, everything that arrives dropped
        h, w = tile
        if in_place:
            P = x
        elif gather:  # the halo is written whole below (neighbours, the ring, the boundary)
            P = out
            P[..., r:r + h, c:c + w] = x
        else:
            P = self.workspace.scratch("adjoint", x, x.size).reshape(x.shape)
            P[...] = x
        plan = self.message_plan(P)
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
        memory = self.grid.node_memory
        sender = memory.sender(P) if memory is not None and config.shared_memory else None
        self.steps(P, tile, gather, round_, finish, plan, sender, context)
        if not gather and not in_place:
            out[...] = P[..., r:r + h, c:c + w]
        if in_place and type(x) is numpy.ndarray and self.extents is not None and not self.boundary.collective \
                and not context.staged:
            self._keep_planned(direction, x, who, description, round_.code, round_.shared)

    def steps(self, P, tile, gather, round_, finish, plan, sender, context, start=0):
        """The call's steps on the padded ``P`` from phase ``start`` on, and the round's end.

        ``start`` > 0: a planned call ran the steps before that phase and
        sent that phase's messages (:mod:`mpisphere.halo.planned`).
        """
        h, w = tile
        phases = self.pattern.phases(h, w, gather)
        if start == 0:
            if gather:
                self.pattern.wrap(P, h, w)
            else:
                self.boundary.give_back(P, h, w, context)
        for index in range(start, len(phases)):
            if index > start and not gather:  # the ring's halo columns go home between the phases
                self.pattern.unwrap(P, h, w)
            if not self.phase(P, phases[index], gather, round_, plan, sender):
                break
        finish(None if sender is None else sender[1])
        if gather:
            self.boundary.fill(P, h, w, context)
        else:
            self.pattern.clear(P, h, w)

    def _keep_planned(self, direction, P, who, description, code, arrived, at_once=False):
        """Plan the next calls on ``P`` from this one, which went through (``arrived``: the blocks it read in
        shared memory, ``NeighbourRound.shared``).

        Not at an array's first call (unless ``at_once``): a plan costs about
        a third of a first call (112 of 374 us at one field on 1 x 2), which a
        program that hands every call a new array would pay for nothing.
        """
        key = (direction, id(P))
        if not at_once and key not in self.planned and self._seen.pop(key, None) is None:
            self._seen[key] = True
            while len(self._seen) > 2 * _PLANNED:
                self._seen.pop(next(iter(self._seen)))
            return
        kept = []
        for planned in self.planned.pop(key, ()):
            if planned.current(P):
                kept.append(planned)
            else:
                planned.free()
        if not any(planned.fits(P) for planned in kept):
            while len(self.planned) >= _PLANNED:
                for planned in self.planned.pop(next(iter(self.planned))):  # the oldest array's
                    planned.free()
            # a shared window keeps a plan for each setting of config.shared_memory (blocks left there, or sent)
            planned = PlannedCall(self, direction, P, who, description, code, arrived)
            if planned.complete:
                kept.append(planned)
            else:
                planned.free()
        if kept:
            self.planned[key] = kept

    def replan(self, planned, code, arrived):
        """Replace ``planned`` by a plan of the call it handed over, which went through."""
        plans = self.planned.get((planned.direction, id(planned.array)), [])
        if planned in plans:
            plans.remove(planned)
            planned.free()
        self._keep_planned(planned.direction, planned.array, planned.who, planned.description, code, arrived,
                           at_once=True)

    def replay(self, direction, P):
        """The planned call for ``direction`` on ``P`` when one can replay this call, else ``None``."""
        for planned in self.planned.get((direction, id(P)), ()):
            if planned.fits(P):
                return planned
        return None

    def message_plan(self, P):
        if type(P) is numpy.ndarray:  # the common case, keyed without asking the backend
            key = (P.shape, P.dtype.str, False, None)
        else:
            key = (tuple(P.shape), P.dtype.str, backend.is_device_array(P),
                   getattr(getattr(P, "device", None), "id", None))
        h, w = P.shape[-2] - 2 * self.rows, P.shape[-1] - 2 * self.cols
        return self.plans.get(key, lambda: MessagePlan(P, self.pattern, h, w, self.grid.cart)).claim(P)

    def phase(self, P, moves, gather, round_, plan, sender):
        """Send this phase's blocks, each over the first link that carries it, then take what arrives from the link
        its header names.

        Returns False when the round is poisoned (the caller stops and finishes).
        """
        sends, receives = self.pattern.sends, self.pattern.receives
        incoming = []
        for move in moves:
            dest = sends.get(move.tag)
            if dest is not None and not round_.has_sent(dest, move.tag):
                link = self.links.sending(self, dest, plan.outgoing[move.tag][1], sender, round_.poisoned)
                link.send(self, round_, plan, P, move, dest, sender)
            source = receives.get(move.tag)
            if source is not None:
                incoming.append(((source, move.tag), move.recv))
        arrived = round_.collect([key for key, _ in incoming])
        if round_.poisoned:
            return False
        for key, region in incoming:
            where = round_.shared.get(key)
            if where is not None or key in arrived:
                self.links.receiving(where).receive(self, round_, plan, P, key, region, gather, sender, where)
        return not round_.poisoned

    def free(self):
        """Drop the cached plans, the planned calls and their persistent requests (rebuilt on the next call)."""
        for plans in self.planned.values():
            for planned in plans:
                planned.free()
        self.planned.clear()
        self._seen.clear()
        self.plans.clear()
