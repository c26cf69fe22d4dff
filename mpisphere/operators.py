"""Linear operators with hand-written adjoints, their layouts, the agreement step, and the dot test.

An operator is a fixed linear map ``A`` between arrays. ``A.forward(x)``
applies it, ``A.adjoint(y)`` applies its adjoint ``A^H``, ``A.H`` is the
adjoint as an operator; ``A @ B`` composes, ``A + B``, ``A - B`` and
``a * A`` combine. Inputs are never modified and outputs never overlap
inputs; ``out=`` writes into a caller's array instead of allocating one.

Each side of an operator has a :class:`Layout`: ``distributed`` (every rank
holds its own piece; the global inner product sums the ranks' local inner
products over the layout's space) or ``replicated`` (every rank holds the
same array; the inner product counts it once). Adjoints are taken with
respect to the real inner product ``sum(x * y)`` for real arrays and
``sum(real(conj(a) * b))`` for complex ones, so a complex array counts as the
pair of its real and imaginary parts.

Agree, then communicate
-----------------------
Every call of an operator that communicates runs in three steps:

1. **local checks** on this rank: the input (type, dtype, shape against what
   the operator expects here) and ``out=`` (type, shape, dtype, writable,
   not overlapping the input); then the output and the scratch buffers the
   call needs are allocated, and a failure (``MemoryError``) becomes this
   rank's finding. Nothing is raised yet.
2. **agreement** over the ranks that communicate (:mod:`mpisphere.agreement`):
   one ``Allreduce`` of six integers carrying the findings and a digest of
   what each rank is about to do: the operator's description (derived from
   every argument it was built with), the direction, the input's shape (the
   axes that legitimately differ masked) and dtype, and the switches in
   force. When anything differs, every rank raises the same error, naming
   the ranks that are wrong and what each has. A halo exchange agrees with
   its neighbours instead, in headers that travel with its data.
3. **the work**, on buffers everyone agreed on.

A composition agrees once for all its parts: over their communicator when
they all use one (so a composition and its parts called one after the other
meet in the same step), else over the space they share. Its local parts
(diagonals, scalings) are part of what is compared. ``mpisphere.config.debug``
compares the full descriptions on every call (no digest);
``mpisphere.config.agreement = False`` skips the step (for code proven to
match; it must then be off on every rank).
"""

import dataclasses
import math
from typing import Callable, Optional

import numpy
from mpi4py import MPI

from . import backend, collectives, dtypes
from .agreement import (REFUSED, CallGuard, Context, Described, InputError, Spec, agree, description_of,
                        raise_everywhere)

__all__ = [
    "DISTRIBUTED",
    "REPLICATED",
    "FORWARD",
    "ADJOINT",
    "Layout",
    "Abilities",
    "Spec",
    "InputError",
    "Context",
    "LinearOperator",
    "AdjointOperator",
    "Identity",
    "Diagonal",
    "check_out",
    "inner",
    "dottest",
]

DISTRIBUTED = "distributed"
REPLICATED = "replicated"
FORWARD = "forward"
ADJOINT = "adjoint"


