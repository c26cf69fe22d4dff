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
   not overlapping the input). Nothing is raised yet.
2. **agreement** over the ranks that communicate: one ``Allreduce`` (MAX) of
   four integers, an error flag, a 62-bit digest of what this rank is about
   to do and its negation (equal maxima mean equal digests), and a flag for
   the CUDA-aware decision. The digest covers the operator, its construction
   parameters, the direction, the input's shape (the axes that legitimately
   differ between ranks masked) and dtype, and the calling thread's name.
   When anything differs, the ranks exchange their full descriptions and
   every rank raises the same error, naming the ranks that are wrong and
   what each has. No rank waits, and no rank returns a result computed from
   mismatched data.
3. **the work**, on buffers everyone agreed on.

A halo exchange agrees with its neighbours instead (see
:mod:`mpisphere.halo`); a composition or a transform agrees once, over its
whole space, for all its parts. ``mpisphere.config.debug`` compares the full
descriptions on every call (no digest); ``mpisphere.config.agreement =
False`` skips the step (for code proven to match; it must then be off on
every rank).
"""

import collections
import hashlib
import math
import threading

import numpy
from mpi4py import MPI

from . import backend, collectives, cuda_aware, dtypes
from .settings import config

__all__ = [
    "DISTRIBUTED",
    "REPLICATED",
    "FORWARD",
    "ADJOINT",
    "Layout",
    "Spec",
    "InputError",
    "Context",
    "LinearOperator",
    "AdjointOperator",
    "Identity",
    "Diagonal",
    "agree",
    "digest",
    "call_description",
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


# --- specs and errors -----------------------------------------------------------------------------

class Spec(collections.namedtuple("Spec", "shape dtype device")):
    """An array without its data: ``shape`` (tuple), ``dtype`` (numpy.dtype), ``device`` (bool: CuPy)."""

    __slots__ = ()

    @classmethod
    def of(cls, a, what="input"):
        """The spec of array ``a``; an :class:`InputError` (TypeError) for anything else."""
        if not backend.is_array(a):
            raise InputError(f"the {what} must be a NumPy or CuPy array, got {type(a).__name__}", TypeError)
        return cls(tuple(a.shape), numpy.dtype(a.dtype), backend.is_device_array(a))

    def but(self, shape=None, dtype=None):
        """The same spec with another shape or dtype."""
        return Spec(self.shape if shape is None else tuple(shape),
                    self.dtype if dtype is None else numpy.dtype(dtype), self.device)

    def describe(self, masked=()):
        """``shape (2, *, 3) float64 on host``: the axes in ``masked`` (they differ between ranks) as ``*``."""
        masked = {a % len(self.shape) for a in masked} if self.shape else set()
        shape = tuple("*" if i in masked else n for i, n in enumerate(self.shape))
        return f"shape {shape} {self.dtype.name} on {'device' if self.device else 'host'}"


class InputError(Exception):
    """A problem with this rank's arguments, found before any communication.

    Carries the exception class that the user sees (``kind``) and the text
    (expected and got); the operator adds who and which rank.
    """

    def __init__(self, text, kind=ValueError):
        super().__init__(text)
        self.text = text
        self.kind = kind


class Context:
    """What the ranks agreed on for one call: whether device buffers go through host memory."""

    __slots__ = ("staged",)

    def __init__(self, staged=False):
        self.staged = staged

    @classmethod
    def local(cls, spec):
        """The context of a call that needs no agreement: this rank's own verdict."""
        return cls(config.force_staging or (spec is not None and spec.device and not cuda_aware.verdict()[0]))


_MASK = (1 << 62) - 1


def digest(text):
    """A 62-bit digest of ``text`` (its negation fits an int64, so one MAX reduction compares digests)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & _MASK


def call_description(description):
    """``description`` with what else must match across ranks: the thread's name and the switches in force."""
    return (f"{description}; thread {threading.current_thread().name!r}"
            f"{'; force_staging' if config.force_staging else ''}{'; debug' if config.debug else ''}")


def _group_id(comm, space):
    """The space rank of ``comm``'s rank 0: the same on every member of ``comm``, different between groups."""
    if comm is space:
        return 0
    return int(MPI.Group.Translate_ranks(comm.Get_group(), [0], space.Get_group())[0])


