"""Waiting for the other ranks of an agreement, with a report when one never arrives.

A rank that never enters a call the others are in (it raised outside
mpisphere, returned early, was given the call on some ranks only, or makes
its calls in another order) leaves them waiting in the agreement, the first
step of every collective call. Where MPI would spin silently, ``wait``
polls the agreement's non-blocking reduction and, after
``config.stall_report`` seconds, prints once to stderr where this rank
waits, which ranks of the call are waiting too (and in which call) and which
have not arrived, with the likely causes. After ``config.stall_deadline``
seconds it prints the report again and aborts the job: no rank can leave a
collective another rank never joins.

The waiting ranks learn of each other by point-to-point messages (tag
``STALL_TAG``) sent only when the report is due: a call that completes
in time costs a non-blocking reduction and its polling (no slower than the
blocking one here: ``scripts/bench_primitives.py``'s agreement rows).
"""

import atexit
import os
import sys
import time

from mpi4py import MPI

from .. import collectives
from ..settings import config
from ..waiting import WaitLoop
from .differing import ranks_text

__all__ = ["wait", "Watch", "STALL_TAG", "ExitNotice", "call_site"]

STALL_TAG = 0x6D7374
_SPIN = 0.05          # seconds of yielding polls before the loop sleeps between them
_NAP = 0.001          # the sleep of a long wait: its latency once a wait has lasted _SPIN
# a Watch yields the core this long (as the loop's first _SPIN seconds do) before it builds its loop, whose clock
# starts then: a neighbour a few microseconds behind (most waits of a halo call) costs no loop
_YIELD_FIRST = 0.001
_GATHER = 2.0         # seconds the report waits for the other ranks' notes


def _name(comm):
    name = comm.Get_name()
    return f"{name} ({comm.Get_size()} ranks)" if name else f"a communicator of {comm.Get_size()} ranks"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mpisphere/
EXIT_NOTICE_RANKS = 1024  # the largest grid whose ranks tell every other rank when they exit (size - 1 notes each)
# the libraries whose frames lie between a user's call and mpisphere's wait (a drop-in layer's forward runs inside
# torch.nn.Module.__call__, its backward inside torch.autograd): not the user's line
_LIBRARIES = ("torch", "torch_harmonics")


def _library_folders():
    """The folders of mpisphere and of the :data:`_LIBRARIES` this process has imported."""
    folders = [_PACKAGE]
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if where:
            folders.append(os.path.dirname(os.path.abspath(where)))
    return tuple(folder + os.sep for folder in folders)


def call_site():
    """``"file:line"`` of the innermost frame outside mpisphere and the libraries it runs inside (PyTorch): the
    user's call that waits (None if none)."""
    frame = sys._getframe(1)
    libraries = _library_folders()
    while frame is not None:
        name = frame.f_code.co_filename
        path = os.path.abspath(name)
        if name.startswith("<") and not name.startswith("<frozen"):  # python -c, an interactive session
            return f"{name}:{frame.f_lineno}"
        if not name.startswith("<") and not path.startswith(libraries):
            try:
                shown = os.path.relpath(path)
            except ValueError:  # another drive
                shown = path
            return f"{shown if not shown.startswith('..') else path}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class ExitNotice:
    """Tells the other ranks of a grid that this process ended with the grid still in use (not freed).

    Registered with :mod:`atexit` when a grid is made (before mpi4py
    finalizes MPI: handlers run last-registered first) and cancelled by
    ``grid.free()``. At exit it sends a small note to every other rank of the
    grid's communicator (tag ``STALL_TAG``), so that a rank left waiting in
    a call this one never made can say, in its stall report, that this rank
    has ended its program. Grids of more than ``EXIT_NOTICE_RANKS`` ranks
    send none (each note is one message to every other rank).
    """

    __slots__ = ("comm", "sent", "__weakref__")

    def __init__(self, comm):
        self.comm, self.sent = comm, []
        atexit.register(self)

    def cancel(self):
        atexit.unregister(self)
        self.comm = None

    def __call__(self):
        comm, self.comm = self.comm, None
        if comm is None or MPI.Is_finalized() or comm == MPI.COMM_NULL:
            return
        size, rank = comm.Get_size(), comm.Get_rank()
        if size > EXIT_NOTICE_RANKS:
            return
        # small messages, sent eagerly; kept referenced until the process ends
        self.sent = [collectives.isend_object(comm, {"rank": rank, "ended": True}, q, STALL_TAG)
                     for q in range(size) if q != rank]


