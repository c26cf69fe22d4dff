"""Communication primitives as linear operators with exact adjoints.

==========================================  ==========================  =======================
operator                                    forward                     adjoint
==========================================  ==========================  =======================
``CopyTo(comm)``                            identity (copy)             Allreduce (sum)
``ReduceFrom(comm)``                        Allreduce (sum)             identity (copy)
``ScatterTo(comm, axis, extent)``           keep own chunk              Allgatherv
``GatherFrom(comm, axis, extent)``          Allgatherv                  keep own chunk
``ReduceScatter(comm, axis, extent)``       Reduce_scatter              Allgatherv
``GatherFromCopyTo(comm, axis, extent)``    Allgatherv                  Reduce_scatter
==========================================  ==========================  =======================

and :class:`~mpisphere.Transpose` (:mod:`mpisphere.transpose`): whole along
one axis and split along another, to the reverse (``Alltoallv``).

Chunks along a split axis are always ``split_sizes(extent, comm.size)`` in
rank order. Every operator takes arrays with any number of axes (the split
axes may be negative), real or complex, float16 to complex128, NumPy or
CuPy. Reductions of float16 run in float32. On a communicator of one rank
no MPI call is made.

Every call agrees before it communicates (see :mod:`mpisphere.operators`):
a wrong extent on a split axis, an axis out of range, an unsupported dtype,
a bad ``out=``, another batch size or dtype than the other ranks, or another
operator altogether raises the same error on every rank of the
communicator, naming the rank that is wrong, what was expected and what
came.
"""

import math


from . import collectives, dtypes
from .operators import ADJOINT, DISTRIBUTED, FORWARD, REPLICATED, InputError, Layout
from .partition import offsets_of, split_sizes
from .validation import check_int
from .comm_operator import CommunicatorOperator, along, check_axis, check_moved_dtype

__all__ = [
    "CopyTo",
    "ReduceFrom",
    "ScatterTo",
    "GatherFrom",
    "ReduceScatter",
    "GatherFromCopyTo",
]


