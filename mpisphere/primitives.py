"""Communication primitives as linear operators with exact adjoints.

================================================  ==========================  =======================
operator                                          forward                     adjoint
================================================  ==========================  =======================
``Transpose(comm, axes=(a, b), extents=(na, nb))``  whole along a, split along b  the reverse transpose
                                                  -> split a, whole b
``CopyTo(comm)``                                  identity (copy)             Allreduce (sum)
``ReduceFrom(comm)``                              Allreduce (sum)             identity (copy)
``ScatterTo(comm, axis, extent)``                 keep own chunk              Allgatherv
``GatherFrom(comm, axis, extent)``                Allgatherv                  keep own chunk
``ReduceScatter(comm, axis, extent)``             Reduce_scatter              Allgatherv
``GatherFromCopyTo(comm, axis, extent)``          Allgatherv                  Reduce_scatter
================================================  ==========================  =======================

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

A :class:`Transpose` also has a non-blocking form, :meth:`Transpose.start_forward`
and :meth:`Transpose.start_adjoint`, which return an :class:`Exchange` to
``wait()`` on, so that a caller can overlap the exchange with work.
"""

import math

import numpy
from mpi4py import MPI

from . import backend, collectives, dtypes
from .operators import ADJOINT, DISTRIBUTED, FORWARD, REPLICATED, Abilities, InputError, Layout, LinearOperator
from .partition import offsets_of, split_sizes
from .validation import check_int

__all__ = [
    "Transpose",
    "Exchange",
    "CopyTo",
    "ReduceFrom",
    "ScatterTo",
    "GatherFrom",
    "ReduceScatter",
    "GatherFromCopyTo",
]


def _along(axis, index):
    """Index tuple selecting ``index`` (a slice) along ``axis``."""
    return (slice(None),) * axis + (index,)


def _is_c_contiguous(a):
    return a.flags.c_contiguous


def _check_dtype(spec):
    problem = dtypes.refusal(spec.dtype, "moved")
    if problem:
        raise InputError(problem, TypeError)


def _check_axis(spec, axis):
    ndim = len(spec.shape)
    if not -ndim <= axis < ndim:
        raise InputError(f"axis {axis} is out of range for an array of shape {spec.shape}")
    return axis % ndim


class _CommunicatorOperator(LinearOperator):
    """Shared set-up of the operators that run on one communicator."""

    def __init__(self, comm):
        if hasattr(comm, "cart") and hasattr(comm, "polar"):
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

    def _extent(self, extent, what="extent"):
        extent = check_int(extent, what, self.name)
        if extent < self.size:
            raise ValueError(f"{self.name}: {what}={extent} is smaller than the communicator size "
                             f"{self.size}; every rank needs at least one entry")
        return extent


class _SplitAxisOperator(_CommunicatorOperator):
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
        _check_dtype(spec)
        axis = _check_axis(spec, self.axis)
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
        out[...] = x[_along(axis, slice(self.offsets[self.rank], self.offsets[self.rank] + self.sizes[self.rank]))]

    def _allgather_buffers(self, x, axis, out):
        """``(send, recv)``: the caller's arrays where MPI can use them, else scratch buffers."""
        send = x if _is_c_contiguous(x) else self._workspace.scratch("send", x, x.size)
        direct = _is_c_contiguous(out) and math.prod(out.shape[:axis]) == 1
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
                out[_along(axis, slice(self.offsets[q], self.offsets[q] + self.sizes[q]))] = block

    def _reduce_scatter_buffers(self, x, axis, out):
        """``(send, recv)`` of a Reduce_scatter in the reduction dtype: the caller's arrays where possible."""
        work = dtypes.reduction_dtype(x.dtype)
        direct_send = x.dtype == work and _is_c_contiguous(x) and math.prod(x.shape[:axis]) == 1
        send = x if direct_send else self._workspace.scratch("send", x, x.size, work)
        direct = out.dtype == work and _is_c_contiguous(out)
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
                sl = _along(axis, slice(self.offsets[q], self.offsets[q] + self.sizes[q]))
                send[displs[q]:displs[q] + counts[q]].reshape(self._chunk_shape(x.shape, axis, q))[...] = x[sl]
        direct = recv is out
        collectives.reduce_scatter(self.comm, send.reshape(-1), recv.reshape(-1), counts,
                                   staged=context.staged, workspace=self._workspace)
        if not direct:
            out[...] = recv.reshape(shape)


