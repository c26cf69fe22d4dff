"""The halo's message path and its copies: the packed buffers of one padded shape, persistent sends, copies by runs.

A ``MessagePlan`` is built once per padded shape, dtype and device:
one message buffer per tag and direction (the data of a block, with room
for the agreement header in front) and, for host buffers, a persistent send
request per tag (``MPI_Send_init``), started in every call. Receives stay
matched probes (``MPI_Improbe`` / ``MPI_Mrecv``): a persistent receive of a
fixed size would truncate a neighbour's message of another size, an error
that MPI raises on one rank only, where a probe sees the size and the
header decides.

Packing and unpacking are one vectorised copy per block, by contiguous
runs where the layout allows (about twice as fast as element by element for
the thin column blocks of a halo); the shared-memory path copies and adds
between two ranks' tiles the same way (``copier``, ``unpacker``,
``between_adder``). Each is made once as a function of no arguments (a
planned call keeps them); ``add_runs`` and ``copy_runs`` make and run one.
"""

import functools
import math

import numpy

from .. import backend, collectives
from .round import message_buffer

__all__ = ["MessagePlan", "copy_runs", "add_runs", "adder", "copier", "packer", "unpacker", "zeroer",
           "between_adder"]


class MessagePlan:
    """The packed buffers of one padded shape, and their persistent sends, built once.

    ``outgoing[tag]`` and ``incoming[tag]`` are ``(message, data)``: a
    :func:`~mpisphere.agreement.message_buffer` and the view of its data
    as the block's shape, or ``(None, None)`` for a block of zero width (the
    message is a header alone). The buffers are kept across calls:
    :meth:`claim` orders their reuse after another CUDA stream's work.
    """

    def __init__(self, P, pattern, h, w, comm):
        lead = tuple(P.shape[:-2])
        self.outgoing, self.incoming = {}, {}
        for phase in pattern.phases(h, w, gather=True):
            for move in phase:
                rows, cols = move.send
                shape = lead + (rows.stop - rows.start, cols.stop - cols.start)
                empty = math.prod(shape) == 0
                self.outgoing[move.tag] = (None, None) if empty else message_buffer(P, shape, P.dtype)
                self.incoming[move.tag] = (None, None) if empty else message_buffer(P, shape, P.dtype)
        self._comm = comm
        self._requests = {}
        self._host = isinstance(P, numpy.ndarray)
        self._streams = backend.StreamOrder()
        self._array, self._copies = None, {}
        self.freed = False

    def claim(self, P):
        """Ready the buffers for a call on ``P`` (on a device: after the last call's stream, see the stream rule).

        The copies between ``P`` and the buffers are planned for the last array the plan served (a model calls
        its halo on the same padded array step after step): the views are made once, not in every call. The
        plan then keeps that array referenced until it serves another or is dropped.
        """
        self._streams.claim(P)
        if self._array is not P:
            self._array, self._copies = P, {}
        return self

    def pack(self, tag, region):
        """Copy ``P[region]`` into the outgoing buffer of ``tag`` (``P``: the claimed array)."""
        # keyed by the region too: update and accumulate send different blocks of one array with the same tag
        key = (tag, True, region[0].start, region[1].start)
        copy = self._copies.get(key)
        if copy is None:
            copy = self._copies[key] = packer(self._array, region, self.outgoing[tag][1])
        copy()

    def unpack(self, tag, region):
        """Copy the incoming buffer of ``tag`` into ``P[region]`` (``P``: the claimed array)."""
        key = (tag, False, region[0].start, region[1].start)
        copy = self._copies.get(key)
        if copy is None:
            copy = self._copies[key] = unpacker(self._array, region, self.incoming[tag][1])
        copy()

    def request(self, tag, dest, epoch=0):
        """The persistent send of ``outgoing[tag]`` to ``dest`` with the wire tag ``tag + epoch`` (the round's
        ``halo.round.epoch_of``; host buffers only, ``None`` otherwise)."""
        message = self.outgoing[tag][0]
        if message is None or not self._host:
            return None
        found = self._requests.get((tag, epoch))
        if found is None:
            found = self._requests[(tag, epoch)] = collectives.send_init_bytes(self._comm, message, dest, tag + epoch)
        return found

    def free(self):
        """Free the persistent requests (inactive between calls); a planned call on this plan is then stale."""
        self.freed = True
        requests, self._requests = list(self._requests.values()), {}
        collectives.free_requests(requests)


def _runs(a, region):
    """``a[..., rows, cols]`` seen as an array of its contiguous runs (one void item each).

    NumPy copies a run of ``k`` doubles as one ``k * 8``-byte item, about
    twice as fast as element by element for the thin column blocks of a
    halo. Returns ``None`` when ``a`` is not a C-contiguous host array.
    """
    if not isinstance(a, numpy.ndarray) or not a.flags.c_contiguous:
        return None
    rows, cols = region  # slices of the last two axes, steps of 1
    shape = a.shape[:-2] + (rows.stop - rows.start, cols.stop - cols.start)
    if 0 in shape:
        return None
    strides = a.strides
    item, axis = a.itemsize, len(shape)
    while axis > 0 and strides[axis - 1] == item and (axis == len(shape) or shape[axis] == a.shape[axis]):
        item *= shape[axis - 1]
        axis -= 1
    # C order: the block starts rows.start rows and cols.start columns into the array (computed, not asked for:
    # a view's __array_interface__ costs microseconds, and this runs several times a call)
    offset = rows.start * strides[-2] + cols.start * strides[-1]
    return numpy.ndarray(shape[:axis], dtype=numpy.dtype((numpy.void, item)), buffer=a, offset=offset,
                         strides=strides[:axis])


