"""mpisphere's pytest plugin: MPI tests under mpiexec that never hang, for mpisphere and for your own code.

Enable it with ``-p mpisphere.testing`` on the command line, ``addopts =
"-p mpisphere.testing"`` in your pytest configuration, or ``pytest_plugins =
["mpisphere.testing"]`` in your top ``conftest.py`` (install with
``pip install '.[testing]'`` in the mpisphere clone: pytest, pytest-mpi,
pytest-timeout).
Then ``python -m pytest`` runs serial tests in-process and every test marked
``@pytest.mark.mpi`` (pytest-mpi's marker; ``min_size=`` is honoured) under
``mpiexec`` at each rank count of ``--mpi-sizes``. A test that takes the
``grid`` fixture runs once per process-grid shape that fits the launch:

====== ==================================================
ranks  grids
====== ==================================================
1      1x1
2      1x2, 2x1
3      1x3, 3x1
4      2x2
6      2x3, 3x2 (one of the two per test unless ``--mpi-full``)
other  MPI.Compute_dims
====== ==================================================

The ``comm`` fixture is ``MPI.COMM_WORLD``.

Two roles, chosen by the command line:

outer run (``python -m pytest``)
    Serial tests run in-process. Tests marked ``mpi`` are replaced by one
    launcher item per rank count (``--mpi-sizes``, default 1,2,6: one launch
    per kind of decomposition, none, one axis split, both axes split
    unevenly; ``--mpi-full``: 1,2,3,4,6): each runs ``mpiexec -n N python -m
    pytest --with-mpi ...`` once for all MPI tests that fit N ranks, under a
    hard timeout (``--mpi-launch-timeout``),
    killing the whole process group when it expires. The launcher fails when
    the launch fails, and shows what the ranks printed; the report's first
    line names the tests that failed, the one running when the launch ended
    and those that never ran (rank 0 records them in a progress file).
    The launches start one after another in the background while the
    serial tests run (``--mpi-overlap``: with at least two cores by default),
    each launch's item then waits for its launch and reports it.
    While a launch runs, a line every few seconds says which launch, how
    many of its tests are done and which one is running (``--mpi-progress``:
    on a terminal by default, ``always`` or ``never``). The launch's output
    is shown without NUL characters (Open MPI ends its version string with
    one, which made ``grep`` call a whole CI log binary).
    A test marked ``also_at(3, 4)`` also runs at those rank counts when
    ``--mpi-sizes`` is not given (the documentation's examples, written
    for the ranks they name).
    A test marked ``long_run`` (a model run of many steps whose checks do
    not depend on the decomposition, because another test compares the
    model on every grid with one rank) runs only at the smallest rank count
    above 1, on the last of its grids (2x1 at two ranks), unless
    ``--mpi-full``. Outside the full matrix, a test on a rank count with two
    grids that both split both axes (2x3 and 3x2 at six ranks) runs on one
    of them, chosen by its name, so that each grid takes about half the
    tests. Where ``PYTHONDONTWRITEBYTECODE`` is set, the launches share one
    temporary bytecode cache (``PYTHONPYCACHEPREFIX``) instead of compiling
    every module again in every rank.
    ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` are guards here: a serial test
    that touches MPI fails with a message naming it instead of ending the
    process at MPICH's first call before ``MPI_Init``.

inner run (``--with-mpi`` / ``--only-mpi``, under mpiexec)
    * ranks check they collected the same tests (CRC32 of the node ids);
    * a rank that waits in an mpisphere call another rank never made prints
      mpisphere's stall report after a quarter of ``--mpi-test-timeout``
      (at most 60 s) and aborts the job after three quarters of it
      (``MPISPHERE_STALL_REPORT`` and ``MPISPHERE_STALL_DEADLINE``, unless
      already set: :mod:`mpisphere.agreement.stall`);
    * a per-test watchdog (``faulthandler.dump_traceback_later(exit=True)``)
      ends a rank stuck past ``--mpi-test-timeout``; mpiexec then tears the
      job down. Each rank writes its traceback to a file of its own, which
      the outer run adds to the launch's report under a line naming the rank
      (run by hand, without the outer run, to the stderr the process
      started with, since pytest's capture swaps fd 2);
    * after every test phase the ranks meet on a private duplicate of
      ``COMM_WORLD``: one non-blocking maximum of a failure flag, polled with
      Test. A rank whose phase failed waits ``--mpi-grace`` seconds for the
      others; if they do not arrive (they are waiting in a collective it never
      entered) it prints its failure and calls ``Abort``. Otherwise, when a
      rank failed, the messages are gathered and a failure on any rank
      becomes a failure on every rank, with each failing
      rank's message, so the phase after a failed setup is skipped everywhere.
      Rank 0 also writes each failure to stderr at once, so that a later
      hang or abort cannot swallow it;
    * only rank 0 writes a pytest report (the others' stdout goes to
      /dev/null; their stderr stays, for crashes and aborts).
"""

