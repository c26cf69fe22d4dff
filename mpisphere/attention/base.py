"""What both attentions on the sphere share (``attention.neighbourhood``, ``attention.whole_sphere``).

Both map a query tile ``(B, in_channels, h_out, w_out)`` and key and value
tiles ``(B, in_channels, h_in, w_in)`` (the query itself for
self-attention) to the output tile ``(B, out_channels, h_out, w_out)``:
1 x 1 projections of query, key and value (with biases), optional q/k
normalisation per head, the quadrature-weighted softmax
(:mod:`~mpisphere.attention.kernels`), and an output projection. They are
not linear: ``gradients`` is the hand-written backward (every input and
every parameter), the parameters' gradients summed over the grid in one
``Allreduce``. A subclass says how the keys and values reach the queries
(``_key_inputs`` and its adjoint) and how the softmax runs over them
(``_attend``, ``_attend_backward``).
"""

import math

import numpy

from .. import backend
from ..agreement import Call, Context, InputError, Spec, agree_construction, collective
from ..grid import check_finite, check_tile
from ..operators import DISTRIBUTED, Layout, ParametrisedOperator
from ..quadrature import latitudes
from ..tiling import RegularTiling
from ..validation import check_dtype, check_int
from .kernels import project, project_adjoint, rms_norm, rms_norm_adjoint

__all__ = ["Attention"]

_WEIGHTS = ("q_weights", "k_weights", "v_weights", "proj_weights")
_OPTIONAL = ("q_bias", "k_bias", "v_bias", "proj_bias", "q_norm_weights", "k_norm_weights")


