"""LinearOperator machinery: layouts, inner products, dottest's failure message."""

import numpy
import pytest

from mpisphere import DISTRIBUTED, REPLICATED, Layout, LinearOperator, dottest, inner
from mpisphere.agreement import InputError

from helpers import raises, rank_rng

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
    with raises(AssertionError, match=rf"dottest\(Scale\): <A x, y> = {lhs!r} but <x, A\^H y> = .*; their "
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
    from mpisphere import Transpose, split_sizes
    p, r = comm.Get_size(), comm.Get_rank()
    op = Transpose(comm, axes=(0, 2), extents=(6, 720))
    local = rank_rng(comm, seed=31)
    x = local.standard_normal((6, 361, split_sizes(720, p)[r]))
    y = local.standard_normal((split_sizes(6, p)[r], 361, 720))
    ax = op.forward(x)
    measures, values = [dottest(op, x, y)], [inner(ax, y, op.range)]
    real_vdot = numpy.vdot
    monkeypatch.setattr(numpy, "vdot", lambda a, b: real_vdot(a[::-1], b[::-1]))
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
    with raises(ValueError, match=r"inner product of arrays of different shapes \(2,\) and \(3,\)"):
        inner(a, numpy.zeros(3), Layout(REPLICATED, comm))


def test_bad_layout_kind(comm):
    with raises(ValueError, match="Layout kind must be 'distributed' or 'replicated', got 'shared'"):
        Layout("shared", comm)


def test_dottest_draws_its_own_points_from_the_shape_contract(comm):
    from mpisphere import GatherFrom, Transpose, split_sizes
    p = comm.Get_size()
    T = Transpose(comm, axes=(0, -1), extents=(p + 1, 2 * p + 3))
    assert T.domain_shape((None, 5, None)) == (p + 1, 5, split_sizes(2 * p + 3, p)[comm.Get_rank()])
    assert T.range_shape((None, 5, None)) == (split_sizes(p + 1, p)[comm.Get_rank()], 5, 2 * p + 3)
    assert dottest(T, lead=(None, 5, None)) <= 1e-15
    assert dottest(GatherFrom(comm, 1, 3 * p), lead=(2, None), dtype=numpy.complex128) <= 1e-15


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


# --- algebra for variational methods ------------------------------------------------------------

def test_sums_differences_scalings_and_diagonals(comm):
    from mpisphere import Diagonal, Identity, Transpose, split_sizes
    p, r = comm.Get_size(), comm.Get_rank()
    layout = Layout(DISTRIBUTED, comm)
    local = rank_rng(comm, seed=12)
    weights = local.uniform(1.0, 2.0, (3, 4))
    D, I = Diagonal(weights, layout), Identity(layout, core=(3, 4))
    x = local.standard_normal((2, 3, 4))
    numpy.testing.assert_array_equal(D.forward(x), weights * x)
    numpy.testing.assert_array_equal((D + I).forward(x), weights * x + x)
    numpy.testing.assert_array_equal((D - 2.5 * I).forward(x), weights * x - 2.5 * x)
    numpy.testing.assert_array_equal((-D).adjoint(x), -weights * x)
    hessian = D + 0.5 * (D @ D)  # B^-1 + H^T R^-1 H shaped
    for op in (D, I, D + I, D - I, 3 * D, hessian, hessian.H):
        assert dottest(op, lead=(2,)) <= 1e-15, op.name
    T = Transpose(comm, axes=(0, 1), extents=(p, 2 * p))
    spread = T.H @ Diagonal(local.uniform(1, 2, (split_sizes(p, p)[r], 2 * p)), Layout(DISTRIBUTED, comm)) @ T
    y = local.standard_normal((p, split_sizes(2 * p, p)[r]))
    assert dottest(spread + T.H @ T, y) <= 1e-15


def test_algebra_checks_layouts(comm):
    from mpisphere import Diagonal, Identity
    with raises(ValueError, match=r"cannot add Diagonal and Identity: their domains are "
                                         r"Layout\('distributed'.* and Layout\('replicated'.*; replicated arrays "
                                         r"cannot be used as distributed"):
        Diagonal(numpy.ones(2), Layout(DISTRIBUTED, comm)) + Identity(Layout(REPLICATED, comm))
    with raises(TypeError, match="Diagonal: weights must be real, got complex128"):
        Diagonal(numpy.ones(2, complex), Layout(DISTRIBUTED, comm))
    with raises(TypeError):
        Identity(Layout(DISTRIBUTED, comm)) * "2"


class Forgetful(LinearOperator):
    """A custom operator that forgets to set its layouts."""

    def _forward(self, x, out):
        return x

    def _adjoint(self, y, out):
        return y


class Halfway(LinearOperator):
    """A custom operator without an adjoint."""

    def __init__(self, comm):
        self.domain = self.range = Layout(DISTRIBUTED, comm)

    def _forward(self, x, out):
        return 2 * x


def test_custom_operators_that_forget_something_get_clear_errors(comm):
    with raises(TypeError, match=r"Forgetful.domain is None: a LinearOperator must set domain and range to "
                                        r"Layouts in its __init__"):
        Forgetful().forward(numpy.ones(2))
    with raises(TypeError, match="Forgetful.domain is None"):
        Scale(comm, broken=False) @ Forgetful()
    with raises(TypeError, match=r"Halfway defines no _adjoint\(y, out\)"):
        Halfway(comm).adjoint(numpy.ones(2))
    numpy.testing.assert_array_equal(Halfway(comm).forward(numpy.ones(2)), 2.0)


# --- out= aliasing, by memory overlap -----------------------------------------------------------

def test_out_overlapping_the_input_is_refused_also_through_a_composition(comm):
    from mpisphere import CopyTo, ReduceFrom
    x = numpy.ones((3, 4))
    with raises(ValueError, match="out overlaps the input"):
        (ReduceFrom(comm) @ CopyTo(comm)).forward(x, out=x)
    with raises(ValueError, match="out overlaps the input"):
        CopyTo(comm).forward(x, out=x[::-1])


def test_interleaved_views_that_share_no_element_are_accepted(comm):
    from mpisphere import CopyTo
    big = numpy.arange(20.0).reshape(2, 10)
    CopyTo(comm).forward(big[:, :5], out=big[:, 5:])  # the same buffer, disjoint elements
    numpy.testing.assert_array_equal(big[:, 5:], big[:, :5])
    strided = numpy.arange(12.0)
    CopyTo(comm).forward(strided[0::2], out=strided[1::2])  # interleaved
    numpy.testing.assert_array_equal(strided[1::2], strided[0::2])


def test_out_must_be_a_writable_array(comm):
    from mpisphere import CopyTo
    with raises(TypeError, match="out must be a NumPy or CuPy array, got list"):
        CopyTo(comm).forward(numpy.ones(2), out=[0.0, 0.0])
    out = numpy.zeros(2)
    out.flags.writeable = False
    with raises(ValueError, match="out is read-only"):
        CopyTo(comm).forward(numpy.ones(2), out=out)


class LateFinding(LinearOperator):
    """An operator of the full protocol whose run finds a problem after the agreement (a defect of its own)."""

    def __init__(self, comm):
        self.domain = self.range = Layout(DISTRIBUTED, comm)
        self._comm = comm

    def _output(self, direction, spec):
        return spec, spec.describe()

    def _run(self, direction, x, out, context):
        raise InputError("this rank found a problem while running", TypeError)


def test_a_finding_raised_while_running_reaches_the_caller_as_the_exception_it_names(comm):
    """``InputError`` is mpisphere's record of a finding: the caller sees its TypeError/ValueError, never the record."""
    with raises(TypeError, match="LateFinding.forward: this rank found a problem while running") as found:
        LateFinding(comm).forward(numpy.ones(3))
    assert type(found.value) is TypeError and not isinstance(found.value, InputError)
