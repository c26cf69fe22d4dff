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
    before = float(tile.sum())
    grid.free()
    after = float(tile.sum())          # the program still holds the tile: its memory is still there
    tile[...] = 0                      # and writable
    assert after == before, (before, after)
    for call in (lambda: halo.zeros(2), lambda: halo.update(tile)):
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
