"""Restarting the shallow-water model from a checkpoint: bit-identical on its grid, equal to rounding on others.

Also the crash that matters: a rank killed while a checkpoint is written
(a serial test launching ``mpiexec`` twice, with a timeout each) leaves
the previous checkpoint current and readable.
"""

import os
import subprocess
import sys
import textwrap

import numpy
import pytest

from mpisphere.examples import AdamsBashforthHistory, LeapfrogHistory, ShallowWaterSolver
from mpisphere.testing import mpiexec_command

pytest.importorskip("zarr")  # the io extra (Python 3.11 and newer)

from helpers import raises, sub_grids  # noqa: E402

NLAT, NLON, DT = 32, 64, 400.0


def model(grid, orders="contiguous"):
    return ShallowWaterSolver(grid, NLAT, NLON, dt=DT, quadrature="legendre-gauss", orders=orders)


@pytest.mark.mpi
def test_a_restarted_run_continues_the_uninterrupted_one(grid, tmp_path):
    shared = grid.cart.bcast(str(tmp_path), root=0)
    swe = model(grid)
    start = swe.galewsky_initial_condition()
    uninterrupted = swe.timestep(start, 6, AdamsBashforthHistory())
    # one call without a history is the same run (the history only carries it across calls)
    numpy.testing.assert_array_equal(swe.timestep(start, 6), uninterrupted)

    history = AdamsBashforthHistory()
    half = swe.timestep(start, 3, history)
    path = os.path.join(shared, "checkpoint")
    swe.save(path, half, history)
    state, restored = swe.load(path)
    assert restored.step == 3 and sorted(restored.tendencies) == [1, 2]
    numpy.testing.assert_array_equal(swe.timestep(state, 3, restored), uninterrupted)

    reference = grid.gather(uninterrupted)
    reference = grid.cart.bcast(reference, root=0)
    for reader in sub_grids(grid.cart):
        if reader is None:
            continue
        other = model(reader, orders="balanced")
        state, restored = other.load(path)
        got = other.sht.gather_coefficients(other.timestep(state, 3, restored))
        if reader.rank == 0:
            for field, g, w in zip(("geopotential", "vorticity", "divergence"), got, reference):
                assert abs(g - w).max() <= 1e-10 * abs(w).max(), (field, reader)


@pytest.mark.mpi
def test_a_semi_implicit_run_restarts_bit_identically(grid, tmp_path):
    shared = grid.cart.bcast(str(tmp_path), root=0)
    swe = ShallowWaterSolver(grid, NLAT, NLON, dt=5 * DT, quadrature="legendre-gauss", scheme="semi-implicit",
                             orography="williamson5", reference_depth=6000.0)
    start = swe.williamson5_initial_condition()
    uninterrupted = swe.timestep(start, 6, swe.new_history())
    numpy.testing.assert_array_equal(swe.timestep(start, 6), uninterrupted)

    history = swe.new_history()
    half = swe.timestep(start, 3, history)
    path = os.path.join(shared, "checkpoint")
    swe.save(path, half, history)
    state, restored = swe.load(path)
    # the leapfrog's filtered previous state travels with the checkpoint
    assert isinstance(restored, LeapfrogHistory) and restored.step == 3
    numpy.testing.assert_array_equal(restored.previous, history.previous)
    numpy.testing.assert_array_equal(swe.timestep(state, 3, restored), uninterrupted)

    # a history of the other scheme on the last rank only: every rank raises, nothing is written
    wrong = AdamsBashforthHistory() if grid.rank == grid.size - 1 else history
    other = os.path.join(shared, "not-written")
    with raises(TypeError, match=f"of {grid.size}: history must be a LeapfrogHistory for the "
                                         "semi-implicit scheme"):
        swe.save(other, half, wrong)
    assert not os.path.exists(other)


