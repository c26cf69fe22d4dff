"""torch-harmonics' distributed modules on mpisphere (the ``torch`` extra): code written against
``torch_harmonics.distributed`` moves over by its import line.

::

    import mpisphere.torch_harmonics as thd    # instead of: import torch_harmonics.distributed as thd

    thd.init(grid)                               # a ProcessGrid, instead of the two process groups
    sht = thd.DistributedRealSHT(nlat, nlon, grid="legendre-gauss")
    conv = thd.DistributedDiscreteContinuousConvS2(8, 8, (nlat, nlon), (nlat, nlon), (3,))

Each module takes this rank's tile and returns this rank's tile (or block),
with torch-harmonics' names, constructor arguments and split attributes
(``lat_shapes``, ``lon_shapes``, ``l_shapes``, ``m_shapes``). Where
torch-harmonics' keyword ``grid`` names the latitude rule, the process grid
is ``init``'s, or the keyword ``process_grid``.

What differs, on purpose:

* **Parameters are the serial module's**, whole and the same on every rank:
  a serial ``state_dict`` loads unchanged, and after ``backward`` each
  parameter's gradient is the whole-sphere gradient on every rank (the
  adjoint of a replicated parameter is a sum over the ranks, done in the
  backward: no all-reduce of gradients is left to the user, unlike
  torch-harmonics' distributed spectral convolution, whose weights are split).
  New parameters are rank 0's, sent to every rank when the module is built.
  Every forward compares the parameters across the ranks (a digest of each):
  a checkpoint loaded on one rank only raises on every rank, naming the
  parameter.
* **Plain torch layers beside them need** :func:`replicate`: a linear
  layer's parameters used on every rank's tile get one tile's gradient
  each. ``replicate(model)``, once on the whole model, covers every
  parameter of it (rank 0's values, compared at each forward by their paths
  in the model, gradients summed over the grid); a drop-in module that
  trains outside a replicated model warns once (:class:`ReplicationWarning`).
* **Precision follows the input**: float32 or float64 throughout
  (torch-harmonics computes its spectral convolution in float32 whatever
  the input); the DISCO convolutions run their longitude FFTs of float32
  data in float64, which makes them more accurate than torch-harmonics'
  float32 sums.
* The DISCO convolutions serve the cutoffs the polar halo reaches (the
  neighbouring polar ranks); a wider one is refused on every rank, naming
  the widest this split serves (``polar_mode="halo-exchange"``, the only
  mode). ``optimized_kernel`` and ``fused`` are accepted and change nothing.

``init`` keeps the default process grid in a context variable (the one
process-wide value of this module, as ``torch_harmonics.distributed`` keeps
its groups); every module also takes ``process_grid=`` instead.
"""

import math
import sys

import numpy
import torch

from .disco import DiscoConvS2, DiscoConvTransposeS2, filter_basis
from .integral import QuadratureS2
from .quadrature import truncate_sht
from .resample import ResampleS2
from .sht import (DistributedInverseRealSHT as _InverseSHT, DistributedInverseRealVectorSHT as _InverseVectorSHT,
                  DistributedRealSHT as _SHT, DistributedRealVectorSHT as _VectorSHT)
from .spectral_convolution import SpectralConvS2, spectral_truncation
from .torch import apply
from .torch_attention import DistributedAttentionS2, DistributedNeighborhoodAttentionS2
from .torch_dropout import DistributedDropout
from .torch_distribute import distribute as _distribute
from .torch_embedding import DistributedPositionEmbedding
from .torch_norms import DistributedBatchNorm2d, DistributedInstanceNorm2d, DistributedLayerNorm
from .torch_primitives import (azimuth_group, compute_polar_halo_radius, config, copy_to_azimuth_region,
                               copy_to_polar_region, distributed_transpose_azimuth, distributed_transpose_polar,
                               flatten_and_pad_leading_dims, gather_from_copy_to_polar_region,
                               gather_from_polar_region, get_group_neighbors, is_distributed_azimuth,
                               is_distributed_polar, polar_group, polar_halo_exchange, polar_halo_reduce,
                               reduce_from_azimuth_region, reduce_from_polar_region,
                               reduce_from_scatter_to_azimuth_region, reduce_from_scatter_to_polar_region,
                               scatter_to_polar_region, split_tensor_along_dim, unpad_and_unflatten_leading_dims)