def add_runs(P, buf, region, workspace):
    """``P[region] += buf`` (``buf``: received data, free to overwrite), made by :func:`adder` and run once."""
    for step in adder(P, buf, region, workspace):
        step()


def adder(P, buf, region, workspace, keep=False):
    """The steps of ``P[region] += buf`` (functions of no arguments, NumPy's own on host arrays), planned once.

    NumPy adds strided blocks of a few elements element by element; copying
    the runs out, adding them contiguously and copying them back was
    measured twice as fast for the column blocks of a (32, 361, 360) tile
    (91 against 172 us). The sum goes into ``buf`` (received data, free to
    overwrite), or with ``keep`` (another rank's block, read only) into a
    scratch copy; either way each element is ``P + buf``, bit for bit.
    """
    runs = _runs(P, region)
    if runs is None or runs.dtype.itemsize > 256:  # long runs: NumPy adds them at full speed in place
        target = P[(Ellipsis,) + region]
        return (functools.partial(numpy.add, target, buf, out=target),)
    own = workspace.scratch("add-runs", buf, buf.size).reshape(buf.shape)
    total = own if keep else buf
    return (_copy_function(_as_runs(own, runs), runs), functools.partial(numpy.add, total, buf if keep else own,
                                                                          out=total),
            _copy_function(runs, _as_runs(total, runs)))


def _as_runs(packed, runs):
    """The contiguous block ``packed`` seen as the runs ``runs`` of a region of the same shape."""
    return packed.reshape(-1).view(runs.dtype).reshape(runs.shape)


def copy_runs(dst, src, region, into_region=False):
    """``dst[...] = src[region]`` (or ``dst[region] = src``): :func:`packer` (:func:`unpacker`) made and run once."""
    (unpacker(dst, region, src) if into_region else packer(src, region, dst))()


def copier(P, region, Q, source):
    """A function that copies ``Q[source]`` into ``P[region]`` (run by run when the layouts allow), planned once."""
    dst, src = _runs(P, region), _runs(Q, source)
    if dst is None or src is None or dst.dtype != src.dtype or dst.shape != src.shape:
        dst, src = P[(Ellipsis,) + region], Q[(Ellipsis,) + source]
    return _copy_function(dst, src)


def zeroer(P, region):
    """A function that zeroes ``P[region]``, planned once: run by run from a block of zeros where the layout allows
    (three to five times faster than NumPy's fill of a thin block), else the view's own fill."""
    runs = _runs(P, region)
    if runs is None:
        view = P[(Ellipsis,) + region]
        return functools.partial(view.fill, 0)
    return functools.partial(numpy.copyto, runs, numpy.zeros(runs.shape, runs.dtype))


def packer(P, region, packed):
    """A function that copies ``P[region]`` into the contiguous block ``packed``, planned once."""
    runs = _runs(P, region)
    if runs is None or not packed.flags.c_contiguous:
        return _copy_function(packed, P[(Ellipsis,) + region])
    return _copy_function(_as_runs(packed, runs), runs)


def _copy_function(dst, src):
    """``dst[...] = src`` as a function: NumPy's own copy for host arrays (no Python frame per call)."""
    if isinstance(dst, numpy.ndarray):
        return functools.partial(numpy.copyto, dst, src)

    def copy():
        dst[...] = src
    return copy


def unpacker(P, region, packed):
    """A function that copies the contiguous block ``packed`` into ``P[region]``, planned once."""
    runs = _runs(P, region)
    if runs is None or not packed.flags.c_contiguous:
        return _copy_function(P[(Ellipsis,) + region], packed)
    return _copy_function(runs, _as_runs(packed, runs))


def between_adder(P, region, Q, source, workspace):
    """The steps of ``P[region] += Q[source]`` (``Q``: another rank's tile, read only), planned once.

    Through a contiguous copy of ``Q[source]``'s runs, then :func:`adder`'s
    steps: element by element the same sums as the message path's, bit for
    bit.
    """
    runs = _runs(P, region)
    if runs is None or runs.dtype.itemsize > 256:  # long runs: added at full speed in place, one pass
        target = P[(Ellipsis,) + region]
        return (functools.partial(numpy.add, target, Q[(Ellipsis,) + source], out=target),)
    rows, cols = source
    shape = Q.shape[:-2] + (rows.stop - rows.start, cols.stop - cols.start)
    packed = workspace.scratch("add-between", Q, math.prod(shape)).reshape(shape)
    return (packer(Q, source, packed),) + adder(P, packed, region, workspace)