import faulthandler
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy
import pytest

# one launch per kind of decomposition: none (1x1), one axis split either way with the periodic azimuth's two
# neighbours one rank (1x2, 2x1), both axes split unevenly (2x3, 3x2); the full matrix adds 1x3, 3x1 and 2x2
QUICK_SIZES = "1,2,6"
FULL_SIZES = "1,2,3,4,6"
LONG_RUN = "long_run"  # the marker of a model run whose checks do not depend on the decomposition
ALSO_AT = "also_at"    # the marker of a test that needs rank counts beyond the default ones (the docs' examples)
GRID_SHAPES = {1: [(1, 1)], 2: [(1, 2), (2, 1)], 3: [(1, 3), (3, 1)], 4: [(2, 2)], 6: [(2, 3), (3, 2)]}
PLUGIN = "mpisphere.testing"


def add_options(parser):
    group = parser.getgroup("mpisphere-mpi", "MPI launches (mpisphere test harness)")
    group.addoption("--mpi-sizes", default=os.environ.get("MPISPHERE_TEST_SIZES"),
                    help=f"comma-separated rank counts the MPI tests run at (default {QUICK_SIZES}, with --mpi-full "
                         f"{FULL_SIZES}; env MPISPHERE_TEST_SIZES)")
    group.addoption("--mpi-full", action="store_true",
                    default=os.environ.get("MPISPHERE_TEST_FULL", "") not in ("", "0"),
                    help=f"the full matrix: rank counts {FULL_SIZES} unless --mpi-sizes says otherwise, every test "
                         "on both grids of 6 ranks (default: one of them each), and tests marked long_run on every "
                         "grid of every rank count (default: one grid of the 2-rank launch; env MPISPHERE_TEST_FULL=1)")
    group.addoption("--mpi-launch-timeout", type=float,
                    default=float(os.environ.get("MPISPHERE_TEST_LAUNCH_TIMEOUT", "900")),
                    help="seconds one mpiexec launch may take before it is killed (default %(default)s)")
    group.addoption("--mpi-test-timeout", type=float,
                    default=float(os.environ.get("MPISPHERE_TEST_TIMEOUT", "180")),
                    help="seconds one MPI test may take before its ranks are ended (default %(default)s)")
    group.addoption("--mpi-grace", type=float, default=float(os.environ.get("MPISPHERE_TEST_GRACE", "20")),
                    help="seconds a failed rank waits for the others before aborting the job")
    group.addoption("--mpi-overlap", choices=("auto", "always", "never"),
                    default=os.environ.get("MPISPHERE_TEST_OVERLAP", "auto"),
                    help="run the MPI launches one after another in the background while the serial tests run "
                         "(auto: with at least 2 cores; env MPISPHERE_TEST_OVERLAP)")
    group.addoption("--mpi-progress", choices=("auto", "always", "never"),
                    default=os.environ.get("MPISPHERE_TEST_PROGRESS_LINES", "auto"),
                    help="print a line every few seconds while a launch runs: which launch, its tests done, the "
                         "one running (auto: when the output is a terminal; env MPISPHERE_TEST_PROGRESS_LINES)")


