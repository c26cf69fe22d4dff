"""Distributed SHT: against a serial reference built on scipy.special, round trips, adjoints."""

import math
import sys
import re

import numpy
import pytest
from mpi4py import MPI

import mpisphere
from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, ProcessGrid, config, dottest
from mpisphere.partition import chunk_slice
from mpisphere.quadrature import latitudes

from helpers import block, every_rank, raises, random_array, rank_rng, tile, whole_message

pytestmark = pytest.mark.mpi

special = pytest.importorskip("scipy.special")

QUADRATURES = ["equiangular", "legendre-gauss", "lobatto"]
NORMS = ["ortho", "schmidt", "four-pi"]


# --- serial reference (independent of mpisphere.legendre) -------------------------------

def reference_table(lmax, mmax, theta, norm, csphase, inverse):
    """P[m, l, k] from scipy's orthonormal harmonics, scaled as torch-harmonics scales them."""
    table = numpy.zeros((mmax, lmax, len(theta)))
    for m in range(min(mmax, lmax)):
        for l in range(m, lmax):
            table[m, l] = special.sph_harm_y(l, m, theta, 0.0).real  # includes (-1)^m
            if not csphase and m % 2:
                table[m, l] *= -1
    if norm != "ortho":
        factor = numpy.sqrt(4 * numpy.pi) * numpy.ones(lmax)
        if norm == "schmidt":
            factor /= numpy.sqrt(2 * numpy.arange(lmax) + 1)
        table *= (1 / factor if inverse else factor)[None, :, None]
    return table


def reference_forward(field, lmax, mmax, quadrature, norm="ortho", csphase=True):
    nlat = field.shape[-2]
    theta, w = latitudes(nlat, quadrature)
    spectrum = 2 * numpy.pi * numpy.fft.rfft(field, axis=-1, norm="forward")[..., :mmax]
    # orders past the longitudes' nlon // 2 + 1 are zero (torch-harmonics pads them)
    spectrum = numpy.concatenate([spectrum, numpy.zeros(spectrum.shape[:-1] + (mmax - spectrum.shape[-1],))], -1)
    table = reference_table(lmax, mmax, theta, norm, csphase, inverse=False)
    return numpy.einsum("mlk,k,...km->...lm", table, w, spectrum)


