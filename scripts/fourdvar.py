"""A strong-constraint 4D-Var twin experiment with the distributed shallow-water model and its adjoint.

    mpiexec -n 4 python -m mpi4py scripts/fourdvar.py            # about a minute on two cores
    mpiexec -n 4 python -m mpi4py scripts/fourdvar.py --iterations 40 --obs 500

The truth is Galewsky et al. (2004)'s jet after a day of spin-up on a
48 x 96 Gauss grid (T47, 240 s steps). A 6-hour window has observations of the
geopotential every hour at ``--obs`` random points each time (different
points each hour), with Gaussian noise of ``--obs-error`` m^2/s^2. The
background is the truth plus an error drawn from the background-error
covariance ``B``: diagonal in spectral space, per field, with a smooth
degree spectrum, ``B^1/2`` a :class:`mpisphere.Diagonal` on the coefficient
blocks.

The control variable is ``chi`` with ``x0 = xb + B^1/2 chi``, so

    J(chi) = 1/2 |chi|^2 + 1/2 sum_k |H_k M_k x0 - y_k|^2 / sigma_o^2
    grad J = chi + B^1/2 M_1^T (H_1^T d_1 + M_2^T (H_2^T d_2 + ...)) / sigma_o^2

with ``M_k`` the hour of model from observation time ``k - 1`` to ``k``
(``ShallowWaterSolver.linearize`` gives it and its adjoint) and ``H_k`` the
observation operator: the inverse SHT of the geopotential, then bilinear
interpolation to the points (:class:`mpisphere.PointInterpolation`), each a
LinearOperator with its adjoint, composed with ``@``.

How the distributed state meets SciPy: rank 0 runs
``scipy.optimize.minimize(method="L-BFGS-B")`` on the whole control vector
(every coefficient block gathered, as real numbers); each evaluation it
broadcasts the vector, every rank takes its own block, the ranks compute
``J`` and the gradient together, and the gradient blocks are gathered back
(``GatherFrom`` over both grid axes). The optimiser's own arithmetic runs
once, on one rank, so no two ranks can step differently; the other ranks
wait for the next vector or the end, which rank 0 sends also when SciPy
raises. The control vector is ``3 lmax mmax`` complex numbers (55 kB here);
for a state too large for one node, the same loop runs with a distributed
optimiser on ``mpisphere.inner``.

Printed per iteration: ``J``, ``|grad J|``, and the errors of the current
initial state against the truth (area-weighted rms of geopotential and
vorticity). At the end: background against analysis errors at the start and
end of the window, and ``fourdvar_errors.png`` (matplotlib optional). The
exit status is 1 unless the analysis's geopotential error at the start is
below 0.75 of the background's (the default run reaches 0.43).
"""

import argparse
import math
import sys
import time

import numpy
from mpi4py import MPI

from mpisphere import DISTRIBUTED, Diagonal, GatherFrom, Layout, LinearOperator, PointInterpolation, ProcessGrid
from mpisphere.examples import ShallowWaterSolver

HOUR = 3600.0


class Geopotential(LinearOperator):
    """The geopotential's coefficients ``(..., l, m)`` of a state ``(..., 3, l, m)``; adjoint: zeros elsewhere.

    A user's own operator in the simple protocol: ``_forward`` and
    ``_adjoint``; it does no communication.
    """

    def __init__(self, grid):
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)

    def _forward(self, x, out):
        result = x[..., 0, :, :].copy()
        if out is not None:
            out[...] = result
            return out
        return result

    def _adjoint(self, y, out):
        result = numpy.zeros(y.shape[:-2] + (3,) + y.shape[-2:], dtype=y.dtype) if out is None else out
        result[...] = 0
        result[..., 0, :, :] = y
        return result


def degree_spectrum(swe, rms, scale_degree):
    """Standard deviations per coefficient, ``(l_loc, m_loc)``: a Gaussian in degree with grid-point rms ``rms``.

    Each coefficient's real and imaginary parts have this standard deviation
    (the imaginary part of ``m = 0`` is not part of a real field), so the
    grid-point variance is ``sum_l s_l^2 (1 + 4 l) / (4 pi)``.
    """
    l = numpy.arange(swe.lmax, dtype=float)
    shape = numpy.exp(-l * (l + 1) / (scale_degree * (scale_degree + 1)))
    shape[0] = 0.0  # no error in the mean
    shape *= rms / math.sqrt(numpy.sum(shape ** 2 * (1 + 4 * l)) / (4 * math.pi))
    return shape[swe.sht.local_degrees][:, None] * swe.triangle


