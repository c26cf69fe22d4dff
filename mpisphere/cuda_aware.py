"""Is the MPI library able to read and write device (CUDA) buffers?

No MPI API answers this portably, so the local verdict is assembled from
several sources, the first definite answer winning:

1. the override: ``mpisphere.config.cuda_aware`` (``True``/``False``), which
   ``MPISPHERE_CUDA_AWARE=0|1`` sets at import;
2. the MPI-4.1 info key ``mpi_memory_alloc_kinds`` on ``COMM_WORLD``, when it
   lists ``cuda:device`` (its absence proves nothing: kinds not requested at
   start-up need not be listed);
3. the MPIX extensions exported by the MPI library mpi4py loaded:
   ``MPIX_GPU_query_support`` (MPICH, Cray MPICH) and
   ``MPIX_Query_cuda_support`` (Open MPI, MPICH), called through ctypes;
4. vendor switches: Cray MPICH with ``MPICH_GPU_SUPPORT_ENABLED=1`` and its
   GTL library loaded, MVAPICH2 ``MV2_USE_CUDA=1``, Intel MPI
   ``I_MPI_OFFLOAD=1``;
5. otherwise: not CUDA-aware (stage through host memory; always safe).

This module is the one home of the decision: detection
(``local_verdict``, remembered per process by ``detect``), the
override, the agreement over a communicator (``decide``), the
description of the path (``describe_path``) and ``reset`` for
tests. Operators need no separate call: every operator call that carries
device buffers agrees on the answer as part of its agreement step (one more
integer in the same reduction), so all ranks take the same path.
"""

import ctypes
import functools
import os

from .settings import config

__all__ = ["mpi_library_path", "local_verdict", "detect", "verdict", "decide", "describe_path", "reset"]

# MPIX_GPU_SUPPORT_CUDA in MPICH's mpi_proto.h
_MPIX_GPU_SUPPORT_CUDA = 0


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def mpi_library_path():
    """Path of the MPI shared library that mpi4py loaded, or ``None`` if unknown."""
    from mpi4py import MPI
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
        dladdr.restype = ctypes.c_int
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        symbol = ctypes.CDLL(MPI.__file__).MPI_Init
        info = _DlInfo()
        if not dladdr(ctypes.cast(symbol, ctypes.c_void_p), ctypes.byref(info)):
            return None
        return os.fsdecode(info.dli_fname)
    except (OSError, AttributeError):
        return None


def _query_info_key():
    from mpi4py import MPI
    try:
        info = MPI.COMM_WORLD.Get_info()
    except MPI.Exception:
        return None, "COMM_WORLD info not available"
    try:
        kinds = info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()
    if kinds is None:
        return None, "info key mpi_memory_alloc_kinds not set"
    listed = [k.strip() for k in kinds.split(",")]
    if "cuda:device" in listed or "cuda" in listed:
        return True, f"MPI info key mpi_memory_alloc_kinds={kinds!r} lists cuda:device"
    return None, f"MPI info key mpi_memory_alloc_kinds={kinds!r} (no cuda:device)"


def _query_mpix(path):
    if path is None:
        return None, "MPI library path unknown"
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        return None, f"cannot open {path}: {exc}"
    query = getattr(lib, "MPIX_GPU_query_support", None)
    if query is not None:
        query.restype = ctypes.c_int
        query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        ok = ctypes.c_int(0)
        if query(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(ok)) == 0:
            return bool(ok.value), f"MPIX_GPU_query_support(CUDA) = {ok.value} in {path}"
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype = ctypes.c_int
        query.argtypes = []
        value = query()
        return bool(value), f"MPIX_Query_cuda_support() = {value} in {path}"
    return None, f"no MPIX CUDA query in {path}"


def _loaded_libraries():
    try:
        with open("/proc/self/maps") as maps:
            return maps.read()
    except OSError:
        return ""


def _query_vendor_switches(environ):
    if environ.get("MPICH_GPU_SUPPORT_ENABLED") == "1":
        if "libmpi_gtl_cuda" in _loaded_libraries():
            return True, "MPICH_GPU_SUPPORT_ENABLED=1 with libmpi_gtl_cuda loaded (Cray MPICH)"
        return False, ("MPICH_GPU_SUPPORT_ENABLED=1 but libmpi_gtl_cuda is not loaded "
                       "(Cray MPICH would crash on device buffers)")
    if environ.get("MV2_USE_CUDA") == "1":
        return True, "MV2_USE_CUDA=1 (MVAPICH2)"
    if environ.get("I_MPI_OFFLOAD") == "1":
        return True, "I_MPI_OFFLOAD=1 (Intel MPI)"
    return None, "no vendor switch set"


def local_verdict(override=None, environ=None, library_path=None):
    """This process's own answer, without communication.

    Parameters
    ----------
    override : bool or None
        ``mpisphere.config.cuda_aware``; a bool is taken as it is.
    environ : mapping, optional
        Environment to read the vendor switches from (default ``os.environ``).
    library_path : str, optional
        MPI library to query (default: the one mpi4py loaded).

    Returns
    -------
    (bool, str)
        The verdict and the source it came from, for logs and
        ``python -m mpisphere diagnose``.
    """
    if override is not None:
        return bool(override), f"override (mpisphere.config.cuda_aware / MPISPHERE_CUDA_AWARE) = {int(bool(override))}"
    environ = os.environ if environ is None else environ
    notes = []
    value, note = _query_info_key()
    if value is not None:
        return value, note
    notes.append(note)
    value, note = _query_mpix(mpi_library_path() if library_path is None else library_path)
    if value is not None:
        return value, note
    notes.append(note)
    value, note = _query_vendor_switches(environ)
    if value is not None:
        return value, note
    notes.append(note)
    return False, "no evidence of CUDA support (" + "; ".join(notes) + "): staging through host memory"


@functools.cache
def detect():
    """This process's detected verdict (no override), computed once and remembered.

    The MPI library cannot change while a process runs, so the answer is
    kept; ``reset`` forgets it (tests, or after changing the environment).
    """
    return local_verdict(None)


def verdict():
    """This rank's answer now: the override of ``mpisphere.config.cuda_aware`` if set, else ``detect``."""
    if config.cuda_aware is not None:
        return local_verdict(config.cuda_aware)
    return detect()


def decide(comm):
    """The answer agreed over ``comm`` (logical AND of every rank's :func:`verdict`).

    Collective over ``comm``. Returns ``(bool, source)``; when this rank said
    yes but another said no, the source says so.
    """
    aware, source = verdict()
    if comm.Get_size() > 1:
        from mpi4py import MPI
        agreed = comm.allreduce(bool(aware), op=MPI.LAND)
        if agreed != aware:
            source = f"another rank found no CUDA support (this rank: {source})"
        aware = agreed
    return bool(aware), source


def describe_path(aware, source, force_staging=False):
    """One line naming the path device buffers take, and why."""
    path = ("device buffers straight to MPI (CUDA-aware)" if aware
            else "device buffers staged through pinned host memory")
    if force_staging:
        path += "; force_staging on: every buffer staged"
    return f"{path} [{source}]"


def reset():
    """Forget the detected verdict, so that the next call of ``detect`` looks again."""
    detect.cache_clear()
