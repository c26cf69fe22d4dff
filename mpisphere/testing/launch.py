"""The launcher: the ``mpiexec`` command, and the pytest item that runs one launch of a suite's MPI tests."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .options import LONG_RUN, PLUGIN, WARN_AT, launch_timeout, usable_cores
from .progress import (BASETEMP_VARIABLE, HANGS_VARIABLE, PROGRESS_SECONDS, PROGRESS_VARIABLE, all_passed, clean,
                       hang_tracebacks, progress_counts, progress_report, session_failure, shows_progress)


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


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def summary_line(text):
    # Open MPI gives rank 0 a terminal; a launcher that forces colour would otherwise hide the counts
    text = _ANSI_ESCAPE.sub("", text)
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|skipped|deselected|xfailed|xpassed).*? in [\d.]+s.*?)\s*=*$",
                       text, flags=re.M)
    return found[-1] if found else None


class MpiLaunchFailed(Exception):
    pass


class MpiLaunch(pytest.Item):
    """One ``mpiexec -n N python -m pytest --with-mpi`` run of the MPI tests."""

    def __init__(self, *, nranks, files, ntests, runs=None, long_runs=True, **kwargs):
        super().__init__(**kwargs)
        self.nranks = nranks
        self.long_runs = long_runs  # whether this launch runs the tests marked long_run
        self.proc = self.output = self.ended = None
        self.files = files
        self.ntests = ntests
        self.runs = ntests if runs is None else runs  # each test once per grid it runs on
        self.timeout = launch_timeout(self.config.getoption("--mpi-launch-timeout"), self.runs, nranks,
                                      usable_cores())
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
        cmd, proc, start, timeout = self.cmd, self.proc, self.started, self.timeout
        shows = shows_progress(self.config)
        warned = False
        try:
            while True:  # wait in slices, saying where the launch is between them (when asked, or on a terminal)
                elapsed = time.monotonic() - start
                left = timeout - elapsed
                until_warning = WARN_AT * timeout - elapsed if not warned else left
                try:
                    proc.wait(timeout=max(0.0, min(left, PROGRESS_SECONDS if shows else max(until_warning, 0.0))))
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - start
                    if elapsed >= timeout:
                        raise
                    if not warned and elapsed >= WARN_AT * timeout:
                        warned = True
                        self._write(self._nearing(elapsed))
                    if shows:
                        self._show_progress(elapsed)
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
        self.summary = summary_line(text) or f"exit {proc.returncode}"
        self.summary += f" (wall {elapsed:.1f} s)"
        if proc.returncode == 5 and "no tests ran" in text:  # everything deselected at this size
            return
        if proc.returncode != 0:
            raise MpiLaunchFailed(self._report(cmd, output, f"exited with status {proc.returncode}"))

    def _read(self):
        self.output.seek(0)
        return self.output.read()

    def _nearing(self, elapsed):
        """The line a launch writes when it has used ``WARN_AT`` of its timeout: where it is, what it may need."""
        done, collected, _ = progress_counts(self.progress)
        line = (f"[mpiexec -n {self.nranks}] {elapsed:.0f} s of its {self.timeout:.0f} s launch timeout "
                f"(--mpi-launch-timeout): {done}/{collected or '?'} tests done")
        if done and collected:
            needed = elapsed / done * collected
            line += f"; at this rate it needs about {needed:.0f} s in all"
            if needed > self.timeout:
                line += (f", past the timeout: the machine is slower or busier than the timeout allows (pass "
                         f"--mpi-launch-timeout={1.5 * needed:.0f}, or fewer ranks than "
                         f"{self.nranks} on {usable_cores()} cores)")
        return line

    def _show_progress(self, elapsed):
        """One line: this launch, its tests done of collected, the one running now (outside pytest's capture)."""
        done, collected, running = progress_counts(self.progress)
        self._write(f"[mpiexec -n {self.nranks}] {elapsed:5.0f} s: {done}/{collected or '?'} tests done"
                    + (f", running {running}" if running else ""))

    def _write(self, line):
        """A line on the terminal now, outside pytest's capture."""
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
        text = clean(output.decode(errors="replace") if isinstance(output, bytes) else (output or ""))
        hint = hang_tracebacks(self.hangs)
        if hint or "Timeout (" in text:
            hint += ("\nA rank exceeded the per-test timeout (--mpi-test-timeout); the tracebacks "
                     f"{'above' if not hint else 'of each rank'} show where it was waiting.")
        tests = progress_report(self.progress)
        passed = all_passed(self.progress)
        if passed and "status" in what:
            # nothing in the tests failed: say so first, and what did (a rank's pytest session after its tests)
            tests = (f" after all its tests passed ({passed}): the failure is outside the tests, in a rank's "
                     f"pytest session: {session_failure(self.hangs, text)}.")
        return (f"MPI launch on {self.nranks} rank(s) {what}{tests}\ncommand: {shlex.join(cmd)}\n"
                f"--- output ---\n{text}{hint}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MpiLaunchFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.ntests} MPI test(s) under mpiexec -n {self.nranks}"
