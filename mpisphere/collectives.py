"""Typed wrappers that run one MPI call on arrays.

Every wrapper takes the communicator explicitly, takes flat C-contiguous
arrays (NumPy, CuPy, or any object exposing ``__dlpack__`` or
``__cuda_array_interface__`` together with an explicit ``dtype``), counts and
displacements in elements, and

* maps the dtype to an MPI datatype (float16 moves as 16-bit words and is
  never reduced: the operators sum it in float32);
* moves contiguous buffers only: with the pip MPICH, derived datatypes were
  measured slower than packing with NumPy (30x for an ``Allgatherv`` of
  strided columns, 3x for a halo column exchange), and MPICH refuses
  reductions on them;
* with ``staged=True`` (the caller's agreed decision: device buffers and an
  MPI that is not CUDA-aware, or ``config.force_staging``) moves the buffers
  through host memory (:mod:`mpisphere.staging`); otherwise synchronises the
  device stream before MPI touches a device buffer.

The decisions (staging, agreement) are made by the operators; nothing here
reads a setting or keeps state.
"""

import numpy
from mpi4py import MPI

from . import dtypes, staging

__all__ = [
    "mpi_type",
    "allgather_object",
    "bcast_object",
    "allreduce_floats",
    "allreduce_max_ints",
    "iallreduce_max_ints",
    "arrived",
    "isend_object",
    "receive_object",
    "receive_objects",
    "abort",
    "alltoallv",
    "ialltoallv",
    "allgatherv",
    "reduce_scatter",
    "allreduce",
    "sendrecv",
    "scatterv",
    "gatherv",
    "bcast_floats",
    "node_local_rank",
    "isend_bytes",
    "status",
    "improbe_bytes",
    "mrecv_bytes",
    "wait",
    "test",
    "waitall",
    "exchange_objects",
]


def mpi_type(dtype):
    """MPI datatype that moves elements of ``dtype`` (sizes in elements of it).

    Raises
    ------
    TypeError
        For a dtype with no MPI type here. The operators move only the dtypes
        of :data:`mpisphere.dtypes.SUPPORTED` (they check first); integers
        and booleans map too, for the library's own metadata.
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
    raise TypeError(f"mpisphere: no MPI type for dtype {dtype} (the operators move "
                    f"{', '.join(d.name for d in dtypes.SUPPORTED)})")


def _reduction_type(dtype):
    """The MPI type of a sum over ranks: dtypes.reduction_dtype says which dtypes are summed as they are."""
    dtype = numpy.dtype(dtype)
    if dtypes.reduction_dtype(dtype) != dtype:
        raise TypeError(f"mpisphere: {dtype.name} is summed in {dtypes.reduction_dtype(dtype).name}; convert "
                        "before the reduction")
    return mpi_type(dtype)


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


def node_local_rank(comm):
    """``(rank, size)`` of this process among the processes of ``comm`` on the same node.

    Collective over ``comm`` (``Split_type(COMM_TYPE_SHARED)``; the node's
    communicator is freed again).
    """
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def bcast_floats(comm, values, root=0):
    """``root``'s small float64 NumPy array on every rank, in place (one verdict for every rank)."""
    comm.Bcast([values, MPI.DOUBLE], root=root)
    return values


def exchange_objects(comm, partners, obj, tag):
    """Send ``obj`` (picklable) to every rank in ``partners`` and return ``{rank: their obj}`` (point to point)."""
    sends = [comm.isend(obj, dest=rank, tag=tag) for rank in partners]
    theirs = {rank: comm.recv(source=rank, tag=tag) for rank in partners}
    MPI.Request.Waitall(sends)
    return theirs


def allreduce_max_ints(comm, values):
    """Elementwise maximum over ``comm`` of a small int64 NumPy array, in place (the agreement step)."""
    comm.Allreduce(MPI.IN_PLACE, [values, MPI.INT64_T], MPI.MAX)
    return values


def iallreduce_max_ints(comm, values):
    """:func:`allreduce_max_ints` without blocking: returns the request (``values`` is written when it completes)."""
    return comm.Iallreduce(MPI.IN_PLACE, [values, MPI.INT64_T], MPI.MAX)


def isend_object(comm, obj, dest, tag):
    """Send ``obj`` (picklable, small) to ``dest`` without blocking; returns the request."""
    return comm.isend(obj, dest=dest, tag=tag)


def receive_object(comm, source, tag):
    """Receive one object (picklable) from ``source`` with ``tag`` (waits for it)."""
    return comm.recv(source=source, tag=tag)


def receive_objects(comm, tag):
    """Every message with ``tag`` that has arrived from any rank, ``[(source, obj)]`` (does not wait)."""
    found, status = [], MPI.Status()
    while comm.iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):
        source = status.Get_source()
        found.append((source, comm.recv(source=source, tag=tag)))
    return found


