"""mpisphere operators as differentiable PyTorch functions (the ``torch`` extra).

Importing this module imports PyTorch; ``import mpisphere`` alone never
does. Any :class:`~mpisphere.LinearOperator` (primitives, halos,
transforms, compositions, sums, a tangent-linear model) becomes a PyTorch
function whose forward is ``op.forward`` and whose backward is
``op.adjoint``::

    import mpisphere.torch as mt

    sht = DistributedRealSHT(grid, nlat, nlon)
    coeffs = mt.apply(sht, tile)          # tile: this rank's (..., h, w) tensor
    loss = (coeffs.abs() ** 2).sum()
    loss.backward()                       # runs sht.adjoint on every rank

Tensors reach the operators without copies through DLPack: CPU tensors as
NumPy arrays, CUDA tensors as CuPy arrays (the operator's device path, as for
any CuPy input). Results come back the same way.

Gradients
---------
mpisphere's adjoints are taken in the real inner product
(``sum(real(conj(a) * b))``), which is the one PyTorch's complex autograd
uses for real losses: the gradient PyTorch holds for a complex tensor is
``dL/d(re) + i dL/d(im)``. So ``backward(g) = op.adjoint(g)`` is the exact
vector-Jacobian product on both real and complex sides, and
``torch.autograd.gradcheck`` holds for it (``tests/test_torch_bridge.py``).
The backward is itself an :func:`apply` of the adjoint, so second
derivatives work too.

Collectives
-----------
An operator that communicates does so in backward as well: every rank must
call ``backward`` through the same operators in the same order, as with
``torch.distributed`` collectives. Whether autograd records a call (the
input requires grad, outside ``torch.no_grad()``) is part of what the ranks
agree on before it runs: an input that requires grad on some ranks only
raises on every rank at the forward, where it would otherwise leave the
backward waiting on the ranks that reach it. Each rank holds its own piece of a
distributed tensor and the gradient of its piece; a loss that should count a
distributed field once is the sum of the ranks' local losses (each rank calls
``backward`` on its own). A replicated output counts once: every rank holds
the same values and the same gradient.
"""

import numpy
import torch

from . import backend
from .operators import ADJOINT, FORWARD

__all__ = ["apply", "TorchOperator", "as_array", "as_tensor"]


def as_array(tensor):
    """``tensor`` as a NumPy (CPU) or CuPy (CUDA) array sharing its memory.

    A tensor with a pending conjugation or negation (a lazy view) is
    resolved first, which copies; gradients are not tracked through the result.
    """
    t = tensor.detach().resolve_conj().resolve_neg()
    if t.device.type == "cpu":
        return t.numpy()
    if t.device.type == "cuda":
        cupy = backend.import_cupy()
        return cupy.from_dlpack(t)
    raise TypeError(f"mpisphere.torch: tensors on {t.device} are not supported (CPU or CUDA)")


def as_tensor(array):
    """A NumPy or CuPy ``array`` as a tensor sharing its memory (NumPy arrays with negative strides are copied)."""
    if isinstance(array, numpy.ndarray):
        if any(s < 0 for s in array.strides):
            array = numpy.ascontiguousarray(array)
        return torch.from_numpy(array)
    return torch.from_dlpack(array)


class _Refused:
    """What a rank hands an operator in place of an input it cannot use: the operator refuses it on every rank.

    Raising on this rank alone would leave the other ranks waiting in the
    operator's agreement; the operator's own checks raise ``refusal`` (a
    TypeError) on every rank, naming this one.
    """

    __slots__ = ("mpisphere_refusal",)

    def __init__(self, refusal):
        self.mpisphere_refusal = refusal


# what the ranks compare besides the call itself when autograd records it: its backward (the adjoint, which
# communicates too) will follow on this rank, so it must follow on every rank
RECORDED = " [recorded by autograd: requires grad]"


def _recorded(tensor):
    """Whether autograd records a call on ``tensor`` (so that a backward through it may follow)."""
    return isinstance(tensor, torch.Tensor) and torch.is_grad_enabled() and tensor.requires_grad


def _call(op, direction, x, recorded=False):
    return op._apply(direction, x, None, purpose=RECORDED if recorded else "")


def _run(op, direction, tensor, recorded):
    try:
        x = as_array(tensor)
    except TypeError as exc:  # a tensor on another device: refused by the operator's own checks, on every rank
        x = _Refused(str(exc).removeprefix("mpisphere.torch: "))
    return as_tensor(_call(op, direction, x, recorded))


class _Apply(torch.autograd.Function):
    """``op`` in ``direction`` as an autograd function; its backward is the other direction."""

    @staticmethod
    def forward(ctx, tensor, op, direction, recorded):
        ctx.op, ctx.direction = op, direction
        return _run(op, direction, tensor, recorded)

    @staticmethod
    def backward(ctx, grad):
        other = ADJOINT if ctx.direction == FORWARD else FORWARD
        grad = grad.contiguous()
        return _Apply.apply(grad, ctx.op, other, _recorded(grad)), None, None, None


def apply(op, tensor, adjoint=False):
    """``op.forward(tensor)`` (``op.adjoint`` when ``adjoint``) as a differentiable tensor.

    Parameters
    ----------
    op : LinearOperator
        Any mpisphere operator.
    tensor : torch.Tensor
        This rank's input: the shape and dtype ``op`` expects on this rank
        (e.g. ``(..., h, w)`` float64 for a forward SHT), on the CPU or a
        CUDA device.
    adjoint : bool
        Apply ``op.adjoint`` instead (its backward is then ``op.forward``).

    Returns
    -------
    torch.Tensor
        This rank's output, on ``tensor``'s device, sharing memory with the
        array the operator returned.
    """
    direction = ADJOINT if adjoint else FORWARD
    if not isinstance(tensor, torch.Tensor):
        # the operator's checks refuse it on every rank (raising here alone would leave the other ranks waiting)
        _call(op, direction, _Refused(f"expected a torch.Tensor, got {type(tensor).__name__}"))
        raise TypeError(f"mpisphere.torch.apply({op.name}): expected a torch.Tensor, got {type(tensor).__name__}")
    # whether autograd records the call is part of what the ranks agree on: an input that requires grad on some
    # ranks only would take the backward (a collective) to those ranks only, where it would wait for the others
    return _Apply.apply(tensor, op, direction, _recorded(tensor))


class TorchOperator(torch.nn.Module):
    """An mpisphere operator as a ``torch.nn.Module`` (no parameters).

    ``TorchOperator(op)(x)`` is ``apply(op, x)``; ``.H`` is the module of the
    adjoint. Modelled on PyLops' ``TorchOperator``: forward as forward, the
    adjoint as backward.

    Parameters
    ----------
    op : LinearOperator
    adjoint : bool
        Wrap ``op.adjoint`` instead.
    """

    def __init__(self, op, adjoint=False):
        super().__init__()
        self.op = op
        self.adjoint = bool(adjoint)

    def forward(self, tensor):
        """``apply(op, tensor)`` (``op.adjoint`` for a module made with ``adjoint=True``): this rank's output."""
        return apply(self.op, tensor, adjoint=self.adjoint)

    @property
    def H(self):
        """The adjoint, as a module."""
        return TorchOperator(self.op, adjoint=not self.adjoint)

    def extra_repr(self):
        return f"{self.op.name}{'.H' if self.adjoint else ''}"
