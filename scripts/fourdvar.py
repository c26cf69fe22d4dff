"""A strong-constraint 4D-Var twin experiment with the distributed shallow-water model and its adjoint.

    mpiexec -n 4 python -m mpi4py scripts/fourdvar.py                  # incremental, about 75 s on two cores
    mpiexec -n 4 python -m mpi4py scripts/fourdvar.py --inner 11,11,11   # a third outer loop
    mpiexec -n 4 python -m mpi4py scripts/fourdvar.py --method lbfgs --iterations 25

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

Two minimisers:

``--method incremental`` (the default; the ``pylops`` extra): incremental
4D-Var as operational systems run it. Each outer loop relinearises the model
along the current guess (``J``, its gradient and the hourly tangent-linear
models), then the inner loop solves the quadratic problem in the increment,
``(I + B^1/2^T G^T G B^1/2 / sigma_o^2) delta = -grad J``, with pylops-mpi's
conjugate gradients on :func:`mpisphere.asmpilinearoperator` of that
Hessian (:class:`GaussNewtonHessian`): every vector is a ``DistributedArray``
whose local part is this rank's control block, and no rank ever holds the
global state. ``--inner 11,11``: two outer loops of 11 CG iterations.

``--method lbfgs``: rank 0 runs ``scipy.optimize.minimize(method="L-BFGS-B")``
on the whole control vector (every coefficient block gathered, as real
numbers); each evaluation it broadcasts the vector, every rank takes its own
block, the ranks compute ``J`` and the gradient together, and the gradient
blocks are gathered back (``GatherFrom`` over both grid axes). The other
ranks wait for the next vector or the end, which rank 0 sends also when SciPy
raises.

Printed per iteration (per outer loop): ``J``, ``|grad J|``, and the errors of the current
initial state against the truth (area-weighted rms of geopotential and
vorticity). At the end: background against analysis errors at the start and
end of the window, every rank's peak resident memory, and
``fourdvar_errors.png`` (matplotlib optional). The
exit status is 1 unless the analysis's geopotential error at the start is
below 0.75 of the background's (the default run reaches 0.39).
"""

import argparse
import math
import resource
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
        self.models = models  # the tangent-linear models along this trajectory (the incremental method's)
        return jb + jo, jb, jo, gradient, x0, state


class GaussNewtonHessian(LinearOperator):
    """``I + B^1/2^T (sum_k G_k^T G_k) B^1/2 / sigma_o^2`` on the control blocks, ``G_k = H_k M_k .. M_1``.

    The Hessian of the quadratic inner problem of incremental 4D-Var, with
    the tangent-linear models of the last linearisation
    (``experiment.models``): one forward sweep of the models, one adjoint
    sweep back, per product. Self-adjoint, so ``adjoint`` is ``forward``.
    """

    def __init__(self, experiment):
        self.experiment = experiment
        self.domain = self.range = Layout(DISTRIBUTED, experiment.grid.cart)

    def _shapes(self, lead):
        shape = lead + (3,) + self.experiment.swe.sht.block_shape
        return shape, shape

    def _forward(self, x, out):
        e = self.experiment
        dx, observed = e.B_half.forward(x), []
        for model, H in zip(e.models, e.H):
            dx = model.forward(dx)
            observed.append(H.forward(dx))
        adjoint = numpy.zeros_like(x)
        for model, H, o in zip(reversed(e.models), reversed(e.H), reversed(observed)):
            adjoint = model.adjoint(adjoint + H.adjoint(o / e.args.obs_error ** 2))
        result = x + e.B_half.adjoint(adjoint)
        if out is not None:
            out[...] = result
            return out
        return result

    _adjoint = _forward