from .torch_layers import (ParametrisedLayer, _constructing, _grid_of, _check_groups, _Nonlinear, _PerDtype, _shape,
                           compute_split_shapes, finalize, init, is_initialized, process_grid)
from .torch_spectral_filter import DistributedSpectralFilter
from .torch_replicate import Replication, ReplicationWarning, replicate as _replicate

__all__ = ["init", "finalize", "is_initialized", "process_grid", "polar_group_size", "azimuth_group_size",
           "polar_group_rank", "azimuth_group_rank", "compute_split_shapes", "DistributedRealSHT",
           "DistributedInverseRealSHT", "DistributedRealVectorSHT", "DistributedInverseRealVectorSHT",
           "DistributedDiscreteContinuousConvS2", "DistributedDiscreteContinuousConvTransposeS2",
           "DistributedQuadratureS2", "DistributedResampleS2", "DistributedSpectralConvS2",
           "DistributedNeighborhoodAttentionS2", "DistributedAttentionS2", "DistributedInstanceNorm2d",
           "DistributedLayerNorm", "DistributedBatchNorm2d", "DistributedDropout",
           "DistributedPositionEmbedding", "DistributedSpectralFilter", "distribute", "replicate",
           "Replication", "ReplicationWarning", "config", "polar_group", "azimuth_group", "is_distributed_polar",
           "is_distributed_azimuth", "get_group_neighbors", "split_tensor_along_dim", "flatten_and_pad_leading_dims",
           "unpad_and_unflatten_leading_dims", "compute_polar_halo_radius", "copy_to_polar_region",
           "copy_to_azimuth_region", "reduce_from_polar_region", "reduce_from_azimuth_region",
           "scatter_to_polar_region", "gather_from_polar_region", "reduce_from_scatter_to_polar_region",
           "reduce_from_scatter_to_azimuth_region", "gather_from_copy_to_polar_region",
           "distributed_transpose_polar", "distributed_transpose_azimuth", "polar_halo_exchange",
           "polar_halo_reduce"]

def polar_group_size():
    """The number of polar ranks of the process grid (torch-harmonics' polar group size)."""
    return process_grid().npolar


def azimuth_group_size():
    """The number of azimuth ranks of the process grid (torch-harmonics' azimuth group size)."""
    return process_grid().nazimuth


def polar_group_rank():
    """This rank's place among the polar ranks (torch-harmonics' polar group rank)."""
    return process_grid().polar_rank


def azimuth_group_rank():
    """This rank's place among the azimuth ranks (torch-harmonics' azimuth group rank)."""
    return process_grid().azimuth.rank


def replicate(module, process_grid=None):
    """Make every parameter of ``module`` whole-sphere on the process grid (``init``'s): call it once on a model.

    The drop-in modules of this package sum their own parameters' gradients;
    a plain layer beside them (a linear layer, an MLP, a 1 x 1 convolution)
    would get one tile's gradient on each rank. After ``replicate(model)``
    every parameter of ``model`` holds rank 0's value, is compared across
    the ranks at every forward of ``model`` (a difference raises on every
    rank, naming its path), and gets the whole-sphere gradient on every rank
    after ``backward``. A layer that cannot run on a tile (a convolution
    wider than 1 x 1, pooling, batch or instance normalisation) is refused,
    naming its path. Collective over the grid; see
    ``mpisphere.torch_replicate.replicate``.

    Returns
    -------
    Replication
        The paths of the parameters it sums (``.summed``) and of those the
        drop-in modules sum themselves (``.own``).
    """
    return _replicate(module, _grid_of(process_grid))