def is_inner(config):
    return bool(config.getoption("--with-mpi") or config.getoption("--only-mpi"))


def mpi_sizes(config):
    text = config.getoption("--mpi-sizes") or (FULL_SIZES if config.getoption("--mpi-full") else QUICK_SIZES)
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise pytest.UsageError(f"--mpi-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise pytest.UsageError(f"--mpi-sizes must list positive rank counts, got {text!r}")
    return sizes


def long_run_size(fits):
    """The one rank count a ``long_run`` test runs at outside the full matrix: the smallest above 1 it fits."""
    return next((n for n in fits if n > 1), fits[0])


def mpiexec_command():
    """The launcher command: ``MPISPHERE_MPIEXEC``, else the mpiexec beside Python, else PATH's."""
    override = os.environ.get("MPISPHERE_MPIEXEC")
    if override:
        return shlex.split(override)
    beside = Path(sys.executable).with_name("mpiexec")
    exe = str(beside) if beside.exists() else (shutil.which("mpiexec") or shutil.which("mpirun"))
    if exe is None:
        return None
    flags = []
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        banner = version.stdout + version.stderr
    except (OSError, subprocess.TimeoutExpired):
        banner = ""
    if "Open MPI" in banner or "OpenRTE" in banner:
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return [exe, *flags]


# --- outer run --------------------------------------------------------------

class MpiLaunchFailed(Exception):
    pass


class MpiLaunch(pytest.Item):
    """One ``mpiexec -n N python -m pytest --with-mpi`` run of the MPI tests."""

    def __init__(self, *, nranks, files, ntests, long_runs=True, **kwargs):
        super().__init__(**kwargs)
        self.nranks = nranks
        self.long_runs = long_runs  # whether this launch runs the tests marked long_run
        self.proc = self.output = self.ended = None
        self.files = files
        self.ntests = ntests
        self.summary = None
        self.add_marker("mpi")

    def _command(self):
        config = self.config
        launcher = mpiexec_command()
        if launcher is None:
            raise MpiLaunchFailed(
                "no mpiexec found: install an MPI runtime (pip install '.[mpich]' in the mpisphere clone) or set "
                "MPISPHERE_MPIEXEC to the launcher command (e.g. 'srun --mpi=pmi2' for the pip MPICH)")
        markexpr = config.option.markexpr
        cmd = [*launcher, "-n", str(self.nranks), sys.executable, "-m", "pytest", "-p", PLUGIN, "--with-mpi",
               "-q", "--no-header", "--color=no", "-p", "no:cacheprovider", "--timeout=0",
               f"--rootdir={config.rootpath}",
               f"--mpi-test-timeout={config.getoption('--mpi-test-timeout')}",
               f"--mpi-grace={config.getoption('--mpi-grace')}",
               "-m", " and ".join(["mpi"] + ([] if self.long_runs else [f"not {LONG_RUN}"])
                                  + ([f"({markexpr})"] if markexpr else []))]
        if config.getoption("--mpi-full"):
            cmd.append("--mpi-full")
        if config.option.keyword:
            cmd += ["-k", config.option.keyword]
        if config.option.verbose > 0:
            cmd.append("-v")
        return cmd + list(self.files)

    def start(self):
        """Start the launch (in the background: :meth:`runtest` waits for it); its output goes to a file."""
        if self.proc is not None:
            return
        self.cmd = cmd = self._command()
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")  # BLAS threads fight oversubscribed ranks for the cores
        env["MPISPHERE_TEST_NRANKS"] = str(self.nranks)
        env["MPISPHERE_TEST_LAUNCHER"] = cmd[0]
        # a rank that never arrives in a call: reported, then the job aborted before the per-test watchdog fires
        timeout = self.config.getoption("--mpi-test-timeout")
        env.setdefault("MPISPHERE_STALL_REPORT", f"{min(60.0, timeout / 4):g}")
        env.setdefault("MPISPHERE_STALL_DEADLINE", f"{0.75 * timeout:g}")
        env["PYTHONUNBUFFERED"] = "1"
        if env.get("PYTHONDONTWRITEBYTECODE"):
            # every rank of every launch would compile (and pytest rewrite) the same modules again: they share
            # one private bytecode cache instead, removed with the session (the checkout stays free of .pyc)
            env.pop("PYTHONDONTWRITEBYTECODE")
            env["PYTHONPYCACHEPREFIX"] = self.session_cache()
        handle, self.progress = tempfile.mkstemp(prefix="mpisphere-progress-", suffix=".txt")
        os.close(handle)
        env[PROGRESS_VARIABLE] = self.progress
        self.hangs = tempfile.mkdtemp(prefix="mpisphere-hangs-")
        env[HANGS_VARIABLE] = self.hangs
        env[BASETEMP_VARIABLE] = self.launch_temp()
        self.output = tempfile.TemporaryFile(prefix="mpisphere-launch-")  # a pipe would fill and stall the ranks
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.output, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(self.config.invocation_params.dir), start_new_session=True)

    def done(self):
        """Whether the launch has ended (``False`` before it starts); notes when it was first seen ended."""
        ended = self.proc is not None and self.proc.poll() is not None
        if ended and self.ended is None:
            self.ended = time.monotonic()
        return ended

    def stop(self):
        """End the launch if it still runs, and remove its files (the session ended before its item ran)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._clean_up()

    def _clean_up(self):
        if self.output is not None:
            self.output.close()
            os.unlink(self.progress)
            shutil.rmtree(self.hangs, ignore_errors=True)
            self.output = None

    def runtest(self):
        self.start()
        try:
            self._wait()
        finally:
            self._clean_up()

    def launch_temp(self):
        """This launch's folder under the outer run's ``basetemp``: each rank's ``tmp_path`` root is a folder in it.

        The ranks are separate pytest sessions; sharing pytest's temporary root
        they raced over its numbered folders and its ``pytest-current`` link
        (one rank's clean-up removed what another still used). Under the outer
        run's own root, pytest's retention keeps them as it keeps its own.
        """
        factory = getattr(self.config, "_tmp_path_factory", None)  # pytest's, as pytest-xdist uses it
        root = factory.getbasetemp() if factory is not None else Path(tempfile.mkdtemp(prefix="mpisphere-tmp-"))
        path = root / f"mpiexec-n{self.nranks}"
        path.mkdir(exist_ok=True)
        return str(path)

    def session_cache(self):
        """A temporary bytecode cache shared by this session's launches (created once, removed at its end)."""
        outer = self.config.pluginmanager.get_plugin("mpisphere-outer")
        if outer.bytecode is None:
            outer.bytecode = tempfile.mkdtemp(prefix="mpisphere-pycache-")
        return outer.bytecode

    def _wait(self):
        cmd, proc, start = self.cmd, self.proc, self.started
        timeout = self.config.getoption("--mpi-launch-timeout")
        shows = _shows_progress(self.config)
        try:
            while True:  # wait in slices, saying where the launch is between them (when asked, or on a terminal)
                left = timeout - (time.monotonic() - start)
                try:
                    proc.wait(timeout=max(0.0, min(left, PROGRESS_SECONDS if shows else left)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - start >= timeout:
                        raise
                    self._show_progress(time.monotonic() - start)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise MpiLaunchFailed(self._report(cmd, self._read(), f"killed after the launch timeout of {timeout:.0f} "
                                               "s (--mpi-launch-timeout)")) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        elapsed = (self.ended or time.monotonic()) - start  # ended in the background: when first seen ended
        output = self._read()
        text = output.decode(errors="replace")
        self.summary = _summary_line(text) or f"exit {proc.returncode}"
        self.summary += f" (wall {elapsed:.1f} s)"
        if proc.returncode == 5 and "no tests ran" in text:  # everything deselected at this size
            return
        if proc.returncode != 0:
            raise MpiLaunchFailed(self._report(cmd, output, f"exited with status {proc.returncode}"))

    def _read(self):
        self.output.seek(0)
        return self.output.read()

    def _show_progress(self, elapsed):
        """One line: this launch, its tests done of collected, the one running now (outside pytest's capture)."""
        done, collected, running = _progress_counts(self.progress)
        line = (f"[mpiexec -n {self.nranks}] {elapsed:5.0f} s: {done}/{collected or '?'} tests done"
                + (f", running {running}" if running else ""))
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        if capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)
        else:
            reporter.write_line(line)

    def _report(self, cmd, output, what):
        text = _clean(output.decode(errors="replace") if isinstance(output, bytes) else (output or ""))
        hint = _hang_tracebacks(self.hangs)
        if hint or "Timeout (" in text:
            hint += ("\nA rank exceeded the per-test timeout (--mpi-test-timeout); the tracebacks "
                     f"{'above' if not hint else 'of each rank'} show where it was waiting.")
        tests = _progress_report(self.progress)
        passed = _all_passed(self.progress)
        if passed and "status" in what:
            # nothing in the tests failed: say so first, and what did (a rank's pytest session after its tests)
            tests = (f" after all its tests passed ({passed}): the failure is outside the tests, in a rank's "
                     f"pytest session: {_session_failure(self.hangs, text)}.")
        return (f"MPI launch on {self.nranks} rank(s) {what}{tests}\ncommand: {shlex.join(cmd)}\n"
                f"--- output ---\n{text}{hint}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MpiLaunchFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.ntests} MPI test(s) under mpiexec -n {self.nranks}"


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _summary_line(text):
    # Open MPI gives rank 0 a terminal; a launcher that forces colour would otherwise hide the counts
    text = _ANSI_ESCAPE.sub("", text)
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|skipped|deselected|xfailed|xpassed).*? in [\d.]+s.*?)\s*=*$",
                       text, flags=re.M)
    return found[-1] if found else None


