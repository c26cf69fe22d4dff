"""mpisphere: fields on the sphere spread over a 2-D grid of MPI ranks.

Communication operators with exact adjoints (transposes, gathers,
reductions, halo exchanges) on NumPy or CuPy buffers, and a distributed
spherical harmonic transform built from them. See README.md for a tour.
"""

from .settings import config
from .partition import split_sizes, split_offsets, split_along, flatten_leading, unflatten_leading
from .grid import ProcessGrid
from .operators import LinearOperator, Layout, Identity, Diagonal, dottest, inner, DISTRIBUTED, REPLICATED
from .primitives import (
    Transpose,
    Exchange,
    CopyTo,
    ReduceFrom,
    ScatterTo,
    GatherFrom,
    ReduceScatter,
    GatherFromCopyTo,
)
from .halo import HaloExchange, HaloReduce, latitude_support_band, polar_halo_radius
from .interpolation import PointInterpolation
from .quadrature import latitudes, truncate_sht
from .sht import (calculus, DistributedRealSHT, DistributedInverseRealSHT, DistributedRealVectorSHT,
                  DistributedInverseRealVectorSHT)
from .backend import select_device

__version__ = "0.2.0"

__all__ = [
    "config",
    "split_sizes",
    "split_offsets",
    "split_along",
    "flatten_leading",
    "unflatten_leading",
    "ProcessGrid",
    "LinearOperator",
    "Layout",
    "Identity",
    "Diagonal",
    "dottest",
    "inner",
    "DISTRIBUTED",
    "REPLICATED",
    "Transpose",
    "Exchange",
    "CopyTo",
    "ReduceFrom",
    "ScatterTo",
    "GatherFrom",
    "ReduceScatter",
    "GatherFromCopyTo",
    "HaloExchange",
    "HaloReduce",
    "latitudes",
    "latitude_support_band",
    "polar_halo_radius",
    "PointInterpolation",
    "truncate_sht",
    "DistributedRealSHT",
    "DistributedInverseRealSHT",
    "DistributedRealVectorSHT",
    "calculus",
    "DistributedInverseRealVectorSHT",
    "select_device",
]
