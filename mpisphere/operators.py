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
from mpi4py import MPI

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
    """How one side of an operator is held across ranks, and over which ranks it is summed.

    Parameters
    ----------
    kind : {"distributed", "replicated"}
        ``distributed``: every rank holds its own piece. ``replicated``: every
        rank of ``comm`` holds the same array.
    comm : mpi4py.MPI.Comm
        The communicator the operator works on (its pieces or its copies).
    space : mpi4py.MPI.Comm, optional
        All the ranks over which a global inner product sums. An operator on
        a sub-communicator of a grid (``grid.polar``, ``grid.azimuth``) runs
        as independent copies, one per row or column, that together map the
        field on the whole grid: its space is ``grid.cart``. Default: the
        space the communicator carries (the communicators of a
        :class:`~mpisphere.ProcessGrid` carry ``grid.cart``), else ``comm``.

    Notes
    -----
    The global inner product of two arrays in this layout is the sum over
    the ranks of ``space`` of the local inner products; for a replicated
    layout each copy counts once (the rank of ``comm`` numbered 0 contributes,
    the others add zero).
    """

    __slots__ = ("kind", "comm", "space")

    def __init__(self, kind, comm, space=None):
        if kind not in (DISTRIBUTED, REPLICATED):
            raise ValueError(f"Layout kind must be {DISTRIBUTED!r} or {REPLICATED!r}, got {kind!r}")
        self.kind = kind
        self.comm = comm
        self.space = space if space is not None else getattr(comm, "space", None) or comm

    def counts_here(self):
        """Whether this rank's local inner product enters the global one (copies count once)."""
        return self.kind == DISTRIBUTED or self.comm.Get_rank() == 0

    def mismatch(self, other):
        """Why an array in layout ``other`` cannot be used as one in this layout, or ``None``.

        Distributed arrays pass between operators whose spaces hold the same
        ranks; replicated arrays also need the same communicator of copies.
        Local: compares groups, never communicates.
        """
        if self.kind != other.kind:
            return f"{other.kind} arrays cannot be used as {self.kind} ones"
        if not _same_ranks(self.space, other.space):
            return "their inner products sum over different ranks"
        if self.kind == REPLICATED and not _same_ranks(self.comm, other.comm):
            return "their arrays are replicated over different ranks"
        return None

    def __repr__(self):
        text = f"Layout({self.kind!r}, {_comm_name(self.comm)}"
        if self.space is not self.comm:
            text += f", space={_comm_name(self.space)}"
        return text + ")"


def _same_ranks(a, b):
    if a is b:
        return True
    return MPI.Comm.Compare(a, b) in (MPI.IDENT, MPI.CONGRUENT)


def _comm_name(comm):
    name = comm.Get_name() if comm != MPI.COMM_NULL else "COMM_NULL"
    size = comm.Get_size() if comm != MPI.COMM_NULL else 0
    return f"{name or 'communicator'} ({size} rank{'s' if size != 1 else ''})"


def _local_inner(a, b):
    """``sum(real(conj(a) * b))`` and ``sum(|a| |b|)`` of this rank's arrays, in float64."""
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"inner product of arrays of different shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a = a.reshape(-1)
    b = b.reshape(-1)
    wide = numpy.complex128 if a.dtype.kind == "c" or b.dtype.kind == "c" else numpy.float64
    a = a.astype(wide, copy=False)
    b = b.astype(wide, copy=False)
    # vdot conjugates its first argument: real(vdot(a, b)) = sum(real(conj(a) * b))
    value = float(numpy.vdot(a, b).real)
    if wide is numpy.complex128:
        # |re(conj(a_i) b_i)| <= |a_i.re b_i.re| + |a_i.im b_i.im|: the bound of what is summed
        bound = float(numpy.vdot(abs(a.real), abs(b.real)) + numpy.vdot(abs(a.imag), abs(b.imag)))
    else:
        bound = float(numpy.vdot(abs(a), abs(b)))
    return value, bound


def _global_sums(values, layout):
    """Sum per-rank float64 ``values`` over the layout's space, copies counted once."""
    local = numpy.array(values, dtype=numpy.float64) * (1.0 if layout.counts_here() else 0.0)
    if layout.space.Get_size() > 1:
        return collectives.allreduce_floats(layout.space, local)
    return local


def inner(a, b, layout):
    """Global real inner product of ``a`` and ``b`` held in ``layout``.

    ``sum(real(conj(a) * b))`` over every element of every rank's piece
    (each copy of a replicated array counted once), accumulated in float64
    whatever the dtype. Collective over ``layout.space`` when it has more
    than one rank.
    """
    return float(_global_sums(_local_inner(a, b)[:1], layout)[0])


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
        if a.domain is not None and b.range is not None:
            reason = a.domain.mismatch(b.range)
            if reason is not None:
                raise ValueError(
                    f"cannot compose {a.name} @ {b.name}: {b.name} returns {b.range!r} but {a.name} takes "
                    f"{a.domain!r}; {reason}, so the composition would not be a linear operator with the "
                    "adjoint its parts define")
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

    The two inner products are equal in exact arithmetic; computed, each
    differs from its exact value by at most about ``n * eps`` times the sum
    of the absolute values of its terms, ``sum |(A x)_i| |y_i|`` and
    ``sum |x_i| |(A^H y)_i|``, whatever order the sum is taken in. The
    difference is therefore measured against that bound, never against the
    inner products themselves: those can cancel to almost nothing (a sum of
    a million terms of size one that comes to 31), and then the verdict
    would flip with the summation order of the CPU's kernels.

    Parameters
    ----------
    op : LinearOperator
    x : array
        A point of the domain (this rank's piece, or the replicated array).
    y : array
        A point of the range.
    rtol : float
        Largest accepted ``|<A x, y> - <x, A^H y>| / (sum |A x| |y| + sum |x| |A^H y|)``.

    Returns
    -------
    float
        That ratio, the same on every rank.

    Raises
    ------
    AssertionError
        If the ratio exceeds ``rtol``; the message holds both inner products,
        the bound and the ratio.
    """
    ax = op.forward(x)
    aty = op.adjoint(y)
    lhs, lhs_bound = (float(v) for v in _global_sums(_local_inner(ax, y), op.range))
    rhs, rhs_bound = (float(v) for v in _global_sums(_local_inner(x, aty), op.domain))
    bound = lhs_bound + rhs_bound
    error = abs(lhs - rhs) / bound if bound > 0 else 0.0
    if not error <= rtol:
        raise AssertionError(
            f"dottest({op.name}): <A x, y> = {lhs!r} but <x, A^H y> = {rhs!r}; their difference "
            f"{abs(lhs - rhs):.3e} is {error:.3e} of the rounding bound sum|Ax||y| + sum|x||A^H y| = {bound:.6e}, "
            f"more than rtol {rtol:.1e}")
    return error
