"""The DISCO convolution tensor ``psi``: the filter basis at the input points around each output latitude (no MPI).

The grid is equiangular in longitude, so the filter around an output point
``(theta_t, lambda_q)`` sees the input points at the same positions relative
to it for every ``q``: ``psi[k, t, i, p]`` is basis function ``k`` at input
point ``(theta_i, lambda_p)`` seen from the output point ``(theta_t, 0)``,
and the convolution is ``y[k, t, q] = sum_{i,p} psi[k, t, i, p] x[i, (p + s q)
mod nlon_in]`` with ``s = nlon_in / nlon_out``. ``psi`` is held as the entries
``(k, t, i, p, value)`` that are not known to be zero, normalised and
weighted with the quadrature as torch-harmonics 0.9.3 does
(``basis_norm_mode``: ``"none"``, ``"nodal"``, ``"modal"``, ``"mean"``,
``"support"``, ``"geometric"``).
"""

import dataclasses
import math
import warnings

import numpy

from ..geometry import latitude_support_band
from ..quadrature import latitudes
from ..validation import check_choice

__all__ = ["NORM_MODES", "CUTOFF_MARGIN", "ConvolutionTensor", "convolution_tensor", "default_theta_cutoff",
           "effective_cutoff"]

NORM_MODES = ("none", "nodal", "modal", "mean", "support", "geometric")
_NORM_ALIASES = {"individual": "nodal", "area ratio": "geometric"}

CUTOFF_MARGIN = 1e-3
"""The filter's support is built with the cutoff widened by this fraction (torch-harmonics' ``THETA_CUTOFF_EPS``)."""

_EPS = 1e-9


def effective_cutoff(theta_cutoff):
    """The radius the support is built with: ``theta_cutoff * (1 + CUTOFF_MARGIN)``."""
    return (1.0 + CUTOFF_MARGIN) * theta_cutoff


def default_theta_cutoff(nlat, quadrature="equiangular"):
    """torch-harmonics 0.9.3's default cutoff: the largest gap between neighbouring latitudes of the grid."""
    theta, _ = latitudes(nlat, quadrature)
    return float(numpy.max(numpy.diff(theta)))


@dataclasses.dataclass(frozen=True)
class ConvolutionTensor:
    """The entries of ``psi`` (see the module docstring) on the global grids.

    Attributes
    ----------
    kernel, out_row, in_row, in_col : ndarray of int, shape ``(nnz,)``
        Basis function, output latitude, input latitude and input longitude
        of each entry.
    values : ndarray of float64, shape ``(nnz,)``
    kernel_size : int
    in_shape, out_shape : (int, int)
    band : (ndarray, ndarray)
        Per output latitude, the first and last input latitude within the
        (widened) cutoff; the entries of a latitude lie inside its band.
    """

    kernel: numpy.ndarray
    out_row: numpy.ndarray
    in_row: numpy.ndarray
    in_col: numpy.ndarray
    values: numpy.ndarray
    kernel_size: int
    in_shape: tuple
    out_shape: tuple
    band: tuple

    def dense(self):
        """``psi`` as a dense array ``(kernel_size, nlat_out, nlat_in, nlon_in)`` (for tests and small grids)."""
        out = numpy.zeros((self.kernel_size, self.out_shape[0]) + tuple(self.in_shape))
        numpy.add.at(out, (self.kernel, self.out_row, self.in_row, self.in_col), self.values)
        return out


def _rotated(theta_out, theta_in, lons):
    """Polar coordinates ``(r, phi)`` of the input points ``(theta_in, lons)`` seen from ``(theta_out, 0)``.

    The point is rotated so that the output point moves to the north pole
    (a rotation about the y axis by ``-theta_out``); ``r`` is then its
    colatitude and ``phi`` its longitude in ``[0, 2 pi)``.
    """
    alpha = -theta_out
    sg, cg = numpy.sin(theta_in)[:, None], numpy.cos(theta_in)[:, None]
    cb, sb = numpy.cos(lons)[None, :], numpy.sin(lons)[None, :]
    x = math.cos(alpha) * cb * sg + cg * math.sin(alpha)
    y = sb * sg
    z = -cb * math.sin(alpha) * sg + math.cos(alpha) * cg
    norm = numpy.sqrt(x * x + y * y + z * z)
    x, y, z = x / norm, y / norm, z / norm
    r = numpy.arccos(z)
    phi = numpy.arctan2(y, x)
    phi = numpy.where(phi < 0.0, phi + 2.0 * math.pi, phi)
    return r, phi