def reference_inverse(coeffs, nlat, nlon, quadrature, norm="ortho", csphase=True):
    lmax, mmax = coeffs.shape[-2:]
    theta, _ = latitudes(nlat, quadrature)
    table = reference_table(lmax, mmax, theta, norm, csphase, inverse=True)
    spectrum = numpy.einsum("mlk,...lm->...km", table, coeffs)
    padded = numpy.zeros(spectrum.shape[:-1] + (nlon // 2 + 1,), complex)
    kept = min(mmax, nlon // 2 + 1)  # orders the longitudes cannot hold are dropped
    padded[..., :kept] = spectrum[..., :kept]
    return numpy.fft.irfft(padded, n=nlon, axis=-1, norm="forward")


def band_limited_coefficients(rng, shape, lmax, mmax, nlon):
    """Random coefficients of a real field: triangular, real at m = 0 (and at m = nlon/2)."""
    c = rng.standard_normal(shape + (lmax, mmax)) + 1j * rng.standard_normal(shape + (lmax, mmax))
    c *= numpy.tril(numpy.ones((lmax, mmax)))
    c[..., 0] = c[..., 0].real
    if nlon % 2 == 0 and mmax > nlon // 2:
        c[..., nlon // 2] = c[..., nlon // 2].real
    return c


def exact_lmax(nlat, quadrature):
    """Largest truncation whose products the rule integrates exactly (the round trip is then exact)."""
    degree = mpisphere.quadrature.exact_degree(nlat, quadrature)
    return degree // 2 + 1


# --- forward and inverse against the reference ------------------------------------------

@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("csphase", [True, False])
def test_forward_and_inverse_match_reference(grid, rng, quadrature, norm, csphase):
    nlat, nlon = 17, 32  # uneven over 2 and 3 polar ranks
    lmax, mmax = mpisphere.truncate_sht(nlat, nlon, quadrature=quadrature)
    field = rng.standard_normal((2, nlat, nlon))
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature=quadrature, norm=norm, csphase=csphase)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature=quadrature, norm=norm, csphase=csphase)
    assert (sht.lmax, sht.mmax) == (lmax, mmax)
    c = sht.forward(tile(field, grid))
    expected = reference_forward(field, lmax, mmax, quadrature, norm, csphase)
    numpy.testing.assert_allclose(c, block(expected, grid, lmax, mmax), rtol=0, atol=1e-12 * abs(expected).max())
    coeffs = rng.standard_normal((2, lmax, mmax)) + 1j * rng.standard_normal((2, lmax, mmax))
    x = isht.forward(block(coeffs, grid, lmax, mmax))
    expected = reference_inverse(coeffs, nlat, nlon, quadrature, norm, csphase)
    numpy.testing.assert_allclose(x, tile(expected, grid), rtol=0, atol=1e-12 * abs(expected).max())


@pytest.mark.parametrize("quadrature", QUADRATURES)
def test_round_trip_of_band_limited_fields(grid, rng, quadrature):
    nlat, nlon = 21, 40
    lmax = mmax = exact_lmax(nlat, quadrature)
    coeffs = band_limited_coefficients(rng, (3,), lmax, mmax, nlon)
    field = reference_inverse(coeffs, nlat, nlon, quadrature)
    sht = DistributedRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature=quadrature)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature=quadrature)
    c = sht.forward(tile(field, grid))
    numpy.testing.assert_allclose(c, block(coeffs, grid, lmax, mmax), rtol=0, atol=1e-12)
    back = isht.forward(c)
    numpy.testing.assert_allclose(back, tile(field, grid), rtol=0, atol=1e-12)


@pytest.mark.parametrize("quadrature", QUADRATURES)
def test_round_trip_at_default_truncation(grid, rng, quadrature):
    """At the default truncation (torch-harmonics 0.9's) the round trip of band-limited fields is exact."""
    nlat, nlon = 33, 64
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature=quadrature)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature=quadrature)
    lmax, mmax = sht.lmax, sht.mmax
    coeffs = band_limited_coefficients(rng, (2,), lmax, mmax, nlon)
    field = reference_inverse(coeffs, nlat, nlon, quadrature)
    x = isht.forward(block(coeffs, grid, lmax, mmax))
    numpy.testing.assert_allclose(x, tile(field, grid), atol=1e-12)
    numpy.testing.assert_allclose(isht.forward(sht.forward(x)), x, atol=1e-12)


@pytest.mark.parametrize("lead", [(), (1,), (2, 3)], ids=str)
def test_analytic_harmonics_are_unit_vectors(grid, lead):
    """Fields built from scipy.special.sph_harm_y come out as unit coefficient vectors.

    With an empty or unit batch the batch is smaller than the group sizes (padded inside).
    """
    nlat, nlon = 25, 48
    theta, _ = latitudes(nlat, "legendre-gauss")
    phi = 2 * numpy.pi * numpy.arange(nlon) / nlon
    lmax, mmax = 20, 20
    modes = [(0, 0), (3, 0), (5, 2), (7, 7), (12, 5), (19, 19), (19, 1)]
    count = int(numpy.prod(lead)) if lead else 1
    fields, expected = [], numpy.zeros((count, lmax, mmax), complex)
    for i in range(count):
        l, m = modes[i % len(modes)]
        y = special.sph_harm_y(l, m, theta[:, None], phi[None, :])
        fields.append(y.real if m == 0 else 2 * y.real)  # c e^{im phi} + conj, with c = 1
        expected[i, l, m] = 1.0
    field = numpy.array(fields).reshape(lead + (nlat, nlon))
    expected = expected.reshape(lead + (lmax, mmax))
    sht = DistributedRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature="legendre-gauss")
    c = sht.forward(tile(field, grid))
    assert c.shape == lead + sht.block_shape
    numpy.testing.assert_allclose(c, block(expected, grid, lmax, mmax), rtol=0, atol=1e-12)