class _SplitAxisOperator(CommunicatorOperator):
    """Operators that split one axis of extent ``extent`` over the communicator.

    ``_forward_whole`` says whether ``forward`` takes the whole extent (and
    returns this rank's chunk) or the chunk (and returns the whole); the
    adjoint goes the other way. ``_moves`` names the work of each direction.
    """

    _forward_whole = None
    _moves = None  # {FORWARD: method name, ADJOINT: method name}

    def __init__(self, comm, axis, extent):
        super().__init__(comm)
        self.axis = check_int(axis, "axis", self.name)
        self.extent = self._extent(extent)
        self.sizes = split_sizes(self.extent, self.size)
        self.offsets = offsets_of(self.sizes)

    def _takes_whole(self, direction):
        return self._forward_whole == (direction == FORWARD)

    def _output(self, direction, spec):
        check_moved_dtype(spec)
        axis = check_axis(spec, self.axis)
        whole = self._takes_whole(direction)
        expected = self.extent if whole else self.sizes[self.rank]
        if spec.shape[axis] != expected:
            what = (f"the whole extent {self.extent}" if whole else
                    f"chunk {self.rank} of {self.extent} split over {self.size} ranks")
            raise InputError(f"expected {expected} entries along axis {self.axis} ({what}), got {spec.shape[axis]} "
                             f"(input shape {spec.shape})")
        shape = list(spec.shape)
        shape[axis] = self.sizes[self.rank] if whole else self.extent
        return spec.but(shape=shape), spec.describe(() if whole else (axis,))

    def _run(self, direction, x, out, context):
        getattr(self, self._moves[direction])(x, self.axis % x.ndim, out, context)

    def _reserve(self, direction, x, out):
        move = self._moves[direction]
        if self.size > 1 and move != "_keep_chunk":
            getattr(self, move + "_buffers")(x, self.axis % x.ndim, out)

    def _shapes(self, lead):
        axis = self.axis % len(lead)
        whole, chunk = list(lead), list(lead)
        whole[axis], chunk[axis] = self.extent, self.sizes[self.rank]
        fw = self._forward_whole
        return (tuple(whole), tuple(chunk)) if fw else (tuple(chunk), tuple(whole))

    def _chunk_shape(self, shape, axis, rank):
        shape = list(shape)
        shape[axis] = self.sizes[rank]
        return tuple(shape)

    # --- the moves ---------------------------------------------------------------

    def _keep_chunk(self, x, axis, out, context):
        """Copy this rank's chunk of ``x`` (whole along ``axis``)."""
        out[...] = x[along(axis, slice(self.offsets[self.rank], self.offsets[self.rank] + self.sizes[self.rank]))]

    def _allgather_buffers(self, x, axis, out):
        """``(send, recv)``: the caller's arrays where MPI can use them, else scratch buffers."""
        send = x if x.flags.c_contiguous else self._workspace.scratch("send", x, x.size)
        direct = out.flags.c_contiguous and math.prod(out.shape[:axis]) == 1
        return send, (out if direct else self._workspace.scratch("recv", x, out.size))

    def _allgather(self, x, axis, out, context):
        """Allgatherv of the chunks along ``axis`` into the whole array."""
        if self.size == 1:
            out[...] = x
            return
        shape = out.shape
        unit = math.prod(shape) // self.extent
        counts = [unit * n for n in self.sizes]
        displs = [unit * o for o in self.offsets]
        send, recv = self._allgather_buffers(x, axis, out)
        if send is not x:
            send.reshape(x.shape)[...] = x
        direct = recv is out
        collectives.allgatherv(self.comm, send.reshape(-1), recv.reshape(-1), counts, displs,
                               staged=context.staged, workspace=self._workspace)
        if not direct:
            flat = recv.reshape(-1)
            for q in range(self.size):
                block = flat[displs[q]:displs[q] + counts[q]].reshape(self._chunk_shape(shape, axis, q))
                out[along(axis, slice(self.offsets[q], self.offsets[q] + self.sizes[q]))] = block

    def _reduce_scatter_buffers(self, x, axis, out):
        """``(send, recv)`` of a Reduce_scatter in the reduction dtype: the caller's arrays where possible."""
        work = dtypes.reduction_dtype(x.dtype)
        direct_send = x.dtype == work and x.flags.c_contiguous and math.prod(x.shape[:axis]) == 1
        send = x if direct_send else self._workspace.scratch("send", x, x.size, work)
        direct = out.dtype == work and out.flags.c_contiguous
        return send, (out if direct else self._workspace.scratch("recv", x, out.size, work))

    def _reduce_scatter(self, x, axis, out, context):
        """Sum ``x`` (whole along ``axis``) over the ranks, keep this rank's chunk."""
        if self.size == 1:
            out[...] = x
            return
        shape = out.shape
        unit = x.size // self.extent
        counts = [unit * n for n in self.sizes]
        send, recv = self._reduce_scatter_buffers(x, axis, out)
        if send is not x:
            displs = [unit * o for o in self.offsets]
            for q in range(self.size):
                sl = along(axis, slice(self.offsets[q], self.offsets[q] + self.sizes[q]))
                send[displs[q]:displs[q] + counts[q]].reshape(self._chunk_shape(x.shape, axis, q))[...] = x[sl]
        direct = recv is out
        collectives.reduce_scatter(self.comm, send.reshape(-1), recv.reshape(-1), counts,
                                   staged=context.staged, workspace=self._workspace)
        if not direct:
            out[...] = recv.reshape(shape)


class _SumOverRanks(CommunicatorOperator):
    """Shared code of :class:`CopyTo` and :class:`ReduceFrom`: ``_sums`` names the direction that sums."""

    _sums = None

    def _output(self, direction, spec):
        check_moved_dtype(spec)
        return spec, spec.describe()

    def _shapes(self, lead):
        return lead, lead

    def _buffers(self, x, out):
        """``(send, recv)`` of the Allreduce in the reduction dtype: the caller's arrays where possible."""
        work = dtypes.reduction_dtype(x.dtype)
        send = x if x.dtype == work and x.flags.c_contiguous else self._workspace.scratch("send", x, x.size, work)
        direct = out.dtype == work and out.flags.c_contiguous
        return send, (out if direct else self._workspace.scratch("recv", x, x.size, work))

    def _reserve(self, direction, x, out):
        if direction == self._sums and self.size > 1:
            self._buffers(x, out)

    def _run(self, direction, x, out, context):
        if direction != self._sums or self.size == 1:
            out[...] = x
            return
        send, recv = self._buffers(x, out)
        if send is not x:
            send.reshape(x.shape)[...] = x
        direct = recv is out
        collectives.allreduce(self.comm, send.reshape(-1), recv.reshape(-1), staged=context.staged,
                              workspace=self._workspace)
        if not direct:
            out[...] = recv.reshape(x.shape)


