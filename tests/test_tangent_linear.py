"""The shallow-water model's tangent-linear and adjoint: exact adjoint, the model's derivative, grid-independent.

The three fields of the state differ by ten orders of magnitude (geopotential
~1e5 m^2/s^2, vorticity ~1e-5 1/s), so an inner product of raw states sees
the geopotential only. The dot tests run on the scaled operator
``S^-1 M S`` with ``S`` a diagonal of typical perturbation sizes per field
(``S`` real and diagonal: its adjoint is itself), so each field weighs the
same, and with ``y = S^-1 M S x``, so ``<M x, y>`` is a sum of squares that
cannot cancel; ``dottest``'s measure is independent of summation order.
"""

import math

import numpy
import pytest
from mpi4py import MPI

from mpisphere import DISTRIBUTED, Diagonal, Layout, LinearOperator, ProcessGrid, dottest
from mpisphere.examples import ShallowWaterSolver

from helpers import raises

pytestmark = pytest.mark.mpi

NLAT, NLON, DT = 32, 64, 600.0
SIZES = (1e2, 1e-5, 1e-6)  # typical perturbations: geopotential (m^2/s^2), vorticity, divergence (1/s)


def make_solver(grid):
    return ShallowWaterSolver(grid, NLAT, NLON, dt=DT, quadrature="legendre-gauss")


def field_scales(swe):
    """``S``: per-field sizes on this rank's block, zero above the triangle (orders beyond the degree)."""
    return numpy.array(SIZES)[:, None, None] * swe.triangle


def scaled(swe, model):
    """``S^-1 M S``, each field of comparable size."""
    s = field_scales(swe)
    layout = Layout(DISTRIBUTED, swe.grid.cart)
    inverse = numpy.divide(1.0, s, out=numpy.zeros_like(s), where=s > 0)
    return Diagonal(inverse, layout) @ model @ Diagonal(s, layout)


def unit_perturbation(swe, seed):
    """A random perturbation of unit size per coefficient (in scaled units), the same field on every grid."""
    rng = numpy.random.default_rng(seed)
    shape = (3, swe.lmax, swe.mmax)
    whole = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    whole[:, :, 0] = whole[:, :, 0].real  # a real field's m = 0 coefficients are real
    block = whole[:, swe.sht.local_degrees][:, :, swe.sht.local_orders]
    return block * swe.triangle


def scaled_norm(swe, state):
    s = field_scales(swe)
    local = float(numpy.sum(numpy.abs(numpy.divide(state, s, out=numpy.zeros_like(state), where=s > 0)) ** 2))
    return math.sqrt(swe.grid.cart.allreduce(local, op=MPI.SUM))


@pytest.mark.parametrize("nsteps", [1, 5, 20])
def test_adjoint_is_exact(grid, nsteps):
    swe = make_solver(grid)
    model = scaled(swe, swe.linearize(swe.galewsky_initial_condition(), nsteps))
    x = unit_perturbation(swe, 1)
    y = model.forward(x)
    assert dottest(model, x, y, rtol=1e-11) <= 1e-11


class _PlantedError(LinearOperator):
    """The model with a relative error ``size`` in one field of its adjoint's output."""

    def __init__(self, model, field, size):
        self.model, self.field, self.size = model, field, size
        self.domain, self.range = model.domain, model.range

    def _forward(self, x, out):
        return self.model.forward(x, out)

    def _adjoint(self, y, out):
        result = self.model.adjoint(y, out)
        result[self.field] *= 1 + self.size
        return result


@pytest.mark.parametrize("field", [0, 1, 2], ids=["geopotential", "vorticity", "divergence"])
def test_a_planted_error_of_1e_7_in_the_adjoint_is_caught(grid, field):
    swe = make_solver(grid)
    model = scaled(swe, swe.linearize(swe.galewsky_initial_condition(), 5))
    x = unit_perturbation(swe, 2)
    y = model.forward(x)
    exact = dottest(model, x, y, rtol=1.0)  # rtol=1: return the measure, do not raise
    planted = dottest(_PlantedError(model, field, 1e-7), x, y, rtol=1.0)
    assert exact <= 1e-11 < planted, f"exact adjoint {exact:.1e}, with the planted error {planted:.1e}"


