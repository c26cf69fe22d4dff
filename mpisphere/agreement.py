"""What the ranks compare before they communicate, and how: every strategy of the agreement in one place.

A mistake seen on one rank (a shape, a dtype, a parameter, a failed
allocation, another operator altogether) must raise the same error on
every rank that would have communicated with it, and never leave a rank
waiting. This module holds everything that decides it:

Descriptions
    What a rank compares is derived from how an object was built, never
    written by hand: :class:`Described` records every constructor argument
    of its subclasses (defaults filled in) and :func:`description_of`
    renders them, numbers by value, arrays by a hash of their bytes (equal
    NaNs compare equal), grids and communicators by their shape and name,
    other described objects by their own description. Arguments that
    legitimately differ between ranks (a rank's own block of weights) are
    named in the class attribute ``_per_rank`` and described by their kind
    and number of axes only.

Three strategies
    * :func:`agree`, over a communicator, before every call of an operator
      that communicates on it: one ``Allreduce`` (MAX) of six integers (an
      error flag, two digests and their negations, the CUDA-aware flag);
      the full descriptions are exchanged only when something differs,
      then every rank raises the same error naming who has what.
    * :class:`NeighbourRound`, with the neighbours of a grid, for halo
      exchanges: the record travels in front of the data (a header of eight
      integers before every data message, which announces the data's size),
      so agreeing costs no extra round trip; a rank that finds a mismatch
      still sends and drains every message of the call, and tells the others
      in its next headers.
    * :func:`agree_construction`, once, when an object whose parameters
      decide who talks to whom (a halo's widths and poles, the points of an
      interpolation, a model's time step) is built: collective over the
      object's communicator.

Threads
    :class:`CallGuard` is the one lock of a grid. A call that finds the
    grid busy with another thread raises on its rank at once, and the
    thread that holds the grid runs the refused call's agreement with an
    error when it finishes, so every other rank raises for that call too and
    every rank's sequence of calls stays the same. The thread's identity is
    never part of what is compared.

Only :mod:`mpisphere.collectives` is used to talk to MPI.
"""

import collections
import functools
import hashlib
import inspect
import math
import os
import threading

import numpy
from mpi4py import MPI

from . import backend, collectives, cuda_aware, staging
from .settings import config

__all__ = [
    "Spec",
    "InputError",
    "Context",
    "Described",
    "description_of",
    "describe_value",
    "digest",
    "call_description",
    "agree",
    "agree_construction",
    "raise_everywhere",
    "NeighbourRound",
    "message_buffer",
    "CallGuard",
    "REFUSED",
    "as_exception",
    "differences",
]


# --- specs, errors, contexts ------------------------------------------------------------------------

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
    (expected and got); the caller adds who and which rank.
    """

    def __init__(self, text, kind=ValueError):
        super().__init__(text)
        self.text = text
        self.kind = kind

    @classmethod
    def from_exception(cls, exc, what):
        """An allocation (or other) failure of this rank as a finding, e.g. ``MemoryError`` while allocating."""
        return cls(f"{what} failed: {type(exc).__name__}: {exc}", type(exc) if isinstance(exc, MemoryError)
                   else RuntimeError)


class Context:
    """What the ranks agreed on for one call: whether device buffers go through host memory."""

    __slots__ = ("staged",)

    def __init__(self, staged=False):
        self.staged = staged

    @classmethod
    def local(cls, spec):
        """The context of a call that needs no agreement: this rank's own verdict."""
        return cls(config.force_staging or (spec is not None and spec.device and not cuda_aware.verdict()[0]))


# --- descriptions ------------------------------------------------------------------------------------

_LONG = 8  # sequences longer than this are described by a hash of their content, not item by item


def _hash_bytes(data):
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _array_text(a):
    host = a if isinstance(a, numpy.ndarray) else backend.array_module(a).asnumpy(a)
    host = numpy.ascontiguousarray(host)
    return f"array({tuple(host.shape)}, {host.dtype.name}, {_hash_bytes(host.tobytes())})"


