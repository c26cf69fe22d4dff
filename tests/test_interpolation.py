"""PointInterpolation: exact on bilinear fields, the same points and values on every grid, an exact adjoint."""

import math

import numpy
import pytest
from mpi4py import MPI

from mpisphere import PointInterpolation, ProcessGrid, dottest
from mpisphere.quadrature import latitudes

from helpers import raises

pytestmark = pytest.mark.mpi

NLAT, NLON = 19, 36


def random_points(n, seed, quadrature="equiangular", nlat=NLAT):
    """``n`` points, the same on every rank, inside the outermost rings of the grid."""
    theta, _ = latitudes(nlat, quadrature)
    rng = numpy.random.default_rng(seed)
    colat = rng.uniform(theta[0], theta[-1], n)
    return 0.5 * math.pi - colat, rng.uniform(-math.pi, 3 * math.pi, n)


def tile_of(grid, whole):
    lat, lon = grid.local_slices(NLAT, NLON)
    return numpy.ascontiguousarray(whole[..., lat, lon])


@pytest.mark.parametrize("quadrature", ["equiangular", "legendre-gauss"])
def test_exact_on_a_bilinear_field_and_every_point_owned_once(grid, quadrature):
    lats, lons = random_points(200, 1, quadrature)
    lons[:5] = 2 * math.pi * (NLON - 0.5) / NLON  # in the last column: the cell wraps to column 0
    op = PointInterpolation(grid, NLAT, NLON, lats, lons, quadrature=quadrature)
    theta, _ = latitudes(NLAT, quadrature)
    column = numpy.arange(NLON, dtype=float)
    # bilinear in (colatitude, column) on the cells that do not wrap
    field = theta[:, None] * (column[None, :] + 1) + 3 * theta[:, None] + 2 * column[None, :]
    values = op.forward(tile_of(grid, field))
    colat = 0.5 * math.pi - lats[op.indices]
    position = numpy.mod(lons[op.indices], 2 * math.pi) * NLON / (2 * math.pi)
    expected = colat * (position + 1) + 3 * colat + 2 * position
    inner = position < NLON - 1
    numpy.testing.assert_allclose(values[inner], expected[inner], rtol=1e-13, atol=1e-13)
    # across the periodic seam: between column NLON - 1 and column 0
    fraction = position[~inner] - (NLON - 1)
    seam = (1 - fraction) * (colat[~inner] * NLON + 3 * colat[~inner] + 2 * (NLON - 1)) + \
        fraction * (colat[~inner] + 3 * colat[~inner])
    numpy.testing.assert_allclose(values[~inner], seam, rtol=1e-13, atol=1e-13)
    owned = numpy.concatenate(grid.cart.allgather(op.indices))
    numpy.testing.assert_array_equal(numpy.sort(owned), numpy.arange(200))


def test_the_same_values_on_every_grid(grid):
    lats, lons = random_points(300, 2)
    whole = numpy.random.default_rng(3).standard_normal((2, NLAT, NLON))
    op = PointInterpolation(grid, NLAT, NLON, lats, lons)
    values = op.forward(tile_of(grid, whole))
    gathered = numpy.empty((2, 300))
    for indices, part in grid.cart.allgather((op.indices, values)):
        gathered[:, indices] = part
    with ProcessGrid(MPI.COMM_SELF) as serial:
        reference = PointInterpolation(serial, NLAT, NLON, lats, lons).forward(whole)
    numpy.testing.assert_allclose(gathered, reference, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("quadrature", ["equiangular", "legendre-gauss"])
def test_adjoint(grid, quadrature):
    lats, lons = random_points(150, 4, quadrature)
    op = PointInterpolation(grid, NLAT, NLON, lats, lons, quadrature=quadrature)
    assert dottest(op, lead=(3,)) <= 1e-13


def test_points_in_the_polar_cap_of_a_gauss_grid_are_refused_on_every_rank(grid):
    lats, lons = random_points(10, 5, "legendre-gauss")
    lats[3] = math.radians(89.9)
    with raises(ValueError, match=r"^PointInterpolation: 1 of 10 points lie poleward"):
        PointInterpolation(grid, NLAT, NLON, lats, lons, quadrature="legendre-gauss")


def test_points_that_differ_on_one_rank_are_refused_on_every_rank(grid):
    lats, lons = random_points(10, 6)
    if grid.rank == grid.size - 1:
        lons = lons + 0.1
    if grid.size == 1:
        pytest.skip("needs two ranks to differ")
    last = grid.size - 1  # named alone (the odd one out), never rank 0 by default
    with raises(ValueError, match=rf"^PointInterpolation: the {grid.size} ranks built it from different "
                                         rf"arguments: lons: .*, rank {last} array\(\(10,\), float64, [0-9a-f]+\)\n"
                                         rf"  fix: build PointInterpolation with the same lons on every rank .*\n.*\n"
                                         rf"  rank {last} has: PointInterpolation\(.*lons=array\(\(10,\), float64"):
        PointInterpolation(grid, NLAT, NLON, lats, lons)


def test_wrong_tile_raises_on_every_rank(grid):
    lats, lons = random_points(20, 7)
    op = PointInterpolation(grid, NLAT, NLON, lats, lons)
    tile = numpy.zeros(grid.local_shape(NLAT, NLON))
    bad = numpy.zeros((tile.shape[0] + 1, tile.shape[1])) if grid.rank == 0 else tile
    message = rf"PointInterpolation.forward: rank 0 of {grid.size}: expected this rank's tile"
    with raises(ValueError, match=message):
        op.forward(bad)
