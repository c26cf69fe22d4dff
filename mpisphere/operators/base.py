"""The operator type: :class:`LinearOperator`, its checked and agreed call, its adjoint and its algebra.

One job: ``A.H``, ``A @ B``, ``A + B`` and ``a * A`` are built by the base class's own methods, so the
combinations live beside it (as in SciPy's and PyLops' ``LinearOperator``).
"""

import math

import numpy

from .. import backend
from ..agreement import (REFUSED, CallGuard, Context, Described, InputError, Spec, agree, description_of, guarded,
                        raise_everywhere)
from .abilities import Abilities
from .calling import agreement_comm, agreement_parts, checked_call
from .layout import ADJOINT, FORWARD, Layout



class LinearOperator(Described):
    """Base class of every mpisphere operator.

    A subclass sets ``domain`` and ``range`` (:class:`Layout`) in
    its ``__init__`` and implements either

    * ``_forward(x, out)`` and ``_adjoint(y, out)``, each returning the
      result (``out`` when given): the simple protocol, for your own
      operators; calls go straight to them; or
    * ``_output(direction, spec)``, returning the result's ``Spec`` and
      a description of the input that must match across ranks (raise
      ``InputError`` for bad input), and ``_run(direction, x, out,
      context)``, which writes into ``out``: the protocol of mpisphere's own
      operators, which get the local checks, ``out=`` handling and the
      agreement step from this class. ``_comm`` names the communicator to
      agree on (``None``: the operator does not communicate).

    What the ranks compare about the operator itself is derived from every
    argument its constructor was called with (``mpisphere.agreement.Described``);
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

    def _dtypes(self):
        """``(domain dtype, range dtype)`` where the operator fixes them (transforms do), else ``(None, None)``."""
        return None, None

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

    def _output_in_place(self, direction, spec):
        """``(spec, description)`` of an in-place call's result: operators that have in-place calls define it."""
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

    def _apply(self, direction, x, out, label=None, runner=None, in_place=False, purpose=""):
        """Check, allocate, agree, run: the steps of every call (see the module docstring).

        ``label`` names the call in messages and in the agreement when it is
        not the plain direction (``start_forward``, ``update``); ``purpose``
        is added to what the ranks compare about the call (the PyTorch
        bridge: whether autograd records it, so that its backward, which
        communicates too, will run on every rank or on none); ``runner``
        does the work instead of :meth:`_run`; ``in_place`` calls write into
        ``x`` and return it (their result is described by
        :meth:`_output_in_place`, and ``_reserve`` and ``_run`` get ``out is
        x``).
        """
        return checked_call(self, direction, x, out, label, runner, in_place, purpose)

    def _guarded(self, who, comm, refusal, call):
        """``call()`` under the grid's guard; at the end of an outermost call, a failure noted elsewhere raises.

        ``refusal``: what the guard's holder runs for this call when another
        thread holds the guard (this rank then raises at once).
        """
        with guarded(self._guard(), comm, who, refusal):
            return call()

    def _check_values(self, direction, x):
        """This rank's check of the input's values (its shape and dtype passed ``_output``): an :class:`InputError`
        for values the operator cannot use, which every rank then raises. Default: none."""

    def _replay(self, direction, x):
        """A call on ``x`` planned in an earlier one (an in-place call that needs no check), or ``None``."""
        return None

    def run_agreed(self, direction, x, out, context):
        """``out`` = this operator (``direction``: FORWARD or ADJOINT) of ``x``, inside a call already checked and
        agreed. Collective over the operator's communicators, with no checks or agreement of its own.

        The inner protocol: an operator made of others (a composition, the
        spectral convolution's transforms, a DISCO convolution's halo) calls
        its parts so, from its own ``_run``, once its own call has checked
        ``x`` and ``out`` and agreed (``context``: what was agreed). Every rank
        must make the same calls in the same order. Subclasses implement
        ``_run``; this is the one name other objects call.
        """
        self._run(direction, x, out, context)

    def _run(self, direction, x, out, context):
        """Do the work into ``out`` (already checked and agreed). Default: the simple protocol."""
        result = self._forward(x, out) if direction == FORWARD else self._adjoint(x, out)
        if result is not out:
            out[...] = result

    def abilities(self, direction):
        """What this operator can do as a pipeline stage run in ``direction`` (``Abilities``). Default: none."""
        return Abilities()


def _is_real_scalar(value):
    return isinstance(value, (int, float, numpy.integer, numpy.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def domain_dtype(op, dtype=None):
    """``dtype`` when given, else the dtype ``op`` takes where it fixes one (the transforms do), else float64.

    The default of everything that draws or builds points of an operator's
    domain for the caller (:func:`~mpisphere.dottest`, the SciPy and
    pylops-mpi bridges), so an inverse transform gets complex coefficients
    without being told.
    """
    if dtype is not None:
        return numpy.dtype(dtype)
    fixed = op._dtypes()[0] if isinstance(op, LinearOperator) else None
    return numpy.dtype(numpy.float64 if fixed is None else fixed)


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
        self.op.run_agreed(self._flip.get(direction, direction), x, out, context)

    def _reserve(self, direction, x, out):
        self.op._reserve(self._flip.get(direction, direction), x, out)

    def _agreement(self, comm, who, error, description, spec, signature):
        return self.op._agreement(comm, who, error, description, spec, signature)

    def _refuse(self, comm, who, description, spec, signature):
        self.op._refuse(comm, who, description, spec, signature)

    def _shapes(self, lead):
        domain, range_ = self.op._shapes(lead)
        return range_, domain

    def _dtypes(self):
        return self.op._dtypes()[::-1]

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
        self._comm = agreement_comm(self.ops)
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
            parts += agreement_parts(op, direction, text, self._comm)
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
            op.run_agreed(direction, x if i == 0 else buffers[i - 1], out if i == len(ops) - 1 else buffers[i], context)

    def _shapes(self, lead):
        return self.ops[-1]._shapes(lead)[0], self.ops[0]._shapes(lead)[1]

    def _dtypes(self):
        return self.ops[-1]._dtypes()[0], self.ops[0]._dtypes()[1]

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
        self._comm = agreement_comm(self.ops)
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
        return first, (agreement_parts(self.ops[0], direction, d1, self._comm)
                       + agreement_parts(self.ops[1], direction, d2, self._comm))

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
        self.ops[0].run_agreed(direction, x, out, context)
        second = self._second(direction, x)
        self.ops[1].run_agreed(direction, x, second, context)
        if self.sign > 0:
            out += second
        else:
            out -= second

    def _shapes(self, lead):
        return self.ops[0]._shapes(lead)

    def _dtypes(self):
        return self.ops[0]._dtypes()

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
        self.ops[0].run_agreed(direction, x, out, context)
        out *= self.scale

    def _shapes(self, lead):
        return self.ops[0]._shapes(lead)

    def _dtypes(self):
        return self.ops[0]._dtypes()

    @property
    def H(self):
        return _Scaled(self.ops[0].H, self.scale)