class Attention(ParametrisedOperator):
    """What both attentions share: arguments, parameters, checks, projections, the call and its backward."""

    parameter_names = _WEIGHTS + _OPTIONAL
    block_elements = 1 << 21
    """Host arrays: the scores computed at a time (global attention's blocks of queries and keys)."""

    def __init__(self, grid, in_channels, in_shape, out_shape, num_heads=1, *, quadrature_in="equiangular",
                 quadrature_out="equiangular", scale=None, k_channels=None, out_channels=None, dtype=numpy.float64):
        who = self.name
        agree_construction(self, grid.cart, who=who)
        self.grid = grid
        self.in_channels = check_int(in_channels, "in_channels", who, minimum=1)
        self.num_heads = check_int(num_heads, "num_heads", who, minimum=1)
        self.k_channels = self.in_channels if k_channels is None else check_int(k_channels, "k_channels", who,
                                                                              minimum=1)
        self.out_channels = self.in_channels if out_channels is None else check_int(out_channels, "out_channels",
                                                                                  who, minimum=1)
        for name, value in (("k_channels", self.k_channels), ("out_channels", self.out_channels)):
            if value % self.num_heads:
                raise ValueError(f"{who}: num_heads={self.num_heads} must divide {name}={value}")
        self.in_shape = tuple(check_int(v, "in_shape", who, minimum=1) for v in in_shape)
        self.out_shape = tuple(check_int(v, "out_shape", who, minimum=1) for v in out_shape)
        self.quadrature_in, self.quadrature_out = quadrature_in, quadrature_out
        self.dtype = check_dtype(dtype, "transformed", "dtype", who)
        self.scale = 1.0 / math.sqrt(self.k_channels // self.num_heads) if scale is None else float(scale)
        _, w = latitudes(self.in_shape[0], quadrature_in)
        self.quad_weights = 2.0 * math.pi * w / self.in_shape[1]
        self.tiling_in = RegularTiling(grid, *self.in_shape)
        self.tiling_out = RegularTiling(grid, *self.out_shape)
        self.tile_in, self.tile_out = self.tiling_in.local_shape(), self.tiling_out.local_shape()
        self.domain = self.range = Layout(DISTRIBUTED, grid.cart)
        self._comm = grid.cart
        self._device, self._device_weights = {}, {}
        self._workspace = backend.Workspace()   # staged exchanges' host buffers
        self._init_parameters()

    # --- parameters ------------------------------------------------------------------------------

    def _prepare_parameters(self, values):
        c, k, o, heads = self.in_channels, self.k_channels, self.out_channels, self.num_heads
        shapes = {"q_weights": (k, c), "k_weights": (k, c), "v_weights": (o, c), "proj_weights": (o, o),
                  "q_bias": (k,), "k_bias": (k,), "v_bias": (o,), "proj_bias": (o,),
                  "q_norm_weights": (k // heads,), "k_norm_weights": (k // heads,)}
        kept = {}
        for name, value in values.items():
            if value is None:
                kept[name] = None
                continue
            shape = shapes[name]
            if value.shape not in (shape, shape + (1, 1)):
                raise ValueError(f"{self.name}: {name} must be {shape}"
                                 + (f" (or {shape + (1, 1)})" if len(shape) == 2 else "") + f", got {value.shape}")
            kept[name] = numpy.array(value.reshape(shape), dtype=self.dtype)
        self._device = {}
        return kept

    def _on(self, like):
        """The parameters on ``like``'s device, by name (None where not set)."""
        names = [n for n in self.parameter_names if self._parameter_values[n] is not None]
        found = backend.on_device_of(like, tuple(self._parameter_values[n] for n in names), self._device)
        values = dict.fromkeys(self.parameter_names)
        values.update(zip(names, found))
        return values

    @property
    def linear(self):
        return False

    def _shapes(self, lead):
        """``(query tile, output tile)`` shapes with leading axes ``lead`` (self-attention's input is the query)."""
        return lead + (self.in_channels,) + self.tile_out, lead + (self.out_channels,) + self.tile_out

    # --- checks ----------------------------------------------------------------------------------

    def _check_inputs(self, query, key, value):
        """Local checks; returns the descriptions of the inputs."""
        missing = [n for n in _WEIGHTS if self._parameter_values[n] is None]
        if missing:
            raise InputError(f"the parameters {', '.join(missing)} are not set\n  fix: op.set_parameters("
                             + ", ".join(f"{n}=..." for n in missing) + ") on every rank first")
        if (key is None) != (value is None) and self.in_shape != self.out_shape:
            raise InputError("key and value must both be given where in_shape differs from out_shape")
        if key is None and value is None and self.in_shape != self.out_shape:
            raise InputError(f"self-attention needs in_shape == out_shape, got in_shape={self.in_shape}, "
                             f"out_shape={self.out_shape}\n  fix: pass key and value, tiles of the input grid")
        texts = []
        spec_q = Spec.of(query)
        check_tile(self.grid, spec_q, self.out_shape, self.dtype, self.in_channels, "query")
        if len(spec_q.shape) != 4:
            raise InputError(f"query: expected (batch, channels, h, w), got {spec_q.shape}")
        texts.append(f"query={spec_q.describe((-2, -1))}")
        for what, x in (("key", key), ("value", value)):
            if x is None:
                texts.append(f"{what}=query")
                continue
            spec = Spec.of(x)
            check_tile(self.grid, spec, self.in_shape, self.dtype, self.in_channels, what)
            if tuple(spec.shape[:1]) != tuple(spec_q.shape[:1]):
                raise InputError(f"{what}: batch {spec.shape[0]} where the query's is {spec_q.shape[0]}")
            texts.append(f"{what}={spec.describe((-2, -1))}")
        for what, x, whole in (("query", query, self.out_shape), ("key", key, self.in_shape),
                               ("value", value, self.in_shape)):
            if x is not None:
                check_finite(self.grid, x, whole, what)
        return ", ".join(texts)

    # --- the call --------------------------------------------------------------------------------

    def __call__(self, query, key=None, value=None):
        return self.forward(query, key, value)

    @collective
    def forward(self, query, key=None, value=None):
        """The attention of ``query`` over ``key`` and ``value`` (the query itself where None).

        Parameters
        ----------
        query : array ``(B, in_channels, h_out, w_out)``
            This rank's tile of the output grid.
        key, value : arrays ``(B, in_channels, h_in, w_in)`` or None
            This rank's tiles of the input grid; None: the query
            (self-attention, ``in_shape == out_shape``).

        Returns
        -------
        array ``(B, out_channels, h_out, w_out)``: this rank's output tile. Collective over ``grid.cart``.
        """
        return self._forward_agreed(query, key, value)

    def _forward_agreed(self, query, key, value, purpose="", keep=False):
        """:meth:`forward`, ``purpose`` added to what the ranks compare (the torch bridge: whether autograd
        records the call, so that its backward, which communicates too, runs on every rank or on none).
        ``keep``: also return what the backward needs (for :meth:`_gradients_kept`)."""
        context = self._agree("forward", query, key, value, extra=purpose)
        y, saved = self._forward(query, key, value, context)
        return (y, saved) if keep else y

    @collective
    def _gradients_kept(self, saved, y_bar, input_gradient=True):
        """:meth:`gradients` from a forward's kept state (the torch bridge's backward: no second forward)."""
        call = Call(self.grid.cart, f"{self.name}.gradients")
        spec_y = Spec.of(y_bar)
        with call.local():
            check_tile(self.grid, spec_y, self.out_shape, self.dtype, self.out_channels, "y_bar")
            if spec_y.shape[0] != saved["xq"].shape[0]:
                raise InputError(f"y_bar: batch {spec_y.shape[0]} where the query's is {saved['xq'].shape[0]}")
        call.agree(f"{self._describe()} gradients: y_bar={spec_y.describe((-2, -1))}, "
                   f"input_gradient={bool(input_gradient)}, {self.describe_parameters()}")
        inputs, parts = self._backward(saved, y_bar, Context.local(spec_y))
        if not input_gradient:
            inputs = (None, None, None)
        return tuple(inputs) + self._sum_over_grid(parts)

    @collective
    def gradients(self, query, y_bar, key=None, value=None, input_gradient=True):
        """The backward of :meth:`forward`: the gradients of ``<y_bar, forward(query, key, value)>``.

        Returns
        -------
        tuple
            ``(query_bar, key_bar, value_bar, *one per parameter_names)``:
            this rank's tiles of the inputs' gradients (None for a key or
            value not given: self-attention's are in ``query_bar``; all None
            without ``input_gradient``), then each parameter's whole-sphere
            gradient, the same on every rank (None where not set).
        """
        spec_y = Spec.of(y_bar)

        def also():
            check_tile(self.grid, spec_y, self.out_shape, self.dtype, self.out_channels, "y_bar")
            if tuple(spec_y.shape[:1]) != tuple(Spec.of(query).shape[:1]):
                raise InputError(f"y_bar: batch {spec_y.shape[0]} where the query's is {Spec.of(query).shape[0]}")
        context = self._agree("gradients", query, key, value, also, f"input_gradient={bool(input_gradient)}")
        y, saved = self._forward(query, key, value, context)
        inputs, parts = self._backward(saved, y_bar, context)
        if not input_gradient:
            inputs = (None, None, None)
        return tuple(inputs) + self._sum_over_grid(parts)

    def _agree(self, label, query, key, value, also=None, extra=""):
        call = Call(self.grid.cart, f"{self.name}.{label}")
        text = None
        with call.local():
            text = self._check_inputs(query, key, value)
            if also is not None:
                also()
        call.agree(f"{self._describe()} {label}: {text}, {extra}, {self.describe_parameters()}")
        return Context.local(Spec.of(query))

    def _forward(self, query, key, value, context):
        """The output and what the backward needs."""
        xp = backend.array_module(query)
        p = self._on(query)
        b, c = query.shape[:2]
        xq = xp.ascontiguousarray(query).reshape(b, c, -1)
        self_attention = key is None and value is None
        key_source = query if key is None else key
        value_source = query if value is None else value
        keys_in, values_in = self._key_inputs(key_source, value_source, value_source is key_source, context)
        # the projections before normalisation are kept only where the normalisation's backward reads them
        q_raw = project(p["q_weights"], p["q_bias"], xq)
        q, q_inverse = (q_raw, None) if p["q_norm_weights"] is None else \
            rms_norm(q_raw, p["q_norm_weights"], self.num_heads)
        q *= self.scale
        q_raw = None if q_inverse is None else q_raw
        k_raw = project(p["k_weights"], p["k_bias"], keys_in)
        k, k_inverse = (k_raw, None) if p["k_norm_weights"] is None else \
            rms_norm(k_raw, p["k_norm_weights"], self.num_heads)
        k_raw = None if k_inverse is None else k_raw
        v = project(p["v_weights"], p["v_bias"], values_in)
        heads = self.num_heads
        qh = q.reshape((b, heads, -1) + self.tile_out)
        kh, vh = k.reshape(b, heads, -1, k.shape[-1]), v.reshape(b, heads, -1, v.shape[-1])
        attended, lse = self._attend(qh, kh, vh, context)
        flat = attended.reshape(b, self.out_channels, -1)
        y = project(p["proj_weights"], p["proj_bias"], flat).reshape((b, self.out_channels) + self.tile_out)
        saved = dict(p=p, xq=xq, self_attention=self_attention, key_given=key is not None,
                     value_given=value is not None, keys_in=keys_in, values_in=values_in, q_raw=q_raw,
                     q_inverse=q_inverse, k_raw=k_raw, k_inverse=k_inverse, qh=qh, kh=kh, vh=vh, attended=attended,
                     lse=lse)
        return y, saved

    def _backward(self, saved, y_bar, context):
        xp = backend.array_module(y_bar)
        p = saved["p"]
        b = y_bar.shape[0]
        parts = {}
        flat = saved["attended"].reshape(b, self.out_channels, -1)
        a_bar, parts["proj_weights"], parts["proj_bias"] = project_adjoint(
            p["proj_weights"], flat, xp.ascontiguousarray(y_bar).reshape(b, self.out_channels, -1),
            p["proj_bias"] is not None)
        q_bar, k_bar, v_bar = self._attend_backward(saved, a_bar.reshape(saved["attended"].shape), context)
        q_bar = q_bar.reshape(saved["xq"].shape[:1] + (self.k_channels, -1))
        q_bar *= self.scale
        if p["q_norm_weights"] is not None:
            q_bar, parts["q_norm_weights"] = rms_norm_adjoint(saved["q_raw"], p["q_norm_weights"],
                                                              saved["q_inverse"], q_bar, self.num_heads)
        xq_bar, parts["q_weights"], parts["q_bias"] = project_adjoint(p["q_weights"], saved["xq"], q_bar,
                                                                      p["q_bias"] is not None)
        k_bar = k_bar.reshape(k_bar.shape[0], self.k_channels, -1)
        if p["k_norm_weights"] is not None:
            k_bar, parts["k_norm_weights"] = rms_norm_adjoint(saved["k_raw"], p["k_norm_weights"],
                                                              saved["k_inverse"], k_bar, self.num_heads)
        keys_bar, parts["k_weights"], parts["k_bias"] = project_adjoint(p["k_weights"], saved["keys_in"], k_bar,
                                                                        p["k_bias"] is not None)
        values_bar, parts["v_weights"], parts["v_bias"] = project_adjoint(
            p["v_weights"], saved["values_in"], v_bar.reshape(v_bar.shape[0], -1, v_bar.shape[-1]),
            p["v_bias"] is not None)
        parts = {name: backend.to_host(value) for name, value in parts.items() if value is not None}
        query_bar = xq_bar.reshape(saved["xq"].shape[:2] + self.tile_out)
        if saved["self_attention"]:     # one way back for both: they came from the query's tile
            query_bar = query_bar + self._key_inputs_adjoint(keys_bar + values_bar, context)
            return (query_bar, None, None), parts
        key_bar = self._key_inputs_adjoint(keys_bar, context)
        value_bar = self._key_inputs_adjoint(values_bar, context)
        if not saved["key_given"]:
            query_bar, key_bar = query_bar + key_bar, None
        if not saved["value_given"]:
            query_bar, value_bar = query_bar + value_bar, None
        return (query_bar, key_bar, value_bar), parts
