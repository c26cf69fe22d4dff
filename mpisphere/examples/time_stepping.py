"""The shallow-water model's time schemes, one module for the model, its tangent-linear and its adjoint.

The explicit scheme is torch-harmonics' (its 0.9.3 shallow-water example):
third-order Adams-Bashforth started with forward Euler and a first-order
second step, then an implicit diffusion ``D``::

    u_{n+1} = D (u_n + dt sum_j c_{n,j} f(u_{n-j}))

with the weights ``c`` of ``adams_bashforth`` (``integrate``).

The semi-implicit scheme (``integrate_leapfrog``) is the spectral
models' (STSWM's): leapfrog with a linear part ``L`` of the tendency (the
gravity waves) averaged over the two ends of the step, and a
Robert-Asselin filter of strength ``alpha``::

    u_{n+1} = D^2 S_dt ((I + dt L) v_{n-1} + 2 dt (f - L)(u_n)),   S_tau = (I - tau L)^-1
    v_n     = u_n + alpha (v_{n-1} - 2 u_n + u_{n+1})

where ``v`` is the filtered state; its first step is the trapezoidal one
of length ``dt``, ``u_1 = D S_{dt/2} (u_0 + dt f(u_0) - dt/2 L u_0)``,
and ``v_0 = u_0``.

The nonlinear model and its tangent-linear run the same functions (with
``f`` the tendency or its Jacobian at step ``n``); the adjoint runs the
recurrences transposed, backwards in time (``integrate_adjoint``,
``integrate_leapfrog_adjoint``).
"""

import numpy

__all__ = ["AdamsBashforthHistory", "ImplicitPart", "LeapfrogHistory", "adams_bashforth", "integrate",
           "integrate_adjoint", "integrate_leapfrog", "integrate_leapfrog_adjoint"]


class ImplicitPart:
    """The linear part ``L`` of a tendency taken implicitly, as four callables on arrays of the state's shape.

    Parameters
    ----------
    apply, apply_adjoint : callable
        ``L x`` and ``L^T x`` (new arrays).
    solve, solve_adjoint : callable
        ``solve(x, tau)``: ``(I - tau L)^-1 x``, and its transpose (new arrays).
    """

    def __init__(self, apply, apply_adjoint, solve, solve_adjoint):
        self.apply, self.apply_adjoint = apply, apply_adjoint
        self.solve, self.solve_adjoint = solve, solve_adjoint


class AdamsBashforthHistory:
    """What the scheme remembers between calls: the steps taken and the latest two tendencies.

    Pass one to ``integrate`` (or ``ShallowWaterSolver.timestep``) to
    continue a run where the previous call stopped: the calls then take
    the same steps, bit for bit, as one call of their total length. A
    checkpoint stores it (``ShallowWaterSolver.save``).

    Attributes
    ----------
    step : int
        Steps taken so far (the next step's number).
    tendencies : dict
        ``{step: tendency}`` of the latest two steps (fewer at the start):
        this rank's blocks, like the state.
    """

    def __init__(self, step=0, tendencies=None):
        self.step = int(step)
        self.tendencies = dict(tendencies or {})

    def __repr__(self):
        return f"AdamsBashforthHistory(step={self.step}, tendencies of steps {sorted(self.tendencies)})"


def adams_bashforth(step):
    """``[(lag, weight)]`` of the tendencies that step ``step`` adds (times ``dt``).

    Third-order Adams-Bashforth from step 2 on; steps 0 and 1 are
    torch-harmonics' start (its ``timestep``): forward Euler, then the AB3
    weights with the missing oldest tendency replaced by the newest,
    ``28/12 f_1 - 16/12 f_0`` (first-order, not the AB2 ``3/2, -1/2`` its
    comment names; kept so that the two models agree).
    """
    if step == 0:
        return [(0, 1.0)]
    if step == 1:
        return [(0, 28.0 / 12.0), (1, -16.0 / 12.0)]
    return [(0, 23.0 / 12.0), (1, -16.0 / 12.0), (2, 5.0 / 12.0)]


def integrate(state, nsteps, dt, tendency, diffuse, history=None):
    """``nsteps`` steps of the scheme from ``state``; returns the final state.

    Parameters
    ----------
    state : ndarray
        The state at step 0 (not modified).
    nsteps : int
    dt : float
    tendency : callable
        ``tendency(n, u_n)``: ``f(u_n)`` (the model) or ``F_n du_n`` (the
        tangent-linear model), a new array.
    diffuse : callable
        ``diffuse(u)``: ``D u``, in place on ``u`` (an array of this
        function's own), returning it.
    history : AdamsBashforthHistory, optional
        Continue from it (updated in place); without one the scheme starts
        afresh at step 0.
    """
    first = 0 if history is None else history.step
    tendencies = {} if history is None else dict(history.tendencies)
    for n in range(first, first + nsteps):
        tendencies[n] = tendency(n, state)
        increment = sum(weight * tendencies[n - lag] for lag, weight in adams_bashforth(n))
        state = diffuse(state + dt * increment)
        tendencies.pop(n - 2, None)
    if history is not None:
        history.step = first + nsteps
        history.tendencies = tendencies
    return state