def _normalised(values, kernel, group_row, weight_row, q_all, kernel_size, ngroups, mode, isotropic, theta_cutoff):
    """torch-harmonics' basis normalisation: per (function, latitude) group of entries."""
    q = q_all[weight_row]
    gid = kernel * ngroups + group_row
    size = kernel_size * ngroups
    support = numpy.bincount(gid, weights=q, minlength=size)
    bias = numpy.zeros(size)
    if mode == "modal":
        anisotropic = ~numpy.asarray(isotropic, dtype=bool)[kernel]
        numerator = numpy.bincount(gid, weights=values * q * anisotropic, minlength=size)
        bias = numpy.where(numpy.abs(support) > _EPS, numerator / numpy.maximum(support, _EPS), 0.0)
    scale = numpy.bincount(gid, weights=numpy.abs(values - bias[gid]) * q, minlength=size)
    if mode in ("nodal", "modal"):
        return (values - bias[gid]) / numpy.maximum(scale[gid], _EPS)
    if mode == "mean":
        per_kernel_bias = bias.reshape(kernel_size, ngroups).mean(axis=1)
        per_kernel_scale = scale.reshape(kernel_size, ngroups).mean(axis=1)
        return (values - per_kernel_bias[kernel]) / numpy.maximum(per_kernel_scale[kernel], _EPS)
    if mode == "support":
        return values / numpy.maximum(support[gid], _EPS)
    if mode == "geometric":
        return values / max((1.0 - math.cos(theta_cutoff)) / 4.0, _EPS)
    return values


def check_norm_mode(mode, who):
    """The normalisation mode by its name (torch-harmonics' old names warn and map to the new)."""
    if mode in _NORM_ALIASES:
        warnings.warn(f"{who}: basis_norm_mode={mode!r} is torch-harmonics' deprecated name of "
                      f"{_NORM_ALIASES[mode]!r}", DeprecationWarning, stacklevel=3)
        mode = _NORM_ALIASES[mode]
    return check_choice(mode, NORM_MODES, "basis_norm_mode", who)


def convolution_tensor(basis, in_shape, out_shape, quadrature_in="equiangular", quadrature_out="equiangular",
                       theta_cutoff=None, basis_norm_mode="nodal", transpose_normalization=False):
    """The quadrature-weighted, normalised ``psi`` of a DISCO convolution from ``in_shape`` to ``out_shape``.

    Parameters
    ----------
    basis : FilterBasis
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the grids ``psi`` maps from and to.
    quadrature_in, quadrature_out : str
        Their latitude rules.
    theta_cutoff : float
        The filter's radius, radians.
    basis_norm_mode : str
        See the module docstring.
    transpose_normalization : bool
        Normalise as torch-harmonics does for the transposed convolution
        (which uses this ``psi`` from its output grid to its input grid):
        groups by input latitude, the output grid's weights.

    Returns
    -------
    ConvolutionTensor
    """
    nlat_in, nlon_in = in_shape
    nlat_out, nlon_out = out_shape
    theta_in, w_in = latitudes(nlat_in, quadrature_in)
    theta_out, w_out = latitudes(nlat_out, quadrature_out)
    lons = 2.0 * math.pi * numpy.arange(nlon_in) / nlon_in
    cutoff = effective_cutoff(theta_cutoff)
    lo, hi = latitude_support_band(theta_in, theta_out, cutoff)
    parts = []
    for t in range(nlat_out):
        if hi[t] < lo[t]:
            continue
        r, phi = _rotated(theta_out[t], theta_in[lo[t]:hi[t] + 1], lons)
        listed, vals = basis.evaluate(r.reshape(-1), phi.reshape(-1), cutoff)
        k, point = numpy.nonzero(listed)
        parts.append((k, numpy.full(k.size, t), lo[t] + point // nlon_in, point % nlon_in, vals[k, point]))
    kernel, out_row, in_row, in_col, values = (numpy.concatenate([p[i] for p in parts]) if parts
                                               else numpy.zeros(0, dtype=int if i < 4 else float)
                                               for i in range(5))
    if transpose_normalization:
        # the transposed convolution groups by its own output latitude (this psi's input) and weighs with its
        # input grid (this psi's output), scaled by the longitudes of that grid
        q = w_out / nlon_out / 2.0
        values = _normalised(values, kernel, in_row, out_row, w_out / nlon_in / 2.0, basis.kernel_size, nlat_in,
                             basis_norm_mode, basis.isotropic, theta_cutoff)
        values = values * q[out_row]
    else:
        q = w_in / nlon_in / 2.0
        values = _normalised(values, kernel, out_row, in_row, q, basis.kernel_size, nlat_out, basis_norm_mode,
                             basis.isotropic, theta_cutoff)
        values = values * q[in_row]
    return ConvolutionTensor(kernel.astype(numpy.int64), out_row.astype(numpy.int64), in_row.astype(numpy.int64),
                             in_col.astype(numpy.int64), values, basis.kernel_size, (nlat_in, nlon_in),
                             (nlat_out, nlon_out), (lo, hi))
