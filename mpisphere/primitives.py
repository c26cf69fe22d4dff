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

Inputs are validated before any collective: a wrong extent on a split axis,
an axis out of range or an unsupported dtype raises on the rank that sees it,
naming the operator, the rank, what was expected and what came. With
``mpisphere.config.debug`` on, the ranks first compare their inputs, so a
mismatch that only one rank can see raises on all of them.
"""

import operator

import numpy
from mpi4py import MPI

from . import backend, collectives
from .operators import DISTRIBUTED, REPLICATED, Layout, LinearOperator, check_input, output_array
from .partition import check_int, offsets_of, split_sizes

__all__ = [
    "Transpose",
    "CopyTo",
    "ReduceFrom",
    "ScatterTo",
    "GatherFrom",
    "ReduceScatter",
    "GatherFromCopyTo",
    "SUPPORTED_DTYPES",
]

SUPPORTED_DTYPES = tuple(numpy.dtype(d) for d in ("float16", "float32", "float64", "complex64", "complex128"))


def _reduction_dtype(dtype):
    """Dtype a sum over ranks runs in: float16 is promoted to float32, nothing else changes."""
    return numpy.dtype(numpy.float32) if dtype == numpy.float16 else dtype


def _dtype_error(x):
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return TypeError, f"expected a NumPy or CuPy array, got {type(x).__name__}"
    if numpy.dtype(dtype) not in SUPPORTED_DTYPES:
        return TypeError, (f"unsupported dtype {numpy.dtype(dtype)}; expected one of "
                           + ", ".join(str(d) for d in SUPPORTED_DTYPES))
    return None


def _meta(x, masked_axis):
    """What must agree across ranks: the shape (split axis masked) and the dtype."""
    shape = tuple(getattr(x, "shape", ()))
    if masked_axis is not None:
        shape = shape[:masked_axis] + ("*",) + shape[masked_axis + 1:]
    return f"shape {shape}", f"dtype {getattr(x, 'dtype', type(x).__name__)}"


def _prod(values):
    result = 1
    for v in values:
        result *= int(v)
    return result


def _along(axis, index, ndim=None):
    """Index tuple selecting ``index`` (a slice) along ``axis``."""
    return (slice(None),) * axis + (index,)


def _is_c_contiguous(a):
    return a.flags.c_contiguous


class _CommunicatorOperator(LinearOperator):
    """Shared set-up of the operators that run on one communicator."""

    def __init__(self, comm):
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"{self.name}: comm must be an mpi4py Intracomm (e.g. grid.polar), "
                            f"got {type(comm).__name__}")
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self._workspace = backend.Workspace()

    def _extent(self, extent, what="extent"):
        extent = check_int(extent, what, self.name)
        if extent < self.size:
            raise ValueError(f"{self.name}: {what}={extent} is smaller than the communicator size "
                             f"{self.size}; every rank needs at least one entry")
        return extent

    def _axis_error(self, x, axis):
        ndim = getattr(x, "ndim", 0)
        if not -ndim <= axis < ndim:
            return ValueError, f"axis {axis} is out of range for an array of shape {tuple(x.shape)}"
        return None


class _SplitAxisOperator(_CommunicatorOperator):
    """Operators that split one axis of extent ``extent`` over the communicator."""

    def __init__(self, comm, axis, extent):
        super().__init__(comm)
        try:
            self.axis = operator.index(axis)
        except TypeError:
            raise TypeError(f"{self.name}: axis must be an integer, got {axis!r}") from None
        self.extent = self._extent(extent)
        self.sizes = split_sizes(self.extent, self.size)
        self.offsets = offsets_of(self.sizes)

    def _validate(self, who, x, whole):
        """Check ``x`` has the whole extent (``whole``) or this rank's chunk along the axis."""
        error = _dtype_error(x) or self._axis_error(x, self.axis)
        axis = None
        if error is None:
            axis = self.axis % x.ndim
            expected = self.extent if whole else self.sizes[self.rank]
            if x.shape[axis] != expected:
                what = (f"the whole extent {self.extent}" if whole else
                        f"chunk {self.rank} of {self.extent} split over {self.size} ranks")
                error = ValueError, (f"expected {expected} entries along axis {self.axis} ({what}), "
                                     f"got {x.shape[axis]} (input shape {tuple(x.shape)})")
        check_input(self.comm, f"{self.name}.{who}", error, lambda: _meta(x, axis))
        return axis

    def _chunk_shape(self, shape, axis, rank):
        shape = list(shape)
        shape[axis] = self.sizes[rank]
        return tuple(shape)

    def _whole_shape(self, shape, axis):
        shape = list(shape)
        shape[axis] = self.extent
        return tuple(shape)

    # --- building blocks shared by the operators below ---------------------

    def _keep_chunk(self, x, axis, out):
        """Copy this rank's chunk of ``x`` (whole along ``axis``)."""
        sl = _along(axis, slice(self.offsets[self.rank], self.offsets[self.rank] + self.sizes[self.rank]))
        out = output_array(self.name, self.comm, x, out, self._chunk_shape(x.shape, axis, self.rank))
        out[...] = x[sl]
        return out

    def _allgather(self, x, axis, out):
        """Allgatherv of the chunks along ``axis`` into the whole array."""
        shape = self._whole_shape(x.shape, axis)
        out = output_array(self.name, self.comm, x, out, shape)
        if self.size == 1:
            out[...] = x
            return out
        unit = _prod(shape) // self.extent
        counts = [unit * n for n in self.sizes]
        displs = [unit * o for o in self.offsets]
        send = x if _is_c_contiguous(x) else self._workspace.scratch("send", x, x.size)
        if send is not x:
            send.reshape(x.shape)[...] = x
        direct = _is_c_contiguous(out) and _prod(shape[:axis]) == 1
        recv = out if direct else self._workspace.scratch("recv", x, out.size)
        collectives.allgatherv(self.comm, send.reshape(-1), recv.reshape(-1), counts, displs,
                               workspace=self._workspace)
        if not direct:
            flat = recv.reshape(-1)
            for q in range(self.size):
                block = flat[displs[q]:displs[q] + counts[q]].reshape(self._chunk_shape(shape, axis, q))
                out[_along(axis, slice(self.offsets[q], self.offsets[q] + self.sizes[q]))] = block
        return out

    def _reduce_scatter(self, x, axis, out):
        """Sum ``x`` (whole along ``axis``) over the ranks, keep this rank's chunk."""
        shape = self._chunk_shape(x.shape, axis, self.rank)
        out = output_array(self.name, self.comm, x, out, shape)
        if self.size == 1:
            out[...] = x
            return out
        work = _reduction_dtype(x.dtype)
        unit = x.size // self.extent
        counts = [unit * n for n in self.sizes]
        if x.dtype == work and _is_c_contiguous(x) and _prod(x.shape[:axis]) == 1:
            send = x
        else:
            send = self._workspace.scratch("send", x, x.size, work)
            displs = [unit * o for o in self.offsets]
            for q in range(self.size):
                sl = _along(axis, slice(self.offsets[q], self.offsets[q] + self.sizes[q]))
                send[displs[q]:displs[q] + counts[q]].reshape(self._chunk_shape(x.shape, axis, q))[...] = x[sl]
        direct = out.dtype == work and _is_c_contiguous(out)
        recv = out if direct else self._workspace.scratch("recv", x, out.size, work)
        collectives.reduce_scatter(self.comm, send.reshape(-1), recv.reshape(-1), counts,
                                   workspace=self._workspace)
        if not direct:
            out[...] = recv.reshape(shape)
        return out