def distribute(model, process_grid=None):
    """A copy of a serial model that takes and returns this rank's tiles; ``model`` is left unchanged. Collective.

    Every torch-harmonics layer of the model becomes its distributed module
    here (transforms, DISCO convolutions and their transposes, resampling,
    quadrature, spectral convolution, neighbourhood and global attention),
    with the serial module's arguments and parameters; so do the layers whose
    meaning is over the whole sphere (instance, batch and two-axis layer
    normalisation, element dropout, the example models' position embeddings
    and spectral convolution). Pointwise layers run as they are. A layer that
    cannot run on a tile is refused before anything is built, on every rank,
    by its path in the model. Then :func:`replicate` covers the copy. See
    :mod:`mpisphere.torch_distribute` for the whole list.

    Parameters
    ----------
    model : torch.nn.Module
        A serial model on ``(batch, channels, nlat, nlon)`` fields
        (torch-harmonics' example models, or any model of those layers).
    process_grid : ProcessGrid, optional
        Default: :func:`init`'s.

    Returns
    -------
    torch.nn.Module
        The distributed model: every spatial input is this rank's tile
        ``(batch, channels, h, w)`` of the grid's split, and every spatial
        output this rank's tile. Its ``state_dict()`` has the serial model's
        keys and whole tensors (a serial model loads it, and a serial
        checkpoint loads into it); after ``backward`` every parameter's
        gradient is its whole-sphere gradient on every rank, so any torch
        optimizer steps every rank alike; parameters (and, in training mode
        with random layers, the torch generators' states) are compared across
        the ranks at every forward. ``model.mpisphere_replication`` says
        which parameters the hooks sum and which layers draw random numbers.

    Raises
    ------
    ValueError
        On every rank: a layer that cannot run on a tile, named by its path
        with what to use instead; models that differ between the ranks; a
        converted layer's own refusal (a DISCO cutoff wider than the split
        serves, a block-diagonal spectral filter on a split azimuth).
    TypeError
        ``model`` is not a ``torch.nn.Module``.

    Notes
    -----
    Building the distributed modules leaves the torch generator as it was.
    Where torch-harmonics keeps no attribute for an argument (a DISCO
    convolution's grids and ``basis_norm_mode``, an attention's grids), the
    candidates are tried, serially, until one gives the module's own tables.
    """
    return _distribute(model, _grid_of(process_grid), sys.modules[__name__])


def _split_attributes(module, pg):
    """torch-harmonics' ``comm_size_polar``, ``comm_rank_polar``, ``comm_size_azimuth``, ``comm_rank_azimuth``."""
    module.comm_size_polar, module.comm_rank_polar = pg.npolar, pg.polar_rank
    module.comm_size_azimuth, module.comm_rank_azimuth = pg.nazimuth, pg.azimuth.rank


class _Transform(torch.nn.Module):
    _operator = None
    _coefficients_out = True

    def __init__(self, nlat, nlon, lmax=None, mmax=None, grid="equiangular", norm="ortho", csphase=True, *,
                 process_grid=None):
        super().__init__()
        pg = _grid_of(process_grid)
        self.process_grid = pg
        _split_attributes(self, pg)
        with _constructing(pg, type(self).__name__, nlat=nlat, nlon=nlon, lmax=lmax, mmax=mmax, grid=grid, norm=norm,
                           csphase=csphase):
            self.nlat, self.nlon, self.grid, self.norm, self.csphase = nlat, nlon, grid, norm, csphase
            self.lmax, self.mmax = truncate_sht(nlat, nlon, lmax, mmax, quadrature=grid)
            self.lat_shapes = compute_split_shapes(nlat, pg.npolar)
            self.lon_shapes = compute_split_shapes(nlon, pg.nazimuth)
            self.l_shapes, self.m_shapes = compute_split_shapes(self.lmax, pg.npolar), \
                compute_split_shapes(self.mmax, pg.nazimuth)
            self.nlat_local, self.nlon_local = self.lat_shapes[pg.polar_rank], self.lon_shapes[pg.azimuth.rank]
            self.lmax_local, self.mmax_local = self.l_shapes[pg.polar_rank], self.m_shapes[pg.azimuth.rank]
        self._ops = _PerDtype(lambda dtype: self._operator(pg, nlat, nlon, self.lmax, self.mmax, quadrature=grid,
                                                           norm=norm, csphase=csphase, dtype=dtype))

    def extra_repr(self):
        return f"nlat={self.nlat}, nlon={self.nlon}, lmax={self.lmax}, mmax={self.mmax}, grid={self.grid!r}"

    def forward(self, x):
        """This rank's tile (``(..., nlat_local, nlon_local)``) to its block, or back for the inverse."""
        real = x.dtype if not x.is_complex() else {torch.complex64: torch.float32}.get(x.dtype, torch.float64)
        return apply(self._ops(real), x)


