"""Failure notes: a halo call that failed on some ranks of a grid reaches the others at their next call.

A halo exchange agrees with the neighbours only (``NeighbourRound``): the
ranks whose result would use wrong data raise, and the ranks farther away
return their (correct) results, unaware; a program that catches the error
where it was raised would then go on with ranks that never learnt of it.
So every rank that raises in a halo call tells every other rank of the grid
(a small note, tag ``FAILURE_TAG`` on ``grid.cart``), and every outermost
call on the grid, operator or collective method, reads the notes that
have arrived when it has done its work (``raise_noted_failure``): a
note about a halo call this rank returned from normally makes the call
raise, with the mistake's class, its rank and the failed rank's message.
The call is not cut short: its messages and agreements ran to the end, so
the ranks that raised in the halo call and went on to the same next call
are not left waiting, and raise only once.

Halo calls are numbered on each grid (``Failures.next_round``): every rank
makes the same halo calls in the same order (or the calls raise), so a
number names one call on every rank. A rank that raised in call ``n``
itself drops the notes about ``n``; a note about a call this rank has not
reached yet is kept until it has. Ranks that raised and then make another
call than the others (or end their program) leave those waiting as any
such difference does: the agreement's stall report says who is where.
"""

from .. import collectives
from .collective import KINDS, printed_once
from .spec import InputError

__all__ = ["Failures", "FAILURE_TAG", "begin_call", "raise_noted_failure"]

FAILURE_TAG = 0x6D6678  # "mfx", on the grid's whole communicator


class Failures:
    """The halo failures of one grid that this rank knows of (on ``grid.cart``, shared by its sub-communicators).

    Attributes
    ----------
    rounds : int
        Halo calls this rank has started on the grid.
    raised : set of int
        The numbers of the halo calls this rank raised in (their notes are dropped here).
    """

    __slots__ = ("comm", "single", "rounds", "raised", "closed", "_before", "_kept", "_sent")

    def __init__(self, comm):
        self.comm = comm
        self.single = comm.Get_size() == 1
        self.rounds = 0
        self.raised = set()
        self.closed = False  # the grid is being freed: no call raises an earlier failure any more
        self._before = 0     # halo calls completed before the outermost call now running began
        self._kept = []   # notes read and not acted on yet (about calls this rank had not completed)
        self._sent = []   # the requests of the notes this rank sent, completed as they go

    def begin(self):
        """An outermost call begins: the halo calls so far are the earlier ones it may raise for."""
        self._before = self.rounds

    def next_round(self):
        """The number of the halo call this rank starts now."""
        self.rounds += 1
        return self.rounds

    def announce(self, number, who, culprit, kind, cause, own=False):
        """This rank raised in halo call ``number``: tell every other rank of the grid.

        ``culprit``: the rank of the mistake as far as this rank knows it (or
        ``None``), ``kind`` its exception class, ``cause`` one line, ``own``
        whether the mistake was the culprit's own input (it then printed the
        whole message, and the notes' exceptions name it).
        """
        if number in self.raised:
            return
        self.raised.add(number)
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        note = {"call": number, "who": who, "rank": rank, "culprit": culprit, "kind": kind.__name__,
                "cause": cause, "own": bool(own)}
        # small messages, sent eagerly: they complete whether or not a rank reads them
        self._sent += [collectives.isend_object(self.comm, note, q, FAILURE_TAG) for q in range(size) if q != rank]

    def _read(self):
        """Keep the notes that have arrived; drop the sends that have completed."""
        arrived = collectives.receive_objects(self.comm, FAILURE_TAG)
        if arrived:
            self._kept += [note for _, note in arrived]
        if self._sent:
            self._sent = [r for r in self._sent if not collectives.test(r)]

    def noted(self):
        """Whether a note about a halo call this rank did not raise in has arrived (read now, kept for later)."""
        self._read()
        return any(note.get("call") not in self.raised for note in self._kept)

    def finding(self):
        """An :class:`InputError` for a halo call this rank completed that failed elsewhere, or ``None``.

        Reads the notes that have arrived (does not wait). The call is then
        counted as raised here, so the other notes about it are dropped.
        """
        if self.single or self.closed:
            return None
        self._read()
        if not self._kept:
            return None
        found, kept = None, []
        for note in self._kept:
            number = note.get("call")
            if number in self.raised:
                continue
            if number > self._before:  # a call this rank has not completed before this one began
                kept.append(note)
                continue
            if found is None:
                found = note
        self._kept = kept
        if found is None:
            return None
        self.raised.add(found["call"])
        culprit = found.get("culprit")
        # a rank's own input is one culprit; calls that do not match are a pair, each side naming the other
        at = "" if culprit is None else f" (the mistake at rank {culprit})" if found.get("own") else \
            f" (its call and rank {culprit}'s do not match)"
        error = InputError(
            f"{found['who']} failed on rank {found['rank']}{at} in an earlier call, halo call {found['call']} on this "
            "grid, which returned normally on this rank; this call completed here, and raises so that this rank "
            f"does not go on alone\n  rank {found['rank']}: {found['cause']}",
            KINDS.get(found.get("kind"), ValueError))
        error.culprit = culprit if found.get("own") else None
        return error

    def free(self):
        """The grid is being freed: drop the notes that arrived and the ones kept, complete the sends.

        Called before and after the free's agreement: by its end every rank has sent its notes.
        """
        self.closed = True
        collectives.receive_objects(self.comm, FAILURE_TAG)
        collectives.waitall(self._sent)
        self._sent, self._kept = [], []


def begin_call(comm):
    """An outermost call on ``comm`` (a grid's communicator) begins (see :func:`raise_noted_failure`)."""
    failures = getattr(getattr(comm, "space", None), "failures", None)
    if failures is not None:
        failures.begin()


def raise_noted_failure(comm, who):
    """At the end of an outermost call on ``comm`` (a grid's communicator) that completed on this rank: raise a
    halo failure that other ranks noted and this rank has not raised for yet (does nothing otherwise).

    The call itself ran to its end on this rank, so no rank waits for it;
    the exception has the mistake's class and names the ranks.
    """
    space = getattr(comm, "space", None)
    failures = getattr(space, "failures", None)
    error = None if failures is None else failures.finding()
    if error is None:
        return
    rank, size = space.Get_rank(), space.Get_size()
    exc = error.kind(f"{who}: rank {rank} of {size}: {error.text}")
    # printed in one line naming the rank whose own input was the mistake (it printed its message in full)
    culprit = getattr(error, "culprit", None)
    cause = error.text.split("\n")[0].split(";")[0]
    raise printed_once(exc, who, rank, rank if culprit is None else culprit, f"rank {rank} of {size}: {cause}",
                       everywhere=False)
