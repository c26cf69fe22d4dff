"""Which array library a buffer belongs to, and how it is handed to MPI.

mpisphere works on NumPy arrays (host memory) and CuPy arrays (device
memory) through the same code. This module answers the questions that
differ between the two:

* which module allocates outputs and scratch (``array_module``);
* on which device (``device_of``);
* how device work is ordered against MPI (the stream rule below);
* how host staging buffers are kept and reused (``Workspace``);
* how many GPUs this process sees (``visible_device_count``; which one
  a rank uses is ``mpisphere.devices.select_device``).

CuPy is never imported here unless the caller already holds a CuPy array or
asks for a device explicitly.

Stream rule
-----------
MPI knows nothing of CUDA streams: it reads a device buffer the moment it is
called and has written its receive buffers when it returns. CuPy orders work
by stream: a kernel sees what earlier work *on its stream* wrote. So

1. before a device buffer is handed to MPI, the kernels that produced it
   must have finished: ``synchronize`` waits for the *current* CuPy
   stream of the buffer's device (not the whole device). Work that produced
   the buffer on another stream is the caller's to order (as with any CuPy
   code that mixes streams);
2. after MPI returns, its receive buffers hold the data, and kernels queued
   afterwards on any stream see it: nothing more to do;
3. with host staging, device-to-host copies run on the current stream and
   are waited for before MPI reads the host buffer; host-to-device copies are
   queued on the current stream, so later kernels on it see the data, and a
   CUDA event recorded after them guards the pinned buffer against being
   overwritten before the copy has read it (``Workspace.guard``; every
   pinned buffer that a copy to the device reads is guarded so);
4. an operator's result is ordered on the stream that was current when it
   was called, like the result of any CuPy function: work queued later on
   that stream sees it, and work on another stream must wait for it first
   (``other.wait_event(stream.record())``, or ``stream.synchronize()``);
5. device memory an operator keeps across calls (its workspaces, plans and
   uploaded constants) is safe to use from any stream: a buffer used last on
   another stream makes the current stream wait for that stream's work
   first (``StreamOrder``, an event, no host synchronisation), and a
   constant is uploaded with a synchronisation, once.
"""

import contextlib
import sys

import numpy

from .settings import config

__all__ = [
    "is_array",
    "shares_memory",
    "is_writeable",
    "copy_into",
    "array_module",
    "is_device_array",
    "device_of",
    "synchronize",
    "Workspace",
    "StreamOrder",
    "BoundedCache",
    "device_kernels",
    "import_cupy",
    "copy_to_host",
    "copy_from_host",
    "wait",
]


def _is_cupy_array(a):
    return type(a).__module__.split(".", 1)[0] == "cupy"


def is_device_array(a):
    """True for a CuPy array (device memory), False for anything else."""
    return _is_cupy_array(a)


def import_cupy():
    """Import CuPy, or raise an ImportError that says how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(
            "mpisphere: CuPy is not installed; install it with the extra that matches "
            "your CUDA toolkit, e.g. pip install '.[cuda12]' in the mpisphere clone") from exc
    return cupy


def is_array(a):
    """True for a NumPy or CuPy array (the inputs operators accept)."""
    return isinstance(a, numpy.ndarray) or _is_cupy_array(a)


def shares_memory(a, b):
    """Whether arrays ``a`` and ``b`` overlap in memory.

    Exact for NumPy arrays (interleaved views that touch no common element
    do not overlap); a problem too hard to solve exactly counts as overlap.
    For CuPy arrays, CuPy's bounds check (conservative: any overlap of the
    address ranges counts).
    """
    if _is_cupy_array(a) or _is_cupy_array(b):
        if not (_is_cupy_array(a) and _is_cupy_array(b)):
            return False
        return bool(sys.modules["cupy"].may_share_memory(a, b))
    try:
        return bool(numpy.shares_memory(a, b, max_work=100_000))
    except numpy.exceptions.TooHardError:
        return True


def data_address(a):
    """The address of ``a``'s first element (host or device memory)."""
    return a.data.ptr if _is_cupy_array(a) else a.__array_interface__["data"][0]