@pytest.mark.mpi
def test_a_checkpoint_of_another_model_is_refused_on_every_rank(grid, tmp_path):
    shared = grid.cart.bcast(str(tmp_path), root=0)
    swe = model(grid)
    path = os.path.join(shared, "checkpoint")
    swe.save(path, swe.galewsky_initial_condition())
    other = ShallowWaterSolver(grid, NLAT, NLON, dt=300.0, quadrature="legendre-gauss")
    with raises(ValueError, match=f"of {grid.size}\\): dt 400.0 in the checkpoint, 300.0 here"):
        other.load(path)
    with raises(FileNotFoundError, match="no checkpoint"):
        swe.load(os.path.join(shared, "nowhere"))


@pytest.mark.mpi
def test_a_damaged_checkpoint_raises_on_every_rank(grid, tmp_path):
    shared = grid.cart.bcast(str(tmp_path), root=0)
    swe = model(grid)
    path = os.path.join(shared, "checkpoint")
    swe.save(path, swe.galewsky_initial_condition())
    if grid.rank == 0:
        chunk = os.path.join(path, "v000001.zarr", "state", "c", "2", "0", "0")
        data = bytearray(open(chunk, "rb").read())
        data[len(data) // 2] ^= 1
        open(chunk, "wb").write(bytes(data))
    grid.cart.Barrier()
    with raises(ValueError, match=f"of {grid.size}: cannot read 'state'.*checksum"):
        swe.load(path)


CRASH = textwrap.dedent("""
    import os, sys
    import numpy
    from mpi4py import MPI
    from mpisphere import ProcessGrid
    from mpisphere.examples import AdamsBashforthHistory, LeapfrogHistory, ShallowWaterSolver
    from mpisphere.io import FieldStore

    phase, path = sys.argv[1], sys.argv[2]
    with ProcessGrid(MPI.COMM_WORLD) as grid:
        swe = ShallowWaterSolver(grid, 32, 64, dt=400.0, quadrature="legendre-gauss")
        if phase == "write":
            history = AdamsBashforthHistory()
            state = swe.timestep(swe.galewsky_initial_condition(), 3, history)
            swe.save(path, state, history)
            whole = grid.gather(state)
            if grid.rank == 0:
                numpy.save(os.path.join(path, "saved.npy"), whole)
            state = swe.timestep(state, 2, history)
            write = FieldStore.write_coefficients

            def dying(self, name, *args, **kwargs):
                write(self, name, *args, **kwargs)
                if name == "tendency_1" and grid.rank == grid.size - 1:
                    os._exit(7)  # killed half way through the second checkpoint
            FieldStore.write_coefficients = dying
            swe.save(path, state, history)
            print("not reached")
        else:
            state, history = swe.load(path)
            whole = grid.gather(state)
            if grid.rank == 0:
                assert history.step == 3, history
                assert numpy.array_equal(whole, numpy.load(os.path.join(path, "saved.npy")))
                print("previous checkpoint intact", sorted(os.listdir(path)))
""")


def _launch(ranks, *args, cwd):
    command = mpiexec_command() + ["-n", str(ranks), sys.executable, "-c", CRASH, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the launch {args} did not end in 180 s (a hang):\n{exc.stdout}\n{exc.stderr}")


def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint(tmp_path):
    path = str(tmp_path / "checkpoint")
    crashed = _launch(2, "write", path, cwd=tmp_path)
    assert crashed.returncode != 0 and "not reached" not in crashed.stdout, crashed.stdout + crashed.stderr
    assert sorted(os.listdir(path)) == ["CURRENT", "saved.npy", "v000001.zarr", "v000002.zarr"]
    with open(os.path.join(path, "CURRENT")) as f:
        assert f.read().strip() == "v000001.zarr"
    read = _launch(3, "read", path, cwd=tmp_path)  # on another number of ranks
    assert read.returncode == 0, read.stdout + read.stderr[-3000:]
    assert "previous checkpoint intact" in read.stdout
