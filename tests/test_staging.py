"""The host-staging code path (forced on NumPy arrays) and the buffer hand-off to mpi4py.

On a machine without a GPU these tests are what runs the staging logic that
device buffers take when MPI is not CUDA-aware, and the hand-off of objects
that MPI sees only through DLPack or the CUDA array interface.
"""

import numpy
import pytest

from mpisphere import collectives, config, cuda_aware, dottest
from mpisphere.backend import Workspace

from catalogue import operators
from helpers import raises, random_array, rank_rng

pytestmark = pytest.mark.mpi


def test_the_catalogue_covers_every_public_operator(grid):
    """Every public operator class has an entry, so the staging and GPU tests run it (a new one fails here)."""
    import mpisphere
    from mpisphere.examples.tangent_linear import LinearisedProducts, TangentLinearModel
    from mpisphere.operators import LinearOperator
    from mpisphere.sht.calculus import DegreeDiagonal
    public = {getattr(mpisphere, name) for name in mpisphere.__all__}
    classes = {c for c in public if isinstance(c, type) and issubclass(c, LinearOperator)}
    classes |= {DegreeDiagonal, TangentLinearModel, LinearisedProducts}
    classes.discard(LinearOperator)  # the base class itself
    catalogued = {type(op) for op, _ in operators(grid)}
    missing = sorted(c.__name__ for c in classes if not any(issubclass(t, c) for t in catalogued))
    assert not missing, f"public operators without an entry in tests/catalogue.py: {missing}"


def test_staged_path_gives_identical_results(grid):
    for op, x in operators(grid):
        back_of = op.adjoint if getattr(op, "linear", True) else (lambda y, op=op, x=x: op.gradients(x, y)[0])
        direct = op.forward(x)
        back = back_of(direct)
        with config.override(force_staging=True):
            staged = op.forward(x)
            staged_back = back_of(staged)
        numpy.testing.assert_array_equal(staged, direct, err_msg=op.name)
        numpy.testing.assert_array_equal(staged_back, back, err_msg=op.name)


def test_staged_path_dottests(grid):
    local = rank_rng(grid.cart, seed=11)
    with config.override(force_staging=True):
        for op, x in operators(grid):
            if "replicated" in (op.domain.kind, op.range.kind) or x.dtype == numpy.float16 \
                    or not getattr(op, "linear", True):
                continue  # covered bit for bit above; their dot tests need replicated data (or an adjoint)
            y = op.forward(x)
            yy = random_array(local, y.shape, y.dtype)
            assert dottest(op, random_array(local, x.shape, x.dtype), yy, rtol=1e-12) <= 1e-12, op.name


def test_staged_all_to_all_with_uneven_and_empty_blocks(comm):
    """The pipelined exchange on its own: blocks of every size, some empty, in any order."""
    p, r = comm.Get_size(), comm.Get_rank()
    send_counts = [(r + q) % 3 for q in range(p)]  # includes zeros
    recv_counts = [(q + r) % 3 for q in range(p)]
    send_displs = list(numpy.cumsum([0] + send_counts[:-1]) + 1)  # a gap in front
    recv_displs = list(numpy.cumsum([0] + recv_counts[:-1]))
    send = numpy.full(sum(send_counts) + 1, -1.0)
    for q in range(p):
        send[send_displs[q]:send_displs[q] + send_counts[q]] = 100 * r + q
    recv = numpy.zeros(sum(recv_counts))
    ws = Workspace()
    for _ in range(3):  # the workspace is reused
        collectives.alltoallv(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, staged=True,
                              workspace=ws)
    for q in range(p):
        numpy.testing.assert_array_equal(recv[recv_displs[q]:recv_displs[q] + recv_counts[q]], 100 * q + r)


