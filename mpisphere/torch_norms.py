"""Normalisation over the whole sphere for tiles (the ``torch`` extra): instance, layer and batch normalisation.

``torch.nn.InstanceNorm2d``, ``torch.nn.LayerNorm((nlat, nlon))`` and
``torch.nn.BatchNorm2d`` take their statistics over every point of a field
(and, for batch normalisation, the batch). On a tile those statistics are
the whole sphere's: each module here sums its tile's part and the grid adds
the parts in **one** ``Allreduce`` per call and direction (the forward's
sums and squares; the backward's two sums and the parameters' gradients
together), in float64, so the result is the serial module's up to rounding.
Parameters and buffers keep the serial module's names and whole shapes (a
serial ``state_dict`` loads; a layer norm's per-point ``weight`` and
``bias`` are ``(nlat, nlon)``, each rank using its tile of them), their
gradients are whole-sphere gradients on every rank, and batch
normalisation's running statistics are the same on every rank. Each call
agrees first (batch, channels, dtype and mode alike on every rank).
"""

import numpy
import torch

from . import backend
from .agreement import Call, InputError, collective
from .operators.parametrised import sum_parts
from .torch import as_array, as_tensor
from .torch_layers import _grid_of

__all__ = ["DistributedInstanceNorm2d", "DistributedLayerNorm", "DistributedBatchNorm2d"]


class _Normalise(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps) * scale + shift`` with the whole sphere's statistics (see the module)."""

    @staticmethod
    def forward(ctx, x, module, statistics, scale, shift):
        ctx.module = module
        xa = as_array(x.contiguous())
        xp = backend.array_module(xa)
        axes = module._axes
        if statistics is None:
            local = [backend.to_host(xa.sum(axis=axes, dtype=numpy.float64)),
                     backend.to_host((xa.astype(numpy.float64) ** 2).sum(axis=axes)),
                     numpy.array([float(numpy.prod([xa.shape[a] for a in axes]))])]
            sums, squares, count = sum_parts(module.process_grid.cart, local)
            mean = sums / count[0]
            var = numpy.maximum(squares / count[0] - mean * mean, 0.0)
            ctx.count = float(count[0])
            module._observed(mean, var, float(count[0]))
        else:
            mean, var = statistics
            ctx.count = None
        inverse = 1.0 / numpy.sqrt(var + module.eps)
        shape = module._stat_shape(xa)
        mean_d = backend.on_device_of(xa, mean.reshape(shape).astype(xa.dtype), {})
        inverse_d = backend.on_device_of(xa, inverse.reshape(shape).astype(xa.dtype), {})
        normalised = (xa - mean_d) * inverse_d
        ctx.save_for_backward(x)
        ctx.saved = (normalised, inverse_d)
        y = normalised
        if scale is not None:
            y = y * module._broadcast(as_array(scale.detach()), xa)
        if shift is not None:
            y = y + module._broadcast(as_array(shift.detach()), xa)
        return as_tensor(xp.ascontiguousarray(y))

    @staticmethod
    def backward(ctx, grad):
        module = ctx.module
        normalised, inverse = ctx.saved
        dy = as_array(grad.contiguous())
        xp = backend.array_module(dy)
        scale, shift = module._affine()
        g = dy if scale is None else dy * module._broadcast(as_array(scale.detach()), dy)
        axes = module._axes
        parts = []
        if ctx.count is not None:     # training statistics: the mean and variance depend on x
            parts += [backend.to_host(g.sum(axis=axes, dtype=numpy.float64)),
                      backend.to_host((g * normalised).sum(axis=axes, dtype=numpy.float64))]
        if scale is not None:
            parts.append(module._parameter_part(backend.to_host((dy * normalised).astype(numpy.float64))))
        if shift is not None:
            parts.append(module._parameter_part(backend.to_host(dy.astype(numpy.float64))))
        found = sum_parts(module.process_grid.cart, parts)
        x_bar = g * inverse
        if ctx.count is not None:
            sum_g, sum_gn = found[:2]
            found = found[2:]
            shape = module._stat_shape(dy)
            correction = (backend.on_device_of(dy, (sum_g / ctx.count).reshape(shape).astype(dy.dtype), {})
                          + normalised * backend.on_device_of(dy, (sum_gn / ctx.count).reshape(shape)
                                                              .astype(dy.dtype), {}))
            x_bar = (g - correction) * inverse
        grads = [as_tensor(xp.ascontiguousarray(x_bar)), None, None]
        for tensor in (scale, shift):
            if tensor is None:
                grads.append(None)
                continue
            grads.append(torch.from_numpy(found.pop(0).reshape(tuple(tensor.shape))).to(grad.device, tensor.dtype))
        return tuple(grads)


