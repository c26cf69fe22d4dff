"""ProcessGrid on every grid of the harness: layout, neighbours, tiles, scatter/gather, bad input."""

import numpy
import pytest
from mpi4py import MPI

from mpisphere import ProcessGrid, split_sizes

from helpers import raises

pytestmark = pytest.mark.mpi


def test_layout_is_row_major(grid):
    world = MPI.COMM_WORLD
    assert grid.size == world.Get_size() == grid.npolar * grid.nazimuth
    assert grid.rank == world.Get_rank()
    assert (grid.polar_rank, grid.azimuth_rank) == divmod(grid.rank, grid.nazimuth)
    assert grid.cart.Get_coords(grid.rank) == [grid.polar_rank, grid.azimuth_rank]
    assert grid.cart.Get_topo()[1] == [False, True]  # polar open, azimuth periodic
    assert grid.polar.Get_size() == grid.npolar and grid.azimuth.Get_size() == grid.nazimuth
    # the polar communicator is this rank's column, the azimuth one its row
    assert grid.polar.allgather(grid.rank) == [p * grid.nazimuth + grid.azimuth_rank for p in range(grid.npolar)]
    assert grid.azimuth.allgather(grid.rank) == [grid.polar_rank * grid.nazimuth + a for a in range(grid.nazimuth)]


def test_neighbours(grid):
    north, south = grid.polar_neighbors
    assert north == (MPI.PROC_NULL if grid.polar_rank == 0 else grid.polar_rank - 1)
    assert south == (MPI.PROC_NULL if grid.polar_rank == grid.npolar - 1 else grid.polar_rank + 1)
    west, east = grid.azimuth_neighbors
    assert west == (grid.azimuth_rank - 1) % grid.nazimuth
    assert east == (grid.azimuth_rank + 1) % grid.nazimuth
    # agrees with MPI's own view of the Cartesian topology
    row = grid.polar_rank * grid.nazimuth
    assert tuple(grid.cart.Shift(1, 1)) == (row + west, row + east)
    src, dst = grid.cart.Shift(0, 1)
    assert (src == MPI.PROC_NULL) == (north == MPI.PROC_NULL)
    assert (dst == MPI.PROC_NULL) == (south == MPI.PROC_NULL)


@pytest.mark.parametrize("nlat, nlon", [(7, 10), (361, 720), (6, 6), (13, 3)])
def test_tiles_cover_the_field(grid, nlat, nlon):
    lat_sizes, lon_sizes = split_sizes(nlat, grid.npolar), split_sizes(nlon, grid.nazimuth)
    h, w = grid.local_shape(nlat, nlon)
    assert (h, w) == (lat_sizes[grid.polar_rank], lon_sizes[grid.azimuth_rank])
    cover = numpy.zeros((nlat, nlon), int)
    for r in range(grid.size):
        lat, lon = grid.tile_slices(nlat, nlon, r)
        cover[lat, lon] += 1
    assert (cover == 1).all()
    assert grid.local_slices(nlat, nlon) == grid.tile_slices(nlat, nlon, grid.rank)


@pytest.mark.parametrize("lead", [(), (3,), (2, 2)], ids=str)
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.complex64, numpy.float16])
@pytest.mark.parametrize("root", [0, -1])
def test_scatter_gather_round_trip(grid, rng, lead, dtype, root):
    nlat, nlon = 7, 10
    root = root % grid.size
    field = rng.standard_normal(lead + (nlat, nlon)).astype(dtype)
    tile = grid.scatter(field if grid.rank == root else None, root=root)
    lat, lon = grid.local_slices(nlat, nlon)
    numpy.testing.assert_array_equal(tile, field[..., lat, lon])
    assert tile.flags.c_contiguous and tile.dtype == field.dtype
    back = grid.gather(tile, root=root)
    if grid.rank == root:
        numpy.testing.assert_array_equal(back, field)
    else:
        assert back is None


