"""How each serial layer of a torch-harmonics model becomes its distributed module (the ``torch`` extra).

:func:`mpisphere.torch_harmonics.distribute` walks a model and asks
``plan`` about every module: a conversion (a function that builds the
distributed module, collectively), nothing (the module runs on a tile as it
is, or is a container of modules that are themselves asked), or a refusal
(why, and what to use instead). ``plan`` is local and communicates nothing;
the builders are collective and run in the same order on every rank.

The serial module's constructor arguments are read back from its
attributes. Where torch-harmonics keeps no attribute for one (a DISCO
convolution's ``grid_in``, ``grid_out`` and ``basis_norm_mode``; an
attention's grids), the candidates are tried in turn: a serial module built
with a candidate whose tables (its buffers) equal the given module's, bit for
bit, is the one (``_identify``). No candidate matching is refused.
"""

import ast
import inspect
import itertools
import textwrap

import torch

from .torch_dropout import DistributedDropout
from .torch_embedding import DistributedPositionEmbedding
from .torch_norms import DistributedBatchNorm2d, DistributedInstanceNorm2d, DistributedLayerNorm
from .torch_spectral_filter import DistributedSpectralFilter

__all__ = ["plan", "Refusal", "QUADRATURES", "is_library_module"]

QUADRATURES = ("equiangular", "legendre-gauss", "lobatto", "equiangular-trapezoidal")
"""torch-harmonics 0.9.3's latitude rules: the candidates for an argument its modules do not keep."""

_NORM_MODES = ("nodal", "mean", "support", "modal", "individual", "none", "geometric", "area ratio")

# functions an unknown module's forward may not call (torch's names; pooling by its ending, FFTs by "fft"): each
# reads other points of the field, which lie on other ranks' tiles
_SPATIAL_CALLS = frozenset(("interpolate", "upsample", "upsample_bilinear", "upsample_nearest", "grid_sample",
                            "roll", "pad", "unfold", "fold", "pixel_shuffle", "pixel_unshuffle", "conv1d", "conv2d",
                            "conv3d", "conv_transpose1d", "conv_transpose2d", "flip", "fliplr", "flipud", "rot90"))
_POOLING = ("pool1d", "pool2d", "pool3d")


class Refusal(Exception):
    """A module ``distribute`` cannot convert: ``why`` and ``fix``."""

    def __init__(self, why, fix):
        super().__init__(why)
        self.why, self.fix = why, fix


def _quadrature_order(hints):
    """The candidate latitude rules, those the model uses elsewhere first."""
    return tuple(dict.fromkeys([h for h in hints if h in QUADRATURES] + list(QUADRATURES)))


def _same_tables(a, b):
    """Whether two serial modules hold the same buffers (names, shapes and values, bit for bit)."""
    mine, theirs = dict(a.named_buffers()), dict(b.named_buffers())
    if mine.keys() != theirs.keys():
        return False
    return all(mine[k].shape == theirs[k].shape and mine[k].dtype == theirs[k].dtype
               and torch.equal(mine[k].cpu(), theirs[k].cpu()) for k in mine)


def _identify(module, build, candidates, what):
    """The first ``candidates`` entry (a dict of arguments) whose serial module ``build(**entry)`` has ``module``'s
    tables; a :class:`Refusal` if none has."""
    with torch.random.fork_rng(devices=[]):      # a serial module's random start must not move the user's generator
        for entry in candidates:
            try:
                trial = build(**entry)
            except (ValueError, NotImplementedError, AssertionError, TypeError):
                continue
            if _same_tables(trial, module):
                return entry
    raise Refusal(f"its {what} are not among torch-harmonics 0.9.3's (no candidate gives its tables)",
                  f"build the distributed module by hand with the same arguments (mpisphere.torch_harmonics."
                  f"Distributed{type(module).__name__})")


def _basis_type(module):
    basis = module.filter_basis
    name = type(basis).__name__
    if name == "HarmonicFilterBasis":      # "morlet" is the harmonic basis without its L2 normalisation
        return "harmonic" if getattr(basis, "_l2_norms", None) is not None else "morlet"
    return {"PiecewiseLinearFilterBasis": "piecewise linear", "ZernikeFilterBasis": "zernike",
            "FourierBesselFilterBasis": "fourier-bessel"}.get(name, name)


