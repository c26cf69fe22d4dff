"""The shallow-water model's time scheme, one module for the model, its tangent-linear and its adjoint.

The scheme is torch-harmonics' (its 0.9.3 shallow-water example): third-order
Adams-Bashforth started with forward Euler and a first-order second step,
then an implicit diffusion ``D``::

    u_{n+1} = D (u_n + dt sum_j c_{n,j} f(u_{n-j}))

with the weights ``c`` of :func:`adams_bashforth`. The semi-implicit
variant (an :class:`ImplicitPart` given) treats a linear part ``L`` of the
tendency (the gravity waves) with the trapezoidal rule and the rest with
the same Adams-Bashforth weights::

    u_{n+1} = D S ((I + dt/2 L) u_n + dt sum_j c_{n,j} (f - L)(u_{n-j})),   S = (I - dt/2 L)^-1 The nonlinear model and
its tangent-linear run :func:`integrate` (with ``f`` the tendency or its
Jacobian at step ``n``); the adjoint runs :func:`integrate_adjoint`, the
same recurrence transposed: backwards in time, applying each step's
``F_k^T`` once to the sum of what the (up to three) steps that used
``F_k du_k`` send back.
"""

__all__ = ["AdamsBashforthHistory", "ImplicitPart", "adams_bashforth", "integrate", "integrate_adjoint"]


class ImplicitPart:
    """The linear part ``L`` of a tendency taken implicitly, as four callables on arrays of the state's shape.

    Parameters
    ----------
    apply, apply_adjoint : callable
        ``L x`` and ``L^T x`` (new arrays).
    solve, solve_adjoint : callable
        ``(I - dt/2 L)^-1 x`` and its transpose (new arrays).
    """

    def __init__(self, apply, apply_adjoint, solve, solve_adjoint):
        self.apply, self.apply_adjoint = apply, apply_adjoint
        self.solve, self.solve_adjoint = solve, solve_adjoint


class AdamsBashforthHistory:
    """What the scheme remembers between calls: the steps taken and the latest two tendencies.

    Pass one to :func:`integrate` (or ``ShallowWaterSolver.timestep``) to
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


def integrate(state, nsteps, dt, tendency, diffuse, history=None, implicit=None):
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
        afresh at step 0. It holds what the scheme extrapolates: ``f`` in
        the explicit scheme, ``f - L`` in the semi-implicit one.
    implicit : ImplicitPart, optional
        The semi-implicit scheme's ``L``; without, the explicit scheme.
    """
    first = 0 if history is None else history.step
    tendencies = {} if history is None else dict(history.tendencies)
    for n in range(first, first + nsteps):
        if implicit is None:
            tendencies[n] = tendency(n, state)
            increment = sum(weight * tendencies[n - lag] for lag, weight in adams_bashforth(n))
            state = diffuse(state + dt * increment)
        else:
            linear = implicit.apply(state)
            tendencies[n] = tendency(n, state) - linear
            increment = sum(weight * tendencies[n - lag] for lag, weight in adams_bashforth(n))
            state = diffuse(implicit.solve(state + (0.5 * dt) * linear + dt * increment))
        tendencies.pop(n - 2, None)
    if history is not None:
        history.step = first + nsteps
        history.tendencies = tendencies
    return state


def integrate_adjoint(adjoint, nsteps, dt, tendency_adjoint, diffuse_adjoint, implicit=None):
    """The adjoint of :func:`integrate`'s linear recurrence (the tangent-linear one) applied to ``adjoint``.

    Parameters
    ----------
    adjoint : ndarray
        The adjoint variable at step ``nsteps`` (not modified).
    tendency_adjoint : callable
        ``tendency_adjoint(n, a)``: ``F_n^T a``, a new array.
    diffuse_adjoint : callable
        ``diffuse_adjoint(a)``: ``D^T a``, in place on ``a`` (an array of this
        function's own), returning it.
    implicit : ImplicitPart, optional
        The semi-implicit scheme's ``L`` (as in :func:`integrate`).
    """
    a = adjoint.copy()
    pending = {}  # step k -> what the steps that used F_k du_k (or (F_k - L) du_k) send back to it
    for n in range(nsteps - 1, -1, -1):
        w = diffuse_adjoint(a)  # D^T a_{n+1}; a is not used again
        if implicit is not None:
            w = implicit.solve_adjoint(w)
        for lag, weight in adams_bashforth(n):
            contribution = (dt * weight) * w
            pending[n - lag] = pending[n - lag] + contribution if n - lag in pending else contribution
        back = pending.pop(n)
        if implicit is None:
            a = w + tendency_adjoint(n, back)
        else:
            a = w + tendency_adjoint(n, back) + implicit.apply_adjoint((0.5 * dt) * w - back)
    return a
