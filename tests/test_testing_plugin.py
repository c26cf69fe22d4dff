"""mpisphere.testing as a user meets it: a tiny project of its own, with passing, failing and hanging MPI tests.

Serial tests: each runs ``python -m pytest -p mpisphere.testing`` in a fresh
folder holding only the user's test file, as a subprocess with a timeout.
"""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from mpisphere.testing import mpiexec_command

USER_TESTS = '''
import numpy
import pytest
from mpi4py import MPI

import mpisphere


@pytest.mark.mpi
def test_a_field_round_trips_through_the_grid(grid):
    whole = numpy.arange(6 * 8, dtype=float).reshape(6, 8)
    tile = grid.scatter(whole if grid.rank == 0 else None)
    back = grid.gather(tile)
    if grid.rank == 0:
        numpy.testing.assert_array_equal(back, whole)


@pytest.mark.mpi(min_size=2)
def test_fails_on_the_last_rank_only(comm):
    assert comm.Get_rank() != comm.Get_size() - 1, "the last rank disagrees"


def test_serial():
    assert mpisphere.__version__
'''

HANGING_TEST = '''
import pytest


@pytest.mark.mpi(min_size=2)
def test_rank_0_waits_for_a_message_that_never_comes(comm):
    if comm.Get_rank() == 0:
        comm.recv(source=1, tag=7)
'''


