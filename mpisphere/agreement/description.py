"""Descriptions derived from how an object was built (:class:`Described`), and their digests."""

import functools
import hashlib
import inspect

import numpy
from mpi4py import MPI

from .. import backend
from ..settings import config
from ..validation import is_process_grid


_LONG = 8  # sequences longer than this are described by a hash of their content, not item by item


def _hash_bytes(data):
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _array_text(a):
    host = backend.to_host(a)
    host = numpy.ascontiguousarray(host)
    return f"array({tuple(host.shape)}, {host.dtype.name}, {_hash_bytes(host.tobytes())})"


def describe_parameter(value):
    """An array a call uses (weights set between calls) as a quoted value: ``'(2, 2, 2) float64 <hash>'``.

    Quoted, the description's reader (:mod:`~mpisphere.agreement.differing`)
    names it by the key it stands under (``weight: ranks 0-2 ..., rank 3
    ...``) instead of reading ``array(...)`` as a call.
    """
    if value is None:
        return "None"
    host = backend.to_host(value)
    host = numpy.ascontiguousarray(host)
    return f"'{tuple(host.shape)} {host.dtype.name} {_hash_bytes(host.tobytes())}'"


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
    if is_process_grid(value):
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
    (defaults filled in) before it runs; ``description_of`` renders them
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

    def _called_with(self):
        """The arguments recorded for this object so far, by name (a copy; empty if none)."""
        return dict(self.__dict__.get("_built_with") or {})

    def _arguments_are(self, **arguments):
        """Record ``arguments`` (by name) as the ones this object was built with, in place of the call's.

        For a constructor whose positional arguments come in several forms
        (a grid and extents, or a tiling): the ranks then compare the same
        names whichever form each used. Call it before the description is
        first used (the construction's agreement).
        """
        self.__dict__["_built_with"] = dict(arguments)


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
