"""The transpose: swap which axis of an array is split over a communicator (``Alltoallv``), with its adjoint.

:class:`Transpose` ``(comm, axes=(a, b), extents=(na, nb))``: the input is
whole along ``a`` and split along ``b``, the output split along ``a`` and
whole along ``b``; the adjoint is the reverse transpose. Its counts,
displacements and buffers are planned once per (direction, shape, dtype,
device) (``_TransposePlan``). It also has a non-blocking form,
:meth:`~mpisphere.Transpose.start_forward` and :meth:`~mpisphere.Transpose.start_adjoint`, which
return an :class:`Exchange` to ``wait()`` on, so that a caller can overlap
the exchange with work.
"""

import math

import numpy

from . import backend, collectives
from .operators import ADJOINT, DISTRIBUTED, FORWARD, Abilities, InputError, Layout
from .partition import offsets_of, split_sizes
from .validation import check_int
from .comm_operator import CommunicatorOperator, along, check_axis, check_moved_dtype

__all__ = ["Transpose", "Exchange", "BufferPool"]


class BufferPool:
    """Where exchanges take their buffer sets: one set per exchange in flight, given back when it ends.

    Each set is a workspace (``mpisphere.backend.Workspace``) whose buffers
    are raw bytes viewed as the dtype of the moment, so one set serves transposes of
    several shapes and dtypes. Transposes that never run at the same time
    (the stages of one operator's pipelines) may share a pool: they then hold
    one set between them, each buffer as large as the largest they need,
    instead of one set each. Not meant to be shared between threads.
    """

    __slots__ = ("_free",)

    def __init__(self):
        self._free = []

    def take(self):
        """A buffer set's workspace: a free one, or a new one when every set is in use."""
        return self._free.pop() if self._free else backend.Workspace()

    def give(self, workspace):
        """Return a set taken with :meth:`take` (its exchange has completed)."""
        self._free.append(workspace)


