"""mpisphere: fields on the sphere spread over a 2-D grid of MPI ranks.

Communication operators with exact adjoints (transposes, gathers,
reductions, halo exchanges) on NumPy or CuPy buffers, and a distributed
spherical harmonic transform built from them. See README.md for a tour.

Importing the package is cheap and starts nothing: each public name loads
its module on first use (PEP 562), so ``import mpisphere.testing`` (the
pytest plugin) does not import ``mpi4py.MPI``, which would initialise MPI in
the process that launches ``mpiexec``.
"""

import importlib

__version__ = "0.4.4"

# public name -> the module (relative to this package) that defines it
_PUBLIC = {
    "config": "settings",
    "split_sizes": "partition",
    "split_offsets": "partition",
    "split_along": "partition",
    "flatten_leading": "partition",
    "unflatten_leading": "partition",
    "ProcessGrid": "grid",
    "LinearOperator": "operators",
    "ParametrisedOperator": "operators",
    "Layout": "operators",
    "Identity": "operators",
    "Diagonal": "operators",
    "dottest": "operators",
    "aslinearoperator": "scipy_bridge",
    "asmpilinearoperator": "pylops_bridge",
    "inner": "operators",
    "DISTRIBUTED": "operators",
    "REPLICATED": "operators",
    "Transpose": "transpose",
    "Exchange": "transpose",
    "BufferPool": "transpose",
    "CopyTo": "primitives",
    "ReduceFrom": "primitives",
    "ScatterTo": "primitives",
    "GatherFrom": "primitives",
    "ReduceScatter": "primitives",
    "GatherFromCopyTo": "primitives",
    "HaloExchange": "halo",
    "HaloReduce": "halo",
    "latitudes": "quadrature",
    "latitude_support_band": "geometry",
    "polar_halo_radius": "geometry",
    "PointInterpolation": "interpolation",
    "truncate_sht": "quadrature",
    "DistributedRealSHT": "sht",
    "DistributedInverseRealSHT": "sht",
    "DistributedRealVectorSHT": "sht",
    "calculus": "calculus",
    "DistributedInverseRealVectorSHT": "sht",
    "RingGeometry": "rings",
    "RingTiles": "ring_tiles",
    "Tiling": "tiling",
    "RegularTiling": "tiling",
    "DistributedReducedRealSHT": "sht",
    "DistributedInverseReducedRealSHT": "sht",
    "DistributedReducedRealVectorSHT": "sht",
    "DistributedInverseReducedRealVectorSHT": "sht",
    "select_device": "devices",
    "Described": "agreement",
    "agree_construction": "agreement",
    "DiscoConvS2": "disco",
    "DiscoConvTransposeS2": "disco",
    "widest_theta_cutoff": "disco",
    "QuadratureS2": "integral",
    "NeighborhoodAttentionS2": "attention",
    "AttentionS2": "attention",
    "SpectralConvS2": "spectral_convolution",
    "ResampleS2": "resample",
}

__all__ = list(_PUBLIC)


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mpisphere' has no attribute {name!r}")
    imported = importlib.import_module(f".{module}", __name__)
    value = imported if module == name else getattr(imported, name)  # a module that is itself a public name
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
