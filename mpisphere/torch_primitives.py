"""torch-harmonics' distributed primitives on mpisphere's operators (the ``torch`` extra): the functions of
``torch_harmonics.distributed`` that models and tests call between the modules.

Each takes and returns this rank's tensor, is differentiable (its backward
is the operator's adjoint: a copy's is a sum over the ranks, a scatter's a
gather), and is collective over the polar or azimuth ranks of the process
grid (:func:`mpisphere.torch_harmonics.init`'s, or ``process_grid=``),
with mpisphere's agreement: a shape or dtype that differs on one rank
raises on every rank. Splits are torch-harmonics' balanced ones
(:func:`~mpisphere.split_sizes`, its ``compute_split_shapes``); a call that
names other sizes is refused, naming the sizes the split has. Re-exported by
:mod:`mpisphere.torch_harmonics`.

What differs: ``polar_group()`` and ``azimuth_group()`` return the grid's
polar and azimuth communicators (mpi4py), not ``torch.distributed`` groups;
every function builds its operator when called (a construction agreement
each time: these are for glue code, the modules keep theirs).
"""

import torch

from . import config as _config
from .agreement import Call, InputError
from .geometry import latitude_support_band
from .halo import HaloExchange
from .partition import split_sizes
from .primitives import CopyTo, GatherFrom, GatherFromCopyTo, ReduceFrom, ReduceScatter, ScatterTo
from .torch import apply
from .torch_layers import process_grid
from .transpose import Transpose

__all__ = ["config", "polar_group", "azimuth_group", "is_distributed_polar", "is_distributed_azimuth",
           "get_group_neighbors", "split_tensor_along_dim", "flatten_and_pad_leading_dims",
           "unpad_and_unflatten_leading_dims", "compute_polar_halo_radius", "copy_to_polar_region",
           "copy_to_azimuth_region", "reduce_from_polar_region", "reduce_from_azimuth_region",
           "scatter_to_polar_region", "gather_from_polar_region", "reduce_from_scatter_to_polar_region",
           "reduce_from_scatter_to_azimuth_region", "gather_from_copy_to_polar_region",
           "distributed_transpose_polar", "distributed_transpose_azimuth", "polar_halo_exchange",
           "polar_halo_reduce"]

config = _config
"""mpisphere's settings (torch-harmonics' ``distributed.config``: ``config.debug`` compares whole
descriptions on every call)."""


def polar_group():
    """The polar ranks of the process grid: its ``polar`` communicator (mpi4py), not a torch process group."""
    return process_grid().polar


def azimuth_group():
    """The azimuth ranks of the process grid: its ``azimuth`` communicator (mpi4py), not a torch process group."""
    return process_grid().azimuth


def is_distributed_polar():
    """Whether the latitudes are split (more than one polar rank)."""
    return process_grid().npolar > 1


def is_distributed_azimuth():
    """Whether the longitudes are split (more than one azimuth rank)."""
    return process_grid().nazimuth > 1


def get_group_neighbors(group):
    """``(previous, next)`` ranks of the process grid (``grid.cart``) around this rank in ``group`` (cyclic).

    ``group``: ``polar_group()`` or ``azimuth_group()``. torch-harmonics returns global ranks of
    ``torch.distributed``; these are ranks of the grid's communicator.
    """
    grid = process_grid()
    members = _members(grid, group)
    here = members.index(grid.cart.rank)
    return members[(here - 1) % len(members)], members[(here + 1) % len(members)]


def _members(grid, group):
    """The grid ranks of ``group`` (one of the grid's two sub-communicators), in the group's order."""
    if group is grid.polar:
        return [p * grid.nazimuth + grid.azimuth.rank for p in range(grid.npolar)]
    if group is grid.azimuth:
        return [grid.polar_rank * grid.nazimuth + a for a in range(grid.nazimuth)]
    raise ValueError("get_group_neighbors: expected polar_group() or azimuth_group() of the process grid")


