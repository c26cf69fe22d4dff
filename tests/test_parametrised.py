"""The parametrised operators' one base: named parameters set together, one description, one gradient sum."""

import numpy
import pytest

from mpisphere import DiscoConvS2, QuadratureS2, ResampleS2, SpectralConvS2
from mpisphere.operators import ParametrisedOperator
from mpisphere.spectral_convolution import spectral_truncation

pytestmark = pytest.mark.mpi


def operators(grid, rng):
    lmax = spectral_truncation((12, 24), (12, 24))
    return [DiscoConvS2(grid, (12, 24), (12, 24), (3,), rng.standard_normal((3, 2, 2)), bias=rng.standard_normal(3)),
            SpectralConvS2(grid, (12, 24), (12, 24), rng.standard_normal((1, 2, 3, lmax)) + 0j),
            ResampleS2(grid, (12, 24), (8, 16)), QuadratureS2(grid, (12, 24))]


def test_every_parametrised_operator_stands_on_the_base_and_returns_one_gradient_per_parameter(grid, rng):
    expected = [("weight", "bias"), ("weight", "bias"), (), ()]
    for op, names in zip(operators(grid, rng), expected):
        assert isinstance(op, ParametrisedOperator) and op.parameter_names == names
        x = grid.scatter(rng.standard_normal((2,) + ((2,) if names else ()) + (12, 24)))
        y = op.forward(x)
        found = op.gradients(x, y)
        assert len(found) == 1 + len(names) and found[0].shape == x.shape
        for name, g in zip(names, found[1:]):
            value = op.parameters[name]
            assert (g is None) == (value is None)
            if g is not None:   # the same on every rank, the parameter's shape and dtype
                assert g.shape == value.shape and g.dtype == value.dtype
                numpy.testing.assert_array_equal(numpy.array(grid.cart.allgather(g)), numpy.array([g] * grid.size))


def test_the_quadratures_gradient_is_its_adjoint(grid, rng):
    op = QuadratureS2(grid, (12, 24))
    x = grid.scatter(rng.standard_normal((3, 12, 24)))
    y_bar = rng.standard_normal(3)
    numpy.testing.assert_array_equal(op.gradients(x, y_bar)[0], op.adjoint(y_bar))


def test_parameters_are_checked_together_before_any_is_set(grid, rng):
    op = operators(grid, rng)[0]
    before = {name: value.copy() for name, value in op.parameters.items()}
    text = op.describe_parameters()
    with pytest.raises(ValueError, match=r"DiscoConvS2: bias must be \(out_channels=3,\) or None, got shape \(4,\)"):
        op.set_parameters(weight=2 * before["weight"], bias=numpy.zeros(4))
    with pytest.raises(ValueError, match="DiscoConvS2: no parameter named scale; its parameters are weight, bias"):
        op.set_parameters(scale=1.0)
    for name, value in op.parameters.items():
        numpy.testing.assert_array_equal(value, before[name])
    assert op.describe_parameters() == text
    assert text.startswith("weight='(3, 2, 2) float64 ") and ", bias='(3,) float64" in text
    op.set_parameters(bias=None)
    assert op.bias is None and op.linear and op.describe_parameters().endswith(", bias=None")
    with pytest.raises(ValueError, match="QuadratureS2: no parameter named weight; its parameters are none"):
        operators(grid, rng)[3].set_parameters(weight=numpy.ones(1))
