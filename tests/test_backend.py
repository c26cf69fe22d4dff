"""Backend selection, workspaces, CUDA-aware detection (serial parts)."""

import os
import sys
import types

import numpy
import pytest

from mpisphere import backend, devices
from mpisphere.cuda_aware import local_verdict, mpi_library_path

from helpers import raises


class FakeDeviceArray:
    """Looks like a CuPy array to type checks, without CuPy or a GPU."""
    __module__ = "cupy._core.core"


def test_array_module_of_host_arrays():
    assert backend.array_module(numpy.zeros(2), None, numpy.ones(3)) is numpy
    assert backend.array_module() is numpy
    assert not backend.is_device_array(numpy.zeros(2))
    assert backend.is_device_array(FakeDeviceArray())


def test_mixing_host_and_device_arrays_is_a_type_error_naming_both():
    with raises(TypeError, match=r"argument 0 is numpy.ndarray, argument 1 is cupy.FakeDeviceArray"):
        backend.array_module(numpy.zeros(2), FakeDeviceArray())


def test_array_module_does_not_import_cupy():
    if "cupy" in sys.modules:
        pytest.skip("CuPy already imported by another test in this process")
    backend.array_module(numpy.zeros(2))
    assert "cupy" not in sys.modules


def test_workspace_reuses_and_grows():
    ws = backend.Workspace()
    like = numpy.zeros(1)
    a = ws.scratch("send", like, 10)
    b = ws.scratch("send", like, 6)
    assert numpy.shares_memory(a, b) and b.size == 6
    c = ws.scratch("send", like, 20)
    assert c.size == 20 and ws.nbytes() == 20 * 8
    ws.scratch("send", like, 20, numpy.float32)  # dtype change: replaced, not accumulated
    assert ws.nbytes() == 20 * 4
    h = ws.host("stage", 5, numpy.complex128, pinned=False)
    assert h.dtype == numpy.complex128 and h.size == 5
    ws.clear()
    assert ws.nbytes() == 0


def test_host_copies():
    src = numpy.arange(6.0).reshape(2, 3)
    dst = numpy.empty(6)
    assert backend.copy_to_host(src, dst, blocking=False) is None
    numpy.testing.assert_array_equal(dst, src.reshape(-1))
    back = numpy.empty((2, 3))
    backend.copy_from_host(dst, back)
    numpy.testing.assert_array_equal(back, src)
    backend.wait(None)


@pytest.mark.mpi
def test_select_device_without_a_gpu():
    if backend.visible_device_count() > 0:
        pytest.skip("a GPU is visible")
    from mpi4py import MPI
    with raises(RuntimeError, match="no CUDA device visible to this process"):
        devices.select_device(MPI.COMM_SELF)


def test_outer_test_process_does_not_start_mpi(pytestconfig):
    """Serial tests run in the process that launches mpiexec; MPI stays uninitialised there."""
    from mpi4py import MPI
    assert not MPI.Is_initialized()


def test_override_wins():
    assert local_verdict(True) == (True, "override (mpisphere.config.cuda_aware / MPISPHERE_CUDA_AWARE) = 1")
    assert local_verdict(False)[0] is False


@pytest.mark.mpi
def test_library_query_of_pip_mpich():
    path = mpi_library_path()
    assert path and os.path.exists(path)
    value, source = local_verdict(None, environ={})
    assert isinstance(value, bool) and source


@pytest.mark.mpi
@pytest.mark.parametrize("environ, expected", [
    ({"MV2_USE_CUDA": "1"}, True),
    ({"I_MPI_OFFLOAD": "1"}, True),
    ({"MPICH_GPU_SUPPORT_ENABLED": "1"}, False),  # no GTL library loaded here: not safe
    ({}, False),
])
def test_vendor_switches(environ, expected):
    """Against a library without MPIX queries (libc), the vendor switches decide."""
    import ctypes.util
    libc = ctypes.util.find_library("c")
    value, source = local_verdict(None, environ=environ, library_path=libc)
    assert value is expected, source
    if not environ:
        assert "staging through host memory" in source


class _FakeDevice:
    def __init__(self, id):
        self.id, self.entered = id, 0

    def __enter__(self):
        self.entered += 1

    def __exit__(self, *exc):
        return False


def test_constants_go_to_each_device_once(monkeypatch):
    uploads, waits = [], []
    fake_cupy = type(sys)("cupy")
    fake_cupy.asarray = lambda a: uploads.append(a) or ("on device", a)
    stream = types.SimpleNamespace(synchronize=lambda: waits.append(len(uploads)))
    fake_cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: stream)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    host, pair, cache = numpy.arange(3.0), (numpy.zeros(2), numpy.ones(2)), {}
    assert backend.on_device_of(numpy.zeros(1), host, cache) is host  # host arrays: the array itself, no cache
    assert cache == {}
    devices = [FakeDeviceArray(), FakeDeviceArray()]
    devices[0].device, devices[1].device = _FakeDevice(0), _FakeDevice(1)
    first = backend.on_device_of(devices[0], host, cache)
    assert first == ("on device", host) and backend.on_device_of(devices[0], host, cache) is first
    assert devices[0].device.entered == 1  # uploaded inside the array's device context, once
    assert backend.on_device_of(devices[1], host, cache) is not first  # another device: its own copy
    both = backend.on_device_of(devices[0], pair, cache, key="pair")  # a tuple: each member, under its own key
    assert both == tuple(("on device", a) for a in pair)
    assert len(uploads) == 4
    # each upload is waited for before the cache hands it out: a call on another stream may read it at once
    assert waits == [1, 2, 4]