class DLPackOnly:
    """Exposes nothing but the DLPack protocol around host memory."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class CudaArrayInterfaceOnly:
    """Exposes nothing but ``__cuda_array_interface__``, pointing at host memory."""

    def __init__(self, array):
        self._array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "data": (array.ctypes.data, False),
            "strides": None, "version": 3, "stream": None,
        }


@pytest.mark.parametrize("wrap", [DLPackOnly, CudaArrayInterfaceOnly], ids=["dlpack", "cuda-array-interface"])
def test_foreign_buffers_are_handed_to_mpi(comm, wrap):
    p, r = comm.Get_size(), comm.Get_rank()
    send = numpy.arange(6.0) + r
    recv = numpy.zeros(6)
    collectives.allreduce(comm, wrap(send), wrap(recv), dtype=numpy.float64, count=6)
    numpy.testing.assert_array_equal(recv, numpy.arange(6.0) * p + p * (p - 1) / 2)
    numpy.testing.assert_array_equal(send, numpy.arange(6.0) + r)  # never written
    recv[:] = 0  # foreign objects are never staged: MPI takes them as they are
    collectives.allreduce(comm, wrap(send), wrap(recv), dtype=numpy.float64, count=6, staged=True)
    numpy.testing.assert_array_equal(recv, numpy.arange(6.0) * p + p * (p - 1) / 2)


def test_cuda_array_interface_buffers_in_sendrecv_and_alltoallv(comm):
    p, r = comm.Get_size(), comm.Get_rank()
    send = numpy.full(4, float(r))
    recv = numpy.zeros(4)
    collectives.sendrecv(comm, CudaArrayInterfaceOnly(send), (r + 1) % p, CudaArrayInterfaceOnly(recv),
                         (r - 1) % p, sendtag=5, recvtag=5)
    numpy.testing.assert_array_equal(recv, (r - 1) % p)
    send = numpy.arange(p, dtype=float) + 10 * r
    recv = numpy.zeros(p)
    ones, offsets = [1] * p, list(range(p))
    collectives.alltoallv(comm, CudaArrayInterfaceOnly(send), ones, offsets, CudaArrayInterfaceOnly(recv), ones,
                          offsets)
    numpy.testing.assert_array_equal(recv, 10 * numpy.arange(p) + r)


def test_cuda_aware_decision_is_the_same_on_every_rank(comm):
    aware, source = cuda_aware.decide(comm)
    assert comm.allgather(aware) == [aware] * comm.Get_size()
    with config.override(cuda_aware=True):
        assert cuda_aware.decide(comm)[0] is True
        assert "CUDA-aware" in cuda_aware.describe_path(*cuda_aware.decide(comm))
    assert cuda_aware.decide(comm)[0] == aware


def test_detection_is_remembered_and_reset_forgets_it(comm):
    first = cuda_aware.detect()
    assert cuda_aware.detect() is first  # looked up once per process
    cuda_aware.reset()
    assert cuda_aware.detect() == first and cuda_aware.detect() is not first


def test_grid_records_the_agreed_decision(grid):
    assert grid.cuda_aware == cuda_aware.decide(grid.cart)
    assert grid.device_buffer_path.startswith("device buffers")


def test_node_local_rank(comm):
    from mpisphere.collectives import node_local_rank
    local_rank, local_size = node_local_rank(comm)
    # one node here: the node-local numbering is the world's
    assert (local_rank, local_size) == (comm.Get_rank(), comm.Get_size())


@pytest.mark.mpi(min_size=2)
def test_one_rank_saying_no_makes_every_rank_stage(comm):
    """The decision is an AND over the ranks: a rank that cannot take device buffers stages for all."""
    with config.override(cuda_aware=comm.Get_rank() != 0):
        aware, source = cuda_aware.decide(comm)
    assert aware is False
    if comm.Get_rank() != 0:
        assert source.startswith("another rank found no CUDA support")


def test_buffers_whose_size_or_dtype_cannot_be_read(comm):
    send, recv = DLPackOnly(numpy.ones(2)), DLPackOnly(numpy.zeros(2))
    with raises(TypeError, match="mpisphere: cannot tell the dtype of DLPackOnly; pass dtype="):
        collectives.allreduce(comm, send, recv, count=2)
    with raises(TypeError, match="mpisphere: cannot tell the element count of DLPackOnly; pass count="):
        collectives.allreduce(comm, send, recv, dtype=numpy.float64)
    with raises(TypeError, match="mpisphere: float16 is summed in float32"):
        collectives.allreduce(comm, numpy.ones(2, numpy.float16), numpy.zeros(2, numpy.float16))
