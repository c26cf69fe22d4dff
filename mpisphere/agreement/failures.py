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

A note travels on its own, so how soon it arrives depends on the machine.
The agreements over the whole grid make the verdict independent of it: each
rank brings the number of the last halo call that raised in the call itself
on it (``token``), the reduction gives every rank the latest one, and a
rank that returned normally from that call raises at the end of the call
that agreed (``learn``), waiting for the note if it has not come yet (it
was sent before its sender entered the agreement). A rank that waited in
such an agreement while its neighbours were in a halo call it never made
answered them (:mod:`mpisphere.halo.absent`) and raises at the end of that
call too (``skip``).
"""

from .. import collectives
from ..waiting import WaitLoop
from .collective import KINDS, printed_once
from .spec import InputError

__all__ = ["Failures", "FAILURE_TAG", "begin_call", "raise_finding", "raise_noted_failure"]

FAILURE_TAG = 0x6D6678  # "mfx", on the grid's whole communicator
_RANK_BITS = 24  # an agreement's failure word: the call's number above, its rank below
_NOTE_WAIT = 60.0  # seconds a rank waits for the note of a failure an agreement told it of


class Failures:
    """The halo failures of one grid that this rank knows of (on ``grid.cart``, shared by its sub-communicators).

    Attributes
    ----------
    rounds : int
        Halo calls this rank has started on the grid.
    raised : set of int
        The numbers of the halo calls this rank raised in (their notes are dropped here).
    """

    __slots__ = ("comm", "single", "rounds", "raised", "closed", "failed", "skipped", "learnt", "_before", "_kept",
                 "_sent")

    def __init__(self, comm):
        self.comm = comm
        self.single = comm.Get_size() == 1
        self.rounds = 0
        self.raised = set()
        self.closed = False  # the grid is being freed: no call raises an earlier failure any more
        self.failed = 0      # the last halo call that raised in the call itself on this rank (and was announced)
        self.skipped = None  # InputError: neighbours' halo calls this rank answered, not making them (halo.absent)
        self.learnt = None   # (call, rank): a halo call that failed on rank, learnt from an agreement
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
        self.failed = max(self.failed, number)
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        note = {"call": number, "who": who, "rank": rank, "culprit": culprit, "kind": kind.__name__,
                "cause": cause, "own": bool(own)}
        # small messages, sent eagerly: they complete whether or not a rank reads them
        self._sent += [collectives.isend_object(self.comm, note, q, FAILURE_TAG) for q in range(size) if q != rank]

    def skip(self, number, error):
        """This rank answered a neighbour's halo call ``number`` that it did not make (it waited in an agreement,
        :mod:`mpisphere.halo.absent`): its count of calls follows, and ``error`` is raised at the end of the call
        it waited in (the first such error is kept)."""
        self.rounds = max(self.rounds, number)
        self.raised.add(number)
        if self.skipped is None:
            self.skipped = error

    def token(self):
        """This rank's word in an agreement over the grid: its last failed halo call and its rank (0: none)."""
        return 0 if self.single or not self.failed else (self.failed << _RANK_BITS) | self.comm.Get_rank()

    def learn(self, token):
        """The agreement's maximum of :meth:`token`: a halo call this rank returned from normally that failed on
        another rank is raised at the end of the call that agreed (:meth:`finding`)."""
        number, rank = int(token) >> _RANK_BITS, int(token) & ((1 << _RANK_BITS) - 1)
        if number and number not in self.raised and number <= self.rounds:
            self.learnt = (number, rank)

    def raising(self):
        """The agreement raises on every rank: what it learnt, and the calls this rank answered, are raised now."""
        if self.learnt is not None:
            self.raised.add(self.learnt[0])
            self.learnt = None
        self.skipped = None

    def _await_learnt(self):
        """Wait for the note of the call :meth:`learn` found (sent before its rank entered the agreement)."""
        number, rank = self.learnt
        self.learnt = None

        def arrived():
            self._read()
            return any(note.get("call") == number for note in self._kept)

        def never():  # MPI delivers what was sent; if it has not, say what the agreement told
            self._kept.append({"call": number, "who": "a halo call", "rank": rank, "culprit": None,
                               "kind": "ValueError", "cause": "(its note did not arrive)", "own": False})

        WaitLoop(deadline=_NOTE_WAIT).run(arrived, expire=never)

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
        if self.skipped is not None:
            error, self.skipped = self.skipped, None
            return error
        self._read()
        if self.learnt is not None:
            self._await_learnt()
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
    if error is not None:
        raise_finding(error, who, space.Get_rank(), space.Get_size())


def raise_finding(error, who, rank, size, after=""):
    """Raise ``error`` (from :meth:`Failures.finding`) at the end of ``who``'s call on this rank; ``after``: what
    the call did, said after its first line."""
    first, _, rest = error.text.partition("\n")
    exc = error.kind(f"{who}: rank {rank} of {size}: {first}{after}" + (f"\n{rest}" if rest else ""))
    culprit = getattr(error, "culprit", None)
    if culprit is None:  # calls that did not match: no one rank's mistake, each rank prints its own view
        exc.mpisphere_message, exc.mpisphere_reporter = str(exc), None
        raise exc
    # printed in one line naming the rank whose own input was the mistake (it printed its message in full)
    cause = error.text.split("\n")[0].split(";")[0]
    raise printed_once(exc, who, rank, culprit, f"rank {rank} of {size}: {cause}", everywhere=False)
