"""Test configuration: mpisphere's own pytest plugin (mpisphere.testing) and the shared fixtures.

``python -m pytest`` runs the serial tests here and every ``mpi``-marked test
under ``mpiexec`` at 1, 2 and 6 ranks (``--mpi-full``: 1, 2, 3, 4 and 6; see
the package mpisphere/testing, which users enable the same way for their own suites).
"""

import os

import numpy
import pytest

pytest_plugins = ["mpisphere.testing"]

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CuPy and a CUDA device")


@pytest.fixture
def rng():
    """Random numbers identical on every rank (each test draws the same sequence everywhere)."""
    return numpy.random.default_rng(20261202)
