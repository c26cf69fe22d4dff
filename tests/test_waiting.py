"""WaitLoop, the one wait loop: the report comes once when due, the deadline reports again and ends the wait."""

import pytest

from mpisphere import waiting
from mpisphere.waiting import WaitLoop


class Ended(Exception):
    pass


def test_a_wait_that_ends_in_time_neither_reports_nor_naps():
    calls = []
    loop = WaitLoop(10.0, 20.0, spin=1.0, nap=0.001, on_nap=lambda: calls.append("nap"))
    polls = iter([False, False, True])
    loop.run(lambda: next(polls), report=lambda waited, final: calls.append(final))
    assert calls == [] and not loop.reported


class Clock:
    """A clock that moves 10 ms at every reading, and sleeps that take no time: the verdict does not depend on
    the machine's load."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self):
        self.now += 0.01
        return self.now

    def sleep(self, seconds):
        pass


def test_the_report_comes_once_then_the_deadline_reports_and_ends(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(waiting, "time", clock)
    monkeypatch.setattr(waiting.os, "sched_yield", lambda: None)
    reports, naps = [], []
    loop = WaitLoop(0.05, 0.2, spin=0.03, nap=0.002, on_nap=lambda: naps.append(loop.waited()))

    def expire():
        raise Ended

    with pytest.raises(Ended):
        loop.run(lambda: False, report=lambda waited, final: reports.append((waited, final)), expire=expire)
    assert [final for _, final in reports] == [False, True]
    assert 0.05 <= reports[0][0] < 0.2 <= reports[1][0]
    assert len(naps) == 1 and naps[0] >= 0.03


def test_a_deadline_without_a_report_time_still_reports_once_at_the_end():
    reports = []
    loop = WaitLoop(None, 0.01, spin=0.0, nap=0.001)
    with pytest.raises(Ended):
        loop.run(lambda: False, report=lambda waited, final: reports.append(final),
                 expire=lambda: (_ for _ in ()).throw(Ended))
    assert reports == [True]
