"""Distributed spherical harmonic transforms: tables and kernels without MPI, stages, transforms.

=====================  =========================================================
module                 owns
=====================  =========================================================
``tables``             parity-split Legendre tables of one rank's orders
``contraction``        the Legendre step's matrix products (per order, batched)
``stages``             the stages (FFT, truncation, Legendre) and the pipeline
``transforms``         the public transforms, each a pipeline of stages
``calculus``           spectral operators on coefficient blocks (Laplacian, winds, ...)
=====================  =========================================================
"""

from . import calculus
from .transforms import (DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                         DistributedRealVectorSHT)

__all__ = ["calculus", "DistributedRealSHT", "DistributedInverseRealSHT", "DistributedRealVectorSHT",
           "DistributedInverseRealVectorSHT"]
