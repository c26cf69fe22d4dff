"""Typed wrappers that run one MPI call on arrays.

This is the only module of mpisphere that calls mpi4py's communication
methods. Every wrapper takes the communicator explicitly, takes flat
C-contiguous arrays (NumPy, CuPy, or any object exposing ``__dlpack__`` or
``__cuda_array_interface__`` together with an explicit ``dtype``), counts and
displacements in elements, and

* maps the dtype to an MPI datatype (float16 moves as 16-bit words and is
  never reduced: reductions promote it to float32 first, in the operators);
* moves contiguous buffers only: with the pip MPICH, derived datatypes were
  measured slower than packing with NumPy (30x for an ``Allgatherv`` of
  strided columns, 3x for a halo column exchange), and MPICH refuses
  reductions on them;
* for device buffers, synchronises the current stream before MPI reads them
  (:func:`mpisphere.backend.synchronize`);
* when the MPI library is not CUDA-aware (or ``config.force_staging`` is set),
  stages the buffers through host buffers kept in the caller's
  :class:`~mpisphere.backend.Workspace`, so nothing is allocated per call.

Metadata helpers (:func:`allgather_object`, :func:`agree`) carry the cross-
rank checks of debug mode.
"""

import numpy
from mpi4py import MPI

from . import backend
from .cuda_aware import local_verdict
from .settings import config

__all__ = [
    "mpi_type",
    "cuda_aware",
    "staging_active",
    "describe_path",
    "allgather_object",
    "bcast_object",
    "agree",
    "allreduce_floats",
    "barrier",
    "alltoallv",
    "allgatherv",
    "reduce_scatter",
    "allreduce",
    "sendrecv",
    "exchange",
    "scatterv",
    "gatherv",
]


def mpi_type(dtype):
    """MPI datatype that moves elements of ``dtype`` (sizes in elements of it).

    Raises
    ------
    TypeError
        For a dtype mpisphere does not move (it handles float16, float32,
        float64, complex64, complex128 and the integer types).
    """
    dtype = numpy.dtype(dtype)
    if dtype == numpy.float64:
        return MPI.DOUBLE
    if dtype == numpy.float32:
        return MPI.FLOAT
    if dtype == numpy.complex128:
        return MPI.C_DOUBLE_COMPLEX
    if dtype == numpy.complex64:
        return MPI.C_FLOAT_COMPLEX
    if dtype == numpy.float16:
        return MPI.UINT16_T  # moved as 16-bit words; never reduced
    if dtype.kind in "iub" and dtype.itemsize in (1, 2, 4, 8):
        signed = dtype.kind == "i"
        return {
            1: MPI.INT8_T if signed else MPI.UINT8_T,
            2: MPI.INT16_T if signed else MPI.UINT16_T,
            4: MPI.INT32_T if signed else MPI.UINT32_T,
            8: MPI.INT64_T if signed else MPI.UINT64_T,
        }[dtype.itemsize]
    raise TypeError(f"mpisphere: unsupported dtype {dtype} (supported: float16, float32, float64, "
                    f"complex64, complex128)")


def _reduction_type(dtype):
    dtype = numpy.dtype(dtype)
    if dtype == numpy.float16:
        raise TypeError("mpisphere: float16 is reduced in float32; convert before the reduction")
    return mpi_type(dtype)


# --- CUDA-aware decision ---------------------------------------------------

def cuda_aware(comm):
    """Agreed answer: may device buffers go to MPI directly?

    Decided once per process and cached in ``mpisphere.config``: the local
    verdict of :func:`mpisphere.cuda_aware.local_verdict` on every rank of
    ``comm``, reduced with logical AND, so all ranks take the same path. The
    first call is collective over ``comm``; :class:`~mpisphere.ProcessGrid`
    makes it at construction, so later calls are local.

    Returns
    -------
    (bool, str)
        The decision and its source.
    """
    decided = config._cuda_aware_decision
    if decided is not None:
        return decided
    value, source = local_verdict(config.cuda_aware)
    if config.cuda_aware is not None:
        config._cuda_aware_decision = (bool(value), source)
    elif comm.Get_size() > 1:
        agreed = comm.allreduce(bool(value), op=MPI.LAND)
        if agreed != value:
            source = f"another rank found no CUDA support (this rank: {source})"
        config._cuda_aware_decision = (bool(agreed), source)
    elif MPI.COMM_WORLD.Get_size() == 1:
        config._cuda_aware_decision = (bool(value), source)
    else:
        # a one-rank communicator inside a larger job: answer for this call,
        # but leave the decision to the first communicator that can agree on it
        return bool(value), source + "; this rank's own verdict, not yet agreed across ranks"
    return config._cuda_aware_decision


