"""The shallow-water model's initial conditions and orography, as functions of a built model.

Each function takes a :class:`~mpisphere.examples.ShallowWaterSolver`
(``model``) and returns this rank's block of the state, ``(3, l_loc,
m_loc)`` complex, made from the model's own points (``model.lats``,
``model.lons``: a tile's rows and columns, or a reduced grid's points) and
transforms; the model's methods of the same names call them. The cases
are Galewsky et al. (2004)'s jet, Williamson et al. (1992)'s cases 2, 5 and
6, and torch-harmonics' random state.
"""

import math

import numpy

__all__ = ["williamson5_orography", "galewsky", "williamson2", "williamson5", "williamson6",
           "rossby_haurwitz_speed", "random_state"]


def williamson5_orography(lats, lons):
    """Williamson et al. (1992) case 5's mountain (m) at ``lats``, ``lons`` (radians, broadcast together).

    ``2000 (1 - r / R)`` within ``R = pi / 9`` of (30 N, 270 E), ``r`` the
    distance in the paper's ``(lon, lat)`` plane, zero outside.
    """
    radius = math.pi / 9.0
    r = numpy.minimum(radius, numpy.sqrt((lons - 1.5 * math.pi) ** 2 + (lats - math.pi / 6.0) ** 2))
    return 2000.0 * (1.0 - r / radius)


def points(model):
    """Latitude and longitude of every point the model holds on this rank, broadcast to its tile's shape."""
    return numpy.broadcast_arrays(model.lats.reshape(model.lats.shape[0], *([1] * (model._grid_axes - 1))),
                                  model.lons)


def _balanced(model, ugrid, geopotential):
    """The state from winds and a geopotential, adjusted to balance the zonal flow (as torch-harmonics)."""
    vrtdivspec = model.vrtdivspec(ugrid)
    vrtdivgrid = model.spec2grid(vrtdivspec)
    tmp = ugrid * (vrtdivgrid + model.coriolis)
    tmpspec = model.vrtdivspec(tmp)
    tmpspec[1] = model.grid2spec(0.5 * numpy.sum(ugrid ** 2, axis=0))
    phispec = model.inverse_laplacian.forward(tmpspec[0]) - tmpspec[1] + model.grid2spec(geopotential)
    uspec = numpy.zeros((3,) + model.sht.block_shape, dtype=vrtdivspec.dtype)
    uspec[0] = phispec
    uspec[1:] = vrtdivspec
    return uspec * model.triangle


def _state(model, geopotential, winds):
    """The state of a geopotential and winds on the model's points, truncated to its triangle."""
    uspec = numpy.zeros((3,) + model.sht.block_shape, dtype=model.sht.cdtype)
    uspec[0] = model.grid2spec(geopotential)
    uspec[1:] = model.vrtdivspec(winds)
    return uspec * model.triangle


def galewsky(model):
    """Galewsky et al. (2004)'s barotropically unstable jet with a height perturbation."""
    umax = 80.0
    phi0 = math.pi / 7.0
    phi1 = 0.5 * math.pi - phi0
    phi2 = 0.25 * math.pi
    en = math.exp(-4.0 / (phi1 - phi0) ** 2)
    alpha, beta = 1.0 / 3.0, 1.0 / 15.0
    lats, lons = points(model)
    mask = (lats > phi0) & (lats < phi1)
    product = numpy.where(mask, (lats - phi0) * (lats - phi1), -1.0)  # safe outside the band
    ugrid = numpy.where(mask, (umax / en) * numpy.exp(1.0 / product), 0.0)
    vgrid = numpy.zeros_like(ugrid)
    hbump = model.hamp * numpy.cos(lats) * numpy.exp(-(((lons - math.pi) / alpha) ** 2)) * \
        numpy.exp(-((phi2 - lats) ** 2) / beta)
    return _balanced(model, numpy.stack([ugrid, vgrid]), model.gravity * (model.havg + hbump))


