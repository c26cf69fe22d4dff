"""A halo call's agreement with the grid neighbours: headers that travel in front of the data (``NeighbourRound``).

Only the halo agrees this way (:mod:`mpisphere.halo.call`, :mod:`.planned`, :mod:`.absent`):
the round lives with it, built on the agreement's digest and stall watch.
"""

import math

import numpy

from .. import backend, collectives, staging
from ..agreement.description import digest
from ..agreement.stall import Watch


HEADER = 12  # int64 words in front of the data of every message of a neighbour round
HEADER_BYTES = 8 * HEADER  # 96: the data after it stays aligned for any dtype
_MAGIC = 0x6D7368616C6F  # "mshalo": a neighbour round's message, not something else that happened to arrive
_OWN_ERROR, _POISONED, _SHARED = 1, 2, 4
# the exception class of the mistake behind a failed round travels in the flags word (bits 8-15), its rank in the
# last header word, so that every rank the failure reaches raises the same class and names the same rank
_KINDS = (ValueError, TypeError, RuntimeError, FloatingPointError, MemoryError, OSError)
_KIND_SHIFT = 8
_CULPRIT_OWN = 1 << 16  # the culprit's mistake was its own input (not a pair of calls that do not match)


def _kind_code(kind):
    return (_KINDS.index(kind) if kind in _KINDS else 0) + 1
DETAILS_TAG = 0x6D74  # the full descriptions of a failed round, exchanged between the pairs that did not fit
# A round's messages travel with their tag plus EPOCH_TAGS when the sender has made an odd number of agreements on
# the grid (``GridComm.agreements``): a rank waiting in agreement k can then probe for the halo messages of ranks
# that have not made agreement k (a call they made instead of it, :mod:`mpisphere.halo.absent`) without taking
# those of ranks that have made it and gone on (the neighbours of a correct program hold the same count).
EPOCH_TAGS = 100


def epoch_of(agreements):
    """The tag offset of the rounds of a rank that has made ``agreements`` agreements on the grid."""
    return EPOCH_TAGS * (int(agreements) & 1)


def current_epoch(comm):
    """The tag offset of a round that begins now on ``comm`` (0 on a communicator that counts no agreements)."""
    return epoch_of(getattr(comm, "agreements", 0))


def header_words(code, tile, order, pattern, nbytes, location=None):
    """The header (:data:`HEADER` int64 words) of a message from a rank whose call and own input are fine.

    ``code``: the digest of the call's description; ``tile``: the sender's
    ``(h, w)``; ``order``: which phase the call runs first; ``pattern``:
    the optional messages it sends; ``nbytes``: the data behind the header,
    or left in shared memory at ``location`` (three integers; the header
    then goes alone, flagged). A round's messages carry these words, with
    the flags of a problem where there is one; a planned call
    (:mod:`mpisphere.halo.planned`) writes and expects exactly these.
    """
    words = numpy.array([_MAGIC, 0, code, tile[0], tile[1], nbytes, order, pattern, 0, 0, 0, 0], numpy.int64)
    if location is not None:
        words[1], words[8:11] = _SHARED, location
    return words


def message_buffer(like, shape, dtype):
    """A flat byte buffer for one message of a round, and the view of its data as an array of ``shape``.

    The first :data:`HEADER_BYTES` bytes hold the header; the data follows
    (aligned for any dtype). In ``like``'s array module and device.
    """
    dtype = numpy.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    xp = backend.array_module(like)
    with backend.device_of(like):
        message = xp.empty(HEADER_BYTES + nbytes, numpy.uint8)
    return message, message[HEADER_BYTES:].view(dtype).reshape(shape)


