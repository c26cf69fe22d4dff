"""Every operator on CuPy arrays, through CUDA-aware MPI and through host staging; streams and refusals.

Runs when CuPy and a CUDA device are usable on every rank (decided
collectively, so no rank skips alone); otherwise every test is skipped with
the reason. Results are compared with the NumPy path, which the other test
modules check against serial references, within a rounding bound that
cannot cancel (the two paths sum in different orders). Every verdict is
gathered from all ranks, so a failure on one rank fails on every rank
instead of leaving the others waiting.

``MPISPHERE_GPU_STRESS_RUNS`` (default 50) sets how often the stream stress
test repeats each case.
"""

import os

import numpy
import pytest
from mpi4py import MPI

from mpisphere import (CopyTo, DistributedInverseRealSHT, DistributedRealSHT, GatherFrom, HaloExchange, ReduceFrom,
                       Transpose, config, cuda_aware, dottest, select_device)
from mpisphere.agreement import InputError
from mpisphere.operators.dottest import inner

from catalogue import host_only, operators
from helpers import raises, random_array, rank_rng

pytestmark = [pytest.mark.mpi, pytest.mark.gpu]

STRESS_RUNS = int(os.environ.get("MPISPHERE_GPU_STRESS_RUNS", "50"))
EPSILON = {numpy.dtype(t): numpy.finfo(t).eps for t in (numpy.float16, numpy.float32, numpy.float64)}


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


def report(grid, failures):
    """Fail on every rank with every rank's failures (one list per rank), or pass on every rank."""
    everyone = grid.cart.allgather(failures)
    found = [f"rank {rank}: {text}" for rank, mine in enumerate(everyone) for text in mine]
    assert not found, f"{len(found)} failure(s):\n" + "\n".join(found)


def _real_dtype(dtype):
    return numpy.dtype(numpy.float32 if numpy.dtype(dtype) in (numpy.complex64, numpy.float32) else
                       numpy.float16 if numpy.dtype(dtype) == numpy.float16 else numpy.float64)


def rounding_bound(op, x, direction):
    """A bound on ``|A x|`` computed in two summation orders, elementwise, that cannot cancel.

    ``|fl(A x)_i - (A x)_i| <= gamma_n sum_j |a_ij| |x_j| <= gamma_n ||A||_2 ||x||_2``
    (a row's norm is at most the operator's): both paths within it, so
    their difference within twice it. ``||A||_2`` by 20 power iterations of
    ``A^H A`` on the host (a lower estimate: doubled), ``n`` the global
    number of entries of ``x`` (at least the terms of any sum).
    """
    forward, backward = (op.forward, op.adjoint) if direction == "forward" else (op.adjoint, op.forward)
    side = op.domain if direction == "forward" else op.range
    v = random_array(numpy.random.default_rng(1), x.shape, x.dtype).astype(x.dtype)
    norm = 0.0
    for _ in range(20):
        length = inner(v, v, side) ** 0.5 or 1.0
        v = (v / length).astype(x.dtype)
        w = backward(forward(v))
        norm = max(norm, abs(inner(v, w, side)) ** 0.5)
        v = w
    terms = max(inner(numpy.ones(x.shape), numpy.ones(x.shape), side), 1.0)
    size = inner(x, x, side) ** 0.5
    epsilon = EPSILON[_real_dtype(x.dtype)]
    return 2 * 2.0 * terms * epsilon * norm * size


def test_every_operator_matches_numpy(cupy, grid, path):
    failures = []
    for op, x in operators(grid):
        try:
            if host_only(op):  # refuses device arrays with a clear error instead
                with raises((TypeError, ValueError), match="host"):
                    op.forward(cupy.asarray(x))
                continue
            if not getattr(op, "linear", True):
                failures += nonlinear_on_device(cupy, op, x)
                continue
            expected = op.forward(x)
            expected_back = op.adjoint(expected)
            got = op.forward(cupy.asarray(x))
            if not (isinstance(got, cupy.ndarray) and got.device.id == cupy.cuda.Device().id):
                failures.append(f"{op.name}: result is {type(got).__name__}, not on the current device")
                continue
            back = op.adjoint(got)
            for what, result, want, point, direction in (("forward", got, expected, x, "forward"),
                                                         ("adjoint", back, expected_back, expected, "adjoint")):
                error = float(abs(cupy.asnumpy(result).astype(numpy.complex128) - want).max()) if want.size else 0.0
                bound = rounding_bound(op, point, direction)
                if not error <= bound:
                    failures.append(f"{op.name} {what}: device differs from NumPy by {error:.3e} > bound {bound:.3e}")
        except Exception as exc:  # noqa: BLE001 -- every operator is tried; each failure is reported
            failures.append(f"{op.name}: {type(exc).__module__}.{type(exc).__name__}: {exc}")
    report(grid, failures)


