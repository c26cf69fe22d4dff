"""ResampleS2: against a serial reference of torch-harmonics' bilinear rule, on every grid; its exact adjoint."""

import math

import numpy
import pytest

from mpisphere import ResampleS2, config, dottest
from mpisphere.quadrature import latitudes

from helpers import raises

pytestmark = pytest.mark.mpi

# (in, out, quadratures): finer and coarser, Gauss to equiangular (output rows beyond the input's: the poles)
CASES = [((12, 24), (17, 36), ("equiangular", "equiangular")),
         ((16, 32), (9, 20), ("equiangular", "equiangular")),
         ((10, 20), (13, 24), ("legendre-gauss", "equiangular")),
         ((11, 24), (11, 24), ("lobatto", "legendre-gauss"))]


def rows(theta_in, theta_out):
    """torch-harmonics' first input row of each output row and its weight (held in float32)."""
    i = numpy.searchsorted(theta_in, theta_out, side="right") - 1
    i = numpy.where(theta_out == theta_in[-1], i - 1, i)
    return i, ((theta_out - theta_in[i]) / numpy.diff(theta_in)[i]).astype(numpy.float32).astype(float)[:, None]


def longitudes(in_shape, out_shape):
    """torch-harmonics' two input columns of each output column (periodic) and the weight of the second."""
    lon_in = numpy.linspace(0, 2 * math.pi, in_shape[1] + 1)[:-1]
    lon_out = numpy.linspace(0, 2 * math.pi, out_shape[1] + 1)[:-1]
    left = numpy.searchsorted(lon_in, lon_out, side="right") - 1
    right = numpy.where(lon_out >= lon_in[-1], 0, left + 1)
    gap = lon_in[right] - lon_in[left]
    gap = numpy.where(gap <= 0, gap + 2 * math.pi, gap)
    return left, right, ((lon_out - lon_in[left]) / gap).astype(numpy.float32).astype(float)


def reference(x, in_shape, out_shape, quadratures):
    """torch-harmonics 0.9.3's ResampleS2 (bilinear) written out with NumPy: rows, then columns."""
    theta_in, _ = latitudes(in_shape[0], quadratures[0])
    theta_out, _ = latitudes(out_shape[0], quadratures[1])
    if (theta_out > theta_in[-1]).any() or (theta_out < theta_in[0]).any():
        theta_in = numpy.concatenate([[0.0], theta_in, [math.pi]])
        x = numpy.concatenate([x[..., :1, :].mean(axis=-1, keepdims=True) * numpy.ones_like(x[..., :1, :]), x,
                               x[..., -1:, :].mean(axis=-1, keepdims=True) * numpy.ones_like(x[..., :1, :])], axis=-2)
    i, a = rows(theta_in, theta_out)
    x = x[..., i, :] + a * (x[..., i + 1, :] - x[..., i, :])
    left, right, b = longitudes(in_shape, out_shape)
    return x[..., left] + b * (x[..., right] - x[..., left])


@pytest.mark.parametrize("case", CASES, ids=["finer", "coarser", "gauss-poles", "same-shape"])
@pytest.mark.parametrize("blocks", ["whole", "lines", "device"])
def test_matches_the_serial_rule_and_its_adjoint(grid, case, blocks, rng):
    """``blocks``: the stencils' strided views on the whole array (small grids), a line at a time (what
    large grids do, cache-sized), or the device kernels' gathers (taken here on host arrays)."""
    in_shape, out_shape, quadratures = case
    try:
        op = ResampleS2(grid, in_shape, out_shape, *quadratures)
    except ValueError as exc:   # a split too fine for the grids: refused on every rank, naming why
        assert "use fewer" in str(exc) and grid.size >= 4
        return
    if blocks == "lines":
        op._rows.block_bytes = op._cols.block_bytes = 1
    with config.override(device_kernels=blocks == "device"):
        check_against_the_serial_rule(grid, op, in_shape, out_shape, quadratures, rng)


def check_against_the_serial_rule(grid, op, in_shape, out_shape, quadratures, rng):
    x = rng.standard_normal((3,) + in_shape)
    y = grid.gather(op.forward(grid.scatter(x)))
    if grid.rank == 0:
        expected = reference(x, in_shape, out_shape, quadratures)
        assert numpy.abs(y - expected).max() <= 1e-14 * numpy.abs(x).max() * 4
    assert dottest(op, lead=(2,)) <= 1e-13


def spherical_reference(x, in_shape, out_shape, quadratures):
    """torch-harmonics' bilinear-spherical rule: the shorter arc, the poles as circular means."""
    theta_in, _ = latitudes(in_shape[0], quadratures[0])
    theta_out, _ = latitudes(out_shape[0], quadratures[1])
    if (theta_out > theta_in[-1]).any() or (theta_out < theta_in[0]).any():
        theta_in = numpy.concatenate([[0.0], theta_in, [math.pi]])

        def mean(ring):
            return numpy.arctan2(numpy.sin(ring).mean(-1, keepdims=True), numpy.cos(ring).mean(-1, keepdims=True))
        x = numpy.concatenate([mean(x[..., :1, :]) * numpy.ones_like(x[..., :1, :]), x,
                               mean(x[..., -1:, :]) * numpy.ones_like(x[..., :1, :])], axis=-2)

    def arc(a, b, w):
        return a + w * (numpy.remainder(b - a + math.pi, 2 * math.pi) - math.pi)
    i, a = rows(theta_in, theta_out)
    x = arc(x[..., i, :], x[..., i + 1, :], a)
    left, right, b = longitudes(in_shape, out_shape)
    return arc(x[..., left], x[..., right], b)


@pytest.mark.parametrize("case", CASES[:3], ids=["finer", "coarser", "gauss-poles"])
def test_angles_along_the_shorter_arc_and_the_derivative(grid, case, rng):
    in_shape, out_shape, quadratures = case
    op = ResampleS2(grid, in_shape, out_shape, *quadratures, mode="bilinear-spherical")
    x = rng.uniform(-math.pi, math.pi, (2,) + in_shape)
    y = grid.gather(op.forward(grid.scatter(x)))
    y_bar = rng.standard_normal((2,) + out_shape)
    x_bar = grid.gather(op.vjp(grid.scatter(x), grid.scatter(y_bar)))
    if grid.rank == 0:
        assert numpy.abs(y - spherical_reference(x, in_shape, out_shape, quadratures)).max() <= 1e-13 * math.pi
        # the derivative along a direction d: <y_bar, (f(x + e d) - f(x - e d)) / 2 e> = <vjp, d>
        d = rng.standard_normal(x.shape)
        e = 1e-6
        slope = (spherical_reference(x + e * d, in_shape, out_shape, quadratures)
                 - spherical_reference(x - e * d, in_shape, out_shape, quadratures)) / (2 * e)
        assert abs(numpy.sum(y_bar * slope) - numpy.sum(x_bar * d)) <= 1e-6 * numpy.sum(numpy.abs(y_bar * slope))
    with raises(TypeError, match="not linear and has no adjoint"):
        op.adjoint(numpy.zeros(grid.local_shape(*out_shape)))


def test_wrong_tiles_are_refused(grid):
    op = ResampleS2(grid, (12, 24), (17, 36))
    if grid.size > 1:
        with raises(ValueError, match="got the whole 12 x 24 field where this rank's tile belongs"):
            op.forward(numpy.zeros((1, 12, 24)))
