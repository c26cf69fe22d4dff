"""What a call is about: its input (``Spec``), a rank's finding (``InputError``), the agreed context."""

import collections

import numpy

from .. import backend, cuda_aware
from ..settings import config


class Spec(collections.namedtuple("Spec", "shape dtype device")):
    """An array without its data: ``shape`` (tuple), ``dtype`` (numpy.dtype), ``device`` (bool: CuPy)."""

    __slots__ = ()

    @classmethod
    def of(cls, a, what="input"):
        """The spec of array ``a``; an ``InputError`` (TypeError) for anything else."""
        if not backend.is_array(a):
            # a bridge hands its refusal over as such an object, so that the operator raises it on every rank
            raise InputError(getattr(a, "mpisphere_refusal", None) or
                             f"the {what} must be a NumPy or CuPy array, got {type(a).__name__}", TypeError)
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
    (expected and got); the caller adds who and which rank. The text's first
    line is the cause, the same words on every rank with the same mistake
    (the ranks are grouped by it); the lines after it say what to do
    (``  fix: ...``) and give this rank's details (``  rank 3: ...``), and
    are shown after every rank's cause.
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