class _SumOverRanks(_CommunicatorOperator):
    """Shared code of :class:`CopyTo` and :class:`ReduceFrom`: ``_sums`` names the direction that sums."""

    _sums = None

    def _output(self, direction, spec):
        _check_dtype(spec)
        return spec, spec.describe()

    def _shapes(self, lead):
        return lead, lead

    def _buffers(self, x, out):
        """``(send, recv)`` of the Allreduce in the reduction dtype: the caller's arrays where possible."""
        work = dtypes.reduction_dtype(x.dtype)
        send = x if x.dtype == work and _is_c_contiguous(x) else self._workspace.scratch("send", x, x.size, work)
        direct = out.dtype == work and _is_c_contiguous(out)
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

class _TransposePlan:
    """Counts, displacements and buffers of one (direction, input shape, dtype, device), built once.

    Buffers come in sets (send and receive); each call or exchange in flight
    takes a set of its own from the plan's pool and returns it when done, so
    two exchanges in flight never share memory.
    """

    def __init__(self, op, shape, dtype, s, g, n_split, n_gather):
        size, rank = op.size, op.rank
        self.size, self.rank, self.s, self.g = size, rank, s, g
        self.dtype = dtype
        self.s_sizes, self.g_sizes = split_sizes(n_split, size), split_sizes(n_gather, size)
        self.s_offs, self.g_offs = offsets_of(self.s_sizes), offsets_of(self.g_sizes)
        out_shape = list(shape)
        out_shape[s] = self.s_sizes[rank]
        out_shape[g] = n_gather
        self.out_shape = tuple(out_shape)
        unit_in = math.prod(shape) // n_split
        unit_out = math.prod(self.out_shape) // n_gather
        self.send_counts = [0 if q == rank else unit_in * self.s_sizes[q] for q in range(size)]
        self.recv_counts = [0 if q == rank else unit_out * self.g_sizes[q] for q in range(size)]
        # the split axis leads: each peer's block is contiguous in the input, send straight from it
        self.send_direct = math.prod(shape[:s]) == 1
        self.recv_direct = math.prod(self.out_shape[:g]) == 1
        self.direct_send_displs = [unit_in * o for o in self.s_offs]
        self.direct_recv_displs = [unit_out * o for o in self.g_offs]
        self.packed_send_displs = offsets_of(self.send_counts)
        self.packed_recv_displs = offsets_of(self.recv_counts)
        self._pool = []

    def send_block(self, x, q):  # what rank q receives from x: its chunk along s
        return x[_along(self.s, slice(self.s_offs[q], self.s_offs[q] + self.s_sizes[q]))]

    def recv_block(self, out, q):  # where q's data lands in out: q's chunk along g
        return out[_along(self.g, slice(self.g_offs[q], self.g_offs[q] + self.g_sizes[q]))]

    def acquire(self, like, host_only):
        """A buffer set: ``{"send", "recv"}`` flat arrays (pinned host arrays when ``host_only``)."""
        if self._pool:
            return self._pool.pop()
        total_send, total_recv = sum(self.send_counts), sum(self.recv_counts)
        if host_only and backend.is_device_array(like):
            ws = backend.Workspace()  # one per set: its pinned buffers belong to this set only
            return {"send": ws.host("send", total_send, self.dtype, True),
                    "recv": ws.host("recv", total_recv, self.dtype, True), "workspace": ws}
        xp = backend.array_module(like)
        with backend.device_of(like):
            return {"send": xp.empty(max(total_send, 1), self.dtype)[:total_send],
                    "recv": xp.empty(max(total_recv, 1), self.dtype)[:total_recv]}

    def release(self, buffers):
        self._pool.append(buffers)

    def pack(self, x, send):
        displs = self.packed_send_displs
        for q in range(self.size):
            if q != self.rank:
                block = self.send_block(x, q)
                send[displs[q]:displs[q] + self.send_counts[q]].reshape(block.shape)[...] = block

    def unpack(self, recv, out):
        displs = self.packed_recv_displs
        for q in range(self.size):
            if q != self.rank:
                block = self.recv_block(out, q)
                block[...] = recv[displs[q]:displs[q] + self.recv_counts[q]].reshape(block.shape)

    def copy_own(self, x, out):
        self.recv_block(out, self.rank)[...] = self.send_block(x, self.rank)


