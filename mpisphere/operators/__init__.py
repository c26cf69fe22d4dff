"""Linear operators with hand-written adjoints, their layouts, the agreement step, and the dot test.

The package's modules: :mod:`.layout` (layouts, directions, ``out=``),
:mod:`.abilities` (what a stage declares to a pipeline), :mod:`.base`
(the operator type, its call, adjoint and algebra), :mod:`.elementary`
(``Identity``, ``Diagonal``) and :mod:`.dottest` (inner products, the dot
test).

An operator is a fixed linear map ``A`` between arrays. ``A.forward(x)``
applies it, ``A.adjoint(y)`` applies its adjoint ``A^H``, ``A.H`` is the
adjoint as an operator; ``A @ B`` composes, ``A + B``, ``A - B`` and
``a * A`` combine. Inputs are never modified and outputs never overlap
inputs; ``out=`` writes into a caller's array instead of allocating one.

Each side of an operator has a :class:`~mpisphere.Layout`: ``distributed`` (every rank
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

An in-place halo call on an array its earlier calls planned (``_replay``,
:mod:`mpisphere.halo.planned`) skips the first two steps: its checks held
for the same array, and its headers still carry the agreement, compared
whole as they arrive.

A composition agrees once for all its parts: over their communicator when
they all use one (so a composition and its parts called one after the other
meet in the same step), else over the space they share. Its local parts
(diagonals, scalings) are part of what is compared. ``mpisphere.config.debug``
compares the full descriptions on every call (no digest);
``mpisphere.config.agreement = False`` skips the step (for code proven to
match; it must then be off on every rank).
"""

from ..agreement import Context, InputError, Spec
from .abilities import Abilities
from .base import AdjointOperator, LinearOperator, domain_dtype
from .dottest import dottest, inner
from .elementary import Diagonal, Identity
from .layout import ADJOINT, DISTRIBUTED, FORWARD, REPLICATED, Layout, check_out
from .parametrised import ParametrisedOperator, parameter

__all__ = [
    "domain_dtype",
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
    "ParametrisedOperator",
    "parameter",
    "Identity",
    "Diagonal",
    "check_out",
    "inner",
    "dottest",
]
