"""What an operator can do as a stage of a pipeline (``Abilities``), declared, never inferred."""

import dataclasses
from typing import Callable, Optional





@dataclasses.dataclass(frozen=True)
class Abilities:
    """What an operator can do as a stage of a pipeline, run in one direction, beyond ``_run(x, out)``.

    A pipeline (:class:`mpisphere.stages.pipeline.Pipeline`) compiles its plan
    from these declarations alone; it never asks a stage for its class.
    The callables are bound to the direction the abilities were asked for.

    Attributes
    ----------
    identity : bool
        The map is the identity: skipped when input and output are held in
        the same memory layout, a copy otherwise.
    view : callable or None
        ``view(x)``: the result as a view of ``x`` (a restriction; no copy).
    embed : callable or None
        A zero padding of the last axis: ``embed(padded)`` zeroes the padding
        of the output buffer and returns the view the input is written into
        (the previous stage writes there directly; no copy).
    kept : int or None
        With ``embed``: the last-axis entries the padding keeps; after it the
        rest is known to be zero.
    pads_short_input_in : frozenset of tuple
        Physical orders (see ``prefers``) in which this stage reads an input
        whose last axis is shorter than its domain's as zero-padded, at no
        cost: a padding before it is then fused into it.
    in_place : bool
        May write its output into its input's memory, with the input's
        strides (only the extents differ).
    consume : callable or None
        ``consume(x, out, context, nonzero)``: ``_run`` allowed to overwrite
        ``x`` (a buffer of the pipeline's own); ``nonzero`` is the count of
        last-axis entries of ``x`` that may be non-zero, or None.
    prefers : tuple or None
        The memory order of both its sides it runs fastest in (the logical
        axes in memory order, as for ``numpy.transpose``); None: any.
    adapts : bool
        With ``prefers``: it reads and writes other layouts itself at little
        cost, so the pipeline need not copy the caller's arrays into the
        preferred layout for it.
    start : callable or None
        ``start(x, out, context)``: the same work started without blocking
        (a communication in flight); returns an object whose ``wait()``
        completes it. A pipeline that runs chunks of the batch in turn uses
        it to let one chunk's exchange travel while another chunk computes.
    """

    identity: bool = False
    view: Optional[Callable] = None
    embed: Optional[Callable] = None
    kept: Optional[int] = None
    pads_short_input_in: frozenset = frozenset()
    in_place: bool = False
    consume: Optional[Callable] = None
    prefers: Optional[tuple] = None
    adapts: bool = False
    start: Optional[Callable] = None