def test_every_grid_equals_the_single_rank_result(grid, rng):
    nlat, nlon = 29, 50
    field = rng.standard_normal((4, nlat, nlon))
    lmax, mmax = mpisphere.truncate_sht(nlat, nlon)
    coeffs = rng.standard_normal((4, lmax, mmax)) * (1 + 0j)
    with ProcessGrid(MPI.COMM_SELF) as serial:
        c_serial = DistributedRealSHT(serial, nlat, nlon).forward(field)
        x_serial = DistributedInverseRealSHT(serial, nlat, nlon).forward(coeffs)
    sht = DistributedRealSHT(grid, nlat, nlon)
    isht = DistributedInverseRealSHT(grid, nlat, nlon)
    c = sht.forward(tile(field, grid))
    x = isht.forward(block(coeffs, grid, sht.lmax, sht.mmax))
    # reassemble the blocks on every rank and compare with the 1x1 result
    c_all = grid.cart.allgather(c)
    x_all = grid.cart.allgather(x)
    c_full = numpy.zeros_like(c_serial)
    x_full = numpy.zeros_like(x_serial)
    for r in range(grid.size):
        p, a = divmod(r, grid.nazimuth)
        c_full[..., chunk_slice(sht.lmax, grid.npolar, p), chunk_slice(sht.mmax, grid.nazimuth, a)] = c_all[r]
        lat, lon = grid.tile_slices(nlat, nlon, r)
        x_full[..., lat, lon] = x_all[r]
    numpy.testing.assert_allclose(c_full, c_serial, rtol=0, atol=1e-12 * abs(c_serial).max())
    numpy.testing.assert_allclose(x_full, x_serial, rtol=0, atol=1e-12 * abs(x_serial).max())


def test_block_indices_and_gathering_a_coefficient_block(grid, rng):
    """local_degrees/local_orders index the whole array; grid.gather assembles blocks as it does tiles."""
    nlat, nlon = 25, 48
    field = rng.standard_normal((2, nlat, nlon))
    with ProcessGrid(MPI.COMM_SELF) as serial:
        whole = DistributedRealSHT(serial, nlat, nlon, quadrature="legendre-gauss").forward(field)
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    c = sht.forward(tile(field, grid))
    own = whole[:, sht.local_degrees][:, :, sht.local_orders]
    numpy.testing.assert_allclose(c, own, rtol=0, atol=1e-12 * abs(whole).max())
    gathered = grid.gather(c)
    if grid.rank == 0:
        numpy.testing.assert_allclose(gathered, whole, rtol=0, atol=1e-12 * abs(whole).max())
    lat, lon = grid.local_slices(nlat, nlon)
    theta, _ = latitudes(nlat, "legendre-gauss")
    numpy.testing.assert_array_equal(sht.local_colatitudes, theta[lat])
    numpy.testing.assert_allclose(sht.local_longitudes, 2 * math.pi * numpy.arange(nlon)[lon] / nlon, rtol=0,
                                  atol=1e-15)


# --- adjoints ------------------------------------------------------------------------------

@pytest.mark.parametrize("quadrature", QUADRATURES)
@pytest.mark.parametrize("norm", ["ortho", "schmidt"])
@pytest.mark.parametrize("nlon", [32, 33])
def test_dottest(grid, quadrature, norm, nlon):
    nlat = 19
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature=quadrature, norm=norm)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature=quadrature, norm=norm)
    local = rank_rng(grid.cart)
    x = local.standard_normal((3,) + sht.tile_shape)
    c = random_array(local, (3,) + sht.block_shape, numpy.complex128)
    assert dottest(sht, x, c, rtol=1e-12) <= 1e-12
    assert dottest(isht, c, x, rtol=1e-12) <= 1e-12
    assert dottest(sht.H, c, x, rtol=1e-12) <= 1e-12


