"""The pipeline's planner on its own, with dummy stages that declare their abilities (serial).

Each dummy stage scales its input and cuts or zero-pads the last axis; what
it can do beyond that (identity, view, padding, in place, consuming, a
preferred memory order) is only declared. The tests check the compiled
plan and that running it gives what applying the stages one after the
other gives, in both directions.
"""

import ast
import functools
from pathlib import Path

import numpy
import pytest
from mpi4py import MPI

from mpisphere.operators import ADJOINT, FORWARD, REPLICATED, Abilities, Layout, Spec
from mpisphere.stages.pipeline import LocalStage, Pipeline, c_order

TRANSPOSED = (1, 0)


class Dummy(LocalStage):
    """``forward``: ``scale`` times the input cut or zero-padded to ``n_out`` columns; ``adjoint`` its transpose."""

    def __init__(self, n_in, n_out=None, scale=1.0, *, identity=False, restriction=False, prefers=None,
                 adapts=False, in_place=False, consumes=False, pads_short=(), log=None):
        super().__init__(Layout(REPLICATED, MPI.COMM_SELF))
        self.n_in, self.n_out = n_in, n_in if n_out is None else n_out
        self.scale = scale
        self.flags = dict(identity=identity, restriction=restriction, prefers=prefers, adapts=adapts,
                          in_place=in_place, consumes=consumes, pads_short=frozenset(pads_short))
        self.log = [] if log is None else log

    def _output(self, direction, spec):
        n_in, n_out = (self.n_in, self.n_out) if direction == FORWARD else (self.n_out, self.n_in)
        assert spec.shape[-1] == n_in
        return spec.but(shape=spec.shape[:-1] + (n_out,)), ""

    def _shapes(self, lead):
        return lead + (self.n_in,), lead + (self.n_out,)

    def apply(self, direction, x):
        """The reference: the map on a fresh array."""
        n_out = self.n_out if direction == FORWARD else self.n_in
        y = numpy.zeros(x.shape[:-1] + (n_out,))
        n = min(n_out, x.shape[-1])
        y[..., :n] = self.scale * x[..., :n]
        return y

    def _run(self, direction, x, out, context, how="run", nonzero=None):
        self.log.append((id(self), direction, how, nonzero, x.strides, out.strides,
                         numpy.shares_memory(x, out)))
        if numpy.shares_memory(x, out):  # in place: this map reads every input column before writing the output
            x = x.copy()
        n = min(out.shape[-1], x.shape[-1])  # a short input (a fused padding) reads as zero-padded
        out[..., :n] = self.scale * x[..., :n]
        out[..., n:] = 0

    def abilities(self, direction):
        f = self.flags
        restriction = f["restriction"] and (direction == FORWARD) == (self.n_out < self.n_in)
        padding = f["restriction"] and not restriction
        kept = min(self.n_in, self.n_out)
        return Abilities(
            identity=f["identity"],
            view=(lambda x: x[..., :kept]) if restriction else None,
            embed=functools.partial(_embed, kept) if padding else None,
            kept=kept if padding else None,
            pads_short_input_in=f["pads_short"],
            in_place=f["in_place"],
            consume=functools.partial(self._consume, direction) if f["consumes"] else None,
            prefers=f["prefers"], adapts=f["adapts"])

    def _consume(self, direction, x, out, context, nonzero):
        self._run(direction, x, out, context, how="consume", nonzero=nonzero)


def _embed(kept, padded):
    padded[..., kept:] = 0
    return padded[..., :kept]


def reference(stages, direction, x):
    for stage in (stages if direction == FORWARD else stages[::-1]):
        x = stage.apply(direction, x)
    return x


def run(pipeline, direction, x):
    n_out = pipeline.specs[-1 if direction == FORWARD else 0].shape
    out = numpy.full(n_out, numpy.nan)
    return pipeline.run(direction, x.copy(), out, None)