_CAUSES = ("  likely causes: a rank raised outside mpisphere, returned or exited early, was given the call on some "
           "ranks only (an operator built or called inside 'if rank == ...'), or the ranks make their collective "
           "calls in different orders. MPISPHERE_STALL_REPORT=seconds sets when this report comes (0: never), "
           "MPISPHERE_STALL_DEADLINE=seconds aborts the job after that long.")


def _notes(comm, found, ended, sequence=None):
    """Read the stall notes that have arrived on ``comm``: calls into ``found``, ranks that ended into ``ended``.

    ``sequence``: which of ``comm``'s agreements this rank waits in (:func:`_next_wait`); a note from a wait of
    another number is stale (that agreement has completed: every rank was in it) and is dropped.
    """
    for source, theirs in collectives.receive_objects(comm, STALL_TAG):
        if theirs.get("ended"):
            ended.add(source)
        elif sequence is None or theirs.get("wait") in (None, sequence):
            found[source] = (theirs.get("who", "?"), theirs.get("at"))


def _next_wait(comm):
    """The number of this agreement on ``comm`` (the same on every rank in the same call), or None.

    A grid's communicators count their agreements (``GridComm.agreements``); other communicators carry no
    count, and their notes are taken as current.
    """
    count = getattr(comm, "agreements", None)
    if count is None:
        return None
    comm.agreements = count + 1
    return count + 1


def _space_notes(comm, ended):
    """The ranks of ``comm`` that ended, from the notes on the grid's whole communicator (``comm.space``)."""
    space = getattr(comm, "space", None)
    if space is None or space is comm or space == MPI.COMM_NULL:
        return
    exited = {source for source, theirs in collectives.receive_objects(space, STALL_TAG) if theirs.get("ended")}
    if exited:
        ended.update(r for r, s in enumerate(collectives.ranks_in(comm, space)) if s in exited)


