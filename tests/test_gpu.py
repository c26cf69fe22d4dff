"""Every operator on CuPy arrays, through CUDA-aware MPI and through host staging.

Runs when CuPy and a CUDA device are usable on every rank (decided
collectively, so no rank skips alone); otherwise every test is skipped with
the reason. Results are compared with the NumPy path, which the other test
modules check against serial references.
"""

import numpy
import pytest
from mpi4py import MPI

from mpisphere import CopyTo, HaloExchange, Transpose, config, cuda_aware, dottest, select_device

from catalogue import host_only, operators
from helpers import random_array, rank_rng

pytestmark = [pytest.mark.mpi, pytest.mark.gpu]


@pytest.fixture(scope="module")
def cupy():
    comm = MPI.COMM_WORLD
    reason = None
    try:
        import cupy as module
        if module.cuda.runtime.getDeviceCount() < 1:
            reason = "no CUDA device visible"
    except ImportError:
        reason = "CuPy is not installed (pip install '.[cuda12]' in the mpisphere clone)"
    except Exception as exc:  # CUDARuntimeError without a driver, ...
        reason = f"CuPy cannot use a GPU here: {type(exc).__name__}: {exc}"
    everyone = comm.allgather(reason)
    if any(everyone):
        pytest.skip(next(r for r in everyone if r))
    select_device(comm)
    return module


@pytest.fixture(params=["cuda-aware", "staging"])
def path(request, grid):
    if request.param == "cuda-aware":
        aware, source = cuda_aware.decide(grid.cart)
        if not aware:
            pytest.skip(f"the MPI library is not CUDA-aware ({source})")
        with config.override(cuda_aware=True):
            yield request.param
    else:
        with config.override(cuda_aware=False):
            yield request.param


def test_every_operator_matches_numpy(cupy, grid, path):
    for op, x in operators(grid):
        if host_only(op):  # refuses device arrays with a clear error instead
            with pytest.raises(ValueError, match="on the host"):
                op.forward(cupy.asarray(x))
            continue
        expected = op.forward(x)
        expected_back = op.adjoint(expected)
        got = op.forward(cupy.asarray(x))
        assert isinstance(got, cupy.ndarray) and got.device.id == cupy.cuda.Device().id, op.name
        back = op.adjoint(got)
        tol = 1e-12 if "SHT" in op.name else 0
        scale = float(abs(expected).max()) or 1.0
        numpy.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=0, atol=tol * scale, err_msg=op.name)
        numpy.testing.assert_allclose(cupy.asnumpy(back), expected_back, rtol=0,
                                      atol=tol * (float(abs(expected_back).max()) or 1.0), err_msg=op.name)


def test_dottests_on_device(cupy, grid, path):
    local = rank_rng(grid.cart, seed=5)
    for op, x in operators(grid):
        if "replicated" in (op.domain.kind, op.range.kind) or x.dtype in (numpy.float16, numpy.float32) \
                or host_only(op):
            continue
        y = op.forward(x)
        xx = cupy.asarray(random_array(local, x.shape, x.dtype))
        yy = cupy.asarray(random_array(local, y.shape, y.dtype))
        assert dottest(op, xx, yy, rtol=1e-12) <= 1e-12, op.name


def test_update_and_accumulate_in_place_on_device(cupy, grid, path):
    op = HaloExchange(grid, 1, 2, extents=(13, 10))
    h, w = grid.local_shape(13, 10)
    host = rank_rng(grid.cart).standard_normal((2, h + 2, w + 4))
    device = cupy.asarray(host)
    assert op.update(device) is device
    numpy.testing.assert_array_equal(cupy.asnumpy(device), op.update(host.copy()))
    numpy.testing.assert_array_equal(cupy.asnumpy(op.accumulate(device)), op.accumulate(op.update(host.copy())))


def test_work_queued_on_a_side_stream_is_seen_by_mpi(cupy, grid, path):
    """The producer's stream is synchronised before MPI reads a buffer."""
    op = Transpose(grid.azimuth, axes=(0, 2), extents=(64, 10))
    h, w = grid.local_shape(13, 10)
    with cupy.cuda.Stream(non_blocking=True):
        x = cupy.full((64, h, w), float(grid.rank))
        for _ in range(20):  # a queue of kernels still running when MPI is called
            x = x * 1.0 + 0.0
        y = op.forward(x)
    expected = op.forward(numpy.full((64, h, w), float(grid.rank)))
    numpy.testing.assert_array_equal(cupy.asnumpy(y), expected)


def test_mixing_host_and_device_arrays(cupy, grid, path):
    op = CopyTo(grid.polar)
    with pytest.raises(TypeError, match="cannot mix host and device arrays"):
        op.forward(cupy.zeros(3), out=numpy.zeros(3))
