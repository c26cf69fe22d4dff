"""Spectral calculus on coefficient blocks: closed forms on every grid, dot tests."""

import numpy
import pytest

from mpisphere import (DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedRealVectorSHT, calculus, dottest, latitudes)

from helpers import raises, tile

pytestmark = pytest.mark.mpi

special = pytest.importorskip("scipy.special")

NLAT, NLON, RADIUS = 24, 48, 6.37122e6
RULE = "legendre-gauss"


def harmonic(l, m):
    """The real field Y(l, m) + conj on the grid, and its gradient (u, v) on a sphere of RADIUS."""
    theta, _ = latitudes(NLAT, RULE)
    phi = 2 * numpy.pi * numpy.arange(NLON) / NLON
    T, P = numpy.meshgrid(theta, phi, indexing="ij")
    y, jac = special.sph_harm_y(l, m, T, P, diff_n=1)
    k = 1 if m == 0 else 2
    field = k * y.real
    # eastward u = d/dlambda / (a sin theta); northward v = -d/dtheta / a
    u = k * (1j * m * y).real / (RADIUS * numpy.sin(T))
    v = -k * jac[..., 0].real / RADIUS
    return field, numpy.stack([u, v])


@pytest.fixture
def transforms(grid):
    return (DistributedRealSHT(grid, NLAT, NLON, quadrature=RULE),
            DistributedInverseRealSHT(grid, NLAT, NLON, quadrature=RULE),
            DistributedRealVectorSHT(grid, NLAT, NLON, quadrature=RULE),
            DistributedInverseRealVectorSHT(grid, NLAT, NLON, quadrature=RULE))


def test_laplacian_of_harmonics_and_its_inverse(grid, transforms):
    sht, isht, _, _ = transforms
    for l, m in ((0, 0), (1, 0), (4, 3), (9, 9)):
        field, _ = harmonic(l, m)
        c = sht.forward(tile(field, grid))
        lap = calculus.laplacian(sht, RADIUS).forward(c)
        # a diagonal scaling: every entry is its own degree's factor times the entry
        degree = sht.local_degrees[:, None]
        numpy.testing.assert_array_equal(lap, (-degree * (degree + 1.0) / RADIUS ** 2) * c)
        # and a harmonic of degree l is an eigenvector: the other entries are rounding of the transform
        assert abs(lap + l * (l + 1) / RADIUS ** 2 * c).max() <= 1e-13 * 200 / RADIUS ** 2
        back = calculus.inverse_laplacian(sht, RADIUS).forward(lap)
        # entry by entry the inverse undoes the scaling (two roundings), except at l = 0, which it zeroes;
        # the bound is per entry, so the transform's rounding in c cannot make it pass or fail
        expected = numpy.where(degree > 0, c, 0)
        assert (abs(back - expected) <= 4 * numpy.finfo(float).eps * abs(expected)).all()


def test_winds_vorticity_and_divergence(grid, transforms):
    sht, isht, vsht, ivsht = transforms
    theta, _ = latitudes(NLAT, RULE)
    lat = numpy.pi / 2 - theta
    u0 = 20.0
    rotation = numpy.zeros((2, NLAT, NLON))
    rotation[0] = u0 * numpy.cos(lat)[:, None]  # eastward solid-body rotation
    vrtdiv = calculus.uv_to_vrtdiv(vsht, RADIUS).forward(tile(rotation, grid))
    vorticity = isht.forward(vrtdiv[0])
    numpy.testing.assert_allclose(vorticity, tile(numpy.broadcast_to(2 * u0 / RADIUS * numpy.sin(lat)[:, None],
                                                                     (NLAT, NLON)), grid), rtol=0, atol=1e-17)
    assert abs(isht.forward(vrtdiv[1])).max() < 1e-19
    numpy.testing.assert_allclose(calculus.vrtdiv_to_uv(ivsht, RADIUS).forward(vrtdiv), tile(rotation, grid),
                                  rtol=0, atol=1e-12 * u0)
    # a gradient: no vorticity, divergence the Laplacian of the potential
    field, wind = harmonic(6, 2)
    vrtdiv = calculus.uv_to_vrtdiv(vsht, RADIUS).forward(tile(wind, grid))
    c = sht.forward(tile(field, grid))
    numpy.testing.assert_allclose(vrtdiv[1], -42 / RADIUS ** 2 * c, rtol=0, atol=1e-12 * 42 / RADIUS ** 2)
    assert abs(vrtdiv[0]).max() < 1e-12 * 42 / RADIUS ** 2


def test_gradient_of_a_scalar(grid, transforms):
    sht, _, _, ivsht = transforms
    for l, m in ((1, 0), (5, 2), (11, 7)):
        field, wind = harmonic(l, m)
        got = calculus.gradient(ivsht, RADIUS).forward(sht.forward(tile(field, grid)))
        numpy.testing.assert_allclose(got, tile(wind, grid), rtol=0, atol=1e-12 * abs(wind).max())


def test_filters(grid, transforms):
    sht = transforms[0]
    l = sht.local_degrees[:, None]
    c = numpy.ones((2,) + sht.block_shape, complex)
    dt = 300.0
    expected = numpy.exp(-dt / 2 / 3600.0 * (l * (l + 1) / ((sht.lmax - 1) * sht.lmax)) ** 4)
    numpy.testing.assert_allclose(calculus.hyperdiffusion(sht, dt).forward(c), expected * c, rtol=1e-15)
    numpy.testing.assert_array_equal(calculus.truncation(sht, 10).forward(c), (l < 10) * c)
    numpy.testing.assert_array_equal(calculus.spectral_filter(sht, numpy.arange(sht.lmax)).forward(c), l * c)
    with raises(ValueError, match=rf"expected one factor per degree, shape \({sht.lmax},\), got \(3,\)"):
        calculus.spectral_filter(sht, numpy.ones(3))


def test_dottests(grid, transforms):
    sht, isht, vsht, ivsht = transforms
    complex_block = numpy.complex128
    for op, dtype in ((calculus.laplacian(sht, RADIUS), complex_block),
                      (calculus.inverse_laplacian(sht, RADIUS), complex_block),
                      (calculus.hyperdiffusion(sht, 300.0), complex_block),
                      (calculus.uv_to_vrtdiv(vsht, RADIUS), numpy.float64),
                      (calculus.vrtdiv_to_uv(ivsht, RADIUS), complex_block),
                      (calculus.gradient(ivsht, RADIUS), complex_block)):
        assert dottest(op, lead=(2,), dtype=dtype, rtol=1e-12) <= 1e-12, op.name


def test_vector_operators_state_both_components_in_their_shapes(grid):
    """Issue 25: the winds' operators' shape contract holds the component axis, so dottest can draw points."""
    from mpisphere import DistributedInverseRealVectorSHT, DistributedRealVectorSHT, dottest
    vsht = DistributedRealVectorSHT(grid, 13, 10)
    ivsht = DistributedInverseRealVectorSHT(grid, 13, 10)
    to_uv = calculus.vrtdiv_to_uv(ivsht, 2.0)
    assert to_uv.domain_shape((3,)) == (3, 2) + tuple(ivsht.block_shape)
    assert calculus.uv_to_vrtdiv(vsht, 2.0).range_shape((3,)) == (3, 2) + tuple(vsht.block_shape)
    assert dottest(to_uv, lead=(3,), dtype=numpy.complex128) <= 1e-12
