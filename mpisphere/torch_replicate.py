"""Whole-sphere parameters for any PyTorch module on a process grid: ``replicate`` (the ``torch`` extra).

Every rank of a :class:`~mpisphere.ProcessGrid` runs the same model on its
own tile of the same sample. A parameter used on the tiles is replicated:
its gradient is the sum over the ranks of each tile's gradient. mpisphere's
drop-in modules (:mod:`mpisphere.torch_harmonics`) sum their own parameters'
gradients in their backward; the parameters of any other module (a linear
layer, an MLP, a 1 x 1 convolution, a learnable scale) get one tile's
gradient each unless something sums them, and a model trained so drifts
apart rank by rank without an error. ``replicate`` is that something,
for a whole model at once::

    model = Model()                      # drop-in modules and plain torch layers
    thd.replicate(model)                 # once, before the first step

and then, for every parameter of ``model`` (the drop-in modules' and the
others'):

* its value is rank 0's on every rank (now), and every forward of
  ``model`` compares every parameter across the ranks (a digest of each):
  a parameter that differs on one rank (a checkpoint loaded there only, a
  step taken there only) raises on every rank, naming its path in the model
  (``head.weight``);
* its gradient after ``backward`` is the whole-sphere gradient on every
  rank: the parameters that no mpisphere module sums get a gradient hook
  that sums them over the grid (one agreement and one ``Allreduce`` per
  parameter and backward; gradient accumulation over several backward
  calls stays right, the hook sums each backward's own part).

A layer whose output at a point depends on other points (a convolution
wider than 1 x 1, pooling, up-sampling, batch, instance or group
normalisation, a layer normalisation over two axes or more) cannot run on a
tile as it is: ``replicate`` refuses it, on every rank, by its path.
Pointwise layers (linear layers, 1 x 1 convolutions, activations,
normalisations over channels) run as they are.
"""

import functools

import numpy
import torch

from . import collectives
from .agreement import Call
from .agreement.description import describe_parameter

__all__ = ["replicate", "Replication", "ReplicationWarning", "SUMS_OWN_GRADIENTS"]

SUMS_OWN_GRADIENTS = "mpisphere_sums_own_gradients"
"""The attribute (``True``) of a module whose backward sums its own parameters' gradients over the grid."""

_POINT_MIXERS = (torch.nn.modules.pooling._MaxPoolNd, torch.nn.modules.pooling._AvgPoolNd,
                 torch.nn.modules.pooling._AdaptiveAvgPoolNd, torch.nn.modules.pooling._AdaptiveMaxPoolNd,
                 torch.nn.modules.pooling._LPPoolNd, torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm,
                 torch.nn.LocalResponseNorm, torch.nn.Upsample, torch.nn.Fold, torch.nn.Unfold,
                 torch.nn.PixelShuffle, torch.nn.PixelUnshuffle)


class ReplicationWarning(UserWarning):
    """A drop-in module trains in a model that ``replicate`` has not covered (plain layers beside it would get
    one tile's gradient)."""


def _mixes_points(module):
    """Why ``module`` cannot run on a tile as it is (its output at a point reads other points), or None."""
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        pointwise = (all(k == 1 for k in module.kernel_size) and all(s == 1 for s in module.stride)
                     and not module.transposed and (isinstance(module.padding, str) or not any(module.padding)))
        if not pointwise:
            return (f"kernel_size={tuple(module.kernel_size)}, stride={tuple(module.stride)}: it reads neighbouring "
                    "points, which lie on other ranks' tiles",
                    "a DISCO convolution (DistributedDiscreteContinuousConvS2) or a 1 x 1 convolution")
        return None
    if isinstance(module, torch.nn.LayerNorm) and len(module.normalized_shape) >= 2:
        return (f"normalized_shape={tuple(module.normalized_shape)}: its statistics run over the spatial axes, whole "
                "on no rank", "a LayerNorm over the channels only")
    if isinstance(module, _POINT_MIXERS):
        return ("its output at a point depends on other points (statistics, pooling or resampling over the tile)",
                "a distributed layer (DistributedResampleS2 for resampling) or a pointwise one")
    return None


def _as_host(tensor):
    """A float64 NumPy copy of ``tensor``, flat (a complex tensor as its real pairs)."""
    host = tensor.detach().to("cpu").resolve_conj()
    if host.is_complex():
        host = torch.view_as_real(host)
    return host.to(torch.float64).contiguous().numpy().reshape(-1)


def _bits(tensor):
    """``tensor``'s values as a NumPy array of the same bits (bfloat16 as int16, complex as real pairs), host."""
    host = tensor.detach().to("cpu").resolve_conj().contiguous()
    if host.is_complex():
        host = torch.view_as_real(host)
    if host.dtype == torch.bfloat16:
        host = host.view(torch.int16)
    return host.numpy()