class DistributedRealSHT(_Transform):
    """torch-harmonics' ``DistributedRealSHT``: ``(..., nlat_local, nlon_local)`` -> ``(..., lmax_local, mmax_local)``.
    """

    _operator = _SHT


class DistributedInverseRealSHT(_Transform):
    """torch-harmonics' ``DistributedInverseRealSHT``: the blocks back to tiles."""

    _operator = _InverseSHT


class DistributedRealVectorSHT(_Transform):
    """torch-harmonics' ``DistributedRealVectorSHT``: ``(..., 2, h, w)`` -> ``(..., 2, l, m)``."""

    _operator = _VectorSHT


class DistributedInverseRealVectorSHT(_Transform):
    """torch-harmonics' ``DistributedInverseRealVectorSHT``."""

    _operator = _InverseVectorSHT


class DistributedQuadratureS2(torch.nn.Module):
    """torch-harmonics' ``DistributedQuadratureS2``: ``(..., h, w)`` tiles -> ``(...)``, the same on every rank."""

    def __init__(self, img_shape, grid="equiangular", normalize=False, *, process_grid=None):
        super().__init__()
        pg = _grid_of(process_grid)
        self.process_grid = pg
        _split_attributes(self, pg)
        with _constructing(pg, "DistributedQuadratureS2", img_shape=img_shape, grid=grid, normalize=normalize):
            self.img_shape, self.grid, self.normalize = _shape(img_shape, "img_shape"), grid, normalize
            self.lat_shapes = compute_split_shapes(img_shape[0], pg.npolar)
            self.lon_shapes = compute_split_shapes(img_shape[1], pg.nazimuth)
        self._ops = _PerDtype(lambda dtype: QuadratureS2(pg, self.img_shape, grid, normalize, dtype=dtype))
        weights = numpy.asarray(self._ops(torch.float32).row_weights(numpy.empty(0)), dtype=numpy.float32)
        local = torch.from_numpy(weights)[:, None].expand(-1, self.lon_shapes[pg.azimuth.rank])
        # torch-harmonics' buffer: this rank's point weights (1, 1, h, w), float32
        self.register_buffer("quad_weight", local.reshape((1, 1) + tuple(local.shape)).contiguous(), persistent=False)

    def forward(self, x):
        """``(..., h, w)`` tile -> ``(...)``: the integral over the sphere, the same on every rank."""
        return apply(self._ops(x.dtype), x)


class DistributedResampleS2(torch.nn.Module):
    """torch-harmonics' ``DistributedResampleS2``: tiles of one grid to tiles of another (both modes)."""

    def __init__(self, nlat_in, nlon_in, nlat_out, nlon_out, grid_in="equiangular", grid_out="equiangular",
                 mode="bilinear", *, process_grid=None):
        super().__init__()
        pg = _grid_of(process_grid)
        self.process_grid = pg
        _split_attributes(self, pg)
        with _constructing(pg, "DistributedResampleS2", nlat_in=nlat_in, nlon_in=nlon_in, nlat_out=nlat_out,
                           nlon_out=nlon_out, grid_in=grid_in, grid_out=grid_out, mode=mode):
            self.nlat_in, self.nlon_in, self.nlat_out, self.nlon_out = nlat_in, nlon_in, nlat_out, nlon_out
            self.mode, self.grid_in, self.grid_out = mode, grid_in, grid_out
            self.lat_in_shapes = compute_split_shapes(nlat_in, pg.npolar)
            self.lon_in_shapes = compute_split_shapes(nlon_in, pg.nazimuth)
            self.lat_out_shapes = compute_split_shapes(nlat_out, pg.npolar)
            self.lon_out_shapes = compute_split_shapes(nlon_out, pg.nazimuth)
        self._ops = _PerDtype(lambda dtype: ResampleS2(pg, (nlat_in, nlon_in), (nlat_out, nlon_out), grid_in,
                                                       grid_out, mode, dtype=dtype))
        self._ops(torch.float32)   # built now: a bad argument is refused at construction, on every rank

    def forward(self, x):
        """``(..., h_in, w_in)`` tile of the input grid -> ``(..., h_out, w_out)`` tile of the output grid."""
        op = self._ops(x.dtype)
        if op.linear:
            return apply(op, x)
        return _Nonlinear.apply(x, op, torch.is_grad_enabled() and x.requires_grad)


