"""SpectralConvS2 and QuadratureS2: rank-independent results, exact adjoints, gradients by linearity."""

import math

import numpy
import pytest
from mpi4py import MPI

from mpisphere import ProcessGrid, QuadratureS2, SpectralConvS2, dottest
from mpisphere.quadrature import latitudes
from mpisphere.spectral_convolution import spectral_truncation

from helpers import raises

pytestmark = pytest.mark.mpi


def real_inner(a, b):
    return float(numpy.sum((numpy.conj(a) * b).real))


def parameters(rng, groups, c_in, c_out, lmax, bias):
    w = rng.standard_normal((groups, c_in // groups, c_out // groups, lmax, 2)) @ [1, 1j]
    b = rng.standard_normal((1, c_in, lmax, lmax, 2)) @ [1, 1j] if bias else None
    return w, b


@pytest.mark.parametrize("shapes", [((12, 24), (12, 24)), ((16, 32), (9, 18))], ids=["same", "down"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_same_result_on_every_grid_and_the_gradients(grid, shapes, bias, rng):
    in_shape, out_shape = shapes
    lmax = spectral_truncation(in_shape, out_shape, "equiangular", "legendre-gauss")
    w, b = parameters(rng, 2, 4, 6, lmax, bias)
    x = rng.standard_normal((3, 4) + in_shape)
    y_bar = rng.standard_normal((3, 6) + out_shape)
    op = SpectralConvS2(grid, in_shape, out_shape, w, bias=b, quadrature_out="legendre-gauss")
    y = grid.gather(op.forward(grid.scatter(x)))
    x_bar, w_bar, b_bar = op.gradients(grid.scatter(x), grid.scatter(y_bar))
    x_bar = grid.gather(x_bar)
    with ProcessGrid(MPI.COMM_SELF) as serial:
        one = SpectralConvS2(serial, in_shape, out_shape, w, bias=b, quadrature_out="legendre-gauss")
        expected = one.forward(x)
        adjoint = one.adjoint(y_bar)
        loss = real_inner(y_bar, expected)
        d = parameters(rng, 2, 4, 6, lmax, False)[0]
        one.weight = d
        along_d = real_inner(y_bar, one.forward(x))   # linear in W for a fixed bias
        one.weight, one.bias = w, None
        no_bias = real_inner(y_bar, one.forward(x))   # and affine in the bias
    assert w_bar.shape == w.shape and (b_bar is None) == (not bias)
    if grid.rank == 0:
        scale = numpy.abs(expected).max()
        assert numpy.abs(y - expected).max() <= 1e-12 * scale
        assert numpy.abs(x_bar - adjoint).max() <= 1e-12 * numpy.abs(adjoint).max()
        assert abs(real_inner(w_bar, d) - along_d) <= 1e-11 * numpy.abs(y_bar).sum() * scale
        if bias:
            assert abs(real_inner(b_bar, b) - (loss - no_bias)) <= 1e-11 * numpy.abs(y_bar).sum() * scale


def test_dot_test(grid, rng):
    lmax = spectral_truncation((13, 24), (13, 24))
    w, b = parameters(rng, 1, 2, 3, lmax, True)
    op = SpectralConvS2(grid, (13, 24), (13, 24), w, bias=b)
    assert dottest(op, lead=(2,)) <= 1e-13


@pytest.mark.parametrize("quadrature", ["equiangular", "legendre-gauss", "lobatto"])
@pytest.mark.parametrize("normalize", [False, True])
def test_quadrature_integrates_the_sphere_and_its_adjoint(grid, quadrature, normalize, rng):
    nlat, nlon = 13, 20
    op = QuadratureS2(grid, (nlat, nlon), quadrature, normalize)
    theta, _ = latitudes(nlat, quadrature)
    lon = 2 * math.pi * numpy.arange(nlon) / nlon
    # 1 + cos(theta)^2 sin(lon)^2 integrates to 4 pi + 2 pi / 3 (exact for every rule here)
    field = 1 + numpy.cos(theta)[:, None] ** 2 * numpy.sin(lon)[None, :] ** 2
    value = op.forward(grid.scatter(numpy.stack([field, 2 * field])))
    exact = (4 * math.pi + 2 * math.pi / 3) / (4 * math.pi if normalize else 1)
    numpy.testing.assert_allclose(value, [exact, 2 * exact], rtol=1e-13)
    assert dottest(op, lead=(2, 3)) <= 1e-13


def test_misuse_is_refused(grid, rng):
    lmax = spectral_truncation((12, 24), (12, 24))
    with raises(ValueError, match=f"weight must be .*lmax={lmax}"):
        SpectralConvS2(grid, (12, 24), (12, 24), numpy.ones((1, 2, 2, lmax + 1), complex))
    op = SpectralConvS2(grid, (12, 24), (12, 24), parameters(rng, 1, 2, 2, lmax, False)[0])
    if grid.size > 1:
        with raises(ValueError, match="got the whole 12 x 24 field where this rank's tile belongs"):
            op.forward(numpy.zeros((1, 2, 12, 24)))
    with raises(TypeError, match="expected float64, got float32"):
        op.forward(numpy.zeros((1, 2) + grid.local_shape(12, 24), numpy.float32))
