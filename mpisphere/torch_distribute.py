"""A whole serial model on tiles by one call: ``distribute(model)`` (the ``torch`` extra).

``distribute`` copies a model (the given one is left as it is) and replaces,
wherever it appears in the copy, every layer whose output at a point reads
other points by its distributed module:

* torch-harmonics' transforms, DISCO convolutions and their transposes,
  resampling, quadrature, spectral convolution, neighbourhood and global
  attention: their drop-in modules (:mod:`mpisphere.torch_harmonics`), with
  the serial module's arguments and parameters;
* the example models' ``SpectralConvS2``: :class:`~mpisphere.torch_spectral_filter.DistributedSpectralFilter`
  over the converted transforms (a transform shared by several layers stays
  one module);
* ``nn.InstanceNorm2d``, ``nn.BatchNorm2d`` and ``nn.LayerNorm`` over
  ``(nlat, nlon)``: their whole-sphere versions (:mod:`mpisphere.torch_norms`);
* ``nn.Dropout``: :class:`~mpisphere.torch_dropout.DistributedDropout` (the
  serial model's element mask, this rank's tile of it); ``nn.Dropout2d`` and
  the examples' ``DropPath`` draw one number per sample or channel and run as
  they are;
* the examples' position embeddings: :class:`~mpisphere.torch_embedding.DistributedPositionEmbedding`.

Pointwise layers (1 x 1 convolutions, linear layers, activations,
normalisations over the channels, the examples' MLPs) run as they are. A
layer that cannot run on a tile (a wider convolution, pooling, an FFT of the
plane, a module of unknown kind whose ``forward`` calls ``interpolate``,
``pad``, ``roll`` or an FFT) is refused before anything is built, on every
rank, by its path in the model. Then :func:`~mpisphere.torch_harmonics.replicate`
covers the whole copy: every parameter holds rank 0's value, is compared
across the ranks at every forward, and gets its whole-sphere gradient in the
backward; in training mode, where the model has random layers, the ranks'
generator states are compared too (one agreement for both).
"""

import copy

import torch

from .agreement import Call
from .torch_conversions import Refusal, is_library_module, plan
from .torch_replicate import _mixes_points, replicate

__all__ = ["distribute"]

_RANDOM = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout)


def _walk(root):
    """Every module of ``root`` once, children before parents, with its path (the first) and every (parent, name)
    that holds it."""
    order, paths, holders = [], {}, {}

    def visit(module, path):
        key = id(module)
        if key in paths:
            return
        paths[key] = path
        for name, child in module.named_children():
            holders.setdefault(id(child), []).append((module, name))
            visit(child, f"{path}.{name}" if path else name)
        order.append(module)
    visit(root, "")
    return order, paths, holders


def _random_layer(module):
    p = getattr(module, "p", getattr(module, "drop_prob", None))
    kind = isinstance(module, _RANDOM) or type(module).__name__ in ("DropPath", "DistributedDropout")
    return kind and p is not None and p > 0.0


_PLAIN = (bool, int, float, str, type(None))


def _settings(module):
    """A layer's plain settings (``p``, ``eps``, ``nlat``, ``theta_cutoff``, ...), compared by value across the ranks:
    a dropout rate or a cutoff that differs on one rank would give that rank other results without an error."""
    def plain(value):
        return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value))
    return {name: value for name, value in vars(module).items() if not name.startswith("_") and plain(value)}


def _hints(order):
    """The latitude rules the model's transforms and layers name, in the order met."""
    found = []
    for module in order:
        for attribute in ("grid", "grid_in", "grid_out"):
            value = getattr(module, attribute, None)
            if isinstance(value, str):
                found.append(value)
    return found


def distribute(model, pg, library):
    """A copy of ``model`` on the tiles of ``pg`` (see :func:`mpisphere.torch_harmonics.distribute`). Collective.

    Parameters
    ----------
    model : torch.nn.Module
    pg : ProcessGrid
    library : module
        Where the distributed modules are (``mpisphere.torch_harmonics``, which calls this).
    """
    thd = library
    who = f"distribute({type(model).__name__})"
    with pg.holding(who):
        call = Call(pg.cart, who)
        result, builders, order, paths, holders = None, {}, [], {}, {}
        with call.local():
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"{who}: expected a torch.nn.Module, got {type(model).__name__}")
            # torch-harmonics' own layers are replaced (or refused), never changed: the copy may share them
            shared = {id(m): m for m in model.modules() if is_library_module(m)}
            result = copy.deepcopy(model, shared)
            order, paths, holders = _walk(result)
            hints = _hints(order)
            for module in order:
                try:
                    builder = plan(module, hints, thd, _mixes_points)
                except Refusal as refusal:
                    raise ValueError(f"{who}: {paths[id(module)] or 'the model'} ({type(module).__name__}) cannot "
                                     f"be distributed: {refusal.why}\n  fix: {refusal.fix}") from None
                if builder is not None:
                    builders[id(module)] = builder
        call.agree(layers=[(paths[id(m)], type(m).__name__, id(m) in builders, _settings(m)) for m in order],
                   mismatch="hold different models (layers, their kinds, paths or settings)")
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with torch.random.fork_rng(devices=[]):
            for module in order:          # children first: a parent's builder sees its converted children
                builder = builders.get(id(module))
                if builder is None:
                    continue
                built = builder(pg)
                built.train(module.training)
                for parent, name in holders.get(id(module), []):
                    parent._modules[name] = built.to(device)
                if module is result:
                    result = built.to(device)
        replication = replicate(result, pg)
        replication.random = tuple(path for path, m in result.named_modules() if _random_layer(m))
    return result
