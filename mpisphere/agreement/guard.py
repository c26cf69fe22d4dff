"""The one lock of a grid (``CallGuard``): a call from a second thread is refused on every rank.

``guarded`` is the one protocol around a collective call with that lock
(the operators' calls and the grid's own, ``ProcessGrid.holding``).
"""

import threading

from .failures import begin_call, raise_noted_failure

REFUSED = ("refused: another thread was running an mpisphere operation on the same grid (or operator); MPI "
           "matches one communicator's messages in call order, so two threads on one grid would mix theirs. Give "
           "each thread its own grid (grid.dup()), or make the calls one after the other in the same order on every "
           "rank")

class CallGuard:
    """The lock of one grid: held while a call communicates on any of its communicators.

    MPI matches a communicator's messages in call order, so two threads
    that call at once on one grid would mix theirs. :meth:`enter` takes the
    guard (re-entrant for the thread that holds it) or, when another thread
    holds it, registers ``refusal`` and returns ``False``: the caller raises
    on its rank, and the holding thread runs ``refusal`` (the refused call's
    agreement, with an error) when it leaves, so the ranks that did make
    that call raise too instead of waiting for this one.
    """

    __slots__ = ("_state", "_owner", "_depth", "_refused")

    def __init__(self):
        self._state = threading.Lock()
        self._owner = None
        self._depth = 0
        self._refused = []

    def enter(self, refusal=None):
        me = threading.get_ident()
        with self._state:
            if self._owner is None or self._owner == me:
                self._owner = me
                self._depth += 1
                return True
            if refusal is not None:
                self._refused.append(refusal)
            return False

    def leave(self):
        """Leave the guard; True when the outermost call of the holding thread has left it."""
        while True:
            with self._state:
                if self._depth > 1 or not self._refused:
                    self._depth -= 1
                    if self._depth == 0:
                        self._owner = None
                    return self._depth == 0
                refusal = self._refused.pop(0)
            try:
                refusal()
            except Exception:  # noqa: BLE001 -- the refused call has raised on its own rank already
                pass

    @property
    def outermost(self):
        """True while the holding thread is in its outermost call (not a call made inside another)."""
        return self._depth == 1

    @property
    def held(self):
        """True while some thread holds the guard."""
        return self._owner is not None


class guarded:  # noqa: N801 -- used as a function: ``with guarded(...):``
    """Hold ``guard`` around one collective call ``who`` over ``comm`` (a context manager).

    Refused on this rank (``RuntimeError``) when another thread holds the
    guard; ``refusal`` is what the holder then runs for this call, so the
    other ranks raise too. The outermost call of the holding thread begins
    a call on ``comm`` (``failures.begin_call``) and, when its block
    completed, raises a failure noted elsewhere meanwhile (a halo call that
    failed near a mistake). ``settles``: a callable, False where that last
    step must be skipped (a grid freed in the block).

    A class rather than a generator: it runs around every call, a planned
    halo call's included, and costs a fraction of a generator-based
    context manager's entry and exit.
    """

    __slots__ = ("guard", "comm", "who", "refusal", "settles")

    def __init__(self, guard, comm, who, refusal, settles=None):
        self.guard, self.comm, self.who, self.refusal, self.settles = guard, comm, who, refusal, settles

    def __enter__(self):
        guard = self.guard
        if not guard.enter(self.refusal):
            raise RuntimeError(f"{self.who}: {REFUSED} on this rank; the other ranks raise too when that call ends")
        if guard.outermost:
            begin_call(self.comm)

    def __exit__(self, kind, value, traceback):
        completed = kind is None
        if self.guard.leave() and completed and (self.settles is None or self.settles()):
            raise_noted_failure(self.comm, self.who)  # a halo call that failed elsewhere (agreement.failures)
        return False
