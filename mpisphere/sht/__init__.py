"""Distributed spherical harmonic transforms: tables and kernels without MPI, stages, transforms.

=====================  =========================================================
module                 owns
=====================  =========================================================
``tables``             parity-split Legendre tables of one rank's orders
``contraction``        the Legendre step's matrix products (per order, batched)
``stages``             the stages (FFT, truncation, Legendre) and the pipeline
``transforms``         the public transforms, each a pipeline of stages
=====================  =========================================================
"""

from .transforms import DistributedInverseRealSHT, DistributedRealSHT

__all__ = ["DistributedRealSHT", "DistributedInverseRealSHT"]
