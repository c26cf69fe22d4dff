"""The inner run's plugin (under ``mpiexec``): one collection on every rank, the watchdog, the meeting after a phase."""

import faulthandler
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy
import pytest

from ..waiting import WaitLoop
from .fixtures import grid_id, grid_shapes
from .progress import BASETEMP_VARIABLE, HANGS_VARIABLE, MEET_MARGIN, MEET_SPIN, PROGRESS_VARIABLE, SESSION_END


class InnerPlugin:
    """Keeps the ranks of one mpiexec launch in step, test phase by test phase."""

    def __init__(self, config):
        from mpi4py import MPI
        self.MPI = MPI
        self.config = config
        self.comm = MPI.COMM_WORLD.Dup()  # harness messages never match a test's own
        self._flag = numpy.zeros(1, dtype=numpy.intc)  # the phase's failure flag, reduced in place
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.test_timeout = config.getoption("--mpi-test-timeout")
        self.grace = config.getoption("--mpi-grace")
        # pytest's capture is suspended while plugins configure: fd 2 is the real stderr
        self.err = os.fdopen(os.dup(2), "w", buffering=1)
        expected = os.environ.get("MPISPHERE_TEST_NRANKS")
        if expected is not None and int(expected) != self.size:
            from mpisphere.cuda_aware import mpi_library_path
            launcher = os.environ.get("MPISPHERE_TEST_LAUNCHER", "")
            if Path(launcher).name == "srun":
                hint = ("srun started each process as its own one-rank world: its PMI plugin does not match the "
                        f"MPI library mpi4py loaded ({mpi_library_path()}). Use --mpi=pmi2 for the pip mpich "
                        "package, --mpi=pmix for Open MPI (srun --mpi=list shows what this Slurm offers; "
                        "SLURM_MPI_TYPE sets the default), e.g. MPISPHERE_MPIEXEC='srun --mpi=pmi2'")
            else:
                hint = (f"the mpiexec used does not belong to the MPI library mpi4py loaded ({mpi_library_path()}); "
                        "set MPISPHERE_MPIEXEC to the matching launcher")
            raise pytest.UsageError(f"the launcher started {expected} ranks but MPI reports {self.size}: {hint}")
        path = os.environ.get(PROGRESS_VARIABLE)
        self.progress = open(path, "a", buffering=1) if path and self.rank == 0 else None  # line-buffered
        # the watchdog's traceback: into this rank's own file for the outer run to label, else to stderr
        self.hangs = os.environ.get(HANGS_VARIABLE)
        self.watchdog = open(os.path.join(self.hangs, f"rank-{self.rank}.txt"), "w") if self.hangs else self.err
        self.any_failed = False  # some rank failed some phase (the same on every rank: known from the meetings)
        self._deadline = None  # when the running test's time is up (its watchdog fires): set per test
        self.own_temp = self._own_basetemp(config)
        if self.rank != 0:
            sys.stdout = open(os.devnull, "w")  # the terminal reporter, created next, writes here

    def _own_basetemp(self, config):
        """Give this rank a pytest ``basetemp`` of its own: ``<parent>/rank-<r>``; returns a folder to remove, or None.

        Every rank is a pytest session of its own; in one temporary root they
        raced over pytest's numbered folders and its ``pytest-current`` link
        (a rank's clean-up removed what another was using, and that rank's
        session failed after its tests had passed). The parent is the outer
        run's folder for this launch, else the ``--basetemp`` given, else a
        new folder made by rank 0, removed at the end when every test passed.
        Must run before pytest's ``tmp_path`` factory is made (this plugin's
        ``pytest_configure`` runs first).
        """
        parent = os.environ.get(BASETEMP_VARIABLE) or config.option.basetemp
        made = None
        if not parent:
            made = parent = self.comm.bcast(tempfile.mkdtemp(prefix="pytest-mpi-") if self.rank == 0 else None)
        os.makedirs(parent, exist_ok=True)
        config.option.basetemp = os.path.join(str(parent), f"rank-{self.rank}")
        return made

    def _progress(self, what, nodeid):
        """Rank 0 notes a test's progress for the outer run (``PROGRESS_VARIABLE``); each line is flushed."""
        if self.progress is not None:
            self.progress.write(f"{what}\t{nodeid}\n")

    def pytest_unconfigure(self, config):
        if self.progress is not None:
            self.progress.close()
        if self.own_temp is not None and not self.any_failed:
            # every rank has finished its tests (the last meeting), but maybe not its own clean-up of its folder:
            # one more meeting (the harness's one wait), then rank 0 removes the folders
            self._meet(False, "the end of the session", "unconfigure", None, rearm=False)
            if self.rank == 0:
                shutil.rmtree(self.own_temp, ignore_errors=True)

    def pytest_terminal_summary(self, terminalreporter):
        if self.own_temp is not None and self.any_failed:
            terminalreporter.write_line(f"the ranks' temporary folders are kept in {self.own_temp}")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        """Note a failure of this rank's session after its tests (its own clean-up) for the outer run's report."""
        try:
            return (yield)
        except BaseException as exc:
            if self.hangs:
                with open(os.path.join(self.hangs, f"{SESSION_END}{self.rank}.txt"), "w") as f:
                    f.write(f"{type(exc).__name__}: {exc}")
            raise

    def pytest_runtest_logstart(self, nodeid, location):
        self._progress("start", nodeid)

    def pytest_runtest_logfinish(self, nodeid, location):
        self._progress("done", nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        """Outside ``--mpi-full``, on two grids that both split both axes (2x3, 3x2): each test on one of them."""
        shapes = grid_shapes(self.size)
        if config.getoption("--mpi-full") or len(shapes) != 2 or min(shapes[0]) < 2:
            return
        keep, drop = [], []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if params.get("grid") not in shapes:
                keep.append(item)
                continue
            # the node id without the grid's part: the same key for the test on either grid, on every rank
            head, bracket, tail = item.nodeid.partition("[")
            key = head + bracket + tail.replace(grid_id(params["grid"]), "", 1)
            (keep if params["grid"] == shapes[zlib.crc32(key.encode()) % 2] else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_collection_finish(self, session):
        for item in session.items:
            self._progress("collected", item.nodeid)
        ids = "\n".join(item.nodeid for item in session.items)
        mine = (zlib.crc32(ids.encode()), len(session.items))
        everyone = self.comm.allgather(mine)
        if any(e != everyone[0] for e in everyone):
            counts = ", ".join(f"rank {r}: {n} tests" for r, (_, n) in enumerate(everyone))
            pytest.exit(f"ranks collected different tests ({counts}); parametrisation must not depend "
                        "on the rank or on randomness", returncode=4)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self._deadline = time.monotonic() + self.test_timeout
        self._arm()
        try:
            return (yield)
        finally:
            faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        failed = report.failed
        text = report.longreprtext if failed else None
        if not self._meet(failed, item.nodeid, call.when, text):
            return report
        self.any_failed = True
        # some rank failed: only now are the messages gathered (a passing phase costs one small reduction)
        everyone = self.comm.allgather((report.outcome, text))
        bad = [r for r, (outcome, _) in enumerate(everyone) if outcome == "failed"]
        if self.size > 1:
            report.outcome = "failed"
            report.longrepr = (f"failed on rank(s) {bad} of {self.size} in {call.when}\n"
                               + "\n".join(f"---------- rank {r} ----------\n{everyone[r][1]}" for r in bad))
        self._progress("failed", item.nodeid)
        if self.rank == 0:
            # Written at once as well: a later test that hangs or aborts the job
            # would otherwise take this report down with it.
            self.err.write(f"\n___ {item.nodeid} FAILED ({call.when}) ___\n{report.longreprtext}\n")
        return report

    def _meet(self, failed, nodeid, when, text, rearm=True):
        """Whether any rank failed this phase: one non-blocking maximum of a flag, polled.

        A rank whose phase failed waits ``--mpi-grace`` seconds; if the others
        never arrive (they wait in a collective it never entered) it prints its
        failure and aborts the job. ``rearm``: while a rank waits here (longer
        than ``MEET_SPIN``), its per-test watchdog runs ``MEET_MARGIN`` seconds
        past the test's deadline, so that a rank still stuck in the test is the
        one whose watchdog fires and reports where it is (under load the
        waiting rank's fired first and ended the job without the stuck rank's
        traceback); after the meeting the test's own deadline holds again.
        """
        flag = self._flag
        flag[0] = 1 if failed else 0
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, flag, op=self.MPI.MAX)

        def report(waited, final):
            self.err.write(
                f"\n*** mpisphere test harness: rank {self.rank} of {self.size}: {nodeid} failed in "
                f"{when}, and the other ranks did not reach the end of that phase within {self.grace:.0f} s "
                "(they are probably waiting in a collective this rank never entered). Aborting the job.\n"
                f"{text}\n")
            self.err.flush()
            self._progress("failed", nodeid)

        # yield at first (oversubscribed ranks: the one being waited for runs; a sleep's granularity of ~1 ms per
        # poll made the meetings three times the cost of the tests at 6 ranks on 2 cores), then nap; the
        # watchdog moves past the test's deadline only for a wait that lasts (re-arming costs)
        loop = WaitLoop(None, self.grace if failed else None, spin=MEET_SPIN, nap=0.001,
                        on_nap=(lambda: self._arm(MEET_MARGIN)) if rearm else None)
        loop.run(request.Test, report, lambda: self.MPI.COMM_WORLD.Abort(1))
        if rearm and loop.waited() >= MEET_SPIN:
            self._arm()  # back to the test's own deadline for its next phase
        return bool(flag[0])

    def _arm(self, margin=0.0):
        """(Re)start the per-test watchdog for what is left of the test's time, plus ``margin`` seconds."""
        left = max(0.1, self._deadline - time.monotonic())
        faulthandler.dump_traceback_later(left + margin, exit=True, file=self.watchdog)
