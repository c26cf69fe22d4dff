"""An operator on one rank as a SciPy LinearOperator: solves with scipy's CG, exact adjoint, refused on many ranks."""

import numpy
import pytest
from mpi4py import MPI

from mpisphere import (DistributedInverseRealSHT, DistributedRealSHT, DistributedRealVectorSHT, HaloExchange,
                       ProcessGrid, Transpose, aslinearoperator)

from helpers import raises

pytestmark = pytest.mark.mpi

sparse_linalg = pytest.importorskip("scipy.sparse.linalg")


def dense(linear):
    """The matrix of a SciPy operator, column by column (small problems only)."""
    return numpy.column_stack([linear.matvec(e) for e in numpy.eye(linear.shape[1])])


@pytest.fixture
def serial():
    with ProcessGrid(MPI.COMM_SELF) as grid:
        yield grid


@pytest.mark.parametrize("make, dtype", [
    (lambda g: DistributedRealSHT(g, 8, 16, quadrature="legendre-gauss"), numpy.float64),        # real -> complex
    (lambda g: DistributedInverseRealSHT(g, 8, 16, quadrature="legendre-gauss"), numpy.complex128),
    (lambda g: DistributedRealVectorSHT(g, 8, 16, quadrature="legendre-gauss"), numpy.float64),
    (lambda g: HaloExchange(g, 1, 1, extents=(8, 16)), numpy.float64),
], ids=["sht", "isht", "vsht", "halo"])
def test_the_scipy_adjoint_is_the_transpose_of_the_matrix(serial, make, dtype):
    linear = aslinearoperator(make(serial), lead=(2,), dtype=dtype)
    matrix = dense(linear)
    rows, columns = linear.shape
    assert matrix.shape == (rows, columns) and linear.dtype == numpy.float64
    adjoint = numpy.column_stack([linear.rmatvec(e) for e in numpy.eye(rows)])
    # both the same products of the same numbers, differently ordered: rounding on the entries' scale
    numpy.testing.assert_allclose(adjoint, matrix.T, rtol=0, atol=1e-13 * abs(matrix).max())


def test_scipy_cg_solves_a_regularised_least_squares_problem_with_the_transform(serial):
    """``(A^T A + I) x = A^T c`` for the real SHT ``A``: CG agrees with a dense solve."""
    sht = DistributedRealSHT(serial, 8, 16, quadrature="legendre-gauss")
    a = aslinearoperator(sht, lead=(1,))
    normal = a.H @ a + sparse_linalg.aslinearoperator(numpy.eye(a.shape[1]))
    rng = numpy.random.default_rng(0)
    c = rng.standard_normal(a.shape[0])
    b = a.rmatvec(c)
    x, info = sparse_linalg.cg(normal, b, rtol=1e-12, atol=0.0, maxiter=500)
    assert info == 0
    matrix = dense(a)
    expected = numpy.linalg.solve(matrix.T @ matrix + numpy.eye(a.shape[1]), b)
    assert abs(x - expected).max() <= 1e-9 * abs(expected).max()


def test_many_ranks_are_refused_on_every_rank(grid):
    op = Transpose(grid.cart, axes=(0, 1), extents=(grid.size, grid.size))
    if grid.size == 1:
        assert aslinearoperator(op, lead=(1, 1)).shape == (1, 1)
        return
    with raises(ValueError, match=f"Transpose spans {grid.size} ranks; a SciPy operator runs on one rank"):
        aslinearoperator(op, lead=(grid.size, 1))
    with raises(TypeError, match="expected a mpisphere LinearOperator, got ndarray"):
        aslinearoperator(numpy.eye(2))