def test_adjoint_is_not_the_inverse(grid, rng):
    nlat, nlon = 17, 32
    sht = DistributedRealSHT(grid, nlat, nlon)
    isht = DistributedInverseRealSHT(grid, nlat, nlon)
    c = block(band_limited_coefficients(rng, (), sht.lmax, sht.mmax, nlon), grid, sht.lmax, sht.mmax)
    difference = grid.cart.allreduce(float(abs(sht.adjoint(c) - isht.forward(c)).max()), op=MPI.MAX)
    assert difference > 1e-3


def test_float32(grid, rng):
    nlat, nlon = 17, 32
    sht = DistributedRealSHT(grid, nlat, nlon, dtype=numpy.float32)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, dtype=numpy.float32)
    field = rng.standard_normal((2, nlat, nlon))
    c = sht.forward(tile(field, grid).astype(numpy.float32))
    assert c.dtype == numpy.complex64
    expected = reference_forward(field, sht.lmax, sht.mmax, "equiangular")
    numpy.testing.assert_allclose(c, block(expected, grid, sht.lmax, sht.mmax), atol=2e-5 * abs(expected).max())
    x = isht.forward(c)
    assert x.dtype == numpy.float32
    local = rank_rng(grid.cart)
    assert dottest(sht, local.standard_normal((2,) + sht.tile_shape).astype(numpy.float32),
                   random_array(local, (2,) + sht.block_shape, numpy.complex64), rtol=1e-5) <= 1e-5


@pytest.mark.parametrize("contraction", ["per-order", "batched"])
def test_contraction_methods_agree(grid, rng, contraction):
    """The batched contraction (CuPy's default) runs on NumPy too, and gives the same numbers."""
    nlat, nlon = 23, 30
    field = rng.standard_normal((3, nlat, nlon))
    sht = DistributedRealSHT(grid, nlat, nlon, lmax=14, mmax=14, contraction=contraction)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, lmax=14, mmax=14, contraction=contraction)
    expected = reference_forward(field, 14, 14, "equiangular")
    c = sht.forward(tile(field, grid))
    numpy.testing.assert_allclose(c, block(expected, grid, 14, 14), atol=1e-12 * abs(expected).max())
    expected_x = reference_inverse(expected, nlat, nlon, "equiangular")
    numpy.testing.assert_allclose(isht.forward(c), tile(expected_x, grid), atol=1e-12 * abs(expected_x).max())
    local = rank_rng(grid.cart)
    x = local.standard_normal((3,) + sht.tile_shape)
    y = random_array(local, (3,) + sht.block_shape, numpy.complex128)
    assert dottest(sht, x, y, rtol=1e-12) <= 1e-12
    assert dottest(isht, y, x, rtol=1e-12) <= 1e-12


@pytest.mark.parametrize("nlat, nlon, quadrature, lmax, mmax, expected", [
    (33, 64, "equiangular", None, None, (17, 17)),
    (32, 64, "legendre-gauss", None, None, (32, 32)),
    (32, 64, "legendre-gauss", 20, 17, (17, 17)),
    (32, 64, "lobatto", None, None, (31, 31)),
    (17, 40, "equiangular", 8, 21, (8, 8)),
    (13, 40, "equiangular", 20, 21, (20, 20)),
])
def test_truncation_follows_torch_harmonics_09(grid, nlat, nlon, quadrature, lmax, mmax, expected):
    """torch-harmonics 0.9's truncate_sht: quadrature default for lmax, Nyquist for mmax, then triangular."""
    assert mpisphere.truncate_sht(nlat, nlon, lmax, mmax, quadrature) == expected
    for cls in (DistributedRealSHT, DistributedInverseRealSHT):
        op = cls(grid, nlat, nlon, lmax=lmax, mmax=mmax, quadrature=quadrature)
        assert (op.lmax, op.mmax) == expected