def agree(comm, who, error, description, spec=None, signature=""):
    """The agreement step: collective over ``comm``; raises the same error on every rank, or returns.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks about to communicate.
    who : str
        ``"Operator.direction"``, the start of every message.
    error : InputError or None
        This rank's local finding.
    description : str or list of (comm or None, str)
        What this rank is about to do, in words that are the same on every
        rank that does the same thing (no rank numbers, split axes masked).
        A composition gives one part per operator with the communicator the
        part must agree over: a part on ``comm`` itself must match on every
        rank, a part on a sub-communicator (``grid.polar`` inside a grid)
        only within its row or column, a part on ``None`` (a local operator)
        nowhere.
    spec : Spec, optional
        The input's spec: when it lives on a device, the ranks also agree
        on whether MPI is CUDA-aware.
    signature : str
        The operator and call (``"Transpose(...) forward"``), which must
        match on every rank.

    Returns
    -------
    Context
        The agreed context (staging decision).

    Raises
    ------
    InputError's kind (TypeError or ValueError)
        On every rank, when any rank had an error or the descriptions differ.
    """
    size = comm.Get_size()
    parts = [(comm, description)] if isinstance(description, str) else list(description)
    on_comm = " | ".join(text for c, text in parts if c is comm)
    kind = "" if spec is None else f" [{spec.dtype.name} on {'device' if spec.device else 'host'}]"
    here = call_description(f"{signature}: {on_comm}" if on_comm else f"{signature}{kind}")
    device = spec is not None and spec.device
    if size == 1 or not config.agreement:
        if error is not None:
            raise _as_exception(who, [(comm.Get_rank(), size, error.kind.__name__, error.text)])
        return Context.local(spec)
    everything = digest(" | ".join(text for _, text in parts))
    code = digest(here)
    not_aware = 1 if device and not config.force_staging and not cuda_aware.verdict()[0] else 0
    flags = numpy.array([0 if error is None else 1, code, -code, everything, -everything, not_aware],
                        dtype=numpy.int64)
    collectives.allreduce_max_ints(comm, flags)
    context = Context(config.force_staging or (device and flags[5] > 0))
    if flags[0] == 0 and flags[1] == -flags[2] and not config.debug:
        if flags[3] == -flags[4]:
            return context
        # the parts on sub-communicators differ somewhere: they need only agree within their groups
        if not _groups_disagree(comm, parts):
            return context
    everyone = collectives.allgather_object(
        comm, (None if error is None else (error.kind.__name__, error.text), here,
               [(None if c is None else (c.Get_name() or "a sub-communicator", _group_id(c, comm)), text)
                for c, text in parts if c is not comm]))
    errors = [(r, size, e[0], e[1]) for r, (e, _, _) in enumerate(everyone) if e is not None]
    if errors:
        raise _as_exception(who, errors)
    problems = _differences([d for _, d, _ in everyone])
    if not problems:  # the ranks agree here: find the groups of a sub-communicator that do not
        for index in range(len(everyone[0][2])):
            group_of = {}
            for r, (_, _, subparts) in enumerate(everyone):
                where, text = subparts[index]
                if where is not None:
                    group_of.setdefault(where, {})[r] = text
            for (name, _), members in group_of.items():
                found = _differences([members[r] for r in sorted(members)], sorted(members))
                if found:
                    problems = f"within {name} " + found
                    break
            if problems:
                break
    if not problems:  # debug mode compared everything and found it equal
        return context
    raise ValueError(f"{who}: the {size} ranks disagree on what they are about to do: {problems}")


def _groups_disagree(comm, parts):
    """Check each sub-communicator part within its groups; the same answer on every rank of ``comm``."""
    bad = 0
    for c, text in parts:
        if c is None or c is comm:
            continue
        code = digest(text)
        pair = numpy.array([code, -code], dtype=numpy.int64)
        collectives.allreduce_max_ints(c, pair)
        bad |= int(pair[0] != -pair[1])
    flag = numpy.array([bad], dtype=numpy.int64)
    collectives.allreduce_max_ints(comm, flag)
    return bool(flag[0])


