"""What the communication operators share: one communicator, its checks, the axis and dtype checks of their input."""


from mpi4py import MPI

from . import backend, dtypes
from .operators import Abilities, InputError, LinearOperator
from .validation import check_int, is_process_grid

__all__ = ["CommunicatorOperator", "along", "check_axis", "check_moved_dtype"]


def along(axis, index):
    """Index tuple selecting ``index`` (a slice) along ``axis``."""
    return (slice(None),) * axis + (index,)


def check_moved_dtype(spec):
    problem = dtypes.refusal(spec.dtype, "moved")
    if problem:
        raise InputError(problem, TypeError)


def check_axis(spec, axis):
    ndim = len(spec.shape)
    if not -ndim <= axis < ndim:
        raise InputError(f"axis {axis} is out of range for an array of shape {spec.shape}")
    return axis % ndim


class CommunicatorOperator(LinearOperator):
    """Shared set-up of the operators that run on one communicator."""

    def __init__(self, comm):
        if is_process_grid(comm):
            raise TypeError(f"{self.name}: comm must be an mpi4py Intracomm, got a {type(comm).__name__}; pass one of "
                            "its communicators: grid.polar, grid.azimuth or grid.cart")
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"{self.name}: comm must be an mpi4py Intracomm (e.g. grid.polar), "
                            f"got {type(comm).__name__}")
        if comm == MPI.COMM_NULL:
            raise ValueError(f"{self.name}: comm is MPI.COMM_NULL (a freed communicator?)")
        self.comm = comm
        self._comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self._workspace = backend.Workspace()

    def abilities(self, direction):
        # on a one-rank communicator every communication operator maps its input to itself
        return Abilities(identity=self.size == 1)

    def _extent(self, extent, what="extent"):
        extent = check_int(extent, what, self.name)
        if extent < self.size:
            raise ValueError(f"{self.name}: {what}={extent} is smaller than the communicator size "
                             f"{self.size}; every rank needs at least one entry")
        return extent
