"""The outer run's plugin (``python -m pytest``): a launch item per rank count, run in the background; the MPI guard."""

import os
import shutil

import pytest

from .launch import MpiLaunch, MpiLaunchFailed
from .options import ALSO_AT, LONG_RUN, grids_at, long_run_size, mpi_sizes


def _outer_process_guard(MPI, name, plugin):
    """A stand-in for ``MPI.<name>`` in the outer pytest process, which never starts MPI.

    A serial test that touched MPI used to end the whole outer run without
    a word (MPICH exits at an MPI call before ``MPI_Init``). The stand-in is
    the same kind of communicator (so code that only checks or stores one,
    as a layout does, works as before), but any of its methods raises in
    that test instead, naming it and the fix.
    """
    original = getattr(MPI, name)
    base = type(original)

    def __getattribute__(self, attribute):
        if attribute.startswith("__") or not hasattr(base, attribute):  # mpi4py's own names are MPI calls
            return base.__getattribute__(self, attribute)
        test = plugin.current or "a serial test"
        raise RuntimeError(
            f"mpisphere.testing: {test} uses MPI.{name}.{attribute} in the outer pytest process, which does "
            "not start MPI (a started MPI there breaks the nested mpiexec launches). Mark the test "
            "@pytest.mark.mpi: it then runs under mpiexec at every rank count of --mpi-sizes (add "
            "@pytest.mark.mpi(min_size=...) for a minimum), where MPI is started.")

    def __repr__(self):
        return f"<MPI.{name}: not available in the outer pytest process (mpisphere.testing)>"

    guard = type(f"OuterProcess{base.__name__}", (base,), {"__getattribute__": __getattribute__,
                                                           "__repr__": __repr__})
    return guard()  # a null handle: building one from the original would call MPI (Comm_test_inter)


class OuterPlugin:
    """Replaces the selected MPI tests by one launcher per rank count."""

    def __init__(self, config):
        self.config = config
        self.launchers = []
        self.unrunnable = []
        self.current = None  # the serial test running now, for the guard's message
        self.guarded = {}    # MPI's communicators replaced by guards, restored at the end
        self.bytecode = None  # the launches' shared bytecode cache, when PYTHONDONTWRITEBYTECODE is set
        self.background = []  # the launches that run one after another beside the serial tests

    def guard_mpi(self):
        """Put guards in place of ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` (MPI itself stays uninitialised)."""
        try:
            from mpi4py import MPI
        except (ImportError, RuntimeError, OSError):
            return  # no MPI library here: a test touching MPI fails at its import anyway
        if not MPI.Is_initialized():
            self.guarded = {name: getattr(MPI, name) for name in ("COMM_WORLD", "COMM_SELF")}
            for name in self.guarded:
                setattr(MPI, name, _outer_process_guard(MPI, name, self))

    def pytest_unconfigure(self, config):
        for launcher in self.launchers:  # a session that ended early (-x, Ctrl-C) leaves no ranks running
            launcher.stop()
        if self.bytecode is not None:
            shutil.rmtree(self.bytecode, ignore_errors=True)
        if self.guarded:  # a process that runs pytest.main() and then MPI gets its communicators back
            from mpi4py import MPI
            for name, original in self.guarded.items():
                setattr(MPI, name, original)

    def pytest_runtest_logstart(self, nodeid, location):
        self.current = nodeid

    def pytest_runtest_logfinish(self, nodeid, location):
        self.current = None
        self._advance()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        if not session.config.option.collectonly:
            self._advance()

    def _advance(self):
        """Keep one background launch running while serial tests remain: start the next when one has ended."""
        if self.background and all(launcher.proc is None or launcher.done() for launcher in self.launchers):
            launcher = self.background.pop(0)
            try:
                launcher.start()
            except MpiLaunchFailed:
                pass  # no launcher found: the item fails with this message when it runs

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        sizes = mpi_sizes(config)
        full = config.getoption("--mpi-full")
        serial, by_size, long_runs = [], {}, set()
        for item in items:
            marker = item.get_closest_marker("mpi")
            if marker is None:
                serial.append(item)
                continue
            min_size = int(marker.kwargs.get("min_size", 1))
            fits = [n for n in sizes if n >= min_size]
            also = item.get_closest_marker(ALSO_AT)
            if also is not None and not config.getoption("--mpi-sizes"):  # the default matrix: and these
                fits = sorted(set(fits) | {int(n) for n in also.args if int(n) >= min_size})
            if not fits:
                self.unrunnable.append(item.nodeid)
            if fits and not full and item.get_closest_marker(LONG_RUN) is not None:
                fits = [long_run_size(fits)]
                long_runs.add(fits[0])
            for n in fits:
                by_size.setdefault(n, []).append(item)
        launchers = []
        for n, group in sorted(by_size.items()):
            files = sorted({str(item.path) for item in group})
            runs = sum(grids_at(n, full, item.get_closest_marker(LONG_RUN) is not None)
                       if "grid" in getattr(item, "fixturenames", ()) else 1 for item in group)
            launchers.append(MpiLaunch.from_parent(session, name=f"mpiexec-n{n}", nranks=n, files=files,
                                                   ntests=len(group), runs=runs, long_runs=full or n in long_runs))
        self.launchers = launchers
        items[:] = serial + launchers
        choice = config.getoption("--mpi-overlap")
        if serial and (choice == "always" or (choice == "auto" and (os.cpu_count() or 1) >= 2)):
            # the serial tests use one core and often wait (on subprocesses, timeouts): the launches run beside
            # them, one at a time, and each launch's item reports what its launch did
            self.background = list(launchers)

    def pytest_terminal_summary(self, terminalreporter):
        ran = [launcher for launcher in self.launchers if launcher.summary]
        if ran:
            terminalreporter.section("MPI launches")
            for launcher in ran:
                terminalreporter.write_line(f"{launcher.nranks} rank(s): {launcher.summary}")
        if self.unrunnable:
            terminalreporter.write_line(
                f"{len(self.unrunnable)} MPI test(s) need more ranks than --mpi-sizes offers, not run: "
                + ", ".join(self.unrunnable[:5]) + (" ..." if len(self.unrunnable) > 5 else ""))