def integrate_adjoint(adjoint, nsteps, dt, tendency_adjoint, diffuse_adjoint):
    """The adjoint of ``integrate``'s linear recurrence (the tangent-linear one) applied to ``adjoint``.

    Parameters
    ----------
    adjoint : ndarray
        The adjoint variable at step ``nsteps`` (not modified).
    tendency_adjoint : callable
        ``tendency_adjoint(n, a)``: ``F_n^T a``, a new array.
    diffuse_adjoint : callable
        ``diffuse_adjoint(a)``: ``D^T a``, in place on ``a`` (an array of this
        function's own), returning it.
    """
    a = adjoint.copy()
    pending = {}  # step k -> what the steps that used F_k du_k send back to it
    for n in range(nsteps - 1, -1, -1):
        w = diffuse_adjoint(a)  # D^T a_{n+1}; a is not used again
        for lag, weight in adams_bashforth(n):
            contribution = (dt * weight) * w
            pending[n - lag] = pending[n - lag] + contribution if n - lag in pending else contribution
        back = pending.pop(n)
        a = w + tendency_adjoint(n, back)
    return a


class LeapfrogHistory:
    """What the semi-implicit leapfrog remembers between calls: the steps taken and the filtered previous state.

    The counterpart of :class:`AdamsBashforthHistory` for
    ``integrate_leapfrog`` (``ShallowWaterSolver(scheme="semi-implicit")``).

    Attributes
    ----------
    step : int
        Steps taken so far (the next step's number).
    previous : ndarray or None
        The filtered state of the step before the current one (``v_{n-1}``),
        this rank's block; None before the first step.
    """

    def __init__(self, step=0, previous=None):
        self.step = int(step)
        self.previous = previous

    def __repr__(self):
        return f"LeapfrogHistory(step={self.step}, {'no' if self.previous is None else 'a'} previous state)"


def _diffuse_twice(diffuse, x):
    return diffuse(diffuse(x))


def integrate_leapfrog(state, nsteps, dt, tendency, diffuse, implicit, alpha, history=None):
    """``nsteps`` steps of the semi-implicit leapfrog (see the module's docstring); returns the final state.

    Parameters
    ----------
    state : ndarray
        The state at the first step (not modified).
    nsteps : int
    dt : float
        The step (a leapfrog step spans ``2 dt``).
    tendency, diffuse : callable
        As in ``integrate``; ``diffuse`` is one step's (applied twice per leapfrog step).
    implicit : ImplicitPart
        ``L``, the part averaged over the ends of each step.
    alpha : float
        The Robert-Asselin filter's strength.
    history : LeapfrogHistory, optional
        Continue from it (updated in place); without one the scheme starts
        afresh at step 0.
    """
    first = 0 if history is None else history.step
    previous = None if history is None else history.previous
    for n in range(first, first + nsteps):
        linear = implicit.apply(state)
        explicit = tendency(n, state) - linear
        if n == 0:
            new = diffuse(implicit.solve(state + (0.5 * dt) * linear + dt * explicit, 0.5 * dt))
            previous = state
        else:
            new = _diffuse_twice(diffuse, implicit.solve(previous + dt * implicit.apply(previous)
                                                         + (2.0 * dt) * explicit, dt))
            previous = state + alpha * (previous - 2.0 * state + new)
        state = new
    if history is not None:
        history.step = first + nsteps
        history.previous = previous
    return state


def integrate_leapfrog_adjoint(adjoint, nsteps, dt, tendency_adjoint, diffuse_adjoint, implicit, alpha):
    """The adjoint of ``integrate_leapfrog``'s linear recurrence (from step 0) applied to ``adjoint``.

    The forward recurrence carries ``(v_{n-1}, u_n)``; its transpose carries
    their adjoints ``(b, a)`` back from ``(0, adjoint)`` at the last step.
    """
    a = adjoint.copy()
    b = numpy.zeros_like(a)  # the adjoint of the filtered previous state: zero after the last step
    for n in range(nsteps - 1, 0, -1):
        w = implicit.solve_adjoint(_diffuse_twice(diffuse_adjoint, a + alpha * b), dt)
        a, b = ((1.0 - 2.0 * alpha) * b + (2.0 * dt) * (tendency_adjoint(n, w) - implicit.apply_adjoint(w)),
                alpha * b + w + dt * implicit.apply_adjoint(w))
    if nsteps == 0:
        return a
    w = implicit.solve_adjoint(diffuse_adjoint(a), 0.5 * dt)
    return b + w + dt * tendency_adjoint(0, w) - (0.5 * dt) * implicit.apply_adjoint(w)