def staging_active(buf, comm):
    """True when ``buf`` goes to MPI through host staging buffers.

    CuPy arrays are staged when the MPI library is not CUDA-aware; with
    ``config.force_staging`` NumPy arrays are staged too (a testing aid).
    Other objects (anything exposing ``__dlpack__`` or
    ``__cuda_array_interface__``) are always handed to MPI as they are.
    """
    if backend.is_device_array(buf):
        return config.force_staging or not cuda_aware(comm)[0]
    return config.force_staging and isinstance(buf, numpy.ndarray)


def describe_path(comm=None):
    """One line naming the path device buffers take, and why. Never communicates.

    Reports the agreed decision once :func:`cuda_aware` has made it (a
    :class:`~mpisphere.ProcessGrid` makes it at construction); before that,
    this rank's own verdict, marked as such. ``comm`` is accepted for
    symmetry and not used, so this is safe to call on one rank only.
    """
    decided = config._cuda_aware_decision
    if decided is not None:
        aware, source = decided
    else:
        aware, source = local_verdict(config.cuda_aware)
        source += "; this rank's own verdict, not yet agreed across ranks"
    path = ("device buffers straight to MPI (CUDA-aware)" if aware
            else "device buffers staged through pinned host memory")
    if config.force_staging:
        path += "; force_staging on: every buffer staged"
    return f"{path} [{source}]"


# --- metadata ---------------------------------------------------------------

def allgather_object(comm, obj):
    """Every rank's ``obj`` (picklable), in rank order."""
    return comm.allgather(obj)


def bcast_object(comm, obj, root=0):
    """``obj`` from ``root`` on every rank."""
    return comm.bcast(obj, root=root)


def allreduce_floats(comm, values, op=MPI.SUM):
    """Reduce a small float64 NumPy array over ``comm`` into a new array (inner products, bounds)."""
    result = numpy.empty_like(values)
    comm.Allreduce([values, MPI.DOUBLE], [result, MPI.DOUBLE], op)
    return result


def barrier(comm):
    comm.Barrier()


def agree(comm, who, local_error, meta):
    """Collective check that no rank has an error and all ranks' ``meta`` match.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    who : str
        Operator and direction for the message, e.g. ``"Transpose.forward"``.
    local_error : str or None
        This rank's own finding (already formatted), or ``None``.
    meta : tuple
        Picklable description that must be equal on every rank (the shape
        with the split axis masked, the dtype, ...).

    Raises
    ------
    ValueError
        The same message on every rank, listing each rank's error and the
        ranks whose metadata differ from rank 0's.
    """
    everyone = comm.allgather((local_error, meta))
    problems = [f"rank {r}: {err}" for r, (err, _) in enumerate(everyone) if err]
    reference = everyone[0][1]
    odd = [r for r, (_, m) in enumerate(everyone) if m != reference]
    if odd:
        problems.append("inputs disagree across ranks: rank 0 has " + _format_meta(reference) + "; "
                        + "; ".join(f"rank {r} has {_format_meta(everyone[r][1])}" for r in odd))
    if problems:
        raise ValueError(f"{who} (debug check over {comm.Get_size()} ranks): " + " | ".join(problems))


def _format_meta(meta):
    return ", ".join(str(m) for m in meta) if isinstance(meta, tuple) else str(meta)


# --- buffers ----------------------------------------------------------------

def _count_of(buf, count):
    if count is not None:
        return int(count)
    size = getattr(buf, "size", None)
    if size is not None:
        return int(size)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        n = 1
        for extent in cai["shape"]:
            n *= int(extent)
        return n
    raise TypeError(f"mpisphere: cannot tell the element count of {type(buf).__name__}; pass count=")


def _dtype_of(buf, dtype):
    if dtype is not None:
        return numpy.dtype(dtype)
    if hasattr(buf, "dtype"):
        return numpy.dtype(buf.dtype)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        return numpy.dtype(cai["typestr"])
    raise TypeError(f"mpisphere: cannot tell the dtype of {type(buf).__name__}; pass dtype=")


def _prepare(buf):
    """Make ``buf`` safe for MPI to touch now (stream rule of :mod:`mpisphere.backend`)."""
    if backend.is_device_array(buf):
        backend.synchronize(buf)
        return
    cai = getattr(buf, "__cuda_array_interface__", None)
    stream = cai.get("stream") if cai is not None else None
    if stream is not None:  # CAI v3: the consumer synchronises on the producer's stream
        cupy = backend.import_cupy()
        cupy.cuda.ExternalStream(int(stream)).synchronize()