def _differences(texts, ranks=None):
    """A message naming who has what, when ``texts`` (one per rank) are not all equal; ``""`` otherwise."""
    ranks = list(range(len(texts))) if ranks is None else ranks
    groups = {}
    for r, text in zip(ranks, texts):
        groups.setdefault(text, []).append(r)
    if len(groups) < 2:
        return ""
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    parts = [f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'}: {d}" for d, rs in ordered[:4]]
    return " | ".join(parts) + (f" | and {len(ordered) - 4} more variants" if len(ordered) > 4 else "")


def _ranks(ranks):
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def _as_exception(who, errors):
    """One exception from ``(rank, size, kind name, text)`` findings (the same on every rank).

    Ranks with the same finding are named together (``ranks 0-5 of 6: ...``);
    the first four different findings are quoted.
    """
    kinds = {kind for _, _, kind, _ in errors}
    cls = TypeError if kinds == {"TypeError"} else (RuntimeError if kinds == {"RuntimeError"} else ValueError)
    size = errors[0][1]
    groups = {}
    for r, _, _, text in errors:
        groups.setdefault(text, []).append(r)
    items = list(groups.items())
    shown = " | ".join(f"{_ranks(ranks)} of {size}: {text}" for text, ranks in items[:4])
    rest = sum(len(ranks) for _, ranks in items[4:])
    more = f" | and {rest} more rank{'s' if rest > 1 else ''}" if rest else ""
    return cls(f"{who}: {shown}{more}")


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

class LinearOperator:
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
        """What identifies this operator across ranks (construction parameters, no rank numbers)."""
        return self.name

    def _forward(self, x, out):
        raise TypeError(f"{self.name} implements neither _forward/_adjoint nor _output/_run: subclasses of "
                        "LinearOperator define _forward(x, out) and _adjoint(y, out)")

    def _adjoint(self, y, out):
        raise TypeError(f"{self.name} defines no _adjoint(y, out): an operator without its adjoint cannot be a "
                        "LinearOperator")

    def _guard_lock(self):
        comm = self._comm
        lock = getattr(comm, "lock", None) if comm is not None else None
        if lock is None:
            lock = self.__dict__.setdefault("_own_lock", threading.RLock())
        return lock

    def _apply(self, direction, x, out, label=None, runner=None):
        """Check, agree, run: the three steps of every call (see the module docstring).

        ``label`` names the call in messages and in the agreement when it is
        not the plain direction (``start_forward``); ``runner`` does the work
        instead of :meth:`_run`.
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
            result, description = self._output(direction, spec)
            if out is not None:
                check_out(out, result, x)
        except InputError as exc:
            error = exc
        lock = self._guard_lock()
        if not lock.acquire(blocking=False):
            raise RuntimeError(
                f"{who}: another thread is running an mpisphere operation on the same grid (or operator) now; "
                "MPI matches one communicator's collectives in call order, so two threads on one grid mix their "
                "messages. Give each thread its own grid: grid.dup()")
        try:
            if comm is None:
                if error is not None:
                    raise error.kind(f"{who}: {error.text}")
                context = Context.local(spec)
            else:
                context = agree(comm, who, error, description, spec, f"{self._describe()} {label}")
            if out is None:
                out = _allocate(result, x)
            (runner or self._run)(direction, x, out, context)
            return out
        finally:
            lock.release()

    def _run(self, direction, x, out, context):
        """Do the work into ``out`` (already checked and agreed). Default: the simple protocol."""
        result = self._forward(x, out) if direction == FORWARD else self._adjoint(x, out)
        if result is not out:
            out[...] = result


def _allocate(spec, like):
    xp = backend.array_module(like)
    with backend.device_of(like):
        return xp.empty(spec.shape, dtype=spec.dtype)


def _is_real_scalar(value):
    return isinstance(value, (int, float, numpy.integer, numpy.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def _space_of(ops):
    """The communicator a group of operators agrees on: the space of those that communicate, or None."""
    for op in ops:
        if getattr(op, "_comm", None) is not None:
            return op.domain.space
    return None


def _parts(op, direction, text):
    """An operator's agreement parts: a list of (communicator, description) (see :func:`agree`)."""
    if isinstance(text, str):
        return [(op._comm, f"{op._describe()} {direction}: {text}")]
    return list(text)


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

    @property
    def is_identity(self):
        return getattr(self.op, "is_identity", False)

    _flip = {FORWARD: ADJOINT, ADJOINT: FORWARD}

    def _simple(self):
        return self.op._simple()

    def _forward(self, x, out):
        return self.op.adjoint(x, out)

    def _adjoint(self, y, out):
        return self.op.forward(y, out)

    def _output(self, direction, spec):
        return self.op._output(self._flip[direction], spec)

    def _describe(self):
        return f"({self.op._describe()}).H"

    def _run(self, direction, x, out, context):
        self.op._run(self._flip[direction], x, out, context)

    def _shapes(self, lead):
        domain, range_ = self.op._shapes(lead)
        return range_, domain

    def _guard_lock(self):
        return self.op._guard_lock()

    @property
    def H(self):
        return self.op


class _Combination(LinearOperator):
    """Shared machinery of compositions and sums: checked as one, agreed once over their space."""

    def _simple(self):
        return any(op._simple() for op in self.ops)

    def _guard_lock(self):
        for op in self.ops:
            if op._comm is not None:
                return op._guard_lock()
        return LinearOperator._guard_lock(self)


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
        self._comm = _space_of(self.ops)
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
            parts += _parts(op, direction, text)
        return spec, parts

    def _describe(self):
        return " @ ".join(op._describe() for op in self.ops)

    def _run(self, direction, x, out, context):
        ops = list(self._sequence(direction))
        for i, op in enumerate(ops):
            if i == len(ops) - 1:
                op._run(direction, x, out, context)
                return
            result, _ = op._output(direction, Spec.of(x))
            buf = self._scratch.scratch(f"step{i}", x, math.prod(result.shape), result.dtype).reshape(result.shape)
            op._run(direction, x, buf, context)
            x = buf

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
        self._comm = _space_of(self.ops)
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
        return first, _parts(self.ops[0], direction, d1) + _parts(self.ops[1], direction, d2)

    def _describe(self):
        return f"({self.ops[0]._describe()}) {'+' if self.sign > 0 else '-'} ({self.ops[1]._describe()})"

    def _run(self, direction, x, out, context):
        self.ops[0]._run(direction, x, out, context)
        result, _ = self.ops[1]._output(direction, Spec.of(x))
        second = self._scratch.scratch("second", x, math.prod(result.shape), result.dtype).reshape(result.shape)
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
        both parts.
    layout : Layout
        Domain and range (a diagonal is its own adjoint in the real inner
        product).

    Notes
    -----
    ``forward(x) = weights * x``, ``adjoint(y) = weights * y``. No
    communication. Typical uses: quadrature weights on a tile, error
    variances on a coefficient block, the inverse of a diagonal ``B``.
    """

    def __init__(self, weights, layout):
        if not backend.is_array(weights):
            raise TypeError(f"Diagonal: weights must be a NumPy or CuPy array, got {type(weights).__name__}")
        if numpy.dtype(weights.dtype).kind not in "fiu":
            raise TypeError(f"Diagonal: weights must be real, got {numpy.dtype(weights.dtype).name}")
        if not isinstance(layout, Layout):
            raise TypeError(f"Diagonal: layout must be a Layout, got {type(layout).__name__}")
        self.weights = weights
        self.domain = self.range = layout

    def _output(self, direction, spec):
        core = tuple(self.weights.shape)
        if spec.shape[len(spec.shape) - len(core):] != core or len(spec.shape) < len(core):
            raise InputError(f"expected an array whose trailing shape is the weights' {core}, got {spec.shape}")
        if spec.device != backend.is_device_array(self.weights):
            raise InputError("the input and the weights live in different places (host and device)", TypeError)
        if dtypes.unsupported(spec.dtype):
            raise InputError(dtypes.unsupported(spec.dtype), TypeError)
        return spec, spec.describe()

    def _run(self, direction, x, out, context):
        numpy.multiply(x, self.weights, out=out)

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
    rng = numpy.random.default_rng([seed, space.Get_rank(), space.Get_size()])
    if x is None:
        x = _random_point(rng, op.domain_shape(lead), dtype, op.domain, seed)
    ax = op.forward(x)
    if y is None:
        y = backend.array_module(ax).asarray(_random_point(rng, ax.shape, ax.dtype, op.range, seed + 1))
    aty = op.adjoint(y)
    who = f"dottest({op.name})"
    lhs, lhs_bound = _global_sums(ax, y, op.range, who)
    rhs, rhs_bound = _global_sums(x, aty, op.domain, who)
    bound = lhs_bound + rhs_bound
    error = abs(lhs - rhs) / bound if bound > 0 else 0.0
    if not error <= rtol:
        raise AssertionError(
            f"dottest({op.name}): <A x, y> = {lhs!r} but <x, A^H y> = {rhs!r}; their difference "
            f"{abs(lhs - rhs):.3e} is {error:.3e} of the rounding bound sum|Ax||y| + sum|x||A^H y| = {bound:.6e}, "
            f"more than rtol {rtol:.1e}")
    return error