class _SumOverRanks(_CommunicatorOperator):
    """Shared code of :class:`CopyTo` and :class:`ReduceFrom`."""

    def _validate(self, who, x):
        check_input(self.comm, f"{self.name}.{who}", _dtype_error(x), lambda: _meta(x, None))

    def _copy(self, who, x, out):
        self._validate(who, x)
        out = output_array(self.name, self.comm, x, out, x.shape)
        out[...] = x
        return out

    def _sum(self, who, x, out):
        self._validate(who, x)
        out = output_array(self.name, self.comm, x, out, x.shape)
        if self.size == 1:
            out[...] = x
            return out
        work = _reduction_dtype(x.dtype)
        if x.dtype == work and _is_c_contiguous(x):
            send = x
        else:
            send = self._workspace.scratch("send", x, x.size, work)
            send.reshape(x.shape)[...] = x
        direct = out.dtype == work and _is_c_contiguous(out)
        recv = out if direct else self._workspace.scratch("recv", x, x.size, work)
        collectives.allreduce(self.comm, send.reshape(-1), recv.reshape(-1), workspace=self._workspace)
        if not direct:
            out[...] = recv.reshape(x.shape)
        return out


class CopyTo(_SumOverRanks):
    """Identity from a replicated array to per-rank copies; its adjoint sums them.

    ``forward``: ``(...)`` replicated -> ``(...)`` distributed (a copy).
    ``adjoint``: ``(...)`` distributed -> ``(...)`` replicated, ``Allreduce``
    (sum; float16 summed in float32).

    Use it where every rank computes a partial result from the same input
    (a replicated parameter feeding rank-local work): the adjoint gathers the
    partial gradients.
    """

    def __init__(self, comm):
        super().__init__(comm)
        self.domain = Layout(REPLICATED, comm)
        self.range = Layout(DISTRIBUTED, comm)

    def _forward(self, x, out):
        return self._copy("forward", x, out)

    def _adjoint(self, y, out):
        return self._sum("adjoint", y, out)