def test_scatter_accepts_non_contiguous_field(grid, rng):
    field = rng.standard_normal((10, 7, 3)).transpose(2, 1, 0)  # (3, 7, 10), Fortran-ordered view
    tile = grid.scatter(field if grid.rank == 0 else None)
    lat, lon = grid.local_slices(7, 10)
    numpy.testing.assert_array_equal(tile, field[..., lat, lon])


def test_from_fortran_round_trip(grid):
    handle = MPI.COMM_WORLD.py2f()
    with ProcessGrid.from_fortran(handle, grid.npolar, grid.nazimuth) as g:
        assert (g.npolar, g.nazimuth, g.rank) == (grid.npolar, grid.nazimuth, grid.rank)
        assert g.cart.Get_size() == MPI.COMM_WORLD.Get_size()
        field = numpy.arange(7 * 10.0).reshape(7, 10)
        back = g.gather(g.scatter(field if g.rank == 0 else None))
        if g.rank == 0:
            numpy.testing.assert_array_equal(back, field)


def test_dims_filled_in(comm):
    size = comm.Get_size()
    with ProcessGrid() as g:
        assert [g.npolar, g.nazimuth] == MPI.Compute_dims(size, 2)
    with ProcessGrid(npolar=size) as g:
        assert (g.npolar, g.nazimuth) == (size, 1)
    with ProcessGrid(nazimuth=size) as g:
        assert (g.npolar, g.nazimuth) == (1, size)


def test_free_twice_and_use_after_free(comm):
    g = ProcessGrid(comm)
    g.free()
    g.free()
    with raises(RuntimeError, match="after free"):
        g.gather(numpy.zeros((1, 1)))


def test_wrong_dims_product(comm):
    size = comm.Get_size()
    with raises(ValueError, match=rf"{size + 1} x 1 = {size + 1} ranks, but the communicator has {size}") \
            as caught:
        ProcessGrid(comm, size + 1, 1)
    # what to do next: on one rank, most likely a program started without the launcher
    fix = (f"fix: start the program under the MPI launcher, e.g. mpiexec -n {size + 1} python -m mpi4py" if size == 1
           else f"fix: launch {size + 1} ranks (mpiexec -n {size + 1}), or choose npolar x nazimuth = {size}")
    assert fix in str(caught.value), str(caught.value)


@pytest.mark.parametrize("dims", [(0, 1), (-2, 1), (1, 0)])
def test_non_positive_dim(comm, dims):
    with raises(ValueError, match=r"ProcessGrid: n(polar|azimuth) must be positive, got"):
        ProcessGrid(comm, *dims)


@pytest.mark.mpi(min_size=2)
def test_dim_that_does_not_divide(comm):
    size = comm.Get_size()
    with raises(ValueError, match=rf"npolar={size + 1} does not divide the communicator size {size}"):
        ProcessGrid(comm, npolar=size + 1)


def test_grid_finer_than_field(grid):
    if grid.npolar > 1:
        with raises(ValueError, match=rf"{grid.npolar} polar ranks cannot split {grid.npolar - 1} latitudes"):
            grid.local_shape(grid.npolar - 1, 10)
    if grid.nazimuth > 1:
        with raises(ValueError, match=rf"{grid.nazimuth} azimuth ranks cannot split 1 longitudes"):
            grid.local_shape(10, 1)
    with raises(ValueError, match="cannot split 0 latitudes"):
        grid.local_shape(0, 10)


@pytest.mark.mpi(min_size=2)
def test_scatter_of_too_small_field_fails_on_every_rank(grid):
    small = numpy.zeros((grid.npolar - 1 or 1, grid.nazimuth - 1 or 1))
    if grid.npolar == 1 and grid.nazimuth == 1:
        pytest.skip("every field fits a 1x1 grid")
    with raises(ValueError, match="cannot split"):
        grid.scatter(small if grid.rank == 0 else None)


