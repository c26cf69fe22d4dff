"""The halo's shared-memory link: a block left in the sender's window on the node and read there by the receiver.

A rank whose padded tile comes from ``HaloExchange.zeros`` or ``empty``
(a window of ``NodeMemory``) sends a neighbour
on the same node the header alone, saying where the block lies: the
receiver copies it into its halo, or adds it onto its own cells (rows
straight from the sender's tile, the thin column blocks from where the
sender packed them behind its tile), then acknowledges; the sender leaves
the call once its blocks are acknowledged. No MPI transfer, no message
buffers. ``MPI_Win_sync`` orders the writes before the header or the
acknowledgement that announces them (:mod:`.shared`).
"""

import functools

import numpy

from .. import collectives
from .links import Link
from .plan import adder, between_adder, copier, packer, unpacker
from .round import HEADER_BYTES, header_words

__all__ = ["SharedLink"]


class SharedLink(Link):
    """Blocks left in shared memory: taken for a block whose sender's tile is shared with the receiver's node.

    Parameters
    ----------
    pattern : HaloPattern
        What the call moves (the blocks' regions).
    rows, cols : int
        The halo's widths.
    workspace : Workspace
        The halo's scratch (the sums of the adjoint).
    """

    def __init__(self, pattern, rows, cols, workspace):
        self.pattern, self.rows, self.cols, self.workspace = pattern, rows, cols, workspace

    def carries(self, call, dest, data, sender, poisoned):
        return sender is not None and data is not None and not poisoned and call.grid.node_memory.on_node(dest)

    def delivers(self, where):
        return where is not None

    # --- sending ----------------------------------------------------------------------------------------

    @staticmethod
    def _leaving(record, P, move, data):
        """``(steps, byte offset)`` that leave ``move``'s block for its reader: a thin block (the columns: runs
        of a few elements) packed behind the tile, where the reader reads it contiguously (offset >= 0; reading
        such runs straight from another core's tile was measured slower); rows read straight from the tile (-1).
        The last step orders this rank's writes before the header that announces them."""
        steps, offset = (), -1
        staged = record.staging.get(move.tag)
        if staged is not None and staged[1].shape == data.shape:
            steps, offset = (packer(P, move.send, staged[1]),), staged[0]
        return steps + (functools.partial(collectives.window_sync, record.window),), offset

    def send(self, call, round_, plan, P, move, dest, sender):
        record, sequence = sender
        data = plan.outgoing[move.tag][1]
        steps, offset = self._leaving(record, P, move, data)
        for step in steps:
            step()
        round_.send(dest, move.tag, None, shared=(data.nbytes, (record.serial, sequence, offset)))

    def send_steps(self, planned, P, move, dest, code):
        record, data = planned.record, planned.plan.outgoing[move.tag][1]
        steps, offset = self._leaving(record, P, move, data)
        words = header_words(code, planned.tile, planned.order, 0, data.nbytes, (record.serial, 0, offset))
        planned.published.append((dest, move.tag))
        message, requests = planned.own_header(dest, move.tag)
        return (steps, memoryview(message)[:HEADER_BYTES], words.tobytes(), requests, dest, move.tag, message,
                message.view(numpy.int64))

    # --- receiving --------------------------------------------------------------------------------------

    def receive(self, call, round_, plan, P, key, region, gather, sender, where):
        memory = call.grid.node_memory
        serial = where[0][0]
        if sender is None:
            steps = self.reader(memory, P, key, where, region, gather)
        else:  # both in shared memory: the copy is planned once per pair of arrays
            planned = sender[0].copies
            rows, cols = region
            at = (key, serial, where[0][2], where[1], gather, rows.start, rows.stop, cols.start, cols.stop)
            steps = planned.get(at)
            if steps is None:
                steps = planned[at] = self.reader(memory, P, key, where, region, gather)
        if steps is None:
            round_.fail(key, f"left its data in shared memory (allocation {serial}) that this rank cannot see")
        else:
            memory.read_barrier(serial)
            for step in steps:
                step()
        round_.acknowledge(key)

    def receive_steps(self, planned, P, move, key, code, tile, where, gather):
        (serial, _, offset), _ = where
        data = planned.plan.incoming[move.tag][1]
        landing = numpy.zeros(HEADER_BYTES, numpy.uint8)
        words = header_words(code, tile, planned.order, 0, data.nbytes, (serial, 0, offset))
        planned.expect_header(key, landing, memoryview(landing), words.tobytes(), landing.view(numpy.int64))
        steps = self.reader(planned.memory, P, key, where, move.recv, gather)
        if steps is None:  # out of reach (not after a call that read it): not planned, the full round decides
            return None
        planned.arrived[key] = where
        return [functools.partial(planned.memory.read_barrier, serial), *steps,
                functools.partial(planned.acknowledge, key)]

    def reader(self, memory, P, key, where, region, gather):
        """The steps that fill (or add onto) ``P[region]`` from the block a neighbour left in shared memory.

        ``key``: ``(its rank, tag)``; ``where``: ``((allocation, call, byte
        offset), its tile)`` from its header. Functions of no arguments,
        planned once (a planned call keeps them); ``None`` when this rank
        cannot see that memory.
        """
        source, tag = key
        (serial, _, offset), (h, w) = where
        if offset >= 0:  # packed by its owner
            rows, cols = region
            theirs = memory.view(serial, source, P.shape[:-2] + (rows.stop - rows.start, cols.stop - cols.start),
                                 P.dtype, offset)
        else:
            theirs = memory.view(serial, source, P.shape[:-2] + (h + 2 * self.rows, w + 2 * self.cols), P.dtype)
        if theirs is None:
            return None
        if offset >= 0:
            return (unpacker(P, region, theirs),) if gather else adder(P, theirs, region, self.workspace, keep=True)
        block = self.pattern.send_region(tag, h, w, gather)
        return (copier(P, region, theirs, block),) if gather else \
            between_adder(P, region, theirs, block, self.workspace)