def abort(comm, code=1):
    """``MPI_Abort``: end every process of the job (a rank that never arrives cannot be recovered from)."""
    comm.Abort(code)


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


# --- collectives ------------------------------------------------------------

def alltoallv(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, *, staged=False,
              workspace=None):
    """``MPI_Alltoallv`` between flat arrays; counts and displacements in elements.

    Staged, the exchange is pipelined point-to-point instead
    (:func:`mpisphere.staging.alltoallv_pipelined`): every rank must stage.
    """
    datatype = mpi_type(_dtype_of(send, None))
    if staged:
        staging.alltoallv_pipelined(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                    datatype, workspace)
        return
    staging.prepare(send)
    staging.prepare(recv)
    comm.Alltoallv([send, (send_counts, send_displs), datatype], [recv, (recv_counts, recv_displs), datatype])


def ialltoallv(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs):
    """``MPI_Ialltoallv``: start the exchange, return its request (buffers must be host or CUDA-aware)."""
    datatype = mpi_type(_dtype_of(send, None))
    staging.prepare(send)
    staging.prepare(recv)
    return comm.Ialltoallv([send, (send_counts, send_displs), datatype],
                           [recv, (recv_counts, recv_displs), datatype])


def allgatherv(comm, send, recv, counts, displs, *, staged=False, workspace=None):
    """``MPI_Allgatherv``: flat ``send`` (this rank's block) into flat ``recv`` at ``displs``."""
    dtype = _dtype_of(send, None)
    datatype = mpi_type(dtype)
    stage = staging.HostStage(staged, workspace)
    count = _count_of(send, None)
    s = stage.send("gather-send", send, dtype, count)
    r = stage.recv("gather-recv", recv, dtype, _count_of(recv, None))
    comm.Allgatherv([s, count, datatype], [r, (counts, displs), datatype])
    stage.finish()


def reduce_scatter(comm, send, recv, counts, op=MPI.SUM, *, staged=False, workspace=None):
    """``MPI_Reduce_scatter`` with uneven ``counts`` (elements per rank, in rank order)."""
    dtype = _dtype_of(send, None)
    datatype = _reduction_type(dtype)
    stage = staging.HostStage(staged, workspace)
    s = stage.send("rs-send", send, dtype, _count_of(send, None))
    r = stage.recv("rs-recv", recv, dtype, _count_of(recv, None))
    comm.Reduce_scatter([s, _count_of(send, None), datatype], [r, _count_of(recv, None), datatype],
                        list(counts), op)
    stage.finish()


def allreduce(comm, send, recv, op=MPI.SUM, *, dtype=None, count=None, staged=False, workspace=None):
    """``MPI_Allreduce`` from ``send`` into ``recv`` (``send`` is never written).

    ``send`` and ``recv`` may be any buffers MPI accepts (NumPy, CuPy, objects
    with ``__dlpack__`` or ``__cuda_array_interface__``); ``dtype`` and
    ``count`` are needed only when they cannot be read off the objects.
    """
    dtype = _dtype_of(send, dtype)
    count = _count_of(send, count)
    datatype = _reduction_type(dtype)
    stage = staging.HostStage(staged, workspace)
    s = stage.send("ar-send", send, dtype, count)
    r = stage.recv("ar-recv", recv, dtype, count)
    comm.Allreduce([s, count, datatype], [r, count, datatype], op)
    stage.finish()


def sendrecv(comm, send, dest, recv, source, *, sendtag=0, recvtag=0, staged=False, workspace=None):
    """``MPI_Sendrecv`` of flat arrays; ``dest``/``source`` may be ``MPI.PROC_NULL``."""
    stage = staging.HostStage(staged, workspace)
    send_dtype, recv_dtype = _dtype_of(send, None), _dtype_of(recv, None)
    send_count, recv_count = _count_of(send, None), _count_of(recv, None)
    message = [stage.send("sr-send", send, send_dtype, send_count), send_count, mpi_type(send_dtype)]
    target = [stage.recv("sr-recv", recv, recv_dtype, recv_count), recv_count, mpi_type(recv_dtype)]
    comm.Sendrecv(message, dest, sendtag, target, source, recvtag)
    stage.finish()




def scatterv(comm, send, counts, displs, recv, root=0, *, staged=False):
    """``MPI_Scatterv`` from ``root``'s flat ``send`` (ignored elsewhere) into flat ``recv``."""
    dtype = _dtype_of(recv, None)
    datatype = mpi_type(dtype)
    stage = staging.HostStage(staged, None)
    is_root = comm.Get_rank() == root
    r = stage.recv("scatter-recv", recv, dtype, _count_of(recv, None))
    spec = None
    if is_root:
        spec = [stage.send("scatter-send", send, dtype, _count_of(send, None)), (counts, displs), datatype]
    comm.Scatterv(spec, [r, _count_of(recv, None), datatype], root=root)
    stage.finish()


