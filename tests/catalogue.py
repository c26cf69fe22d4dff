"""One catalogue of operators and points for the tests that run every operator (staging, GPU).

``operators(grid)`` returns ``(operator, domain point)`` pairs covering every
primitive, the halo exchange and the transforms, on uneven extents; the
points come from the operators' own shape contract.
"""

import numpy

from mpisphere import (CopyTo, DistributedInverseRealSHT, DistributedRealSHT, GatherFrom, GatherFromCopyTo,
                       HaloExchange, ReduceFrom, ReduceScatter, ScatterTo, Transpose)

from helpers import random_array, rank_rng

BATCH, NLAT, NLON = 5, 13, 10


def operators(grid):
    """``[(op, x)]``: one point of each operator's domain (replicated points identical on every rank)."""
    az, pol = grid.azimuth, grid.polar
    local = rank_rng(grid.cart)
    same = numpy.random.default_rng(3)
    h, w = grid.local_shape(NLAT, NLON)
    cases = [  # (operator, leading axes or a whole template for the primitives, dtype, random source)
        (Transpose(az, axes=(0, 2), extents=(BATCH, NLON)), (BATCH, h, None), numpy.float64, local),
        (Transpose(pol, axes=(-1, 1), extents=(w, NLAT)), (BATCH, None, None), numpy.complex128, local),
        (CopyTo(az), (3, 4), numpy.float64, same),
        (ReduceFrom(pol), (3, 4), numpy.float16, local),
        (ScatterTo(az, 1, 7), (3, None), numpy.float64, same),
        (GatherFrom(az, -1, 7), (3, None), numpy.float32, local),
        (ReduceScatter(pol, 0, 11), (None, 2), numpy.complex128, local),
        (GatherFromCopyTo(pol, 0, 11), (None, 2), numpy.float64, local),
        (HaloExchange(grid, 2, 2, extents=(NLAT, NLON)), (BATCH,), numpy.float64, local),
        (DistributedRealSHT(grid, NLAT, NLON), (2,), numpy.float64, local),
        (DistributedInverseRealSHT(grid, NLAT, NLON), (2,), numpy.complex128, local),
    ]
    return [(op, random_array(rng, op.domain_shape(lead), dtype)) for op, lead, dtype, rng in cases]