def test_truncations_beyond_the_grid(grid, rng):
    """lmax > nlat (more degrees than latitudes) works and stays adjoint."""
    nlat, nlon = 13, 40
    lmax = mmax = 20
    sht = DistributedRealSHT(grid, nlat, nlon, lmax=lmax, mmax=mmax)
    field = rng.standard_normal((2, nlat, nlon))
    expected = reference_forward(field, lmax, mmax, "equiangular")
    numpy.testing.assert_allclose(sht.forward(tile(field, grid)), block(expected, grid, lmax, mmax),
                                  atol=1e-12 * abs(expected).max())
    local = rank_rng(grid.cart)
    assert dottest(sht, local.standard_normal((2,) + sht.tile_shape),
                   random_array(local, (2,) + sht.block_shape, numpy.complex128), rtol=1e-12) <= 1e-12


@pytest.mark.mpi
@pytest.mark.parametrize("orders", ["contiguous", "balanced"])
@pytest.mark.parametrize("legendre", ["transpose", "reduce-scatter"])
def test_orders_beyond_the_longitudes_are_zero_padded_as_in_torch_harmonics(grid, rng, orders, legendre):
    """lmax = mmax = 32 on 32 longitudes (17 orders): the analysis pads zeros, the synthesis drops them."""
    nlat, nlon, lmax = 16, 32, 32
    assert mpisphere.truncate_sht(nlat, nlon, lmax, lmax, "legendre-gauss") == (lmax, lmax)
    options = dict(quadrature="legendre-gauss", orders=orders, legendre=legendre)
    sht = DistributedRealSHT(grid, nlat, nlon, lmax, lmax, **options)
    isht = DistributedInverseRealSHT(grid, nlat, nlon, lmax, lmax, **options)
    field = rng.standard_normal((2, nlat, nlon))
    expected = reference_forward(field, lmax, lmax, "legendre-gauss")
    got = sht.gather_coefficients(sht.forward(tile(field, grid)))
    coeffs = random_array(rng, (2, lmax, lmax), numpy.complex128)
    synthesised = grid.gather(isht.forward(sht.scatter_coefficients(coeffs if grid.rank == 0 else None)))
    if grid.rank == 0:
        assert not got[..., nlon // 2 + 1:].any()
        # rounding: each coefficient sums nlat * nlon terms of size <= max |field| times weights of total 4 pi
        numpy.testing.assert_allclose(got, expected, rtol=0, atol=1e-13 * nlat * nlon * abs(field).max())
        reference = reference_inverse(coeffs, nlat, nlon, "legendre-gauss")
        numpy.testing.assert_allclose(synthesised, reference, rtol=0, atol=1e-13 * lmax * lmax * abs(coeffs).max())
    assert dottest(sht, lead=(2,), rtol=1e-12) <= 1e-12
    assert dottest(isht, lead=(2,), rtol=1e-12) <= 1e-12


def test_out_argument_and_inputs_untouched(grid, rng):
    nlat, nlon = 17, 32
    sht = DistributedRealSHT(grid, nlat, nlon)
    x = rng.standard_normal((2,) + sht.tile_shape)
    before = x.copy()
    out = numpy.empty((2,) + sht.block_shape, numpy.complex128)
    assert sht.forward(x, out=out) is out
    numpy.testing.assert_array_equal(out, sht.forward(x))
    numpy.testing.assert_array_equal(x, before)


def test_tables_hold_only_this_ranks_orders(grid):
    nlat, nlon = 33, 64
    with ProcessGrid(MPI.COMM_SELF) as serial:
        whole = DistributedRealSHT(serial, nlat, nlon).table_bytes()
    mine = DistributedRealSHT(grid, nlat, nlon).table_bytes()
    total = grid.azimuth.allreduce(mine)
    assert total == whole  # the orders are partitioned, not replicated, along the azimuth ranks
    if grid.nazimuth > 1:
        assert mine < whole


# --- bad input -------------------------------------------------------------------------------

def test_truncate_sht_rejects_non_positive_requests():
    with raises(ValueError, match="truncate_sht: lmax must be a positive integer or None, got 0"):
        mpisphere.truncate_sht(17, 32, lmax=0)
    with raises(ValueError, match="mmax must be a positive integer or None, got 2.5"):
        mpisphere.truncate_sht(17, 32, mmax=2.5)
    with raises(ValueError, match="quadrature must be one of .*got 'gaussian'"):
        mpisphere.truncate_sht(17, 32, quadrature="gaussian")


def test_tile_of_the_wrong_shape(grid):
    sht = DistributedRealSHT(grid, 17, 32)
    h, w = sht.tile_shape
    with raises(ValueError, match=r"^DistributedRealSHT.forward: ranks? 0.*: the input's last 2 axes are not "
                                         r"this rank's tile") as caught:
        sht.forward(numpy.zeros((2, h + 1, w)))
    mine = rf"  rank {grid.rank} \(.*\): expected \({h}, {w}\) in the last 2 axes, got shape \(2, {h + 1}, {w}\)"
    assert re.search(mine, whole_message(caught.value)), whole_message(caught.value)
    assert "fix: pass this rank's tile (grid.local_shape(17, 32))" in whole_message(caught.value)
    if grid.size > 1:  # the whole field where a tile belongs: the cause and the fix come first, the ranks after
        with raises(ValueError) as caught:
            sht.forward(numpy.zeros((3, 17, 32)))
        text = whole_message(caught.value)
        assert text.startswith(f"DistributedRealSHT.forward: {every_rank(grid.size)}: got the whole "
                               "field (17, 32) where this rank's tile belongs\n  fix: give each rank its own part: "
                               "grid.scatter(field), of shape (..., *grid.local_shape(17, 32))\n  rank 0 ("), text
        assert (str(caught.value) == text) == (grid.rank == 0), str(caught.value)  # printed once, by rank 0
    isht = DistributedInverseRealSHT(grid, 17, 32)
    with raises(ValueError, match="not this rank's coefficient block"):
        isht.forward(numpy.zeros((2, 1, 1), complex))


def test_real_input_to_the_inverse(grid):
    isht = DistributedInverseRealSHT(grid, 17, 32)
    with raises(TypeError, match=r"expected complex coefficients of dtype complex128, got float64 "
                                        r"\(real input to a transform that takes coefficients\?\)"):
        isht.forward(numpy.zeros(isht.block_shape))
    sht = DistributedRealSHT(grid, 17, 32)
    with raises(TypeError, match=r"complex input to a transform that takes fields"):
        sht.forward(numpy.zeros(sht.tile_shape, complex))
    with raises(TypeError, match="expected real fields of dtype float64, got float32"):
        sht.forward(numpy.zeros(sht.tile_shape, numpy.float32))


@pytest.mark.mpi(min_size=2)
def test_grid_finer_than_lmax(grid):
    if grid.npolar > 1:
        with raises(ValueError, match=rf"grid is finer than the transform: {grid.npolar} polar ranks cannot "
                                             rf"split lmax={grid.npolar - 1}"):
            DistributedRealSHT(grid, 17, 32, lmax=grid.npolar - 1)
    if grid.nazimuth > 1:
        # triangular truncation makes lmax = mmax = 1: too few for either axis of ranks
        with raises(ValueError, match=rf"{grid.npolar if grid.npolar > 1 else grid.nazimuth} "
                                             rf"{'polar' if grid.npolar > 1 else 'azimuth'} ranks cannot split "
                                             rf"{'lmax' if grid.npolar > 1 else 'mmax'}=1"):
            DistributedInverseRealSHT(grid, 17, 32, mmax=1)


def test_bad_parameters(grid):
    with raises(ValueError, match="DistributedRealSHT: quadrature must be one of .*got 'gaussian'"):
        DistributedRealSHT(grid, 17, 32, quadrature="gaussian")
    assert DistributedRealSHT(grid, 17, 32, quadrature="gauss").lmax == 17
    assert DistributedRealSHT(grid, 17, 32, quadrature="legendre-gauss-lobatto").lmax == 16  # aliases too
    with raises(ValueError, match="norm must be one of .*got 'unit'"):
        DistributedRealSHT(grid, 17, 32, norm="unit")
    with raises(TypeError, match="dtype: unsupported dtype complex128; expected float32 or float64"):
        DistributedRealSHT(grid, 17, 32, dtype=numpy.complex128)
    with raises(ValueError, match="lmax must be positive"):
        DistributedRealSHT(grid, 17, 32, lmax=0)
    with raises(ValueError, match="contraction must be one of .* got 'fast'"):
        DistributedRealSHT(grid, 17, 32, contraction="fast")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_different_batches_raise_on_every_rank(grid, debug):
    sht = DistributedRealSHT(grid, 17, 32)
    x = numpy.zeros((2 + (grid.rank == 1),) + sht.tile_shape)
    with config.override(debug=debug):
        with raises(ValueError, match=r"rank 1 has: .*shape \(3, '\*', '\*'\)"):
            sht.forward(x)


def test_torch_harmonics_spelling_gets_a_type_error_that_teaches(grid):
    with raises(TypeError, match=r"DistributedRealSHT: the first argument is the ProcessGrid .* pass the "
                                        r"quadrature as quadrature='legendre-gauss' "
                                        r"\(torch-harmonics calls it grid=\)"):
        DistributedRealSHT(64, 128, grid="legendre-gauss")
    with raises(TypeError, match=r"DistributedInverseRealSHT: the first argument is the ProcessGrid"):
        DistributedInverseRealSHT(64, 128)
    with raises(TypeError, match=r"DistributedRealSHT: grid must be a ProcessGrid, got GridComm \(a "
                                        r"communicator; pass the ProcessGrid it belongs to, or build one: "
                                        r"ProcessGrid\(comm\)\)"):
        DistributedRealSHT(grid.cart, 17, 32)


@pytest.mark.parametrize("quadrature", ["equiangular", "lobatto"])
def test_one_latitude_is_too_few_for_rules_with_poles(grid, quadrature):
    with raises(ValueError, match=rf"DistributedRealSHT: the {quadrature} rule needs at least 2 latitudes, "
                                         r"got nlat=1"):
        DistributedRealSHT(grid, 1, 32, quadrature=quadrature)


def test_out_may_not_overlap_the_input_even_with_a_padded_batch(grid):
    """A batch of one is padded inside (a split needs an entry per rank); out overlapping x is still refused."""
    sht = DistributedRealSHT(grid, 16, 16, quadrature="legendre-gauss")
    x = numpy.zeros((1,) + sht.tile_shape)
    big = numpy.zeros(x.size * 4 + 64)
    view = big[:2 * math.prod(sht.block_shape)].view(complex).reshape((1,) + sht.block_shape)
    alias = big[:x.size].reshape(x.shape)  # x written in the same memory as out
    with raises(ValueError, match="out overlaps the input"):
        sht.forward(alias, out=view)
    apart = big[-2 * math.prod(sht.block_shape):].view(complex).reshape((1,) + sht.block_shape)
    assert sht.forward(alias, out=apart) is apart  # the same buffer, disjoint elements: fine


# --- FFT libraries ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [DistributedRealSHT, DistributedInverseRealSHT, mpisphere.DistributedRealVectorSHT,
                                 mpisphere.DistributedInverseRealVectorSHT])
