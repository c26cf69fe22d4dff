"""The tangent-linear and adjoint shallow-water model, as one LinearOperator.

:meth:`~mpisphere.examples.ShallowWaterSolver.linearize` returns a ``TangentLinearModel``:
``forward(du)`` integrates the tangent-linear (TL) model along a stored
trajectory, ``adjoint(au)`` its exact adjoint (AD), both from this rank's
block ``(..., 3, l_loc, m_loc)`` to this rank's block.

The linearised tendency ``F_n`` is the model's own chain of operators
(the scalar and vector transforms, the calculus operators of
:mod:`mpisphere.sht.calculus`) around the pointwise products of the
nonlinear terms linearised about step ``n``'s fields
(``LinearisedProducts``, the one piece written by hand, with its own
adjoint and dot test). The adjoint ``F_n^T`` applies the same operators'
``.H`` in reverse order. The time scheme is
:mod:`~mpisphere.examples.time_stepping`'s, whose adjoint runs the
recurrence backwards. A TL or AD step costs one linearised tendency: the
same nine transform calls' worth as a nonlinear step, plus pointwise
products.

The trajectory is stored, not recomputed: per step, the geopotential, the
absolute vorticity and the two wind components on this rank's tile, four
``(h, w)`` float64 fields: ``32 h w`` bytes per step and rank (8 MB for 100
steps of a 256 x 512 grid on 4 ranks). Checkpointing would trade that for a
second nonlinear run; at these sizes memory is not the limit.
"""

import numpy

from ..operators import DISTRIBUTED, FORWARD, InputError, Layout, LinearOperator
from . import time_stepping

__all__ = ["TangentLinearModel", "LinearisedProducts"]


def field_axis(grid_axes):
    """``at(i)``: the index of entry ``i`` of the axis in front of ``grid_axes`` grid axes (2 on a regular grid,
    1 on a reduced grid's points)."""
    return lambda i: (Ellipsis, i) + (slice(None),) * grid_axes


class LinearisedProducts(LinearOperator):
    """The shallow-water model's pointwise products, linearised about one step's fields.

    With ``phi``, ``eta`` (absolute vorticity), ``u``, ``v`` the fields of
    the trajectory, ``forward`` maps the perturbation ``(dphi, dzeta, du,
    dv)`` on this rank's tile to the perturbations of the five products the
    tendency transforms::

        (du eta + u dzeta, dv eta + v dzeta,     vorticity flux
         du phi + u dphi,  dv phi + v dphi,      geopotential flux
         dphi + u du + v dv)                     energy

    Parameters
    ----------
    fields : ndarray, ``(4, h, w)`` (``(4, npoints)`` on a reduced grid)
        ``phi``, ``eta``, ``u``, ``v`` on this rank's tile (real).
    layout : Layout
        The grid's distributed layout (the inner product sums over its ranks).

    Notes
    -----
    ``forward``: ``(..., 4, h, w)`` -> ``(..., 5, h, w)``; ``adjoint`` its
    transpose (the fields are real, the products pointwise). Local: no
    communication, no agreement.
    """

    _per_rank = ("fields",)  # this rank's tile

    def __init__(self, fields, layout):
        self.fields = fields
        self.domain = self.range = layout

    def _output(self, direction, spec):
        n_in, n_out = (4, 5) if direction == FORWARD else (5, 4)
        core = tuple(self.fields.shape[1:])
        k = len(core)
        if spec.shape[-1 - k:] != (n_in,) + core or spec.dtype != self.fields.dtype or spec.device:
            raise InputError(f"expected (..., {n_in}, {', '.join(map(str, core))}) {self.fields.dtype.name} on the "
                             f"host, got {spec.shape} {spec.dtype.name}{' on a device' if spec.device else ''}")
        return spec.but(shape=spec.shape[:-1 - k] + (n_out,) + core), spec.describe(masked=range(-k, 0))

    def _shapes(self, lead):
        core = tuple(self.fields.shape[1:])
        return lead + (4,) + core, lead + (5,) + core

    def _run(self, direction, x, out, context):
        phi, eta, uv = self.fields[0], self.fields[1], self.fields[2:]
        at = field_axis(self.fields.ndim - 1)
        fields = -1 - (self.fields.ndim - 1)  # the field axis
        if direction == FORWARD:
            dphi, dzeta, duv = x[at(slice(0, 1))], x[at(slice(1, 2))], x[at(slice(2, None))]
            out[at(slice(0, 2))] = duv * eta + uv * dzeta
            out[at(slice(2, 4))] = duv * phi + uv * dphi
            out[at(4)] = x[at(0)] + numpy.sum(uv * duv, axis=fields)
        else:
            avort, aphi, aenergy = x[at(slice(0, 2))], x[at(slice(2, 4))], x[at(4)]
            out[at(0)] = aenergy + numpy.sum(uv * aphi, axis=fields)
            out[at(1)] = numpy.sum(uv * avort, axis=fields)
            out[at(slice(2, None))] = avort * eta + aphi * phi + uv * numpy.expand_dims(aenergy, fields)