class _TransposePlan:
    """Counts, displacements and buffers of one (direction, input shape, dtype, device), built once.

    Buffers come in sets (send and receive); each call or exchange in flight
    takes a set of its own from the pool (:class:`BufferPool`) and returns it
    when done, so two exchanges in flight never share memory.
    """

    def __init__(self, op, shape, dtype, s, g, s_sizes, g_sizes, pool):
        size, rank = op.size, op.rank
        self.size, self.rank, self.s, self.g = size, rank, s, g
        self.dtype = dtype
        self.s_sizes, self.g_sizes = list(s_sizes), list(g_sizes)
        n_split, n_gather = sum(s_sizes), sum(g_sizes)
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
        self._pool = pool

    def send_block(self, x, q):  # what rank q receives from x: its chunk along s
        return x[along(self.s, slice(self.s_offs[q], self.s_offs[q] + self.s_sizes[q]))]

    def recv_block(self, out, q):  # where q's data lands in out: q's chunk along g
        return out[along(self.g, slice(self.g_offs[q], self.g_offs[q] + self.g_sizes[q]))]

    def acquire(self, like, host_only, send=True, recv=True):
        """A buffer set: ``{"send", "recv", "workspace"}`` (flat; pinned host arrays when ``host_only``).

        ``send``, ``recv``: whether the call packs into a send buffer and
        unpacks from a receive buffer (a direct exchange needs neither; the
        entry is then None). Each set keeps its buffers in a workspace of its
        own: asked for again on another CUDA stream, the device buffers are
        ordered after the stream that used them last, and a pinned receive
        buffer whose copy to the device is still queued is waited for (the
        stream rule of :mod:`mpisphere.backend`).
        """
        ws = self._pool.take()
        pinned = host_only and backend.is_device_array(like)
        return {"send": self.raw(ws, "send", like, sum(self.send_counts), pinned) if send else None,
                "recv": self.raw(ws, "recv", like, sum(self.recv_counts), pinned) if recv else None,
                "workspace": ws}

    def raw(self, ws, name, like, count, pinned=False):
        """``count`` entries of the plan's dtype in ``ws``'s byte buffer ``name`` (kept whatever the dtype)."""
        nbytes = count * self.dtype.itemsize
        buf = ws.host(name, nbytes, numpy.uint8, True) if pinned else ws.scratch(name, like, nbytes, numpy.uint8)
        return buf.view(self.dtype)

    def release(self, buffers):
        self._pool.give(buffers["workspace"])

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
    """A :class:`Transpose` in flight, from :meth:`~mpisphere.Transpose.start_forward` or ``start_adjoint``.

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


class Transpose(CommunicatorOperator):
    """Swap which axis is split over the communicator (``Alltoallv``).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        E.g. ``grid.polar`` or ``grid.azimuth``.
    axes : (int, int)
        ``(a, b)``: the input is whole along ``a`` and split along ``b``; the
        output is split along ``a`` and whole along ``b``. Negative axes count
        from the end, so the same operator serves any number of leading axes.
    extents : (int or sequence of int, int or sequence of int)
        ``(na, nb)``, the global extents along ``a`` and ``b``, each split by
        :func:`~mpisphere.split_sizes`; or, for an axis split otherwise (the
        rings of a reduced grid, balanced by points), the sizes of every
        rank's chunk along it (``comm.size`` entries, each at least 1).
    pool : BufferPool, keyword-only, optional
        Where its exchanges take their buffers; transposes that never run
        at the same time may share one (default: a pool per plan).

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

    def __init__(self, comm, axes, extents, *, pool=None):
        super().__init__(comm)
        self._pool = pool
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
        self.sizes = (self._chunks(na, "extents[0]"), self._chunks(nb, "extents[1]"))
        self.extents = tuple(sum(sizes) for sizes in self.sizes)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(DISTRIBUTED, comm)
        self._plans = backend.BoundedCache(8)
        self._dropped = []

    def _chunks(self, extent, what):
        """Every rank's chunk along an axis: of an extent (balanced) or as given."""
        if not numpy.iterable(extent):  # one extent, split evenly (check_int refuses anything else)
            return tuple(split_sizes(self._extent(extent, what), self.size))
        try:
            sizes = tuple(check_int(v, what, self.name, minimum=1) for v in extent)
        except TypeError:
            raise TypeError(f"Transpose: {what} takes an extent or one chunk size per rank, got {extent!r}") \
                from None
        if len(sizes) != self.size:
            raise ValueError(f"Transpose: {what} gives {len(sizes)} chunk sizes for a communicator of {self.size} "
                             "ranks")
        return sizes

    @property
    def is_identity(self):
        """True on a one-rank communicator: the map is then the identity (a copy)."""
        return self.size == 1

    def _roles(self, direction):
        """``(split axis, gather axis), (split chunks, gather chunks)`` of the input in ``direction``."""
        if direction == FORWARD:
            return self.axes, self.sizes
        return self.axes[::-1], self.sizes[::-1]

    def _output(self, direction, spec):
        if self._dropped:
            raise InputError(f"{self._dropped[0]} on this operator was dropped without wait(); its buffers may "
                             "still be written by MPI. Call wait() on every Exchange", RuntimeError)
        check_moved_dtype(spec)
        (split_axis, gather_axis), (s_sizes, g_sizes) = self._roles(direction)
        n_split, n_gather = sum(s_sizes), sum(g_sizes)
        s, g = check_axis(spec, split_axis), check_axis(spec, gather_axis)
        if s == g:
            raise InputError(f"axes {self.axes} name the same axis of an array with {len(spec.shape)} dimensions")
        want_g = g_sizes[self.rank]
        if spec.shape[s] != n_split or spec.shape[g] != want_g:
            raise InputError(
                f"expected {n_split} entries along axis {split_axis} (whole) and {want_g} along axis "
                f"{gather_axis} (chunk {self.rank} of {n_gather} split over {self.size} ranks), "
                f"got input shape {spec.shape}")
        shape = list(spec.shape)
        shape[s] = s_sizes[self.rank]
        shape[g] = n_gather
        return spec.but(shape=shape), spec.describe((g,))

    def _shapes(self, lead):
        (a, b), (na, nb), (sa, sb) = self.axes, self.extents, self.sizes
        a, b = a % len(lead), b % len(lead)
        domain, range_ = list(lead), list(lead)
        domain[a], domain[b] = na, sb[self.rank]
        range_[a], range_[b] = sa[self.rank], nb
        return tuple(domain), tuple(range_)

    def abilities(self, direction):
        if self.is_identity:
            return super().abilities(direction)
        return Abilities(start=lambda x, out, context: self._begin(direction, x, out, context, f"start_{direction}"))

    def _plan(self, direction, x):
        (split_axis, gather_axis), (s_sizes, g_sizes) = self._roles(direction)
        key = (direction, tuple(x.shape), x.dtype.str, backend.is_device_array(x))
        return self._plans.get(key, lambda: _TransposePlan(self, tuple(x.shape), numpy.dtype(x.dtype),
                                                           split_axis % x.ndim, gather_axis % x.ndim, s_sizes,
                                                           g_sizes, BufferPool() if self._pool is None else self._pool))

    def _reserve(self, direction, x, out):
        if self.size > 1 and not backend.is_device_array(x):  # (device sets differ when staged: made in the call)
            plan = self._plan(direction, x)
            # into the pool, where the call takes it from
            plan.release(plan.acquire(x, False, *self._packed(plan, x, out, staged=False)))

    @staticmethod
    def _packed(plan, x, out, staged):
        """Whether a call packs its send and unpacks its receive buffer (else MPI reads ``x``, writes ``out``)."""
        if staged and backend.is_device_array(x):
            return True, True
        return not (plan.send_direct and x.flags.c_contiguous), not (plan.recv_direct and out.flags.c_contiguous)

    def _run(self, direction, x, out, context):
        if self.size == 1:
            backend.copy_into(out, x)
            return
        plan = self._plan(direction, x)
        packed_send, packed_recv = self._packed(plan, x, out, staged=False)
        buffers = plan.acquire(x, False, packed_send, packed_recv)
        try:
            if not packed_send:
                send, send_displs = x.reshape(-1), plan.direct_send_displs
            else:
                send, send_displs = buffers["send"], plan.packed_send_displs
                plan.pack(x, send)
            direct = not packed_recv
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

        Collective, and checked and agreed like :meth:`~mpisphere.LinearOperator.forward` (the ranks
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
        staged = context.staged and backend.is_device_array(x)
        packed_send, packed_recv = self._packed(plan, x, out, staged)
        buffers = plan.acquire(x, context.staged, packed_send, packed_recv)
        if not packed_send:
            send, send_displs = x.reshape(-1), plan.direct_send_displs
        else:
            send, send_displs = buffers["send"], plan.packed_send_displs
            if staged:  # packed on the device in the buffer set's own workspace, then one copy to the host
                packed = plan.raw(buffers["workspace"], "packed", x, send.size)
                plan.pack(x, packed)
                backend.copy_to_host(packed, send)
            else:
                plan.pack(x, send)
        direct = not packed_recv
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
                arrived = plan.raw(buffers["workspace"], "arrived", out, recv.size)
                backend.copy_from_host(recv, arrived)
                buffers["workspace"].guard("recv", True, arrived)  # the next exchange's MPI writes recv
                plan.unpack(arrived, out)
            else:
                plan.unpack(recv, out)

        return Exchange(self, label, plan, buffers, request, x, out, finish)