class _Staged:
    """The buffers one MPI call sees: host stand-ins when staging is active.

    ``send`` buffers are copied to host on the way in; ``recv`` buffers are
    copied back to their arrays by :meth:`finish`. Host buffers come from the
    caller's workspace, so a call allocates nothing after the first.
    """

    __slots__ = ("comm", "workspace", "_back")

    def __init__(self, comm, workspace):
        self.comm = comm
        self.workspace = workspace if workspace is not None else backend.Workspace()
        self._back = []

    def send(self, name, buf, dtype, count):
        if buf is None:
            return None
        if not staging_active(buf, self.comm):
            _prepare(buf)
            return buf
        pinned = backend.is_device_array(buf)
        host = self.workspace.host(name, count, dtype, pinned)
        backend.copy_to_host(buf, host)
        return host

    def recv(self, name, buf, dtype, count):
        if buf is None:
            return None
        if not staging_active(buf, self.comm):
            _prepare(buf)  # pending kernels on this memory must finish before MPI writes it
            return buf
        pinned = backend.is_device_array(buf)
        host = self.workspace.host(name, count, dtype, pinned)
        self._back.append((name, host, buf, pinned))
        return host

    def finish(self):
        for name, host, buf, pinned in self._back:
            backend.copy_from_host(host, buf)
            self.workspace.guard(name, pinned, buf)
        self._back.clear()


# --- collectives ------------------------------------------------------------

def alltoallv(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, *, workspace=None):
    """``MPI_Alltoallv`` between flat arrays; counts and displacements in elements.

    With staging active the exchange is pipelined instead (see
    :func:`_alltoallv_staged`).
    """
    dtype = _dtype_of(send, None)
    datatype = mpi_type(dtype)
    if staging_active(send, comm) or staging_active(recv, comm):
        _alltoallv_staged(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, datatype,
                          workspace if workspace is not None else backend.Workspace())
        return
    _prepare(send)
    _prepare(recv)
    comm.Alltoallv([send, (send_counts, send_displs), datatype], [recv, (recv_counts, recv_displs), datatype])


# Tag of the point-to-point messages of a staged all-to-all. mpisphere's own
# communicators carry nothing else; on a user's communicator, avoid this tag
# for messages in flight across an mpisphere call.
STAGED_TAG = 0x6D73


