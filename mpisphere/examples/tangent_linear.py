"""The tangent-linear and adjoint shallow-water model, as one LinearOperator.

:meth:`ShallowWaterSolver.linearize` returns a :class:`TangentLinearModel`:
``forward(du)`` integrates the tangent-linear (TL) model along a stored
trajectory, ``adjoint(au)`` its exact adjoint (AD), both from this rank's
block ``(..., 3, l_loc, m_loc)`` to this rank's block. They are written by
hand from the model's pieces, each of which has its adjoint in mpisphere:
the scalar and vector transforms, the diagonal spectral operators, and the
pointwise products of the nonlinear terms, linearised about the trajectory.

The time scheme is a linear recurrence. With ``D`` the hyperdiffusion
(identity on the geopotential) and ``F_n`` the Jacobian of the tendency at
step ``n``, the model of :meth:`ShallowWaterSolver.timestep` is
``u_{n+1} = D (u_n + dt sum_j c_{n,j} f(u_{n-j}))`` (:func:`adams_bashforth`
gives the ``c``), so the TL is ``du_{n+1} = D (du_n + dt sum_j c_{n,j}
F_{n-j} du_{n-j})`` and the AD runs it backwards, applying each ``F_k^T``
once to the sum of what the three steps that used ``F_k du_k`` send back.
A TL or AD step costs one linearised tendency: the same nine transform
calls' worth as a nonlinear step, plus pointwise products.

The trajectory is stored, not recomputed: per step, the geopotential, the
absolute vorticity and the two wind components on this rank's tile, four
``(h, w)`` float64 fields: ``32 h w`` bytes per step and rank (8 MB for 100
steps of a 256 x 512 grid on 4 ranks). Checkpointing would trade that for a
second nonlinear run; at these sizes memory is not the limit.
"""

import numpy

from ..operators import DISTRIBUTED, FORWARD, InputError, Layout, LinearOperator

__all__ = ["TangentLinearModel", "adams_bashforth"]


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


