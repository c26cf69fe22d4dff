"""Host staging of device buffers for an MPI library that is not CUDA-aware.

When MPI cannot read device memory, a call's device buffers are copied to
page-locked (pinned) host buffers, MPI runs on those, and the received data
is copied back. ``HostStage`` does that for one call, with host
buffers kept in the caller's ``mpisphere.backend.Workspace`` (nothing
is allocated after the first call). ``alltoallv_pipelined`` is the
all-to-all through host memory with the copies overlapped with the
messages.

Whether a call is staged is decided by the operator that makes it (agreed
across ranks, see :mod:`mpisphere.operators`); :mod:`mpisphere.collectives`
passes its ``staged`` flag here. With ``mpisphere.config.force_staging``
NumPy buffers take this path too (a testing aid: identical results).
"""

import numpy
from mpi4py import MPI

from . import backend

__all__ = ["HostStage", "alltoallv_pipelined", "STAGED_TAG", "prepare"]

# Tag of the point-to-point messages of a staged all-to-all. mpisphere's own
# communicators carry nothing else; on a user's communicator, avoid this tag
# for messages in flight across an mpisphere call.
STAGED_TAG = 0x6D73


def prepare(buf):
    """Make ``buf`` safe for MPI to touch now (the stream rule of :mod:`mpisphere.backend`)."""
    if backend.is_device_array(buf):
        backend.synchronize(buf)
        return
    cai = getattr(buf, "__cuda_array_interface__", None)
    stream = cai.get("stream") if cai is not None else None
    if stream is not None:  # CAI v3: the consumer synchronises on the producer's stream
        cupy = backend.import_cupy()
        cupy.cuda.ExternalStream(int(stream)).synchronize()


class HostStage:
    """The buffers one MPI call sees: host stand-ins when ``staged``.

    ``send`` buffers are copied to the host on the way in; ``recv`` buffers
    are copied back to their arrays by :meth:`finish`. Objects that are
    neither NumPy nor CuPy arrays (anything exposing ``__dlpack__`` or
    ``__cuda_array_interface__``) are always handed to MPI as they are.
    """

    __slots__ = ("staged", "workspace", "_back")

    def __init__(self, staged, workspace):
        self.staged = staged
        self.workspace = workspace if workspace is not None else backend.Workspace()
        self._back = []

    def _stages(self, buf):
        return self.staged and (backend.is_device_array(buf) or isinstance(buf, numpy.ndarray))

    def send(self, name, buf, dtype, count):
        if buf is None:
            return None
        if not self._stages(buf):
            prepare(buf)
            return buf
        pinned = backend.is_device_array(buf)
        host = self.workspace.host(name, count, dtype, pinned)
        backend.copy_to_host(buf, host)
        return host

    def recv(self, name, buf, dtype, count):
        if buf is None:
            return None
        if not self._stages(buf):
            prepare(buf)  # pending kernels on this memory must finish before MPI writes it
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


def alltoallv_pipelined(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, datatype,
                        workspace):
    """The all-to-all through host buffers, copies overlapped with messages.

    Every peer's block is queued for copy to the host at once, in the order
    the peers are served; each is sent as soon as its copy is done, while the
    later ones are still copying. Received blocks are queued for copy back as
    they arrive, while the others are still in flight. Point-to-point
    messages (``Isend``/``Irecv``, tag :data:`STAGED_TAG`) make this overlap
    possible where one ``MPI_Alltoallv`` call would not. Every rank of the
    call must take this path (the operators agree on it).
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    dtype = numpy.dtype(send.dtype)
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