# --- layouts ------------------------------------------------------------------------------------

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
    blocks : str, optional
        What the local pieces hold, where equal shapes are not enough to
        say it: the transforms' coefficient blocks carry their order layout
        (``"orders=contiguous"`` or ``"orders=balanced"``). Two layouts that
        both name their blocks must name the same; ``None`` matches any.

    Notes
    -----
    The global inner product of two arrays in this layout is the sum over
    the ranks of ``space`` of the local inner products; for a replicated
    layout each copy counts once (the rank of ``comm`` numbered 0 contributes,
    the others add zero).
    """

    __slots__ = ("kind", "comm", "space", "blocks")

    def __init__(self, kind, comm, space=None, *, blocks=None):
        if kind not in (DISTRIBUTED, REPLICATED):
            raise ValueError(f"Layout kind must be {DISTRIBUTED!r} or {REPLICATED!r}, got {kind!r}")
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"Layout: comm must be an mpi4py communicator, got {type(comm).__name__}")
        self.kind = kind
        self.comm = comm
        self.space = space if space is not None else getattr(comm, "space", None) or comm
        self.blocks = blocks

    def counts_here(self):
        """Whether this rank's local inner product enters the global one (copies count once)."""
        return self.kind == DISTRIBUTED or self.comm.Get_rank() == 0

    def mismatch(self, other):
        """Why an array in layout ``other`` cannot be used as one in this layout, or ``None``.

        Distributed arrays pass between operators whose spaces hold the same
        ranks; replicated arrays also need the same communicator of copies.
        Local: compares groups, never communicates.
        """
        if not isinstance(other, Layout):
            return f"{other!r} is not a Layout"
        if self.kind != other.kind:
            return f"{other.kind} arrays cannot be used as {self.kind} ones"
        if not _same_ranks(self.space, other.space):
            return "their inner products sum over different ranks"
        if self.kind == REPLICATED and not _same_ranks(self.comm, other.comm):
            return "their arrays are replicated over different ranks"
        if self.blocks is not None and other.blocks is not None and self.blocks != other.blocks:
            return f"their blocks hold different entries ({other.blocks} where {self.blocks} is expected)"
        return None

    def __repr__(self):
        text = f"Layout({self.kind!r}, {_comm_name(self.comm)}"
        if self.space is not self.comm:
            text += f", space={_comm_name(self.space)}"
        if self.blocks is not None:
            text += f", blocks={self.blocks!r}"
        return text + ")"


def _same_ranks(a, b):
    if a is b:
        return True
    if a == MPI.COMM_NULL or b == MPI.COMM_NULL:
        return False
    return MPI.Comm.Compare(a, b) in (MPI.IDENT, MPI.CONGRUENT)


def _comm_name(comm):
    if comm == MPI.COMM_NULL:
        return "a freed communicator"
    name = comm.Get_name()
    size = comm.Get_size()
    return f"{name or 'communicator'} ({size} rank{'s' if size != 1 else ''})"


def check_out(out, spec, x):
    """Raise :class:`InputError` unless ``out`` can receive a result of ``spec`` computed from ``x``."""
    if not backend.is_array(out):
        raise InputError(f"out must be a NumPy or CuPy array, got {type(out).__name__}", TypeError)
    if backend.is_device_array(out) != spec.device:
        raise InputError(f"out is a {'device' if backend.is_device_array(out) else 'host'} array but the result "
                         f"lives on the {'device' if spec.device else 'host'}; move one of them "
                         "(cupy.asarray / cupy.asnumpy)", TypeError)
    if tuple(out.shape) != spec.shape or numpy.dtype(out.dtype) != spec.dtype:
        raise InputError(f"out has shape {tuple(out.shape)} {numpy.dtype(out.dtype).name}, expected "
                         f"{spec.shape} {spec.dtype.name}")
    if not backend.is_writeable(out):
        raise InputError("out is read-only (its writeable flag is off); pass an array the result can be written to")
    if x is not None and backend.is_array(x) and backend.shares_memory(out, x):
        raise InputError("out overlaps the input; pass a separate array")


# --- operators --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Abilities:
    """What an operator can do as a stage of a pipeline, run in one direction, beyond ``_run(x, out)``.

    A pipeline (:class:`mpisphere.sht.pipeline.Pipeline`) compiles its plan
    from these declarations alone; it never asks a stage for its class.
    The callables are bound to the direction the abilities were asked for.

    Attributes
    ----------
    identity : bool
        The map is the identity: skipped when input and output are held in
        the same memory layout, a copy otherwise.
    view : callable or None
        ``view(x)``: the result as a view of ``x`` (a restriction; no copy).
    embed : callable or None
        A zero padding of the last axis: ``embed(padded)`` zeroes the padding
        of the output buffer and returns the view the input is written into
        (the previous stage writes there directly; no copy).
    kept : int or None
        With ``embed``: the last-axis entries the padding keeps; after it the
        rest is known to be zero.
    pads_short_input_in : frozenset of tuple
        Physical orders (see ``prefers``) in which this stage reads an input
        whose last axis is shorter than its domain's as zero-padded, at no
        cost: a padding before it is then fused into it.
    in_place : bool
        May write its output into its input's memory, with the input's
        strides (only the extents differ).
    consume : callable or None
        ``consume(x, out, context, nonzero)``: ``_run`` allowed to overwrite
        ``x`` (a buffer of the pipeline's own); ``nonzero`` is the count of
        last-axis entries of ``x`` that may be non-zero, or None.
    prefers : tuple or None
        The memory order of both its sides it runs fastest in (the logical
        axes in memory order, as for ``numpy.transpose``); None: any.
    adapts : bool
        With ``prefers``: it reads and writes other layouts itself at little
        cost, so the pipeline need not copy the caller's arrays into the
        preferred layout for it.
    """

    identity: bool = False
    view: Optional[Callable] = None
    embed: Optional[Callable] = None
    kept: Optional[int] = None
    pads_short_input_in: frozenset = frozenset()
    in_place: bool = False
    consume: Optional[Callable] = None
    prefers: Optional[tuple] = None
    adapts: bool = False