class TwinExperiment:
    """Truth, observations, background and the 4D-Var cost with its gradient, on one grid (every method collective)."""

    def __init__(self, grid, args):
        self.grid, self.args = grid, args
        self.swe = swe = ShallowWaterSolver(grid, args.nlat, args.nlon, dt=args.dt, quadrature="legendre-gauss")
        self.steps = int(round(HOUR / args.dt))
        rng = numpy.random.default_rng(args.seed)  # the same draws on every rank; each takes its part
        self.truth = swe.timestep(swe.galewsky_initial_condition(), int(round(args.spinup * HOUR / args.dt)))
        # B^1/2: per field, a smooth error (about 1000 km)
        sigma = numpy.stack([degree_spectrum(swe, args.background_error, 8),
                             degree_spectrum(swe, args.background_error * 1e-8, 8),
                             degree_spectrum(swe, args.background_error * 1e-9, 8)])
        self.B_half = Diagonal(sigma, Layout(DISTRIBUTED, grid.cart))
        self.background = self.truth + self.B_half.forward(self._draw(rng))
        # observations: hourly, random points, noisy
        self.H, self.y = [], []
        state = self.truth
        geopotential = Geopotential(grid)
        for _ in range(args.hours):
            state = swe.timestep(state, self.steps)
            lats = numpy.arcsin(rng.uniform(-math.sin(math.radians(85)), math.sin(math.radians(85)), args.obs))
            lons = rng.uniform(0, 2 * math.pi, args.obs)
            points = PointInterpolation(grid, args.nlat, args.nlon, lats, lons, quadrature="legendre-gauss")
            H = points @ swe.isht @ geopotential
            noise = rng.standard_normal(args.obs)[points.indices] * args.obs_error
            self.H.append(H)
            self.y.append(H.forward(state) + noise)
        self.truth_end = state
        self.evaluations = 0

    def _draw(self, rng):
        """A standard normal control vector (real and imaginary parts), the same field on every grid."""
        swe = self.swe
        shape = (3, swe.lmax, swe.mmax)
        whole = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        return whole[:, swe.sht.local_degrees][:, :, swe.sht.local_orders]

    def errors(self, state, reference):
        """Area-weighted rms of geopotential (m^2/s^2) and vorticity (1/s) differences, the same on every rank."""
        diff = self.swe.spec2grid((state - reference)[:2])
        area = 4 * math.pi * self.swe.radius ** 2
        return tuple(math.sqrt(float(v) / area) for v in self.swe.integrate_grid(diff ** 2))

    def cost_and_gradient(self, chi):
        """``J(chi)`` and its gradient on this rank's block; the state at the start and end of the window."""
        sigma_o2 = self.args.obs_error ** 2
        x0 = self.background + self.B_half.forward(chi)
        models, departures = [], []
        state = x0
        for H, y in zip(self.H, self.y):
            model = self.swe.linearize(state, self.steps)
            state = model.final_state
            models.append(model)
            departures.append(H.forward(state) - y)
        local = numpy.array([float(numpy.sum(d ** 2)) for d in departures]).sum()
        jo = 0.5 * self.grid.cart.allreduce(local, op=MPI.SUM) / sigma_o2
        jb = 0.5 * self.grid.cart.allreduce(float(numpy.sum(numpy.abs(chi) ** 2)), op=MPI.SUM)
        if not math.isfinite(jo + jb):  # the same J on every rank, so every rank raises
            raise FloatingPointError(f"J = {jb + jo}: the model blew up in the window (time step too long?)")
        adjoint = numpy.zeros_like(chi)
        for model, H, d in zip(reversed(models), reversed(self.H), reversed(departures)):
            adjoint = model.adjoint(adjoint + H.adjoint(d / sigma_o2))
        gradient = chi + self.B_half.adjoint(adjoint)
        self.evaluations += 1
        return jb + jo, jb, jo, gradient, x0, state


