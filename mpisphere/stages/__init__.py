"""Stages and the pipeline that runs them, shared by the transforms (``sht``) and the DISCO convolutions (``disco``).

======================  =========================================================
module                  owns
======================  =========================================================
``pipeline``            ``LocalStage``, ``Pipeline``: a plan compiled from what its stages declare, then run
``fourier``             the real FFT along longitudes and the truncation of its orders, as stages
======================  =========================================================
"""

from .fourier import FourierStage, Truncation, resolve_fft
from .pipeline import BATCH_INNERMOST, LocalStage, Pipeline

__all__ = ["FourierStage", "Truncation", "resolve_fft", "BATCH_INNERMOST", "LocalStage", "Pipeline"]