def _zonal_wind(model, u0):
    lats, _ = points(model)
    return lats, numpy.stack([u0 * numpy.cos(lats), numpy.zeros_like(lats)])


def williamson2(model, u0=None, gh0=2.94e4):
    """Williamson et al. (1992) test case 2 (rotation angle 0): ``(uspec, geopotential on the tile)``."""
    u0 = 2.0 * math.pi * model.radius / (12.0 * 86400.0) if u0 is None else u0
    lats, wind = _zonal_wind(model, u0)
    geopotential = gh0 - (model.radius * model.omega * u0 + 0.5 * u0 ** 2) * numpy.sin(lats) ** 2
    return _state(model, geopotential, wind), geopotential


def williamson5(model, u0=20.0, h0=5960.0):
    """Williamson et al. (1992) test case 5: zonal flow over an isolated mountain (the depth's geopotential)."""
    lats, wind = _zonal_wind(model, u0)
    surface = model.gravity * h0 - (model.radius * model.omega * u0 + 0.5 * u0 ** 2) * numpy.sin(lats) ** 2
    return _state(model, surface - model.surface_geopotential, wind)


def williamson6(model, omega=7.848e-6, k=7.848e-6, wavenumber=4, h0=8000.0):
    """Williamson et al. (1992) test case 6: the Rossby-Haurwitz wave (the paper's A, B and C)."""
    a, big, r = model.radius, model.omega, wavenumber
    lats, lons = points(model)
    c, s = numpy.cos(lats), numpy.sin(lats)
    u = a * omega * c + a * k * c ** (r - 1) * (r * s ** 2 - c ** 2) * numpy.cos(r * lons)
    v = -a * k * r * c ** (r - 1) * s * numpy.sin(r * lons)
    coef_a = 0.5 * omega * (2 * big + omega) * c ** 2 + 0.25 * k ** 2 * c ** (2 * r) * (
        (r + 1) * c ** 2 + (2 * r ** 2 - r - 2) - 2 * r ** 2 * c ** -2.0)
    coef_b = 2 * (big + omega) * k / ((r + 1) * (r + 2)) * c ** r * ((r ** 2 + 2 * r + 2) - (r + 1) ** 2 * c ** 2)
    coef_c = 0.25 * k ** 2 * c ** (2 * r) * ((r + 1) * c ** 2 - (r + 2))
    geopotential = model.gravity * h0 + a ** 2 * (coef_a + coef_b * numpy.cos(r * lons)
                                                  + coef_c * numpy.cos(2 * r * lons))
    return _state(model, geopotential - model.surface_geopotential, numpy.stack([u, v]))


def rossby_haurwitz_speed(model, omega=7.848e-6, wavenumber=4):
    """``(R (3 + R) omega - 2 Omega) / ((1 + R) (2 + R))`` (rad/s; Haurwitz 1940, Williamson et al. 1992, eq. 141)."""
    r = wavenumber
    return (r * (3 + r) * omega - 2 * model.omega) / ((1 + r) * (2 + r))


def random_state(model, mach=0.1, seed=0):
    """Random coefficients up to degree 120 (as torch-harmonics), the same field on every grid."""
    limit = min(120, model.lmax)
    rng = numpy.random.default_rng(seed)
    whole = numpy.zeros((3, model.lmax, model.mmax), dtype=model.sht.cdtype)
    shape = (3, limit, min(limit, model.mmax))
    whole[:, :limit, :shape[2]] = math.sqrt(4 * math.pi / limit / (limit + 1)) * (
        rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / math.sqrt(2)
    whole[0] *= model.gravity * model.hamp
    whole[0, 0, 0] += math.sqrt(4 * math.pi) * model.havg * model.gravity
    whole[1:] *= mach * math.sqrt(model.gravity * model.havg) / model.radius
    l0, m0 = model.sht.local_degrees, model.sht.local_orders
    return whole[:, l0][:, :, m0] * model.triangle