def minimise(grid, experiment, args, report):
    """L-BFGS-B on rank 0 over the gathered control vector; the other ranks evaluate with it (see the docstring)."""
    swe = experiment.swe
    # one after the other: after the first, the array is replicated over grid.polar but still split over
    # grid.azimuth, a layout that composition (which needs the adjoint too) does not describe
    gather_degrees = GatherFrom(grid.polar, -2, swe.lmax)
    gather_orders = GatherFrom(grid.azimuth, -1, swe.mmax)
    degrees, orders = swe.sht.local_degrees, swe.sht.local_orders
    shape = (3, swe.lmax, swe.mmax)
    comm = grid.cart

    def evaluate(vector):
        whole = vector.view(numpy.complex128).reshape(shape)
        chi = numpy.ascontiguousarray(whole[:, degrees][:, :, orders])
        j, jb, jo, gradient, x0, _ = experiment.cost_and_gradient(chi)
        errors = experiment.errors(x0, experiment.truth)
        full = gather_orders.forward(gather_degrees.forward(gradient))
        return j, jb, jo, numpy.ascontiguousarray(full).view(numpy.float64).reshape(-1), errors

    if grid.rank != 0:
        while True:
            vector = comm.bcast(None, root=0)
            if vector is None:
                return None
            evaluate(vector)

    from scipy.optimize import minimize
    seen = {}

    def fun(vector):
        comm.bcast(vector, root=0)
        j, jb, jo, gradient, errors = evaluate(vector)
        seen.clear()
        seen[vector.tobytes()] = (j, jb, jo, float(numpy.linalg.norm(gradient)), errors)
        return j, gradient

    iteration = [0]

    def callback(intermediate_result):
        iteration[0] += 1
        found = seen.get(intermediate_result.x.tobytes())
        if found is not None:
            report(iteration[0], *found)

    x0 = numpy.zeros(2 * math.prod(shape))
    try:
        first = fun(x0)
        report(0, *seen[x0.tobytes()])
        del first
        result = minimize(fun, x0, jac=True, method="L-BFGS-B", callback=callback,
                          options={"maxiter": args.iterations, "gtol": 1e-8, "ftol": 1e-12})
    finally:
        comm.bcast(None, root=0)  # the other ranks stop waiting, also when SciPy raised
    return result


