"""mpisphere.sht.costs counts what the transforms really send: checked against the bytes handed to MPI."""

import numpy
import pytest

from mpisphere import (DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedRealVectorSHT, collectives)
from mpisphere.sht.costs import TRANSPOSES, sht_costs

pytestmark = pytest.mark.mpi


def _counting(monkeypatch):
    """Replace the Alltoallv wrapper by one that records (communicator size, bytes and messages to others)."""
    calls = []
    original = collectives.alltoallv

    def counted(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, **kwargs):
        me = comm.Get_rank()
        others = [int(n) for q, n in enumerate(send_counts) if q != me]
        calls.append((comm.Get_size(), sum(others) * send.itemsize, sum(1 for n in others if n > 0)))
        return original(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, **kwargs)

    monkeypatch.setattr(collectives, "alltoallv", counted)
    return calls


@pytest.mark.parametrize("cls", [DistributedRealSHT, DistributedInverseRealSHT, DistributedRealVectorSHT,
                                 DistributedInverseRealVectorSHT])
@pytest.mark.parametrize("orders", ["contiguous", "balanced"])
@pytest.mark.parametrize("batch, dtype", [(1, numpy.float64), (5, numpy.float32)])
def test_bytes_and_messages_sent_are_what_the_model_counts(grid, monkeypatch, cls, orders, batch, dtype):
    nlat, nlon = 23, 40
    # the transposes' strategy, named: auto may run a batch table-free, by a cost model calibrated per machine
    # (the reduce-scatter strategies' exchanges have a test of their own below)
    legendre = "transpose"
    op = cls(grid, nlat, nlon, quadrature="legendre-gauss", dtype=dtype, orders=orders, legendre=legendre)
    vector = "Vector" in cls.__name__
    inverse = "Inverse" in cls.__name__
    x = numpy.ones(op.domain_shape((batch,)), op.cdtype if inverse else op.dtype)
    calls = _counting(monkeypatch)
    op.forward(x)
    expected = sht_costs(nlat, nlon, op.lmax, op.mmax, grid.npolar, grid.nazimuth, batch=batch, vector=vector,
                         dtype=dtype, orders=orders, legendre=legendre)[grid.rank]
    # the pipeline's transposes in running order; those on one-rank communicators call no MPI
    sizes = {"longitudes": grid.nazimuth, "orders": grid.nazimuth, "latitudes": grid.npolar,
             "degrees": grid.npolar}
    names = TRANSPOSES[::-1] if inverse else TRANSPOSES
    # an inverse runs the reversed pipeline: it sends what the forward receives, so compare the sums over the grid
    want = [(sizes[n], expected.sent[TRANSPOSES.index(n)], expected.messages[TRANSPOSES.index(n)])
            for n in names if sizes[n] > 1]
    if not inverse:
        assert calls == want, f"counted {calls}, model {want}"
    else:
        assert [c[0] for c in calls] == [w[0] for w in want]
        everyone = sht_costs(nlat, nlon, op.lmax, op.mmax, grid.npolar, grid.nazimuth, batch=batch,
                             vector=vector, dtype=dtype, orders=orders, legendre=legendre)
        total_model = sum(sum(c.sent) for c in everyone)
        total_counted = grid.cart.allreduce(sum(c[1] for c in calls))
        assert total_counted == total_model


@pytest.mark.parametrize("vector", [False, True])
def test_scratch_is_what_the_model_counts(grid, vector):
    nlat, nlon, batch = 23, 40, 7
    options = dict(orders="balanced", legendre="transpose")  # what the model counts, whatever auto would pick
    forward = (DistributedRealVectorSHT if vector else DistributedRealSHT)(grid, nlat, nlon, **options)
    inverse = (DistributedInverseRealVectorSHT if vector else DistributedInverseRealSHT)(grid, nlat, nlon, **options)
    # both directions of both transforms: they share the grid's buffers, and none needs more than the model says
    c = forward.forward(numpy.ones(forward.domain_shape((batch,))))
    x = inverse.forward(c)
    forward.adjoint(c)
    inverse.adjoint(x)
    expected = sht_costs(nlat, nlon, forward.lmax, forward.mmax, grid.npolar, grid.nazimuth, batch=batch,
                         vector=vector, orders="balanced")[grid.rank]
    assert grid.scratch.nbytes() == expected.scratch_bytes


@pytest.mark.parametrize("legendre, vector", [("reduce-scatter", False), ("reduce-scatter", True),
                                               ("table-free", False), ("table-free", True)])
def test_the_reduce_scatter_strategies_send_what_the_model_counts(grid, monkeypatch, legendre, vector):
    """The polar exchange is one Reduce_scatter of every degree's partial sums; the transposes are the azimuth ones."""
    nlat, nlon, batch = 23, 40, 3
    cls = DistributedRealVectorSHT if vector else DistributedRealSHT
    op = cls(grid, nlat, nlon, quadrature="legendre-gauss", orders="balanced", legendre=legendre)
    transposes = _counting(monkeypatch)
    reduced = []
    original = collectives.reduce_scatter

    def counted(comm, send, recv, counts, *args, **kwargs):
        me = comm.Get_rank()
        reduced.append((comm.Get_size(), (sum(counts) - counts[me]) * send.itemsize,
                        sum(1 for q, n in enumerate(counts) if q != me and n > 0)))
        return original(comm, send, recv, counts, *args, **kwargs)

    monkeypatch.setattr(collectives, "reduce_scatter", counted)
    op.forward(numpy.ones(op.domain_shape((batch,))))
    expected = sht_costs(nlat, nlon, op.lmax, op.mmax, grid.npolar, grid.nazimuth, batch=batch, vector=vector,
                         orders="balanced", legendre=legendre)[grid.rank]
    assert expected.sent[2] == expected.messages[2] == 0
    assert transposes == [(grid.nazimuth, expected.sent[t], expected.messages[t]) for t in (0, 1)
                          if grid.nazimuth > 1]
    assert reduced == ([(grid.npolar, expected.sent[3], expected.messages[3])] if grid.npolar > 1 else [])
    assert expected.table_bytes == op.table_bytes()
