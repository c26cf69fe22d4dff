"""A distributed spectral shallow-water model on the rotating sphere.

The equations, state, time stepping and method names are those of
torch-harmonics' ``ShallowWaterSolver`` (its 0.9.3 example): the state
``uspec`` holds the spectral coefficients of geopotential, vorticity and
divergence, ``(3, l_loc, m_loc)`` complex, and the tendencies are computed
from products on the grid. Here every array is this rank's block (spectral)
or tile (grid) of a :class:`~mpisphere.ProcessGrid`, the transforms are
mpisphere's distributed ones, and every global quantity (integrals, norms)
is reduced over the grid, so a torch-harmonics script ports by changing its
imports and passing a grid. The model gives the same state on every grid,
up to rounding.

The model is written with the library's operators: the transforms, and
the spectral calculus (:mod:`mpisphere.sht.calculus`: winds to vorticity and
divergence and back, the Laplacian, the hyperdiffusion), so its
tangent-linear and adjoint (:mod:`.tangent_linear`) use the same operators
and their ``.H``.

Time stepping (:mod:`.time_stepping`, shared with the tangent-linear and
adjoint): third-order Adams-Bashforth, started as torch-harmonics starts
it, with implicit hyperdiffusion on vorticity and divergence (an e-folding
time of one hour at the highest degree, applied half a step).

A semi-implicit variant (``scheme="semi-implicit"``) is the spectral
models' leapfrog: the linear gravity-wave terms about a resting reference
depth averaged over the two ends of each step (a 2 x 2 solve per degree),
the rest explicit, and a Robert-Asselin filter; the tangent-linear and
adjoint follow either scheme. Orography
(``orography=``) enters the momentum equation only.

Initial conditions: Galewsky et al. (2004)'s barotropically unstable jet
(:meth:`~mpisphere.examples.ShallowWaterSolver.galewsky_initial_condition`), Williamson et al. (1992)'s test case 2,
steady zonal geostrophic flow with a known exact solution
(:meth:`~mpisphere.examples.ShallowWaterSolver.williamson2_initial_condition`), case 5, zonal flow over an
isolated mountain (:meth:`~mpisphere.examples.ShallowWaterSolver.williamson5_initial_condition`), case 6, the
Rossby-Haurwitz wave of wavenumber 4 (:meth:`~mpisphere.examples.ShallowWaterSolver.williamson6_initial_condition`),
and random fields (:meth:`~mpisphere.examples.ShallowWaterSolver.random_initial_condition`).
"""

import math
import warnings

import numpy

from ..agreement import Call, Described, InputError, agree_construction, collective
from ..primitives import GatherFrom, ReduceFrom
from ..sht import calculus
from . import shallow_water_checkpoints as checkpoints, shallow_water_initial as initial, time_stepping
from .shallow_water_implicit import gravity_waves
from .shallow_water_initial import williamson5_orography
from .tangent_linear import TangentLinearModel
from .. import sht as sht_family
from ..rings import RingGeometry
from ..tiling import Tiling

__all__ = ["ShallowWaterSolver"]


SCHEMES = ("explicit", "semi-implicit")

# The largest Courant number each scheme stays stable at, in the number step_limit() computes: measured on
# Galewsky's jet over one day (2026-12-07). Explicit AB3 with the model's implicit hyperdiffusion: stable at 0.824
# and unstable at 0.863 on the 64 x 128 Gauss grid (dt 210 / 220 s), stable at 0.853 and unstable at 0.882 on O48
# (290 / 300 s); the estimate bounds the fastest mode's frequency from above, which is why this exceeds AB3's
# 0.72 on the imaginary axis. Semi-implicit (advection only, leapfrog): stable at 1.62, growing at 1.73 (64 x 128,
# 2100 / 2250 s).
COURANT_LIMITS = {"explicit": 0.85, "semi-implicit": 1.6}