def as_strided(a, shape, strides):
    """A view of ``a``'s memory with ``shape`` and byte ``strides``; the caller vouches for the extent."""
    return array_module(a).lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


def is_writeable(a):
    """False for a read-only NumPy array (a CuPy array is always writeable)."""
    flags = getattr(a, "flags", None)
    return True if flags is None or _is_cupy_array(a) else bool(flags.writeable)


def copy_into(dst, src):
    """``dst[...] = src`` for arrays whose memory layouts differ, a cache-sized piece at a time.

    A whole-array copy between transposed layouts streams through memory
    with a large stride on one side. On the host this copies slabs along the
    axis that is outer in both layouts (the largest of the two strides' minimum), about
    256 KiB a slab: each slab is a small transpose that stays in cache (2.5x
    faster than one copy for ``(L, m, B) -> (B, L, m)`` at the sizes of a
    transform). On a device, one kernel.
    """
    if device_kernels(dst) or dst.ndim < 2 or dst.size < 1 << 15 or dst.strides == src.strides:
        dst[...] = src
        return
    axis = max(range(dst.ndim), key=lambda i: min(abs(dst.strides[i]), abs(src.strides[i]))
               if dst.shape[i] > 1 else -1)
    step = max(1, (1 << 18) * dst.shape[axis] // max(dst.nbytes, 1))
    index = [slice(None)] * dst.ndim
    for k in range(0, dst.shape[axis], step):
        index[axis] = slice(k, k + step)
        dst[tuple(index)] = src[tuple(index)]


def array_module(*arrays):
    """The array module (``numpy`` or ``cupy``) that all ``arrays`` belong to.

    ``None`` entries are ignored; anything that is not a CuPy array counts as
    NumPy (it is converted with ``numpy.asarray`` where an array is needed).

    Raises
    ------
    TypeError
        If NumPy and CuPy arrays are mixed in one call; the message names the
        position and type of one of each.
    """
    host = device = None
    for index, a in enumerate(arrays):
        if a is None:
            continue
        if _is_cupy_array(a):
            device = device or (index, a)
        else:
            host = host or (index, a)
    if host is not None and device is not None:
        raise TypeError(
            f"mpisphere: cannot mix host and device arrays in one call: argument {host[0]} is "
            f"{type(host[1]).__module__}.{type(host[1]).__name__}, argument {device[0]} is "
            f"cupy.{type(device[1]).__name__}; move one of them (cupy.asarray / cupy.asnumpy)")
    if device is not None:
        return sys.modules["cupy"]
    return numpy


def device_of(a):
    """Context manager that makes ``a``'s device current (a no-op for host arrays)."""
    if _is_cupy_array(a):
        return a.device
    return contextlib.nullcontext()


def on_device_of(like, host, cache, key=None):
    """``host`` (a NumPy array, or a tuple of them) where ``like`` lives: itself for host arrays.

    For a device array, a copy on ``like``'s device, made once and kept in
    ``cache`` (an operator's own dict) under ``(key, device id)``: the
    constant arrays of an operator (weights, coefficients, indices) are
    uploaded once per device, not once per call.
    """
    if not _is_cupy_array(like):
        return host
    slot = (key, like.device.id)
    if slot not in cache:
        with like.device:
            cupy = sys.modules["cupy"]
            uploaded = tuple(cupy.asarray(h) for h in host) if isinstance(host, tuple) else cupy.asarray(host)
            # rule 5: a later call on another stream reads the constant without waiting for this one
            cupy.cuda.get_current_stream().synchronize()
            cache[slot] = uploaded
    return cache[slot]


def device_kernels(a):
    """Whether work on ``a`` takes the kernels written for devices (few large launches, no host loops).

    True for CuPy arrays. For NumPy arrays only under the testing aid
    ``mpisphere.config.device_kernels``, which runs the device algorithms
    on the host so that a machine without a GPU can check them (their
    results and how many operations a call issues).
    """
    if _is_cupy_array(a):
        return True
    return config.device_kernels


def synchronize(a):
    """Wait until the current stream of ``a``'s device has produced ``a``.

    A no-op for host arrays. See the stream rule in the module docstring.
    """
    if _is_cupy_array(a):
        cupy = sys.modules["cupy"]
        with a.device:
            cupy.cuda.get_current_stream().synchronize()


class BoundedCache:
    """At most ``size`` entries, the oldest dropped first: an operator's plans, keyed by shape and dtype.

    The one cache of mpisphere (the architecture test refuses hand-written
    ones): plans hold buffers, so a caller that cycles through many shapes
    keeps only the last ``size`` of them.
    """

    __slots__ = ("size", "_items", "_drop")

    def __init__(self, size, drop=None):
        self.size = int(size)
        self._items = {}
        self._drop = drop  # called with each entry that leaves the cache (e.g. to free its MPI requests)

    def get(self, key, build):
        """The entry for ``key``, built by ``build()`` (and the oldest entry dropped) when it is missing."""
        found = self._items.get(key)
        if found is None:
            while len(self._items) >= self.size:
                self._release(self._items.pop(next(iter(self._items))))
            found = self._items[key] = build()
        return found

    def _release(self, entry):
        if self._drop is not None:
            self._drop(entry)

    def clear(self):
        entries = list(self._items.values())
        self._items.clear()
        for entry in entries:
            self._release(entry)

    def values(self):
        """The entries, oldest first."""
        return list(self._items.values())

    def __len__(self):
        return len(self._items)

    def __contains__(self, key):
        return key in self._items


class StreamOrder:
    """Orders the reuse of device memory kept across calls between CUDA streams (rule 5 of the stream rule).

    :meth:`claim` is called each time such memory is about to be used: if it
    was used last on another stream of that device, the current stream waits
    (on the GPU, through an event) for everything queued on that stream so
    far, so a kernel of this call cannot overwrite what a kernel of an
    earlier call, on another stream, still reads or writes. A no-op for host
    memory and while the stream stays the same.
    """

    __slots__ = ("_last",)

    def __init__(self):
        self._last = {}

    def claim(self, like):
        """Order the current stream of ``like``'s device after the stream that used the memory last."""
        if not _is_cupy_array(like):
            return
        cupy = sys.modules["cupy"]
        with like.device:
            stream = cupy.cuda.get_current_stream()
            last = self._last.get(like.device.id)
            if last is not None and last.ptr != stream.ptr:
                stream.wait_event(last.record())
            self._last[like.device.id] = stream


class Workspace:
    """Scratch buffers owned by one operator and reused across its calls.

    A buffer is identified by a name (``"send"``, ``"recv"``, ...). It is
    allocated the first time it is asked for and grows when a larger one is
    needed, so memory is bounded by the largest shape an operator has seen,
    never by the number of calls. Outputs handed to the caller are never taken
    from here. A device buffer asked for on another stream than the one that
    used it last is ordered after that stream's work (``StreamOrder``).

    A workspace belongs to one operator and is not meant to be shared between
    threads.
    """

    __slots__ = ("_buffers", "_events", "_streams")

    def __init__(self):
        self._buffers = {}
        self._events = {}
        self._streams = StreamOrder()

    def _lookup(self, key, xp, count, dtype, allocate):
        buf = self._buffers.get(key)
        if buf is None or buf.dtype != dtype or buf.size < count:
            buf = None
            self._buffers.pop(key, None)  # release the old one before allocating
            buf = allocate(max(count, 1), dtype)
            self._buffers[key] = buf
        return buf[:count]

    def scratch(self, name, like, count, dtype=None):
        """A 1-D scratch array of ``count`` elements in ``like``'s module and device."""
        dtype = numpy.dtype(like.dtype if dtype is None else dtype)
        if _is_cupy_array(like):
            cupy = sys.modules["cupy"]
            key = (name, "device", like.device.id)
            with like.device:
                self._streams.claim(like)
                return self._lookup(key, cupy, count, dtype, lambda n, dt: cupy.empty(n, dt))
        key = (name, "host")
        return self._lookup(key, numpy, count, dtype, lambda n, dt: numpy.empty(n, dt))

    def host(self, name, count, dtype, pinned):
        """A 1-D host array for staging, page-locked (pinned) when ``pinned``.

        If a host-to-device copy from this buffer is still queued (see
        :meth:`guard`), waits for it first so the buffer can be overwritten.
        """
        dtype = numpy.dtype(dtype)
        key = (name, "pinned" if pinned else "pageable")
        event = self._events.pop(key, None)
        if event is not None:
            event.synchronize()
        if pinned:
            cupyx = _import_cupyx()
            return self._lookup(key, numpy, count, dtype, lambda n, dt: cupyx.empty_pinned(n, dt))
        return self._lookup(key, numpy, count, dtype, lambda n, dt: numpy.empty(n, dt))

    def guard(self, name, pinned, device_array):
        """Record that a copy from host buffer ``name`` to ``device_array`` is queued (on the current stream)."""
        if pinned and _is_cupy_array(device_array):
            cupy = sys.modules["cupy"]
            with device_array.device:
                event = cupy.cuda.Event(block=False, disable_timing=True)
                event.record()
            self._events[(name, "pinned")] = event

    def nbytes(self):
        """Total bytes held, for tests and memory reports."""
        return sum(int(b.nbytes) for b in self._buffers.values())

    def clear(self):
        """Drop every buffer (they are allocated again on the next call)."""
        for event in self._events.values():
            event.synchronize()
        self._events.clear()
        self._buffers.clear()


def _import_cupyx():
    import_cupy()
    import cupyx
    return cupyx


def to_host(a):
    """``a`` as a NumPy array: itself for anything NumPy takes, a copy for a CuPy array (which waits for it)."""
    return numpy.asarray(a) if not _is_cupy_array(a) else sys.modules["cupy"].asnumpy(a)


def copy_to_host(src, dst, blocking=True):
    """Copy array ``src`` (host or device) into the 1-D host array ``dst``.

    ``dst`` must have ``src.size`` elements of ``src.dtype``. A device copy
    runs on the current stream; with ``blocking=False`` it is only queued and
    the returned CUDA event tells when it is done (see :func:`wait`). Host
    copies happen at once and return ``None``.
    """
    if _is_cupy_array(src):
        cupy = sys.modules["cupy"]
        with src.device:
            src.reshape(-1).get(out=dst, blocking=blocking)
            if blocking:
                return None
            event = cupy.cuda.Event(block=False, disable_timing=True)
            event.record()
            return event
    numpy.copyto(dst, numpy.asarray(src).reshape(-1))
    return None


def wait(event):
    """Block until ``event`` (from :func:`copy_to_host`) has happened; ``None`` is a no-op."""
    if event is not None:
        event.synchronize()


def copy_from_host(src, dst):
    """Copy the 1-D host array ``src`` into ``dst`` (host or device, C-contiguous).

    For a device ``dst`` the copy is queued on the current stream and the
    call returns at once (see the stream rule).
    """
    if _is_cupy_array(dst):
        with dst.device:
            dst.reshape(-1).set(src)
    else:
        numpy.copyto(dst.reshape(-1), src)


def visible_device_count():
    """Number of CUDA devices this process can see (0 without CuPy or a driver)."""
    try:
        cupy = import_cupy()
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # ImportError, CUDARuntimeError (no driver), ...
        return 0
