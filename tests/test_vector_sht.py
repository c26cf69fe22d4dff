"""Distributed vector SHT: against torch-harmonics' formulas, closed forms, round trips, adjoints."""

import math
import re

import numpy
import pytest
from mpi4py import MPI

import mpisphere
from mpisphere import DistributedInverseRealVectorSHT, DistributedRealVectorSHT, ProcessGrid, dottest
from mpisphere.quadrature import latitudes

from helpers import block, raises, random_array, tile, whole_message

pytestmark = pytest.mark.mpi

special = pytest.importorskip("scipy.special")
import vector_reference as reference  # noqa: E402  (needs scipy)

QUADRATURES = ["equiangular", "legendre-gauss", "lobatto"]


@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("norm", ["ortho", "schmidt", "four-pi"])
@pytest.mark.parametrize("csphase", [True, False])
def test_forward_and_inverse_match_torch_harmonics_formulas(grid, rng, quadrature, norm, csphase):
    nlat, nlon = 17, 32  # uneven over 2 and 3 ranks both ways
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature=quadrature, norm=norm, csphase=csphase)
    ivsht = DistributedInverseRealVectorSHT(grid, nlat, nlon, quadrature=quadrature, norm=norm, csphase=csphase)
    assert (vsht.lmax, vsht.mmax) == mpisphere.truncate_sht(nlat, nlon, quadrature=quadrature)
    theta, w = latitudes(nlat, quadrature)
    field = rng.standard_normal((2, 2, nlat, nlon))
    expected = reference.forward(field, vsht.lmax, vsht.mmax, theta, w, norm, csphase)
    got = vsht.forward(tile(field, grid))
    assert got.shape == (2, 2) + vsht.block_shape
    numpy.testing.assert_allclose(got, block(expected, grid, vsht.lmax, vsht.mmax), rtol=0,
                                  atol=1e-13 * abs(expected).max())
    coeffs = random_array(rng, (2, 2, vsht.lmax, vsht.mmax), numpy.complex128)
    expected = reference.inverse(coeffs, nlat, nlon, theta, norm, csphase)
    got = ivsht.forward(block(coeffs, grid, vsht.lmax, vsht.mmax))
    numpy.testing.assert_allclose(got, tile(expected, grid), rtol=0, atol=1e-13 * abs(expected).max())


@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("dtype, rtol", [(numpy.float64, 1e-12), (numpy.float32, 1e-5)], ids=["float64", "float32"])
def test_dottests(grid, quadrature, dtype, rtol):
    for cls in (DistributedRealVectorSHT, DistributedInverseRealVectorSHT):
        op = cls(grid, 19, 33, quadrature=quadrature, dtype=dtype)
        real, complex_ = numpy.dtype(dtype), numpy.result_type(dtype, numpy.complex64)
        x_dtype = complex_ if cls is DistributedInverseRealVectorSHT else real
        assert dottest(op, lead=(3,), dtype=x_dtype, rtol=rtol) <= rtol
        assert dottest(op.H, lead=(2,), dtype=real if x_dtype == complex_ else complex_, rtol=rtol) <= rtol


def test_gradient_of_a_harmonic_is_purely_spheroidal(grid):
    """grad(Y(l, m) + conj) has coefficient 1 at (l, m) in component 0 and nothing else (torch-harmonics' order)."""
    nlat, nlon = 24, 48
    theta, _ = latitudes(nlat, "legendre-gauss")
    phi = 2 * numpy.pi * numpy.arange(nlon) / nlon
    T, P = numpy.meshgrid(theta, phi, indexing="ij")
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    modes = [(1, 0), (3, 0), (5, 2), (7, 7), (12, 5)]
    fields, expected = [], numpy.zeros((len(modes), 2, vsht.lmax, vsht.mmax), complex)
    for i, (l, m) in enumerate(modes):
        y, jac = special.sph_harm_y(l, m, T, P, diff_n=1)
        k = 1 if m == 0 else 2  # the real field c Y + conj with c = 1
        fields.append(numpy.stack([k * jac[..., 0].real, k * (1j * m * y / numpy.sin(T)).real]))
        expected[i, 0, l, m] = 1.0
    got = vsht.forward(tile(numpy.array(fields), grid))
    numpy.testing.assert_allclose(got, block(expected, grid, vsht.lmax, vsht.mmax), rtol=0, atol=1e-13)