class CopyTo(_SumOverRanks):
    """Identity from a replicated array to per-rank copies; its adjoint sums them.

    ``forward``: ``(...)`` replicated -> ``(...)`` distributed (a copy).
    ``adjoint``: ``(...)`` distributed -> ``(...)`` replicated, ``Allreduce``
    (sum; float16 summed in float32).

    Use it where every rank computes a partial result from the same input
    (a replicated parameter feeding rank-local work): the adjoint gathers the
    partial gradients. Shapes: any; ``domain_shape(shape)`` is ``shape``.
    """

    _sums = ADJOINT

    def __init__(self, comm):
        super().__init__(comm)
        self.domain = Layout(REPLICATED, comm)
        self.range = Layout(DISTRIBUTED, comm)


class ReduceFrom(_SumOverRanks):
    """Sum of per-rank arrays, replicated on every rank; its adjoint copies.

    ``forward``: ``(...)`` distributed -> ``(...)`` replicated, ``Allreduce``
    (sum; float16 summed in float32). ``adjoint``: replicated -> distributed
    (a copy). The caller's array is never reduced in place.
    """

    _sums = FORWARD

    def __init__(self, comm):
        super().__init__(comm)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(REPLICATED, comm)


class ScatterTo(_SplitAxisOperator):
    """Keep this rank's chunk of a replicated array; the adjoint gathers.

    ``forward``: ``(..., extent, ...)`` replicated -> ``(..., n_r, ...)``
    distributed, ``n_r = split_sizes(extent, comm.size)[rank]`` along
    ``axis``. ``adjoint``: ``Allgatherv`` back to the whole, replicated.
    ``domain_shape(shape)``: ``shape`` with ``extent`` along ``axis``.
    """

    _forward_whole = True
    _moves = {FORWARD: "_keep_chunk", ADJOINT: "_allgather"}

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(REPLICATED, comm)
        self.range = Layout(DISTRIBUTED, comm)


class GatherFrom(_SplitAxisOperator):
    """Assemble the chunks of all ranks along ``axis``, replicated on every rank.

    ``forward``: ``(..., n_r, ...)`` distributed -> ``(..., extent, ...)``
    replicated (``Allgatherv``). ``adjoint``: keep this rank's chunk.
    """

    _forward_whole = False
    _moves = {FORWARD: "_allgather", ADJOINT: "_keep_chunk"}

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(REPLICATED, comm)


class ReduceScatter(_SplitAxisOperator):
    """Sum per-rank partial arrays and keep this rank's chunk of the sum.

    ``forward``: ``(..., extent, ...)`` distributed (partial sums) ->
    ``(..., n_r, ...)`` distributed (``Reduce_scatter`` with uneven counts;
    float16 summed in float32). ``adjoint``: ``Allgatherv`` (every rank gets
    a private copy of the whole).
    """

    _forward_whole = True
    _moves = {FORWARD: "_reduce_scatter", ADJOINT: "_allgather"}

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(DISTRIBUTED, comm)


class GatherFromCopyTo(_SplitAxisOperator):
    """Allgatherv into per-rank copies of the whole; the adjoint reduce-scatters.

    ``forward``: ``(..., n_r, ...)`` distributed -> ``(..., extent, ...)``
    distributed (each rank's private copy, later used for rank-local partial
    work). ``adjoint``: ``Reduce_scatter`` of the partial results.
    """

    _forward_whole = False
    _moves = {FORWARD: "_allgather", ADJOINT: "_reduce_scatter"}

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(DISTRIBUTED, comm)


# --- Transpose ------------------------------------------------------------------------------------