def _alltoallv_staged(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, datatype,
                      workspace):
    """The all-to-all through host buffers, copies overlapped with messages.

    Every peer's block is queued for copy to the host at once, in the order
    the peers are served; each is sent as soon as its copy is done, while the
    later ones are still copying. Received blocks are queued for copy back as
    they arrive, while the others are still in flight. Point-to-point
    messages (``Isend``/``Irecv``, tag :data:`STAGED_TAG`) make this overlap
    possible where one ``MPI_Alltoallv`` call would not.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    pinned = backend.is_device_array(send) or backend.is_device_array(recv)
    send_total = max((d + c for d, c in zip(send_displs, send_counts)), default=0)
    recv_total = max((d + c for d, c in zip(recv_displs, recv_counts)), default=0)
    host_send = workspace.host("a2a-send", send_total, dtype, pinned)
    host_recv = workspace.host("a2a-recv", recv_total, dtype, pinned)
    order = [(rank + k) % size for k in range(size)]
    copies = {}
    for q in order:
        if send_counts[q]:
            block = slice(send_displs[q], send_displs[q] + send_counts[q])
            copies[q] = backend.copy_to_host(send[block], host_send[block], blocking=False)
    receives, sources = [], []
    for q in order:
        if recv_counts[q]:
            block = host_recv[recv_displs[q]:recv_displs[q] + recv_counts[q]]
            receives.append(comm.Irecv([block, datatype], source=q, tag=STAGED_TAG))
            sources.append(q)
    sends = []
    for q in order:
        if send_counts[q]:
            backend.wait(copies[q])
            block = host_send[send_displs[q]:send_displs[q] + send_counts[q]]
            sends.append(comm.Isend([block, datatype], dest=q, tag=STAGED_TAG))
    for _ in range(len(receives)):
        q = sources[MPI.Request.Waitany(receives)]
        block = slice(recv_displs[q], recv_displs[q] + recv_counts[q])
        backend.copy_from_host(host_recv[block], recv[block])
    MPI.Request.Waitall(sends)
    workspace.guard("a2a-recv", pinned, recv)


def allgatherv(comm, send, recv, counts, displs, *, workspace=None):
    """``MPI_Allgatherv``: flat ``send`` (this rank's block) into flat ``recv`` at ``displs``."""
    dtype = _dtype_of(send, None)
    datatype = mpi_type(dtype)
    staged = _Staged(comm, workspace)
    count = _count_of(send, None)
    s = staged.send("gather-send", send, dtype, count)
    r = staged.recv("gather-recv", recv, dtype, _count_of(recv, None))
    comm.Allgatherv([s, count, datatype], [r, (counts, displs), datatype])
    staged.finish()


def reduce_scatter(comm, send, recv, counts, op=MPI.SUM, *, workspace=None):
    """``MPI_Reduce_scatter`` with uneven ``counts`` (elements per rank, in rank order)."""
    dtype = _dtype_of(send, None)
    datatype = _reduction_type(dtype)
    staged = _Staged(comm, workspace)
    s = staged.send("rs-send", send, dtype, _count_of(send, None))
    r = staged.recv("rs-recv", recv, dtype, _count_of(recv, None))
    comm.Reduce_scatter([s, _count_of(send, None), datatype], [r, _count_of(recv, None), datatype],
                        list(counts), op)
    staged.finish()


def allreduce(comm, send, recv, op=MPI.SUM, *, dtype=None, count=None, workspace=None):
    """``MPI_Allreduce`` from ``send`` into ``recv`` (``send`` is never written).

    ``send`` and ``recv`` may be any buffers MPI accepts (NumPy, CuPy, objects
    with ``__dlpack__`` or ``__cuda_array_interface__``); ``dtype`` and
    ``count`` are needed only when they cannot be read off the objects.
    """
    dtype = _dtype_of(send, dtype)
    count = _count_of(send, count)
    datatype = _reduction_type(dtype)
    staged = _Staged(comm, workspace)
    s = staged.send("ar-send", send, dtype, count)
    r = staged.recv("ar-recv", recv, dtype, count)
    comm.Allreduce([s, count, datatype], [r, count, datatype], op)
    staged.finish()


def sendrecv(comm, send, dest, recv, source, *, sendtag=0, recvtag=0, workspace=None):
    """``MPI_Sendrecv`` of flat arrays; ``dest``/``source`` may be ``MPI.PROC_NULL``."""
    staged = _Staged(comm, workspace)
    send_dtype, recv_dtype = _dtype_of(send, None), _dtype_of(recv, None)
    send_count, recv_count = _count_of(send, None), _count_of(recv, None)
    message = [staged.send("sr-send", send, send_dtype, send_count), send_count, mpi_type(send_dtype)]
    target = [staged.recv("sr-recv", recv, recv_dtype, recv_count), recv_count, mpi_type(recv_dtype)]
    comm.Sendrecv(message, dest, sendtag, target, source, recvtag)
    staged.finish()


def exchange(comm, sends, recvs, *, workspace=None):
    """Point-to-point exchange: post every receive, then every send, wait for all.

    Parameters
    ----------
    sends : list of (array, dest, tag)
    recvs : list of (array, source, tag)
        Flat C-contiguous arrays; ``dest``/``source`` may be ``MPI.PROC_NULL``.
        All messages are in flight together (``Irecv``/``Isend``), so the
        exchanges of a halo phase overlap instead of running one by one.
    """
    staged = _Staged(comm, workspace)
    posted = []
    for i, (buf, source, tag) in enumerate(recvs):
        if source == MPI.PROC_NULL:
            continue
        dtype = _dtype_of(buf, None)
        host = staged.recv(f"x-recv{i}", buf, dtype, _count_of(buf, None))
        posted.append(comm.Irecv([host, mpi_type(dtype)], source=source, tag=tag))
    for i, (buf, dest, tag) in enumerate(sends):
        if dest == MPI.PROC_NULL:
            continue
        dtype = _dtype_of(buf, None)
        host = staged.send(f"x-send{i}", buf, dtype, _count_of(buf, None))
        posted.append(comm.Isend([host, mpi_type(dtype)], dest=dest, tag=tag))
    MPI.Request.Waitall(posted)
    staged.finish()


def scatterv(comm, send, counts, displs, recv, root=0):
    """``MPI_Scatterv`` from ``root``'s flat ``send`` (ignored elsewhere) into flat ``recv``."""
    dtype = _dtype_of(recv, None)
    datatype = mpi_type(dtype)
    staged = _Staged(comm, None)
    is_root = comm.Get_rank() == root
    r = staged.recv("scatter-recv", recv, dtype, _count_of(recv, None))
    spec = None
    if is_root:
        spec = [staged.send("scatter-send", send, dtype, _count_of(send, None)), (counts, displs), datatype]
    comm.Scatterv(spec, [r, _count_of(recv, None), datatype], root=root)
    staged.finish()


def gatherv(comm, send, recv, counts, displs, root=0):
    """``MPI_Gatherv`` of flat ``send`` into ``root``'s flat ``recv`` (ignored elsewhere)."""
    dtype = _dtype_of(send, None)
    datatype = mpi_type(dtype)
    staged = _Staged(comm, None)
    s = staged.send("gather-send", send, dtype, _count_of(send, None))
    spec = None
    if comm.Get_rank() == root:
        spec = [staged.recv("gather-recv", recv, dtype, _count_of(recv, None)), (counts, displs), datatype]
    comm.Gatherv([s, _count_of(send, None), datatype], spec, root=root)
    staged.finish()
