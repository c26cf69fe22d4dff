"""Layouts (how each side of an operator is held across ranks), directions, and the ``out=`` check."""


import numpy
from mpi4py import MPI

from .. import backend
from ..agreement import InputError



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