@pytest.mark.mpi(min_size=2)
def test_gather_of_mismatched_tiles_fails_on_every_rank(grid):
    h, w = grid.local_shape(7, 10)
    tile = numpy.zeros((h + (2 if grid.rank == grid.size - 1 else 0), w))  # no split of any nlat fits
    with raises(ValueError, match="ProcessGrid.gather"):
        grid.gather(tile)
    dtype = numpy.float32 if grid.rank == 1 else numpy.float64
    with raises(ValueError, match="disagree in leading shape or dtype"):
        grid.gather(numpy.zeros((h, w), dtype))


def test_bad_communicators_and_handles(comm):
    with raises(TypeError, match="ProcessGrid: comm must be an mpi4py Intracomm, got int"):
        ProcessGrid(7)
    with raises(TypeError, match="ProcessGrid.from_fortran: handle must be an integer, got 'world'"):
        ProcessGrid.from_fortran("world")
    with raises(ValueError, match=rf"ProcessGrid.from_fortran: handle {MPI.COMM_NULL.py2f()} is MPI_COMM_NULL"):
        ProcessGrid.from_fortran(MPI.COMM_NULL.py2f())


def test_bad_ranks_and_roots(grid):
    with raises(ValueError,
                       match=rf"ProcessGrid.tile_slices: rank {grid.size} out of range for {grid.size} ranks"):
        grid.tile_slices(7, 10, grid.size)
    with raises(ValueError, match=rf"ProcessGrid.scatter: ranks? .*of {grid.size}: root {grid.size} out of "
                                         rf"range for {grid.size} ranks"):
        grid.scatter(None, root=grid.size)
    with raises(ValueError, match=rf"ProcessGrid.scatter: rank 0 of {grid.size}: root 0 must pass an array with "
                                         "at least 2 axes"):
        grid.scatter(numpy.zeros(3) if grid.rank == 0 else None)


@pytest.mark.mpi(min_size=2)
def test_gather_of_a_missing_tile_fails_on_every_rank(grid):
    h, w = grid.local_shape(7, 10)
    tile = numpy.zeros(3) if grid.rank == 1 else numpy.zeros((h, w))
    with raises(ValueError, match=rf"ProcessGrid.gather: rank 1 of {grid.size}: expected this rank's tile, an "
                                         r"array with at least 2 axes, got ndarray \(3,\)"):
        grid.gather(tile)


# --- issue 11: agreement, launching, threads, lifetime, messages -------------------------------------

def test_a_second_thread_uses_its_own_grid(grid, rng):
    """grid.dup(): a grid on duplicated communicators, usable from another thread at the same time."""
    import threading
    from mpisphere import GatherFrom
    twin = grid.dup()
    assert (twin.npolar, twin.nazimuth, twin.rank) == (grid.npolar, grid.nazimuth, grid.rank)
    nlat = 7 * grid.size
    field = rng.standard_normal((3, nlat))
    h = split_sizes(nlat, grid.size)[grid.rank]
    start = sum(split_sizes(nlat, grid.size)[:grid.rank])
    x = field[:, start:start + h]
    results = {}

    def other():
        results["twin"] = GatherFrom(twin.cart, -1, nlat).forward(x)

    thread = threading.Thread(target=other, name="other")
    thread.start()
    results["main"] = GatherFrom(grid.cart, -1, nlat).forward(x)
    thread.join(60)
    numpy.testing.assert_array_equal(results["main"], field)
    numpy.testing.assert_array_equal(results["twin"], field)
    twin.free()