@pytest.mark.parametrize("nlon", [36, 37])
@pytest.mark.parametrize("mmax", [None, 11], ids=["all-orders", "fewer-orders"])
def test_fft_libraries_agree_and_keep_the_adjoint(grid, cls, nlon, mmax):
    """Both FFT libraries, with every order kept and with fewer (the FFT then pads the missing ones itself
    on one rank, where it reads the Legendre step's layout)."""
    pytest.importorskip("ducc0")
    nlat = 19
    ops = {fft: cls(grid, nlat, nlon, lmax=mmax, mmax=mmax, quadrature="legendre-gauss", fft=fft)
           for fft in ("numpy", "ducc0")}
    assert ops["ducc0"].fft == "ducc0" and ops["numpy"].fft == "numpy"
    local = rank_rng(grid.cart)
    op = ops["numpy"]
    inverse = "Inverse" in cls.__name__
    lead = (3,)
    # arbitrary complex input also in the imaginary parts of m = 0 (and m = nlon / 2): both libraries drop them
    x = random_array(local, op.domain_shape(lead), op.cdtype if inverse else op.dtype)
    y = random_array(local, op.range_shape(lead), op.dtype if inverse else op.cdtype)
    results = {fft: o.forward(x) for fft, o in ops.items()}
    adjoints = {fft: o.adjoint(y) for fft, o in ops.items()}
    # the two differ by rounding only: bound by the sizes of what was summed (the same for both)
    for got in (results, adjoints):
        scale = grid.cart.allreduce(float(abs(got["numpy"]).max()), op=MPI.MAX)
        diff = grid.cart.allreduce(float(abs(got["numpy"] - got["ducc0"]).max()), op=MPI.MAX)
        assert diff <= 1e3 * numpy.finfo(float).eps * scale * nlon
    for o in ops.values():
        assert dottest(o, x, y, rtol=1e-12) <= 1e-12


