"""What the ranks compare before they communicate, and how: every strategy of the agreement in one place.

A mistake seen on one rank (a shape, a dtype, a parameter, a failed
allocation, another operator altogether) must raise the same error on
every rank that would have communicated with it, and never leave a rank
waiting. This module holds everything that decides it:

Descriptions
    What a rank compares is derived from how an object was built, never
    written by hand: :class:`~mpisphere.Described` records every constructor argument
    of its subclasses (defaults filled in) and ``description_of``
    renders them, numbers by value, arrays by a hash of their bytes (equal
    NaNs compare equal), grids and communicators by their shape and name,
    other described objects by their own description. Arguments that
    legitimately differ between ranks (a rank's own block of weights) are
    named in the class attribute ``_per_rank`` and described by their kind
    and number of axes only.

Four strategies
    * ``agree``, over a communicator, before every call of an operator
      that communicates on it: one ``Allreduce`` (MAX) of six integers (an
      error flag, two digests and their negations, the CUDA-aware flag);
      the full descriptions are exchanged only when something differs,
      then every rank raises the same error, whose first line names what
      differs (``nlat: ranks 0-2 64, rank 3 65``) or the call each rank is
      in, then the fix, then each rank's description.
    * with the neighbours of a grid, for halo exchanges: the record travels
      in front of the data (a header before every message), so agreeing costs
      no extra round trip (``mpisphere.halo.round.NeighbourRound``, which
      lives with the halo, its one user, and builds on this package's digest,
      stall watch and failure notes).
    * :func:`~mpisphere.agree_construction`, once, when an object whose parameters
      decide who talks to whom (a halo's widths and poles, the points of an
      interpolation, a model's time step) is built: collective over the
      object's communicator.
    * ``settle``, after a step whose outcome may differ between ranks
      (a file written or read): one ``Allreduce`` of an error flag, always.

One protocol
    Every collective call outside the operators runs as a ``Call``:
    validate locally, allocate, agree (by value: ``canonical``),
    communicate, settle; :func:`collective` marks such a public method and
    holds its grid's guard. The operators' ``_apply`` runs the same steps.

Stalls
    A rank that never arrives in a call leaves the others waiting in its
    agreement: :mod:`.stall` reports who waits where and who is missing, and
    aborts the job at an optional deadline.

Threads
    ``CallGuard`` is the one lock of a grid. A call that finds the
    grid busy with another thread raises on its rank at once, and the
    thread that holds the grid runs the refused call's agreement with an
    error when it finishes, so every other rank raises for that call too and
    every rank's sequence of calls stays the same. The thread's identity is
    never part of what is compared.

Only :mod:`mpisphere.collectives` is used to talk to MPI. The package's
modules: :mod:`.spec`, :mod:`.description`, :mod:`.differing` (what
differs between the ranks' descriptions, named field by field), :mod:`.stall`,
:mod:`.collective` (over a communicator), :mod:`mpisphere.agreement.call` (the protocol),
:mod:`.failures` (notes of a failure near a mistake), :mod:`.guard` (threads).
"""

from .call import Call, canonical, collective, finding
from .collective import agree, agree_construction, as_exception, cause_first, raise_everywhere, settle
from .description import Described, call_description, describe_value, description_of, digest
from .guard import REFUSED, CallGuard, guarded
from .spec import Context, InputError, Spec

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
    "settle",
    "Call",
    "canonical",
    "collective",
    "finding",
    "CallGuard",
    "REFUSED",
    "guarded",
    "as_exception",
    "cause_first",
]