class _SphereNorm(torch.nn.Module):
    """What the three share: the grid, the agreement of a call, the autograd node."""

    mpisphere_sums_own_gradients = True  # (torch_replicate.SUMS_OWN_GRADIENTS) its backward sums them

    _axes = (2, 3)

    def _init_grid(self, process_grid):
        self.process_grid = self.grid = _grid_of(process_grid)    # grid: what @collective holds

    def _affine(self):
        return self.weight, self.bias

    def _observed(self, mean, var, count):
        """Training statistics seen (batch normalisation updates its running ones)."""

    def _running(self):
        """``(mean, var)`` to use instead of the batch's (eval mode with running statistics), or None."""
        return None

    def _stat_shape(self, x):
        return x.shape[:2] + (1, 1)

    def _broadcast(self, parameter, like):
        return parameter.reshape(-1, 1, 1).astype(like.dtype)

    def _parameter_part(self, per_point):
        """This rank's part of a per-channel parameter's gradient: ``(C,)``."""
        return per_point.sum(axis=(0, 2, 3))

    @collective
    def forward(self, x):
        """``(B, C, h, w)`` tile -> ``(B, C, h, w)`` tile, normalised with the whole sphere's statistics."""
        call = Call(self.process_grid.cart, f"{type(self).__name__}.forward")
        with call.local():
            if x.dim() != 4:
                raise InputError(f"expected a (batch, channels, h, w) tile, got shape {tuple(x.shape)}")
            self._check(x)
        statistics = self._running()
        call.agree(f"{type(self).__name__}: batch and channels {tuple(x.shape[:2])}, {x.dtype}, "
                   f"{'running statistics' if statistics is not None else 'batch statistics'}, "
                   f"grad={torch.is_grad_enabled() and x.requires_grad}")
        scale, shift = self._affine()
        return _Normalise.apply(x, self, statistics, scale, shift)

    def _check(self, x):
        if x.shape[1] != self.num_features:
            raise InputError(f"expected {self.num_features} channels, got {x.shape[1]}")


class DistributedInstanceNorm2d(_SphereNorm):
    """``torch.nn.InstanceNorm2d`` over the whole sphere: per field and channel, the statistics of every point.

    Same arguments and parameters (``weight``, ``bias`` ``(num_features,)`` with ``affine``);
    ``track_running_stats`` is refused (the example models do not use it).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False, *,
                 process_grid=None):
        super().__init__()
        if track_running_stats:
            raise ValueError("DistributedInstanceNorm2d: track_running_stats=True is not supported; "
                             "use DistributedBatchNorm2d for running statistics")
        self._init_grid(process_grid)
        self.num_features, self.eps, self.momentum, self.affine = num_features, eps, momentum, affine
        self.weight = torch.nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = torch.nn.Parameter(torch.zeros(num_features)) if affine else None


class DistributedLayerNorm(_SphereNorm):
    """``torch.nn.LayerNorm((nlat, nlon))`` on tiles: per field and channel over the sphere, per-point affine.

    ``weight`` and ``bias`` are ``(nlat, nlon)``, whole on every rank (a serial ``state_dict`` loads); each
    rank uses its tile of them, and their gradients are whole-sphere gradients on every rank.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *, process_grid=None):
        super().__init__()
        self._init_grid(process_grid)
        shape = tuple(normalized_shape) if not isinstance(normalized_shape, int) else (normalized_shape,)
        if len(shape) != 2:
            raise ValueError(f"DistributedLayerNorm: normalized_shape must be (nlat, nlon), got {normalized_shape!r}"
                             "; a layer norm over channels only (the examples' LayerNorm wrapper) runs on tiles "
                             "as it is")
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.weight = torch.nn.Parameter(torch.ones(shape)) if elementwise_affine else None
        self.bias = torch.nn.Parameter(torch.zeros(shape)) if elementwise_affine and bias else None
        self._slices = self.process_grid.local_slices(*shape)

    def _check(self, x):
        expected = self.process_grid.local_shape(*self.normalized_shape)
        if tuple(x.shape[-2:]) != tuple(expected):
            raise InputError(f"expected this rank's tile {tuple(expected)} of the {self.normalized_shape} grid, got "
                             f"{tuple(x.shape[-2:])}")

    def _broadcast(self, parameter, like):
        return parameter[self._slices].astype(like.dtype)

    def _parameter_part(self, per_point):
        whole = numpy.zeros(self.normalized_shape)
        whole[self._slices] = per_point.sum(axis=(0, 1))
        return whole


class DistributedBatchNorm2d(_SphereNorm):
    """``torch.nn.BatchNorm2d`` over the whole sphere and batch, its running statistics the same on every rank.

    Same arguments, parameters and buffers (``weight``, ``bias``, ``running_mean``, ``running_var``,
    ``num_batches_tracked``); training uses the batch's statistics over every point of every rank and
    updates the running ones (unbiased variance, PyTorch's rule); eval mode uses the running ones.
    """

    _axes = (0, 2, 3)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, *,
                 process_grid=None):
        super().__init__()
        self._init_grid(process_grid)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = torch.nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = torch.nn.Parameter(torch.zeros(num_features)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _stat_shape(self, x):
        return (1, x.shape[1], 1, 1)

    def _running(self):
        if self.training or not self.track_running_stats:
            return None
        return self.running_mean.double().numpy(), self.running_var.double().numpy()

    def _observed(self, mean, var, count):
        if not (self.training and self.track_running_stats):
            return
        with torch.no_grad():
            self.num_batches_tracked += 1
            factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
            unbiased = var * count / max(count - 1.0, 1.0)
            self.running_mean.mul_(1 - factor).add_(factor * torch.from_numpy(mean).to(self.running_mean.dtype))
            self.running_var.mul_(1 - factor).add_(factor * torch.from_numpy(unbiased).to(self.running_var.dtype))