def check_both_directions(stages, rows=3):
    pipeline = Pipeline(stages, Spec((rows, stages[0].n_in), numpy.dtype(numpy.float64), False))
    rng = numpy.random.default_rng(0)
    for direction, boundary in ((FORWARD, 0), (ADJOINT, -1)):
        x = rng.standard_normal(pipeline.specs[boundary].shape)
        numpy.testing.assert_array_equal(run(pipeline, direction, x), reference(stages, direction, x))
    return pipeline


def actions(pipeline, direction):
    return [(step.stage, step.action, step.target) for step in pipeline.plan(direction)]


def test_plain_stages_alternate_between_two_buffers_and_the_last_writes_out():
    stages = [Dummy(5, scale=2.0), Dummy(5, 4, scale=3.0), Dummy(4, scale=-1.0)]
    pipeline = check_both_directions(stages)
    plan = pipeline.plan(FORWARD)
    assert [(s.action, s.target, s.slot) for s in plan] == [("run", "buffer", 0), ("run", "buffer", 1),
                                                            ("run", "out", None)]
    assert pipeline.plan(FORWARD) is plan  # compiled once per direction


def test_an_identity_between_equal_layouts_is_skipped_and_out_still_written():
    stages = [Dummy(5, scale=2.0), Dummy(5, identity=True)]
    pipeline = check_both_directions(stages)
    assert actions(pipeline, FORWARD) == [(0, "run", "out"), (1, "skip", None)]
    assert actions(pipeline, ADJOINT) == [(1, "skip", None), (0, "run", "out")]


def test_a_restriction_is_a_view_and_its_adjoint_lets_the_previous_stage_write_into_the_padded_buffer():
    log = []
    stages = [Dummy(6, scale=2.0, log=log), Dummy(6, 4, restriction=True, log=log), Dummy(4, scale=3.0, log=log)]
    pipeline = check_both_directions(stages)
    assert actions(pipeline, FORWARD) == [(0, "run", "buffer"), (1, "view", None), (2, "run", "out")]
    # adjoint: stage 2's adjoint writes into the padded output of the padding, which therefore does not run
    assert actions(pipeline, ADJOINT) == [(2, "run", "buffer"), (1, "skip", None), (0, "run", "out")]
    assert all(entry[0] != id(stages[1]) for entry in log)  # the restriction never ran


def test_a_padding_fuses_into_a_following_stage_that_reads_short_input_in_its_layout():
    log = []
    stages = [Dummy(6, pads_short=[c_order(2)], consumes=True, log=log), Dummy(6, 4, restriction=True, log=log),
              Dummy(4, scale=3.0, log=log)]
    pipeline = check_both_directions(stages)
    assert actions(pipeline, ADJOINT) == [(2, "run", "buffer"), (1, "fuse", None), (0, "run", "out")]
    # the stage after the fused padding consumes the pipeline's buffer and learns how many columns are not zero
    consumed = [entry for entry in log if entry[0] == id(stages[0]) and entry[1] == ADJOINT]
    assert consumed[-1][2:4] == ("consume", 4)


def test_a_padding_is_not_fused_into_a_stage_that_reads_short_input_only_in_another_layout():
    stages = [Dummy(6, pads_short=[TRANSPOSED]), Dummy(6, 4, restriction=True), Dummy(4, scale=3.0)]
    pipeline = check_both_directions(stages)
    assert [a for _, a, _ in actions(pipeline, ADJOINT)] == ["run", "skip", "run"]


def test_a_preferred_layout_spreads_through_identities_and_views_and_stops_at_other_stages():
    stages = [Dummy(6, scale=2.0), Dummy(6, 4, restriction=True), Dummy(4, identity=True),
              Dummy(4, scale=5.0, prefers=TRANSPOSED), Dummy(4, scale=7.0)]
    pipeline = check_both_directions(stages)
    # boundaries 1-4 in the preferred order: stage 0 writes it, the view and the identity pass it on
    assert pipeline.orders == [c_order(2), TRANSPOSED, TRANSPOSED, TRANSPOSED, TRANSPOSED, c_order(2)]
    assert actions(pipeline, FORWARD) == [(0, "run", "buffer"), (1, "view", None), (2, "skip", None),
                                          (3, "run", "buffer"), (4, "run", "out")]