class LinearOperator(Described):
    """Base class of every mpisphere operator.

    A subclass sets :attr:`domain` and :attr:`range` (:class:`Layout`) in
    its ``__init__`` and implements either

    * ``_forward(x, out)`` and ``_adjoint(y, out)``, each returning the
      result (``out`` when given): the simple protocol, for your own
      operators; calls go straight to them; or
    * ``_output(direction, spec)``, returning the result's :class:`Spec` and
      a description of the input that must match across ranks (raise
      :class:`InputError` for bad input), and ``_run(direction, x, out,
      context)``, which writes into ``out``: the protocol of mpisphere's own
      operators, which get the local checks, ``out=`` handling and the
      agreement step from this class. ``_comm`` names the communicator to
      agree on (``None``: the operator does not communicate).

    What the ranks compare about the operator itself is derived from every
    argument its constructor was called with (:class:`~mpisphere.agreement.Described`);
    a subclass lists the arguments that legitimately differ between ranks
    in ``_per_rank``.

    Attributes
    ----------
    domain, range : Layout
        Layouts of the input of :meth:`forward` and of its output.
    """

    domain = None
    range = None
    _comm = None

    @property
    def name(self):
        return type(self).__name__

    # --- public interface ---

    def forward(self, x, out=None):
        """Apply the operator. Never modifies ``x``; writes into ``out`` when given."""
        return self._apply(FORWARD, x, out)

    def adjoint(self, y, out=None):
        """Apply the adjoint. Never modifies ``y``; writes into ``out`` when given."""
        return self._apply(ADJOINT, y, out)

    def __call__(self, x, out=None):
        return self.forward(x, out)

    def domain_shape(self, lead=()):
        """This rank's shape of a domain point with leading (batch) axes ``lead``.

        Operators with a fixed core of trailing axes (halo exchanges,
        transforms, spectral operators) append it to ``lead``; the
        primitives, whose split axes may be anywhere, take ``lead`` as the
        whole shape with the split axes' entries ignored (see each class).
        """
        return self._shapes(tuple(lead))[0]

    def range_shape(self, lead=()):
        """This rank's shape of a range point with leading axes ``lead`` (see :meth:`domain_shape`)."""
        return self._shapes(tuple(lead))[1]

    def _shapes(self, lead):
        raise TypeError(f"{self.name} does not describe its shapes; pass the points to dottest yourself")

    @property
    def H(self):
        """The adjoint operator: ``A.H.forward == A.adjoint``."""
        return AdjointOperator(self)

    def __matmul__(self, other):
        if not isinstance(other, LinearOperator):
            return NotImplemented
        return _Composition(self, other)

    def __add__(self, other):
        if not isinstance(other, LinearOperator):
            return NotImplemented
        return _Sum(self, other, 1.0)

    def __sub__(self, other):
        if not isinstance(other, LinearOperator):
            return NotImplemented
        return _Sum(self, other, -1.0)

    def __mul__(self, scalar):
        if isinstance(scalar, LinearOperator) or not _is_real_scalar(scalar):
            return NotImplemented
        return _Scaled(self, float(scalar))

    __rmul__ = __mul__

    def __neg__(self):
        return _Scaled(self, -1.0)

    def __repr__(self):
        return f"<{self.name}: {self.domain} -> {self.range}>"

    # --- the protocol ---

    def _layouts(self):
        for side in ("domain", "range"):
            if not isinstance(getattr(self, side), Layout):
                raise TypeError(f"{self.name}.{side} is {getattr(self, side)!r}: a LinearOperator must set domain "
                                "and range to Layouts in its __init__ (e.g. Layout('distributed', grid.cart))")

    def _simple(self):
        """True for operators written in the simple protocol (``_forward``/``_adjoint``)."""
        return type(self)._output is LinearOperator._output

    def _output(self, direction, spec):
        raise NotImplementedError

    def _describe(self):
        """What identifies this operator across ranks: every constructor argument (see ``Described``)."""
        return description_of(self)

    def _forward(self, x, out):
        raise TypeError(f"{self.name} implements neither _forward/_adjoint nor _output/_run: subclasses of "
                        "LinearOperator define _forward(x, out) and _adjoint(y, out)")

    def _adjoint(self, y, out):
        raise TypeError(f"{self.name} defines no _adjoint(y, out): an operator without its adjoint cannot be a "
                        "LinearOperator")

    def _guard(self):
        """The :class:`~mpisphere.agreement.CallGuard` of the grid this operator communicates on (or its own)."""
        guard = getattr(self._comm, "guard", None) if self._comm is not None else None
        if guard is None:
            guard = self.__dict__.setdefault("_own_guard", CallGuard())
        return guard

    def _reserve(self, direction, x, out):
        """Allocate the scratch buffers a call will use (before the agreement, so a failure is agreed on)."""

    def _agreement(self, comm, who, error, description, spec, signature):
        """The agreement strategy: over ``comm`` (one Allreduce), raising everywhere or returning the context."""
        if comm is None:
            if error is not None:
                raise error.kind(f"{who}: {error.text}")
            return Context.local(spec)
        return agree(comm, who, error, description, spec, signature)

    def _refuse(self, comm, who, description, spec, signature):
        """What a call refused on this rank (another thread held the grid) tells the other ranks."""
        if comm is not None:
            raise_everywhere(comm, who, InputError(REFUSED, RuntimeError))

    def _apply(self, direction, x, out, label=None, runner=None, in_place=False):
        """Check, allocate, agree, run: the steps of every call (see the module docstring).

        ``label`` names the call in messages and in the agreement when it is
        not the plain direction (``start_forward``, ``update``); ``runner``
        does the work instead of :meth:`_run`; ``in_place`` calls write into
        ``x`` and return it.
        """
        self._layouts()
        if self._simple():
            return self._forward(x, out) if direction == FORWARD else self._adjoint(x, out)
        label = label or direction
        who = f"{self.name}.{label}"
        comm = self._comm
        if comm is not None and comm == MPI.COMM_NULL:
            raise RuntimeError(f"{who}: the operator's communicator was freed (grid.free()); build the operator "
                               "on a live grid")
        error, spec, result, description = None, None, None, "(input not understood)"
        try:
            spec = Spec.of(x)
            result, description = self._output(label if in_place else direction, spec)
            if in_place:
                if not backend.is_writeable(x):
                    raise InputError(f"the array is read-only; {label} writes into it")
            elif out is not None:
                check_out(out, result, x)
        except InputError as exc:
            error = exc
        if error is None:  # allocate before agreeing: a failure here is this rank's finding, seen by every rank
            try:
                if in_place:
                    out = x
                elif out is None:
                    out = _allocate(result, x)
                self._reserve(label if in_place else direction, x, out)
            except Exception as exc:  # noqa: BLE001 -- MemoryError, cupy's OutOfMemoryError, ...
                error = InputError.from_exception(exc, f"allocating the buffers of this call ({result.describe()})")
        signature = f"{self._describe()} {label}"
        guard = self._guard()
        if not guard.enter(lambda: self._refuse(comm, who, description, spec, signature)):
            raise RuntimeError(f"{who}: {REFUSED} on this rank; the other ranks raise too when that call ends")
        try:
            context = self._agreement(comm, who, error, description, spec, signature)
            (runner or self._run)(label if in_place else direction, x, out, context)
            return out
        finally:
            guard.leave()

    def _run(self, direction, x, out, context):
        """Do the work into ``out`` (already checked and agreed). Default: the simple protocol."""
        result = self._forward(x, out) if direction == FORWARD else self._adjoint(x, out)
        if result is not out:
            out[...] = result

    def abilities(self, direction):
        """What this operator can do as a pipeline stage run in ``direction`` (:class:`Abilities`). Default: none."""
        return Abilities()


