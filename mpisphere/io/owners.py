"""The one all-to-all of a store's write or read: between the ranks' parts and the owners of the chunks.

A ``ChunkPlan`` says which piece of whose part
goes into which chunk; ``OwnerExchange`` holds the buffers of the
all-to-all that moves them, allocated up front (inside the call's local
step, so that a rank that cannot allocate raises with the others before
any rank moves data).
"""

import numpy

from .. import collectives

__all__ = ["OwnerExchange", "stored_selection"]


class OwnerExchange:
    """The buffers of one all-to-all between the ranks' parts and the chunks' owners, allocated up front.

    Parameters
    ----------
    plan : ChunkPlan
    rank : int
        This rank of the grid.
    dtype : numpy.dtype
    to_owners : bool
        A write (parts to owners) or a read (owners to parts).
    """

    def __init__(self, plan, rank, dtype, to_owners):
        self.plan, self.rank = plan, rank
        parts_side, owners_side = plan.counts_to_owners(rank), plan.counts_from_parts(rank)
        self.send_counts, self.recv_counts = (parts_side, owners_side) if to_owners else (owners_side, parts_side)
        self.send = numpy.empty(sum(self.send_counts), dtype)
        self.recv = numpy.empty(sum(self.recv_counts), dtype)
        self.regions = [numpy.empty(plan.region_shape(r), dtype) for r in plan.regions(rank)] if to_owners else None

    def _alltoallv(self, comm):
        collectives.alltoallv(comm, self.send, self.send_counts, _displacements(self.send_counts), self.recv,
                              self.recv_counts, _displacements(self.recv_counts))

    def to_owners(self, comm, part):
        """The owners' regions, assembled from every rank's ``part`` (``(lead_size, rows, cols)``)."""
        self.plan.pack_parts(self.rank, part, self.send)
        self._alltoallv(comm)
        self.plan.copy_own(self.rank, part, self.regions)
        self.plan.unpack_regions(self.rank, self.recv, self.regions)
        return self.regions

    def from_owners(self, comm, regions, part):
        """Every rank's ``part``, from the owners' ``regions``."""
        self.plan.pack_regions(self.rank, regions, self.send)
        self.plan.copy_own(self.rank, part, regions, to_regions=False)
        self._alltoallv(comm)
        self.plan.unpack_parts(self.rank, self.recv, part)


def stored_selection(selection, flat):
    """A plan's selection ``(lead..., rows, columns)`` in the stored array (points: no column axis)."""
    return selection[:-1] if flat else selection


def _displacements(counts):
    return numpy.concatenate([[0], numpy.cumsum(counts)[:-1]]).astype(numpy.int64) if counts else []
