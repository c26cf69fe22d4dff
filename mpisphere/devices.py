"""Which GPU each rank uses: the node-local rank modulo the devices it sees.

Collective (a ``Split_type`` of the communicator, through
:mod:`mpisphere.collectives`); call it once, right after MPI starts.
"""

import os

from mpi4py import MPI

from . import backend, collectives

__all__ = ["select_device"]


def select_device(comm=None):
    """Choose and activate this rank's GPU: node-local rank modulo visible devices.

    Call it once, right after MPI starts and before any other CUDA work. It
    honours ``CUDA_VISIBLE_DEVICES`` (the ids are those CuPy sees), and
    several ranks sharing one GPU is fine (they get the same id).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Communicator whose ranks share out the devices; default
        ``MPI.COMM_WORLD``. Collective over it.

    Returns
    -------
    int
        The device id now current for CuPy.

    Raises
    ------
    RuntimeError
        If no CUDA device is visible (raised after the collective part, on
        every rank that sees none).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    local_rank, _ = collectives.node_local_rank(comm)
    count = backend.visible_device_count()
    if count == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise RuntimeError(
            "mpisphere.select_device: no CUDA device visible to this process"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
            + "; is CuPy installed with a matching driver?")
    device_id = local_rank % count
    cupy = backend.import_cupy()
    cupy.cuda.Device(device_id).use()
    return device_id