def nonlinear_on_device(cupy, op, x):
    """An operator that is not linear (attention) on a device against NumPy: its forward and ``gradients``.

    Its rounding has no operator norm to bound it: 1e-10 of the largest value (float64), far above
    rounding, far below any mistake.
    """
    failures = []
    expected = op.forward(x)
    host = op.gradients(x, expected)
    got = op.forward(cupy.asarray(x))
    device = op.gradients(cupy.asarray(x), got)
    for what, result, want in [("forward", got, expected)] + [(f"gradient {i}", d, h)
                                                              for i, (d, h) in enumerate(zip(device, host))
                                                              if h is not None]:
        error = float(abs(cupy.asnumpy(result) - want).max())
        if not error <= 1e-10 * float(abs(want).max()):
            failures.append(f"{op.name} {what}: device differs from NumPy by {error:.3e}")
    return failures


def test_dottests_on_device(cupy, grid, path):
    local = rank_rng(grid.cart, seed=5)
    failures = []
    for op, x in operators(grid):
        if "replicated" in (op.domain.kind, op.range.kind) or x.dtype in (numpy.float16, numpy.float32) \
                or host_only(op) or not getattr(op, "linear", True):
            continue
        y = op.forward(x)
        xx = cupy.asarray(random_array(local, x.shape, x.dtype))
        yy = cupy.asarray(random_array(local, y.shape, y.dtype))
        try:
            found = dottest(op, xx, yy, rtol=1e-12)
            if not found <= 1e-12:
                failures.append(f"{op.name}: dot test {found:.2e}")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{op.name}: {type(exc).__name__}: {exc}")
    report(grid, failures)


def test_every_refusal_on_a_device_is_a_documented_exception(cupy, grid, path):
    """Wrong dtype, wrong shape, ``out=`` on the host, host-only operators: TypeError or ValueError, never InputError.

    ``InputError`` is mpisphere's internal record of a rank's finding; users
    see the exception class it names (the table-free strategy once raised
    the record itself).
    """
    failures = []
    for op, x in operators(grid):
        device = cupy.asarray(x)
        wrong_dtype = (numpy.float32 if x.dtype != numpy.float32 else numpy.float64) if x.dtype.kind == "f" \
            else numpy.complex64 if x.dtype != numpy.complex64 else numpy.complex128
        cases = [("a wrong shape", lambda: op.forward(device[..., :-1] if device.shape[-1] > 1 else device[None])),
                 ("out= on the host", lambda: op.forward(device, out=numpy.zeros(3)))]
        if op._dtypes()[0] is not None:
            cases.append(("a wrong dtype", lambda: op.forward(device.astype(wrong_dtype))))
        if host_only(op):
            cases.append(("a device array", lambda: op.forward(device)))
        for what, call in cases:
            try:
                call()
                if host_only(op) or what != "a wrong shape":
                    failures.append(f"{op.name} with {what}: no error")
            except InputError as exc:
                failures.append(f"{op.name} with {what}: the internal InputError reached the caller: {exc}")
            except (TypeError, ValueError) as exc:
                if type(exc).__module__ != "builtins":
                    failures.append(f"{op.name} with {what}: {type(exc).__module__}.{type(exc).__name__}")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{op.name} with {what}: {type(exc).__module__}.{type(exc).__name__}: {exc}")
    report(grid, failures)


def test_update_and_accumulate_in_place_on_device(cupy, grid, path):
    op = HaloExchange(grid, 1, 2, extents=(13, 10))
    h, w = grid.local_shape(13, 10)
    host = rank_rng(grid.cart).standard_normal((2, h + 2, w + 4))
    device = cupy.asarray(host)
    assert op.update(device) is device
    numpy.testing.assert_array_equal(cupy.asnumpy(device), op.update(host.copy()))
    numpy.testing.assert_array_equal(cupy.asnumpy(op.accumulate(device)), op.accumulate(op.update(host.copy())))