def plot(experiment, analysis, path):
    """Background and analysis geopotential errors at the start of the window (rank 0 writes)."""
    grid, swe = experiment.grid, experiment.swe
    fields = [grid.gather(swe.spec2grid(s[0] - experiment.truth[0])) for s in (experiment.background, analysis)]
    lats = grid.gather(numpy.broadcast_to(swe.lats[:, None], swe.sht.tile_shape).copy())
    lons = grid.gather(numpy.broadcast_to(swe.lons[None, :], swe.sht.tile_shape).copy())
    if grid.rank != 0:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    limit = float(abs(fields[0]).max()) / swe.gravity
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=100, sharey=True, layout="constrained")
    for ax, field, title in zip(axes, fields, ("background error", "analysis error")):
        image = ax.pcolormesh(numpy.degrees(lons[0]), numpy.degrees(lats[:, 0]), field / swe.gravity,
                              cmap="RdBu_r", vmin=-limit, vmax=limit, shading="nearest")
        rms = math.sqrt(float(numpy.mean(field ** 2 * numpy.cos(lats)) / numpy.mean(numpy.cos(lats))))
        ax.set_title(f"{title} (rms {rms / swe.gravity:.1f} m)")
        ax.set_xlabel("longitude (degrees)")
    axes[0].set_ylabel("latitude (degrees)")
    fig.colorbar(image, ax=axes, shrink=0.9, label="height error (m)")
    fig.suptitle("4D-Var with mpisphere: height errors at the start of the window, against the truth")
    fig.savefig(path)
    plt.close(fig)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=48)
    parser.add_argument("--nlon", type=int, default=96)
    parser.add_argument("--dt", type=float, default=240.0,
                        help="time step (s), whole steps to the hour; third-order Adams-Bashforth holds the fastest "
                             "gravity waves up to about 0.7 a / (sqrt(g havg) lmax): 290 s at lmax 48")
    parser.add_argument("--spinup", type=float, default=24.0, help="hours of truth run before the window")
    parser.add_argument("--hours", type=int, default=6, help="window length; observations every hour")
    parser.add_argument("--obs", type=int, default=300, help="observations of the geopotential per hour")
    parser.add_argument("--obs-error", type=float, default=20.0, help="observation error (m^2/s^2)")
    parser.add_argument("--background-error", type=float, default=300.0,
                        help="rms background error of the geopotential (m^2/s^2)")
    parser.add_argument("--iterations", type=int, default=25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--png", default="fourdvar_errors.png")
    args = parser.parse_args(argv)
    if abs(HOUR / args.dt - round(HOUR / args.dt)) > 1e-9:
        parser.error(f"--dt {args.dt} does not divide an hour")
    start = time.perf_counter()
    with ProcessGrid(MPI.COMM_WORLD) as grid:
        experiment = TwinExperiment(grid, args)
        background = experiment.errors(experiment.background, experiment.truth)
        if grid.rank == 0:
            print(f"4D-Var twin experiment on {grid.npolar} x {grid.nazimuth} ranks: {args.nlat} x {args.nlon} Gauss "
                  f"(lmax {experiment.swe.lmax}), dt {args.dt:g} s, {args.hours} h window, {args.obs} geopotential "
                  f"observations an hour (error {args.obs_error:g} m^2/s^2)")
            print(f"  background error: geopotential {background[0]:.2f} m^2/s^2, vorticity {background[1]:.3e} 1/s")
            print(f"  {'iter':>4} {'J':>12} {'Jb':>10} {'Jo':>12} {'|grad J|':>10} {'err phi':>9} {'err zeta':>10}")

        def report(iteration, j, jb, jo, gnorm, errors):
            print(f"  {iteration:4d} {j:12.2f} {jb:10.2f} {jo:12.2f} {gnorm:10.3e} {errors[0]:9.2f} "
                  f"{errors[1]:10.3e}", flush=True)

        result = minimise(grid, experiment, args, report)
        message = grid.cart.bcast(None if result is None else str(result.message), root=0)
        vector = grid.cart.bcast(None if result is None else result.x, root=0)
        swe = experiment.swe
        whole = vector.view(numpy.complex128).reshape(3, swe.lmax, swe.mmax)
        chi = whole[:, swe.sht.local_degrees][:, :, swe.sht.local_orders]
        analysis = experiment.background + experiment.B_half.forward(chi)
        end_a = experiment.errors(_forecast(experiment, analysis), experiment.truth_end)
        end_b = experiment.errors(_forecast(experiment, experiment.background), experiment.truth_end)
        start_a = experiment.errors(analysis, experiment.truth)
        written = plot(experiment, analysis, args.png)
        wall = grid.cart.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if grid.rank == 0:
            print(f"  L-BFGS-B: {message}")
            print(f"  {'':26s} {'geopotential':>14} {'vorticity':>12}")
            print(f"  {'start, background':26s} {background[0]:14.2f} {background[1]:12.3e}")
            print(f"  {'start, analysis':26s} {start_a[0]:14.2f} {start_a[1]:12.3e}")
            print(f"  {'end of window, background':26s} {end_b[0]:14.2f} {end_b[1]:12.3e}")
            print(f"  {'end of window, analysis':26s} {end_a[0]:14.2f} {end_a[1]:12.3e}")
            print(f"  analysis / background error at the start: geopotential {start_a[0] / background[0]:.2f}, "
                  f"vorticity {start_a[1] / background[1]:.2f}; {wall:.0f} s wall")
            print(f"  picture: {args.png}" if written else
                  "  no picture: matplotlib is not installed (pip install 'mpisphere[plot]')")
        return 0 if start_a[0] < 0.75 * background[0] else 1  # clearly better than the background, or fail


def _forecast(experiment, state):
    """The state at the end of the window: the model hour by hour, as the cost runs it."""
    for _ in range(experiment.args.hours):
        state = experiment.swe.timestep(state, experiment.steps)
    return state


if __name__ == "__main__":
    sys.exit(main())
