"""Filter bases of the DISCO convolutions: functions on a disk of angular radius ``r_cutoff`` (no MPI).

A DISCO filter is a learned combination of ``kernel_size`` fixed functions
``phi_k(r, phi)`` of the polar coordinates around the output point. The bases
follow torch-harmonics 0.9.3's conventions (collocation points, orderings,
normalisations), so that weights trained there mean the same here:

``"piecewise linear"``
    hat functions in radius (``kernel_shape = (nr,)``, isotropic) or tensor
    products of hats in radius and angle (``(nr, nphi)``, anisotropic);
``"harmonic"``
    a Hann window in radius times sines and cosines of the Cartesian
    coordinates on the disk, each scaled to unit L2 norm on the unit disk
    (``"morlet"``: the same without that scaling, torch-harmonics'
    deprecated name);
``"zernike"``
    the Zernike polynomials of degree below ``kernel_shape``, with unit L2
    norm on the unit disk.
"""

import math
import warnings

import numpy

from ..validation import check_choice

__all__ = ["BASIS_TYPES", "FilterBasis", "filter_basis"]

BASIS_TYPES = ("piecewise linear", "harmonic", "morlet", "zernike")


def _circle_distance(a, b):
    """Distance of two angles on the circle (``a`` in ``[0, 2 pi)``, ``b`` in ``[-pi, pi)``)."""
    d = numpy.abs(a - b)
    return numpy.minimum(d, numpy.abs(2.0 * math.pi - d))