PROGRESS_VARIABLE = "MPISPHERE_TEST_PROGRESS"
HANGS_VARIABLE = "MPISPHERE_TEST_HANGS"  # a directory: each rank's per-test watchdog writes its traceback there
BASETEMP_VARIABLE = "MPISPHERE_TEST_BASETEMP"  # a directory: each rank's pytest basetemp is rank-<r> in it
SESSION_END = "session-end-rank-"  # in HANGS_VARIABLE: a rank's session that failed after its tests, and why
MEET_SPIN = 0.1  # seconds a rank polls the meeting by yielding the core before it naps between polls
MEET_MARGIN = 2.0  # seconds a rank waiting in a meeting outlives the per-test timeout of a rank stuck in the test
PROGRESS_SECONDS = float(os.environ.get("MPISPHERE_TEST_PROGRESS_SECONDS", "5"))  # at most one line this often


def _clean(text):
    """Launch output that ``grep`` reads as text: without the NUL Open MPI ends its library version with."""
    return text.replace("\x00", "")


def _shows_progress(config):
    """Whether to print progress lines during launches: ``--mpi-progress`` (``auto``: when stdout is a terminal)."""
    choice = config.getoption("--mpi-progress")
    if choice == "auto":
        # the terminal reporter's view, taken when it was made: by the time the launches run, pytest's capture has
        # replaced sys.stdout (and fd 1), which is never a terminal
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        isatty = getattr(reporter, "isatty", False)
        return bool(isatty() if callable(isatty) else isatty)
    return choice == "always"


