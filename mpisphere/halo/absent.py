"""Answering the halo calls that neighbours make while this rank waits in an agreement over the grid.

A halo call agrees with the neighbours only, in the headers of its messages
(``halo.round.NeighbourRound``). A rank that makes another
call instead, one that begins with an agreement over the whole grid
(``grid.free()``, a transform, a gather), would leave its neighbours waiting
for its messages while it waits for theirs in the agreement. So while a rank
waits in such an agreement, it looks for halo messages addressed to it; the
ones that come from a rank that has not made this agreement are a call it
never makes (their tags say so: ``halo.round.epoch_of``).
It then answers that neighbour as any rank of the round does: one header for
every message the neighbour expects of it, saying that it makes another call
(its digest), no data; it drops what the neighbour sent, acknowledges what the
neighbour left in shared memory, and exchanges the two calls' descriptions
with it. The neighbour raises in its halo call, naming this rank and the call
it is in; this rank raises at the end of the call it waited in (or with its
agreement, when that fails), and the grid's agreements tell the ranks farther
away (:mod:`mpisphere.agreement.failures`). The messages of the call are all
matched, so nothing is left for a later call.
"""

from .. import collectives
from ..agreement import InputError
from .round import DETAILS_TAG, NeighbourRound, epoch_of
from ..agreement.stall import call_site
from ..waiting import WaitLoop
from .pattern import FROM, RECORD

__all__ = ["SkippedCalls"]

_FIX = ("fix: make the same mpisphere calls in the same order on every rank: a call made inside 'if rank == ...', "
        "or a rank that returned or freed the grid early, leaves its neighbours in a halo call it never makes")


class SkippedCalls:
    """The answers of one rank to its neighbours' halo calls that it does not make (on ``grid.cart.answers``).

    Parameters
    ----------
    grid : ProcessGrid
        Its four direct neighbours and their tags are the same for every halo
        on the grid (:class:`~mpisphere.halo.pattern.HaloPattern`).
    sends, receives : dict of tag -> cart rank
        The pattern's neighbours: where each tag's message goes, and whence it comes.

    Notes
    -----
    The answers never wait: a neighbour may need another neighbour's answer
    before it can end its call (a block it left in shared memory is
    acknowledged only when the other has read it), so every answer open
    moves on at each poll of the agreement (:meth:`poll`) and the last
    ones end after it (:meth:`settle`: by then every neighbour has ended
    its call, as it entered the agreement).
    """

    __slots__ = ("grid", "sends", "receives", "sources", "_sequence", "_base", "_counts", "_open")

    def __init__(self, grid, sends, receives):
        self.grid, self.sends, self.receives = grid, dict(sends), dict(receives)
        # the first message a neighbour's call sends here: a record (a halo without extents) or a block
        self.sources = {}
        for tag, rank in self.receives.items():
            self.sources.setdefault(rank, []).extend((tag, tag + RECORD))
        self._sequence, self._base, self._counts = None, 0, {}
        self._open = {}  # source -> _Answer in progress

    def poll(self, sequence, who):
        """This rank waits in agreement number ``sequence`` on the grid (``who``'s): answer every neighbour whose
        halo call's messages have arrived from before that agreement, and move the open answers on. Never waits."""
        comm = self.grid.cart
        if sequence != self._sequence:  # a new wait: the answers number the calls from the count before it
            self._sequence, self._base, self._counts = sequence, comm.failures.rounds, {}
        epoch = epoch_of(sequence - 1)
        for source, tags in self.sources.items():
            if source not in self._open and any(collectives.arrived(comm, source, tag + epoch) for tag in tags):
                self._open[source] = _Answer(self, source, epoch, who)
        self._advance()

    def settle(self):
        """The agreement has completed: end the answers still open (their neighbours have ended their calls, so
        only their last messages are on their way)."""
        WaitLoop().run(self._advance)

    def _advance(self):
        """Move every open answer on, noting those that end; whether none is left open."""
        for source, answer in list(self._open.items()):
            if answer.progress():
                del self._open[source]
                self._note(answer)
        return not self._open

    def _note(self, answer):
        """An answer has ended: the neighbour raised in its call number ``n``; this rank raises at the end of its
        own call (``Failures.skip``)."""
        source = answer.source
        self._counts[source] = self._counts.get(source, 0) + 1
        number = self._base + self._counts[source]
        side = FROM[next(tag for tag, rank in self.receives.items() if rank == source)]
        error = InputError(
            f"{side} neighbour rank {source} was in {answer.theirs} on this grid (halo call {number}) while this rank "
            f"was in {answer.where}: this rank answered that it is not in that call, and rank {source} raised there"
            f"\n  {_FIX}", ValueError)
        error.culprit = None  # two calls that do not match: each rank prints its own view
        self.grid.cart.failures.skip(number, error)


class _Answer:
    """One neighbour's halo round, answered by a rank in another call: its headers sent at once, the neighbour's
    messages received and dropped as they arrive, then the two calls' names exchanged (as ``NeighbourRound.details``
    does on the neighbour's side)."""

    __slots__ = ("source", "where", "owed", "round", "sent", "theirs", "comm")

    def __init__(self, calls, source, epoch, who):
        g = calls.grid
        site = call_site()
        self.source, self.comm = source, g.cart
        self.where = who + (f", called at {site}" if site else "")
        self.owed = [(rank, tag) for tag, rank in calls.sends.items() if rank == source]
        expected = [(source, tag) for tag, rank in calls.receives.items() if rank == source]
        optional = {(source, tag + RECORD): 1 for tag, rank in calls.receives.items() if rank == source}
        memory = g.node_memory
        acknowledge = None if memory is None else (lambda s, t, where: memory.acknowledge(s, t, where[1]))
        error = InputError(f"it is in {self.where}, not in a halo call", ValueError)
        self.round = NeighbourRound(g.cart, who, who, (0, 0), error, expected, lambda header, s, t: None,
                                    optional=optional, acknowledge=acknowledge, epoch=epoch, absent=True)
        for dest, tag in self.owed:
            self.round.send(dest, tag, None)
        self.sent, self.theirs = None, None

    def progress(self):
        """Move the answer on without waiting; whether it has ended."""
        if self.sent is None:
            if not self.round.progress():
                return False
            self.round.finish(self.owed)  # everything has arrived: ends at once
            mine = (self.round.error.text, self.round.description, self.round.who)
            self.sent = collectives.isend_object(self.comm, mine, self.source, DETAILS_TAG)
        if not collectives.arrived(self.comm, self.source, DETAILS_TAG):
            return False
        theirs = collectives.receive_object(self.comm, self.source, DETAILS_TAG)
        collectives.waitall([self.sent])
        self.theirs = theirs[2]  # (error text, description, who): NeighbourRound.details
        return True


def answer_skipped_calls(grid, pattern):
    """Make ``grid``'s whole communicator answer the halo calls of its neighbours that it does not make (once)."""
    if grid.cart.answers is None and grid.size > 1:
        grid.cart.answers = SkippedCalls(grid, pattern.sends, pattern.receives)
