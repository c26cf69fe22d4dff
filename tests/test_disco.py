"""DISCO convolutions: the distributed operators against a dense serial reference, their adjoints and gradients.

The reference applies ``psi`` (``ConvolutionTensor.dense``) directly: the
sum over input latitudes and longitudes for every output point, shifting
the input along longitude, with no FFT, band or halo. ``psi`` itself is
checked here against a direct evaluation of the filter basis at every input
point, and against torch-harmonics 0.9.3 in ``test_torch_harmonics_modules.py``.
"""

import math
import re

import numpy
import pytest

from mpisphere import config, dottest, widest_theta_cutoff
from mpisphere.disco import (DiscoConvS2, DiscoConvTransposeS2, convolution_tensor, default_theta_cutoff,
                             filter_basis)
from mpisphere.disco.psi import _rotated, effective_cutoff
from mpisphere.quadrature import latitudes

from helpers import raises

pytestmark = pytest.mark.mpi

# (in_shape, out_shape, transposed): the same grid, a downsampling and an upsampling pair, an odd latitude count
PAIRS = [((12, 24), (12, 24), False), ((16, 32), (8, 16), False), ((8, 16), (16, 32), True), ((11, 20), (11, 20), True)]
BASES = [((3,), "piecewise linear", 1), ((3, 4), "piecewise linear", 2), (3, "zernike", 1), ((2, 2), "harmonic", 2)]