def _grid_arguments(grid, args, nlat, nlon, dt, lmax, mmax):
    """``(tiling, dt, lmax, mmax, problem)`` from ``(tiling, dt, lmax, mmax)`` or ``(grid, nlat, nlon, dt, lmax,
    mmax)``, positional or by name; ``problem``: why ``grid.tiling(nlat, nlon)`` could not be made (a TypeError or
    ValueError, raised on every rank once the arguments are agreed), else ``None``."""
    who = "ShallowWaterSolver"
    tiling = grid if isinstance(grid, Tiling) else None
    names = ("dt", "lmax", "mmax") if tiling is not None else ("nlat", "nlon", "dt", "lmax", "mmax")
    if len(args) > len(names):
        raise TypeError(f"{who}({'tiling' if tiling is not None else 'grid'}, {', '.join(names)}): "
                        f"{len(args)} arguments after the {'tiling' if tiling is not None else 'grid'}, at most "
                        f"{len(names)}")
    given = {"nlat": nlat, "nlon": nlon, "dt": dt, "lmax": lmax, "mmax": mmax}
    for name, value in zip(names, args):
        if given[name] is not None:
            raise TypeError(f"{who}: {name} given twice (by position and by name)")
        given[name] = value
    if given["dt"] is None:
        raise TypeError(f"{who}: the time step dt is required")
    if tiling is not None and (given["nlat"] is not None or given["nlon"] is not None):
        raise TypeError(f"{who}: the tiling gives the grid; pass no nlat or nlon with it")
    if isinstance(given["nlat"], RingGeometry):
        raise TypeError(f"{who}(grid, rings, None, dt) was removed in 0.4.3 (deprecated since 0.4.0): pass the "
                        "grid's tiling, ShallowWaterSolver(RingTiles(grid, rings), dt)")
    problem = None
    if tiling is None:
        try:
            tiling = grid.tiling(given["nlat"], given["nlon"])
        except (TypeError, ValueError) as exc:
            problem = exc
    return tiling, given["dt"], given["lmax"], given["mmax"], problem