class TangentLinearModel(LinearOperator):
    """The TL model (``forward``) and its adjoint along one trajectory of a :class:`ShallowWaterSolver`.

    Built by :meth:`~mpisphere.examples.ShallowWaterSolver.linearize`; not constructed directly.

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
        self.products = [LinearisedProducts(fields, self.domain) for fields in trajectory]

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

    def _tl(self, du):
        s = self.solver
        if s._implicit is None:
            return time_stepping.integrate(du, self.nsteps, s.dt, self._jacobian, s.diffuse)
        return time_stepping.integrate_leapfrog(du, self.nsteps, s.dt, self._jacobian, s.diffuse, s._implicit,
                                                s.robert_asselin)

    def _ad(self, au):
        s = self.solver
        if s._implicit is None:
            return time_stepping.integrate_adjoint(au, self.nsteps, s.dt, self._jacobian_adjoint,
                                                   self._diffuse_adjoint)
        return time_stepping.integrate_leapfrog_adjoint(au, self.nsteps, s.dt, self._jacobian_adjoint,
                                                        self._diffuse_adjoint, s._implicit, s.robert_asselin)

    def _diffuse_adjoint(self, a):
        a[..., 1:, :, :] = self.solver.hyperdiffusion.H.forward(a[..., 1:, :, :])
        return a

    # --- one linearised tendency ------------------------------------------------------------------

    def _jacobian(self, n, du):
        """``F_n du``: the tendency of :meth:`ShallowWaterSolver.dudtspec` linearised at step ``n``."""
        s = self.solver
        lead, tile = du.shape[:-3], s.sht.tile_shape
        at = field_axis(len(tile))
        perturbation = numpy.empty(lead + (4,) + tile, dtype=s.sht.dtype)
        perturbation[at(slice(0, 2))] = s.isht.forward(du[..., :2, :, :])          # d phi, d zeta
        perturbation[at(slice(2, None))] = s.vrtdiv_to_uv.forward(du[..., 1:, :, :])   # d u, d v
        products = self.products[n].forward(perturbation)
        fluxes = s.uv_to_vrtdiv.forward(products[at(slice(0, 4))].reshape(lead + (2, 2) + tile))  # (..., 2, 2, l, m)
        energy = s.laplacian.forward(s.sht.forward(products[at(4)]))
        out = numpy.empty_like(du)
        out[..., 0, :, :] = -fluxes[..., 1, 1, :, :]
        out[..., 1, :, :] = -fluxes[..., 0, 1, :, :]
        out[..., 2, :, :] = fluxes[..., 0, 0, :, :] - energy
        return out

    def _jacobian_adjoint(self, n, a):
        """``F_n^T a``: the operators of :meth:`_jacobian`, each as its ``.H``, in reverse order."""
        s = self.solver
        lead, tile = a.shape[:-3], s.sht.tile_shape
        afluxes = numpy.zeros(lead + (2, 2) + a.shape[-2:], dtype=a.dtype)
        afluxes[..., 1, 1, :, :] = -a[..., 0, :, :]
        afluxes[..., 0, 1, :, :] = -a[..., 1, :, :]
        afluxes[..., 0, 0, :, :] = a[..., 2, :, :]
        at = field_axis(len(tile))
        aproducts = numpy.empty(lead + (5,) + tile, dtype=s.sht.dtype)
        aproducts[at(slice(0, 4))] = s.uv_to_vrtdiv.H.forward(afluxes).reshape(lead + (4,) + tile)
        aproducts[at(4)] = s.sht.H.forward(s.laplacian.H.forward(-a[..., 2, :, :]))
        aperturbation = self.products[n].H.forward(aproducts)
        out = numpy.zeros_like(a)
        out[..., :2, :, :] = s.isht.H.forward(aperturbation[at(slice(0, 2))])
        out[..., 1:, :, :] += s.vrtdiv_to_uv.H.forward(aperturbation[at(slice(2, None))])
        return out
