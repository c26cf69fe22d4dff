"""Neighbourhood and global attention on distributed tiles against a dense float64 reference written here.

The reference lists every (output point, input point) pair within the
cutoff by great-circle distance (torch-harmonics' neighbourhoods: the cutoff
widened by 1e-3) and applies the quadrature-weighted softmax to all of them
at once: no arcs, no exchange, no online softmax. It is written for complex
inputs too, so the gradients are checked by complex steps (a directional
derivative to rounding, with no difference quotient): ``<g, d>`` for a random
direction ``d`` of every input and every parameter, against a bound on the
sum of the absolute terms. torch-harmonics' own modules are compared in
``test_torch_harmonics_modules.py``.
"""

import math

import numpy
import pytest

from mpisphere import AttentionS2, NeighborhoodAttentionS2
from mpisphere.quadrature import latitudes

from helpers import raises

pytestmark = pytest.mark.mpi

STEP = 1e-30


def points(shape, quadrature):
    theta, w = latitudes(shape[0], quadrature)
    phi = 2 * math.pi * numpy.arange(shape[1]) / shape[1]
    t, p = numpy.meshgrid(theta, phi, indexing="ij")
    xyz = numpy.stack([numpy.sin(t) * numpy.cos(p), numpy.sin(t) * numpy.sin(p), numpy.cos(t)], -1).reshape(-1, 3)
    return xyz, numpy.repeat(2 * math.pi * w / shape[1], shape[1])


def dense(case, params, query, key, value):
    """The attention of the whole fields by every pair at once (complex inputs allowed)."""
    xyz_out, _ = points(case["out_shape"], case["grid_out"])
    xyz_in, weights = points(case["in_shape"], case["grid_in"])
    mask = numpy.arccos(numpy.clip(xyz_out @ xyz_in.T, -1, 1)) <= (1 + 1e-3) * case["cutoff"] \
        if case["cutoff"] else numpy.ones((len(xyz_out), len(xyz_in)), dtype=bool)
    heads = case["heads"]
    b = query.shape[0]

    def proj(name, x):
        y = numpy.einsum("oc,bcn->bon", params[name + "_weights"], x.reshape(b, x.shape[1], -1))
        return y + params[name + "_bias"][:, None]

    def norm(y, gain):
        g = y.reshape(b, heads, -1, y.shape[-1])
        rms = numpy.sqrt((g * g).mean(axis=2, keepdims=True) + numpy.finfo(numpy.float64).eps)
        return (g / rms * (1 + gain)[:, None]).reshape(y.shape)

    q, k, v = proj("q", query), proj("k", key), proj("v", value)
    if "q_norm_weights" in params:
        q, k = norm(q, params["q_norm_weights"]), norm(k, params["k_norm_weights"])
    q = q.reshape(b, heads, -1, q.shape[-1]) * case["scale"]
    k, v = k.reshape(b, heads, -1, k.shape[-1]), v.reshape(b, heads, -1, v.shape[-1])
    e = numpy.exp(numpy.einsum("bhcq,bhcn->bhqn", q, k)) * weights * mask
    attended = numpy.einsum("bhqn,bhcn->bhcq", e / e.sum(axis=-1, keepdims=True), v).reshape(b, -1, q.shape[-1])
    y = numpy.einsum("oc,bcn->bon", params["proj_weights"], attended) + params["proj_bias"][:, None]
    return y.reshape((b, -1) + tuple(case["out_shape"]))


CASES = {
    "self-heads2-qknorm": dict(kind="neighbourhood", in_shape=(8, 16), out_shape=(8, 16), heads=2, qknorm=True),
    "gauss-wide-kc-oc": dict(kind="neighbourhood", in_shape=(9, 18), out_shape=(9, 18), grid="legendre-gauss",
                             cutoff=1.0, k_channels=4, out_channels=6, cross=True),
    "down": dict(kind="neighbourhood", in_shape=(12, 24), out_shape=(6, 12), cross=True),
    "up": dict(kind="neighbourhood", in_shape=(6, 12), out_shape=(12, 24), heads=2, cross=True),
    "global-self": dict(kind="global", in_shape=(8, 16), out_shape=(8, 16), heads=2, qknorm=True),
    "global-down": dict(kind="global", in_shape=(12, 24), out_shape=(6, 12), cross=True),
}


