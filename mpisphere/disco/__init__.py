"""DISCO convolutions: filter bases, the convolution tensor, its banded spectral form, the distributed operators."""

from .bases import BASIS_TYPES, FilterBasis, filter_basis
from .convolution import DiscoConvS2, DiscoConvTransposeS2
from .reach import widest_theta_cutoff
from .psi import NORM_MODES, ConvolutionTensor, convolution_tensor, default_theta_cutoff

__all__ = ["BASIS_TYPES", "NORM_MODES", "ConvolutionTensor", "DiscoConvS2", "DiscoConvTransposeS2", "FilterBasis",
           "convolution_tensor", "default_theta_cutoff", "filter_basis", "widest_theta_cutoff"]
