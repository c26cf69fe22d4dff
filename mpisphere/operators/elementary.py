"""The elementary local operators: :class:`Identity` and :class:`Diagonal`."""


import numpy

from .. import backend, dtypes
from ..agreement import InputError
from .base import LinearOperator
from .layout import Layout



class Identity(LinearOperator):
    """The identity on arrays of ``layout``: ``forward`` and ``adjoint`` copy.

    Parameters
    ----------
    layout : Layout
        Domain and range.
    core : tuple of int, optional
        The trailing shape of a point (for :meth:`~mpisphere.LinearOperator.domain_shape` and
        :func:`dottest` drawing its own points); any shape is accepted.
    """

    def __init__(self, layout, core=()):
        if not isinstance(layout, Layout):
            raise TypeError(f"Identity: layout must be a Layout, got {type(layout).__name__}")
        self.domain = self.range = layout
        self.core = tuple(core)

    def _output(self, direction, spec):
        return spec, spec.describe()

    def _run(self, direction, x, out, context):
        out[...] = x

    def _shapes(self, lead):
        return lead + self.core, lead + self.core


class Diagonal(LinearOperator):
    """Elementwise multiplication by fixed real ``weights`` on arrays of ``layout``.

    Parameters
    ----------
    weights : array
        Real NumPy or CuPy array; inputs must have its shape, or a shape it
        broadcasts to (leading batch axes). Complex inputs are scaled in
        both parts. NumPy weights serve CuPy inputs too (copied to the
        device once); CuPy weights need CuPy inputs.
    layout : Layout
        Domain and range (a diagonal is its own adjoint in the real inner
        product).

    Notes
    -----
    ``forward(x) = weights * x``, ``adjoint(y) = weights * y``. No
    communication. Typical uses: quadrature weights on a tile, error
    variances on a coefficient block, the inverse of a diagonal ``B``.
    """

    _per_rank = ("weights",)  # each rank's own block of weights

    def __init__(self, weights, layout):
        if not backend.is_array(weights):
            raise TypeError(f"Diagonal: weights must be a NumPy or CuPy array, got {type(weights).__name__}")
        if numpy.dtype(weights.dtype).kind not in "fiu":
            raise TypeError(f"Diagonal: weights must be real, got {numpy.dtype(weights.dtype).name}")
        if not isinstance(layout, Layout):
            raise TypeError(f"Diagonal: layout must be a Layout, got {type(layout).__name__}")
        self.weights = weights
        self.domain = self.range = layout
        self._on_device = {}

    def _output(self, direction, spec):
        core = tuple(self.weights.shape)
        if spec.shape[len(spec.shape) - len(core):] != core or len(spec.shape) < len(core):
            raise InputError(f"expected an array whose trailing shape is the weights' {core}, got {spec.shape}")
        if backend.is_device_array(self.weights) and not spec.device:
            raise InputError("the weights live on a device and the input on the host; move the input "
                             "(cupy.asarray)", TypeError)
        if dtypes.refusal(spec.dtype, "moved"):
            raise InputError(dtypes.refusal(spec.dtype, "moved"), TypeError)
        return spec, spec.describe()

    def _run(self, direction, x, out, context):
        # host weights are uploaded once per device for device inputs
        numpy.multiply(x, backend.on_device_of(x, self.weights, self._on_device), out=out)

    def _shapes(self, lead):
        return lead + tuple(self.weights.shape), lead + tuple(self.weights.shape)
