"""torch-harmonics' distributed attention modules on mpisphere's attention operators (the ``torch`` extra).

``DistributedNeighborhoodAttentionS2`` and ``DistributedAttentionS2`` take
torch-harmonics 0.9.3's constructor arguments and parameter names; each
takes this rank's tiles (``forward(query, key=None, value=None)``) and
returns this rank's output tile. Unlike torch-harmonics' (CUDA and NCCL
only, a ring of every azimuth rank's keys and values), they run on the CPU
and the GPU, receive only the points their neighbourhoods reach, and their
parameters are the serial module's, whole on every rank, with whole-sphere
gradients (``mpisphere.torch_harmonics``'s notes). Re-exported by
:mod:`mpisphere.torch_harmonics`.
"""

import math

import torch

from .attention import AttentionS2, NeighborhoodAttentionS2
from .torch import RECORDED, as_array, as_tensor
from .torch_layers import ParametrisedLayer, _constructing, _grid_of, _PerDtype, _shape, compute_split_shapes

__all__ = ["DistributedNeighborhoodAttentionS2", "DistributedAttentionS2"]


class _AttentionFunction(torch.autograd.Function):
    """One attention call as one autograd node: forward by the operator, backward by its ``gradients`` from the
    forward's kept state (the projections, the received points, the softmax's maxima and sums)."""

    @staticmethod
    def forward(ctx, query, key, value, layer, recorded, *parameters):
        ctx.layer = layer
        ctx.save_for_backward(query, *parameters)
        op = layer._operator_for(query, parameters)
        arrays = [None if t is None else as_array(t.contiguous()) for t in (query, key, value)]
        y, ctx.kept = op._forward_agreed(*arrays, purpose=RECORDED if recorded else "", keep=True)
        if not recorded:
            ctx.kept = None
        return as_tensor(y)

    @staticmethod
    def backward(ctx, grad):
        query, *parameters = ctx.saved_tensors
        op = ctx.layer._operator_for(query, parameters)   # the forward's values: another call may have set others
        found = op._gradients_kept(ctx.kept, as_array(grad.contiguous()), input_gradient=any(ctx.needs_input_grad[:3]))
        ctx.kept = None
        inputs = [None if g is None else as_tensor(g) for g in found[:3]]
        grads = []
        for attribute, g in zip(ctx.layer._parameter_attributes, found[3:]):
            tensor = getattr(ctx.layer, attribute)
            if tensor is not None:
                grads.append(torch.from_numpy(g).reshape(tensor.shape).to(grad.device, tensor.dtype))
        return tuple(inputs) + (None, None) + tuple(grads)