def report(comm, who, waited, final=False, site=None, ended=None, sequence=None):
    """The stall report of this rank (every waiting rank writes its own): ``(text, sends)``.

    Sends this rank's note (its call, the user's line that made it and the
    agreement's number ``sequence``) to every other rank of ``comm``, then
    collects the notes of the ranks that are waiting in the same agreement,
    for up to a few seconds. A rank that ended its program with the grid
    still in use has sent a note of its own (``ExitNotice``); ``ended`` keeps
    those ranks from one report of a wait to the next. ``sends``: the
    requests of this rank's notes, for the caller to complete.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    note = {"rank": rank, "who": who, "at": site, "wait": sequence}
    sends = [collectives.isend_object(comm, note, q, STALL_TAG) for q in range(size) if q != rank]
    notes, ended = {rank: (who, site)}, (set() if ended is None else ended)
    start = time.monotonic()
    while len(notes) + len(ended - set(notes)) < size and time.monotonic() - start < _GATHER:
        _notes(comm, notes, ended, sequence)
        _space_notes(comm, ended)
        time.sleep(0.01)
    ended.difference_update(notes)
    same = [r for r, (w, _) in notes.items() if w == who]
    other = {r: note for r, note in notes.items() if note[0] != who}
    missing = [r for r in range(size) if r not in notes and r not in ended]
    lines = [f"mpisphere: rank {rank} of {size} has waited {waited:.0f} s in {who}'s agreement over {_name(comm)}"
             + (f", called at {site}" if site else "")
             + (" and aborts the job now (MPISPHERE_STALL_DEADLINE)" if final else "") + ".",
             f"  waiting in it too: {ranks_text(same)}"]
    lines += [f"  rank {r} waits in another call: {w}" + (f", called at {at}" if at else "")
              for r, (w, at) in sorted(other.items())]
    if ended:
        lines.append(f"  ended its program (exited with the grid in use, without this call): {ranks_text(ended)}")
    lines.append(f"  not arrived: {ranks_text(missing)}" if missing else
                 "  every rank has arrived here, in another call or at its end (see above)")
    lines.append(_CAUSES)
    return "\n".join(lines), sends


def _write(text):
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def wait(request, comm, who):
    """Wait for ``request``, the agreement's reduction over ``comm``: report a stall, abort at the deadline.

    Every request the report starts is completed before this returns (its notes are small: sent eagerly,
    they complete whether or not a rank reads them; a note read late is recognised as stale by its number).
    """
    sequence = _next_wait(comm)
    if collectives.test(request):
        return
    ended, sends = set(), []
    # a grid's whole communicator answers the halo calls its neighbours make instead of this agreement (halo.absent)
    answers = getattr(comm, "answers", None) if sequence is not None else None

    def write(waited, final):
        text, sent = report(comm, who, waited, final=final, site=call_site(), ended=ended, sequence=sequence)
        sends.extend(sent)
        _write(text)

    def done():
        if collectives.test(request):
            return True
        if answers is not None:
            answers.poll(sequence, who)
        return False

    WaitLoop(config.stall_report, config.stall_deadline, spin=_SPIN, nap=_NAP).run(
        done, write, lambda: collectives.abort(comm, 1))
    if answers is not None:
        answers.settle()
    collectives.waitall(sends)


class Watch:
    """The clock of a wait for messages from known ranks (a halo's neighbours): report once, abort at the deadline.

    :meth:`idle` is called each time a poll found nothing, with the ranks
    whose messages are still awaited; what has arrived and what has not is
    this rank's own knowledge (no messages of its own). The clock is a
    ``mpisphere.waiting.WaitLoop``, built once the wait has lasted a
    millisecond (until then :meth:`idle` only yields the core).
    """

    __slots__ = ("comm", "who", "loop", "started", "ended")

    def __init__(self, comm, who):
        self.comm, self.who = comm, who
        self.loop = self.started = None
        self.ended = set()  # the ranks whose notes said they ended their program, kept from report to report

    def idle(self, pending, arrived):
        """One poll found nothing: ``pending`` ranks are awaited, ``arrived`` have sent theirs."""
        if self.loop is None:
            now = time.monotonic()
            self.started = self.started or now
            if now - self.started < _YIELD_FIRST:
                os.sched_yield()
                return
            self.loop = WaitLoop(config.stall_report, config.stall_deadline, spin=_SPIN, nap=_NAP)
        self.loop.idle(lambda waited, final: _write(self.report(waited, final, pending, arrived)),
                       lambda: collectives.abort(self.comm, 1))

    def report(self, waited, final, pending, arrived):
        """The report of a wait for ``pending`` neighbours: where this rank waits (the user's line), what the ranks it
        has heard of do (the notes of ranks waiting in an agreement, and of ranks that ended their program)."""
        rank, size, comm = self.comm.Get_rank(), self.comm.Get_size(), self.comm
        others = {}
        start = time.monotonic()
        while True:  # the waiting ranks' notes come when their own report is due: a moment to let them arrive
            _notes(comm, others, self.ended)
            _space_notes(comm, self.ended)
            if pending <= self.ended | set(others) or time.monotonic() - start >= _GATHER:
                break
            time.sleep(0.01)
        site = call_site()
        lines = [f"mpisphere: rank {rank} of {size} has waited {waited:.0f} s in {self.who} for its neighbours"
                 + (f", called at {site}" if site else "")
                 + (" and aborts the job now (MPISPHERE_STALL_DEADLINE)" if final else "") + ".",
                 f"  not arrived: the messages of {ranks_text(pending)}", f"  arrived: {ranks_text(arrived)}"]
        lines += [f"  rank {r} waits in another call: {w}" + (f", called at {at}" if at else "")
                  for r, (w, at) in sorted(others.items()) if r in pending]
        gone = sorted(self.ended & set(pending))
        if gone:
            lines.append(f"  ended its program (exited with the grid in use, without this call): {ranks_text(gone)}")
        return "\n".join(lines + [_CAUSES])
