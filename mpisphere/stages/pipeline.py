"""Run a list of stages with reused buffers, by a plan compiled from what the stages declare.

A transform is a list of stages (:class:`~mpisphere.LinearOperator` each,
with its own forward and adjoint); its adjoint is the reversed list of
adjoints. ``Pipeline`` runs such a list on one rank's data. It knows
its stages only through :meth:`~mpisphere.LinearOperator.abilities`
(``mpisphere.operators.Abilities``): whether a stage is an identity,
a restriction that can be a view, a zero padding the previous stage can
write into, runs in place, may overwrite its input, prefers a memory order.
From those it compiles, once per direction, a plan:

* **layouts**: the memory order of every intermediate. A stage that prefers
  an order gets it on both sides, and so do the intermediates reached from
  there through stages that keep a layout (identities, views, paddings);
  the caller's arrays stay C-ordered, and a stage that ``adapts`` reads and
  writes them itself instead of the pipeline copying them;
* **steps**: per stage, skip (an identity between equal layouts), view,
  fuse (a padding the next stage does itself) or run, and for each run
  where it writes: the caller's ``out``, its input's memory (``in_place``),
  or one of two byte buffers the intermediates take turns in.

``Pipeline.run`` is then a loop over the steps. The stages run without
their own checks and agreement: the transform that owns the pipeline
checked and agreed once for all of them.
"""

import dataclasses
import math
from typing import Callable, Optional

import numpy

from .. import backend
from ..operators import ADJOINT, FORWARD, LinearOperator

__all__ = ["LocalStage", "Pipeline", "Step", "c_order"]


class LocalStage(LinearOperator):
    """A stage that does not communicate: domain and range are the transform's layouts."""

    def __init__(self, layout):
        self.domain = self.range = layout


def c_order(ndim):
    """The memory order of a C-contiguous array of ``ndim`` axes."""
    return tuple(range(ndim))