def _disco(module, hints, thd):
    weight = module.weight
    known = dict(in_channels=weight.shape[1] * module.groups, out_channels=weight.shape[0],
                 in_shape=(module.nlat_in, module.nlon_in), out_shape=(module.nlat_out, module.nlon_out),
                 kernel_shape=module.kernel_shape, basis_type=_basis_type(module), groups=module.groups,
                 bias=module.bias is not None, theta_cutoff=module.theta_cutoff)
    order = _quadrature_order(hints)
    candidates = [dict(grid_in=a, grid_out=b, basis_norm_mode=n)
                  for n, (a, b) in itertools.product(_NORM_MODES, itertools.product(order, order))]
    serial = type(module)
    found = _identify(module, lambda **c: serial(**known, **c), candidates,
                      "grids (grid_in, grid_out) or basis_norm_mode")
    target = thd.DistributedDiscreteContinuousConvS2 if "Transpose" not in serial.__name__ \
        else thd.DistributedDiscreteContinuousConvTransposeS2
    return lambda pg: target(**known, **found, process_grid=pg)


def _attention_known(module):
    known = dict(in_channels=module.in_channels, in_shape=(module.nlat_in, module.nlon_in),
                 out_shape=(module.nlat_out, module.nlon_out), num_heads=module.num_heads,
                 use_qknorm=module.q_norm_weights is not None, bias=module.q_bias is not None,
                 k_channels=module.k_channels, out_channels=module.out_channels)
    scale = module.scale
    if isinstance(scale, torch.nn.Parameter):
        raise Refusal("its scale is a learnable parameter", "a fixed scale (a float or None)")
    known["scale"] = float(scale) if isinstance(scale, torch.Tensor) else scale
    return known


def _neighbourhood_attention(module, hints, thd):
    known = dict(_attention_known(module), theta_cutoff=module.theta_cutoff)
    order = _quadrature_order(hints)
    candidates = [dict(grid_in=a, grid_out=b) for a, b in itertools.product(order, order)]
    serial = type(module)
    found = _identify(module, lambda **c: serial(**known, **c), candidates, "grids (grid_in, grid_out)")
    return lambda pg: thd.DistributedNeighborhoodAttentionS2(**known, **found, process_grid=pg)


def _global_attention(module, hints, thd):
    known = dict(_attention_known(module), drop_rate=module.drop_rate)
    # the output grid's rule enters no table of global attention (only the keys' weights do): any serves
    candidates = [dict(grid_in=a, grid_out=a) for a in _quadrature_order(hints)]
    serial = type(module)
    found = _identify(module, lambda **c: serial(**known, **c), candidates, "input grid (grid_in)")
    return lambda pg: thd.DistributedAttentionS2(**known, **found, process_grid=pg)


def _transform(target_name):
    def convert(module, hints, thd):
        target = getattr(thd, target_name)
        arguments = dict(lmax=module.lmax, mmax=module.mmax, grid=module.grid, norm=module.norm,
                         csphase=module.csphase)
        return lambda pg: target(module.nlat, module.nlon, **arguments, process_grid=pg)
    return convert


def _resample(module, hints, thd):
    return lambda pg: thd.DistributedResampleS2(module.nlat_in, module.nlon_in, module.nlat_out, module.nlon_out,
                                                module.grid_in, module.grid_out, module.mode, process_grid=pg)


def _quadrature(module, hints, thd):
    shape = tuple(module.quad_weight.shape[-2:])
    return lambda pg: thd.DistributedQuadratureS2(shape, module.grid, module.normalize, process_grid=pg)


def _spectral_convolution(module, hints, thd):
    sht, isht = module.sht, module.isht
    arguments = dict(in_channels=module.in_channels, out_channels=module.out_channels,
                     num_groups=module.num_groups, grid_in=sht.grid, grid_out=isht.grid,
                     bias=getattr(module, "spectral_bias", None) is not None)
    return lambda pg: thd.DistributedSpectralConvS2((sht.nlat, sht.nlon), (isht.nlat, isht.nlon), **arguments,
                                                    process_grid=pg)


def _torch_harmonics_table():
    """torch-harmonics' serial classes and their converters (empty without torch-harmonics)."""
    try:
        import torch_harmonics as th
    except ImportError:
        return ()
    return ((th.RealSHT, _transform("DistributedRealSHT")),
            (th.InverseRealSHT, _transform("DistributedInverseRealSHT")),
            (th.RealVectorSHT, _transform("DistributedRealVectorSHT")),
            (th.InverseRealVectorSHT, _transform("DistributedInverseRealVectorSHT")),
            (th.DiscreteContinuousConvS2, _disco), (th.DiscreteContinuousConvTransposeS2, _disco),
            (th.ResampleS2, _resample), (th.QuadratureS2, _quadrature), (th.SpectralConvS2, _spectral_convolution),
            (th.NeighborhoodAttentionS2, _neighbourhood_attention), (th.AttentionS2, _global_attention))