class _DiscoLayer(ParametrisedLayer):
    _operator = None
    _parameter_attributes = ("weight", "bias")

    def __init__(self, in_channels, out_channels, in_shape, out_shape, kernel_shape, basis_type="piecewise linear",
                 basis_norm_mode="nodal", groups=1, grid_in="equiangular", grid_out="equiangular", bias=True,
                 theta_cutoff=None, optimized_kernel=True, fused=False, polar_mode="halo-exchange", *,
                 process_grid=None):
        super().__init__()
        name = type(self).__name__
        pg = _grid_of(process_grid)
        self.process_grid = pg
        _split_attributes(self, pg)
        with _constructing(pg, name, in_channels=in_channels, out_channels=out_channels, in_shape=in_shape,
                           out_shape=out_shape, kernel_shape=kernel_shape, basis_type=basis_type,
                           basis_norm_mode=basis_norm_mode, groups=groups, grid_in=grid_in, grid_out=grid_out,
                           bias=bias, theta_cutoff=theta_cutoff, polar_mode=polar_mode):
            if polar_mode != "halo-exchange":
                raise ValueError(f"{name}: polar_mode={polar_mode!r}: mpisphere's DISCO convolutions bring the rows "
                                 "through the polar halo only (polar_mode='halo-exchange'); a cutoff wider than the "
                                 "halo reaches is refused, naming the widest one the split serves")
            _check_groups(name, in_channels, out_channels, groups, "groups")
            self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
            self.groupsize, self.out_per_group = in_channels // groups, out_channels // groups
            self.nlat_in, self.nlon_in = _shape(in_shape, "in_shape")
            self.nlat_out, self.nlon_out = _shape(out_shape, "out_shape")
            self.kernel_shape, self.optimized_kernel = kernel_shape, optimized_kernel
            self.polar_mode, self.fused = polar_mode, fused
            self.lat_in_shapes = compute_split_shapes(self.nlat_in, pg.npolar)
            self.lon_in_shapes = compute_split_shapes(self.nlon_in, pg.nazimuth)
            self.lat_out_shapes = compute_split_shapes(self.nlat_out, pg.npolar)
            self.lon_out_shapes = compute_split_shapes(self.nlon_out, pg.nazimuth)
            self.filter_basis = filter_basis(kernel_shape, basis_type)
            kernel_size = self.filter_basis.kernel_size
            self.nlat_in_local, self.nlon_in_local = self.lat_in_shapes[pg.polar_rank], self.lon_in_shapes[
                pg.azimuth.rank]
            self.nlat_out_local, self.nlon_out_local = self.lat_out_shapes[pg.polar_rank], self.lon_out_shapes[
                pg.azimuth.rank]
        options = dict(basis_type=basis_type, basis_norm_mode=basis_norm_mode, groups=groups,
                       quadrature_in=grid_in, quadrature_out=grid_out, theta_cutoff=theta_cutoff)
        start = numpy.zeros((out_channels, self.groupsize, kernel_size))
        self._ops = _PerDtype(lambda dtype: self._operator(pg, in_shape, out_shape, kernel_shape, start, dtype=dtype,
                                                           **options))
        op = self._ops(torch.get_default_dtype() if torch.get_default_dtype() in (torch.float32, torch.float64)
                       else torch.float32)   # built now: a bad argument is refused at construction, on every rank
        self.theta_cutoff = op.theta_cutoff
        self.kernel_size = kernel_size
        scale = math.sqrt(1.0 / self.groupsize) / math.sqrt(kernel_size)
        self.weight = torch.nn.Parameter(scale * torch.randn(out_channels, self.groupsize, kernel_size))
        self.bias = torch.nn.Parameter(torch.zeros(out_channels)) if bias else None
        self._share_initial_parameters()

    def extra_repr(self):
        return (f"in_shape={(self.nlat_in, self.nlon_in)}, out_shape={(self.nlat_out, self.nlon_out)}, "
                f"in_chans={self.in_channels}, out_chans={self.out_channels}, kernel_shape={self.kernel_shape}, "
                f"theta_cutoff={self.theta_cutoff}, groups={self.groups}")

    def forward(self, x):
        """``(batch, in_channels, h, w)`` tile -> ``(batch, out_channels, h', w')`` tile."""
        parameters = (self.weight,) if self.bias is None else (self.weight, self.bias)
        return self._apply_layer(x, parameters)