def split_tensor_along_dim(tensor, dim, num_chunks):
    """``tensor`` split along ``dim`` into ``num_chunks`` balanced views (the first ``size % num_chunks`` larger).

    Raises
    ------
    ValueError
        ``dim`` out of range, or fewer elements than chunks (no empty chunk).
    """
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"split_tensor_along_dim: a tensor of {tensor.dim()} dimensions has no dimension {dim}")
    if tensor.shape[dim] < num_chunks:
        raise ValueError(f"split_tensor_along_dim: cannot split dimension {dim} of size {tensor.shape[dim]} into "
                         f"{num_chunks} chunks (no chunk may be empty)")
    return torch.split(tensor, list(split_sizes(tensor.shape[dim], num_chunks)), dim=dim)


def flatten_and_pad_leading_dims(tensor, min_leading_size, num_trailing_dims=2):
    """All but the last ``num_trailing_dims`` axes as one, padded with zeros to at least ``min_leading_size``.

    Returns
    -------
    (tensor, lead_shape, lead_size)
        The contiguous ``(M, *trailing)`` tensor, the leading shape and its size (for
        :func:`unpad_and_unflatten_leading_dims`). Complex tensors keep their dtype.
    """
    trailing = tuple(tensor.shape[tensor.dim() - num_trailing_dims:])
    lead_shape = tensor.shape[:tensor.dim() - num_trailing_dims]
    flat = tensor.reshape((-1,) + trailing)
    lead_size = flat.shape[0]
    if lead_size < min_leading_size:
        flat = torch.cat([flat, flat.new_zeros((min_leading_size - lead_size,) + trailing)])
    return flat.contiguous(), lead_shape, lead_size


def unpad_and_unflatten_leading_dims(tensor, lead_shape, lead_size, num_trailing_dims=2):
    """The inverse of :func:`flatten_and_pad_leading_dims` (the trailing axes as ``tensor`` has them now)."""
    trailing = tuple(tensor.shape[tensor.dim() - num_trailing_dims:])
    return tensor.narrow(0, 0, lead_size).reshape(tuple(lead_shape) + trailing).contiguous()


def compute_polar_halo_radius(lats_in, lats_out, theta_cutoff, lat_in_shapes, lat_out_shapes):
    """The latitude rows a polar rank borrows from its neighbours for a localized operator of radius
    ``theta_cutoff`` (radians, the widened cutoff): the widest overhang of any rank's output band past its own
    input rows; 0 on one polar rank.

    Raises
    ------
    ValueError
        The radius exceeds the smallest input chunk (the halo reaches only the neighbouring ranks).
    """
    ranks = len(lat_out_shapes)
    if ranks <= 1:
        return 0
    lo, hi = latitude_support_band(_numpy(lats_in), _numpy(lats_out), float(theta_cutoff))
    radius, start_in, start_out = 0, 0, 0
    for n_in, n_out in zip(lat_in_shapes, lat_out_shapes):
        if n_out > 0 and hi[start_out + n_out - 1] >= lo[start_out]:
            radius = max(radius, start_in - int(lo[start_out]), int(hi[start_out + n_out - 1]) - (start_in + n_in - 1))
        start_in, start_out = start_in + n_in, start_out + n_out
    if radius > min(lat_in_shapes):
        raise ValueError(f"compute_polar_halo_radius: a halo of {radius} rows exceeds the smallest input chunk of "
                         f"{min(lat_in_shapes)} rows (input latitudes split as {list(lat_in_shapes)})\n  fix: fewer "
                         "polar ranks, more latitudes or a smaller theta_cutoff")
    return radius


def _numpy(values):
    return values.detach().cpu().double().numpy() if isinstance(values, torch.Tensor) else values


def _dim(tensor, dim):
    return dim % tensor.dim()


def _checked_shapes(who, comm, shapes):
    """``shapes`` as the balanced split of their sum over ``comm``, agreed over ``comm``: sizes that are not the
    split's, or that differ between the ranks, raise on every rank (a local raise would leave the others waiting
    in the exchange)."""
    call = Call(comm, who)
    total = None
    with call.local():
        total = int(sum(shapes))
        expected = list(split_sizes(total, comm.size))
        if [int(s) for s in shapes] != expected:
            raise InputError(f"shapes_ {list(shapes)} are not the balanced split of {total} over {comm.size} "
                             f"ranks; mpisphere splits as compute_split_shapes({total}, {comm.size}) = {expected}")
    call.agree(shapes=[int(s) for s in shapes])
    return total