def describe_value(value, per_rank=False):
    """The text that stands for one constructor argument in what ranks compare.

    Numbers by value (``repr``: ``0.3`` and ``0.1 + 0.2`` differ, as they
    should), arrays by shape, dtype and a hash of their bytes, sequences of
    more than eight items the same way, grids by shape and rank order,
    communicators by name and size, :class:`Described` objects by their own
    description. ``per_rank``: the argument legitimately differs between
    ranks; only its kind (and number of axes or items) is described.
    """
    if per_rank:
        if backend.is_array(value):
            return f"per-rank {numpy.dtype(value.dtype).name} array of {value.ndim} axes"
        if isinstance(value, (list, tuple)):
            return f"per-rank {type(value).__name__} of {len(value)} items"
        return f"per-rank {type(value).__name__}"
    if value is None or isinstance(value, (bool, str, bytes)):
        return repr(value)
    if isinstance(value, numpy.bool_):
        return repr(bool(value))
    if isinstance(value, (int, numpy.integer)):
        return repr(int(value))
    if isinstance(value, (float, numpy.floating)):
        return repr(float(value))
    if isinstance(value, (complex, numpy.complexfloating)):
        return repr(complex(value))
    if isinstance(value, numpy.dtype):
        return value.name
    if isinstance(value, type):
        if issubclass(value, (numpy.generic, bool, int, float, complex)):
            return numpy.dtype(value).name  # float64 and numpy.float64 alike
        return f"{value.__module__}.{value.__qualname__}"
    if backend.is_array(value):
        return _array_text(value)
    if isinstance(value, Described):
        own = getattr(value, "_describe", None)  # operators: compositions describe themselves by their parts
        return own() if callable(own) else description_of(value)
    if isinstance(value, MPI.Comm):
        if value == MPI.COMM_NULL:
            return "a freed communicator"
        size = value.Get_size()
        return f"{value.Get_name() or 'communicator'} ({size} rank{'s' if size != 1 else ''})"
    if hasattr(value, "npolar") and hasattr(value, "nazimuth") and hasattr(value, "cart"):
        return f"ProcessGrid({value.npolar} x {value.nazimuth}, {getattr(value, 'order', '')})"
    if isinstance(value, (list, tuple)):
        if len(value) > _LONG:
            try:
                as_array = numpy.asarray(value)
            except (ValueError, TypeError):
                as_array = None
            if as_array is not None and as_array.dtype.kind in "biufc":
                return f"{type(value).__name__} of {_array_text(as_array)}"
            return f"{type(value).__name__} of {len(value)} items, {_hash_bytes(repr(value).encode())}"
        inner = ", ".join(describe_value(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{describe_value(k)}: {describe_value(v)}"
                               for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(value, slice) or (type(value).__module__.startswith("mpisphere") and
                                    type(value).__repr__ is not object.__repr__):
        return repr(value)  # value-like objects of ours (Layout) and slices: no addresses in their repr
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return f"a {type(value).__qualname__}"  # anything else is compared by its type only


class Described:
    """An object whose description (what ranks compare) is derived from its constructor arguments.

    Every subclass's ``__init__`` records the arguments it was called with
    (defaults filled in) before it runs; :func:`description_of` renders them
    as ``Class(name=value, ...)``. A subclass names the arguments that
    legitimately differ between ranks in ``_per_rank``; nothing else is ever
    left out, so a parameter cannot be forgotten.
    """

    _per_rank = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_records_arguments", False):
            return
        signature = inspect.signature(init)

        @functools.wraps(init)
        def recording(self, *args, **kw):
            if "_built_with" not in self.__dict__:  # the outermost constructor records (the class the user named)
                try:
                    bound = signature.bind(self, *args, **kw)
                    bound.apply_defaults()
                    arguments = dict(bound.arguments)
                    arguments.pop(next(iter(signature.parameters)))
                except TypeError:
                    arguments = None  # the constructor itself will raise the TypeError
                self.__dict__["_built_with"] = arguments
            init(self, *args, **kw)

        recording._records_arguments = True
        cls.__init__ = recording


def description_of(obj):
    """``Class(name=value, ...)`` of a :class:`Described` object, from every argument it was built with.

    Computed once per object (arrays are hashed at the first use).
    """
    cached = obj.__dict__.get("_description")
    if cached is not None:
        return cached
    arguments = obj.__dict__.get("_built_with")
    name = getattr(obj, "name", None)
    name = name if isinstance(name, str) else type(obj).__name__
    if arguments is None:
        text = f"{name}(...)"
    else:
        per_rank = set(type(obj)._per_rank)
        text = f"{name}(" + ", ".join(f"{key}={describe_value(value, key in per_rank)}"
                                      for key, value in arguments.items()) + ")"
    obj.__dict__["_description"] = text
    return text


# --- digests -------------------------------------------------------------------------------------------

_MASK = (1 << 62) - 1


def digest(text):
    """A 62-bit digest of ``text`` (its negation fits an int64, so one MAX reduction compares digests)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & _MASK


def call_description(description):
    """``description`` with the switches in force, which must match across ranks too (never the thread)."""
    return f"{description}{'; force_staging' if config.force_staging else ''}{'; debug' if config.debug else ''}"


# --- messages ------------------------------------------------------------------------------------------

def differences(texts, ranks=None):
    """A message naming who has what, when ``texts`` (one per rank) are not all equal; ``""`` otherwise.

    The largest group is named first, so with more than two ranks the odd
    one out is the rank named alone.
    """
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


_KINDS = {"TypeError": TypeError, "RuntimeError": RuntimeError, "MemoryError": MemoryError}


def as_exception(who, errors):
    """One exception from ``(rank, size, kind name, text)`` findings (the same on every rank).

    Ranks with the same finding are named together (``ranks 0-5 of 6: ...``);
    the first four different findings are quoted. The class is the findings'
    own when they share one (TypeError, RuntimeError, MemoryError), else
    ValueError.
    """
    kinds = {kind for _, _, kind, _ in errors}
    cls = _KINDS.get(next(iter(kinds)), ValueError) if len(kinds) == 1 else ValueError
    size = errors[0][1]
    groups = {}
    for r, _, _, text in errors:
        groups.setdefault(text, []).append(r)
    items = list(groups.items())
    shown = " | ".join(f"{_ranks(ranks)} of {size}: {text}" for text, ranks in items[:4])
    rest = sum(len(ranks) for _, ranks in items[4:])
    more = f" | and {rest} more rank{'s' if rest > 1 else ''}" if rest else ""
    return cls(f"{who}: {shown}{more}")


# --- over a communicator -------------------------------------------------------------------------------

def _group_id(comm, space):
    """The space rank of ``comm``'s rank 0: the same on every member of ``comm``, different between groups."""
    if comm is space:
        return 0
    return int(MPI.Group.Translate_ranks(comm.Get_group(), [0], space.Get_group())[0])


def agree(comm, who, error, description, spec=None, signature=""):
    """The agreement step over ``comm``: collective; raises the same error on every rank, or returns.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks about to communicate.
    who : str
        ``"Operator.direction"``, the start of every message.
    error : InputError or None
        This rank's local finding (bad input, a failed allocation, a refused
        call).
    description : str or list of (comm or None, str)
        What this rank is about to do, in words that are the same on every
        rank that does the same thing (no rank numbers, split axes masked).
        A composition gives one part per operator with the communicator the
        part must agree over: a part on ``comm`` itself must match on every
        rank, a part on a sub-communicator (``grid.polar`` inside a grid)
        only within its row or column, a part on ``None`` nowhere.
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
    The findings' own class (TypeError, ValueError, RuntimeError, MemoryError)
        On every rank, when any rank had a finding or the descriptions differ.
    """
    size = comm.Get_size()
    parts = [(comm, description)] if isinstance(description, str) else list(description)
    on_comm = " | ".join(text for c, text in parts if c is comm)
    kind = "" if spec is None else f" [{spec.dtype.name} on {'device' if spec.device else 'host'}]"
    here = call_description(f"{signature}: {on_comm}" if on_comm else f"{signature}{kind}")
    device = spec is not None and spec.device
    if size == 1 or not config.agreement:
        if error is not None:
            raise as_exception(who, [(comm.Get_rank(), size, error.kind.__name__, error.text)])
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
        raise as_exception(who, errors)
    problems = differences([d for _, d, _ in everyone])
    if not problems:  # the ranks agree here: find the groups of a sub-communicator that do not
        for index in range(len(everyone[0][2])):
            group_of = {}
            for r, (_, _, subparts) in enumerate(everyone):
                where, text = subparts[index]
                if where is not None:
                    group_of.setdefault(where, {})[r] = text
            for (name, _), members in group_of.items():
                found = differences([members[r] for r in sorted(members)], sorted(members))
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


def raise_everywhere(comm, who, error):
    """The agreement of a call that will not run on this rank: the others raise ``error``'s finding too.

    Used for a call refused on this rank (another thread held the grid):
    collective over ``comm``, it always ends in the exception, which the
    caller may drop (the refusing rank has already raised its own).
    """
    agree(comm, who, error, "(refused)", signature="(refused)")


def agree_construction(obj, comm, who=None, error=None):
    """Collective over ``comm``: every rank built ``obj`` from the same arguments, or all raise.

    For objects whose parameters decide who talks to whom (a halo's widths
    and poles, the points of an interpolation) or what a model computes (a
    time step, a radius): agreed once, when they are built, whatever
    ``mpisphere.config.agreement`` says. The message names the ranks and
    their arguments (the largest group first, so the odd rank out is named
    alone).

    Raises
    ------
    ValueError
        On every rank, when the descriptions differ; ``error``'s kind when
        some rank passes a finding of its own.
    """
    who = who or (getattr(obj, "name", None) if isinstance(getattr(obj, "name", None), str)
                  else type(obj).__name__)
    text = description_of(obj)
    size = comm.Get_size()
    if size == 1:
        if error is not None:
            raise as_exception(who, [(0, 1, error.kind.__name__, error.text)])
        return
    code = digest(text)
    flags = numpy.array([0 if error is None else 1, code, -code], dtype=numpy.int64)
    collectives.allreduce_max_ints(comm, flags)
    if flags[0] == 0 and flags[1] == -flags[2]:
        return
    everyone = collectives.allgather_object(comm, (None if error is None else (error.kind.__name__, error.text),
                                                   text))
    errors = [(r, size, e[0], e[1]) for r, (e, _) in enumerate(everyone) if e is not None]
    if errors:
        raise as_exception(who, errors)
    raise ValueError(f"{who}: the {size} ranks built it from different arguments (build it the same way on every "
                     f"rank): {differences([t for _, t in everyone])}")


# --- with the neighbours --------------------------------------------------------------------------------

HEADER = 8  # int64 words in front of the data of every message of a neighbour round
HEADER_BYTES = 8 * HEADER
_MAGIC = 0x6D7368616C6F  # "mshalo": a neighbour round's message, not something else that happened to arrive
_OWN_ERROR, _POISONED = 1, 2
DETAILS_TAG = 0x6D74  # the full descriptions of a failed round, exchanged between the pairs that did not fit


def message_buffer(like, shape, dtype):
    """A flat byte buffer for one message of a round, and the view of its data as an array of ``shape``.

    The first :data:`HEADER_BYTES` bytes hold the header; the data follows
    (aligned for any dtype). In ``like``'s array module and device.
    """
    dtype = numpy.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    xp = backend.array_module(like)
    with backend.device_of(like):
        message = xp.empty(HEADER_BYTES + nbytes, numpy.uint8)
    return message, message[HEADER_BYTES:].view(dtype).reshape(shape)


class NeighbourRound:
    """One call's messages with its grid neighbours, each message its header followed by its data.

    The header (eight int64 words in front of the data) carries this rank's
    verdict on its own input, whether the data it sends is incomplete
    (``poisoned``), a digest of the call (operator, parameters, direction,
    batch shape, dtype, switches), the tile's height and width, the number of
    data bytes, the order of the call's phases and which optional messages
    it sends. A receiver probes for a message, learns its size, and receives
    it whole: into the caller's buffer when the size is the expected one,
    into a drain buffer otherwise; then it reads the header and uses the data
    only when the header fits (same digest, tiles that fit together). A
    mismatch therefore never truncates a message or leaves one behind for
    the next call, and agreeing costs no message of its own.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator of the messages (``grid.cart``).
    who : str
        The call, for messages.
    description : str
        The call, as the neighbours must see it (its digest travels).
    tile : (int, int)
        This rank's tile, for the neighbours' fit checks.
    error : InputError or None
        This rank's own finding: the round then sends every header at once,
        without data, and drops what arrives, so no neighbour waits.
    expected : list of (source, tag)
        Every message this call receives. The sender of a message with tag
        ``t`` to rank ``d`` must appear in ``d``'s list as ``(sender, t)``:
        the halo uses the same neighbours and tags in every call, whatever
        its widths, so any two halo calls on neighbouring ranks exchange the
        same messages and every mismatch is seen.
    fits : callable ``(header, source, tag) -> str or None``
        Why a neighbour's header cannot be used here (tiles that do not fit),
        or ``None``. Must be symmetric between the two ranks of a pair.
    order : int
        Which phase comes first (the gathering and the accumulating
        directions of a halo run their phases in opposite orders).
    staged : bool
        Move device data through host buffers.
    pattern : int
        Bits naming the optional messages this call sends (a halo without
        extents sends records first); it travels in every header.
    optional : dict of (source, tag) -> bit
        The messages a neighbour sends only when its ``pattern`` has that
        bit. One that this call expects but the neighbour does not send is
        not waited for; one it sends but this call does not expect is
        received and dropped, so two calls of different patterns still match
        every message.

    Notes
    -----
    A phase (:meth:`collect`) waits for its own messages, receiving and
    checking the messages of later phases that arrive meanwhile. A problem
    with a message of a phase makes the data this rank sends in later
    phases incomplete: those headers say so (``poisoned``) and carry no
    data, and the neighbours that needed it raise too, so the ranks that
    raise are exactly the ones whose result would have used wrong data (the
    3 x 3 block around a mistake). A message whose phases run in the other
    order (a neighbour in the adjoint while this rank is in the forward)
    could otherwise leave a cycle of ranks each waiting for the next one's
    first phase: the rank then sends all its remaining headers at once,
    which breaks the cycle. Problems are raised by the caller after
    :meth:`finish`.
    """

    def __init__(self, comm, who, description, tile, error, expected, fits, order=0, staged=False,
                 workspace=None, pattern=0, optional=None):
        self.comm, self.who, self.fits = comm, who, fits
        self.description = description
        self.error = error
        self.code = digest(description)
        self.tile = (int(tile[0]), int(tile[1]))
        self.order = int(order)
        # messages that only some calls send: {(source, tag): bit of ``pattern``}; the source's headers say which
        self.pattern, self.optional = int(pattern), optional or {}
        self.staged = staged
        self.workspace = workspace if workspace is not None else backend.Workspace()
        self.problems = []          # ((source, tag), text) of the messages this rank cannot use
        self.mismatched = set()     # sources whose own records did not fit with this rank's (for details)
        self.poisoned = error is not None  # the data this rank would send next is not complete
        self._flush = error is not None    # send everything at once: waiting could close a cycle
        self._pending = list(expected)     # messages not received yet
        self._received = set()
        self._targets = {}                 # key -> the caller's message buffer (None: a header alone)
        self._usable = {}                  # key -> whether the message arrived and fits (its data may be used)
        self._other_call = set()           # keys whose sender makes another call (another digest)
        self._patterns_seen = set()
        self._sent = set()
        self._sends = []
        self._status = collectives.status()

    # --- sending -----------------------------------------------------------------------------------

    def _header(self, nbytes):
        flags = (_OWN_ERROR if self.error is not None else 0) | (_POISONED if self.poisoned else 0)
        return numpy.array([_MAGIC, flags, self.code, self.tile[0], self.tile[1], nbytes, self.order, self.pattern],
                           numpy.int64)

    def send(self, dest, tag, message):
        """Send ``message`` (a buffer from :func:`message_buffer`, or ``None``) to ``dest`` with ``tag``.

        The round writes the header into its first bytes. A poisoned round,
        or ``None``, sends the header alone.
        """
        if (dest, tag) in self._sent:
            raise RuntimeError(f"{self.who}: two messages to rank {dest} with tag {tag} in one round")
        self._sent.add((dest, tag))
        if self.poisoned or message is None:
            out = self._header(0).view(numpy.uint8)
        else:
            header = self._header(int(message.size) - HEADER_BYTES).view(numpy.uint8)
            if self.staged and (backend.is_device_array(message) or isinstance(message, numpy.ndarray)):
                out = self.workspace.host(f"nr-send-{dest}-{tag}", message.size, numpy.uint8,
                                          backend.is_device_array(message))
                backend.copy_to_host(message, out)
                out[:HEADER_BYTES] = header
            elif backend.is_device_array(message):
                message[:HEADER_BYTES] = backend.array_module(message).asarray(header)
                out = message
            else:
                message[:HEADER_BYTES] = header
                out = message
        self._sends.append((collectives.isend_bytes(self.comm, out, dest, tag), out))

    # --- receiving --------------------------------------------------------------------------------------

    def expect(self, key, message):
        """Where message ``key`` lands when its size is the expected one: a :func:`message_buffer`, or ``None``."""
        self._targets[key] = message

    def _receive(self, key, probed, nbytes):
        """Receive the probed message ``key`` whole, check its header; its data is used only if it fits."""
        source, tag = key
        target = self._targets.get(key)
        fitting = target is not None and nbytes == int(target.size) and not self._flush and self.error is None
        if fitting and not (self.staged or backend.is_device_array(target)):
            landing = target
        elif fitting and not self.staged:  # a device buffer, CUDA-aware
            landing = target
        elif fitting:
            landing = self.workspace.host(f"nr-recv-{source}-{tag}", nbytes, numpy.uint8,
                                          backend.is_device_array(target))
        else:  # drain it: every byte sent is received in this call
            landing = self.workspace.scratch(f"nr-drain-{source}-{tag}", numpy.empty(0, numpy.uint8),
                                             max(nbytes, 1), numpy.uint8)
        if landing is target:
            staging.prepare(target)
        collectives.mrecv_bytes(probed, landing, nbytes)
        if nbytes < HEADER_BYTES:
            header = numpy.zeros(HEADER, numpy.int64)
        elif backend.is_device_array(landing):
            header = backend.array_module(landing).asnumpy(landing[:HEADER_BYTES]).view(numpy.int64)
        else:
            header = numpy.array(landing[:HEADER_BYTES]).view(numpy.int64)
        self._pending.remove(key)
        self._received.add(key)
        self._on_header(key, header, nbytes)
        if fitting and self._usable[key] and landing is not target:
            backend.copy_from_host(landing, target)

    def _on_header(self, key, header, nbytes):
        """Check a neighbour's header."""
        source, tag = key
        problem = None
        if header[0] != _MAGIC:
            problem = "sent a message that is not a halo exchange's"
            self._flush = True
        elif header[1] & _OWN_ERROR:
            problem = "has an input it cannot use"
            self.mismatched.add(source)
        elif self.error is not None:
            self.mismatched.add(source)
        elif header[2] != self.code:
            problem = "is not making the same call (another operator, parameters, direction, batch shape or dtype)"
            self.mismatched.add(source)
            self._other_call.add(key)
        else:
            problem = self.fits(header, source, tag)  # before the poisoned flag: both sides of a pair see it
            if problem is not None:
                self.mismatched.add(source)
            elif header[1] & _POISONED:
                problem = "could not complete its own exchange (a mistake in its neighbourhood)"
            else:
                target = self._targets.get(key)
                expected = HEADER_BYTES if target is None else int(target.size)
                if nbytes != expected:
                    problem = f"sent {nbytes - HEADER_BYTES} bytes where {expected - HEADER_BYTES} were expected"
        if header[0] == _MAGIC and header[6] != self.order:
            self._flush = True
        if header[0] == _MAGIC and source not in self._patterns_seen:
            self._patterns_seen.add(source)
            self._match_pattern(source, int(header[7]))
        self._usable[key] = problem is None
        if problem is not None:
            self.problems.append((key, problem))

    def _match_pattern(self, source, theirs):
        """Match the optional messages ``source`` sends (its ``pattern``) with the ones this rank expects."""
        for key, bit in self.optional.items():
            if key[0] != source:
                continue
            sends = bool(theirs & bit)
            if key in self._pending and not sends:  # never coming: a problem, not a wait
                self._pending.remove(key)
                self._usable[key] = False
                self.problems.append((key, "is not making the same call (its messages differ)"))
            elif not sends or key in self._received or key in self._pending:
                continue
            else:  # sent but not expected here: received and dropped in this call
                self._pending.append(key)

    def _poll(self, wanted):
        """Receive messages (any that is pending) until every key in ``wanted`` has arrived or the round flushes."""
        while self._pending and any(k in self._pending for k in wanted) and not self._flush:
            if not self._sweep():
                return

    def _sweep(self):
        """Probe every pending message once and receive those that are there; False once the round flushes.

        A sweep that finds nothing yields the core: on oversubscribed nodes
        the neighbour we wait for may be waiting for this core.
        """
        found = False
        for key in list(self._pending):
            probed, nbytes = collectives.improbe_bytes(self.comm, key[0], key[1], self._status)
            if probed is not None:
                found = True
                self._receive(key, probed, nbytes)
                if self._flush:
                    return False
        if not found:
            os.sched_yield()
        return True

    def collect(self, keys, records=False):
        """Wait for the messages ``keys`` of one phase; ``{key: data}`` of those whose data may be used.

        Messages of later phases that arrive meanwhile are received and
        checked too. When a message of this phase cannot be used, or the
        round must flush, returns ``{}`` and poisons the round: the caller
        skips its work and calls :meth:`finish`. ``records``: a phase of
        headers alone, sent ahead of the data to check that the tiles fit
        together; a neighbour making another call poisons nothing there (its
        data messages will say so again, to the ranks that need them), a
        neighbour whose tile does not fit poisons the round.
        """
        self._poll(keys)
        if self._flush or not all(self._usable.get(k, False) or (records and k in self._other_call) for k in keys):
            self.poisoned = True
            return {}
        return {k: self._targets[k] for k in keys if self._targets.get(k) is not None}

    def finish(self, remaining):
        """Send the headers of ``remaining`` ``(dest, tag)`` not sent yet (no data), receive the rest, wait.

        Every rank calls it once, whatever happened, so that every message
        of the call is matched in the call. Returns the problems (a list of
        ``((source, tag), text)``), or ``None`` when there were none and this
        rank had no finding of its own.
        """
        if self.problems:
            self.poisoned = True
        for dest, tag in remaining:
            if (dest, tag) not in self._sent:
                self.send(dest, tag, None)
        self._flush = True  # everything left is received and dropped
        while self._pending:
            self._sweep()
        collectives.waitall([r for r, _ in self._sends])
        self._sends.clear()
        if self.error is None and not self.problems:
            return None
        return self.problems

    def details(self):
        """``{rank: (error text or None, description)}`` of the neighbours whose records did not fit with this one.

        Both ranks of such a pair call it (the reasons are symmetric), so the
        extra messages always match; ranks poisoned only from farther away
        exchange nothing more.
        """
        mine = (None if self.error is None else self.error.text, self.description)
        return collectives.exchange_objects(self.comm, sorted(self.mismatched), mine, DETAILS_TAG)


# --- threads ----------------------------------------------------------------------------------------------

REFUSED = ("refused: another thread was running an mpisphere operation on the same grid (or operator); MPI "
           "matches one communicator's messages in call order, so two threads on one grid would mix theirs. Give "
           "each thread its own grid (grid.dup()), or make the calls one after the other in the same order on every "
           "rank")

class CallGuard:
    """The lock of one grid: held while a call communicates on any of its communicators.

    MPI matches a communicator's messages in call order, so two threads
    that call at once on one grid would mix theirs. :meth:`enter` takes the
    guard (re-entrant for the thread that holds it) or, when another thread
    holds it, registers ``refusal`` and returns ``False``: the caller raises
    on its rank, and the holding thread runs ``refusal`` (the refused call's
    agreement, with an error) when it leaves, so the ranks that did make
    that call raise too instead of waiting for this one.
    """

    __slots__ = ("_state", "_owner", "_depth", "_refused")

    def __init__(self):
        self._state = threading.Lock()
        self._owner = None
        self._depth = 0
        self._refused = []

    def enter(self, refusal=None):
        me = threading.get_ident()
        with self._state:
            if self._owner is None or self._owner == me:
                self._owner = me
                self._depth += 1
                return True
            if refusal is not None:
                self._refused.append(refusal)
            return False

    def leave(self):
        while True:
            with self._state:
                if self._depth > 1 or not self._refused:
                    self._depth -= 1
                    if self._depth == 0:
                        self._owner = None
                    return
                refusal = self._refused.pop(0)
            try:
                refusal()
            except Exception:  # noqa: BLE001 -- the refused call has raised on its own rank already
                pass

    @property
    def held(self):
        """True while some thread holds the guard."""
        return self._owner is not None
