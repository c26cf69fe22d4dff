"""What mpisphere's torch modules share (the ``torch`` extra): the default process grid, one operator per
dtype, construction as one collective step, and the autograd node of a module with parameters.

``init`` keeps the default process grid in a context variable (the one
process-wide value of the drop-in, as ``torch_harmonics.distributed`` keeps
its groups); every module also takes ``process_grid=`` instead. A module
with parameters (``ParametrisedLayer``) runs its operator
(:class:`~mpisphere.ParametrisedOperator`) as one autograd node:
the tensors named by ``_parameter_attributes`` are passed to the operator by
``set_parameters`` in the forward and again in the backward, whose
``gradients`` are the whole-sphere gradients of every parameter.
"""

import contextlib
import contextvars
import warnings

import numpy
import torch

from .agreement import Call
from .operators import FORWARD
from .partition import split_sizes
from .torch import RECORDED, as_array, as_tensor
from .torch_replicate import ReplicationWarning
from .validation import is_process_grid

__all__ = ["init", "finalize", "is_initialized", "process_grid", "compute_split_shapes", "ParametrisedLayer"]

_DEFAULT_GRID = contextvars.ContextVar("mpisphere.torch_harmonics grid", default=None)


def init(grid):
    """Make ``grid`` (a :class:`~mpisphere.ProcessGrid`) the process grid of the modules built from now on."""
    if not is_process_grid(grid):
        raise TypeError(f"mpisphere.torch_harmonics.init: expected a ProcessGrid, got {type(grid).__name__} "
                        "(torch-harmonics takes two process groups; mpisphere one ProcessGrid of both)")
    _DEFAULT_GRID.set(grid)


def finalize():
    """Forget the default process grid (the grid itself is the caller's to free)."""
    _DEFAULT_GRID.set(None)


def is_initialized():
    """Whether :func:`init` gave a default process grid."""
    return _DEFAULT_GRID.get() is not None


def process_grid(grid=None):
    """``grid``, or :func:`init`'s; a clear error when there is neither."""
    found = grid if grid is not None else _DEFAULT_GRID.get()
    if found is None:
        raise RuntimeError("mpisphere.torch_harmonics: no process grid on this rank; call "
                           "mpisphere.torch_harmonics.init(grid) with a mpisphere.ProcessGrid first, or pass "
                           "process_grid=. Call init on every rank: this rank cannot tell the others, which wait in "
                           "the module's construction (their stall report names where; 'python -m mpi4py' ends the "
                           "job with this error)")
    return found


def compute_split_shapes(size, num_chunks):
    """torch-harmonics' balanced chunks (the first ``size % num_chunks`` one larger): :func:`mpisphere.split_sizes`."""
    return list(split_sizes(size, num_chunks))


class _PerDtype:
    """An operator built once per floating dtype (the first call in that dtype builds it, on every rank)."""

    def __init__(self, build):
        self._build, self._ops = build, {}

    def __call__(self, dtype):
        # another dtype goes to the float32 operator, which refuses it on every rank through its agreement
        # (raising here would leave the other ranks waiting in theirs)
        key = {torch.float64: numpy.float64}.get(dtype, numpy.float32)
        if key not in self._ops:
            self._ops[key] = self._build(key)
        return self._ops[key]


def _shape(value, name):
    """``value`` as ``(nlat, nlon)``: two positive integers, or a ValueError naming ``name``."""
    try:
        nlat, nlon = (int(v) for v in value)
        if (nlat, nlon) != tuple(value) or nlat < 1 or nlon < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be (nlat, nlon), two positive integers, got {value!r}") from None
    return nlat, nlon


def _check_groups(who, in_channels, out_channels, groups, name):
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"{who}: in_channels={in_channels} and out_channels={out_channels} must be multiples of "
                         f"{name}={groups}")


def _grid_of(grid):
    return process_grid(grid)


@contextlib.contextmanager
def _constructing(process_grid, who, /, **arguments):
    """A module's construction as one collective step: its checks as this rank's finding, then one agreement.

    The block's exceptions (a bad ``groups``, a misspelt ``basis_type``, an
    ``in_shape`` that is not two sizes) are kept, and every rank raises the
    first of them, naming its rank, when the ranks agree on the constructor's
    ``arguments`` (compared by value: another ``in_shape`` on one rank raises
    too) after the block. Nothing after it communicates before that.
    """
    call = Call(process_grid.cart, f"{who}.__init__")
    with call.local():
        yield
    call.agree(mismatch="were built with different arguments", **arguments)


