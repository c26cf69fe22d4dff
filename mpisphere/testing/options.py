"""The plugin's options and markers: rank counts, grid shapes, the role (outer or inner) a run plays."""

import os

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
    group.addoption("--mpi-launch-timeout", type=launch_timeout_choice,
                    default=launch_timeout_choice(os.environ.get("MPISPHERE_TEST_LAUNCH_TIMEOUT", "auto")),
                    help="seconds one mpiexec launch may take before it is killed, or 'auto' (the default): "
                         f"{LAUNCH_FLOOR:g} s or, for a launch that holds more, {LAUNCH_SETUP:g} s plus "
                         f"{SECONDS_PER_TEST:g} s per test and grid, times the ranks per core when they outnumber the "
                         "cores; a launch that has used 80%% of it says so (env MPISPHERE_TEST_LAUNCH_TIMEOUT)")
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


LAUNCH_FLOOR = 900.0      # seconds: the least an 'auto' launch timeout gives any launch
LAUNCH_SETUP = 60.0       # seconds: a launch's start (MPI, imports, collection) before its first test
# seconds one test on one grid may take on a core of its own, on average over a launch: measured 0.05-0.13 s on two
# idle cores (0.054 s a test at 2 ranks, 0.127 s at 6 ranks, 2026-12-07) and about 6 times that at a load of 7-11
SECONDS_PER_TEST = 1.0
WARN_AT = 0.8             # the share of its timeout after which a launch says it nears it


def launch_timeout_choice(text):
    """``--mpi-launch-timeout``: ``"auto"`` or positive seconds."""
    text = str(text).strip()
    if text == "auto":
        return text
    try:
        seconds = float(text)
    except ValueError:
        raise pytest.UsageError(f"--mpi-launch-timeout must be 'auto' or seconds, got {text!r}") from None
    if not seconds > 0:
        raise pytest.UsageError(f"--mpi-launch-timeout must be positive, got {text!r}")
    return seconds


def launch_timeout(choice, ntests, nranks, cores):
    """The seconds a launch of ``ntests`` tests (each test once per grid it runs on) on ``nranks`` ranks may take.

    ``choice``: ``--mpi-launch-timeout`` (seconds, taken as they are, or ``"auto"``). ``auto`` scales with
    what the launch holds: ``LAUNCH_SETUP + ntests * SECONDS_PER_TEST``, times ``nranks / cores`` where the
    ranks outnumber the cores (oversubscribed ranks share them), and never less than ``LAUNCH_FLOOR``.
    """
    if choice != "auto":
        return float(choice)
    share = max(1.0, nranks / max(1, cores))
    return max(LAUNCH_FLOOR, LAUNCH_SETUP + ntests * SECONDS_PER_TEST * share)


def usable_cores():
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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


def grids_at(nranks, full, long_run):
    """On how many process grids a test that takes the ``grid`` fixture runs in a launch of ``nranks`` ranks."""
    shapes = GRID_SHAPES.get(nranks, [None])
    if long_run and not full:
        return 1
    if not full and len(shapes) == 2 and min(shapes[0]) >= 2:  # 2x3 and 3x2: each test on one of them
        return 1
    return len(shapes)


def long_run_size(fits):
    """The one rank count a ``long_run`` test runs at outside the full matrix: the smallest above 1 it fits."""
    return next((n for n in fits if n > 1), fits[0])