def _allocate(spec, like):
    xp = backend.array_module(like)
    with backend.device_of(like):
        return xp.empty(spec.shape, dtype=spec.dtype)


def _is_real_scalar(value):
    return isinstance(value, (int, float, numpy.integer, numpy.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def _agreement_comm(ops):
    """The communicator a group of operators agrees on, or None when none of them communicates.

    Their common communicator when every part that communicates uses the
    same one (a composition then meets its parts, called one after the other
    on another rank, in the same agreement); otherwise the space they share.
    """
    comms = [op._comm for op in ops if getattr(op, "_comm", None) is not None]
    if not comms:
        return None
    first = comms[0]
    if all(c is first or (c != MPI.COMM_NULL and first != MPI.COMM_NULL and
                          MPI.Comm.Compare(c, first) == MPI.IDENT) for c in comms[1:]):
        return first
    return next(op for op in ops if getattr(op, "_comm", None) is not None).domain.space


def _parts(op, direction, text, comm):
    """An operator's agreement parts: a list of (communicator, description) (see :func:`agree`).

    A part that does not communicate (a diagonal, a scaling) still has its
    own description compared over ``comm``, the communicator of the
    composition: its parameters decide the result as much as a transform's.
    """
    if not isinstance(text, str):
        return list(text)
    if op._comm is None:
        return [(comm, f"{op._describe()} {direction}"), (None, text)]
    return [(op._comm, f"{op._describe()} {direction}: {text}")]


class AdjointOperator(LinearOperator):
    """``op.H``: forward is ``op.adjoint``, adjoint is ``op.forward``."""

    def __init__(self, op):
        op._layouts()
        self.op = op
        self.domain = op.range
        self.range = op.domain
        self._comm = op._comm

    @property
    def name(self):
        return f"{self.op.name}.H"

    _flip = {FORWARD: ADJOINT, ADJOINT: FORWARD}

    def abilities(self, direction):
        return self.op.abilities(self._flip[direction])

    def _simple(self):
        return self.op._simple()

    def _forward(self, x, out):
        return self.op.adjoint(x, out)

    def _adjoint(self, y, out):
        return self.op.forward(y, out)

    def _output(self, direction, spec):
        return self.op._output(self._flip.get(direction, direction), spec)

    def _run(self, direction, x, out, context):
        self.op._run(self._flip.get(direction, direction), x, out, context)

    def _reserve(self, direction, x, out):
        self.op._reserve(self._flip.get(direction, direction), x, out)

    def _agreement(self, comm, who, error, description, spec, signature):
        return self.op._agreement(comm, who, error, description, spec, signature)

    def _refuse(self, comm, who, description, spec, signature):
        self.op._refuse(comm, who, description, spec, signature)

    def _shapes(self, lead):
        domain, range_ = self.op._shapes(lead)
        return range_, domain

    def _guard(self):
        return self.op._guard()

    @property
    def H(self):
        return self.op


class _Combination(LinearOperator):
    """Shared machinery of compositions and sums: checked as one, agreed once over their space."""

    def _simple(self):
        return any(op._simple() for op in self.ops)

    def _guard(self):
        for op in self.ops:
            if op._comm is not None:
                return op._guard()
        return LinearOperator._guard(self)


class _Composition(_Combination):
    """``A @ B``: forward applies ``B`` then ``A``; adjoint ``A^H`` then ``B^H``."""

    def __init__(self, a, b):
        a._layouts()
        b._layouts()
        reason = a.domain.mismatch(b.range)
        if reason is not None:
            raise ValueError(
                f"cannot compose {a.name} @ {b.name}: {b.name} returns {b.range!r} but {a.name} takes "
                f"{a.domain!r}; {reason}, so the composition would not be a linear operator with the "
                "adjoint its parts define")
        self.ops = (a.ops if isinstance(a, _Composition) else (a,)) + \
                   (b.ops if isinstance(b, _Composition) else (b,))
        for op in self.ops:
            if getattr(op, "needs_own_agreement", False):
                raise ValueError(f"{op.name} cannot take part in a composition: {op.needs_own_agreement}")
        self.domain = self.ops[-1].domain
        self.range = self.ops[0].range
        self._comm = _agreement_comm(self.ops)
        self._scratch = backend.Workspace()

    @property
    def name(self):
        return " @ ".join(op.name for op in self.ops)

    def _sequence(self, direction):
        return reversed(self.ops) if direction == FORWARD else iter(self.ops)

    def _forward(self, x, out):
        for op in reversed(self.ops[1:]):
            x = op.forward(x)
        return self.ops[0].forward(x, out)

    def _adjoint(self, y, out):
        for op in self.ops[:-1]:
            y = op.adjoint(y)
        return self.ops[-1].adjoint(y, out)

    def _output(self, direction, spec):
        # one part per operator, each agreed over that operator's communicator (see agree)
        parts = []
        for op in self._sequence(direction):
            try:
                spec, text = op._output(direction, spec)
            except InputError as exc:
                raise InputError(f"at {op.name}.{direction}: {exc.text}", exc.kind) from None
            parts += _parts(op, direction, text, self._comm)
        return spec, parts

    def _describe(self):
        return " @ ".join(op._describe() for op in self.ops)

    def _steps(self, direction, x):
        """The intermediate buffers of a call, one per part but the last (from the composition's workspace)."""
        buffers, spec = [], Spec.of(x)
        ops = list(self._sequence(direction))
        for i, op in enumerate(ops[:-1]):
            spec, _ = op._output(direction, spec)
            buffers.append(self._scratch.scratch(f"step{i}", x, math.prod(spec.shape), spec.dtype)
                           .reshape(spec.shape))
        return ops, buffers

    def _reserve(self, direction, x, out):
        ops, buffers = self._steps(direction, x)
        for i, op in enumerate(ops):
            op._reserve(direction, x if i == 0 else buffers[i - 1], out if i == len(ops) - 1 else buffers[i])

    def _run(self, direction, x, out, context):
        ops, buffers = self._steps(direction, x)
        for i, op in enumerate(ops):
            op._run(direction, x if i == 0 else buffers[i - 1], out if i == len(ops) - 1 else buffers[i], context)

    def _shapes(self, lead):
        return self.ops[-1]._shapes(lead)[0], self.ops[0]._shapes(lead)[1]

    @property
    def H(self):
        result = self.ops[-1].H
        for op in reversed(self.ops[:-1]):
            result = result @ op.H
        return result


class _Sum(_Combination):
    """``A + B`` (``sign=1``) or ``A - B`` (``sign=-1``): both map the same layouts."""

    def __init__(self, a, b, sign):
        a._layouts()
        b._layouts()
        for side in ("domain", "range"):
            reason = getattr(a, side).mismatch(getattr(b, side))
            if reason is not None:
                raise ValueError(f"cannot add {a.name} and {b.name}: their {side}s are {getattr(a, side)!r} and "
                                 f"{getattr(b, side)!r}; {reason}")
        self.ops = (a, b)
        self.sign = sign
        self.domain, self.range = a.domain, a.range
        self._comm = _agreement_comm(self.ops)
        self._scratch = backend.Workspace()

    @property
    def name(self):
        return f"({self.ops[0].name} {'+' if self.sign > 0 else '-'} {self.ops[1].name})"

    def _forward(self, x, out):
        return self._combine(self.ops[0].forward(x), self.ops[1].forward(x), out)

    def _adjoint(self, y, out):
        return self._combine(self.ops[0].adjoint(y), self.ops[1].adjoint(y), out)

    def _combine(self, first, second, out):
        if out is None:
            out = first
        else:
            out[...] = first
        if self.sign > 0:
            out += second
        else:
            out -= second
        return out

    def _output(self, direction, spec):
        first, d1 = self.ops[0]._output(direction, spec)
        second, d2 = self.ops[1]._output(direction, spec)
        if first.shape != second.shape or first.dtype != second.dtype:
            raise InputError(f"{self.ops[0].name} gives {first.describe()} but {self.ops[1].name} gives "
                             f"{second.describe()}; they cannot be added")
        return first, _parts(self.ops[0], direction, d1, self._comm) + _parts(self.ops[1], direction, d2, self._comm)

    def _describe(self):
        return f"({self.ops[0]._describe()}) {'+' if self.sign > 0 else '-'} ({self.ops[1]._describe()})"

    def _second(self, direction, x):
        result, _ = self.ops[1]._output(direction, Spec.of(x))
        return self._scratch.scratch("second", x, math.prod(result.shape), result.dtype).reshape(result.shape)

    def _reserve(self, direction, x, out):
        second = self._second(direction, x)
        self.ops[0]._reserve(direction, x, out)
        self.ops[1]._reserve(direction, x, second)

    def _run(self, direction, x, out, context):
        self.ops[0]._run(direction, x, out, context)
        second = self._second(direction, x)
        self.ops[1]._run(direction, x, second, context)
        if self.sign > 0:
            out += second
        else:
            out -= second

    def _shapes(self, lead):
        return self.ops[0]._shapes(lead)

    @property
    def H(self):
        return _Sum(self.ops[0].H, self.ops[1].H, self.sign)


class _Scaled(_Combination):
    """``a * A`` for a real scalar ``a`` (its own adjoint factor in the real inner product)."""

    def __init__(self, op, scale):
        op._layouts()
        self.ops = (op,)
        self.scale = scale
        self.domain, self.range = op.domain, op.range
        self._comm = op._comm

    @property
    def name(self):
        return f"{self.scale:g} * {self.ops[0].name}"

    def _describe(self):
        return f"{self.scale!r} * {self.ops[0]._describe()}"

    def _forward(self, x, out):
        result = self.ops[0].forward(x, out)
        result *= self.scale
        return result

    def _adjoint(self, y, out):
        result = self.ops[0].adjoint(y, out)
        result *= self.scale
        return result

    def _output(self, direction, spec):
        return self.ops[0]._output(direction, spec)

    def _reserve(self, direction, x, out):
        self.ops[0]._reserve(direction, x, out)

    def _run(self, direction, x, out, context):
        self.ops[0]._run(direction, x, out, context)
        out *= self.scale

    def _shapes(self, lead):
        return self.ops[0]._shapes(lead)

    @property
    def H(self):
        return _Scaled(self.ops[0].H, self.scale)


class Identity(LinearOperator):
    """The identity on arrays of ``layout``: ``forward`` and ``adjoint`` copy.

    Parameters
    ----------
    layout : Layout
        Domain and range.
    core : tuple of int, optional
        The trailing shape of a point (for :meth:`domain_shape` and
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


# --- inner products and the dot test ------------------------------------------------------------

def _local_inner(a, b):
    """``sum(real(conj(a) * b))`` and ``sum(|a| |b|)`` of this rank's arrays, in float64 (and an error)."""
    if not (backend.is_array(a) and backend.is_array(b)):
        return 0.0, 0.0, f"inner product of {type(a).__name__} and {type(b).__name__}: arrays expected"
    if tuple(a.shape) != tuple(b.shape):
        return 0.0, 0.0, f"inner product of arrays of different shapes {tuple(a.shape)} and {tuple(b.shape)}"
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
    return value, bound, None


def _global_sums(a, b, layout, who):
    """Global ``(inner product, bound)`` of ``a`` and ``b`` in ``layout``; a local problem raises everywhere."""
    value, bound, error = _local_inner(a, b)
    weight = 1.0 if layout.counts_here() else 0.0
    local = numpy.array([value * weight, bound * weight, 0.0 if error is None else 1.0])
    if layout.space.Get_size() > 1:
        local = collectives.allreduce_floats(layout.space, local)
    if local[2] > 0:
        raise ValueError(f"{who}: " + (error or "another rank's arrays do not match for the inner product"))
    return float(local[0]), float(local[1])


def inner(a, b, layout):
    """Global real inner product of ``a`` and ``b`` held in ``layout``.

    ``sum(real(conj(a) * b))`` over every element of every rank's piece
    (each copy of a replicated array counted once), accumulated in float64
    whatever the dtype. Collective over ``layout.space`` when it has more
    than one rank; arrays of different shapes on any rank raise on all.
    """
    return _global_sums(a, b, layout, "inner")[0]


def _random_point(rng, shape, dtype, layout, seed):
    """Random normal data; identical on the ranks of a replicated layout's communicator."""
    if layout.kind == REPLICATED:
        rng = numpy.random.default_rng([seed, 0])
    dtype = numpy.dtype(dtype)
    x = rng.standard_normal(shape)
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def dottest(op, x=None, y=None, rtol=1e-13, *, lead=(), dtype=numpy.float64, seed=0):
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
    x : array, optional
        A point of the domain (this rank's piece, or the replicated array).
        Drawn at random from ``op.domain_shape(lead)`` when omitted.
    y : array, optional
        A point of the range; drawn at random like ``op.forward(x)`` when
        omitted.
    rtol : float
        Largest accepted ``|<A x, y> - <x, A^H y>| / (sum |A x| |y| + sum |x| |A^H y|)``.
    lead : tuple of int, keyword-only
        Leading axes of the random points.
    dtype : dtype, keyword-only
        Of a random ``x`` (a random ``y`` takes the dtype of ``op.forward(x)``).
    seed : int, keyword-only
        Seed of the random points (mixed with the rank for distributed ones).

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
    space = op.domain.space
    who = f"dottest({op.name})"
    if space.Get_size() > 1:  # one verdict for every rank: the ranks check the same thing, to the same tolerance
        error = None
        if not (isinstance(rtol, (int, float, numpy.integer, numpy.floating)) and not isinstance(rtol, bool)):
            error = InputError(f"rtol must be a real number, got {rtol!r}", TypeError)
        how = (f"rtol={rtol!r}, lead={tuple(lead)!r}, dtype={numpy.dtype(dtype).name}, seed={seed!r}, "
               f"x {'given' if x is not None else 'drawn'}, y {'given' if y is not None else 'drawn'}")
        # the operator itself agrees in its own calls (copies on sub-communicators may differ between groups)
        agree(space, who, error, how, signature=who)
    rng = numpy.random.default_rng([seed, space.Get_rank(), space.Get_size()])
    if x is None:
        x = _random_point(rng, op.domain_shape(lead), dtype, op.domain, seed)
    ax = op.forward(x)
    if y is None:
        y = backend.array_module(ax).asarray(_random_point(rng, ax.shape, ax.dtype, op.range, seed + 1))
    aty = op.adjoint(y)
    lhs, lhs_bound = _global_sums(ax, y, op.range, who)
    rhs, rhs_bound = _global_sums(x, aty, op.domain, who)
    if space.Get_size() > 1:  # an Allreduce may round differently on different ranks: rank 0's figures for all
        lhs, rhs, lhs_bound, rhs_bound = (float(v) for v in collectives.bcast_floats(
            space, numpy.array([lhs, rhs, lhs_bound, rhs_bound], dtype=numpy.float64)))
    bound = lhs_bound + rhs_bound
    error = abs(lhs - rhs) / bound if bound > 0 else 0.0
    if not error <= rtol:
        raise AssertionError(
            f"dottest({op.name}): <A x, y> = {lhs!r} but <x, A^H y> = {rhs!r}; their difference "
            f"{abs(lhs - rhs):.3e} is {error:.3e} of the rounding bound sum|Ax||y| + sum|x||A^H y| = {bound:.6e}, "
            f"more than rtol {rtol:.1e}")
    return error
