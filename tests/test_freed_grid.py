"""A freed grid: its shared tiles stay readable, and every call on it gives one clear error on every rank.

Serial tests: each launches a small program under ``mpiexec`` (with a
timeout), so that a crash (reading unmapped memory) fails the test instead
of ending the test run.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from mpisphere.testing import mpiexec_command

PROGRAM = textwrap.dedent("""
    import numpy
    from mpi4py import MPI
    from mpisphere import HaloExchange, ProcessGrid
    grid = ProcessGrid(MPI.COMM_WORLD, 1, MPI.COMM_WORLD.size)
    halo = HaloExchange(grid, 1, 1, extents=(8, 16))
    tile = halo.zeros(2)
    tile[...] = grid.rank + 1
    halo.update(tile)
    plain = numpy.ones(tile.shape)
    for _ in range(3):
        halo.update(plain)             # planned at the second call, replayed at the third (on a freed grid: not)
    before = float(tile.sum())
    grid.free()
    after = float(tile.sum())          # the program still holds the tile: its memory is still there
    tile[...] = 0                      # and writable
    assert after == before, (before, after)
    for call in (lambda: halo.zeros(2), lambda: halo.update(tile), lambda: halo.update(plain),
                 lambda: halo.accumulate(tile)):
        try:
            call()
        except RuntimeError as exc:
            assert "was freed" in str(exc), exc
        else:
            raise AssertionError("a call on a freed grid did not raise")
    print(f"rank {MPI.COMM_WORLD.rank}: ok")
""")


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_shared_tile_outlives_its_grid_and_calls_on_a_freed_grid_raise(ranks):
    command = mpiexec_command() + ["-n", str(ranks), sys.executable, "-c", PROGRAM]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no end within 120 s:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"rank {r}: ok" in done.stdout for r in range(ranks)), done.stdout + done.stderr


SWEEP = textwrap.dedent("""
    import numpy
    from mpi4py import MPI
    import mpisphere as ms
    from mpisphere.io import FieldStore
    grid = ms.ProcessGrid(MPI.COMM_WORLD, 1, MPI.COMM_WORLD.size)
    nlat, nlon = 16, 32
    sht = ms.DistributedRealSHT(grid, nlat, nlon)
    halo = ms.HaloExchange(grid, 1, 1, extents=(nlat, nlon))
    rings = ms.RingGeometry.octahedral(4)
    tiles = ms.RingTiles(grid, rings)
    x = numpy.zeros(grid.local_shape(nlat, nlon))
    grid.free()
    calls = {
        "scatter": lambda: grid.scatter(numpy.zeros((nlat, nlon))),
        "gather": lambda: grid.gather(x),
        "tiling": lambda: grid.tiling(nlat, nlon).gather(x),
        "check_tile": lambda: grid.check_tile(nlat, nlon, *grid.local_slices(nlat, nlon)),
        "dup": lambda: grid.dup(),
        "sht": lambda: sht.forward(x),
        "halo": lambda: halo.forward(x),
        "new sht": lambda: ms.DistributedRealSHT(grid, nlat, nlon),
        "new halo": lambda: ms.HaloExchange(grid, 1, 1, extents=(nlat, nlon)),
        "rings": lambda: tiles.scatter(numpy.zeros(rings.npoints)),
        "interpolation": lambda: ms.PointInterpolation(grid, nlat, nlon, numpy.zeros(3), numpy.zeros(3)),
        "store": lambda: FieldStore("unused-store", grid, "r"),
    }
    for name, call in calls.items():
        try:
            call()
        except RuntimeError as exc:
            assert "free" in str(exc), f"{name}: {exc}"
        else:
            raise AssertionError(f"{name} on a freed grid did not raise")
    grid.free()  # twice: nothing to do
    print(f"rank {MPI.COMM_WORLD.rank}: ok")
""")


@pytest.mark.parametrize("ranks", [1, 2])
def test_every_call_on_a_freed_grid_raises_that_it_was_freed(ranks, tmp_path):
    """Methods of the grid, operators built before, new operators, rings, interpolation, the store: each raises
    RuntimeError naming the free (the same on every rank: free() is agreed), none reaches MPI's null communicator."""
    command = mpiexec_command() + ["-n", str(ranks), sys.executable, "-c", SWEEP]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no end within 120 s:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"rank {r}: ok" in done.stdout for r in range(ranks)), done.stdout + done.stderr