class _Nonlinear(torch.autograd.Function):
    """An operator that is not linear (``op.linear`` False): forward by ``op.forward``, backward by ``op.vjp``."""

    @staticmethod
    def forward(ctx, x, op, recorded):
        ctx.op = op
        ctx.save_for_backward(x)
        return as_tensor(op._apply(FORWARD, as_array(x), None, purpose=RECORDED if recorded else ""))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return as_tensor(ctx.op.vjp(as_array(x), as_array(grad.contiguous()))), None, None


class _Layer(torch.autograd.Function):
    """A module with parameters as one autograd node: forward by its operator, backward by its ``gradients``."""

    @staticmethod
    def forward(ctx, x, layer, recorded, *parameters):
        ctx.layer = layer
        ctx.save_for_backward(x, *parameters)
        return layer._run_forward(x, parameters, recorded)

    @staticmethod
    def backward(ctx, grad):
        x, *parameters = ctx.saved_tensors
        grads = ctx.layer._run_backward(x, parameters, grad.contiguous(), ctx.needs_input_grad[0])
        return (grads[0], None, None) + tuple(grads[1:])


class ParametrisedLayer(torch.nn.Module):
    """What the layers with parameters share: the same initial values everywhere, the autograd node."""

    mpisphere_sums_own_gradients = True  # (torch_replicate.SUMS_OWN_GRADIENTS) replicate() leaves their sums to us
    mpisphere_covered = False  # set by replicate(): the model around this module sums its other parameters
    _uncovered_said = False     # the ReplicationWarning, once per module

    def _share_initial_parameters(self):
        # rank 0's random start on every rank: the ranks' generators need not agree
        call = Call(self.process_grid.cart, f"{type(self).__name__}.__init__")
        values = call.share([p.detach().cpu().numpy() for p in self.parameters()])
        with torch.no_grad():
            for p, value in zip(self.parameters(), values):
                p.copy_(torch.from_numpy(value))

    def _recorded(self, x, parameters):
        recorded = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in parameters))
        if recorded and not self.mpisphere_covered and not self._uncovered_said:
            self._uncovered_said = True
            warnings.warn(
                f"{type(self).__name__} trains in a model that mpisphere.torch_harmonics.replicate() has not "
                "covered: its own parameters get whole-sphere gradients, but any plain torch layer beside it (a "
                "linear layer, an MLP, a 1 x 1 convolution) gets only this rank's tile's, and the ranks' models "
                "drift apart without an error. Call thd.replicate(model) once on the whole model before training.",
                ReplicationWarning, stacklevel=2)
        return recorded

    def _apply_layer(self, x, parameters):
        """``parameters``: the module's tensors, in the order of its operator's ``parameter_names`` (None skipped)."""
        return _Layer.apply(x, self, self._recorded(x, parameters), *parameters)

    def _operator_for(self, x, parameters):
        """The operator of ``x``'s dtype, given this call's parameter values by their names (None: not set)."""
        op = self._ops(x.dtype)
        values = iter(parameters)
        op.set_parameters(**{name: None if getattr(self, attribute) is None else as_array(next(values))
                             for name, attribute in zip(op.parameter_names, self._parameter_attributes)})
        return op

    def _run_forward(self, x, parameters, recorded):
        op = self._operator_for(x, parameters)
        return as_tensor(op._apply(FORWARD, as_array(x), None, purpose=RECORDED if recorded else ""))

    def _run_backward(self, x, parameters, grad, input_gradient):
        # the forward's values again: the operator may have served another call of the module since
        found = self._operator_for(x, parameters).gradients(as_array(x), as_array(grad), input_gradient=input_gradient)
        x_bar = found[0]
        grads = [None if x_bar is None else as_tensor(x_bar)]
        for attribute, g in zip(self._parameter_attributes, found[1:]):
            tensor = getattr(self, attribute)
            if tensor is not None:
                grads.append(torch.from_numpy(g).to(grad.device, tensor.dtype))
        return grads