class _AttentionLayer(ParametrisedLayer):
    """What both attention modules share: torch-harmonics' parameters, their initial values, the call."""

    _parameter_attributes = ("q_weights", "k_weights", "v_weights", "proj_weights", "q_bias", "k_bias", "v_bias",
                             "proj_bias", "q_norm_weights", "k_norm_weights")

    def _build(self, pg, operator, in_channels, in_shape, out_shape, grid_in, grid_out, num_heads, scale,
               use_qknorm, bias, k_channels, out_channels, **options):
        """The attributes, the operator per dtype and the parameters (rank 0's start), after the agreement."""
        self.process_grid = pg
        self.nlat_in, self.nlon_in = in_shape
        self.nlat_out, self.nlon_out = out_shape
        self.in_channels, self.num_heads = in_channels, num_heads
        self.k_channels = in_channels if k_channels is None else k_channels
        self.out_channels = in_channels if out_channels is None else out_channels
        self.comm_size_polar, self.comm_rank_polar = pg.npolar, pg.polar_rank
        self.comm_size_azimuth, self.comm_rank_azimuth = pg.nazimuth, pg.azimuth.rank
        self.lat_in_shapes = compute_split_shapes(self.nlat_in, pg.npolar)
        self.lon_in_shapes = compute_split_shapes(self.nlon_in, pg.nazimuth)
        self.lat_out_shapes = compute_split_shapes(self.nlat_out, pg.npolar)
        self.lon_out_shapes = compute_split_shapes(self.nlon_out, pg.nazimuth)
        self.nlat_in_local, self.nlon_in_local = self.lat_in_shapes[pg.polar_rank], self.lon_in_shapes[
            pg.azimuth.rank]
        self.nlat_out_local, self.nlon_out_local = self.lat_out_shapes[pg.polar_rank], self.lon_out_shapes[
            pg.azimuth.rank]
        self._ops = _PerDtype(lambda dtype: operator(pg, in_channels, in_shape, out_shape, num_heads,
                                                     quadrature_in=grid_in, quadrature_out=grid_out, scale=scale,
                                                     k_channels=k_channels, out_channels=out_channels, dtype=dtype,
                                                     **options))
        op = self._ops(torch.float32)   # built now: a bad argument is refused at construction, on every rank
        self.scale = op.scale
        c, k, o = self.in_channels, self.k_channels, self.out_channels
        scale_qk, scale_v = math.sqrt(6.0 / (c + k)), math.sqrt(6.0 / (c + o))

        def uniform(bound, *shape):
            return torch.nn.Parameter(bound * (2 * torch.rand(*shape) - 1))
        self.q_weights, self.k_weights = uniform(scale_qk, k, c, 1, 1), uniform(scale_qk, k, c, 1, 1)
        self.v_weights, self.proj_weights = uniform(scale_v, o, c, 1, 1), uniform(math.sqrt(3.0 / o), o, o, 1, 1)
        for name, size in (("q_bias", k), ("k_bias", k), ("v_bias", o), ("proj_bias", o)):
            setattr(self, name, torch.nn.Parameter(torch.zeros(size)) if bias else None)
        for name in ("q_norm_weights", "k_norm_weights"):
            setattr(self, name, torch.nn.Parameter(torch.zeros(k // num_heads)) if use_qknorm else None)
        self._share_initial_parameters()
        return op

    def forward(self, query, key=None, value=None):
        """``query`` ``(B, in_channels, h_out, w_out)`` tile, ``key``/``value`` tiles of the input grid (None:
        the query) -> ``(B, out_channels, h_out, w_out)`` tile."""
        parameters = tuple(p for p in (getattr(self, a) for a in self._parameter_attributes) if p is not None)
        inputs = [t for t in (query, key, value) if t is not None]
        recorded = self._recorded(query, parameters) or (torch.is_grad_enabled()
                                                        and any(t.requires_grad for t in inputs))
        return _AttentionFunction.apply(query, key, value, self, recorded, *parameters)

    def extra_repr(self):
        return (f"in_shape={(self.nlat_in, self.nlon_in)}, out_shape={(self.nlat_out, self.nlon_out)}, "
                f"in_channels={self.in_channels}, out_channels={self.out_channels}, k_channels={self.k_channels}")


def _float_scale(scale, who):
    """A fixed ``scale`` (a number or a tensor without gradient) as a float; None stays None."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.requires_grad or scale.numel() != 1:
            raise ValueError(f"{who}: scale must be a number (or a one-element tensor without gradient), got a "
                             f"tensor of shape {tuple(scale.shape)}"
                             + (" that requires grad" if scale.requires_grad else "")
                             + "; a learnable scale is not supported")
        return float(scale)
    return float(scale)


class DistributedNeighborhoodAttentionS2(_AttentionLayer):
    """torch-harmonics' ``DistributedNeighborhoodAttentionS2`` on :class:`~mpisphere.NeighborhoodAttentionS2`.

    torch-harmonics' constructor arguments (``optimized_kernel`` accepted,
    changing nothing) and parameters: ``q_weights``, ``k_weights``,
    ``v_weights``, ``proj_weights`` ``(out, in, 1, 1)``, the biases and the
    q/k normalisation gains, whole on every rank.
    """

    def __init__(self, in_channels, in_shape, out_shape, grid_in="equiangular", grid_out="equiangular", num_heads=1,
                 scale=None, use_qknorm=False, bias=True, theta_cutoff=None, k_channels=None, out_channels=None,
                 optimized_kernel=True, *, process_grid=None):
        super().__init__()
        pg = _grid_of(process_grid)
        name = type(self).__name__
        with _constructing(pg, name, in_channels=in_channels, in_shape=in_shape, out_shape=out_shape,
                           grid_in=grid_in, grid_out=grid_out, num_heads=num_heads,
                           scale=None if scale is None else float(scale), use_qknorm=use_qknorm, bias=bias,
                           theta_cutoff=theta_cutoff, k_channels=k_channels, out_channels=out_channels):
            in_shape, out_shape = _shape(in_shape, "in_shape"), _shape(out_shape, "out_shape")
            scale = _float_scale(scale, name)
        self.optimized_kernel = optimized_kernel
        op = self._build(pg, NeighborhoodAttentionS2, in_channels, in_shape, out_shape, grid_in, grid_out, num_heads,
                         scale, use_qknorm, bias, k_channels, out_channels, theta_cutoff=theta_cutoff)
        self.theta_cutoff = op.theta_cutoff

    def extra_repr(self):
        return super().extra_repr() + f", theta_cutoff={self.theta_cutoff}"


class DistributedAttentionS2(_AttentionLayer):
    """torch-harmonics' ``AttentionS2``, distributed, on :class:`~mpisphere.AttentionS2` (global attention).

    torch-harmonics 0.9.3 has no distributed global attention; this takes
    the serial module's arguments and parameters. ``drop_rate`` must be 0
    (attention dropout would need the serial model's masks).
    """

    def __init__(self, in_channels, num_heads, in_shape, out_shape, grid_in="equiangular", grid_out="equiangular",
                 scale=None, use_qknorm=False, bias=True, k_channels=None, out_channels=None, drop_rate=0.0, *,
                 process_grid=None):
        super().__init__()
        pg = _grid_of(process_grid)
        name = type(self).__name__
        with _constructing(pg, name, in_channels=in_channels, num_heads=num_heads, in_shape=in_shape,
                           out_shape=out_shape, grid_in=grid_in, grid_out=grid_out,
                           scale=None if scale is None else float(scale), use_qknorm=use_qknorm, bias=bias,
                           k_channels=k_channels, out_channels=out_channels, drop_rate=drop_rate):
            in_shape, out_shape = _shape(in_shape, "in_shape"), _shape(out_shape, "out_shape")
            scale = _float_scale(scale, name)
            if drop_rate:
                raise ValueError(f"{name}: drop_rate={drop_rate}: attention dropout is not supported (its masks "
                                 "would differ from the serial model's); use drop_rate=0.0")
        self.drop_rate = 0.0
        self._build(pg, AttentionS2, in_channels, in_shape, out_shape, grid_in, grid_out, num_heads, scale,
                    use_qknorm, bias, k_channels, out_channels)