class ShallowWaterSolver(Described):
    """Shallow-water equations on a rotating sphere, spread over a grid of ranks.

    ``ShallowWaterSolver(tiling, dt, lmax=None, mmax=None, ...)``, or for a
    regular grid ``ShallowWaterSolver(grid, nlat, nlon, dt, lmax=None,
    mmax=None, ...)`` (positional or by name).

    Parameters
    ----------
    tiling : Tiling
        The grid as its ranks hold it: ``grid.tiling(nlat, nlon)``, or
        ``RingTiles(grid, rings)`` for a reduced grid, whose fields are this
        rank's points ``(..., npoints)`` where a regular grid's are tiles
        ``(..., h, w)``; the quadrature is then the rings'.
    grid : ProcessGrid
    nlat, nlon : int
        A regular grid's extents (with ``grid``). A reduced grid is passed
        as its tiling (the form ``(grid, rings, None, dt)`` was removed in
        0.4.3).
    dt : float
        Time step, seconds.
    lmax, mmax : int, optional
        Truncation (resolved by :func:`~mpisphere.truncate_sht`).
    quadrature : {"equiangular", "legendre-gauss", "lobatto"}, keyword-only
        torch-harmonics' ``grid=``.
    radius, omega, gravity, havg, hamp : float, keyword-only
        Sphere radius (m), rotation rate (1/s), gravity (m/s^2), mean depth
        and the height of Galewsky's perturbation (m); the Earth's values by
        default, as in torch-harmonics.
    orders : {"contiguous", "balanced"}, keyword-only
        The order layout of the four transforms (and so of the state's
        blocks): see :class:`~mpisphere.DistributedRealSHT`.
    orography : None, "williamson5" or ndarray, keyword-only
        The height of the surface (m) under the fluid: none (flat, the
        default), the isolated mountain of Williamson et al. (1992)'s case 5
        (2000 m, radius pi/9, centred at 30 N, 270 E), or this rank's tile
        ``(h, w)`` of a field of your own. The state's geopotential is then
        the fluid's depth times gravity, and the momentum equation takes the
        gradient of the depth's geopotential plus ``gravity * orography``.
    scheme : {"explicit", "semi-implicit"}, keyword-only
        ``"explicit"``: torch-harmonics' third-order Adams-Bashforth (the
        default; the same state as torch-harmonics' model to rounding when
        torch runs in float64, to float32's precision in torch's default
        float32, see :doc:`/guide/shallow-water`). ``"semi-implicit"``: leapfrog
        (steps of ``2 dt`` from the filtered state before) with the linear
        gravity-wave terms about a resting state of depth
        ``reference_depth`` (``d phi/dt = -g H delta``, ``d delta/dt = -lap
        phi``) averaged over the ends of the step, solved per degree in
        spectral space (a 2 x 2 system), the rest explicit, and a
        Robert-Asselin filter of strength ``robert_asselin``; it starts
        with one trapezoidal step. The gravity waves then no longer limit
        ``dt``; the flow's speed does (docs/williamson.md: five times the
        explicit step in Williamson's cases 2, 5 and 6). Its history is a
        :class:`~mpisphere.examples.LeapfrogHistory`.
    reference_depth : float, keyword-only
        The semi-implicit scheme's resting depth (m); ``havg`` by default.
        The scheme is stable for a reference of at least half the flow's
        largest depth (Simmons, Hoskins and Burridge 1978); a reference near
        the largest depth is the usual choice.
    robert_asselin : float, keyword-only
        The semi-implicit scheme's filter strength (0.05 by default): it
        damps leapfrog's computational mode, at the cost of first-order
        damping of the physical one.

    Attributes
    ----------
    lats, lons : ndarray
        Latitudes (radians, north first) of this rank's tile rows and
        longitudes of its columns.
    coriolis : ndarray, shape ``(h, 1)``
        ``2 omega sin(lat)`` on the tile rows.
    lap, invlap, hyperdiff : ndarray, shape ``(l_loc, m_loc)``
        The Laplacian, its inverse (0 at ``l = 0``) and the hyperdiffusion
        factor on this rank's block (torch-harmonics' arrays; the model
        itself applies the operators below).
    laplacian, inverse_laplacian, hyperdiffusion : LinearOperator
        The same as operators on coefficient blocks
        (``mpisphere.sht.calculus.laplacian`` and its neighbours).
    uv_to_vrtdiv, vrtdiv_to_uv : LinearOperator
        Winds ``(..., 2, h, w)`` to the coefficients of vorticity and
        divergence ``(..., 2, l_loc, m_loc)`` and back
        (:mod:`mpisphere.sht.calculus`).
    quad_weights : ndarray, shape ``(h, 1)``
        Quadrature weights of the tile rows (for ``x = cos(theta)``).

    Notes
    -----
    ``uspec`` is this rank's block ``(3, l_loc, m_loc)`` of the coefficients
    of geopotential (m^2/s^2), vorticity and divergence (1/s); grid fields
    are this rank's tiles ``(..., h, w)``; winds are ``(u, v)``, eastward and
    northward, ``(2, h, w)``. Every method is collective over ``grid.cart``.

    Construction is collective too: the ranks agree on every argument (the
    time step, the radius, gravity, ... by value) before anything is built,
    so a model built with another ``dt`` on one rank raises on every rank.
    The global reductions (:meth:`integrate_grid`, :meth:`diagnostics`) are
    mpisphere operators and agree like any other call.
    """

    _per_rank = ("orography",)  # a tile of the caller's own orography differs between ranks

    def __init__(self, grid, *args, nlat=None, nlon=None, dt=None, lmax=None, mmax=None, quadrature="equiangular",
                 radius=6.37122e6, omega=7.292e-5, gravity=9.80616, havg=10.0e3, hamp=120.0,
                 orders="contiguous", orography=None, scheme="explicit", reference_depth=None,
                 robert_asselin=0.05):
        tiling, dt, lmax, mmax, problem = _grid_arguments(grid, args, nlat, nlon, dt, lmax, mmax)
        grid = grid if tiling is None else tiling.grid
        # what the ranks compare: every argument by name, whichever form the call used, the points by value
        built = {k: v for k, v in self._called_with().items() if k not in ("grid", "args", "nlat", "nlon")}
        self._arguments_are(grid=grid, **{**built, "points": None if tiling is None else tiling.description(),
                                          "dt": dt, "lmax": lmax, "mmax": mmax})
        error = None if problem is None else InputError(str(problem), type(problem))
        tile = None if tiling is None else tuple(tiling.local_shape())  # this rank's part, where a check needs it
        if error is not None:
            pass  # no tiling: nothing else can be checked
        elif scheme not in SCHEMES:
            error = InputError(f"scheme must be {' or '.join(map(repr, SCHEMES))}, got {scheme!r}")
        elif not (orography is None or isinstance(orography, str) and orography == "williamson5"
                  or isinstance(orography, numpy.ndarray)
                  and orography.shape == tile and orography.dtype.kind == "f"):
            error = InputError(f"orography must be None, 'williamson5' or this rank's tile "
                               f"{tile} of real heights, got "
                               f"{type(orography).__name__} {getattr(orography, 'shape', orography)!r}")
        agree_construction(self, grid.cart, error=error)
        self.scheme = scheme
        self.grid, self.tiling = grid, tiling  # the tiling: which points each rank holds, and what serves them
        self.dt = float(dt)

        self.radius, self.omega, self.gravity = float(radius), float(omega), float(gravity)
        self.havg, self.hamp = float(havg), float(hamp)
        self.reference_depth = self.havg if reference_depth is None else float(reference_depth)
        self.robert_asselin = float(robert_asselin)
        self.sht, self.isht, self.vsht, self.ivsht = tiling.transforms(sht_family, lmax, mmax, quadrature,
                                                                       csphase=False, orders=orders)
        self.lmax, self.mmax = self.sht.lmax, self.sht.mmax
        self.quadrature = self.sht.quadrature
        self._grid_axes = len(self.sht.tile_shape)  # 2 (rows, columns) or 1 (a reduced grid's points)
        points = tiling.points(quadrature)
        self.nlat = points.nrings
        self.nlon = tiling.parameters(quadrature).get("nlon")  # None on a reduced grid: each ring has its own
        self.lats = (0.5 * math.pi - points.colatitudes).reshape(-1)
        self.lons = numpy.asarray(points.longitudes).reshape(-1)
        self.quad_weights = points.weights
        self.coriolis = 2.0 * self.omega * numpy.sin(0.5 * math.pi - points.colatitudes)
        self._dlon = points.spacing
        self._rows = points.rings
        if orography is None:
            self.orography = numpy.zeros(self.sht.tile_shape)
        elif isinstance(orography, str):
            self.orography = williamson5_orography(*initial.points(self))
        else:
            self.orography = numpy.array(orography, dtype=numpy.float64)
        self._orography_kind = "none" if orography is None else (orography if isinstance(orography, str)
                                                                  else "array")
        self.surface_geopotential = self.gravity * self.orography

        l = self.sht.local_degrees.astype(float)[:, None] * numpy.ones(self.sht.block_shape)
        m = self.sht.local_orders[None, :] * numpy.ones(self.sht.block_shape)
        self.l, self.m = l, m
        self.triangle = (m <= l).astype(float)  # torch.tril on the block: orders above the degree are zero

        self.laplacian = calculus.laplacian(self.sht, self.radius)
        self.hyperdiffusion = calculus.hyperdiffusion(self.sht, self.dt)
        self.uv_to_vrtdiv = calculus.uv_to_vrtdiv(self.vsht, self.radius)
        self.vrtdiv_to_uv = calculus.vrtdiv_to_uv(self.ivsht, self.radius)
        self.lap = self.laplacian.weights
        self.inverse_laplacian = calculus.inverse_laplacian(self.sht, self.radius)
        self.invlap = self.inverse_laplacian.weights
        self.hyperdiff = self.hyperdiffusion.weights
        self._implicit = None if scheme == "explicit" else gravity_waves(self.gravity * self.reference_depth,
                                                                            -self.lap)
        self._sum = ReduceFrom(grid.cart)                 # integrals: sums over the ranks, agreed like any call
        self._each = GatherFrom(grid.cart, 0, grid.size)  # numbers from every rank (the largest vorticity, speeds)
        self._step_warned = False  # the step limit's warning: once per model

    # --- transforms, as torch-harmonics names them ------------------------------------------

    def grid2spec(self, ugrid):
        """Grid fields ``(..., h, w)`` -> coefficients ``(..., l_loc, m_loc)``."""
        return self.sht.forward(ugrid)

    def spec2grid(self, uspec):
        """Coefficients -> grid fields."""
        return self.isht.forward(uspec)

    def vrtdivspec(self, ugrid):
        """Winds ``(..., 2, h, w)`` -> coefficients of vorticity and divergence ``(..., 2, l_loc, m_loc)``."""
        return self.uv_to_vrtdiv.forward(ugrid)

    def getuv(self, vrtdivspec):
        """Coefficients of vorticity and divergence -> winds ``(..., 2, h, w)``."""
        return self.vrtdiv_to_uv.forward(vrtdivspec)

    def gethuv(self, uspec):
        """Geopotential and winds on the grid, ``(3, h, w)`` (``(3, npoints)`` on a reduced grid)."""
        return numpy.concatenate([self.spec2grid(uspec[:1]), self.getuv(uspec[1:])], axis=-1 - self._grid_axes)

    def potential_vorticity(self, uspec):
        """Potential vorticity on the grid (scaled as in torch-harmonics)."""
        ugrid = self.spec2grid(uspec)
        return (0.5 * self.havg * self.gravity / self.omega) * (ugrid[1] + self.coriolis) / ugrid[0]

    def dimensionless(self, uspec):
        """Geopotential anomaly over ``hamp g``, vorticity and divergence over ``sqrt(g havg) / radius``, in place.

        torch-harmonics subtracts ``havg g`` from every coefficient; the mean
        lives in the ``l = m = 0`` coefficient alone (``sqrt(4 pi)`` times the
        mean, orthonormal harmonics), so only that one is shifted here, and the
        anomaly field is the one its docstring describes.
        """
        mean = (self.l == 0) & (self.m == 0)
        uspec[0] = (uspec[0] - mean * (math.sqrt(4 * math.pi) * self.havg * self.gravity)) / self.hamp / self.gravity
        uspec[1:] = uspec[1:] * self.radius / math.sqrt(self.gravity * self.havg)
        return uspec

    # --- dynamics ------------------------------------------------------------------------------

    def dudtspec(self, uspec):
        """Time derivatives of geopotential, vorticity and divergence, in spectral space.

        ``d phi/dt = -div(phi v)``, ``d zeta/dt = -div((zeta + f) v)``,
        ``d delta/dt = curl((zeta + f) v) - lap(phi + |v|^2 / 2)``.
        """
        return self._tendency(uspec)[0]

    def _tendency(self, uspec):
        """The tendency and the grid fields it was computed from: ``(dudtspec, (4, h, w))``.

        The fields (geopotential, absolute vorticity, ``u``, ``v``) are the
        trajectory the tangent-linear model is linearised about.
        """
        ugrid = self.spec2grid(uspec[:2])        # phi, zeta on the grid (the divergence is not needed there)
        uvgrid = self.getuv(uspec[1:])           # u, v
        absvort = ugrid[1] + self.coriolis
        fluxes = numpy.stack([uvgrid * absvort, uvgrid * ugrid[0]])
        tmpspec = self.vrtdivspec(fluxes)        # curl and divergence of both fluxes, one transform
        bernoulli = ugrid[0] + 0.5 * (uvgrid[0] ** 2 + uvgrid[1] ** 2)
        energy = self.grid2spec(bernoulli if self._orography_kind == "none" else bernoulli + self.surface_geopotential)
        dudtspec = numpy.empty_like(uspec)
        dudtspec[0] = -tmpspec[1, 1]
        dudtspec[1] = -tmpspec[0, 1]
        dudtspec[2] = tmpspec[0, 0] - self.laplacian.forward(energy)
        return dudtspec, numpy.stack([ugrid[0], absvort, uvgrid[0], uvgrid[1]])

    @collective
    def step_limit(self, uspec):
        """The Courant number of ``dt`` on the state ``uspec`` and the largest step the scheme keeps stable.

        The fastest frequency of the model's highest degree ``L = lmax - 1``
        on this state is bounded by ``(sqrt(L (L + 1)) c + L |v|) / radius``,
        with ``c = sqrt(phi)`` the gravity-wave speed and ``|v|`` the wind
        speed, each the largest over the sphere (the semi-implicit scheme
        treats gravity waves implicitly: advection only). The Courant number
        is ``dt`` times that; the scheme is stable below the limit measured for
        it (``COURANT_LIMITS``: 0.85 explicit, 1.6 semi-implicit).
        :meth:`timestep` warns once per model (a ``RuntimeWarning``, the same
        on every rank) when a call starts above it.

        Returns
        -------
        courant : float
        largest_dt : float
            The step (s) at which the Courant number meets the limit on this
            state (``inf`` at rest). Both are the same on every rank.
        """
        return self._courant(self.spec2grid(uspec[:1])[0], self.getuv(uspec[1:]))

    def _courant(self, phi, uv):
        """``(courant, largest_dt)`` from this rank's geopotential and winds (one gather of two numbers)."""
        local = numpy.zeros((1, 2))
        if phi.size:
            local[0] = max(float(phi.max()), 0.0), float((uv[0] ** 2 + uv[1] ** 2).max())
        top = self._each.forward(local).max(axis=0)
        L = self.lmax - 1
        gravity_waves = math.sqrt(L * (L + 1) * top[0]) if self._implicit is None else 0.0
        rate = (gravity_waves + L * math.sqrt(top[1])) / self.radius
        limit = COURANT_LIMITS[self.scheme]
        return self.dt * rate, (limit / rate if rate > 0 else math.inf)

    def _check_step(self, fields):
        """Warn once (every rank alike) when ``dt`` is above the scheme's stable step on the state of ``fields``."""
        if self._step_warned:
            return
        courant, largest = self._courant(fields[0], fields[2:4])
        if courant > COURANT_LIMITS[self.scheme]:
            self._step_warned = True
            warnings.warn(
                f"ShallowWaterSolver: dt={self.dt:g} s is above the {self.scheme} scheme's stable step on this state: "
                f"Courant number {courant:.3f} (the scheme's limit {COURANT_LIMITS[self.scheme]:g}, with the "
                f"fastest gravity wave and wind of the state at degree {self.lmax - 1}); the largest stable step is "
                f"about {largest:.0f} s. The highest degrees will grow (ripples, then a blow-up): take dt <= "
                f"{largest:.0f}" + (" or scheme='semi-implicit'" if self._implicit is None else "")
                + " (step_limit(state) computes both).", RuntimeWarning, stacklevel=4)

    @collective
    def timestep(self, uspec, nsteps, history=None):
        """Integrate ``nsteps`` steps of the model's scheme, with hyperdiffusion; returns the new state.

        The explicit scheme is Adams-Bashforth 3 (started as torch-harmonics
        starts it); the semi-implicit one leapfrog (see ``scheme``, and
        :mod:`~mpisphere.examples.time_stepping` for both); the
        hyperdiffusion is implicit, on vorticity and divergence.

        Parameters
        ----------
        uspec : ndarray, shape ``(3, l_loc, m_loc)``
        nsteps : int
        history : AdamsBashforthHistory or LeapfrogHistory, optional
            Continue the scheme where an earlier call stopped (updated in
            place; start with :meth:`new_history`): calls sharing one
            history take the steps of one long call, bit for bit, and
            :meth:`save` keeps it for a restart. Without one, every call
            starts the scheme afresh with its first step, as
            torch-harmonics' ``timestep`` does.
        """
        checkpoints.check_history(self, history, "ShallowWaterSolver.timestep", uspec)
        first = 0 if history is None else history.step
        final = self._integrate(uspec, nsteps, None, history, check_step=True)
        self._check_finite(final, "ShallowWaterSolver.timestep", first + nsteps)
        return final

    def new_history(self):
        """A fresh history for this model's scheme: an ``AdamsBashforthHistory`` or a ``LeapfrogHistory``."""
        return checkpoints.history_kind(self)()

    def _check_finite(self, state, who, step):
        """Raise on every rank when any rank's state is not finite (the model blew up), naming the step. Collective."""
        call = Call(self.grid.cart, who)
        bad = [name for name, field in zip(("geopotential", "vorticity", "divergence"), state)
               if not numpy.isfinite(field).all()]
        if bad:
            call.fail(f"the state is not finite at step {step} ({', '.join(bad)}): the model blew up; a time step of "
                      f"dt={self.dt:g} s is probably above the scheme's stability limit (try a smaller dt, or "
                      f"scheme='semi-implicit')", FloatingPointError)
        call.agree()

    def diffuse(self, uspec):
        """The implicit hyperdiffusion of one step on vorticity and divergence, in place; returns ``uspec``.

        Its own adjoint (a real diagonal): the adjoint model applies
        ``hyperdiffusion.H`` in the same place.
        """
        uspec[..., 1:, :, :] = self.hyperdiffusion.forward(uspec[..., 1:, :, :])
        return uspec

    def _integrate(self, uspec, nsteps, trajectory, history=None, who="ShallowWaterSolver.timestep",
                   check_step=False):
        pending = [check_step]  # the step's stability is checked on the first state of the call

        def tendency(n, state):
            self._check_finite(state, who, n)
            dudt, fields = self._tendency(state)
            if pending[0]:
                pending[0] = False
                self._check_step(fields)
            if trajectory is not None:
                trajectory.append(fields)
            return dudt
        if self._implicit is None:
            return time_stepping.integrate(uspec, nsteps, self.dt, tendency, self.diffuse, history)
        return time_stepping.integrate_leapfrog(uspec, nsteps, self.dt, tendency, self.diffuse, self._implicit,
                                                self.robert_asselin, history)

    # --- checkpoints -------------------------------------------------------------------------------

    def parameters(self):
        """What a continuation must share with this model: the grid, truncation, time step and constants (a dict)."""
        return checkpoints.parameters(self)

    @collective
    def save(self, path, uspec, history=None, *, keep=2, allow_nonfinite=False):
        """Write a checkpoint: the state, the scheme's history, the step, the time and the parameters. Collective.

        Every rank writes its own blocks (:mod:`mpisphere.io`; needs the
        ``io`` extra). The checkpoint is a new version at ``path``, made
        current only once every rank has written it: a crash while saving
        leaves the previous one current and intact.

        Parameters
        ----------
        path : str or os.PathLike
            The checkpoint directory (every rank sees it).
        uspec : ndarray, shape ``(3, l_loc, m_loc)``
            This rank's block of the state.
        history : AdamsBashforthHistory or LeapfrogHistory, optional
            The run's history (see :meth:`timestep`); without one the
            checkpoint restarts the scheme afresh, like a new run.
        keep : int
            Versions kept at ``path``.
        allow_nonfinite : bool
            Write a state that is not finite (NaN or infinite values, a model
            that blew up) instead of refusing it on every rank.
        """
        checkpoints.save(self, path, uspec, history, keep=keep, allow_nonfinite=allow_nonfinite)

    @collective
    def load(self, path):
        """Read the current checkpoint at ``path`` onto this model's grid: ``(uspec, history)``. Collective.

        The grid of ranks may differ from the writer's (any shape, any
        number of ranks, either order layout); the model's parameters
        (:meth:`parameters`) may not: a checkpoint of another grid,
        truncation, time step or planet raises on every rank. On the
        writer's grid the continuation is bit-identical to the run that was
        not interrupted; on another grid it equals it up to rounding.
        """
        return checkpoints.load(self, path)

    def linearize(self, uspec, nsteps):
        """The tangent-linear model along ``timestep(uspec, nsteps)``, with its adjoint: a LinearOperator.

        Runs the nonlinear model once, storing its trajectory (four tile
        fields per step, ``32 h w`` bytes per step on each rank). The
        returned ``mpisphere.examples.tangent_linear.TangentLinearModel``
        ``M`` maps a perturbation of this rank's block ``(..., 3, l_loc,
        m_loc)`` at the start to the perturbation after ``nsteps`` steps
        (``M.forward``), and back (``M.adjoint``, the gradient of ``<M du,
        au>`` with respect to ``du``); ``M.final_state`` is the nonlinear
        model's state at the end. Collective over ``grid.cart``.
        """
        trajectory = []
        final = self._integrate(uspec, nsteps, trajectory)
        return TangentLinearModel(self, trajectory, final)

    # --- initial conditions ----------------------------------------------------------------------

    def galewsky_initial_condition(self):
        """Galewsky et al. (2004)'s barotropically unstable jet with a height perturbation (this rank's block)."""
        return initial.galewsky(self)

    def williamson2_initial_condition(self, u0=None, gh0=2.94e4):
        """Williamson et al. (1992) test case 2 (rotation angle 0): steady zonal geostrophic flow.

        ``u = u0 cos(lat)``, ``v = 0``, ``g h = gh0 - (radius omega u0 + u0^2 / 2) sin(lat)^2`` with
        ``u0 = 2 pi radius / 12 days``: an exact steady solution, so the state
        should not change. Returns ``(uspec, geopotential on the tile)``.
        """
        return initial.williamson2(self, u0, gh0)

    def williamson5_initial_condition(self, u0=20.0, h0=5960.0):
        """Williamson et al. (1992) test case 5: zonal flow over an isolated mountain.

        Build the model with ``orography="williamson5"``. ``u = u0 cos(lat)``,
        ``v = 0``, a free surface ``g h = g h0 - (radius omega u0 + u0^2 / 2)
        sin(lat)^2`` in balance with it; the state's geopotential is the
        depth's, ``g h - g orography``. Returns ``uspec``.
        """
        return initial.williamson5(self, u0, h0)

    def williamson6_initial_condition(self, omega=7.848e-6, k=7.848e-6, wavenumber=4, h0=8000.0):
        """Williamson et al. (1992) test case 6: the Rossby-Haurwitz wave of wavenumber 4.

        The paper's winds and height (its A, B, C) for ``omega = K = 7.848e-6
        1/s``, ``R = 4``, ``h0 = 8000 m``. For the non-divergent barotropic
        equations the pattern moves east at :meth:`rossby_haurwitz_speed`
        without changing shape; in the shallow-water equations nearly so.
        Returns ``uspec``.
        """
        return initial.williamson6(self, omega, k, wavenumber, h0)

    def rossby_haurwitz_speed(self, omega=7.848e-6, wavenumber=4):
        """The eastward angular speed (rad/s) of case 6's pattern in the non-divergent barotropic equations.

        ``(R (3 + R) omega - 2 Omega) / ((1 + R) (2 + R))`` (Haurwitz 1940,
        Williamson et al. 1992, eq. 141).
        """
        return initial.rossby_haurwitz_speed(self, omega, wavenumber)

    def random_initial_condition(self, mach=0.1, seed=0):
        """Random coefficients up to degree 120 (as torch-harmonics), the same field on every grid."""
        return initial.random_state(self, mach, seed)

    # --- global quantities -------------------------------------------------------------------------

    def integrate_grid(self, ugrid, dimensionless=False, polar_opt=0):
        """The integral over the sphere of each field ``(..., h, w)`` (``(..., npoints)``), the same on every rank."""
        radius = 1.0 if dimensionless else self.radius
        weights = self.quad_weights
        if polar_opt > 0:  # leave out polar_opt rows (rings) at each pole, as torch-harmonics
            weights = weights * ((self._rows >= polar_opt) & (self._rows < self.nlat - polar_opt))
        axes = tuple(range(-self._grid_axes, 0))
        local = numpy.array(numpy.sum(ugrid * weights * self._dlon * radius ** 2, axis=axes), dtype=numpy.float64)
        return self._sum.forward(local)

    def diagnostics(self, uspec):
        """Mass, total energy and the largest absolute relative vorticity, each the same on every rank.

        Mass is the integral of ``h = phi / g`` (m^3); energy the integral of
        ``(phi |v|^2 + phi^2 + 2 phi phi_s) / (2 g)`` (kinetic plus potential,
        J/kg m^2; ``phi_s = g orography``, zero without orography).
        """
        ugrid = self.spec2grid(uspec)
        uv = self.getuv(uspec[1:])
        phi = ugrid[0]
        mass, energy = self.integrate_grid(numpy.stack([phi / self.gravity,
                                                        (phi * (uv[0] ** 2 + uv[1] ** 2) + phi ** 2
                                                         + 2 * phi * self.surface_geopotential) /
                                                        (2 * self.gravity)]))
        vmax = float(self._each.forward(numpy.array([abs(ugrid[1]).max()], dtype=numpy.float64)).max())
        return {"mass": float(mass), "energy": float(energy), "max_vorticity": vmax}
