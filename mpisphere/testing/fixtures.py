"""The ``grid`` and ``comm`` fixtures and the grid shapes a test runs at on a number of ranks."""


import pytest

from .options import GRID_SHAPES, LONG_RUN, is_inner


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
