"""``python -m mpisphere``: its help reads as plain text and ``diagnose`` reports what this machine has.

Each command runs in a child process under ``mpiexec -n 1`` with a timeout
(the outer pytest process never starts MPI).
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from mpisphere.testing import mpiexec_command


def run(*args, launcher=True):
    command = (mpiexec_command() + ["-n", "1"] if launcher else []) + [sys.executable, "-m", "mpisphere", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_help_is_plain_text():
    done = run("--help", launcher=False)
    assert done.returncode == 0, done.stderr
    assert "python -m mpisphere diagnose" in done.stdout and "``" not in done.stdout, done.stdout


def test_diagnose_reports_the_library_and_says_when_there_is_no_gpu():
    if mpiexec_command() is None:
        pytest.fail("no mpiexec found: install an MPI runtime (pip install '.[mpich]' in the mpisphere clone)")
    done = run("diagnose")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MPI library:" in done.stdout and "CUDA-aware MPI:" in done.stdout, done.stdout
    if importlib.util.find_spec("cupy") is None:
        assert "CuPy: not installed" in done.stdout
        assert "device buffers: none on this machine (no GPU visible)" in done.stdout, done.stdout
        assert "path for device buffers" not in done.stdout


def test_calibrate_writes_a_model_that_a_transform_loads(tmp_path):
    """The fit finds its two kinds of kernel (a table product, a strategy holding no tables) from what the
    strategy records say, and writes positive finite rates that a transform then reads."""
    path = tmp_path / "machine.json"
    done = run("calibrate", "--repeats", "1", "--out", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    rates = {k: v for k, v in json.loads(path.read_text()).items() if k.endswith(("_rate", "_bandwidth"))}
    assert len(rates) == 12 and all(math.isfinite(v) and v > 0 for v in rates.values()), rates
    check = ("import os, mpisphere as ms; from mpi4py import MPI; g = ms.ProcessGrid(MPI.COMM_WORLD); "
             "print(ms.DistributedRealSHT(g, 17, 32).machine.source)")
    loaded = subprocess.run(mpiexec_command() + ["-n", "1", sys.executable, "-c", check], capture_output=True,
                            text=True, timeout=300, env=dict(os.environ, MPISPHERE_MACHINE_MODEL=str(path)))
    assert loaded.returncode == 0 and loaded.stdout.strip() == str(path), loaded.stdout + loaded.stderr
