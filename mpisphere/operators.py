"""Linear operators with hand-written adjoints, their layouts, and the dot test.

An operator is a fixed linear map ``A`` between arrays. ``A.forward(x)``
applies it, ``A.adjoint(y)`` applies its adjoint ``A^H``, ``A.H`` is the
adjoint as an operator, and ``A @ B`` composes. Inputs are never modified and
outputs never alias inputs; ``out=`` writes into a caller's array instead of
allocating one.

Each side of an operator has a :class:`Layout`: ``distributed`` (every rank
holds its own piece; the global inner product sums the ranks' local inner
products over the layout's communicator) or ``replicated`` (every rank holds
the same array; the inner product counts it once). Adjoints are taken with
respect to the real inner product ``sum(x * y)`` for real arrays and
``sum(real(conj(a) * b))`` for complex ones, so a complex array counts as the
pair of its real and imaginary parts.
"""

import numpy

from . import backend, collectives
from .settings import config

__all__ = [
    "DISTRIBUTED",
    "REPLICATED",
    "Layout",
    "LinearOperator",
    "inner",
    "dottest",
    "check_input",
    "output_array",
    "AdjointOperator",
]

DISTRIBUTED = "distributed"
REPLICATED = "replicated"


class Layout:
    """How an operator's input or output is held across the ranks of ``comm``.

    Parameters
    ----------
    kind : {"distributed", "replicated"}
    comm : mpi4py.MPI.Comm
        The ranks over which a distributed inner product is summed.
    """

    __slots__ = ("kind", "comm")

    def __init__(self, kind, comm):
        if kind not in (DISTRIBUTED, REPLICATED):
            raise ValueError(f"Layout kind must be {DISTRIBUTED!r} or {REPLICATED!r}, got {kind!r}")
        self.kind = kind
        self.comm = comm

    def __repr__(self):
        return f"Layout({self.kind!r}, size={self.comm.Get_size()})"


def _local_inner(a, b):
    if a.shape != b.shape:
        raise ValueError(f"inner product of arrays of different shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a = a.reshape(-1)
    b = b.reshape(-1)
    wide = numpy.complex128 if a.dtype.kind == "c" or b.dtype.kind == "c" else numpy.float64
    # vdot conjugates its first argument: real(vdot(a, b)) = sum(real(conj(a) * b))
    return float(numpy.vdot(a.astype(wide, copy=False), b.astype(wide, copy=False)).real)


def inner(a, b, layout):
    """Global real inner product of ``a`` and ``b`` held in ``layout``.

    Accumulated in float64 whatever the dtype. Collective over
    ``layout.comm`` for a distributed layout.
    """
    local = _local_inner(a, b)
    if layout.kind == DISTRIBUTED and layout.comm.Get_size() > 1:
        return collectives.allreduce_scalar(layout.comm, local)
    return local


def check_input(comm, who, error, meta):
    """Raise an input error before any collective; in debug mode, on every rank.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator the operator is about to use.
    who : str
        ``"Operator.direction"``, the start of every message.
    error : (type, str) or None
        This rank's own finding: exception class and text (expected and got).
    meta : callable
        Returns what must agree across ranks in debug mode (shape with the
        split axis masked, dtype, ...); only called in debug mode.
    """
    if config.debug and comm.Get_size() > 1:
        collectives.agree(comm, who, None if error is None else error[1], meta())
    if error is not None:
        cls, text = error
        raise cls(f"{who}: rank {comm.Get_rank()} of {comm.Get_size()}: {text}")


def output_array(who, comm, like, out, shape, dtype=None):
    """``out`` checked against ``shape``/``dtype``, or a new array beside ``like``.

    A new array comes from ``like``'s module (NumPy or CuPy) on its device.
    A given ``out`` must match exactly, live in the same module and not
    overlap ``like``.
    """
    dtype = like.dtype if dtype is None else numpy.dtype(dtype)
    if out is None:
        xp = backend.array_module(like)
        with backend.device_of(like):
            return xp.empty(shape, dtype=dtype)
    backend.array_module(like, out)  # TypeError when host and device are mixed
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{who}: rank {comm.Get_rank()}: out has shape {tuple(out.shape)} {out.dtype}, "
                         f"expected {tuple(shape)} {numpy.dtype(dtype)}")
    if numpy.may_share_memory(out, like):
        raise ValueError(f"{who}: rank {comm.Get_rank()}: out overlaps the input; pass a separate array")
    return out


