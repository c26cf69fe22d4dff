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