# the memory order of a transform's logical (B, C, n, m) intermediates with the batch innermost: (n, m, C, B)
BATCH_INNERMOST = (2, 3, 1, 0)


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a compiled plan.

    Attributes
    ----------
    stage : int
        Index of the stage in the pipeline's list (forward order).
    action : {"skip", "view", "fuse", "run"}
    target : {"out", "in-place", "buffer"} or None
        Where a run writes (None for the other actions).
    slot : int or None
        With ``"buffer"``: which of the two byte buffers.
    boundary : int or None
        The intermediate a run writes (index into the pipeline's specs).
    run : callable or None
        ``run(x, out, context)``: the stage's work, bound to its direction
        (``consume`` when the input is a buffer of the pipeline's own).
    embed : callable or None
        The following padding's ``embed``: the run writes into the view it
        returns (the padding is then done too).
    view : callable or None
        For ``"view"``: the restriction.
    start : callable or None
        The run started without blocking (an exchange), for
        :meth:`Pipeline.run_interleaved`.
    """

    stage: int
    action: str
    target: Optional[str] = None
    slot: Optional[int] = None
    boundary: Optional[int] = None
    run: Optional[Callable] = None
    embed: Optional[Callable] = None
    view: Optional[Callable] = None
    start: Optional[Callable] = None


@dataclasses.dataclass(frozen=True)
class _Held:
    """Where the current intermediate is, as the planner follows it: a slot (or the caller's), shape, strides."""

    slot: Optional[int]
    shape: tuple
    strides: tuple
    itemsize: int


class Pipeline:
    """Run stages in order with reused intermediate buffers; the adjoint runs their adjoints in reverse.

    Parameters
    ----------
    stages : list of LinearOperator
        In forward order; each implements ``_output``, ``_run`` and,
        where it can do more, ``abilities``.
    spec : Spec
        The forward input (one batch shape and dtype: a pipeline is built
        per batch shape).
    workspace : Workspace, optional
        Where the intermediates live (default: a workspace of its own).
        The transforms pass their grid's ``grid.scratch``, shared by every
        transform on the grid: runs on one grid never overlap (the grid's
        lock), and a run leaves nothing in its buffers that a later run needs.

    Notes
    -----
    The intermediates take turns in two byte buffers (a stage reads one and
    writes the other), sized for the largest intermediate, whatever their
    dtypes: at most two batch-sized buffers per grid, not one per
    intermediate and operator. A stage that runs in place (the Legendre
    step) writes into the buffer its input is in, with the input's strides;
    a scalar transform on one rank then needs only one buffer.
    """

    _SLOTS = ("pipeline-a", "pipeline-b")

    def __init__(self, stages, spec, workspace=None):
        self.stages = list(stages)
        self.specs = [spec]
        for stage in self.stages:
            self.specs.append(stage._output(FORWARD, self.specs[-1])[0])
        self._workspace = backend.Workspace() if workspace is None else workspace
        self._slot_bytes = max(math.prod(sp.shape) * sp.dtype.itemsize for sp in self.specs)
        self.orders = self._layouts()
        self._plans = {}

    # --- compiling -------------------------------------------------------------------------------------

    def _keeps_layout(self, k):
        """Whether stage ``k`` can pass its input's layout on unchanged (skipped, a view or a padding)."""
        forward, adjoint = self.stages[k].abilities(FORWARD), self.stages[k].abilities(ADJOINT)
        return any(a.identity or a.view is not None or a.embed is not None for a in (forward, adjoint))

    def _layouts(self):
        """The memory order of every intermediate ``0 .. n`` (both directions use the same)."""
        n = len(self.stages)
        orders = [None] * (n + 1)
        for k, stage in enumerate(self.stages):
            abilities = stage.abilities(FORWARD)
            preferred = abilities.prefers
            if preferred is None:
                continue
            for boundary, step in ((k, -1), (k + 1, +1)):
                chain = [boundary]
                while True:
                    neighbour = chain[-1] - 1 if step < 0 else chain[-1]  # the stage beyond this boundary
                    if not 0 <= neighbour < n or not self._keeps_layout(neighbour):
                        break
                    chain.append(chain[-1] + step)
                if chain[-1] in (0, n):  # it reaches the caller's array, which stays C-ordered
                    if abilities.adapts:
                        continue  # the stage reads or writes the caller's layout itself
                    chain.pop()   # the last stage of the chain copies into the caller's layout
                for b in chain:
                    if orders[b] is None:
                        orders[b] = preferred
        return [order if order is not None else c_order(len(self.specs[b].shape))
                for b, order in enumerate(orders)]

    def _held_in(self, boundary, slot):
        """:class:`_Held` of intermediate ``boundary`` in a fresh byte buffer ``slot``."""
        spec, order = self.specs[boundary], self.orders[boundary]
        physical = [spec.shape[i] for i in order]
        strides_physical, step = [0] * len(physical), spec.dtype.itemsize
        for p in range(len(physical) - 1, -1, -1):
            strides_physical[p] = step
            step *= physical[p]
        strides = [0] * len(physical)
        for p, axis in enumerate(order):
            strides[axis] = strides_physical[p]
        return _Held(slot, tuple(spec.shape), tuple(strides), spec.dtype.itemsize)

    def _fits_in_place(self, boundary, held):
        """Whether intermediate ``boundary`` can be written with ``held``'s strides into its memory."""
        spec = self.specs[boundary]
        shape = tuple(spec.shape)
        if held.slot is None or spec.dtype.itemsize != held.itemsize or len(shape) != len(held.strides) \
                or 0 in shape or min(held.strides) < 0:
            return False
        # the new extents with the old strides must not make two elements share memory (only an axis held
        # outermost may grow, as the Legendre step's latitudes or degrees do)
        span = held.itemsize
        for size, step in sorted(zip(shape, held.strides), key=lambda pair: pair[1]):
            if size > 1 and step < span:
                return False
            span = max(span, step * size)
        return span <= self._slot_bytes

    def plan(self, direction, consume=False):
        """The compiled steps for ``direction`` (``FORWARD`` or ``ADJOINT``), in running order.

        ``consume``: the steps for an input the pipeline may overwrite (see :meth:`run`).
        """
        key = (direction, bool(consume))
        if key not in self._plans:
            self._plans[key] = self._compile(direction, bool(consume))
        return self._plans[key]

    def _compile(self, direction, consume):
        n = len(self.stages)
        indices = range(n) if direction == FORWARD else range(n - 1, -1, -1)

        def ends(k):
            return (k, k + 1) if direction == FORWARD else (k + 1, k)

        abilities = {k: self.stages[k].abilities(direction) for k in indices}
        actions = []
        for k in indices:
            src, dst = ends(k)
            if abilities[k].view is not None:
                actions.append([k, "view"])
            elif abilities[k].identity and self.orders[src] == self.orders[dst]:
                actions.append([k, "skip"])
            else:
                actions.append([k, "run"])
        # a padding whose next working stage reads a short input in the padding's input layout: fused into it
        for i, (k, action) in enumerate(actions):
            src, _ = ends(k)
            if action != "run" or abilities[k].embed is None:
                continue
            following = next((j for j, a in actions[i + 1:] if a != "skip"), None)
            if following is not None and self.orders[src] in abilities[following].pads_short_input_in:
                actions[i][1] = "fuse"
        working = [i for i, (_, a) in enumerate(actions) if a != "skip"]
        # the last stage that does work writes into out when only skipped stages follow it
        into_out = next((i for i in reversed(working) if actions[i][1] == "run"), None)
        if into_out is not None and working and working[-1] != into_out:
            into_out = None  # a view or fused padding comes after it: out gets a copy at the end

        steps = []
        held = _Held(None, tuple(self.specs[0 if direction == FORWARD else n].shape), (), 0)
        nonzero = None
        input_owned = consume   # until the first stage that runs has read the caller's input
        i = 0
        while i < len(actions):
            k, action = actions[i]
            src, dst = ends(k)
            if action == "skip":
                steps.append(Step(k, "skip"))
            elif action == "view":
                steps.append(Step(k, "view", view=abilities[k].view))
                held = dataclasses.replace(held, shape=tuple(self.specs[dst].shape))
            elif action == "fuse":
                steps.append(Step(k, "fuse"))
                nonzero = abilities[k].kept
            else:
                following_slot = 0 if held.slot is None else 1 - held.slot
                run = self._runner(k, direction, abilities[k], held, nonzero, input_owned)
                nonzero, input_owned = None, False
                j = i + 1
                while j < len(actions) and actions[j][1] == "skip":
                    j += 1
                pad = abilities[actions[j][0]] if j < len(actions) and actions[j][1] == "run" else None
                if pad is not None and pad.embed is not None:
                    # the next working stage pads: write into its padded buffer, and that stage is done too
                    _, pad_dst = ends(actions[j][0])
                    if j == into_out:
                        steps.append(Step(k, "run", "out", None, pad_dst, run, pad.embed))
                        held = _Held(None, (), (), 0)
                    else:
                        steps.append(Step(k, "run", "buffer", following_slot, pad_dst, run, pad.embed))
                        held = self._held_in(pad_dst, following_slot)
                    for skipped in range(i + 1, j):
                        steps.append(Step(actions[skipped][0], "skip"))
                    steps.append(Step(actions[j][0], "skip"))
                    nonzero = pad.kept
                    i = j + 1
                    continue
                if i == into_out:
                    steps.append(Step(k, "run", "out", None, dst, run))
                    held = _Held(None, (), (), 0)
                elif abilities[k].in_place and self._fits_in_place(dst, held):
                    steps.append(Step(k, "run", "in-place", held.slot, dst, run))
                    held = dataclasses.replace(held, shape=tuple(self.specs[dst].shape))
                else:
                    steps.append(Step(k, "run", "buffer", following_slot, dst, run))
                    held = self._held_in(dst, following_slot)
            i += 1
        return tuple(dataclasses.replace(step, start=abilities[step.stage].start)
                      if step.action == "run" and abilities[step.stage].start is not None else step for step in steps)

    def _runner(self, k, direction, abilities, held, nonzero, input_owned=False):
        """The callable a run step calls: ``consume`` when the input is a buffer of the pipeline's own
        (or the caller's, given to be overwritten)."""
        if (held.slot is not None or input_owned) and abilities.consume is not None:
            consume = abilities.consume
            return lambda x, out, context: consume(x, out, context, nonzero)
        stage = self.stages[k]
        return lambda x, out, context: stage.run_agreed(direction, x, out, context)

    # --- running ---------------------------------------------------------------------------------------

    def _buffer(self, boundary, like, slot):
        """The intermediate at ``boundary`` in byte buffer ``slot`` (0 or 1), in its planned memory order."""
        spec = self.specs[boundary]
        order = self.orders[boundary]
        raw = self._workspace.scratch(self._SLOTS[slot], like, self._slot_bytes, numpy.uint8)
        count = math.prod(spec.shape)
        flat = raw[:count * spec.dtype.itemsize].view(spec.dtype)
        buf = flat.reshape(tuple(spec.shape[i] for i in order))
        return buf.transpose(numpy.argsort(order))

    def nbytes(self):
        """Bytes of the buffers held now in this pipeline's workspace (shared with others on the grid)."""
        return self._workspace.nbytes()

    def run(self, direction, x, out, context, consume=False):
        """Apply the pipeline (``FORWARD``) or its adjoint (``ADJOINT``) to ``x``, writing ``out``.

        ``consume``: ``x`` is the caller's scratch and may be overwritten (a
        stage that can work in its input then saves a copy).
        """
        for _ in self._execute(direction, x, out, context, interleaved=False, consume=consume):
            pass
        return out

    @staticmethod
    def run_interleaved(runs):
        """Run several pipelines in turns, each starting its exchanges without blocking.

        ``runs``: ``[(pipeline, direction, x, out, context)]``, pipelines
        with workspaces of their own (chunks of one batch). Each runs until
        it has started an exchange, then the next one runs, so one chunk's
        exchange travels while the others compute; a chunk waits for its
        exchange when its turn comes again. The turns are the same on every
        rank, so the exchanges start in the same order everywhere.
        """
        active = [pipeline._execute(direction, x, out, context, interleaved=True)
                  for pipeline, direction, x, out, context in runs]
        while active:
            for run in list(active):
                if next(run, StopIteration) is StopIteration:
                    active.remove(run)

    def _execute(self, direction, x, out, context, interleaved, consume=False):
        """The steps of :meth:`run`; ``interleaved``: start each exchange, yield, then wait for it."""
        current = x
        for step in self.plan(direction, consume):
            if step.action == "view":
                current = step.view(current)
            elif step.action == "run":
                if step.target == "out":
                    target = out
                elif step.target == "in-place":
                    target = backend.as_strided(current, tuple(self.specs[step.boundary].shape), current.strides)
                else:
                    target = self._buffer(step.boundary, current, step.slot)
                destination = target if step.embed is None else step.embed(target)
                if interleaved and step.start is not None:
                    flight = step.start(current, destination, context)
                    yield
                    flight.wait()
                else:
                    step.run(current, destination, context)
                current = target
        if current is not out:
            backend.copy_into(out, current)