class Replication:
    """What ``replicate`` attached to a module: its grid, the parameters it covers by path, its hooks.

    Attributes
    ----------
    grid : ProcessGrid
    summed : tuple of str
        The paths of the parameters whose gradients its hooks sum over the grid
        (those of the modules that do not sum their own).
    own : tuple of str
        The paths of the parameters that mpisphere's modules sum themselves.
    random : tuple of str
        The paths of the layers that draw random numbers (``distribute`` sets
        it): while it is not empty, a forward in training mode also compares
        the torch generators' states across the ranks, in the same agreement.
    """

    def __init__(self, module, grid):
        self.grid, self.name = grid, type(module).__name__
        self.parameters = dict(module.named_parameters())
        own = set()
        for path, child in module.named_modules():
            if getattr(child, SUMS_OWN_GRADIENTS, False):
                own.update(f"{path}.{name}" if path else name for name, _ in child.named_parameters())
        self.own = tuple(p for p in self.parameters if p in own)
        self.summed = tuple(p for p in self.parameters if p not in own)
        self.random = ()
        self._handles = []

    def attach(self, module, call):
        """Refuse what cannot run on a tile, share rank 0's values, add the hooks. Collective (``call``'s)."""
        with call.local():
            for path, child in module.named_modules():
                found = _mixes_points(child)
                if found is not None:
                    why, fix = found
                    raise ValueError(f"replicate({self.name}): {path or 'the module'} ({type(child).__name__}) "
                                     f"cannot run on a tile as it is: {why}\n  fix: {fix}")
        call.agree(parameters=[(path, tuple(p.shape), str(p.dtype)) for path, p in self.parameters.items()],
                   mismatch="hold different parameters (names, shapes or dtypes)")
        values = call.share([p.detach().cpu() for p in self.parameters.values()])
        with torch.no_grad():
            for p, value in zip(self.parameters.values(), values):
                p.copy_(value)
        for path in self.summed:
            p = self.parameters[path]
            if p.requires_grad:
                self._handles.append(p.register_hook(functools.partial(self._sum, path)))
        self._handles.append(module.register_forward_pre_hook(self._compare))
        module.mpisphere_replication = self
        for child in module.modules():
            if getattr(child, SUMS_OWN_GRADIENTS, False):
                child.mpisphere_covered = True

    def detach(self, module):
        """Remove the hooks (the parameters keep their values)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if getattr(module, "mpisphere_replication", None) is self:
            del module.mpisphere_replication

    def _compare(self, module, args):
        """Every parameter's digest compared across the ranks before the forward: a difference raises everywhere."""
        call = Call(self.grid.cart, f"{self.name}.forward (replicated)")
        with self.grid.holding(call.who):
            with call.local():
                digests = {path: describe_parameter(_bits(p)) for path, p in self.parameters.items()}
                if self.random and module.training:
                    # dropout masks are drawn alike on every rank only from generators in the same state
                    digests[" random generator"] = describe_parameter(_generator_state(module))
            call.agree(mismatch="hold different values of the model's parameters or random generator states (each "
                                "rank must hold the same: a checkpoint loaded or a step taken on some ranks only, "
                                "or torch.manual_seed with a different seed?)", **digests)

    def _sum(self, path, grad):
        """The hook of one parameter: its gradient summed over the grid (this backward's part only)."""
        call = Call(self.grid.cart, f"{self.name}: the gradient of {path} (replicated)")
        with self.grid.holding(call.who):
            flat = None
            with call.local():
                flat = _as_host(grad)
            call.agree(parameter=path, shape=tuple(grad.shape), dtype=str(grad.dtype))
            total = numpy.empty_like(flat)
            collectives.allreduce(self.grid.cart, flat, total)
        summed = torch.from_numpy(total)
        if grad.is_complex():
            summed = torch.view_as_complex(summed.reshape(tuple(grad.shape) + (2,)))
            return summed.to(grad.dtype).to(grad.device)
        return summed.reshape(grad.shape).to(grad.dtype).to(grad.device)


def _generator_state(module):
    """The state of the generator a module's random layers draw from (CPU, or the current CUDA device's)."""
    cuda = any(p.is_cuda for p in module.parameters())
    return (torch.cuda.get_rng_state() if cuda else torch.get_rng_state()).numpy()


def replicate(module, grid):
    """Make every parameter of ``module`` a whole-sphere one on ``grid``: rank 0's values, summed gradients. Collective.

    Parameters
    ----------
    module : torch.nn.Module
        A model (or any module) whose ranks each run it on their own tile of
        the same samples. Its drop-in modules (:mod:`mpisphere.torch_harmonics`)
        already sum their own gradients; every other parameter gets a hook
        that sums its gradient over ``grid.cart``.
    grid : ProcessGrid

    Returns
    -------
    Replication
        What was attached (``.summed``, ``.own``: the parameters' paths);
        also ``module.mpisphere_replication``. Calling ``replicate`` again
        (after adding layers) replaces it.

    Raises
    ------
    ValueError
        On every rank: a layer that cannot run on a tile (named by its path
        in ``module``, with what to use instead), or parameters that differ in
        name, shape or dtype between the ranks.
    """
    who = f"replicate({type(module).__name__})"
    with grid.holding(who):
        call = Call(grid.cart, who)
        replication = None
        with call.local():
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"{who}: expected a torch.nn.Module, got {type(module).__name__}")
            replication = Replication(module, grid)
        call.agree()
        previous = getattr(module, "mpisphere_replication", None)
        if previous is not None:
            previous.detach(module)
        replication.attach(module, call)
    return replication