class TangentLinearModel(LinearOperator):
    """The TL model (``forward``) and its adjoint along one trajectory of a :class:`ShallowWaterSolver`.

    Built by :meth:`ShallowWaterSolver.linearize`; not constructed directly.

    Parameters
    ----------
    solver : ShallowWaterSolver
    trajectory : list of ndarray, each ``(4, h, w)``
        Per step: geopotential, absolute vorticity, ``u``, ``v`` on this rank's tile.
    final_state : ndarray, ``(3, l_loc, m_loc)``
        The nonlinear model's state at the end (``timestep(uspec, nsteps)``).

    Notes
    -----
    Domain and range: this rank's block ``(..., 3, l_loc, m_loc)`` of the
    solver's coefficient dtype, distributed over ``grid.cart`` (the inner
    product sums over ranks: ``dottest`` and composition work as for every
    operator). The ranks agree once per call; the transforms inside agree
    again, as they would in user code.
    """

    _per_rank = ("trajectory", "final_state")  # this rank's tiles and block; the solver is compared whole

    def __init__(self, solver, trajectory, final_state):
        self.solver = solver
        self.trajectory = trajectory
        self.final_state = final_state
        self.nsteps = len(trajectory)
        self.domain = self.range = Layout(DISTRIBUTED, solver.grid.cart)
        self._comm = solver.grid.cart
        self.block = (3,) + tuple(solver.sht.block_shape)
        self.dtype = numpy.dtype(solver.sht.cdtype)

    def _output(self, direction, spec):
        if spec.shape[-3:] != self.block or spec.dtype != self.dtype or spec.device:
            raise InputError(f"expected this rank's block (..., {', '.join(map(str, self.block))}) "
                             f"{self.dtype.name} on the host, got {spec.shape} {spec.dtype.name}"
                             f"{' on a device' if spec.device else ''}")
        return spec, spec.describe(masked=(-2, -1))  # the block differs between ranks

    def _shapes(self, lead):
        return lead + self.block, lead + self.block

    def nbytes(self):
        """Bytes of the stored trajectory on this rank."""
        return sum(t.nbytes for t in self.trajectory)

    def _run(self, direction, x, out, context):
        out[...] = self._tl(x) if direction == FORWARD else self._ad(x)

    # --- the time loop ----------------------------------------------------------------------------

    def _diffuse(self, u):
        u[..., 1:, :, :] *= self.solver.hyperdiff
        return u

    def _tl(self, du):
        dt = self.solver.dt
        du = numpy.array(du, copy=True)
        tendencies = {}
        for n in range(self.nsteps):
            tendencies[n] = self._jacobian(n, du)
            increment = sum(weight * tendencies[n - lag] for lag, weight in adams_bashforth(n))
            du = self._diffuse(du + dt * increment)
            tendencies.pop(n - 2, None)
        return du

    def _ad(self, au):
        dt = self.solver.dt
        a = numpy.array(au, copy=True)
        pending = {}  # step k -> what the steps that used F_k du_k send back to it
        for n in range(self.nsteps - 1, -1, -1):
            w = self._diffuse(a)  # D^T a_{n+1} (D is diagonal and real); a is not used again
            for lag, weight in adams_bashforth(n):
                contribution = (dt * weight) * w
                pending[n - lag] = pending[n - lag] + contribution if n - lag in pending else contribution
            a = w + self._jacobian_adjoint(n, pending.pop(n))
        return a

    # --- one linearised tendency ------------------------------------------------------------------

    def _jacobian(self, n, du):
        """``F_n du``: the tendency of :meth:`ShallowWaterSolver.dudtspec` linearised at step ``n``."""
        s = self.solver
        phi, absvort, uv = self.trajectory[n][0], self.trajectory[n][1], self.trajectory[n][2:]
        fields = s.spec2grid(du[..., :2, :, :])             # d phi, d zeta
        duv = s.getuv(du[..., 1:, :, :])                    # d u, d v
        dphi, dzeta = fields[..., 0:1, :, :], fields[..., 1:2, :, :]
        fluxes = numpy.stack([duv * absvort + uv * dzeta, duv * phi + uv * dphi], axis=-4)
        tmpspec = s.vrtdivspec(fluxes)                      # (..., 2, 2, l, m)
        energy = s.grid2spec(fields[..., 0, :, :] + numpy.sum(uv * duv, axis=-3))
        out = numpy.empty_like(du)
        out[..., 0, :, :] = -tmpspec[..., 1, 1, :, :]
        out[..., 1, :, :] = -tmpspec[..., 0, 1, :, :]
        out[..., 2, :, :] = tmpspec[..., 0, 0, :, :] - s.lap * energy
        return out

    def _jacobian_adjoint(self, n, a):
        """``F_n^T a``, the adjoint of :meth:`_jacobian` in the real inner product, step by step backwards."""
        s = self.solver
        phi, absvort, uv = self.trajectory[n][0], self.trajectory[n][1], self.trajectory[n][2:]
        lead = a.shape[:-3]
        atmp = numpy.zeros(lead + (2, 2) + a.shape[-2:], dtype=a.dtype)
        atmp[..., 1, 1, :, :] = -a[..., 0, :, :]
        atmp[..., 0, 1, :, :] = -a[..., 1, :, :]
        atmp[..., 0, 0, :, :] = a[..., 2, :, :]
        aenergy = s.sht.adjoint(-s.lap * a[..., 2, :, :])              # (..., h, w)
        afluxes = s.vsht.adjoint(s.lap * s.radius * atmp)              # (..., 2, 2, h, w)
        avort_flux, aphi_flux = afluxes[..., 0, :, :, :], afluxes[..., 1, :, :, :]
        afields = numpy.empty(lead + (2,) + aenergy.shape[-2:], dtype=aenergy.dtype)
        afields[..., 0, :, :] = aenergy + numpy.sum(uv * aphi_flux, axis=-3)
        afields[..., 1, :, :] = numpy.sum(uv * avort_flux, axis=-3)
        aduv = avort_flux * absvort + aphi_flux * phi + uv * aenergy[..., None, :, :]
        out = numpy.zeros_like(a)
        out[..., :2, :, :] = s.isht.adjoint(afields)
        out[..., 1:, :, :] += (s.invlap / s.radius) * s.ivsht.adjoint(aduv)
        return out