def _progress_lines(path):
    """A launch's progress file as ``[(what, nodeid)]`` (see ``InnerPlugin._progress``); None if unreadable."""
    try:
        with open(path) as f:
            return [line.rstrip("\n").split("\t", 1) for line in f if "\t" in line]
    except OSError:
        return None


def _progress_counts(path):
    """``(tests done, tests collected, the one running)`` from a launch's progress file."""
    lines = _progress_lines(path) or []
    collected = sum(1 for what, _ in lines if what == "collected")
    done = sum(1 for what, _ in lines if what == "done")
    started = [nodeid for what, nodeid in lines if what == "start"]
    finished = {nodeid for what, nodeid in lines if what == "done"}
    running = next((n for n in reversed(started) if n not in finished), None)
    return done, collected, running


def _hang_tracebacks(directory):
    """Every rank's watchdog traceback (``HANGS_VARIABLE``), each under a line naming its rank."""
    try:
        names = sorted((n for n in os.listdir(directory) if re.fullmatch(r"rank-\d+\.txt", n)),
                       key=lambda n: int(n.split("-")[1].split(".")[0]))
    except (OSError, ValueError, IndexError):
        return ""
    parts = []
    for name in names:
        try:
            with open(os.path.join(directory, name), errors="replace") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            rank = name.split("-")[1].split(".")[0]
            parts.append(f"\n---------- rank {rank}: per-test timeout, where it was ----------\n{text}")
    return "".join(parts)


