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

import pytest

from .fixtures import comm, grid, grid_id, grid_shapes, pytest_generate_tests, world_size
from .inner import InnerPlugin
from .launch import MpiLaunch, MpiLaunchFailed, mpiexec_command
from .options import (ALSO_AT, FULL_SIZES, GRID_SHAPES, LONG_RUN, PLUGIN, QUICK_SIZES, add_options, is_inner,
                      long_run_size, mpi_sizes)
from .outer import OuterPlugin

__all__ = ["mpiexec_command", "world_size", "grid_shapes", "grid_id", "grid", "comm", "add_options", "is_inner",
           "mpi_sizes", "long_run_size", "MpiLaunch", "MpiLaunchFailed", "OuterPlugin", "InnerPlugin", "QUICK_SIZES",
           "FULL_SIZES", "LONG_RUN", "ALSO_AT", "GRID_SHAPES", "PLUGIN", "pytest_addoption", "pytest_configure",
           "pytest_generate_tests"]


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