def test_a_grid_dropped_without_free_warns(comm):
    import gc
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ProcessGrid(comm)  # never freed
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "was never freed: call grid.free()" in str(w.message)
               for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ProcessGrid(comm):
            pass
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_operators_on_a_freed_grid_raise(comm):
    from mpisphere import DistributedRealSHT, GatherFrom, HaloExchange
    g = ProcessGrid(comm)
    ops = [GatherFrom(g.cart, 0, g.size), HaloExchange(g, 1, 1)]
    g.free()
    for op in ops:
        with raises(RuntimeError, match="freed"):
            op.forward(numpy.zeros((g.size, 3)))
    with raises(RuntimeError, match=r"DistributedRealSHT: the grid was freed \(grid.free\(\)\)"):
        DistributedRealSHT(g, 9, 16)
    with raises(RuntimeError, match=r"ProcessGrid: used after free\(\)"):
        g.scatter(None)


@pytest.mark.mpi(min_size=2)
def test_polar_fastest_rank_order(comm):
    """A model numbering its ranks latitude-fastest: rank r of comm holds polar index r % npolar."""
    size = comm.Get_size()
    npolar = 2 if size % 2 == 0 else size
    with ProcessGrid(comm, npolar=npolar, order="polar-fastest") as g:
        r = comm.Get_rank()
        assert (g.polar_rank, g.azimuth_rank) == (r % npolar, r // npolar)
        assert g.comm_rank == r and g.rank == g.polar_rank * g.nazimuth + g.azimuth_rank
        nlat, nlon = 9, 12
        lat, lon = g.local_slices(nlat, nlon)
        g.check_tile(nlat, nlon, lat, (lon.start, lon.stop))
        field = numpy.arange(nlat * nlon, dtype=float).reshape(nlat, nlon)
        back = g.gather(g.scatter(field if g.rank == 0 else None))
        if g.rank == 0:
            numpy.testing.assert_array_equal(back, field)


@pytest.mark.mpi(min_size=2)
def test_check_tile_finds_a_model_numbered_the_other_way(comm):
    size = comm.Get_size()
    npolar = 2 if size % 2 == 0 else size
    if npolar == size:
        pytest.skip("needs a grid with both axes split")
    nlat, nlon = 9, 12
    with ProcessGrid(comm, npolar=npolar, order="polar-fastest") as model, ProcessGrid(comm, npolar=npolar) as g:
        lat, lon = model.local_slices(nlat, nlon)  # the model's tile, by its own numbering
        with raises(ValueError, match=r"ProcessGrid.check_tile: the model's tiles of the 9 x 12 field differ "
                                             r"from mpisphere's on \d+ of \d+ ranks: rank \d+ holds latitudes .*"
                                             r"build the grid with order='polar-fastest'"):
            g.check_tile(nlat, nlon, lat, lon)


@pytest.mark.mpi(min_size=2)
def test_scatter_of_an_unsupported_dtype_fails_the_same_on_every_rank(grid):
    bfloat16_like = numpy.zeros((4, 6), dtype=numpy.dtype((numpy.void, 2)))
    with raises(TypeError, match=rf"^ProcessGrid.scatter: rank 0 of {grid.size}: root 0's field: unsupported "
                                        "dtype void16"):
        grid.scatter(bfloat16_like if grid.rank == 0 else None)
    with raises(ValueError, match=rf"^ProcessGrid.scatter: rank 0 of {grid.size}: root 0 must pass an array "
                                         "with at least 2 axes"):
        grid.scatter(numpy.zeros(3) if grid.rank == 0 else None)


@pytest.mark.mpi(min_size=2)
def test_gather_names_the_tiles_that_do_not_fit(grid):
    if grid.nazimuth < 2:
        pytest.skip("needs two azimuth ranks")
    h, w = grid.local_shape(7, 10)
    tile = numpy.zeros((h, w + (2 if grid.rank == 1 else 0)))  # rank 1's tile is two columns too wide
    with raises(ValueError, match=r"ProcessGrid.gather: the tiles do not fit together as one field: .*"
                                         r"\(tiles: rank 0: \(\d+, \d+\), rank 1: \(\d+, \d+\)"):
        grid.gather(tile)
