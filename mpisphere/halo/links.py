"""The halo's links: how a block reaches a neighbour, one class per transport, the same for both engines.

A halo call moves the blocks its pattern names (:mod:`.pattern`); a *link*
carries one block from a rank to a neighbour. Each link says, for one
block, both how a full call (:mod:`mpisphere.halo.call`, with its neighbour round) moves
it and which steps a planned call (:mod:`.planned`) keeps to replay it:

=================  =========================================  ==========================================
a link says        the full call (with a ``NeighbourRound``)  the planned call (steps kept, replayed)
=================  =========================================  ==========================================
sending a block    ``Link.send``                              ``Link.send_steps``
receiving a block  ``Link.receive``                           ``Link.receive_steps``
=================  =========================================  ==========================================

The sender picks the first link in ``Links``' order that carries the
block (``Link.carries``); the header it sends says which link it took
(its data behind it, or the data's place in shared memory), and the
receiver takes the block from the link the header names. The two links:

* ``MessageLink``: the block packed into
  a message buffer behind its header (persistent sends for host buffers);
  every array, every neighbour, on or off the node;
* ``SharedLink``: the block left in the
  sender's window on the node (a tile from ``HaloExchange.zeros``), read
  there by the receiver, acknowledged.

A new transport (a GPU IPC handle, a persistent CUDA-aware request) is one
module with a ``Link`` subclass, placed in ``Links``' order.
"""

__all__ = ["Link", "Links"]


class Link:
    """One way a halo block reaches a neighbour (the protocol each transport implements).

    ``call`` below is the exchange's :class:`~mpisphere.halo.call.HaloCall`
    (its pattern, workspace and node memory), ``plan`` the padded shape's
    :class:`~mpisphere.halo.plan.MessagePlan`, ``P`` the padded array,
    ``move`` a :class:`~mpisphere.halo.pattern.Move` (its ``tag``, ``send``
    and ``recv`` regions), ``sender`` ``(allocation, call number)`` when
    ``P`` lies in shared memory and may be read there, else ``None``.
    """

    def carries(self, call, dest, data, sender, poisoned):
        """Whether this link carries the block of ``data`` (its packed view, ``None``: zero width) to ``dest``."""
        raise NotImplementedError

    def delivers(self, where):
        """Whether a received header that left its data at ``where`` (``None``: in the message) is this link's."""
        raise NotImplementedError

    def send(self, call, round_, plan, P, move, dest, sender):
        """Move the block in a full call: its header (and data, or where it lies) sent through ``round_``."""
        raise NotImplementedError

    def receive(self, call, round_, plan, P, key, region, gather, sender, where):
        """Copy (``gather``) or add the received block of ``key`` into ``P[region]`` in a full call."""
        raise NotImplementedError

    def send_steps(self, planned, P, move, dest, code):
        """What a planned call keeps to send this block again: ``(steps, header view, header bytes, requests,
        dest, tag, message, call-number words or None)`` (:mod:`.planned`)."""
        raise NotImplementedError

    def receive_steps(self, planned, P, move, key, code, tile, where, gather):
        """The steps a planned call runs once the block of ``key`` has arrived (after registering the header it
        expects with ``planned.expect_header``); ``None`` when it cannot be planned (the full call decides)."""
        raise NotImplementedError


class Links:
    """The links of one exchange, in the order a sender tries them (the first that carries a block takes it).

    Parameters
    ----------
    links : sequence of Link
        The last must carry every block (the message link).
    """

    def __init__(self, links):
        self.order = tuple(links)

    def sending(self, call, dest, data, sender, poisoned):
        """The link that carries a block to ``dest``."""
        return next(link for link in self.order if link.carries(call, dest, data, sender, poisoned))

    def receiving(self, where):
        """The link a received header names (``where``: the data's place in shared memory, or ``None``)."""
        return next(link for link in self.order if link.delivers(where))
