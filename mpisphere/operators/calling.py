"""The steps of every operator call: check, allocate, agree, run (``LinearOperator._apply`` calls them).

``checked_call`` runs one call of an operator: its input checked
against what it takes (``_output``, ``_check_values``), its result and
scratch allocated, then one agreement over its communicator (every rank's
finding raised on every rank), then the work, all under the grid's guard.
An in-place call planned by an earlier one (the halo's) is replayed without
checks. ``agreement_comm`` and ``agreement_parts`` say what a
combination of operators agrees on and over which communicator.
"""

from mpi4py import MPI

from .. import backend
from ..agreement import InputError, Spec
from .layout import FORWARD, check_out

__all__ = ["checked_call", "allocate", "agreement_comm", "agreement_parts"]


def checked_call(op, direction, x, out, label=None, runner=None, in_place=False, purpose=""):
    """``op``'s call in ``direction`` on ``x`` (``LinearOperator._apply``: its arguments described there)."""
    label = label or direction
    who = f"{op.name}.{label}"
    comm = op._comm
    replay = op._replay(direction, x) if in_place else None
    if replay is not None:  # a call planned in an earlier one on the same array: nothing to check or agree
        op._guarded(who, comm, lambda: op._refuse(comm, who, None, None, None), replay.run)
        return x
    op._layouts()
    if op._simple():
        return op._forward(x, out) if direction == FORWARD else op._adjoint(x, out)
    if comm is not None and comm == MPI.COMM_NULL:
        raise RuntimeError(f"{who}: the operator's communicator was freed (grid.free()); build the operator "
                           "on a live grid")
    error, spec, result, description = None, None, None, "(input not understood)"
    try:
        spec = Spec.of(x)
        result, description = (op._output_in_place if in_place else op._output)(direction, spec)
        op._check_values(direction, x)
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
                out = allocate(result, x)
            op._reserve(direction, x, out)
        except Exception as exc:  # noqa: BLE001 -- MemoryError, cupy's OutOfMemoryError, ...
            error = InputError.from_exception(exc, f"allocating the buffers of this call ({result.describe()})")
    signature = f"{op._describe()} {label}{purpose}"

    def call():
        context = op._agreement(comm, who, error, description, spec, signature)
        try:
            (runner or op._run)(direction, x, out, context)
        except InputError as exc:  # a finding is raised as the exception it names, never as itself
            raise exc.kind(f"{who}: {exc.text}") from None
        return out
    return op._guarded(who, comm, lambda: op._refuse(comm, who, description, spec, signature), call)


def allocate(spec, like):
    """An empty array of ``spec``'s shape and dtype in ``like``'s array module and on its device."""
    xp = backend.array_module(like)
    with backend.device_of(like):
        return xp.empty(spec.shape, dtype=spec.dtype)


def agreement_comm(ops):
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


def agreement_parts(op, direction, text, comm):
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