class FilterBasis:
    """The functions of one basis.

    Attributes
    ----------
    basis_type : str
    kernel_shape : tuple of int
    kernel_size : int
        Number of functions.
    isotropic : tuple of bool
        Per function: whether it depends on the radius alone.
    """

    def __init__(self, basis_type, kernel_shape):
        self.basis_type = basis_type
        self.kernel_shape = kernel_shape
        self._norms = None
        if basis_type == "harmonic":
            self._norms = self._disk_norms()

    def __repr__(self):
        return f"FilterBasis({self.basis_type!r}, kernel_shape={self.kernel_shape})"

    @property
    def kernel_size(self):
        shape = self.kernel_shape
        if self.basis_type == "piecewise linear":
            return (shape[0] // 2) * shape[1] + shape[0] % 2
        if self.basis_type == "zernike":
            return shape[0] * (shape[0] + 1) // 2
        return shape[0] * shape[1]

    @property
    def isotropic(self):
        if self.basis_type == "piecewise linear":
            nr, nphi = self.kernel_shape
            if nphi == 1:
                return (True,) * self.kernel_size
            return tuple(k == 0 and nr % 2 == 1 for k in range(self.kernel_size))
        if self.basis_type == "zernike":
            return tuple(2 * l == n for n in range(self.kernel_shape[0]) for l in range(n + 1))
        return tuple(k == 0 for k in range(self.kernel_size))

    def evaluate(self, r, phi, r_cutoff):
        """The functions at the points ``(r, phi)``, and where torch-harmonics lists them.

        Parameters
        ----------
        r, phi : ndarray, shape ``(n,)``
            Angular distance from the disk's centre (radians) and direction
            in ``[0, 2 pi)``.
        r_cutoff : float
            The disk's radius.

        Returns
        -------
        listed : ndarray of bool, shape ``(kernel_size, n)``
            The points in each function's support as torch-harmonics lists
            them (its ``"support"`` normalisation sums quadrature weights over
            these, zeros of a function included).
        values : ndarray, shape ``(kernel_size, n)``
            ``phi_k`` at each point; 0 where not listed.
        """
        r = numpy.asarray(r, dtype=numpy.float64)
        phi = numpy.asarray(phi, dtype=numpy.float64)
        if self.basis_type == "piecewise linear":
            if self.kernel_shape[1] == 1:
                return self._hats(r, r_cutoff)
            return self._hats_anisotropic(r, phi, r_cutoff)
        inside = numpy.broadcast_to(r <= r_cutoff, (self.kernel_size, r.size))
        u = r / r_cutoff
        if self.basis_type == "zernike":
            vals = self._zernike(u, phi)
        else:
            vals = self._harmonic(u, phi)
            if self._norms is not None:
                vals = vals / numpy.maximum(self._norms, 1e-12)[:, None]
        return inside, numpy.where(inside, vals, 0.0)

    # --- piecewise linear ---------------------------------------------------------------------

    def _hats(self, r, r_cutoff):
        nr = self.kernel_shape[0]
        dr = 2.0 * r_cutoff / (nr + 1)
        k = numpy.arange(self.kernel_size, dtype=numpy.float64)[:, None]
        centre = k * dr if nr % 2 == 1 else (k + 0.5) * dr
        distance = numpy.abs(r - centre)
        listed = (distance <= dr) & (r <= r_cutoff)
        return listed, numpy.where(listed, 1.0 - distance / dr, 0.0)

    def _hats_anisotropic(self, r, phi, r_cutoff):
        nr, nphi = self.kernel_shape
        dr = 2.0 * r_cutoff / (nr + 1)
        dphi = 2.0 * math.pi / nphi
        k = numpy.arange(self.kernel_size)[:, None]
        if nr % 2 == 1:
            # function 0 is the hat at the centre; the others sit on rings at dr, 2 dr, ... in nphi directions
            centre = ((k - 1) // nphi + 1) * dr
            direction = ((k - 1) % nphi) * dphi - math.pi
            in_r = (numpy.abs(r - centre) <= dr) & (r <= r_cutoff)
            in_phi = (k == 0) | (_circle_distance(phi, direction) <= dphi)
            vals = 1.0 - numpy.abs(r - centre) / dr
            vals = vals * numpy.where(k > 0, 1.0 - _circle_distance(phi, direction) / dphi, 1.0)
            return in_r & in_phi, numpy.where(in_r & in_phi, vals, 0.0)
        # even: the innermost ring's hats reach through the centre, onto the opposite direction
        centre = (k // nphi + 0.5) * dr
        direction = (k % nphi) * dphi - math.pi
        opposite = numpy.where(phi >= 0.0, phi - math.pi, phi + math.pi)
        in_r = (numpy.abs(r - centre) <= dr) & (r <= r_cutoff)
        in_phi = _circle_distance(phi, direction) <= dphi
        in_rn = (numpy.abs(-r - centre) <= dr) & (-r <= r_cutoff)
        in_phin = _circle_distance(opposite, direction) <= dphi
        vals = in_r * (1.0 - numpy.abs(r - centre) / dr) * in_phi * (1.0 - _circle_distance(phi, direction) / dphi)
        vals = vals + in_rn * (1.0 - numpy.abs(-r - centre) / dr) * in_phin \
            * (1.0 - _circle_distance(opposite, direction) / dphi)
        listed = (in_r & in_phi) | (in_rn & in_phin)
        return listed, numpy.where(listed, vals, 0.0)

    # --- harmonic -----------------------------------------------------------------------------

    def _harmonic(self, u, phi):
        k = numpy.arange(self.kernel_size)[:, None]
        n, m = k % self.kernel_shape[1], k // self.kernel_shape[1]
        x, y = u * numpy.sin(phi), u * numpy.cos(phi)
        fx, fy = numpy.ceil(n / 2.0), numpy.ceil(m / 2.0)
        wave = numpy.where(n % 2 == 1, numpy.sin(fx * math.pi * x), numpy.cos(fx * math.pi * x))
        wave = wave * numpy.where(m % 2 == 1, numpy.sin(fy * math.pi * y), numpy.cos(fy * math.pi * y))
        return numpy.cos(0.5 * math.pi * u) ** 2 * wave

    def _disk_norms(self, nr=50, nphi=200):
        # torch-harmonics' numerical L2 norms on the unit disk (midpoint rule in r, open grid in phi): the same
        # rule, so that the normalised functions are the same numbers
        dr, dphi = 1.0 / nr, 2.0 * math.pi / nphi
        r = (numpy.arange(nr) + 0.5) * dr
        phi = numpy.arange(nphi) * dphi
        r, phi = (a.reshape(-1) for a in numpy.meshgrid(r, phi, indexing="ij"))
        vals = self._harmonic(r, phi)
        return numpy.sqrt((vals ** 2 * r * dr * dphi).sum(axis=1))

    # --- zernike ------------------------------------------------------------------------------

    def _zernike(self, u, phi):
        out = numpy.empty((self.kernel_size, u.size))
        k = 0
        for n in range(self.kernel_shape[0]):
            for l in range(n + 1):
                m = 2 * l - n
                am = abs(m)
                radial = numpy.zeros_like(u)
                for s in range((n - am) // 2 + 1):
                    radial += ((-1) ** s * math.factorial(n - s)
                               / (math.factorial(s) * math.factorial((n + am) // 2 - s)
                                  * math.factorial((n - am) // 2 - s))) * u ** (n - 2 * s)
                angular = numpy.sin(m * phi) if m < 0 else numpy.cos(m * phi)
                norm = math.sqrt(math.pi * (2.0 if m == 0 else 1.0) / (2.0 * (n + 1)))
                out[k] = radial * angular / norm
                k += 1
        return out


def filter_basis(kernel_shape, basis_type="piecewise linear"):
    """The :class:`FilterBasis` of torch-harmonics' ``get_filter_basis(kernel_shape, basis_type)``.

    Parameters
    ----------
    kernel_shape : int or tuple of int
        ``"piecewise linear"``: ``nr`` or ``(nr, nphi)``; ``"harmonic"``
        and ``"morlet"``: ``n`` (for ``(n, n)``) or ``(n, m)``;
        ``"zernike"``: the number of degrees ``n`` (or ``(n,)``).
    basis_type : {"piecewise linear", "harmonic", "morlet", "zernike"}

    Raises
    ------
    ValueError
        An unknown basis type or a kernel shape the basis does not take.
    """
    basis_type = check_choice(basis_type, BASIS_TYPES, "basis_type", "filter_basis")
    shape = (kernel_shape,) if isinstance(kernel_shape, (int, numpy.integer)) else tuple(kernel_shape)
    if not shape or not all(isinstance(s, (int, numpy.integer)) and s >= 1 for s in shape):
        raise ValueError(f"filter_basis: kernel_shape must be positive integers, got {kernel_shape!r}")
    shape = tuple(int(s) for s in shape)
    if basis_type == "piecewise linear":
        if len(shape) > 2:
            raise ValueError(f"filter_basis: a piecewise linear kernel_shape is (nr,) or (nr, nphi), got {shape}")
        shape = shape if len(shape) == 2 else (shape[0], 1)
    elif basis_type == "zernike":
        shape = shape[:1]
    else:
        if len(shape) > 2:
            raise ValueError(f"filter_basis: a {basis_type} kernel_shape is n or (n, m), got {shape}")
        shape = shape if len(shape) == 2 else (shape[0], shape[0])
    if basis_type == "morlet":
        warnings.warn("basis_type='morlet' is torch-harmonics' deprecated name of 'harmonic' without the L2 "
                      "normalisation; use 'harmonic'", DeprecationWarning, stacklevel=2)
    return FilterBasis(basis_type, shape)