class Exchange:
    """A :class:`Transpose` in flight, from :meth:`Transpose.start_forward` or ``start_adjoint``.

    Call :meth:`wait` to complete it: it returns the result (``out`` when one
    was given). Until then the input must not be modified and the output not
    read. Several exchanges may be in flight at once, on one operator or
    several, and completed in any order; they never share buffers. An
    exchange that is dropped without :meth:`wait` makes the next call of its
    operator raise (its buffers may still be written by MPI, so they are
    never reused).
    """

    def __init__(self, op, label, plan, buffers, request, x, out, finish):
        self._op, self._label, self._plan, self._buffers = op, label, plan, buffers
        self._request, self._x, self._out, self._finish = request, x, out, finish
        self.done = request is None

    def wait(self):
        """Complete the exchange and return the result."""
        if not self.done:
            collectives.wait(self._request)
            self._finish()
            self._plan.release(self._buffers)
            self.done = True
            self._x = None
        return self._out

    def test(self):
        """True when the exchange has completed (then :meth:`wait` returns at once)."""
        if self.done:
            return True
        if collectives.test(self._request):
            self.wait()
            return True
        return False

    def __del__(self):
        if not getattr(self, "done", True):
            self._op._dropped.append(f"an exchange started with {self._label}")


class Transpose(_CommunicatorOperator):
    """Swap which axis is split over the communicator (``Alltoallv``).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        E.g. ``grid.polar`` or ``grid.azimuth``.
    axes : (int, int)
        ``(a, b)``: the input is whole along ``a`` and split along ``b``; the
        output is split along ``a`` and whole along ``b``. Negative axes count
        from the end, so the same operator serves any number of leading axes.
    extents : (int, int)
        ``(na, nb)``, the global extents along ``a`` and ``b``.

    Notes
    -----
    ``forward``: ``x[..., na @ a, ..., nb_r @ b, ...]`` ->
    ``y[..., na_r @ a, ..., nb @ b, ...]`` where ``na_r, nb_r`` are this
    rank's chunks. ``adjoint`` is the reverse transpose (a permutation, so
    also the inverse). Both map distributed to distributed. On a one-rank
    communicator both are a local copy (no MPI call).

    The block a rank keeps is copied directly; blocks to and from other ranks
    go straight from the input and into the output when they are contiguous
    there (the split axis is the first axis of extent > 1), and through
    buffers kept by a plan per input shape otherwise. ``domain_shape(shape)``
    takes a whole shape and returns this rank's piece.

    :meth:`start_forward` and :meth:`start_adjoint` start the exchange and
    return an :class:`Exchange` at once, for overlapping it with work.
    """

    def __init__(self, comm, axes, extents):
        super().__init__(comm)
        try:
            a, b = (check_int(v, "axes") for v in axes)
        except (TypeError, ValueError):
            raise TypeError(f"Transpose: axes must be a pair of integers, got {axes!r}") from None
        try:
            na, nb = extents
        except (TypeError, ValueError):
            raise TypeError(f"Transpose: extents must be a pair of integers, got {extents!r}") from None
        if a == b:
            raise ValueError(f"Transpose: axes must differ, got axes=({a}, {b})")
        self.axes = (a, b)
        self.extents = (self._extent(na, "extents[0]"), self._extent(nb, "extents[1]"))
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(DISTRIBUTED, comm)
        self._plans = backend.BoundedCache(8)
        self._dropped = []

    @property
    def is_identity(self):
        """True on a one-rank communicator: the map is then the identity (a copy)."""
        return self.size == 1

    def abilities(self, direction):
        return Abilities(identity=self.is_identity)

    def _roles(self, direction):
        """``(split axis, gather axis), (n_split, n_gather)`` of the input in ``direction``."""
        if direction == FORWARD:
            return self.axes, self.extents
        return self.axes[::-1], self.extents[::-1]

    def _output(self, direction, spec):
        if self._dropped:
            raise InputError(f"{self._dropped[0]} on this operator was dropped without wait(); its buffers may "
                             "still be written by MPI. Call wait() on every Exchange", RuntimeError)
        _check_dtype(spec)
        (split_axis, gather_axis), (n_split, n_gather) = self._roles(direction)
        s, g = _check_axis(spec, split_axis), _check_axis(spec, gather_axis)
        if s == g:
            raise InputError(f"axes {self.axes} name the same axis of an array with {len(spec.shape)} dimensions")
        want_g = split_sizes(n_gather, self.size)[self.rank]
        if spec.shape[s] != n_split or spec.shape[g] != want_g:
            raise InputError(
                f"expected {n_split} entries along axis {split_axis} (whole) and {want_g} along axis "
                f"{gather_axis} (chunk {self.rank} of {n_gather} split over {self.size} ranks), "
                f"got input shape {spec.shape}")
        shape = list(spec.shape)
        shape[s] = split_sizes(n_split, self.size)[self.rank]
        shape[g] = n_gather
        return spec.but(shape=shape), spec.describe((g,))

    def _shapes(self, lead):
        (a, b), (na, nb) = self.axes, self.extents
        a, b = a % len(lead), b % len(lead)
        domain, range_ = list(lead), list(lead)
        domain[a], domain[b] = na, split_sizes(nb, self.size)[self.rank]
        range_[a], range_[b] = split_sizes(na, self.size)[self.rank], nb
        return tuple(domain), tuple(range_)

    def _plan(self, direction, x):
        (split_axis, gather_axis), (n_split, n_gather) = self._roles(direction)
        key = (direction, tuple(x.shape), x.dtype.str, backend.is_device_array(x))
        return self._plans.get(key, lambda: _TransposePlan(self, tuple(x.shape), numpy.dtype(x.dtype),
                                                           split_axis % x.ndim, gather_axis % x.ndim, n_split,
                                                           n_gather))

    def _reserve(self, direction, x, out):
        if self.size > 1 and not backend.is_device_array(x):  # (device sets differ when staged: made in the call)
            plan = self._plan(direction, x)
            plan.release(plan.acquire(x, host_only=False))  # into the pool, where the call takes it from

    def _run(self, direction, x, out, context):
        if self.size == 1:
            backend.copy_into(out, x)
            return
        plan = self._plan(direction, x)
        buffers = plan.acquire(x, host_only=False)
        try:
            if plan.send_direct and _is_c_contiguous(x):
                send, send_displs = x.reshape(-1), plan.direct_send_displs
            else:
                send, send_displs = buffers["send"], plan.packed_send_displs
                plan.pack(x, send)
            direct = plan.recv_direct and _is_c_contiguous(out)
            if direct:
                recv, recv_displs = out.reshape(-1), plan.direct_recv_displs
            else:
                recv, recv_displs = buffers["recv"], plan.packed_recv_displs
            plan.copy_own(x, out)
            collectives.alltoallv(self.comm, send, plan.send_counts, send_displs, recv, plan.recv_counts,
                                  recv_displs, staged=context.staged, workspace=self._workspace)
            if not direct:
                plan.unpack(recv, out)
        finally:
            plan.release(buffers)

    # --- non-blocking form ---------------------------------------------------------

    def start_forward(self, x, out=None):
        """Start the forward transpose; returns an :class:`Exchange` whose ``wait()`` gives the result.

        Collective, and checked and agreed like :meth:`forward` (the ranks
        must all start, in the same order; blocking and non-blocking calls do
        not match each other).
        """
        return self._start(FORWARD, x, out)

    def start_adjoint(self, y, out=None):
        """Start the adjoint (reverse) transpose; see :meth:`start_forward`."""
        return self._start(ADJOINT, y, out)

    def _start(self, direction, x, out):
        handle = []

        def begin(direction_, x_, out_, context):
            handle.append(self._begin(direction_, x_, out_, context, f"start_{direction}"))

        self._apply(direction, x, out, label=f"start_{direction}", runner=begin)
        return handle[0]

    def _begin(self, direction, x, out, context, label):
        if self.size == 1:
            backend.copy_into(out, x)
            return Exchange(self, label, None, None, None, x, out, None)
        plan = self._plan(direction, x)
        buffers = plan.acquire(x, host_only=context.staged)
        staged = context.staged and backend.is_device_array(x)
        if not staged and plan.send_direct and _is_c_contiguous(x):
            send, send_displs = x.reshape(-1), plan.direct_send_displs
        else:
            send, send_displs = buffers["send"], plan.packed_send_displs
            if staged:  # packed on the device in the buffer set's own workspace, then one copy to the host
                packed = buffers["workspace"].scratch("packed", x, send.size)
                plan.pack(x, packed)
                backend.copy_to_host(packed, send)
            else:
                plan.pack(x, send)
        direct = not staged and plan.recv_direct and _is_c_contiguous(out)
        if direct:
            recv, recv_displs = out.reshape(-1), plan.direct_recv_displs
        else:
            recv, recv_displs = buffers["recv"], plan.packed_recv_displs
        request = collectives.ialltoallv(self.comm, send, plan.send_counts, send_displs, recv, plan.recv_counts,
                                         recv_displs)
        plan.copy_own(x, out)

        def finish():
            if direct:
                return
            if staged:
                arrived = buffers["workspace"].scratch("arrived", out, recv.size)
                backend.copy_from_host(recv, arrived)
                plan.unpack(arrived, out)
            else:
                plan.unpack(recv, out)

        return Exchange(self, label, plan, buffers, request, x, out, finish)

