"""One protocol for a collective call outside the operators: validate locally, allocate, agree, communicate, settle.

:class:`~mpisphere.LinearOperator` runs these steps for every operator
(``_apply``). The other collective entry points (a grid's scatter and
gather, a store's reads and writes, checkpoints, a model's steps, saves and
histories, the bridges) run them through a ``Call``::

    call = Call(grid.cart, "FieldStore.write_tiles('u')")
    with call.local():                 # this rank's checks and allocations
        host = check(tile)              # an exception here is this rank's finding, not raised yet
    call.agree(name=name, shape=...)    # every finding, or differing values, raised on every rank
    ...                                 # communicate: every rank is here
    with call.local("cannot write 'u'"):
        write(...)                      # a step that may fail on some ranks (a file)
    call.agree()                        # settle: every rank raises what any rank met
    offset = call.root(prepare, "cannot create 'u'")   # rank 0's result everywhere, or its failure

What the ranks must agree on is given by value (``canonical``: dict
keys sorted, arrays as lists, floats exactly), so equal values in another
key order agree and different values never do. ``collective`` marks a
public method that runs such a call and holds its grid's guard while it
does; ``tests/test_architecture.py`` refuses a public method of a
communicating class without it, and an agreement written by hand.
"""

import contextlib
import functools
import json
import math

import numpy

from .. import collectives
from ..validation import is_process_grid
from .collective import settle
from .spec import InputError

__all__ = ["Call", "canonical", "collective", "finding"]


def finding(exc, what=None):
    """An exception met on this rank as an :class:`InputError` (the exception class the callers will see).

    An :class:`InputError` is kept as it is (its text says what). A failure
    of a step (``what`` says which: "cannot write 'u'") keeps TypeError,
    MemoryError and OSError (with its file errors) and is a ValueError
    otherwise, its text naming the exception; a failed check (no ``what``)
    keeps TypeError, ValueError, MemoryError, ImportError and OSError and is
    a RuntimeError otherwise.
    """
    if isinstance(exc, InputError):
        return exc
    if what is not None:
        kind = type(exc) if isinstance(exc, (OSError, TypeError, MemoryError)) else ValueError
        return InputError(f"{what}: {type(exc).__name__}: {exc}", kind)
    keeps = isinstance(exc, (OSError, TypeError, ValueError, MemoryError, ImportError))
    return InputError(str(exc) if keeps else f"{type(exc).__name__}: {exc}", type(exc) if keeps else RuntimeError)


def _plain(value):
    """``value`` as JSON-able data, exactly: dicts, lists, strings, ints, floats (by their exact text)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, numpy.ndarray):
        return {"array": _plain(value.tolist()), "dtype": value.dtype.str}
    if isinstance(value, (bool, numpy.bool_)):
        return bool(value)
    if isinstance(value, (int, numpy.integer)):
        return int(value)
    if isinstance(value, (float, numpy.floating)):
        value = float(value)
        return value.hex() if math.isfinite(value) else repr(value)  # exact, and NaN equal to NaN
    if isinstance(value, numpy.dtype):
        return value.str
    if value is None or isinstance(value, str):
        return value
    return f"{type(value).__name__}:{value!r}"


def canonical(value):
    """The text the ranks compare for ``value``: the same for equal values whatever the dict key order."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))


class Call:
    """The steps of one collective call over ``comm``; ``who`` names it in every message.

    A finding met in :meth:`local` is kept, not raised: the next
    :meth:`agree` raises it on every rank (with the rank that met it), so no
    rank leaves a step the others wait in. After a finding, later
    :meth:`local` blocks of the same step still run (their own findings are
    kept only if there was none yet); use :meth:`run` for a step that must
    not start after one.
    """

    __slots__ = ("comm", "who", "error")

    def __init__(self, comm, who):
        self.comm, self.who = comm, who
        self.error = None

    @contextlib.contextmanager
    def local(self, what=None):
        """Run the block as this rank's own work: an exception in it becomes this rank's finding."""
        try:
            yield self
        except Exception as exc:  # noqa: BLE001 -- every failure is a finding, raised on every rank by agree()
            if self.error is None:
                self.error = finding(exc, what)

    def run(self, fn, *args, what=None):
        """``fn(*args)`` as this rank's own work, or nothing after a finding; returns its result (or None)."""
        if self.error is not None:
            return None
        with self.local(what):
            return fn(*args)
        return None

    def fail(self, text, kind=ValueError):
        """Record a finding of this rank (the first one is kept)."""
        if self.error is None:
            self.error = InputError(text, kind)

    def agree(self, description=None, mismatch="disagree on what they are about to do", **values):
        """Collective: raise every rank's finding on every rank, or differing ``values``; else go on.

        ``values`` (or ``description``) is what every rank must hold alike,
        compared by value (``canonical``). The finding is cleared: the
        call goes on to its next step.
        """
        text = description if description is not None else (canonical(values) if values else "")
        error, self.error = self.error, None
        settle(self.comm, self.who, error, text, mismatch=mismatch)

    def root(self, fn, what=None, root=0):
        """``fn()`` on ``root``, its result on every rank, its failure raised on every rank. Collective."""
        value = None
        if self.comm.Get_rank() == root:
            value = self.run(fn, what=what)
        self.agree()
        return collectives.bcast_object(self.comm, value, root=root)

    def share(self, value, root=0):
        """``root``'s ``value`` on every rank (after an agreement: every rank is here). Collective."""
        return collectives.bcast_object(self.comm, value, root=root)


def collective(method):
    """Mark a public method as a collective call (the architecture's rule) and hold its grid's guard while it runs.

    The object has ``grid`` (a :class:`~mpisphere.ProcessGrid`) or is
    one; a second thread's call on the same grid is refused on every rank.
    """
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        grid = self if is_process_grid(self) else self.grid
        with grid.holding(f"{type(self).__name__}.{method.__name__}"):
            return method(self, *args, **kwargs)
    call.mpisphere_collective = True
    return call