def _all_passed(path):
    """The number of a launch's tests when every one of them ran to its end without failing, else 0."""
    lines = _progress_lines(path) or []
    collected = [n for what, n in lines if what == "collected"]
    done = {n for what, n in lines if what == "done"}
    if not collected or any(what == "failed" for what, _ in lines) or any(n not in done for n in collected):
        return 0
    return len(collected)


_ERROR_LINE = re.compile(r"^(?:INTERNALERROR>\s*)?(?:E\s+)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b.*)$",
                         re.M)


def _session_failure(directory, text):
    """What failed after the tests: the ranks' own notes (``SESSION_END``), else the output's first error line."""
    notes = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(SESSION_END))
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(directory, name), errors="replace") as f:
                notes.append(f"rank {name[len(SESSION_END):].split('.')[0]}: {f.read().strip()}")
        except OSError:
            continue
    if notes:
        return "; ".join(notes)
    found = _ERROR_LINE.search(text)
    return found.group(1).strip() if found else "no error line found in the output below"


def _progress_report(path):
    """What a launch's rank 0 recorded (see ``InnerPlugin``): ``": failed A, B; running C; 12 not run: ..."``.

    The first line of a failed launch's report, so that pytest's summary
    line and a JUnit ``failure`` message name the tests, not only the launch.
    """
    lines = _progress_lines(path)
    if lines is None:
        return "."
    collected, started, finished, failed = [], set(), set(), []
    for what, nodeid in lines:
        if what == "collected":
            collected.append(nodeid)
        elif what == "start":
            started.add(nodeid)
        elif what == "done":
            finished.add(nodeid)
        elif what == "failed" and nodeid not in failed:
            failed.append(nodeid)
    if not collected:
        return " before its tests were collected."
    parts = []
    if failed:
        parts.append("failed " + ", ".join(failed))
    running = [n for n in collected if n in started and n not in finished and n not in failed]
    if running:
        parts.append("running when it ended: " + ", ".join(running))
    never = [n for n in collected if n not in started]
    if never:
        shown = ", ".join(never[:10]) + (f" and {len(never) - 10} more" if len(never) > 10 else "")
        parts.append(f"not run ({len(never)} of {len(collected)}): {shown}")
    return (": " + "; ".join(parts) + ".") if parts else "."


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
            launchers.append(MpiLaunch.from_parent(session, name=f"mpiexec-n{n}", nranks=n, files=files,
                                                   ntests=len(group), long_runs=full or n in long_runs))
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