def test_work_queued_on_a_side_stream_is_seen_by_mpi(cupy, grid, path):
    """The producer's stream is synchronised before MPI reads a buffer; the result is read on that stream.

    (A result is ordered on the stream current at the call, like any CuPy
    result: reading it on another stream without waiting raced here once,
    half the received values still zero.)
    """
    op = Transpose(grid.azimuth, axes=(0, 2), extents=(64, 10))
    h, w = grid.local_shape(13, 10)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.full((64, h, w), float(grid.rank))
        for _ in range(20):  # a queue of kernels still running when MPI is called
            x = x * 1.0 + 0.0
        y = op.forward(x)
        got = read(y, stream)
    expected = op.forward(numpy.full((64, h, w), float(grid.rank)))
    numpy.testing.assert_array_equal(got, expected)


def read(a, stream):
    """``a`` on the host, copied on ``stream`` and waited for."""
    host = a.get(stream=stream)
    stream.synchronize()
    return host


def _stress_cases(cupy, grid):
    """``[(name, call on a device array, the same on the host, the input on the host)]``: large arrays."""
    nlat, nlon, batch = 181, 360, 16
    h, w = grid.local_shape(nlat, nlon)
    rng = rank_rng(grid.cart, seed=17)
    tile = rng.standard_normal((batch, h, w))
    whole = rng.standard_normal((batch, 8, w))
    transpose = Transpose(grid.azimuth, axes=(0, 2), extents=(batch, nlon))
    gather = GatherFrom(grid.azimuth, -1, nlon)
    reduce = ReduceFrom(grid.cart)
    halo = HaloExchange(grid, 3, 3, extents=(nlat, nlon))
    sht = DistributedRealSHT(grid, nlat, nlon, legendre="transpose", overlap=True)  # exchanges in flight
    isht = DistributedInverseRealSHT(grid, nlat, nlon, legendre="transpose")
    return [("Transpose (Alltoallv)", transpose.forward, tile),
            ("GatherFrom (Allgatherv)", gather.forward, whole),
            ("ReduceFrom (Allreduce)", reduce.forward, numpy.round(whole * 8) / 8),  # sums exact in any order
            ("HaloExchange (neighbours)", halo.forward, tile),
            ("SHT, overlapped transposes", lambda x: isht.forward(sht.forward(x)), tile)]


def test_streams_under_stress(cupy, grid, path):
    """Large arrays behind a long queue of kernels on a non-blocking stream, read on two other streams; calls on
    alternating streams reuse the operators' buffers. Every run must see exactly the NumPy result (or, for the
    transforms, the same rounding)."""
    failures = []
    producer = cupy.cuda.Stream(non_blocking=True)
    second = cupy.cuda.Stream(non_blocking=True)
    for name, call, host in _stress_cases(cupy, grid):
        expected = call(host)
        tolerance = 1e-12 * float(abs(expected).max()) if "SHT" in name else 0.0
        bad = 0
        for run in range(STRESS_RUNS):
            with producer:
                x = cupy.asarray(host)
                for _ in range(200):  # long: MPI would read a half-made input if the library did not wait
                    x = x * 1.0
                y = call(x)
                done = producer.record()
            readings = []
            null = cupy.cuda.Stream.null
            with null:  # the default stream, ordered after the producer by its event
                null.wait_event(done)
                readings.append(read(y * 1.0, null))
            with second:  # another non-blocking stream, likewise
                second.wait_event(done)
                readings.append(read(y * 1.0, second))
            other = second if run % 2 else producer
            with other:  # the next call on another stream than the last one: the operators' buffers are reused
                readings.append(read(call(cupy.asarray(host)), other))
            for reading in readings:
                if not float(abs(reading - expected).max()) <= tolerance:
                    bad += 1
        if bad:
            failures.append(f"{name}: {bad} of {3 * STRESS_RUNS} readings differ from the NumPy result")
    report(grid, failures)


def test_mixing_host_and_device_arrays(cupy, grid, path):
    op = CopyTo(grid.polar)
    with raises(TypeError, match="out is a host array but the result lives on the device"):
        op.forward(cupy.zeros(3), out=numpy.zeros(3))
