"""The one place arguments are checked: integers, choices among names, dtypes for a role, a process grid.

Every constructor and function of mpisphere checks its plain arguments
through these functions, so the same mistake reads the same wherever
it is made: ``"<who>: <name> must be ..., got <value>"``, a ``TypeError``
for the wrong kind of value and a ``ValueError`` for a value out of range.
Which dtypes a role admits is :mod:`mpisphere.dtypes`' policy; arrays are
checked where an operator call describes them (``Spec.of``, one place too).

``tests/test_architecture.py`` refuses these messages written anywhere else,
and a test of "is this a ProcessGrid" written anywhere but
``is_process_grid`` (this module sits below :mod:`mpisphere.grid`, so it
asks for what a grid has instead of importing the class).
"""

import operator

import numpy

from . import dtypes

__all__ = ["check_int", "check_choice", "check_dtype", "is_process_grid", "check_process_grid"]

_GRID_PARTS = ("cart", "polar", "azimuth", "npolar", "nazimuth", "holding")


def _prefix(who):
    return f"{who}: " if who else ""


def check_int(value, name, who=None, minimum=None):
    """``value`` as an int, or a TypeError/ValueError naming ``name`` (and ``who`` first, when given).

    Extents, widths, ranks, axes and counts all pass through it; NumPy
    integers are accepted, floats and booleans-as-floats are not.
    """
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{_prefix(who)}{name} must be an integer, got {value!r}") from None
    if minimum is not None and value < minimum:
        bound = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise ValueError(f"{_prefix(who)}{name} must be {bound}, got {name}={value}")
    return value


def check_choice(value, choices, name, who=None, aliases=None):
    """``value`` if it is one of ``choices`` (or the name an alias stands for), else a ValueError listing them.

    Parameters
    ----------
    value : object
    choices : sequence of str
        The names accepted, in the order the message lists them.
    name : str
        The argument's name, for the message.
    who : str, optional
        The function or class, for the message.
    aliases : dict, optional
        Other spellings accepted, ``{alias: name}`` (compared in lower case).
    """
    if isinstance(value, str):
        if value in choices:
            return value
        key = value.lower()
        if aliases and key in aliases:
            return aliases[key]
    else:
        try:
            if value in choices:
                return value
        except TypeError:  # unhashable or uncomparable: not a choice
            pass
    raise ValueError(f"{_prefix(who)}{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_dtype(dtype, role, name="dtype", who=None):
    """``numpy.dtype(dtype)`` if ``role`` admits it (see :data:`mpisphere.dtypes.ROLES`), else a TypeError."""
    problem = dtypes.refusal(dtype, role)
    if problem is not None:
        raise TypeError(f"{_prefix(who)}{name}: {problem}")
    return numpy.dtype(dtype)


def is_process_grid(value):
    """Whether ``value`` is a :class:`~mpisphere.ProcessGrid`: its three communicators, its shape and its guard.

    The one test of it in the package (``tests/test_architecture.py`` refuses another).
    """
    return all(hasattr(value, part) for part in _GRID_PARTS)


def check_process_grid(value, name="grid", who=None):
    """``value`` if it is a ProcessGrid; else ``TypeError`` ("<who>: <name> must be a ProcessGrid, got ..."),
    with a hint where ``value`` is a communicator."""
    if not is_process_grid(value):
        hint = (" (a communicator; pass the ProcessGrid it belongs to, or build one: ProcessGrid(comm))"
                if hasattr(value, "Get_size") else "")
        raise TypeError(f"{_prefix(who)}{name} must be a ProcessGrid, got {type(value).__name__}{hint}")
    return value