def gatherv(comm, send, recv, counts, displs, root=0, *, staged=False):
    """``MPI_Gatherv`` of flat ``send`` into ``root``'s flat ``recv`` (ignored elsewhere)."""
    dtype = _dtype_of(send, None)
    datatype = mpi_type(dtype)
    stage = staging.HostStage(staged, None)
    s = stage.send("gather-send", send, dtype, _count_of(send, None))
    spec = None
    if comm.Get_rank() == root:
        spec = [stage.recv("gather-recv", recv, dtype, _count_of(recv, None)), (counts, displs), datatype]
    comm.Gatherv([s, _count_of(send, None), datatype], spec, root=root)
    stage.finish()


# --- point to point, non-blocking ---------------------------------------------


def isend_bytes(comm, buf, dest, tag):
    """``MPI_Isend`` of a flat contiguous array as bytes (host, or device with a CUDA-aware MPI)."""
    staging.prepare(buf)
    return comm.Isend([buf, int(buf.size) * numpy.dtype(buf.dtype).itemsize, MPI.BYTE], dest=dest, tag=tag)


def send_init_bytes(comm, buf, dest, tag):
    """``MPI_Send_init``: a persistent send of a flat contiguous host array as bytes (start it with ``Start``)."""
    return comm.Send_init([buf, int(buf.size) * numpy.dtype(buf.dtype).itemsize, MPI.BYTE], dest=dest, tag=tag)


def free_requests(requests):
    """``MPI_Request_free`` of inactive persistent requests (nothing once MPI is finalized)."""
    if MPI.Is_finalized():
        return
    for request in requests:
        request.Free()


def start(request):
    """``MPI_Start`` of an inactive persistent request."""
    request.Start()


# --- memory shared on a node (MPI-3 windows) ------------------------------------


def split_shared(comm):
    """``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``: the ranks of ``comm`` that share this node's memory."""
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def ranks_in(group_of, comm):
    """The ranks in ``comm`` of the ranks ``0 .. n-1`` of the communicator ``group_of``."""
    ranks = MPI.Group.Translate_ranks(group_of.Get_group(), list(range(group_of.Get_size())), comm.Get_group())
    return [int(r) for r in ranks]


def allocate_shared(nbytes, node):
    """``MPI_Win_allocate_shared`` of ``nbytes`` on each rank of ``node``, each segment on its own pages.

    The window is returned inside a shared lock epoch of every rank
    (``MPI_Win_lock_all``), so that :func:`window_sync` may be called on it.
    """
    info = MPI.Info.Create()
    info.Set("alloc_shared_noncontig", "true")  # each rank's segment on its own pages (first touch: its NUMA node)
    try:
        window = MPI.Win.Allocate_shared(max(int(nbytes), 1), 1, info, node)
    finally:
        info.Free()
    window.Lock_all(MPI.MODE_NOCHECK)
    return window


def shared_segment(window, node_rank):
    """``MPI_Win_shared_query``: the segment of rank ``node_rank`` of ``window`` as a NumPy uint8 array."""
    buf, _ = window.Shared_query(node_rank)
    return numpy.frombuffer(buf, numpy.uint8)


def window_sync(window):
    """``MPI_Win_sync``: a memory barrier for the window's memory (writes before, reads after)."""
    window.Sync()


def free_window(window):
    """End the lock epoch of :func:`allocate_shared` and free the window (collective)."""
    if MPI.Is_finalized():
        return
    window.Unlock_all()
    window.Free()


def free_comm(comm):
    """``MPI_Comm_free`` (collective; nothing once MPI is finalized)."""
    if not MPI.Is_finalized():
        comm.Free()


def status():
    """An ``MPI_Status`` to reuse across probes."""
    return MPI.Status()


def improbe_bytes(comm, source, tag, status):
    """``MPI_Improbe``: ``(message, its size in bytes)`` if one from ``source`` with ``tag`` is there.

    ``(None, 0)`` otherwise. A message found is matched (no later receive can
    take it): receive it with :func:`mrecv_bytes`.
    """
    message = comm.Improbe(source, tag, status)
    if message is None:
        return None, 0
    return message, status.Get_count(MPI.BYTE)


def arrived(comm, source, tag):
    """``MPI_Iprobe``: whether a message from ``source`` with ``tag`` is there (it stays there, unmatched)."""
    return comm.Iprobe(source=source, tag=tag)


def mrecv_bytes(message, buf, nbytes):
    """``MPI_Mrecv`` of a probed message of ``nbytes`` bytes into the start of the flat array ``buf``."""
    message.Recv([buf, int(nbytes), MPI.BYTE])


def wait(request):
    """``MPI_Wait``."""
    request.Wait()


def test(request):
    """``MPI_Test``: whether the request has completed."""
    return request.Test()


def waitall(requests):
    """``MPI_Waitall``."""
    MPI.Request.Waitall(requests)
