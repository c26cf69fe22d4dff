"""One tiling for rectangles and rings: the regular tiling, a new kind defined here in one class, bad input."""

import numpy
import pytest

from mpisphere import RegularTiling, RingGeometry, RingTiles, Tiling

from helpers import raises

pytestmark = pytest.mark.mpi


class EveryOtherPoint(Tiling):
    """A kind of grid the library does not have: rank r holds points r, r + size, r + 2 size, ... of a line.

    One class (which points, how to take them out and put them back) is all a new kind needs for
    scatter and gather.
    """

    def __init__(self, grid, n):
        self.grid, self.whole, self.name = grid, (n,), f"a line of {n} points"

    def _points(self, rank):
        return numpy.arange(self.grid.rank if rank is None else rank, self.whole[0], self.grid.size)

    def local_shape(self, rank=None):
        return (len(self._points(rank)),)

    def piece(self, field, rank):
        return field[..., self._points(rank)]

    def place(self, field, rank, part):
        field[..., self._points(rank)] = part


@pytest.mark.parametrize("lead", [(), (3,)], ids=str)
def test_the_regular_tiling_holds_the_grids_tiles_and_moves_whole_fields(grid, rng, lead):
    nlat, nlon = 7, 11  # uneven splits at every grid shape of the harness
    tiling = grid.tiling(nlat, nlon)
    assert isinstance(tiling, RegularTiling) and isinstance(tiling, Tiling)
    assert tiling.whole == (nlat, nlon)
    for r in range(grid.size):
        lat, lon = grid.tile_slices(nlat, nlon, r)
        assert tiling.slices(r) == (lat, lon)
        assert tiling.local_shape(r) == (lat.stop - lat.start, lon.stop - lon.start)
    assert tiling.local_shape() == grid.local_shape(nlat, nlon)
    field = rng.standard_normal(lead + (nlat, nlon))
    root = grid.size - 1
    tile = tiling.scatter(field if grid.rank == root else None, root=root)
    lat, lon = grid.local_slices(nlat, nlon)
    numpy.testing.assert_array_equal(tile, field[..., lat, lon])
    back = tiling.gather(tile, root=root)
    if grid.rank == root:
        numpy.testing.assert_array_equal(back, field)
    else:
        assert back is None


def test_a_new_kind_of_grid_is_one_class(grid, rng):
    n = 3 * grid.size + 2
    tiling = EveryOtherPoint(grid, n)
    field = rng.standard_normal((2, n))
    part = tiling.scatter(field if grid.rank == 0 else None)
    numpy.testing.assert_array_equal(part, field[:, grid.rank::grid.size])
    back = tiling.gather(part)
    if grid.rank == 0:
        numpy.testing.assert_array_equal(back, field)
    with raises(ValueError, match=rf"^EveryOtherPoint.scatter: .*root 0's field ends in \({n + 1},\), "
                                  rf"a line of {n} points is \({n},\)"):
        tiling.scatter(numpy.zeros(n + 1) if grid.rank == 0 else None)


def test_rings_and_rectangles_are_one_kind_of_object(grid):
    rings = RingTiles(grid, RingGeometry.octahedral(6))
    assert isinstance(rings, Tiling)
    assert rings.whole == (rings.rings.npoints,)
    assert rings.local_shape() == (rings.npoints,)
    assert sum(rings.local_shape(r)[0] for r in range(grid.size)) == rings.rings.npoints
    assert [rings.local_shape(r)[0] for r in range(grid.size)] == [len(rings.point_indices(r))
                                                                    for r in range(grid.size)]


def test_a_part_of_another_shape_fails_the_gather_on_every_rank(grid):
    tiling = grid.tiling(6, 9)
    h, w = tiling.local_shape(grid.size - 1)  # the rank with the mistake, whose shapes the message quotes
    tile = numpy.zeros(tuple(numpy.add(tiling.local_shape(), (0, grid.rank == grid.size - 1))))
    with raises(ValueError, match=rf"RegularTiling.gather: .*rank {grid.size - 1} of {grid.size}: expected this "
                                  rf"rank's part \(\.\.\., {h}, {w}\) of the 6 x 9 field, got ndarray "
                                  rf"\({h}, {w + 1}\)"):
        tiling.gather(tile)


def test_extents_that_do_not_split_over_the_grid_are_refused(grid):
    with raises(ValueError, match=rf"ProcessGrid.tiling: {grid.nazimuth} azimuth ranks cannot split "
                                  rf"{grid.nazimuth - 1} longitudes"):
        grid.tiling(8, grid.nazimuth - 1)


def _whole_points(tiling, quadrature):
    """Every rank's ``points`` broadcast to its part and gathered into whole fields (root 0)."""
    points = tiling.points(quadrature)
    shape = tuple(tiling.local_shape())
    fields = [numpy.broadcast_to(numpy.asarray(a, dtype=numpy.float64), shape)
              for a in (points.colatitudes, points.longitudes, points.weights, points.spacing, points.rings)]
    return points, tiling.gather(numpy.ascontiguousarray(numpy.stack(fields)))


@pytest.mark.parametrize("quadrature", ["equiangular", "legendre-gauss"])
def test_a_regular_tilings_points_are_the_grids_own(grid, quadrature):
    """Each rank's points, put together, are the latitude rule's colatitudes and weights and the regular longitudes
    (an independent meshgrid of the whole grid), whatever the split."""
    from mpisphere.quadrature import latitudes
    nlat, nlon = 7, 11
    points, whole = _whole_points(grid.tiling(nlat, nlon), quadrature)
    assert points.nrings == nlat
    if grid.rank == 0:
        theta, weights = latitudes(nlat, quadrature)
        lon = 2 * numpy.pi * numpy.arange(nlon) / nlon
        rows = numpy.broadcast_to(numpy.arange(nlat)[:, None], (nlat, nlon))
        expected = numpy.stack([numpy.broadcast_to(theta[:, None], (nlat, nlon)),
                                numpy.broadcast_to(lon, (nlat, nlon)),
                                numpy.broadcast_to(weights[:, None], (nlat, nlon)),
                                numpy.full((nlat, nlon), 2 * numpy.pi / nlon), rows])
        assert numpy.array_equal(whole, expected)


def test_a_ring_tilings_points_are_the_rings_own(grid):
    """Each rank's points, put together, are the rings' colatitudes, longitudes, weights and spacing, ring after
    ring (``RingGeometry``'s own arrays)."""
    rings = RingGeometry.octahedral(6)
    points, whole = _whole_points(RingTiles(grid, rings), None)
    assert points.nrings == rings.nrings
    if grid.rank == 0:
        ring = numpy.repeat(numpy.arange(rings.nrings), rings.nlon)
        expected = numpy.stack([rings.theta[ring], rings.longitudes, rings.weights[ring],
                                2 * numpy.pi / rings.nlon[ring], ring])
        assert numpy.array_equal(whole, expected)