class LinearOperator:
    """Base class of every mpisphere operator.

    Subclasses set :attr:`domain` and :attr:`range` (:class:`Layout`) and
    implement ``_forward(x, out)`` and ``_adjoint(y, out)``; each returns the
    result (``out`` when given).

    Attributes
    ----------
    domain, range : Layout
        Layouts of the input of :meth:`forward` and of its output.
    """

    domain = None
    range = None

    @property
    def name(self):
        return type(self).__name__

    def forward(self, x, out=None):
        """Apply the operator. Never modifies ``x``; writes into ``out`` when given."""
        return self._forward(x, out)

    def adjoint(self, y, out=None):
        """Apply the adjoint. Never modifies ``y``; writes into ``out`` when given."""
        return self._adjoint(y, out)

    def __call__(self, x, out=None):
        return self.forward(x, out)

    @property
    def H(self):
        """The adjoint operator: ``A.H.forward == A.adjoint``."""
        return AdjointOperator(self)

    def __matmul__(self, other):
        if not isinstance(other, LinearOperator):
            return NotImplemented
        return _ComposedOperator(self, other)

    def __repr__(self):
        return f"<{self.name}: {self.domain} -> {self.range}>"


class AdjointOperator(LinearOperator):
    """``op.H``: forward is ``op.adjoint``, adjoint is ``op.forward``."""

    def __init__(self, op):
        self.op = op
        self.domain = op.range
        self.range = op.domain

    @property
    def name(self):
        return f"{self.op.name}.H"

    def _forward(self, x, out):
        return self.op.adjoint(x, out)

    def _adjoint(self, y, out):
        return self.op.forward(y, out)

    @property
    def H(self):
        return self.op


class _ComposedOperator(LinearOperator):
    """``A @ B``: forward applies ``B`` then ``A``; adjoint ``A^H`` then ``B^H``."""

    def __init__(self, a, b):
        if a.domain is not None and b.range is not None and a.domain.kind != b.range.kind:
            raise ValueError(
                f"cannot compose {a.name} @ {b.name}: {b.name} returns {b.range.kind} arrays but "
                f"{a.name} takes {a.domain.kind} ones, so the adjoint of the composition would be wrong")
        self.ops = (a.ops if isinstance(a, _ComposedOperator) else (a,)) + \
                   (b.ops if isinstance(b, _ComposedOperator) else (b,))
        self.domain = self.ops[-1].domain
        self.range = self.ops[0].range

    @property
    def name(self):
        return " @ ".join(op.name for op in self.ops)

    def _forward(self, x, out):
        for op in reversed(self.ops[1:]):
            x = op.forward(x)
        return self.ops[0].forward(x, out)

    def _adjoint(self, y, out):
        for op in self.ops[:-1]:
            y = op.adjoint(y)
        return self.ops[-1].adjoint(y, out)

    @property
    def H(self):
        result = self.ops[-1].H
        for op in reversed(self.ops[:-1]):
            result = result @ op.H
        return result


def dottest(op, x, y, rtol=1e-13):
    """Check ``<op.forward(x), y> == <x, op.adjoint(y)>`` over all ranks.

    Parameters
    ----------
    op : LinearOperator
    x : array
        A point of the domain (this rank's piece, or the replicated array).
    y : array
        A point of the range.
    rtol : float
        Largest relative difference accepted.

    Returns
    -------
    float
        ``|<Ax, y> - <x, A^H y>| / max(|<Ax, y>|, |<x, A^H y>|)``, the same
        on every rank.

    Raises
    ------
    AssertionError
        If the relative difference exceeds ``rtol``; the message holds both
        inner products.
    """
    ax = op.forward(x)
    aty = op.adjoint(y)
    lhs = inner(ax, y, op.range)
    rhs = inner(x, aty, op.domain)
    scale = max(abs(lhs), abs(rhs))
    error = abs(lhs - rhs) / scale if scale > 0 else 0.0
    if not error <= rtol:
        raise AssertionError(
            f"dottest({op.name}): <A x, y> = {lhs!r} but <x, A^H y> = {rhs!r}; "
            f"relative difference {error:.3e} > rtol {rtol:.1e}")
    return error
