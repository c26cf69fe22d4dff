"""LinearOperator machinery: layouts, inner products, dottest's failure message."""

import numpy
import pytest

from mpisphere import DISTRIBUTED, REPLICATED, Layout, LinearOperator, dottest, inner

from helpers import rank_rng

pytestmark = pytest.mark.mpi


class Scale(LinearOperator):
    """x -> 2 x, with an adjoint that is wrong on purpose when ``broken``."""

    def __init__(self, comm, broken):
        self.domain = self.range = Layout(DISTRIBUTED, comm)
        self.broken = broken

    def _forward(self, x, out):
        return 2.0 * x

    def _adjoint(self, y, out):
        return (3.0 if self.broken else 2.0) * y


def test_dottest_failure_names_both_inner_products(comm):
    local = rank_rng(comm)
    x, y = local.standard_normal(5), local.standard_normal(5)
    assert dottest(Scale(comm, broken=False), x, y) <= 1e-15
    lhs = comm.allreduce(float(numpy.dot(2 * x, y)))
    with pytest.raises(AssertionError, match=rf"dottest\(Scale\): <A x, y> = {lhs!r} but <x, A\^H y> = .* "
                                             r"relative difference 3\.333e-01 > rtol 1\.0e-13"):
        dottest(Scale(comm, broken=True), x, y)


def test_inner_products_by_layout(comm):
    p = comm.Get_size()
    a = numpy.array([1.0 + 2.0j, 3.0])
    b = numpy.array([2.0 - 1.0j, 1.0])
    local = 1 * 2 + 2 * (-1) + 3 * 1  # sum(real(conj(a) * b))
    assert inner(a, b, Layout(REPLICATED, comm)) == local
    assert inner(a, b, Layout(DISTRIBUTED, comm)) == p * local
    with pytest.raises(ValueError, match=r"inner product of arrays of different shapes \(2,\) and \(3,\)"):
        inner(a, numpy.zeros(3), Layout(REPLICATED, comm))


def test_bad_layout_kind(comm):
    with pytest.raises(ValueError, match="Layout kind must be 'distributed' or 'replicated', got 'shared'"):
        Layout("shared", comm)


def test_adjoint_of_the_adjoint_is_the_operator(comm):
    op = Scale(comm, broken=False)
    assert op.H.H is op
    assert op.H.name == "Scale.H"
    numpy.testing.assert_array_equal((op @ op).H.forward(numpy.ones(2)), numpy.full(2, 4.0))
