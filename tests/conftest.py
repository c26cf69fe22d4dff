"""Test configuration: the MPI harness (see _harness.py) and shared fixtures.

``python -m pytest`` runs the serial tests here and every ``mpi``-marked test
under ``mpiexec`` at 1, 2, 3, 4 and 6 ranks. A test that takes the ``grid``
fixture runs once per process-grid shape that fits the launch:

====== =============
ranks  grids
====== =============
1      1x1
2      1x2, 2x1
3      1x3, 3x1
4      2x2
6      2x3, 3x2
====== =============
"""

import os

import numpy
import pytest

import _harness

GRID_SHAPES = {1: [(1, 1)], 2: [(1, 2), (2, 1)], 3: [(1, 3), (3, 1)], 4: [(2, 2)], 6: [(2, 3), (3, 2)]}

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def pytest_addoption(parser):
    _harness.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CuPy and a CUDA device")
    if _harness.is_inner(config):
        config.pluginmanager.register(_harness.InnerPlugin(config), "mpisphere-inner")
    else:
        # The outer process only launches mpiexec: importing mpi4py.MPI must not start
        # MPI here (a singleton MPI in the parent can make Open MPI refuse a nested launch).
        import mpi4py
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        config.pluginmanager.register(_harness.OuterPlugin(config), "mpisphere-outer")


def world_size(config):
    if not _harness.is_inner(config):
        return 1
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_size()


def grid_shapes(size):
    if size in GRID_SHAPES:
        return GRID_SHAPES[size]
    from mpi4py import MPI
    return [tuple(MPI.Compute_dims(size, 2))]


def pytest_generate_tests(metafunc):
    if "grid" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("mpi") is None:
            raise pytest.UsageError(f"{metafunc.definition.nodeid} takes the grid fixture but is not marked mpi")
        shapes = grid_shapes(world_size(metafunc.config))
        metafunc.parametrize("grid", shapes, ids=[f"{p}x{a}" for p, a in shapes], indirect=True)


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
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture
def rng():
    """Random numbers identical on every rank (each test draws the same sequence everywhere)."""
    return numpy.random.default_rng(20261202)