class ReduceFrom(_SumOverRanks):
    """Sum of per-rank arrays, replicated on every rank; its adjoint copies.

    ``forward``: ``(...)`` distributed -> ``(...)`` replicated, ``Allreduce``
    (sum; float16 summed in float32). ``adjoint``: replicated -> distributed
    (a copy). The caller's array is never reduced in place.
    """

    def __init__(self, comm):
        super().__init__(comm)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(REPLICATED, comm)

    def _forward(self, x, out):
        return self._sum("forward", x, out)

    def _adjoint(self, y, out):
        return self._copy("adjoint", y, out)


class ScatterTo(_SplitAxisOperator):
    """Keep this rank's chunk of a replicated array; the adjoint gathers.

    ``forward``: ``(..., extent, ...)`` replicated -> ``(..., n_r, ...)``
    distributed, ``n_r = split_sizes(extent, comm.size)[rank]`` along
    ``axis``. ``adjoint``: ``Allgatherv`` back to the whole, replicated.
    """

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(REPLICATED, comm)
        self.range = Layout(DISTRIBUTED, comm)

    def _forward(self, x, out):
        return self._keep_chunk(x, self._validate("forward", x, whole=True), out)

    def _adjoint(self, y, out):
        return self._allgather(y, self._validate("adjoint", y, whole=False), out)


class GatherFrom(_SplitAxisOperator):
    """Assemble the chunks of all ranks along ``axis``, replicated on every rank.

    ``forward``: ``(..., n_r, ...)`` distributed -> ``(..., extent, ...)``
    replicated (``Allgatherv``). ``adjoint``: keep this rank's chunk.
    """

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(REPLICATED, comm)

    def _forward(self, x, out):
        return self._allgather(x, self._validate("forward", x, whole=False), out)

    def _adjoint(self, y, out):
        return self._keep_chunk(y, self._validate("adjoint", y, whole=True), out)


class ReduceScatter(_SplitAxisOperator):
    """Sum per-rank partial arrays and keep this rank's chunk of the sum.

    ``forward``: ``(..., extent, ...)`` distributed (partial sums) ->
    ``(..., n_r, ...)`` distributed (``Reduce_scatter`` with uneven counts;
    float16 summed in float32). ``adjoint``: ``Allgatherv`` (every rank gets
    a private copy of the whole).
    """

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(DISTRIBUTED, comm)

    def _forward(self, x, out):
        return self._reduce_scatter(x, self._validate("forward", x, whole=True), out)

    def _adjoint(self, y, out):
        return self._allgather(y, self._validate("adjoint", y, whole=False), out)