@pytest.mark.parametrize("quadrature", QUADRATURES)
def test_solid_body_rotation_is_purely_toroidal(grid, quadrature):
    """u_phi = omega sin(theta): component 1 at (1, 0) is omega sqrt(4 pi / 3), the coefficient of cos(theta)."""
    nlat, nlon = 21, 40
    theta, _ = latitudes(nlat, quadrature)
    omega = 0.7
    field = numpy.zeros((2, nlat, nlon))
    field[1] = omega * numpy.sin(theta)[:, None]
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature=quadrature)
    expected = numpy.zeros((2, vsht.lmax, vsht.mmax), complex)
    expected[1, 1, 0] = omega * math.sqrt(4 * math.pi / 3)
    numpy.testing.assert_allclose(vsht.forward(tile(field, grid)), block(expected, grid, vsht.lmax, vsht.mmax),
                                  rtol=0, atol=1e-13)
    back = DistributedInverseRealVectorSHT(grid, nlat, nlon, quadrature=quadrature).forward(
        block(expected, grid, vsht.lmax, vsht.mmax))
    numpy.testing.assert_allclose(back, tile(field, grid), rtol=0, atol=1e-13)


@pytest.mark.parametrize("quadrature", ["legendre-gauss", "lobatto"])
def test_round_trip_of_band_limited_vector_fields(grid, rng, quadrature):
    nlat, nlon = 20, 40
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature=quadrature)
    ivsht = DistributedInverseRealVectorSHT(grid, nlat, nlon, quadrature=quadrature)
    lmax, mmax = vsht.lmax, vsht.mmax
    keep = lmax - 1  # one degree below the truncation: the products the forward integrates stay exact
    c = random_array(rng, (3, 2, lmax, mmax), numpy.complex128)
    c *= numpy.tril(numpy.ones((lmax, mmax)))
    c[..., keep:, :] = 0
    c[..., 0, :] = 0                       # vector harmonics start at degree 1
    c[..., :, 0] = c[..., :, 0].real       # real fields: the m = 0 coefficients are real
    field = reference.inverse(c, nlat, nlon, latitudes(nlat, quadrature)[0])
    scale = abs(field).max()  # rounding is measured against the size of what is summed, never a cancelling sum
    got = vsht.forward(tile(field, grid))
    numpy.testing.assert_allclose(got, block(c, grid, lmax, mmax), rtol=0, atol=1e-13 * scale)
    numpy.testing.assert_allclose(ivsht.forward(got), tile(field, grid), rtol=0, atol=1e-13 * scale)


def test_every_grid_equals_the_single_rank_result(grid, rng):
    nlat, nlon = 29, 50
    field = rng.standard_normal((3, 2, nlat, nlon))
    with ProcessGrid(MPI.COMM_SELF) as serial:
        whole = DistributedRealVectorSHT(serial, nlat, nlon).forward(field)
        lmax, mmax = whole.shape[-2:]
        coeffs = random_array(rng, (3, 2, lmax, mmax), numpy.complex128)
        back = DistributedInverseRealVectorSHT(serial, nlat, nlon).forward(coeffs)
    got = DistributedRealVectorSHT(grid, nlat, nlon).forward(tile(field, grid))
    numpy.testing.assert_allclose(got, block(whole, grid, lmax, mmax), rtol=0, atol=1e-13 * abs(whole).max())
    got = DistributedInverseRealVectorSHT(grid, nlat, nlon).forward(block(coeffs, grid, lmax, mmax))
    numpy.testing.assert_allclose(got, tile(back, grid), rtol=0, atol=1e-13 * abs(back).max())
    assert grid.gather(block(coeffs, grid, lmax, mmax)) is None or grid.rank == 0


def test_a_single_vector_field_on_many_ranks_keeps_its_components_together(grid, rng):
    """One field (a batch smaller than the grid) is padded inside; its two components never split."""
    nlat, nlon = 13, 24
    vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    field = rng.standard_normal((2, nlat, nlon))
    got = vsht.forward(tile(field, grid))
    assert got.shape == (2,) + vsht.block_shape
    with ProcessGrid(MPI.COMM_SELF) as serial:
        whole = DistributedRealVectorSHT(serial, nlat, nlon, quadrature="legendre-gauss").forward(field)
    numpy.testing.assert_allclose(got, block(whole, grid, vsht.lmax, vsht.mmax), atol=1e-13 * abs(whole).max())
    assert vsht.domain_shape(()) == (2,) + vsht.tile_shape and vsht.range_shape((4,)) == (4, 2) + vsht.block_shape