# --- inner run ----------------------------------------------------------------

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
        start = time.monotonic()
        deadline = start + self.grace if failed else None
        extended = False  # the watchdog moved past the test's deadline (only for a wait that lasts: re-arming costs)
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline:
                self.err.write(
                    f"\n*** mpisphere test harness: rank {self.rank} of {self.size}: {nodeid} failed in "
                    f"{when}, and the other ranks did not reach the end of that phase within {self.grace:.0f} s "
                    "(they are probably waiting in a collective this rank never entered). Aborting the job.\n"
                    f"{text}\n")
                self.err.flush()
                self._progress("failed", nodeid)
                self.MPI.COMM_WORLD.Abort(1)
            # yield at first (oversubscribed ranks: the one being waited for runs; a sleep's granularity of ~1 ms
            # per poll made the meetings three times the cost of the tests at 6 ranks on 2 cores), then nap
            if time.monotonic() - start < MEET_SPIN:
                os.sched_yield()
            else:
                if rearm and not extended:
                    self._arm(MEET_MARGIN)
                    extended = True
                time.sleep(0.001)
        if extended:
            self._arm()  # back to the test's own deadline for its next phase
        return bool(flag[0])

    def _arm(self, margin=0.0):
        """(Re)start the per-test watchdog for what is left of the test's time, plus ``margin`` seconds."""
        left = max(0.1, self._deadline - time.monotonic())
        faulthandler.dump_traceback_later(left + margin, exit=True, file=self.watchdog)


# --- the plugin's hooks and fixtures ----------------------------------------------

def pytest_addoption(parser):
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if config.pluginmanager.has_plugin("mpisphere-inner") or config.pluginmanager.has_plugin("mpisphere-outer"):
        return
    config.addinivalue_line("markers", f"{LONG_RUN}: a model run of many steps whose checks do not depend on the "
                            "decomposition (another test compares every grid with one rank); it runs at one rank count "
                            "(the smallest above 1) on one grid unless --mpi-full")
    config.addinivalue_line("markers", f"{ALSO_AT}(*sizes): rank counts this test also runs at when --mpi-sizes "
                            "is not given (e.g. examples written for 4 ranks)")
    if is_inner(config):
        config.pluginmanager.register(InnerPlugin(config), "mpisphere-inner")
    else:
        # The outer process only launches mpiexec: importing mpi4py.MPI must not start
        # MPI here (a singleton MPI in the parent can make Open MPI refuse a nested launch).
        import mpi4py
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        outer = OuterPlugin(config)
        outer.guard_mpi()
        config.pluginmanager.register(outer, "mpisphere-outer")


def world_size(config):
    if not is_inner(config):
        return 1
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_size()


def grid_shapes(size):
    """The process-grid shapes the ``grid`` fixture runs at on ``size`` ranks."""
    if size in GRID_SHAPES:
        return GRID_SHAPES[size]
    from mpi4py import MPI
    return [tuple(MPI.Compute_dims(size, 2))]


def grid_id(shape):
    """``"2x3"``: the test id of the grid fixture's ``(npolar, nazimuth)``."""
    return "{}x{}".format(*shape)


def pytest_generate_tests(metafunc):
    if "grid" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("mpi") is None:
            raise pytest.UsageError(f"{metafunc.definition.nodeid} takes the grid fixture but is not marked mpi")
        shapes = grid_shapes(world_size(metafunc.config))
        full = metafunc.config.getoption("--mpi-full")
        if metafunc.definition.get_closest_marker(LONG_RUN) is not None and not full:
            shapes = shapes[-1:]  # one grid (2x1 at two ranks: the latitudes split) unless the full matrix
        metafunc.parametrize("grid", shapes, ids=[grid_id(shape) for shape in shapes], indirect=True)


@pytest.fixture
def grid(request):
    """A ProcessGrid over COMM_WORLD of the parametrised shape, freed afterwards."""
    from mpisphere import ProcessGrid
    npolar, nazimuth = request.param
    g = ProcessGrid(None, npolar, nazimuth)
    yield g
    g.free()


@pytest.fixture
def comm():
    """``MPI.COMM_WORLD``."""
    from mpi4py import MPI
    return MPI.COMM_WORLD