def test_fft_keyword_is_checked(grid):
    with raises(ValueError, match="DistributedRealSHT: fft must be one of 'auto', 'numpy', 'ducc0'"):
        DistributedRealSHT(grid, 17, 32, fft="fftw")


# --- memory: shared tables and scratch ------------------------------------------------------------

def test_analysis_and_synthesis_share_tables_and_the_grid_scratch(grid, rng):
    nlat, nlon, batch = 33, 64, 5
    sht = DistributedRealSHT(grid, nlat, nlon)
    isht = DistributedInverseRealSHT(grid, nlat, nlon)
    assert sht.tables is isht.tables  # unweighted, the analysis applies the weights in its contraction
    vsht = mpisphere.DistributedRealVectorSHT(grid, nlat, nlon)
    ivsht = mpisphere.DistributedInverseRealVectorSHT(grid, nlat, nlon)
    assert vsht.tables is ivsht.tables and vsht.tables is not sht.tables
    # other norms scale analysis and synthesis differently: separate tables
    assert DistributedRealSHT(grid, nlat, nlon, norm="schmidt").tables is not \
        DistributedInverseRealSHT(grid, nlat, nlon, norm="schmidt").tables
    assert DistributedRealSHT(grid, nlat, nlon, dtype=numpy.float32).tables.dtype == numpy.float32
    x = rng.standard_normal((batch,) + sht.tile_shape)
    wind = rng.standard_normal((batch, 2) + sht.tile_shape)
    c = sht.forward(x)
    isht.forward(c)
    sht.adjoint(c)
    isht.adjoint(x)
    ivsht.forward(vsht.forward(wind))
    # every intermediate of every transform on the grid took turns in two buffers of the largest intermediate
    padded = max(batch, grid.npolar, grid.nazimuth)
    largest = 0
    for op in (sht, isht, vsht, ivsht):
        for pipeline in op._pipelines.values():
            largest = max(largest, pipeline._slot_bytes)
    assert 0 < grid.scratch.nbytes() <= 2 * largest
    assert largest <= 2 * padded * 16 * max(sht.tile_shape[0], nlat) * (nlon // 2 + 1)


def test_fft_without_ducc0(grid, monkeypatch):
    """fft='ducc0' without ducc0 says how to get it (on every rank); 'auto' falls back to NumPy's FFT."""
    monkeypatch.setitem(sys.modules, "ducc0", None)
    monkeypatch.setitem(sys.modules, "ducc0.fft", None)
    message = r"DistributedRealSHT: fft='ducc0' needs ducc0: pip install '\.\[ducc0\]' in the mpisphere clone"
    with raises(ImportError, match=message):
        DistributedRealSHT(grid, 17, 32, fft="ducc0")
    assert DistributedRealSHT(grid, 17, 32).fft == "numpy"