def reference(op, weight, x):
    """The convolution (or its transpose) by the dense ``psi``, and its expansion over the basis functions.

    Returns ``out (B, O, nlat_out, nlon_out)`` and ``expansion (B, C, K,
    nlat_out, nlon_out)`` with ``out = sum_{c,k} weight[o, c, k] expansion[c, k]``
    per group.
    """
    K = op.basis.kernel_size
    B, C = x.shape[:2]
    g = op.groups
    O = weight.shape[0]
    (_, nlon_in), (nlat_out, nlon_out) = op.in_shape, op.out_shape
    if isinstance(op, DiscoConvTransposeS2):
        psi = convolution_tensor(op.basis, op.out_shape, op.in_shape, op.quadrature_out, op.quadrature_in,
                                 op.theta_cutoff, op.basis_norm_mode, transpose_normalization=True).dense()
        expansion = numpy.zeros((B, C, K, nlat_out, nlon_out))
        for q in range(nlon_in):   # out[T, n] = sum psi[k, t, T, n - s q] x[t, q]
            shifted = numpy.roll(psi, op.stride * q, axis=-1)
            expansion += numpy.einsum("ktTn,bct->bckTn", shifted, x[..., q])
    else:
        psi = convolution_tensor(op.basis, op.in_shape, op.out_shape, op.quadrature_in, op.quadrature_out,
                                 op.theta_cutoff, op.basis_norm_mode).dense()
        expansion = numpy.zeros((B, C, K, nlat_out, nlon_out))
        for q in range(nlon_out):  # y[t, q] = sum psi[k, t, i, p] x[i, p + s q]
            shifted = numpy.roll(x, -op.stride * q, axis=-1)
            expansion[..., q] = numpy.einsum("ktip,bcip->bckt", psi, shifted)
    grouped = expansion.reshape((B, g, C // g, K, nlat_out, nlon_out))
    out = numpy.einsum("gock,bgckxy->bgoxy", weight.reshape(g, O // g, C // g, K), grouped)
    return out.reshape((B, O, nlat_out, nlon_out)), expansion


def reference_values(op):
    """The entries of the operator's ``psi``."""
    if isinstance(op, DiscoConvTransposeS2):
        return convolution_tensor(op.basis, op.out_shape, op.in_shape, op.quadrature_out, op.quadrature_in,
                                  op.theta_cutoff, op.basis_norm_mode, transpose_normalization=True).values
    return convolution_tensor(op.basis, op.in_shape, op.out_shape, op.quadrature_in, op.quadrature_out,
                              op.theta_cutoff, op.basis_norm_mode).values


def build(grid, pair, basis, rng, channels=(4, 6), **options):
    (in_shape, out_shape, transposed), (kernel_shape, basis_type, groups) = pair, basis
    C, O = channels
    weight = rng.standard_normal((O, C // groups, filter_basis(kernel_shape, basis_type).kernel_size))
    cls = DiscoConvTransposeS2 if transposed else DiscoConvS2
    return cls(grid, in_shape, out_shape, kernel_shape, weight, basis_type=basis_type, groups=groups, **options), weight


@pytest.mark.parametrize("pair", PAIRS, ids=["same", "down", "up", "odd"])
@pytest.mark.parametrize("basis", BASES, ids=["hat", "hat-aniso-g2", "zernike", "harmonic-g2"])
@pytest.mark.parametrize("blocks", ["whole", "rows", "device"])
def test_forward_adjoint_and_gradients_match_the_dense_reference(grid, pair, basis, blocks, rng):
    """``blocks``: the contraction in one block (small grids on the host), a block per row (what large grids
    do, cache-sized), or the device kernels' block per basis function (taken here on host arrays)."""
    op, weight = build(grid, pair, basis, rng)
    if blocks == "rows":
        op.block_bytes = 1
    with config.override(device_kernels=blocks == "device"):
        check_against_the_dense_reference(grid, op, weight, pair, rng)


def check_against_the_dense_reference(grid, op, weight, pair, rng):
    x = rng.standard_normal((2, 4) + pair[0])
    y_bar = rng.standard_normal((2, 6) + pair[1])
    expected, expansion = reference(op, weight, x)
    y = grid.gather(op.forward(grid.scatter(x)))
    x_bar, w_bar, _ = op.gradients(grid.scatter(x), grid.scatter(y_bar))
    adjoint = grid.gather(op.adjoint(grid.scatter(y_bar)))
    x_bar = grid.gather(x_bar)
    g = op.groups
    w_expected = numpy.einsum("bgoxy,bgckxy->gock", y_bar.reshape((2, g, 6 // g) + pair[1]),
                              expansion.reshape((2, g, 4 // g, weight.shape[2]) + pair[1])).reshape(weight.shape)
    # every rank holds the whole-sphere weight gradient
    numpy.testing.assert_array_equal(numpy.array(grid.cart.allgather(w_bar)), numpy.array([w_bar] * grid.size))
    if grid.rank == 0:
        # the FFT's rounding is a few ulp of the terms summed: bounded by the sums of their absolute values
        bound = 1e-13 * reference(op, numpy.abs(weight), numpy.abs(x))[0].max()
        assert numpy.abs(y - expected).max() <= bound
        # the same map in another order (the band before or after the weights): a bound on its terms' sum
        psi_max = max(abs(v) for v in (reference_values(op).max(), reference_values(op).min()))
        assert numpy.abs(adjoint - x_bar).max() <= 1e-13 * weight.shape[2] * numpy.abs(weight).max() * psi_max \
            * numpy.abs(y_bar).sum()
        # <y_bar, A x> = <A^H y_bar, x>, measured against the sums of absolute terms
        assert abs(numpy.sum(y_bar * expected) - numpy.sum(x_bar * x)) <= 1e-13 * numpy.sum(
            numpy.abs(y_bar) * reference(op, numpy.abs(weight), numpy.abs(x))[0])
        w_bound = 1e-13 * numpy.einsum("bgoxy,bgckxy->gock", numpy.abs(y_bar).reshape((2, g, 6 // g) + pair[1]),
                                       numpy.abs(expansion).reshape((2, g, 4 // g, weight.shape[2]) + pair[1])).max()
        assert numpy.abs(w_bar - w_expected).max() <= w_bound


@pytest.mark.parametrize("transposed", [False, True])
def test_dot_test(grid, transposed, rng):
    pair = ((8, 16), (16, 32), True) if transposed else ((13, 24), (13, 24), False)
    op, _ = build(grid, pair, ((3, 2), "piecewise linear", 1), rng, channels=(2, 3),
                  quadrature_in="legendre-gauss", quadrature_out="lobatto" if transposed else "legendre-gauss")
    assert dottest(op, lead=(2,)) <= 1e-13
    assert dottest(op.H, lead=(1,)) <= 1e-13


def test_float32_and_a_batch_of_no_leading_axes(grid, rng):
    op64, weight = build(grid, PAIRS[0], BASES[0], rng)
    op32 = DiscoConvS2(grid, (12, 24), (12, 24), (3,), weight, dtype=numpy.float32)
    x = grid.scatter(rng.standard_normal((4, 12, 24)))
    y64 = op64.forward(x)
    y32 = op32.forward(x.astype(numpy.float32))
    assert y32.dtype == numpy.float32 and y32.shape == y64.shape
    assert numpy.abs(y32 - y64).max() <= 1e-5 * max(numpy.abs(y64).max(), 1.0)


def test_a_bias_is_a_parameter_added_per_channel_with_its_gradient_in_the_one_sum(grid, rng):
    """The bias is a declared parameter: the forward adds it per output channel, ``gradients`` returns its
    whole-sphere gradient (``y_bar`` summed over batch and sphere) beside the weights', and the map, now affine,
    refuses an adjoint on every rank."""
    op, weight = build(grid, PAIRS[1], BASES[0], rng)
    bias = rng.standard_normal(6)
    with_bias = DiscoConvS2(grid, PAIRS[1][0], PAIRS[1][1], BASES[0][0], weight, bias=bias)
    x = rng.standard_normal((2, 4) + PAIRS[1][0])
    y_bar = rng.standard_normal((2, 6) + PAIRS[1][1])
    plain = grid.gather(op.forward(grid.scatter(x)))
    shifted = grid.gather(with_bias.forward(grid.scatter(x)))
    x_bar, w_bar, b_bar = with_bias.gradients(grid.scatter(x), grid.scatter(y_bar), input_gradient=False)
    assert x_bar is None and op.gradients(grid.scatter(x), grid.scatter(y_bar))[2] is None
    numpy.testing.assert_array_equal(numpy.array(grid.cart.allgather(b_bar)), numpy.array([b_bar] * grid.size))
    if grid.rank == 0:
        # the same terms in both, then one addition of the bias: a bound on the sum's rounding
        assert numpy.abs(shifted - plain - bias[None, :, None, None]).max() <= 1e-15 * (
            numpy.abs(plain).max() + numpy.abs(bias).max())
        b_expected = y_bar.sum(axis=(0, 2, 3))
        assert numpy.abs(b_bar - b_expected).max() <= 1e-15 * numpy.abs(y_bar).sum()
    _, expansion = reference(op, weight, x)
    w_expected = numpy.einsum("boxy,bckxy->ock", y_bar, expansion)
    w_bound = 1e-13 * numpy.einsum("boxy,bckxy->ock", numpy.abs(y_bar), numpy.abs(expansion)).max()
    assert numpy.abs(w_bar - w_expected).max() <= w_bound
    assert not with_bias.linear and op.linear
    with raises(TypeError, match="not linear in its input here and has no adjoint"):
        with_bias.adjoint(grid.scatter(y_bar))


def test_the_weights_can_change_between_calls(grid, rng):
    op, weight = build(grid, PAIRS[0], BASES[0], rng)
    x = grid.scatter(rng.standard_normal((1, 4, 12, 24)))
    y = op.forward(x)
    op.weight = 2 * weight
    numpy.testing.assert_allclose(op.forward(x), 2 * y, rtol=1e-14, atol=1e-14 * numpy.abs(y).max())


def test_a_weight_that_differs_on_one_rank_raises_on_every_rank(grid, rng):
    op, weight = build(grid, PAIRS[0], BASES[0], rng)
    changed = weight.copy()
    if grid.rank == grid.size - 1:
        changed[0, 0, 0] += 1
    op.weight = changed
    x = grid.scatter(rng.standard_normal((1, 4, 12, 24)))
    if grid.size > 1:
        with raises(ValueError, match="weight"):
            op.forward(x)


def test_a_cutoff_too_wide_for_the_halo_names_the_widest_it_serves(grid):
    weight = numpy.ones((1, 1, 2))
    if grid.npolar == 1:  # one polar rank holds every latitude: any cutoff is served, with no halo
        assert DiscoConvS2(grid, (25, 24), (25, 24), (3,), weight, theta_cutoff=2.5).halo_rows == 0
        assert widest_theta_cutoff(grid, (25, 24), (25, 24)) == math.pi
        return
    with raises(ValueError, match=r"reaches past the neighbouring polar rank .* the widest cutoff this split serves "
                                  r"is (\d\.\d+)") as caught:
        DiscoConvS2(grid, (25, 24), (25, 24), (3,), weight, theta_cutoff=2.5)
    widest = float(re.search(r"serves is (\d\.\d+)", str(caught.value)).group(1))
    assert widest_theta_cutoff(grid, (25, 24), (25, 24)) == widest   # found without triggering the error
    DiscoConvS2(grid, (25, 24), (25, 24), (3,), weight, theta_cutoff=widest)  # the cutoff named is served
    with raises(ValueError, match="reaches past"):
        DiscoConvS2(grid, (25, 24), (25, 24), (3,), weight, theta_cutoff=widest * 1.001 + 1e-6)


def test_channels_not_divisible_by_groups_and_wrong_tiles_are_refused(grid, rng):
    with raises(ValueError, match="multiple of groups=2"):
        DiscoConvS2(grid, (12, 24), (12, 24), (3,), numpy.ones((3, 1, 2)), groups=2)
    op, _ = build(grid, PAIRS[0], BASES[0], rng)
    if grid.size > 1:
        with raises(ValueError, match="got the whole 12 x 24 field where this rank's tile belongs"):
            op.forward(numpy.zeros((1, 4, 12, 24)))
    with raises(ValueError, match="not \\(channels, \\*this rank's tile\\)"):
        op.forward(numpy.zeros((1, 3) + grid.local_shape(12, 24)))


@pytest.mark.parametrize("basis", [((3,), "piecewise linear"), ((4, 3), "piecewise linear"), (3, "zernike"),
                                   ((2, 3), "harmonic")])
def test_psi_is_the_basis_at_every_input_point_within_the_cutoff(basis):
    """The band and listing of ``convolution_tensor`` against the basis evaluated at every input point."""
    (kernel_shape, basis_type) = basis
    fb = filter_basis(kernel_shape, basis_type)
    shape = (10, 20)
    cutoff = default_theta_cutoff(10)
    dense = convolution_tensor(fb, shape, shape, theta_cutoff=cutoff, basis_norm_mode="none").dense()
    theta, weights = latitudes(10)
    lons = 2 * math.pi * numpy.arange(20) / 20
    for t in range(10):
        r, phi = _rotated(theta[t], theta, lons)
        _, values = fb.evaluate(r.reshape(-1), phi.reshape(-1), effective_cutoff(cutoff))
        expected = values.reshape(fb.kernel_size, 10, 20) * (weights / 20 / 2.0)[None, :, None]
        numpy.testing.assert_allclose(dense[:, t], expected, rtol=0, atol=1e-15 * numpy.abs(expected).max())


@pytest.mark.parametrize("transposed", [False, True])
def test_fewer_fields_than_azimuth_ranks(grid, transposed, rng):
    """One channel, no batch axis: the transposes get fewer fields than ranks (zeros fill the rest)."""
    pair = PAIRS[2] if transposed else PAIRS[1]
    op, weight = build(grid, pair, BASES[0], rng, channels=(1, 1))
    x = rng.standard_normal((1,) + pair[0])
    y_bar = rng.standard_normal((1,) + pair[1])
    expected, _ = reference(op, weight, x[None])
    y = grid.gather(op.forward(grid.scatter(x)))
    x_bar, w_bar, _ = op.gradients(grid.scatter(x), grid.scatter(y_bar))
    adjoint = grid.gather(op.adjoint(grid.scatter(y_bar)))
    x_bar = grid.gather(x_bar)
    if grid.rank == 0:
        bound = 1e-13 * reference(op, numpy.abs(weight), numpy.abs(x)[None])[0].max()
        assert numpy.abs(y - expected[0]).max() <= bound
        assert abs(numpy.sum(y_bar * expected[0]) - numpy.sum(adjoint * x)) <= 1e-13 * numpy.sum(
            numpy.abs(y_bar) * reference(op, numpy.abs(weight), numpy.abs(x)[None])[0][0])
        psi_max = numpy.abs(reference_values(op)).max()
        assert numpy.abs(x_bar - adjoint).max() <= 1e-13 * weight.shape[2] * numpy.abs(weight).max() * psi_max \
            * numpy.abs(y_bar).sum()


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("value", [numpy.nan, numpy.inf, -numpy.inf])
def test_a_non_finite_input_point_is_refused_on_every_rank_naming_it(grid, rng, transposed, value):
    """One missing value (NaN over land) would spread over its whole latitude ring through the FFT; it is refused on
    every rank, naming the point in the whole grid's indices, in the forward, the adjoint and the gradients."""
    op, _ = build(grid, PAIRS[2] if transposed else PAIRS[0], BASES[0], rng)
    x = grid.scatter(rng.standard_normal((1, op.in_channels) + op.in_shape))
    y = op.forward(x)
    last = grid.rank == grid.size - 1
    bad = x.copy()
    lat, lon = grid.tiling(*op.in_shape).slices(grid.size - 1)   # the last rank's tile
    if last:
        bad[0, 1, -1, -1] = value
    where = rf"latitude {lat.stop - 1}, longitude {lon.stop - 1} of the {op.in_shape[0]} x {op.in_shape[1]} grid"
    found = rf"rank {grid.size - 1} of {grid.size}: input: a non-finite value \({value}\) at index \(0, 1\), {where}"
    with raises(ValueError, match=found + ".*\n  fix: fill the missing values"):
        op.forward(bad)
    with raises(ValueError, match=rf"rank {grid.size - 1} of {grid.size}: x: a non-finite value"):
        op.gradients(bad, y)
    y_bad = y.copy()
    if last:
        y_bad[0, 0, 0, 0] = value
    with raises(ValueError, match=rf"rank {grid.size - 1} of {grid.size}: the adjoint's input: a non-finite value"):
        op.adjoint(y_bad)
    numpy.testing.assert_array_equal(op.forward(x), y)   # every rank in step, the operator unchanged
