"""The progress protocol between a launch's rank 0 and the outer run: the files it writes, how they are read.

Rank 0 of an inner run appends a line per test phase to the file named by
``MPISPHERE_TEST_PROGRESS``; each rank's per-test watchdog writes its
traceback into the directory named by ``MPISPHERE_TEST_HANGS``. The outer
run reads both to say which tests failed, which one was running when a
launch ended, and which never ran.
"""

import os
import re


PROGRESS_VARIABLE = "MPISPHERE_TEST_PROGRESS"
HANGS_VARIABLE = "MPISPHERE_TEST_HANGS"  # a directory: each rank's per-test watchdog writes its traceback there
BASETEMP_VARIABLE = "MPISPHERE_TEST_BASETEMP"  # a directory: each rank's pytest basetemp is rank-<r> in it
SESSION_END = "session-end-rank-"  # in HANGS_VARIABLE: a rank's session that failed after its tests, and why
MEET_SPIN = 0.1  # seconds a rank polls the meeting by yielding the core before it naps between polls
MEET_MARGIN = 2.0  # seconds a rank waiting in a meeting outlives the per-test timeout of a rank stuck in the test
PROGRESS_SECONDS = float(os.environ.get("MPISPHERE_TEST_PROGRESS_SECONDS", "5"))  # at most one line this often


def clean(text):
    """Launch output that ``grep`` reads as text: without the NUL Open MPI ends its library version with."""
    return text.replace("\x00", "")


def shows_progress(config):
    """Whether to print progress lines during launches: ``--mpi-progress`` (``auto``: when stdout is a terminal)."""
    choice = config.getoption("--mpi-progress")
    if choice == "auto":
        # the terminal reporter's view, taken when it was made: by the time the launches run, pytest's capture has
        # replaced sys.stdout (and fd 1), which is never a terminal
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        isatty = getattr(reporter, "isatty", False)
        return bool(isatty() if callable(isatty) else isatty)
    return choice == "always"


def progress_lines(path):
    """A launch's progress file as ``[(what, nodeid)]`` (see ``InnerPlugin._progress``); None if unreadable."""
    try:
        with open(path) as f:
            return [line.rstrip("\n").split("\t", 1) for line in f if "\t" in line]
    except OSError:
        return None


def progress_counts(path):
    """``(tests done, tests collected, the one running)`` from a launch's progress file."""
    lines = progress_lines(path) or []
    collected = sum(1 for what, _ in lines if what == "collected")
    done = sum(1 for what, _ in lines if what == "done")
    started = [nodeid for what, nodeid in lines if what == "start"]
    finished = {nodeid for what, nodeid in lines if what == "done"}
    running = next((n for n in reversed(started) if n not in finished), None)
    return done, collected, running


def hang_tracebacks(directory):
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


def all_passed(path):
    """The number of a launch's tests when every one of them ran to its end without failing, else 0."""
    lines = progress_lines(path) or []
    collected = [n for what, n in lines if what == "collected"]
    done = {n for what, n in lines if what == "done"}
    if not collected or any(what == "failed" for what, _ in lines) or any(n not in done for n in collected):
        return 0
    return len(collected)


_ERROR_LINE = re.compile(r"^(?:INTERNALERROR>\s*)?(?:E\s+)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b.*)$",
                         re.M)


def session_failure(directory, text):
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


def progress_report(path):
    """What a launch's rank 0 recorded (see ``InnerPlugin``): ``": failed A, B; running C; 12 not run: ..."``.

    The first line of a failed launch's report, so that pytest's summary
    line and a JUnit ``failure`` message name the tests, not only the launch.
    """
    lines = progress_lines(path)
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