class NeighbourRound:
    """One call's messages with its grid neighbours, each message its header followed by its data.

    The header (twelve int64 words in front of the data) carries this rank's
    verdict on its own input, whether the data it sends is incomplete
    (``poisoned``), a digest of the call (operator, parameters, direction,
    batch shape, dtype, switches), the tile's height and width, the number of
    data bytes, the order of the call's phases, which optional messages it
    sends, and where the data is when it is not in the message (below). A
    receiver probes for a message, learns its size, and receives it whole:
    into the caller's buffer when the size is the expected one, into a drain
    buffer otherwise; then it reads the header and uses the data only when
    the header fits (same digest, tiles that fit together). A mismatch
    therefore never truncates a message or leaves one behind for the next
    call, and agreeing costs no message of its own.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator of the messages (``grid.cart``).
    who : str
        The call, for messages.
    description : str
        The call, as the neighbours must see it (its digest travels).
    tile : (int, int)
        This rank's tile, for the neighbours' fit checks.
    error : InputError or None
        This rank's own finding: the round then sends every header at once,
        without data, and drops what arrives, so no neighbour waits.
    expected : list of (source, tag)
        Every message this call receives. The sender of a message with tag
        ``t`` to rank ``d`` must appear in ``d``'s list as ``(sender, t)``:
        the halo uses the same neighbours and tags in every call, whatever
        its widths, so any two halo calls on neighbouring ranks exchange the
        same messages and every mismatch is seen.
    fits : callable ``(header, source, tag) -> str or None``
        Why a neighbour's header cannot be used here (tiles that do not fit),
        or ``None``. Must be symmetric between the two ranks of a pair.
    order : int
        Which phase comes first (the gathering and the accumulating
        directions of a halo run their phases in opposite orders).
    staged : bool
        Move device data through host buffers.
    pattern : int
        Bits naming the optional messages this call sends (a halo without
        extents sends records first); it travels in every header.
    optional : dict of (source, tag) -> bit
        The messages a neighbour sends only when its ``pattern`` has that
        bit. One that this call expects but the neighbour does not send is
        not waited for; one it sends but this call does not expect is
        received and dropped, so two calls of different patterns still match
        every message.
    acknowledge : callable ``(source, tag, location) -> None``, optional
        Tells the sender of a message whose data stayed in memory shared
        on the node (:meth:`send` with ``shared=``) that this rank no longer
        reads it. Called exactly once for every such message received,
        whether its data was used or dropped: by the caller through
        :meth:`acknowledge` after reading, by the round otherwise.
    code : int, optional
        ``digest(description)``, when the caller keeps it from call to call.
    epoch : int, optional
        The offset added to every tag on the wire (``epoch_of``); by
        default this rank's, from ``comm``'s count of agreements. A persistent
        ``request`` given to :meth:`send` must have been made with it.
    absent : bool
        A round of a rank that is not in the neighbours' call (it waits in an
        agreement, :mod:`mpisphere.halo.absent`): like a round with ``error``
        it sends headers alone and drops what arrives, but its headers say only
        that it makes another call (its digest), not that its input is wrong.

    Notes
    -----
    A phase (:meth:`collect`) waits for its own messages, receiving and
    checking the messages of later phases that arrive meanwhile. A problem
    with a message of a phase makes the data this rank sends in later
    phases incomplete: those headers say so (``poisoned``) and carry no
    data, and the neighbours that needed it raise too, so the ranks that
    raise are exactly the ones whose result would have used wrong data (the
    3 x 3 block around a mistake). A message whose phases run in the other
    order (a neighbour in the adjoint while this rank is in the forward)
    could otherwise leave a cycle of ranks each waiting for the next one's
    first phase: the rank then sends all its remaining headers at once,
    which breaks the cycle. Problems are raised by the caller after
    :meth:`finish`.

    Data in shared memory: a sender whose block lies in memory the receiver
    can read (an MPI-3 shared window on the node) sends the header alone,
    flagged, with the data's size and a ``location`` of three integers (for
    the halo: which array, which call, where in the sender's memory); the receiver reads the block itself
    (:attr:`shared` says where) and acknowledges it. The sender must not
    change the block until every such message it sent (:attr:`published`)
    has been acknowledged.
    """

    def __init__(self, comm, who, description, tile, error, expected, fits, order=0, staged=False,
                 workspace=None, pattern=0, optional=None, acknowledge=None, code=None, epoch=None, absent=False):
        self.comm, self.who, self.fits = comm, who, fits
        self.epoch = current_epoch(comm) if epoch is None else int(epoch)
        self.absent = bool(absent)
        self.description = description
        self.error = error
        self.code = digest(description) if code is None else code  # a caller may keep it from call to call
        self.tile = (int(tile[0]), int(tile[1]))
        self.order = int(order)
        # messages that only some calls send: {(source, tag): bit of ``pattern``}; the source's headers say which
        self.pattern, self.optional = int(pattern), optional or {}
        self.staged = staged
        self.workspace = workspace if workspace is not None else backend.Workspace()
        self.problems = []          # ((source, tag), text) of the messages this rank cannot use
        self.mismatched = set()     # sources whose own records did not fit with this rank's (for details)
        self.poisoned = error is not None  # the data this rank would send next is not complete
        # (rank, exception class) of the mistake behind this round's failure, as far as this rank knows it
        # (rank, exception class, whether the mistake is the culprit's own input) of the mistake behind this
        # round's failure, as far as this rank knows it
        self.culprit = (comm.Get_rank(), error.kind, True) if error is not None and not absent else None
        self._flush = error is not None    # send everything at once: waiting could close a cycle
        self._pending = list(expected)     # messages not received yet
        self._received = set()
        self._targets = {}                 # key -> the caller's message buffer (None: a header alone)
        self._usable = {}                  # key -> whether the message arrived and fits (its data may be used)
        self._other_call = set()           # keys whose sender makes another call (another digest)
        self._patterns_seen = set()
        self._sent = set()
        self._sends = []
        self._status = collectives.status()
        self._watch = Watch(comm, who)
        self._acknowledge = acknowledge
        self._base = header_words(self.code, self.tile, self.order, self.pattern, 0)
        self.shared = {}                   # key -> (location, the sender's tile) of data read in shared memory
        self._owed = {}                    # key -> location: shared data received and not acknowledged yet
        self.published = []                # (dest, tag) of the messages this rank sent with shared data

    # --- sending -----------------------------------------------------------------------------------

    def _header(self, nbytes, location=None):
        header = self._base.copy()  # one array built per round; a copy per message (the sends are in flight)
        header[1] = (_OWN_ERROR if self.error is not None and not self.absent else 0) | \
            (_POISONED if self.poisoned else 0) | \
            (0 if location is None else _SHARED)
        header[5] = nbytes
        if location is not None:
            header[8:11] = location
        if self.poisoned and self.culprit is not None:
            header[1] |= (_kind_code(self.culprit[1]) << _KIND_SHIFT) | (_CULPRIT_OWN if self.culprit[2] else 0)
            header[11] = self.culprit[0] + 1
        return header

    def _learn_culprit(self, rank, code, own=False):
        """Keep the first mistake this rank hears of: ``rank``, its exception class (``code``, 0: unknown) and
        whether it was ``rank``'s own input."""
        if self.culprit is None:
            self.culprit = (int(rank), _KINDS[(code & 0xFF) - 1] if 0 < (code & 0xFF) <= len(_KINDS) else ValueError,
                            bool(own))

    def send(self, dest, tag, message, *, shared=None, request=None):
        """Send ``message`` (a buffer from :func:`message_buffer`, or ``None``) to ``dest`` with ``tag``.

        The round writes the header into its first bytes. A poisoned round,
        or ``None``, sends the header alone. ``shared=(nbytes, location)``:
        the data (``nbytes``) stays in shared memory at ``location`` and the
        header goes alone, flagged (not from a poisoned round: that sends no
        data at all). ``request``: a persistent send of ``message`` to
        ``dest`` with ``tag`` (host memory, not staged), started instead of a
        new one.
        """
        if (dest, tag) in self._sent:
            raise RuntimeError(f"{self.who}: two messages to rank {dest} with tag {tag} in one round")
        self._sent.add((dest, tag))
        if shared is not None and not self.poisoned:
            out = self._header(int(shared[0]), shared[1]).view(numpy.uint8)
            self.published.append((dest, tag))
        elif self.poisoned or message is None:
            out = self._header(0).view(numpy.uint8)
        elif request is not None and not self.staged and isinstance(message, numpy.ndarray):
            message[:HEADER_BYTES] = self._header(int(message.size) - HEADER_BYTES).view(numpy.uint8)
            self._post(message, dest, tag, request)
            return
        else:
            header = self._header(int(message.size) - HEADER_BYTES).view(numpy.uint8)
            if self.staged and (backend.is_device_array(message) or isinstance(message, numpy.ndarray)):
                out = self.workspace.host(f"nr-send-{dest}-{tag}", message.size, numpy.uint8,
                                          backend.is_device_array(message))
                backend.copy_to_host(message, out)
                out[:HEADER_BYTES] = header
            elif backend.is_device_array(message):
                message[:HEADER_BYTES] = backend.array_module(message).asarray(header)
                out = message
            else:
                message[:HEADER_BYTES] = header
                out = message
        self._post(out, dest, tag)

    def has_sent(self, dest, tag):
        """Whether this round has sent its message to ``dest`` with ``tag``."""
        return (dest, tag) in self._sent

    def _post(self, out, dest, tag, request=None):
        """Start the send of the bytes ``out`` (its persistent ``request``, or a new one)."""
        if request is None:
            request = collectives.isend_bytes(self.comm, out, dest, tag + self.epoch)
        else:
            collectives.start(request)
        self._sends.append((request, out))

    # --- receiving --------------------------------------------------------------------------------------

    def expect(self, key, message):
        """Where message ``key`` lands when its size is the expected one: a :func:`message_buffer`, or ``None``."""
        self._targets[key] = message

    def receive(self, key, probed, nbytes):
        """Receive the probed message ``key`` whole, check its header; its data is used only if it fits.

        ``probed``, ``nbytes``: its ``MPI_Improbe`` match and size (a planned call hands over the one it matched).
        """
        source, tag = key
        target = self._targets.get(key)
        fitting = target is not None and nbytes == int(target.size) and not self._flush and self.error is None
        if fitting and not (self.staged or backend.is_device_array(target)):
            landing = target
        elif fitting and not self.staged:  # a device buffer, CUDA-aware
            landing = target
        elif fitting:
            landing = self.workspace.host(f"nr-recv-{source}-{tag}", nbytes, numpy.uint8,
                                          backend.is_device_array(target))
        else:  # drain it: every byte sent is received in this call
            landing = self.workspace.scratch(f"nr-drain-{source}-{tag}", numpy.empty(0, numpy.uint8),
                                             max(nbytes, 1), numpy.uint8)
        if landing is target:
            staging.prepare(target)
        collectives.mrecv_bytes(probed, landing, nbytes)
        self.landed(key, landing, nbytes, fitting)

    def landed(self, key, landing, nbytes, fitting):
        """The message ``key`` (``nbytes``) was received into ``landing``: check its header, use it or drop it.

        ``fitting``: ``landing`` is the caller's buffer for ``key`` (or the
        host buffer staged for it) and the size is the expected one.
        """
        source, tag = key
        target = self._targets.get(key)
        if nbytes < HEADER_BYTES:
            header = numpy.zeros(HEADER, numpy.int64)
        elif backend.is_device_array(landing):
            header = backend.array_module(landing).asnumpy(landing[:HEADER_BYTES]).view(numpy.int64)
        else:
            header = landing[:HEADER_BYTES].view(numpy.int64)  # read at once (the buffer is reused next call)
        self._pending.remove(key)
        self._received.add(key)
        self._on_header(key, header, nbytes)
        if header[0] == _MAGIC and header[1] & _SHARED:
            self._owed[key] = (int(header[8]), int(header[9]), int(header[10]))
            if self._usable[key] and not self._flush and self.error is None:
                self.shared[key] = (self._owed[key], (int(header[3]), int(header[4])))
            else:  # dropped: the sender may go on at once
                self.acknowledge(key)
        if fitting and self._usable[key] and landing is not target:
            backend.copy_from_host(landing, target)
            # the next round's message lands in this pinned buffer: not before the copy has read it
            self.workspace.guard(f"nr-recv-{source}-{tag}", backend.is_device_array(target), target)

    def adopt(self, sent, received, published=(), shared=None):
        """Take over a round that a planned call (:mod:`mpisphere.halo.planned`) began in this call.

        ``sent``: ``(dest, tag, request, message)`` of the messages it
        started, each with the header :func:`header_words` of this round,
        ``published`` the ``(dest, tag)`` among them whose data it left in
        shared memory; ``received``: the keys whose messages arrived with
        the headers this round expects of them, whole in their targets or,
        for the keys of ``shared`` (``key -> (location, the sender's
        tile)``), as headers whose data lies in shared memory, not read yet.
        The round then goes on as if it had sent and received them itself.
        """
        for dest, tag, request, message in sent:
            self._sent.add((dest, tag))
            self._sends.append((request, message))
        self.published += list(published)
        for key in received:
            self._pending.remove(key)
            self._received.add(key)
            self._usable[key] = True
            self._patterns_seen.add(key[0])
        for key, (location, tile) in (shared or {}).items():
            self._owed[key] = location
            self.shared[key] = (location, tile)

    def _on_header(self, key, header, nbytes):
        """Check a neighbour's header."""
        source, tag = key
        problem = None
        if header[0] != _MAGIC:
            problem = "sent a message that is not a halo exchange's"
            self._flush = True
        elif header[1] & _OWN_ERROR:
            problem = "has an input it cannot use"
            self.mismatched.add(source)
            self._learn_culprit(source, int(header[1]) >> _KIND_SHIFT, own=True)
        elif self.error is not None:
            self.mismatched.add(source)
        elif header[2] != self.code:
            problem = "is not making the same call (another operator, parameters, direction, batch shape or dtype)"
            self.mismatched.add(source)
            self._other_call.add(key)
            self._learn_culprit(source, _kind_code(ValueError))
        else:
            problem = self.fits(header, source, tag)  # before the poisoned flag: both sides of a pair see it
            if problem is not None:
                self.mismatched.add(source)
                self._learn_culprit(source, _kind_code(ValueError))
            elif header[1] & _POISONED:
                if header[11] > 0:
                    self._learn_culprit(int(header[11]) - 1, int(header[1]) >> _KIND_SHIFT,
                                        own=bool(header[1] & _CULPRIT_OWN))
                    problem = (f"could not complete its own exchange (a mistake in its neighbourhood, at rank "
                               f"{int(header[11]) - 1})")
                else:
                    problem = "could not complete its own exchange (a mistake in its neighbourhood)"
            else:
                target = self._targets.get(key)
                expected = HEADER_BYTES if target is None else int(target.size)
                if header[1] & _SHARED:  # the header alone; the size of the data left in shared memory
                    nbytes = HEADER_BYTES + int(header[5]) if nbytes == HEADER_BYTES else -1
                if nbytes != expected:
                    problem = f"sent {nbytes - HEADER_BYTES} bytes where {expected - HEADER_BYTES} were expected"
        if header[0] == _MAGIC and header[6] != self.order:
            self._flush = True
        if header[0] == _MAGIC and source not in self._patterns_seen:
            self._patterns_seen.add(source)
            self._match_pattern(source, int(header[7]))
        self._usable[key] = problem is None
        if problem is not None:
            self.problems.append((key, problem))

    def _match_pattern(self, source, theirs):
        """Match the optional messages ``source`` sends (its ``pattern``) with the ones this rank expects."""
        for key, bit in self.optional.items():
            if key[0] != source:
                continue
            sends = bool(theirs & bit)
            if key in self._pending and not sends:  # never coming: a problem, not a wait
                self._pending.remove(key)
                self._usable[key] = False
                self.problems.append((key, "is not making the same call (its messages differ)"))
            elif not sends or key in self._received or key in self._pending:
                continue
            else:  # sent but not expected here: received and dropped in this call
                self._pending.append(key)

    def progress(self):
        """Receive the pending messages that have arrived, never waiting; whether every one has (a round that
        :meth:`finish` then ends without waiting for a neighbour)."""
        self._receive_arrived()
        return not self._pending

    def _receive_arrived(self, stop_at_flush=False):
        """One pass over the pending messages, receiving those that have arrived; how many did. With
        ``stop_at_flush``, the pass ends after the message that makes the round flush."""
        count = 0
        for key in list(self._pending):
            probed, nbytes = collectives.improbe_bytes(self.comm, key[0], key[1] + self.epoch, self._status)
            if probed is not None:
                count += 1
                self.receive(key, probed, nbytes)
                if stop_at_flush and self._flush:
                    break
        return count

    def _poll(self, wanted):
        """Receive messages (any that is pending) until every key in ``wanted`` has arrived or the round flushes."""
        while self._pending and any(k in self._pending for k in wanted) and not self._flush:
            if not self._sweep():
                return

    def _sweep(self):
        """Probe every pending message once and receive those that are there; False once the round flushes.

        A sweep that finds nothing yields the core (on oversubscribed nodes
        the neighbour we wait for may be waiting for this core), and after a
        long wait reports the neighbours whose messages have not arrived.
        """
        if self._receive_arrived(stop_at_flush=True):
            return not self._flush
        # nothing came: yields the core; reports a neighbour that never sends (config.stall_report)
        self._watch.idle({k[0] for k in self._pending}, {k[0] for k in self._received})
        return True

    def collect(self, keys, records=False):
        """Wait for the messages ``keys`` of one phase; ``{key: data}`` of those whose data may be used.

        Messages of later phases that arrive meanwhile are received and
        checked too. When a message of this phase cannot be used, or the
        round must flush, returns ``{}`` and poisons the round: the caller
        skips its work and calls :meth:`finish`. ``records``: a phase of
        headers alone, sent ahead of the data to check that the tiles fit
        together; a neighbour making another call poisons nothing there (its
        data messages will say so again, to the ranks that need them), a
        neighbour whose tile does not fit poisons the round.
        """
        self._poll(keys)
        if self._flush or not all(self._usable.get(k, False) or (records and k in self._other_call) for k in keys):
            self.poisoned = True
            return {}
        return {k: self._targets[k] for k in keys if self._targets.get(k) is not None}

    def fail(self, key, text):
        """The message ``key`` (``(source, tag)``) cannot be used, for the reason ``text``: the round is
        poisoned (this rank stops using data and its remaining headers say so)."""
        self.problems.append((key, text))
        self.poisoned = True

    def acknowledge(self, key):
        """Tell the sender of ``key`` (data in shared memory) that this rank no longer reads it."""
        location = self._owed.pop(key, None)
        if location is None:
            return
        if self._acknowledge is None:
            raise RuntimeError(f"{self.who}: rank {key[0]} left its data in shared memory, which this call "
                               "cannot acknowledge")
        self._acknowledge(key[0], key[1], location)

    def finish(self, remaining):
        """Send the headers of ``remaining`` ``(dest, tag)`` not sent yet (no data), receive the rest, wait.

        Every rank calls it once, whatever happened, so that every message
        of the call is matched in the call. Returns the problems (a list of
        ``((source, tag), text)``), or ``None`` when there were none and this
        rank had no finding of its own.
        """
        if self.problems:
            self.poisoned = True
        for dest, tag in remaining:
            if (dest, tag) not in self._sent:
                self.send(dest, tag, None)
        self._flush = True  # everything left is received and dropped
        while self._pending:
            self._sweep()
        for key in list(self._owed):  # shared data not read (a problem) or read without acknowledging
            self.acknowledge(key)
        collectives.waitall([r for r, _ in self._sends])
        self._sends.clear()
        if self.error is None and not self.problems:
            return None
        return self.problems

    def details(self):
        """``{rank: (error text or None, description, who)}`` of the neighbours whose records did not fit with this
        one (``who``: their call's name, ``"HaloExchange.update"``).

        Both ranks of such a pair call it (the reasons are symmetric), so the
        extra messages always match; ranks poisoned only from farther away
        exchange nothing more.
        """
        mine = (None if self.error is None else self.error.text, self.description, self.who)
        return collectives.exchange_objects(self.comm, sorted(self.mismatched), mine, DETAILS_TAG)
