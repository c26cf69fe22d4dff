"""Operators as pylops-mpi operators: the same maps on DistributedArrays, and its CG solving with a transform."""

import numpy
import pytest
from mpi4py import MPI

from mpisphere import (DISTRIBUTED, CopyTo, DistributedRealSHT, HaloExchange, Identity, Layout, ProcessGrid,
                       aslinearoperator, asmpilinearoperator)
from mpisphere.pylops_bridge import from_distributed, to_distributed

from helpers import raises, random_array, rank_rng

pytestmark = pytest.mark.mpi

# the test extra installs pylops-mpi on Python 3.11 and newer (0.8 imports typing.Self)
pylops_mpi = pytest.importorskip("pylops_mpi")


def test_matvec_and_rmatvec_are_forward_and_adjoint_on_each_ranks_piece(grid):
    sht = DistributedRealSHT(grid, 13, 24, quadrature="legendre-gauss")
    adapter = asmpilinearoperator(sht, lead=(2,))
    rng = rank_rng(grid.cart, 3)
    x = random_array(rng, sht.domain_shape((2,)), numpy.float64)
    y = random_array(rng, sht.range_shape((2,)), numpy.complex128)
    ax = from_distributed(adapter.matvec(to_distributed(x, grid.cart)), sht.range_shape((2,)), numpy.complex128)
    aty = from_distributed(adapter.rmatvec(to_distributed(y, grid.cart)), sht.domain_shape((2,)), numpy.float64)
    numpy.testing.assert_array_equal(ax, sht.forward(x))
    numpy.testing.assert_array_equal(aty, sht.adjoint(y))
    # pylops-mpi's dot sums the (re, im) pairs over the ranks: mpisphere's inner product
    left = adapter.matvec(to_distributed(x, grid.cart)).dot(to_distributed(y, grid.cart))
    right = to_distributed(x, grid.cart).dot(adapter.rmatvec(to_distributed(y, grid.cart)))
    scale = grid.cart.allreduce(float(numpy.sum(abs(ax) * abs(y)) + numpy.sum(abs(x) * abs(aty))), op=MPI.SUM)
    assert abs(left - right) <= 1e-13 * scale


def test_pylops_cg_solves_with_a_distributed_transform_as_one_rank_does(grid):
    """``(A^T A + I) x = A^T c`` with pylops-mpi's CG on the grid, against SciPy's dense solve on one rank."""
    nlat, nlon = 12, 24
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    normal = sht.H @ sht + Identity(Layout(DISTRIBUTED, grid.cart), sht.tile_shape)
    whole_c = numpy.random.default_rng(5).standard_normal((sht.lmax, sht.mmax)) * (1 + 1j)
    whole_c[:, 0] = whole_c[:, 0].real
    c = whole_c[sht.local_degrees][:, sht.local_orders]
    b = sht.adjoint(c)
    adapter = asmpilinearoperator(normal)
    x0 = to_distributed(numpy.zeros(sht.tile_shape), grid.cart)
    solution, iterations, _ = pylops_mpi.cg(adapter, to_distributed(b, grid.cart), x0, niter=200, tol=1e-24)
    x = from_distributed(solution, sht.tile_shape, numpy.float64)
    whole_x = grid.gather(x)
    if grid.rank == 0:
        with ProcessGrid(MPI.COMM_SELF) as serial:
            one = DistributedRealSHT(serial, nlat, nlon, quadrature="legendre-gauss")
            a = aslinearoperator(one)
            matrix = numpy.column_stack([a.matvec(e) for e in numpy.eye(a.shape[1])])
            rhs = a.rmatvec(numpy.concatenate([whole_c.view(float).reshape(-1)]))
            expected = numpy.linalg.solve(matrix.T @ matrix + numpy.eye(a.shape[1]), rhs).reshape(nlat, nlon)
        assert abs(whole_x - expected).max() <= 1e-9 * abs(expected).max(), iterations


def test_replicated_layouts_are_refused(grid):
    with raises(ValueError, match="CopyTo's domain is replicated"):
        asmpilinearoperator(CopyTo(grid.cart), lead=(3,))
    halo = HaloExchange(grid, 1, 1, extents=(12, 24))
    assert asmpilinearoperator(halo).shape[1] == grid.cart.allreduce(halo.domain_shape(())[0] *
                                                                      halo.domain_shape(())[1])