class GatherFromCopyTo(_SplitAxisOperator):
    """Allgatherv into per-rank copies of the whole; the adjoint reduce-scatters.

    ``forward``: ``(..., n_r, ...)`` distributed -> ``(..., extent, ...)``
    distributed (each rank's private copy, later used for rank-local partial
    work). ``adjoint``: ``Reduce_scatter`` of the partial results.
    """

    def __init__(self, comm, axis, extent):
        super().__init__(comm, axis, extent)
        self.domain = Layout(DISTRIBUTED, comm)
        self.range = Layout(DISTRIBUTED, comm)

    def _forward(self, x, out):
        return self._allgather(x, self._validate("forward", x, whole=False), out)

    def _adjoint(self, y, out):
        return self._reduce_scatter(y, self._validate("adjoint", y, whole=True), out)


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
    also the inverse). Both map distributed to distributed.

    The block a rank keeps is copied directly; blocks to and from other ranks
    go straight from the input and into the output when they are contiguous
    there (the split axis is the first axis of extent > 1), and through
    scratch buffers reused across calls otherwise.
    """

    def __init__(self, comm, axes, extents):
        super().__init__(comm)
        try:
            a, b = (operator.index(v) for v in axes)
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

    def _forward(self, x, out):
        return self._run("forward", x, out, self.axes, self.extents)

    def _adjoint(self, y, out):
        return self._run("adjoint", y, out, self.axes[::-1], self.extents[::-1])

    def _run(self, who, x, out, axes, extents):
        """Exchange so that ``axes[0]`` (whole in ``x``) ends up split and ``axes[1]`` whole."""
        split_axis, gather_axis = axes
        n_split, n_gather = extents
        error = _dtype_error(x) or self._axis_error(x, split_axis) or self._axis_error(x, gather_axis)
        s = g = None
        if error is None:
            s, g = split_axis % x.ndim, gather_axis % x.ndim
            if s == g:
                error = ValueError, f"axes {self.axes} name the same axis of an array with {x.ndim} dimensions"
        if error is None:
            want_g = split_sizes(n_gather, self.size)[self.rank]
            if x.shape[s] != n_split or x.shape[g] != want_g:
                error = ValueError, (
                    f"expected {n_split} entries along axis {split_axis} (whole) and {want_g} along axis "
                    f"{gather_axis} (chunk {self.rank} of {n_gather} split over {self.size} ranks), "
                    f"got input shape {tuple(x.shape)}")
        check_input(self.comm, f"Transpose.{who}", error, lambda: _meta(x, g))
        return self._exchange(x, s, g, n_split, n_gather, out)

    def _exchange(self, x, s, g, n_split, n_gather, out):
        size, rank = self.size, self.rank
        s_sizes, g_sizes = split_sizes(n_split, size), split_sizes(n_gather, size)
        s_offs, g_offs = offsets_of(s_sizes), offsets_of(g_sizes)
        out_shape = list(x.shape)
        out_shape[s] = s_sizes[rank]
        out_shape[g] = n_gather
        out = output_array("Transpose", self.comm, x, out, tuple(out_shape))

        def send_block(q):  # what rank q receives from x: its chunk along s
            return x[_along(s, slice(s_offs[q], s_offs[q] + s_sizes[q]))]

        def recv_block(q):  # where q's data lands in out: q's chunk along g
            return out[_along(g, slice(g_offs[q], g_offs[q] + g_sizes[q]))]

        recv_block(rank)[...] = send_block(rank)
        if size == 1:
            return out

        unit_in = x.size // n_split
        unit_out = out.size // n_gather
        send_counts = [0 if q == rank else unit_in * s_sizes[q] for q in range(size)]
        recv_counts = [0 if q == rank else unit_out * g_sizes[q] for q in range(size)]

        if _is_c_contiguous(x) and _prod(x.shape[:s]) == 1:
            send = x.reshape(-1)
            send_displs = [unit_in * o for o in s_offs]
        else:
            send = self._workspace.scratch("send", x, sum(send_counts))
            send_displs = offsets_of(send_counts)
            for q in range(size):
                if q != rank:
                    block = send_block(q)
                    send[send_displs[q]:send_displs[q] + send_counts[q]].reshape(block.shape)[...] = block

        direct = _is_c_contiguous(out) and _prod(out.shape[:g]) == 1
        if direct:
            recv = out.reshape(-1)
            recv_displs = [unit_out * o for o in g_offs]
        else:
            recv = self._workspace.scratch("recv", x, sum(recv_counts))
            recv_displs = offsets_of(recv_counts)

        collectives.alltoallv(self.comm, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                              workspace=self._workspace)

        if not direct:
            for q in range(size):
                if q != rank:
                    block = recv_block(q)
                    block[...] = recv[recv_displs[q]:recv_displs[q] + recv_counts[q]].reshape(block.shape)
        return out