def test_taylor_the_tangent_linear_is_the_derivative_of_the_model(grid):
    """``||model(u + e du) - model(u) - e M du|| / ||e M du||`` falls like ``e`` over four decades."""
    nsteps = 20
    swe = make_solver(grid)
    u = swe.galewsky_initial_condition()
    model = swe.linearize(u, nsteps)
    du = unit_perturbation(swe, 3) * field_scales(swe)
    tl = model.forward(du)
    rows = []
    for e in (1e-2, 1e-3, 1e-4, 1e-5, 1e-6):
        residual = swe.timestep(u + e * du, nsteps) - model.final_state - e * tl
        rows.append((e, scaled_norm(swe, residual) / scaled_norm(swe, e * tl)))
    table = "\n".join(f"  e = {e:.0e}: {r:.3e}" for e, r in rows)
    drops = [a[1] / b[1] for a, b in zip(rows, rows[1:])]
    assert all(7 < d < 13 for d in drops), f"relative Taylor residual does not fall like e:\n{table}"
    assert rows[-1][1] < 1e-4, table


def test_final_state_is_the_model_run(grid):
    swe = make_solver(grid)
    u = swe.galewsky_initial_condition()
    numpy.testing.assert_array_equal(swe.linearize(u, 7).final_state, swe.timestep(u, 7))


def test_every_grid_gives_the_single_rank_tangent_linear(grid):
    swe = make_solver(grid)
    du = unit_perturbation(swe, 4) * field_scales(swe)
    model = swe.linearize(swe.galewsky_initial_condition(), 10)
    got = grid.gather(model.forward(du))
    back = grid.gather(model.adjoint(du))
    with ProcessGrid(MPI.COMM_SELF) as serial:
        alone = make_solver(serial)
        reference_model = alone.linearize(alone.galewsky_initial_condition(), 10)
        whole = unit_perturbation(alone, 4) * field_scales(alone)
        want, want_back = reference_model.forward(whole), reference_model.adjoint(whole)
    if grid.rank == 0:
        for f in range(3):
            assert abs(got[f] - want[f]).max() <= 1e-10 * abs(want[f]).max(), f"TL field {f}"
            assert abs(back[f] - want_back[f]).max() <= 1e-10 * abs(want_back[f]).max(), f"AD field {f}"


def test_batches_and_bad_input(grid):
    swe = make_solver(grid)
    model = swe.linearize(swe.galewsky_initial_condition(), 3)
    du = unit_perturbation(swe, 5) * field_scales(swe)
    both = model.forward(numpy.stack([du, 2 * du]))
    single = model.forward(du)
    for field in range(3):
        largest = abs(single[field]).max()
        numpy.testing.assert_allclose(both[0, field], single[field], rtol=0, atol=1e-12 * largest)
        numpy.testing.assert_allclose(both[1, field], 2 * single[field], rtol=0, atol=1e-12 * largest)
    assert model.nbytes() == 3 * 4 * 8 * math.prod(swe.sht.tile_shape)
    with raises(ValueError, match=r"TangentLinearModel.forward: .*expected this rank's block"):
        model.forward(du[:2])


def test_the_hand_linearised_products_have_an_exact_adjoint(grid):
    """The one piece of the tangent-linear model not made of the library's operators has its own dot test."""
    swe = make_solver(grid)
    model = swe.linearize(swe.galewsky_initial_condition(), 3)
    for products in model.products:
        assert dottest(products, lead=(2,), seed=5) <= 1e-13


def test_the_adjoint_model_is_made_of_the_operators_adjoints(grid):
    """The adjoint of each transform and calculus operator the tangent-linear model uses is its ``.H``."""
    import inspect

    from mpisphere.examples import tangent_linear

    source = inspect.getsource(tangent_linear.TangentLinearModel._jacobian_adjoint)
    for op in ("uv_to_vrtdiv", "laplacian", "sht", "isht", "vrtdiv_to_uv"):
        assert f"s.{op}.H.forward(" in source, op
    assert "adjoint(" not in source.replace("_jacobian_adjoint", "")  # no hand-written transform adjoints