def copy_to_polar_region(input_):
    """Identity; its backward sums the gradient over the polar ranks."""
    return apply(CopyTo(polar_group()), input_)


def copy_to_azimuth_region(input_):
    """Identity; its backward sums the gradient over the azimuth ranks."""
    return apply(CopyTo(azimuth_group()), input_)


def reduce_from_polar_region(input_):
    """The sum over the polar ranks (the same on each); its backward is the identity."""
    return apply(ReduceFrom(polar_group()), input_)


def reduce_from_azimuth_region(input_):
    """The sum over the azimuth ranks (the same on each); its backward is the identity."""
    return apply(ReduceFrom(azimuth_group()), input_)


def scatter_to_polar_region(input_, dim_):
    """This polar rank's chunk of ``input_`` (the same on every polar rank) along ``dim_``; backward: a gather."""
    return apply(ScatterTo(polar_group(), _dim(input_, dim_), input_.shape[dim_]), input_)


def gather_from_polar_region(input_, dim_, shapes_):
    """The polar ranks' chunks along ``dim_`` side by side (``shapes_``: each rank's size); backward: a scatter."""
    comm = polar_group()
    total = _checked_shapes("gather_from_polar_region", comm, shapes_)
    return apply(GatherFrom(comm, _dim(input_, dim_), total), input_)


def reduce_from_scatter_to_polar_region(input_, dim_):
    """The sum over the polar ranks, this rank's chunk of it along ``dim_``; backward: a gather."""
    return apply(ReduceScatter(polar_group(), _dim(input_, dim_), input_.shape[dim_]), input_)


def reduce_from_scatter_to_azimuth_region(input_, dim_):
    """The sum over the azimuth ranks, this rank's chunk of it along ``dim_``; backward: a gather."""
    return apply(ReduceScatter(azimuth_group(), _dim(input_, dim_), input_.shape[dim_]), input_)


def gather_from_copy_to_polar_region(input_, dim_, shapes_):
    """The polar ranks' chunks along ``dim_`` side by side; backward: the sum over the ranks, scattered."""
    comm = polar_group()
    total = _checked_shapes("gather_from_copy_to_polar_region", comm, shapes_)
    return apply(GatherFromCopyTo(comm, _dim(input_, dim_), total), input_)


def _transpose(comm, who, input_, dims_, shapes_):
    a, b = _dim(input_, dims_[0]), _dim(input_, dims_[1])
    if comm.size == 1:
        return input_.contiguous()
    total = _checked_shapes(who, comm, shapes_)
    return apply(Transpose(comm, axes=(a, b), extents=(input_.shape[a], total)), input_.contiguous())


def distributed_transpose_polar(input_, dims_, shapes_):
    """Move the split over the polar ranks from ``dims_[1]`` (``shapes_`` its chunks) to ``dims_[0]``."""
    return _transpose(polar_group(), "distributed_transpose_polar", input_, dims_, shapes_)


def distributed_transpose_azimuth(input_, dims_, shapes_):
    """Move the split over the azimuth ranks from ``dims_[1]`` (``shapes_`` its chunks) to ``dims_[0]``."""
    return _transpose(azimuth_group(), "distributed_transpose_azimuth", input_, dims_, shapes_)


def polar_halo_exchange(x, r_lat):
    """``x`` ``(B, C, H, W)`` with ``r_lat`` rows of each polar neighbour above and below (zeros past the poles):
    ``(B, C, H + 2 r_lat, W)``; backward: the halo's gradient summed back where its rows live."""
    if r_lat == 0 or not is_distributed_polar():
        return x
    return apply(_polar_halo(r_lat), x)


def polar_halo_reduce(y, r_lat, H):
    """The adjoint of :func:`polar_halo_exchange`: ``(B, C, H + 2 r_lat, W)`` -> ``(B, C, H, W)``, each halo row
    added to the rank that owns it (``H``, torch-harmonics' argument, is read off ``y`` here)."""
    if r_lat == 0 or not is_distributed_polar():
        return y
    return apply(_polar_halo(r_lat), y, adjoint=True)


def _polar_halo(r_lat):
    """The polar halo of ``r_lat`` rows (zeros past the poles) on the process grid."""
    return HaloExchange(process_grid(), r_lat, 0)
