"""The shallow-water model on ring grids (octahedral, HEALPix): Williamson case 2 as on the regular Gaussian grid,
tangent-linear and adjoint, restarts, and what it refuses."""

import numpy
import pytest

from mpisphere import RingGeometry, RingTiles, dottest
from mpisphere.examples import ShallowWaterSolver

from test_tangent_linear import scaled, unit_perturbation

from helpers import raises

pytestmark = pytest.mark.mpi


def case2_error(solver, hours):
    """Williamson case 2's relative l2 error of the geopotential after ``hours`` (an exact steady solution)."""
    uspec, exact = solver.williamson2_initial_condition()
    state = solver.timestep(uspec, int(round(hours * 3600 / solver.dt)))
    phi = solver.spec2grid(state[0])
    return float(solver.integrate_grid((phi - exact) ** 2) ** 0.5 / solver.integrate_grid(exact ** 2) ** 0.5)


@pytest.mark.long_run
def test_williamson2_on_octahedral_grids_as_on_the_regular_gaussian_grid(grid):
    """O24 and O32 against the regular 2n x 4n Gaussian grids at the same (cubic) truncation, 12 hours: the errors
    agree within 2x and fall with resolution (measured at 24 hours: O24 1.5e-10, O48 5.5e-13, O96 1.5e-14, each
    within 0.5% of the regular grid's; docs/williamson.md)."""
    errors = {}
    for n, dt in ((24, 900.0), (32, 675.0)):
        octahedral = ShallowWaterSolver(RingTiles(grid, RingGeometry.octahedral(n)), dt)
        regular = ShallowWaterSolver(grid, 2 * n, 4 * n, dt, lmax=n, mmax=n, quadrature="legendre-gauss")
        errors[n] = case2_error(octahedral, 12), case2_error(regular, 12)
        assert octahedral.lmax == regular.lmax == n
        assert 0.5 <= errors[n][0] / errors[n][1] <= 2.0, errors
    assert errors[32][0] < errors[24][0] / 4, errors  # converging


@pytest.mark.parametrize("rings", [RingGeometry.octahedral(12), RingGeometry.healpix(6)], ids=str)
def test_mass_is_the_integral_on_the_points(grid, rings):
    solver = ShallowWaterSolver(RingTiles(grid, rings), 600.0)
    ones = numpy.ones(solver.sht.tile_shape)
    numpy.testing.assert_allclose(solver.integrate_grid(ones, dimensionless=True), 4 * numpy.pi, rtol=1e-13)
    assert solver.gethuv(solver.galewsky_initial_condition()).shape == (3,) + solver.sht.tile_shape


@pytest.mark.parametrize("rings", [RingGeometry.octahedral(12), RingGeometry.healpix(6)], ids=str)
def test_tangent_linear_and_adjoint_on_a_ring_grid(grid, rings):
    """Exact adjoints whatever the rings' quadrature (HEALPix's integrates only approximately)."""
    swe = ShallowWaterSolver(RingTiles(grid, rings), 600.0, orography="williamson5")
    model = scaled(swe, swe.linearize(swe.williamson5_initial_condition(), 4))
    x = unit_perturbation(swe, 1)
    assert dottest(model, x, model.forward(x), rtol=1e-11) <= 1e-11


def test_restart_on_rings_continues_bit_for_bit(grid, tmp_path, comm):
    pytest.importorskip("zarr")
    path = comm.bcast(str(tmp_path / "ring-restart"), root=0)
    swe = ShallowWaterSolver(RingTiles(grid, RingGeometry.octahedral(10)), 600.0)
    history = swe.new_history()
    state = swe.timestep(swe.galewsky_initial_condition(), 3, history)
    swe.save(path, state, history)
    straight = swe.timestep(state, 2, history)
    loaded, again = swe.load(path)
    assert numpy.array_equal(swe.timestep(loaded, 2, again), straight)
    other = ShallowWaterSolver(RingTiles(grid, RingGeometry.octahedral(12)), 600.0)
    with raises(ValueError, match="rings"):
        other.load(path)
    # an orography of one's own is stored as a points variable and compared on load
    rings = RingGeometry.octahedral(10)
    heights = 100.0 * numpy.cos(swe.lats) ** 2
    mountains = ShallowWaterSolver(RingTiles(grid, rings), 600.0, orography=heights)
    mountains.save(path, state)
    loaded, _ = mountains.load(path)
    assert numpy.array_equal(loaded, state)
    flatter = ShallowWaterSolver(RingTiles(grid, rings), 600.0, orography=0.5 * heights)
    with raises(ValueError, match="orography differs"):
        flatter.load(path)


def test_what_a_model_on_rings_refuses(grid):
    rings = RingGeometry.octahedral(8)
    with raises(ValueError, match="orography must be"):
        ShallowWaterSolver(RingTiles(grid, rings), 600.0, orography=numpy.zeros(10))
    with raises(TypeError, match="the tiling gives the grid"):
        ShallowWaterSolver(RingTiles(grid, rings), nlat=8, dt=600.0)
    with raises(TypeError, match="dt given twice"):
        ShallowWaterSolver(RingTiles(grid, rings), 600.0, dt=600.0)
    # the form deprecated in 0.4.0, a RingGeometry in place of nlat, is refused with the form to use
    with raises(TypeError, match=r"removed in 0.4.3.*ShallowWaterSolver\(RingTiles\(grid, rings\), dt\)"):
        ShallowWaterSolver(grid, rings, None, 600.0)


def test_a_model_on_a_regular_tiling_is_the_model_on_nlat_and_nlon(grid):
    """A regular tiling is (nlat, nlon): the two forms build the same model."""
    regular = ShallowWaterSolver(grid.tiling(16, 32), 600.0, quadrature="legendre-gauss")
    same = ShallowWaterSolver(grid, 16, 32, 600.0, quadrature="legendre-gauss")
    numpy.testing.assert_array_equal(regular.galewsky_initial_condition(), same.galewsky_initial_condition())
