"""Distributed spherical harmonic transforms: tables and kernels without MPI, transforms built on ``mpisphere.stages``.

======================  =========================================================
module                  owns
======================  =========================================================
``orders``, ``costs``   which orders each azimuth rank holds; what a transform costs
``tables``              parity-split Legendre tables of one rank's orders
``contraction``         the Legendre step's matrix products (per order, batched)
``legendre_stage``      the Legendre contraction as a stage
``coupling``            the vector transforms' degree coupling as a stage
``transforms``          the public transforms, each a pipeline of stages
``ring_fourier``        the Fourier stage of ring grids (whole rings, one FFT per length)
``reduced``             the transforms on ring grids (octahedral, reduced Gaussian)
``calculus``            spectral operators on coefficient blocks (Laplacian, winds, ...)
======================  =========================================================
"""

from . import calculus
from .transforms import DistributedInverseRealSHT, DistributedRealSHT
from .vector import DistributedInverseRealVectorSHT, DistributedRealVectorSHT
from .reduced import (DistributedInverseReducedRealSHT, DistributedInverseReducedRealVectorSHT,
                      DistributedReducedRealSHT, DistributedReducedRealVectorSHT)

__all__ = ["calculus", "DistributedRealSHT", "DistributedInverseRealSHT", "DistributedRealVectorSHT",
           "DistributedInverseRealVectorSHT", "DistributedReducedRealSHT", "DistributedInverseReducedRealSHT",
           "DistributedReducedRealVectorSHT", "DistributedInverseReducedRealVectorSHT"]
