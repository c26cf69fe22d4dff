"""The one wait loop: poll, yield the core, then nap; report once when due; at the deadline, report and end (no MPI).

Every place mpisphere waits for other ranks (the agreement's reduction, a
halo's neighbours, a shared tile's readers) and the test harness's meeting
after each phase waits through a ``WaitLoop``: the clock, the report
and the deadline are written once. What is polled, what the report says and
how the wait ends at the deadline are the caller's.
"""

import os
import time

__all__ = ["WaitLoop"]


class WaitLoop:
    """The clock of one wait.

    Parameters
    ----------
    report_after : float or None
        Seconds after which ``report(waited, final=False)`` is called, once
        (None: never).
    deadline : float or None
        Seconds after which ``report(waited, final=True)`` and then
        ``expire()`` are called (None: never). ``expire`` should end the
        wait (abort the job, or raise); if it returns, the wait goes on.
    spin : float
        Seconds of polls that yield the core (``sched_yield``) before the
        loop naps between polls: ranks oversubscribing the cores let the
        one being waited for run, and a short wait keeps its latency low.
    nap : float
        The sleep between polls once the wait has lasted ``spin``.
    on_nap : callable or None
        Called once, when the loop first naps (a wait that lasts).

    Notes
    -----
    :meth:`run` drives the loop with a poll; a caller whose loop does work
    of its own between polls calls :meth:`idle` each time a poll found
    nothing. Not shared between threads.
    """

    __slots__ = ("report_after", "deadline", "spin", "nap", "on_nap", "start", "reported", "_napping")

    def __init__(self, report_after=None, deadline=None, *, spin=0.05, nap=0.001, on_nap=None):
        self.report_after, self.deadline = report_after, deadline
        self.spin, self.nap, self.on_nap = spin, nap, on_nap
        self.start, self.reported, self._napping = None, False, False

    def waited(self):
        """Seconds since the first idle poll (0 before it)."""
        return 0.0 if self.start is None else time.monotonic() - self.start

    def idle(self, report=None, expire=None):
        """One poll found nothing: report or end if due, then yield the core or nap."""
        now = time.monotonic()
        if self.start is None:
            self.start = now
        waited = now - self.start
        final = self.deadline is not None and waited >= self.deadline
        if report is not None and (final or (not self.reported and self.report_after is not None
                                             and waited >= self.report_after)):
            report(waited, final)
            self.reported = True
        if final and expire is not None:
            expire()
        if waited < self.spin:
            os.sched_yield()
            return
        if not self._napping:
            self._napping = True
            if self.on_nap is not None:
                self.on_nap()
        time.sleep(self.nap)

    def run(self, poll, report=None, expire=None):
        """Wait until ``poll()`` is true; the arguments of :meth:`idle` on each empty poll. Returns the wait's
        length in seconds."""
        while not poll():
            self.idle(report, expire)
        return self.waited()