class DistributedDiscreteContinuousConvS2(_DiscoLayer):
    """torch-harmonics' ``DistributedDiscreteContinuousConvS2`` on :class:`~mpisphere.DiscoConvS2` (module notes)."""

    _operator = DiscoConvS2


class DistributedDiscreteContinuousConvTransposeS2(_DiscoLayer):
    """torch-harmonics' ``DistributedDiscreteContinuousConvTransposeS2`` on :class:`~mpisphere.DiscoConvTransposeS2`."""

    _operator = DiscoConvTransposeS2


class DistributedSpectralConvS2(ParametrisedLayer):
    """torch-harmonics' ``DistributedSpectralConvS2`` on :class:`~mpisphere.SpectralConvS2`, with serial parameters.

    ``weight`` is ``(num_groups, in_channels // num_groups, out_channels //
    num_groups, lmax)`` and ``spectral_bias`` ``(1, in_channels, lmax, mmax)``,
    complex, whole on every rank (the serial ``SpectralConvS2``'s shapes).
    """

    _parameter_attributes = ("weight", "spectral_bias")

    def __init__(self, in_shape, out_shape, in_channels, out_channels, num_groups=1, grid_in="equiangular",
                 grid_out="equiangular", bias=False, *, process_grid=None):
        super().__init__()
        pg = _grid_of(process_grid)
        self.process_grid = pg
        _split_attributes(self, pg)
        with _constructing(pg, "DistributedSpectralConvS2", in_shape=in_shape, out_shape=out_shape,
                           in_channels=in_channels, out_channels=out_channels, num_groups=num_groups, grid_in=grid_in,
                           grid_out=grid_out, bias=bias):
            _check_groups("DistributedSpectralConvS2", in_channels, out_channels, num_groups, "num_groups")
            self.in_channels, self.out_channels, self.num_groups = in_channels, out_channels, num_groups
            in_shape, out_shape = _shape(in_shape, "in_shape"), _shape(out_shape, "out_shape")
            self.lmax = self.mmax = spectral_truncation(in_shape, out_shape, grid_in, grid_out)
            self.l_shapes = compute_split_shapes(self.lmax, pg.npolar)
            self.m_shapes = compute_split_shapes(self.mmax, pg.nazimuth)
            self.lat_shapes = compute_split_shapes(in_shape[0], pg.npolar)
            self.lon_shapes = compute_split_shapes(in_shape[1], pg.nazimuth)
            self.lmax_local, self.mmax_local = self.l_shapes[pg.polar_rank], self.m_shapes[pg.azimuth.rank]
        # torch-harmonics' transforms of the layer, as modules (the layer's operator holds its own)
        self.sht = DistributedRealSHT(*in_shape, lmax=self.lmax, mmax=self.mmax, grid=grid_in, process_grid=pg)
        self.isht = DistributedInverseRealSHT(*out_shape, lmax=self.lmax, mmax=self.mmax, grid=grid_out,
                                              process_grid=pg)
        shape = (num_groups, in_channels // num_groups, out_channels // num_groups, self.lmax)
        start = numpy.zeros(shape, dtype=numpy.complex128)
        self._ops = _PerDtype(lambda dtype: SpectralConvS2(pg, in_shape, out_shape, start, quadrature_in=grid_in,
                                                           quadrature_out=grid_out, dtype=dtype))
        self._ops(torch.float32)   # built now: a bad argument is refused at construction, on every rank
        scale = math.sqrt(1.0 / (in_channels // num_groups)) * torch.ones(self.lmax, dtype=torch.complex64)
        scale[0] *= math.sqrt(2.0)
        self.weight = torch.nn.Parameter(scale * torch.randn(*shape, dtype=torch.complex64))
        self.spectral_bias = torch.nn.Parameter(torch.zeros(1, in_channels, self.lmax, self.mmax,
                                                            dtype=torch.complex64)) if bias else None
        self._share_initial_parameters()

    def forward(self, x):
        """``(batch, in_channels, h, w)`` tile -> ``(batch, out_channels, h', w')`` tile."""
        parameters = (self.weight,) if self.spectral_bias is None else (self.weight, self.spectral_bias)
        return self._apply_layer(x, parameters)