def user_project(tmp_path, source, *args):
    """Write the user's test file; the command that runs their suite, and its environment."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-p", "mpisphere.testing", "-p", "no:cacheprovider", "--color=no",
               "--rootdir", str(tmp_path), *args]
    return command, env


def run_project(tmp_path, source, *args, timeout=300):
    command, env = user_project(tmp_path, source, *args)
    try:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the user's suite hung past {timeout} s:\n{exc.stdout}")
    return done.returncode, done.stdout + done.stderr


def test_a_user_project_runs_its_mpi_tests_on_every_grid_and_reports_a_one_rank_failure(tmp_path):
    code, out = run_project(tmp_path, USER_TESTS, "--mpi-sizes=1,2,3")
    assert code == 1, out
    assert "1 rank(s): 1 passed, 1 skipped" in out, out              # the grid test on 1x1; min_size=2 skips
    assert "2 rank(s): 1 failed, 2 passed" in out, out               # 1x2, 2x1, and the failing test
    assert "3 rank(s): 1 failed, 2 passed" in out, out
    assert "failed on rank(s) [1] of 2" in out and "the last rank disagrees" in out, out
    assert "failed on rank(s) [2] of 3" in out, out


def test_a_hanging_rank_ends_the_launch_instead_of_hanging_the_suite(tmp_path):
    code, out = run_project(tmp_path, HANGING_TEST, "--mpi-sizes=2", "--mpi-test-timeout=3",
                            "--mpi-launch-timeout=120")
    assert code == 1, out
    assert "MPI launch on 2 rank(s)" in out and "Timeout" in out, out
    # every rank's watchdog traceback, labelled with its rank (rank 0 in the receive)
    assert "---------- rank 0: per-test timeout, where it was ----------" in out, out
    assert "\x00" not in out


SLOW_TEST = '''
import time
import pytest


@pytest.mark.mpi(min_size=2)
def test_slow(comm):
    time.sleep(1.2)
'''


def test_progress_lines_name_the_launch_and_the_running_test(tmp_path, monkeypatch):
    monkeypatch.setenv("MPISPHERE_TEST_PROGRESS_SECONDS", "0.3")
    code, out = run_project(tmp_path, SLOW_TEST, "--mpi-sizes=2", "--mpi-progress=always")
    assert code == 0, out
    assert "[mpiexec -n 2]" in out and "0/1 tests done, running test_user.py::test_slow" in out, out
    code, out = run_project(tmp_path, SLOW_TEST, "--mpi-sizes=2")  # not a terminal: no progress lines
    assert code == 0 and "[mpiexec -n 2]" not in out, out


def test_launch_output_is_shown_without_nul_characters():
    from mpisphere.testing.progress import clean
    assert clean("Open MPI v4.1.4, package: Debian\x00\nnext") == "Open MPI v4.1.4, package: Debian\nnext"


def test_the_summary_and_junit_name_the_failing_test_of_a_launch(tmp_path):
    code, out = run_project(tmp_path, USER_TESTS, "--mpi-sizes=2", f"--junitxml={tmp_path / 'report.xml'}")
    assert code == 1, out
    named = ("MPI launch on 2 rank(s) exited with status 1: failed "
             "test_user.py::test_fails_on_the_last_rank_only.")
    assert named in out, out
    assert named in (tmp_path / "report.xml").read_text()


ABORTING_TESTS = '''
import pytest


@pytest.mark.mpi(min_size=2)
def test_rank_0_fails_while_the_others_wait(comm):
    if comm.Get_rank() == 0:
        raise ValueError("rank 0 alone")
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_next(comm):
    pass


@pytest.mark.mpi(min_size=2)
def test_last(comm):
    pass
'''


def test_after_an_abort_the_report_says_which_tests_did_not_run(tmp_path):
    code, out = run_project(tmp_path, ABORTING_TESTS, "--mpi-sizes=2", "--mpi-grace=2")
    assert code == 1, out
    assert ("failed test_user.py::test_rank_0_fails_while_the_others_wait; not run (2 of 3): "
            "test_user.py::test_next, test_user.py::test_last.") in out, out


SERIAL_TEST_USING_MPI = '''
from mpi4py import MPI


def test_forgot_the_marker():
    assert MPI.COMM_WORLD.Get_size() == 1


def test_after_it():
    pass
'''


def test_a_serial_test_touching_mpi_fails_by_name_instead_of_ending_the_run(tmp_path):
    code, out = run_project(tmp_path, SERIAL_TEST_USING_MPI)
    assert code == 1, out
    assert ("test_user.py::test_forgot_the_marker uses MPI.COMM_WORLD.Get_size in the outer pytest process"
            in out), out
    assert "@pytest.mark.mpi" in out and "1 failed, 1 passed" in out, out  # the run went on


LONG_RUN_TESTS = '''
import pytest


@pytest.mark.mpi
@pytest.mark.long_run
def test_long(grid):
    pass


@pytest.mark.mpi
def test_short(grid):
    pass


def test_serial():
    pass
'''


def test_the_default_matrix_is_one_launch_per_kind_of_decomposition_and_full_adds_the_rest(tmp_path):
    code, out = run_project(tmp_path, USER_TESTS, "--collect-only", "-q")
    assert code == 0 and re.findall(r"::mpiexec-n(\d+)", out) == ["1", "2", "6"], out
    code, out = run_project(tmp_path, USER_TESTS, "--collect-only", "-q", "--mpi-full")
    assert code == 0 and re.findall(r"::mpiexec-n(\d+)", out) == ["1", "2", "3", "4", "6"], out


def test_a_long_run_runs_on_one_grid_of_two_ranks_unless_the_full_matrix(tmp_path):
    """Beside a serial test (so the launches run in the background): the counts of each launch."""
    code, out = run_project(tmp_path, LONG_RUN_TESTS, "--mpi-sizes=1,2")
    assert code == 0, out
    assert re.search(r"1 rank\(s\): 1 passed", out) and re.search(r"2 rank\(s\): 3 passed", out), out  # 2x1 only
    code, out = run_project(tmp_path, LONG_RUN_TESTS, "--mpi-sizes=1,2", "--mpi-full", "--mpi-overlap=never")
    assert code == 0, out
    assert re.search(r"1 rank\(s\): 2 passed", out) and re.search(r"2 rank\(s\): 4 passed", out), out


SIX_RANK_TESTS = '''
import os

import pytest


@pytest.mark.mpi
@pytest.mark.parametrize("i", range(8))
def test_on_a_grid(grid, i):
    if grid.rank == 0:
        with open(os.path.join(os.path.dirname(__file__), "grids.txt"), "a") as seen:
            seen.write(f"{i} {grid.npolar}x{grid.nazimuth}\\n")
'''


def test_at_six_ranks_each_test_runs_on_one_of_the_two_grids_and_both_grids_are_used(tmp_path):
    code, out = run_project(tmp_path, SIX_RANK_TESTS, "--mpi-sizes=6")
    assert code == 0 and re.search(r"6 rank\(s\): 8 passed", out), out
    seen = (tmp_path / "grids.txt").read_text().split()
    grids = dict(zip(seen[::2], seen[1::2]))
    assert len(grids) == 8 and set(grids.values()) == {"2x3", "3x2"}, seen
    # (--mpi-full reaching the inner run, where both grids would run: the long-run test above shows it)


TEMPORARY_PATH_TESTS = '''
import os

import pytest


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("i", range(6))
def test_each_rank_makes_and_removes_temporary_paths_in_a_root_of_its_own(comm, tmp_path, tmp_path_factory, i):
    root = tmp_path_factory.getbasetemp()
    roots = comm.allgather(str(root))
    assert len(set(roots)) == comm.Get_size() and root.name == f"rank-{comm.Get_rank()}", roots
    assert tmp_path.is_relative_to(root)
    made = tmp_path_factory.mktemp("scratch")
    (made / "mine.txt").write_text(str(comm.Get_rank()))
    (tmp_path / "mine.txt").write_text(str(comm.Get_rank()))
    os.remove(made / "mine.txt")
    os.rmdir(made)
    if comm.Get_rank() == 0:
        with open(os.path.join(os.path.dirname(__file__), "roots.txt"), "a") as seen:
            seen.write(os.path.dirname(root) + "\\n")
'''


def test_every_rank_has_a_temporary_root_of_its_own(tmp_path):
    """The ranks are separate pytest sessions: in one root they raced over its numbered folders and links."""
    base = tmp_path / "base"
    code, out = run_project(tmp_path, TEMPORARY_PATH_TESTS, "--mpi-sizes=3", f"--basetemp={base}")
    assert code == 0 and re.search(r"3 rank\(s\): 6 passed", out), out
    assert sorted(p.name for p in (base / "mpiexec-n3").iterdir()) == [f"rank-{r}" for r in range(3)]
    # run by hand under mpiexec (no outer run): a folder of rank 0's for the ranks, removed when all passed
    launched = subprocess.run(
        [*mpiexec_command(), "-n", "2", sys.executable, "-m", "pytest", "-p", "mpisphere.testing", "--with-mpi",
         "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), "test_user.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    parent = (tmp_path / "roots.txt").read_text().split()[-1]
    assert os.path.basename(parent).startswith("pytest-mpi-") and not os.path.exists(parent), parent


FAILING_CLEAN_UP = '''
import os


def pytest_sessionfinish(session):
    if os.environ.get("MPISPHERE_TEST_NRANKS"):  # a rank of a launch, not the outer run
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == MPI.COMM_WORLD.Get_size() - 1:
            raise FileNotFoundError("the clean-up lost its file")
'''


def test_a_launch_that_fails_after_its_tests_passed_says_so_first(tmp_path):
    (tmp_path / "conftest.py").write_text(FAILING_CLEAN_UP)
    code, out = run_project(tmp_path, SLOW_TEST.replace("time.sleep(1.2)", "pass"), "--mpi-sizes=2")
    assert code == 1, out
    first = next(line for line in out.splitlines() if "MPI launch on 2 rank(s)" in line)
    assert re.search(r"MPI launch on 2 rank\(s\) exited with status \d+ after all its tests passed \(1\): the "
                     r"failure is outside the tests, in a rank's pytest session: rank 1: FileNotFoundError: the "
                     r"clean-up lost its file\.", first), out


def run_in_a_terminal(tmp_path, source, *args, timeout=300):
    """``run_project`` with stdin, stdout and stderr on a pseudo-terminal, as a user at a terminal runs it."""
    import pty
    import select
    command, env = user_project(tmp_path, source, *args)
    env["TERM"] = "xterm"
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdin=terminal, stdout=terminal, stderr=terminal,
                            close_fds=True)
    os.close(terminal)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    data = os.read(controller, 65536)
                except OSError:  # the terminal closed: the run ended
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            pytest.fail(f"the run in a terminal hung past {timeout} s:\n{b''.join(chunks).decode(errors='replace')}")
    finally:
        os.close(controller)
        proc.wait()
    return proc.returncode, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def test_progress_lines_come_by_default_on_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setenv("MPISPHERE_TEST_PROGRESS_SECONDS", "0.3")
    code, out = run_in_a_terminal(tmp_path, SLOW_TEST, "--mpi-sizes=2")
    assert code == 0, out
    assert "[mpiexec -n 2]" in out and "0/1 tests done, running test_user.py::test_slow" in out, out


def test_the_launch_timeout_scales_with_the_tests_and_the_ranks_per_core():
    from mpisphere.testing.options import (LAUNCH_FLOOR, LAUNCH_SETUP, SECONDS_PER_TEST, grids_at,
                                           launch_timeout, launch_timeout_choice)
    assert launch_timeout("auto", 10, 2, 2) == LAUNCH_FLOOR              # a small launch: the floor
    big = launch_timeout("auto", 2000, 2, 2)
    assert big == LAUNCH_SETUP + 2000 * SECONDS_PER_TEST > LAUNCH_FLOOR
    assert launch_timeout("auto", 2000, 6, 2) == LAUNCH_SETUP + 2000 * SECONDS_PER_TEST * 3  # 3 ranks a core
    assert launch_timeout("auto", 2000, 6, 8) == big                     # enough cores: no share
    assert launch_timeout(120.0, 2000, 6, 2) == 120.0                    # given seconds are kept
    assert launch_timeout_choice("auto") == "auto" and launch_timeout_choice("75") == 75.0
    for bad in ("soon", "0", "-3"):
        with pytest.raises(pytest.UsageError, match="--mpi-launch-timeout must be"):
            launch_timeout_choice(bad)
    # each test counts once per grid it runs on: 1x2 and 2x1 at two ranks, one of 2x3 and 3x2 at six
    assert [grids_at(n, False, False) for n in (1, 2, 3, 4, 6)] == [1, 2, 2, 1, 1]
    assert [grids_at(n, True, False) for n in (1, 2, 3, 4, 6)] == [1, 2, 2, 1, 2]
    assert grids_at(2, False, True) == 1 and grids_at(2, True, True) == 2


ENDLESS_TEST = '''
import time
import pytest


@pytest.mark.mpi(min_size=2)
def test_endless(comm):
    time.sleep(600)
'''


def test_a_launch_that_nears_its_timeout_says_so_before_it_is_killed(tmp_path):
    code, out = run_project(tmp_path, ENDLESS_TEST, "--mpi-sizes=2", "--mpi-test-timeout=300",
                            "--mpi-launch-timeout=6")
    assert code == 1, out
    # where the launch is when it says so depends on the machine's speed (the ranks may still be collecting)
    said = re.search(r"\[mpiexec -n 2\] \d+ s of its 6 s launch timeout \(--mpi-launch-timeout\): 0/[1?] tests "
                     r"done", out)
    killed = out.find("killed after the launch timeout of 6 s")
    assert said and 0 <= said.start() < killed, out