def minimise_incremental(grid, experiment, args, report):
    """Incremental 4D-Var: Gauss-Newton outer loops around pylops-mpi's distributed CG; nothing is gathered.

    Outer loop: linearise the model along the current guess ``chi`` (the
    cost and gradient there, and the hourly tangent-linear models). Inner
    loop: CG on ``A delta = -grad J(chi)`` with ``A`` the
    :class:`GaussNewtonHessian`, as a pylops-mpi operator whose vectors'
    local parts are each rank's control blocks
    (:func:`mpisphere.asmpilinearoperator`). Returns the last ``chi``, the
    CG iterations per outer loop and the seconds spent linearising and in CG.
    """
    import pylops_mpi

    from mpisphere import asmpilinearoperator
    from mpisphere.pylops_bridge import from_distributed, to_distributed

    comm = grid.cart
    chi = numpy.zeros((3,) + experiment.swe.sht.block_shape, dtype=numpy.complex128)
    hessian, inner, seconds = None, [], [0.0, 0.0]
    budgets = [int(n) for n in str(args.inner).split(",")]
    for outer in range(len(budgets) + 1):
        started = time.perf_counter()
        j, jb, jo, gradient, x0, _ = experiment.cost_and_gradient(chi)
        seconds[0] += time.perf_counter() - started
        gnorm = math.sqrt(comm.allreduce(float(numpy.sum(abs(gradient) ** 2)), op=MPI.SUM))
        report(outer, j, jb, jo, gnorm, experiment.errors(x0, experiment.truth))
        if outer == len(budgets):  # the last linearisation only reports the cost of the analysis
            return chi, inner, seconds
        started = time.perf_counter()
        if hessian is None:
            hessian = asmpilinearoperator(GaussNewtonHessian(experiment), dtype=numpy.complex128)
        delta, iterations, _ = pylops_mpi.cg(hessian, to_distributed(-gradient, comm),
                                             to_distributed(numpy.zeros_like(chi), comm), niter=budgets[outer],
                                             tol=1e-10 * gnorm ** 2)
        inner.append(int(iterations))
        seconds[1] += time.perf_counter() - started
        chi = chi + from_distributed(delta, chi.shape, chi.dtype)


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
    parser.add_argument("--method", choices=("incremental", "lbfgs"), default="incremental",
                        help="incremental: Gauss-Newton outer loops, pylops-mpi's CG inside, every vector "
                             "distributed (the pylops extra); lbfgs: SciPy's L-BFGS-B on rank 0 over the gathered "
                             "control vector")
    parser.add_argument("--inner", default="11,11",
                        help="incremental: CG iterations of each outer loop (one outer loop, a relinearisation, per "
                             "entry): the first solve from the background needs the most")
    parser.add_argument("--iterations", type=int, default=25, help="lbfgs: iterations")
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
            label = "outer" if args.method == "incremental" else "iter"
            print(f"  {label:>5} {'J':>12} {'Jb':>10} {'Jo':>12} {'|grad J|':>10} {'err phi':>9} {'err zeta':>10}")

        def report(iteration, j, jb, jo, gnorm, errors):
            if grid.rank != 0:
                return
            print(f"  {iteration:5d} {j:12.2f} {jb:10.2f} {jo:12.2f} {gnorm:10.3e} {errors[0]:9.2f} "
                  f"{errors[1]:10.3e}", flush=True)

        swe = experiment.swe
        if args.method == "incremental":
            chi, inner, seconds = minimise_incremental(grid, experiment, args, report)
            message = (f"{len(inner)} outer loops, CG iterations {inner} (pylops-mpi): {experiment.evaluations} "
                       f"linearisations {seconds[0]:.1f} s, CG {seconds[1]:.1f} s (rank 0)")
        else:
            result = minimise(grid, experiment, args, report)
            message = "L-BFGS-B: " + grid.cart.bcast(None if result is None else str(result.message), root=0)
            message += f", {grid.cart.bcast(experiment.evaluations, root=0)} evaluations of J and its gradient"
            vector = grid.cart.bcast(None if result is None else result.x, root=0)
            whole = vector.view(numpy.complex128).reshape(3, swe.lmax, swe.mmax)
            chi = whole[:, swe.sht.local_degrees][:, :, swe.sht.local_orders]
        # the peak before the picture's gather (the only gather of the incremental method)
        peaks = grid.cart.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, root=0)
        analysis = experiment.background + experiment.B_half.forward(chi)
        end_a = experiment.errors(_forecast(experiment, analysis), experiment.truth_end)
        end_b = experiment.errors(_forecast(experiment, experiment.background), experiment.truth_end)
        start_a = experiment.errors(analysis, experiment.truth)
        written = plot(experiment, analysis, args.png)
        wall = grid.cart.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if grid.rank == 0:
            print(f"  {message}")
            print(f"  {'':26s} {'geopotential':>14} {'vorticity':>12}")
            print(f"  {'start, background':26s} {background[0]:14.2f} {background[1]:12.3e}")
            print(f"  {'start, analysis':26s} {start_a[0]:14.2f} {start_a[1]:12.3e}")
            print(f"  {'end of window, background':26s} {end_b[0]:14.2f} {end_b[1]:12.3e}")
            print(f"  {'end of window, analysis':26s} {end_a[0]:14.2f} {end_a[1]:12.3e}")
            print(f"  analysis / background error at the start: geopotential {start_a[0] / background[0]:.2f}, "
                  f"vorticity {start_a[1] / background[1]:.2f}; {wall:.0f} s wall")
            others = peaks[1:] or [peaks[0]]
            print(f"  peak RSS: rank 0 {peaks[0]:.0f} MB, the other ranks {min(others):.0f}-{max(others):.0f} MB")
            print(f"  picture: {args.png}" if written else
                  "  no picture: matplotlib is not installed (pip install '.[plot]' in the mpisphere clone)")
        return 0 if start_a[0] < 0.75 * background[0] else 1  # clearly better than the background, or fail


def _forecast(experiment, state):
    """The state at the end of the window: the model hour by hour, as the cost runs it."""
    for _ in range(experiment.args.hours):
        state = experiment.swe.timestep(state, experiment.steps)
    return state


if __name__ == "__main__":
    sys.exit(main())
