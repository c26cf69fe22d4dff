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

import os
import sys
import time

from .. import collectives
from ..settings import config

__all__ = ["wait", "Watch", "STALL_TAG"]

STALL_TAG = 0x6D7374
_SPIN = 0.05          # seconds of yielding polls before the loop sleeps between them
_NAP = 0.001          # the sleep of a long wait: its latency once a wait has lasted _SPIN
_GATHER = 2.0         # seconds the report waits for the other ranks' notes


def _ranks(ranks):
    ranks = sorted(ranks)
    if not ranks:
        return "none"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:12])) + (", ..." if len(ranks) > 12 else "")


def _name(comm):
    name = comm.Get_name()
    return f"{name} ({comm.Get_size()} ranks)" if name else f"a communicator of {comm.Get_size()} ranks"


_CAUSES = ("  likely causes: a rank raised outside mpisphere, returned or exited early, was given the call on some "
           "ranks only (an operator built or called inside 'if rank == ...'), or the ranks make their collective "
           "calls in different orders. MPISPHERE_STALL_REPORT=seconds sets when this report comes (0: never), "
           "MPISPHERE_STALL_DEADLINE=seconds aborts the job after that long.")


def report(comm, who, waited, final=False):
    """The stall report of this rank (every waiting rank writes its own), as text.

    Sends this rank's note to every other rank of ``comm``, then collects
    the notes of the ranks that are waiting too, for up to a few seconds.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    note = {"rank": rank, "who": who}
    sends = [collectives.isend_object(comm, note, q, STALL_TAG) for q in range(size) if q != rank]
    notes = {rank: who}
    start = time.monotonic()
    while len(notes) < size and time.monotonic() - start < _GATHER:
        for source, theirs in collectives.receive_objects(comm, STALL_TAG):
            notes[source] = theirs.get("who", "?")
        time.sleep(0.01)
    same = [r for r, w in notes.items() if w == who]
    other = {r: w for r, w in notes.items() if w != who}
    missing = [r for r in range(size) if r not in notes]
    lines = [f"mpisphere: rank {rank} of {size} has waited {waited:.0f} s in {who}'s agreement over {_name(comm)}"
             + (" and aborts the job now (MPISPHERE_STALL_DEADLINE)" if final else "") + ".",
             f"  waiting in it too: ranks {_ranks(same)}"]
    lines += [f"  rank {r} waits in another call: {w}" for r, w in sorted(other.items())]
    lines.append(f"  not arrived: ranks {_ranks(missing)}" if missing else
                 "  every rank has arrived here or in another call (the calls differ: see above)")
    lines.append(_CAUSES)
    del sends  # small messages, sent eagerly: nothing waits on them
    return "\n".join(lines)


def wait(request, comm, who):
    """Wait for ``request``, the agreement's reduction over ``comm``: report a stall, abort at the deadline."""
    report_after, deadline = config.stall_report, config.stall_deadline
    if collectives.test(request):
        return
    start = time.monotonic()
    reported = False
    while not collectives.test(request):
        waited = time.monotonic() - start
        if not reported and report_after is not None and waited >= report_after:
            sys.stderr.write(report(comm, who, waited) + "\n")
            sys.stderr.flush()
            reported = True
        if deadline is not None and waited >= deadline:
            sys.stderr.write(report(comm, who, waited, final=True) + "\n")
            sys.stderr.flush()
            collectives.abort(comm, 1)
        if waited < _SPIN:
            os.sched_yield()  # ranks oversubscribing the cores: let the one being waited for run
        else:
            time.sleep(_NAP)
    if reported:  # the notes of ranks that reported after this one's: not for a later report
        collectives.receive_objects(comm, STALL_TAG)


class Watch:
    """The clock of a wait for messages from known ranks (a halo's neighbours): report once, abort at the deadline.

    :meth:`idle` is called each time a poll found nothing, with the ranks
    whose messages are still awaited; what has arrived and what has not is
    this rank's own knowledge (no messages of its own).
    """

    __slots__ = ("comm", "who", "start", "reported")

    def __init__(self, comm, who):
        self.comm, self.who = comm, who
        self.start, self.reported = None, False

    def idle(self, pending, arrived):
        """One poll found nothing: ``pending`` ranks are awaited, ``arrived`` have sent theirs."""
        now = time.monotonic()
        if self.start is None:
            self.start = now
        waited = now - self.start
        report_after, deadline = config.stall_report, config.stall_deadline
        due = (not self.reported and report_after is not None and waited >= report_after) or \
            (deadline is not None and waited >= deadline)
        if due:
            final = deadline is not None and waited >= deadline
            rank, size = self.comm.Get_rank(), self.comm.Get_size()
            sys.stderr.write(
                f"mpisphere: rank {rank} of {size} has waited {waited:.0f} s in {self.who} for its neighbours"
                + (" and aborts the job now (MPISPHERE_STALL_DEADLINE)" if final else "") + ".\n"
                f"  not arrived: the messages of ranks {_ranks(pending)}\n  arrived: ranks {_ranks(arrived)}\n"
                + _CAUSES + "\n")
            sys.stderr.flush()
            self.reported = True
            if final:
                collectives.abort(self.comm, 1)
        if waited < _SPIN:
            os.sched_yield()
        else:
            time.sleep(_NAP)