def test_a_stage_that_adapts_reads_and_writes_the_callers_arrays_itself():
    log = []
    stages = [Dummy(4, identity=True), Dummy(4, scale=2.0, prefers=TRANSPOSED, adapts=True, log=log),
              Dummy(4, identity=True)]
    pipeline = check_both_directions(stages)
    assert pipeline.orders == [c_order(2)] * 4
    assert [a for _, a, _ in actions(pipeline, FORWARD)] == ["skip", "run", "skip"]
    # one that does not adapt gets its layout, and the identity next to the caller's array runs as the copy
    stages = [Dummy(4, identity=True), Dummy(4, scale=2.0, prefers=TRANSPOSED), Dummy(4, identity=True)]
    pipeline = check_both_directions(stages)
    assert pipeline.orders == [c_order(2), TRANSPOSED, TRANSPOSED, c_order(2)]
    assert actions(pipeline, FORWARD) == [(0, "run", "buffer"), (1, "run", "buffer"), (2, "run", "out")]


def test_an_in_place_stage_writes_into_its_inputs_buffer_with_its_strides():
    log = []
    stages = [Dummy(6, scale=2.0, prefers=TRANSPOSED), Dummy(6, 4, scale=3.0, in_place=True, log=log),
              Dummy(4, scale=5.0)]
    pipeline = check_both_directions(stages)
    plan = pipeline.plan(FORWARD)
    assert [(s.action, s.target, s.slot) for s in plan] == [("run", "buffer", 0), ("run", "in-place", 0),
                                                            ("run", "out", None)]
    forward = [entry for entry in log if entry[1] == FORWARD][-1]
    assert forward[-1] and forward[4] == forward[5]  # shared memory, same strides


def test_a_stage_consumes_only_the_pipelines_own_buffers():
    log = []
    first = Dummy(4, scale=2.0, consumes=True, log=log)
    stages = [first, Dummy(4, scale=3.0, consumes=True, log=log)]
    check_both_directions(stages)
    forward = [entry[2] for entry in log if entry[1] == FORWARD]
    assert forward == ["run", "consume"]  # the caller's x is never overwritten


def test_a_caller_that_gives_its_input_away_lets_the_first_stage_consume_it():
    log = []
    stages = [Dummy(4, scale=2.0, consumes=True, log=log), Dummy(4, scale=3.0, consumes=True, log=log)]
    pipeline = check_both_directions(stages)
    x = numpy.arange(12.0).reshape(3, 4)
    out = numpy.empty((3, 4))
    log.clear()
    pipeline.run(FORWARD, x.copy(), out, None, consume=True)
    assert [entry[2] for entry in log] == ["consume", "consume"]
    numpy.testing.assert_array_equal(out, 6.0 * x)
    pipeline.run(FORWARD, x, out, None)   # the plan without consume is its own
    assert [entry[2] for entry in log[2:]] == ["run", "consume"]


def test_the_planner_knows_stages_only_by_their_abilities():
    """No isinstance, getattr or hasattr in the pipeline module: a new stage declares, the planner follows."""
    source = Path(__file__).resolve().parent.parent / "mpisphere" / "stages" / "pipeline.py"
    calls = {node.func.id for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not calls & {"isinstance", "getattr", "hasattr"}


@pytest.mark.parametrize("direction", [FORWARD, ADJOINT])
def test_the_adjoint_of_a_wrapped_stage_declares_its_operators_abilities_for_the_other_direction(direction):
    stage = Dummy(6, 4, restriction=True)
    flipped = stage.H.abilities(direction)
    plain = stage.abilities(ADJOINT if direction == FORWARD else FORWARD)
    assert (flipped.view is None, flipped.embed is None, flipped.kept) == \
        (plain.view is None, plain.embed is None, plain.kept)
