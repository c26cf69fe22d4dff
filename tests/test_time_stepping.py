"""The semi-implicit leapfrog of ``mpisphere.examples.time_stepping`` on small linear systems (serial).

The shallow-water tests run the scheme inside the model; these check the
recurrence itself against what it claims: second order in ``dt`` without
the Robert-Asselin filter (first order with it), calls continued through a
:class:`LeapfrogHistory` equal to one call bit for bit, and
:func:`integrate_leapfrog_adjoint` the transpose of the tangent-linear
recurrence, compared with the explicit matrix of the forward map.
"""

import numpy
import pytest

from mpisphere.examples.time_stepping import (ImplicitPart, LeapfrogHistory, integrate_leapfrog,
                                              integrate_leapfrog_adjoint)


def implicit_part(matrix):
    eye = numpy.eye(len(matrix))
    return ImplicitPart(apply=lambda x: matrix @ x, apply_adjoint=lambda x: matrix.T @ x,
                        solve=lambda x, tau: numpy.linalg.solve(eye - tau * matrix, x),
                        solve_adjoint=lambda x, tau: numpy.linalg.solve((eye - tau * matrix).T, x))


def in_place(matrix):
    def apply(x):
        x[...] = matrix @ x
        return x
    return apply


def rotation(omega):
    return numpy.array([[0.0, -omega], [omega, 0.0]])


def oscillator_error(dt, alpha, length=2.0):
    """Error at ``t = length`` of the leapfrog on ``u' = (L + F) u``, a fast wave ``L`` implicit, ``F`` explicit."""
    fast, slow = rotation(3.0), rotation(0.7) - 0.1 * numpy.eye(2)
    whole = fast + slow
    start = numpy.array([1.0, 0.5])
    steps = int(round(length / dt))
    got = integrate_leapfrog(start, steps, dt, lambda n, u: whole @ u, lambda u: u, implicit_part(fast), alpha)
    values, vectors = numpy.linalg.eig(whole)
    exact = (vectors @ numpy.diag(numpy.exp(values * length)) @ numpy.linalg.solve(vectors, start)).real
    return numpy.linalg.norm(got - exact)


def test_the_unfiltered_leapfrog_is_second_order_and_the_filter_first():
    unfiltered = [oscillator_error(dt, 0.0) for dt in (0.02, 0.01, 0.005)]
    filtered = [oscillator_error(dt, 0.05) for dt in (0.02, 0.01, 0.005)]
    # errors of 1e-5 to 1e-3: rounding (1e-16) cannot move these ratios
    for coarse, fine in zip(unfiltered, unfiltered[1:]):
        assert 3.6 < coarse / fine < 4.4, unfiltered
    for coarse, fine in zip(filtered, filtered[1:]):
        assert 1.7 < coarse / fine < 2.3, filtered


def test_calls_continued_through_a_history_are_one_call():
    rng = numpy.random.default_rng(3)
    fast, slow = rng.standard_normal((2, 4, 4))
    diffusion = numpy.eye(4) - 0.01 * numpy.diag(rng.random(4))
    start = rng.standard_normal(4)

    def run(state, steps, history):
        return integrate_leapfrog(state, steps, 0.05, lambda n, u: (fast + slow) @ u + 0.1 * numpy.sin(u),
                                  in_place(diffusion), implicit_part(fast), 0.05, history)
    whole = run(start, 7, None)
    history = LeapfrogHistory()
    state = run(start, 3, history)
    assert history.step == 3 and history.previous is not None
    state = run(state, 4, history)
    assert history.step == 7
    numpy.testing.assert_array_equal(state, whole)


@pytest.mark.parametrize("nsteps", [0, 1, 2, 5])
def test_the_adjoint_is_the_transpose_of_the_tangent_linear_recurrence(nsteps):
    rng = numpy.random.default_rng(nsteps)
    size, dt, alpha = 5, 0.1, 0.05
    fast = rng.standard_normal((size, size))
    jacobians = rng.standard_normal((max(nsteps, 1), size, size))  # F_n: another per step
    diffusion = numpy.eye(size) - 0.05 * rng.random((size, size))
    implicit = implicit_part(fast)

    def forward(du):
        return integrate_leapfrog(du, nsteps, dt, lambda n, u: jacobians[n] @ u, in_place(diffusion), implicit,
                                  alpha)
    matrix = numpy.column_stack([forward(e) for e in numpy.eye(size)])
    # rounding is bounded by eps times the norms of the steps' operators (not by the result, which may cancel):
    # a leapfrog step maps (v, u) to sizes at most ``growth`` times theirs
    norm = lambda a: numpy.linalg.norm(a, 2)  # noqa: E731
    solve = max(norm(numpy.linalg.inv(numpy.eye(size) - tau * fast)) for tau in (dt, 0.5 * dt))
    new = norm(diffusion) ** 2 * solve * (1 + dt * norm(fast) + 2 * dt * (max(map(norm, jacobians)) + norm(fast)))
    growth = (1 + alpha) * new + 1 + 3 * alpha
    for trial in range(3):
        y = rng.standard_normal(size)
        got = integrate_leapfrog_adjoint(y, nsteps, dt, lambda n, a: jacobians[n].T @ a, in_place(diffusion.T),
                                         implicit, alpha)
        bound = 100 * (nsteps + 1) * numpy.finfo(float).eps * growth ** nsteps * numpy.linalg.norm(y)
        error = numpy.linalg.norm(got - matrix.T @ y)
        assert error <= bound, (trial, error, bound)
        assert bound < 1e-9 * numpy.linalg.norm(matrix.T @ y)  # the bound is tight enough to catch a wrong term
