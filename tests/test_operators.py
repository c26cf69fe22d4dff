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


def test_dottest_failure_names_both_inner_products_and_the_bound(comm):
    local = rank_rng(comm)
    x, y = local.standard_normal(5), local.standard_normal(5)
    assert dottest(Scale(comm, broken=False), x, y) <= 1e-15
    lhs = comm.allreduce(float(numpy.dot(2 * x, y)))
    bound = comm.allreduce(float(numpy.dot(abs(2 * x), abs(y)) + numpy.dot(abs(x), abs(3 * y))))
    measure = abs(lhs - 1.5 * lhs) / bound
    with pytest.raises(AssertionError, match=rf"dottest\(Scale\): <A x, y> = {lhs!r} but <x, A\^H y> = .*; their "
                                             rf"difference .* is {measure:.3e} of the rounding bound "
                                             r"sum\|Ax\|\|y\| \+ sum\|x\|\|A\^H y\| = .*, more than rtol 1\.0e-13"):
        dottest(Scale(comm, broken=True), x, y)


def test_dottest_verdict_survives_an_inner_product_that_cancels(comm):
    """<A x, y> made to vanish: a measure relative to the inner products would see only rounding.

    With y orthogonal to A x the two inner products are rounding noise of
    different sizes (about 1e-14 here), so their relative difference is of
    order one on any machine; against the bound that cannot cancel, the
    operator is exact to 1e-17.
    """
    from mpisphere import Transpose, split_sizes
    p, r = comm.Get_size(), comm.Get_rank()
    op = Transpose(comm, axes=(0, 1), extents=(6, 1000))
    local = rank_rng(comm, seed=3)
    x = local.standard_normal((6, split_sizes(1000, p)[r]))
    y = local.standard_normal((split_sizes(6, p)[r], 1000))
    ax = op.forward(x)
    y = y - comm.allreduce(float(numpy.vdot(ax, y))) / comm.allreduce(float(numpy.vdot(ax, ax))) * ax
    assert abs(inner(ax, y, op.range)) < 1e-11
    assert dottest(op, x, y, rtol=1e-15) <= 1e-15


def test_dottest_verdict_does_not_depend_on_the_summation_order(comm, monkeypatch):
    """The reference problem of the CPU-dependent failure: 1.3 million terms that sum to about -31.

    Summing in reverse order (another kernel's order) moves the inner
    products by about 1e-12, which the old relative measure (1e-13) could
    not absorb; against the bound the verdict does not move.
    """
    from mpisphere import Transpose, operators, split_sizes
    p, r = comm.Get_size(), comm.Get_rank()
    op = Transpose(comm, axes=(0, 2), extents=(6, 720))
    local = rank_rng(comm, seed=31)
    x = local.standard_normal((6, 361, split_sizes(720, p)[r]))
    y = local.standard_normal((split_sizes(6, p)[r], 361, 720))
    ax = op.forward(x)
    measures, values = [dottest(op, x, y)], [inner(ax, y, op.range)]
    real_vdot = numpy.vdot
    monkeypatch.setattr(operators.numpy, "vdot", lambda a, b: real_vdot(a[::-1], b[::-1]))
    measures.append(dottest(op, x, y))
    values.append(inner(ax, y, op.range))
    assert values[0] != values[1]  # the order of summation did change the inner product
    assert max(measures) < 1e-16


def test_inner_products_by_layout(comm):
    """Distributed pieces are summed over the ranks, replicated copies counted once."""
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


@pytest.mark.mpi(min_size=2)
def test_layouts_of_a_grid_communicator_sum_over_the_grid(comm):
    from mpisphere import ProcessGrid
    with ProcessGrid(comm, npolar=comm.Get_size()) as grid:
        polar = Layout(DISTRIBUTED, grid.polar)
        assert polar.space is grid.cart and repr(polar) == (
            f"Layout('distributed', grid.polar ({grid.npolar} ranks), space=grid.cart ({grid.size} ranks))")
        assert Layout(DISTRIBUTED, grid.azimuth).mismatch(polar) is None  # both sum over grid.cart
        assert Layout(DISTRIBUTED, comm).mismatch(polar) is None  # the same ranks
        assert "different ranks" in Layout(REPLICATED, grid.azimuth).mismatch(Layout(REPLICATED, grid.polar))
        assert "cannot be used as distributed" in polar.mismatch(Layout(REPLICATED, grid.polar))
        a = numpy.array([1.0, 2.0])
        # replicated over a column within the grid: one copy per column counts
        assert inner(a, a, Layout(REPLICATED, grid.polar)) == 5.0 * grid.nazimuth
        assert inner(a, a, Layout(DISTRIBUTED, grid.polar)) == 5.0 * grid.size