def test_vector_input_checks(grid):
    vsht = DistributedRealVectorSHT(grid, 13, 24)
    with raises(ValueError) as caught:
        vsht.forward(numpy.zeros((3,) + vsht.tile_shape))
    assert re.search(r"expected \(2, \d+, \d+\) \(2 components first\)", whole_message(caught.value))
    # one signature for the four transforms: the quadrature may come by position, as torch-harmonics takes it
    assert DistributedRealVectorSHT(grid, 13, 24, None, None, "legendre-gauss").quadrature == "legendre-gauss"


@pytest.mark.parametrize("block_bytes", [1, 3000])
def test_degree_coupling_in_blocks_gives_the_same_result(grid, monkeypatch, block_bytes):
    """The coupling runs in blocks of degree rows (and of orders, when a row is over the size) on the host; any
    block size gives the same numbers, through the caller's layout as through the pipeline's."""
    from mpisphere.sht.coupling import VectorCoupling
    nlat, nlon = 21, 40
    whole = {}
    for label, size in (("one block", 1 << 40), ("blocks", block_bytes)):
        monkeypatch.setattr(VectorCoupling, "_HOST_BLOCK_BYTES", size)
        vsht = DistributedRealVectorSHT(grid, nlat, nlon, quadrature="legendre-gauss")
        ivsht = DistributedInverseRealVectorSHT(grid, nlat, nlon, quadrature="legendre-gauss")
        x = numpy.random.default_rng(11 + grid.rank).standard_normal((3, 2) + vsht.tile_shape)
        c = vsht.forward(x)
        whole[label] = (c, vsht.adjoint(c), ivsht.forward(c), ivsht.adjoint(x))
    # the same element-wise operations (equal to the last bit here); SIMD loops may round complex products
    # differently at another alignment, so allow rounding on each output's scale
    for a, b in zip(whole["one block"], whole["blocks"]):
        assert abs(a - b).max() <= 16 * numpy.finfo(float).eps * abs(a).max()


@pytest.mark.mpi
def test_the_component_slots_hold_what_the_docs_say(grid):
    """Fed ``(u, v)`` (eastward, northward), slot 0 is the rotational part and slot 1 the divergent part.

    The same transform read as torch-harmonics' docstring reads it: fed the
    (colatitude, longitude) components ``(-v, u)``, slot 0 is spheroidal
    (divergent) and slot 1 toroidal (rotational). A solid-body rotation is
    purely rotational, the gradient of a scalar purely divergent.
    """
    vsht = DistributedRealVectorSHT(grid, 24, 48, quadrature="legendre-gauss")
    lat = math.pi / 2 - vsht.local_colatitudes[:, None]
    ones = numpy.ones((1, len(vsht.local_longitudes)))
    rotation = numpy.stack([numpy.cos(lat) * ones, 0.0 * ones * lat])        # u = cos(lat), v = 0
    gradient = numpy.stack([0.0 * ones * lat, numpy.cos(lat) * ones])        # grad sin(lat): v = cos(lat)
    largest = {}
    for name, wind in (("rotation (u, v)", rotation), ("gradient (u, v)", gradient),
                       ("rotation (theta, phi)", numpy.stack([-rotation[1], rotation[0]])),
                       ("gradient (theta, phi)", numpy.stack([-gradient[1], gradient[0]]))):
        c = vsht.forward(wind)
        largest[name] = [grid.cart.allreduce(float(abs(c[k]).max()) if c[k].size else 0.0, op=MPI.MAX)
                         for k in (0, 1)]
    # rounding: every coefficient sums at most nlat * nlon terms of size <= 1 times weights summing to ~4 pi
    bound = 1e-12
    assert largest["rotation (u, v)"][0] > 1.0 and largest["rotation (u, v)"][1] <= bound, largest
    assert largest["gradient (u, v)"][1] > 1.0 and largest["gradient (u, v)"][0] <= bound, largest
    assert largest["rotation (theta, phi)"][1] > 1.0 and largest["rotation (theta, phi)"][0] <= bound, largest
    assert largest["gradient (theta, phi)"][0] > 1.0 and largest["gradient (theta, phi)"][1] <= bound, largest

    # and through mpisphere.calculus: the vorticity of u = cos(lat) on the unit sphere is 2 sin(lat)
    isht = mpisphere.DistributedInverseRealSHT(grid, 24, 48, quadrature="legendre-gauss")
    vrtdiv = mpisphere.calculus.uv_to_vrtdiv(vsht, radius=1.0).forward(rotation)
    vorticity, divergence = isht.forward(numpy.ascontiguousarray(vrtdiv[0])), isht.forward(
        numpy.ascontiguousarray(vrtdiv[1]))
    assert abs(vorticity - 2.0 * numpy.sin(lat) * ones).max() <= 1e-11
    assert abs(divergence).max() <= 1e-11