def _examples():
    """torch-harmonics' example layers module, or None."""
    try:
        from torch_harmonics.examples.models import _layers
    except ImportError:
        return None
    return _layers


def is_library_module(module):
    """Whether ``module`` is one of torch-harmonics' own layers (not an example model's): ``distribute``
    converts each or refuses it, so its copy may share the original (some hold handles that cannot be copied)."""
    name = type(module).__module__
    return name.split(".")[0] == "torch_harmonics" and ".examples." not in name


def _spatial_call(node):
    """The name of a call in ``node`` (a function's syntax tree) that reads other points, or None. Calls of the
    module's own children (``self.upsample(x)``) are theirs, and asked about on their own."""
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id == "self":
                continue
            name = func.attr
        elif isinstance(func, ast.Name):
            name = func.id
        else:
            continue
        if name in _SPATIAL_CALLS or name.endswith(_POOLING) or "fft" in name:
            return name
    return None


def _scan_forward(module):
    """A call in an unknown module's forward that reads other points of the field, or None."""
    forward = type(module).forward
    if forward is torch.nn.Module.forward:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    return _spatial_call(tree)


def plan(module, hints, thd, mixes_points):
    """What ``distribute`` does with ``module``: a builder ``f(process_grid) -> module``, None (keep it), or raise.

    Parameters
    ----------
    module : torch.nn.Module
    hints : sequence of str
        The latitude rules the model's transforms name (tried first where an argument must be found).
    thd : module
        ``mpisphere.torch_harmonics`` (the distributed classes).
    mixes_points : callable
        ``replicate``'s test of a plain torch layer that cannot run on a tile: ``(why, fix)`` or None.

    Raises
    ------
    Refusal
    """
    for serial, convert in _torch_harmonics_table():
        if type(module) is serial:
            build = convert(module, hints, thd)
            return lambda pg: _loaded(module, build(pg))
    if module.__class__.__module__.startswith("torch_harmonics.distributed"):
        raise Refusal("it is torch-harmonics' own distributed module (torch.distributed process groups)",
                      "the serial torch-harmonics module: distribute() converts it")
    if is_library_module(module):
        raise Refusal("distribute() has no distributed module for this torch-harmonics layer",
                      "a layer listed in mpisphere.torch_distribute's notes, or its distributed module by hand")
    examples = _examples()
    if examples is not None:
        if isinstance(module, examples.SpectralConvS2):
            return lambda pg: DistributedSpectralFilter(module, process_grid=pg)
        if isinstance(module, examples.PositionEmbedding):
            return lambda pg: DistributedPositionEmbedding(module, process_grid=pg)
        if isinstance(module, (examples.RealFFT2, examples.InverseRealFFT2)):
            raise Refusal("a two-dimensional FFT of the plane reads the whole field",
                          "the spherical transforms (RealSHT, InverseRealSHT)")
        if isinstance(module, (examples.DropPath, examples.MLP, examples.LayerNorm)):
            return None
    if type(module) is torch.nn.InstanceNorm2d:
        return lambda pg: _loaded(module, DistributedInstanceNorm2d(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
            process_grid=pg))
    if type(module) is torch.nn.BatchNorm2d:
        return lambda pg: _loaded(module, DistributedBatchNorm2d(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
            process_grid=pg))
    if type(module) is torch.nn.LayerNorm and len(module.normalized_shape) == 2:
        return lambda pg: _loaded(module, DistributedLayerNorm(
            module.normalized_shape, module.eps, module.elementwise_affine, module.bias is not None,
            process_grid=pg))
    if type(module) is torch.nn.Dropout and module.p > 0.0:
        return lambda pg: DistributedDropout(module.p, None, module.inplace, process_grid=pg)
    found = mixes_points(module)
    if found is not None:
        raise Refusal(*found)
    # torch-harmonics' own layers were converted or refused above: what is left of it is the example models'
    if type(module).__module__.split(".")[0] not in ("torch", "mpisphere"):
        name = _scan_forward(module)
        if name is not None:
            raise Refusal(f"its forward calls {name}, which reads other points of the field (on other ranks' tiles)",
                          "the distributed layers (DistributedResampleS2 to resample, DISCO convolutions, the "
                          "spherical transforms), or the call moved into a layer of its own")
    return None


def _loaded(serial, distributed):
    """``distributed`` holding ``serial``'s parameters and persistent buffers (the same names), of their dtypes."""
    distributed.load_state_dict(serial.state_dict())
    theirs = dict(serial.named_parameters())
    for name, p in distributed.named_parameters():
        if name in theirs and p.dtype != theirs[name].dtype:
            p.data = p.data.to(theirs[name].dtype)
    return distributed