def build(grid, name, rng):
    spec = CASES[name]
    c, heads = 3, spec.get("heads", 1)
    kc, oc = spec.get("k_channels", 2 * heads), spec.get("out_channels", 2 * heads)
    quadrature = spec.get("grid", "equiangular")
    options = dict(quadrature_in=quadrature, quadrature_out=quadrature, k_channels=kc, out_channels=oc)
    if spec["kind"] == "neighbourhood":
        op = NeighborhoodAttentionS2(grid, c, spec["in_shape"], spec["out_shape"], heads,
                                     theta_cutoff=spec.get("cutoff"), **options)
    else:
        op = AttentionS2(grid, c, spec["in_shape"], spec["out_shape"], heads, **options)
    shapes = {"q_weights": (kc, c), "k_weights": (kc, c), "v_weights": (oc, c), "proj_weights": (oc, oc),
              "q_bias": (kc,), "k_bias": (kc,), "v_bias": (oc,), "proj_bias": (oc,)}
    if spec.get("qknorm"):
        shapes.update(q_norm_weights=(kc // heads,), k_norm_weights=(kc // heads,))
    params = {n: 0.7 * rng.standard_normal(s) for n, s in shapes.items()}
    op.set_parameters(**params)
    case = dict(in_shape=spec["in_shape"], out_shape=spec["out_shape"], grid_in=quadrature, grid_out=quadrature,
                heads=heads, scale=op.scale, cutoff=getattr(op, "theta_cutoff", None))
    return op, params, case, spec.get("cross", False)


@pytest.mark.parametrize("name", list(CASES) + ["self-heads2-qknorm/long", "down/long", "up/long"])
def test_forward_and_every_gradient_match_the_dense_reference(grid, name, rng, monkeypatch):
    """``/long``: every arc, however short, through the long arcs' matrix products."""
    name, _, arcs = name.partition("/")
    if arcs:
        monkeypatch.setattr("mpisphere.attention.neighbourhood._Arc.LONG", 0)
    op, params, case, cross = build(grid, name, rng)
    c = op.in_channels
    query = rng.standard_normal((2, c) + case["out_shape"])
    key = rng.standard_normal((2, c) + case["in_shape"]) if cross else None
    value = rng.standard_normal((2, c) + case["in_shape"]) if cross else None
    y_bar = rng.standard_normal((2, op.out_channels) + case["out_shape"])
    tiles = [None if a is None else grid.scatter(a) for a in (query, key, value)]
    y = grid.gather(op.forward(*tiles))
    found = op.gradients(tiles[0], grid.scatter(y_bar), tiles[1], tiles[2])
    inputs_bar = [None if g is None else grid.gather(g) for g in found[:3]]
    if grid.rank != 0:
        return
    kv = (key, value) if cross else (query, query)
    expected = dense(case, params, query, *kv)
    assert numpy.abs(y - expected).max() <= 1e-12 * numpy.abs(expected).max()
    # every gradient along a random direction, by a complex step through the reference
    directions = [rng.standard_normal(a.shape) for a in (query,) + ((key, value) if cross else ())]
    for i, (a, d) in enumerate(zip((query,) + ((key, value) if cross else ()), directions)):
        args = [query, *kv] if cross else [query, query, query]
        if cross:
            args[i] = a + 1j * STEP * d
        else:
            args = [query + 1j * STEP * d] * 3
        step = numpy.sum(y_bar * dense(case, params, *args).imag) / STEP
        terms = inputs_bar[i] * d
        assert abs(numpy.sum(terms) - step) <= 1e-11 * numpy.abs(terms).sum(), (name, i)
    for name_p, g in zip(op.parameter_names, found[3:]):
        if name_p not in params:
            assert g is None
            continue
        d = rng.standard_normal(params[name_p].shape)
        moved = dict(params, **{name_p: params[name_p] + 1j * STEP * d})
        step = numpy.sum(y_bar * dense(case, moved, query, *kv).imag) / STEP
        terms = g * d
        # k_bias's gradient is zero but for rounding (a shift of every key leaves the softmax as it is): the
        # sums that make it are bounded by the cotangent times the outputs
        floor = 1e-14 * numpy.abs(y_bar).sum() * numpy.abs(expected).max() * numpy.abs(d).max()
        assert abs(numpy.sum(terms) - step) <= 1e-11 * numpy.abs(terms).sum() + floor, name_p


def test_each_rank_receives_only_what_its_neighbourhoods_reach(grid):
    """The points received are the minimum: the windows' points held elsewhere, each once; on one rank none."""
    op = NeighborhoodAttentionS2(grid, 2, (16, 32), (16, 32))
    gather = op.neighbours
    lat, lon = op.tiling_in.slices()
    own = sum(1 for hi, (_, first, span) in gather.rows.items()
              for t in range(min(span, 32)) if lat.start <= hi < lat.stop and lon.start <= (first + t) % 32 < lon.stop)
    reached = sum(min(span, 32) for _, _, span in gather.rows.values())
    assert gather.received == reached - own
    if grid.size == 1:
        assert gather.received == 0


def test_misuse_raises_on_every_rank(grid, rng):
    op, params, case, _ = build(grid, "down", rng)
    last = grid.rank == grid.size - 1
    q = grid.scatter(rng.standard_normal((1, 3) + case["out_shape"]))
    k = grid.scatter(rng.standard_normal((1, 3) + case["in_shape"]))
    with raises(ValueError, match="self-attention needs in_shape == out_shape"):
        op.forward(q)
    bad = k[:, :, :-1] if last else k      # every tile holds two rows or more
    with raises(ValueError, match=rf"rank {grid.size - 1} of {grid.size}: key: the last three axes"):
        op.forward(q, bad, k)
    with raises(ValueError, match="value: "):
        op.forward(q, k, q if last else k)     # the value on the query's grid
    if grid.size == 1:
        return      # what follows differs between ranks
    with raises(ValueError, match="theta_cutoff"):
        NeighborhoodAttentionS2(grid, 3, (8, 16), (8, 16), 1, theta_cutoff=2.0 if last else None)
    with raises(ValueError, match="num_heads"):
        NeighborhoodAttentionS2(grid, 4, (8, 16), (8, 16), 2 if last else 1)
    other = dict(params, q_weights=params["q_weights"] * 2 if last else params["q_weights"])
    op.set_parameters(**other)
    with raises(ValueError, match="q_weights"):
        op.forward(q, k, k)
