"""Reference vector SHT for the tests: torch-harmonics 0.9's formulas (its m-recurrence for the derivatives),
written again in NumPy from scipy's orthonormal harmonics; it shares no code with mpisphere."""
import math
import numpy
from scipy import special


def legpoly(mmax, lmax, theta, norm, inverse):
    """P[m, l, k] without the Condon-Shortley phase, in torch-harmonics' norms."""
    out = numpy.zeros((mmax, lmax, len(theta)))
    for m in range(min(mmax, lmax)):
        for l in range(m, lmax):
            out[m, l] = special.sph_harm_y(l, m, theta, 0.0).real * (-1) ** m
    factor = 1.0 if norm == "ortho" else math.sqrt(4 * math.pi)
    factor = 1 / factor if inverse else factor
    out *= factor
    if norm == "schmidt":
        s = numpy.sqrt(2 * numpy.arange(lmax) + 1.0)[None, :, None]
        out = out * s if inverse else out / s
    return out


def dlegpoly(mmax, lmax, theta, norm, inverse, csphase):
    pct = legpoly(mmax + 1, lmax + 1, theta, norm, inverse)
    d = numpy.zeros((2, mmax, lmax, len(theta)))
    for m in range(mmax):
        for l in range(lmax):
            if 1 <= m <= l:
                d[0, m, l] = 0.5 * (math.sqrt((l + m) * (l - m + 1)) * pct[m - 1, l]
                                    - math.sqrt((l - m) * (l + m + 1)) * pct[m + 1, l])
                d[1, m, l] = 0.5 * math.sqrt((2 * l + 1) / (2 * l + 3)) * (
                    math.sqrt((l - m + 1) * (l - m + 2)) * pct[m - 1, l + 1]
                    + math.sqrt((l + m + 1) * (l + m + 2)) * pct[m + 1, l + 1])
        if m == 0:
            d[0, 0] = -numpy.sqrt(numpy.arange(lmax) * (numpy.arange(lmax) + 1.0))[:, None] * pct[1, :lmax]
    if norm == "schmidt":
        l = numpy.arange(lmax)
        corr = numpy.sqrt((2 * l + 3) / (2 * l + 1)) if not inverse else numpy.sqrt((2 * l + 1) / (2 * l + 3))
        d[1] *= corr[None, :, None]
    if csphase:
        d[:, 1::2] *= -1
    return d


def forward(field, lmax, mmax, theta, w, norm="ortho", csphase=True):
    d = dlegpoly(mmax, lmax, theta, norm, False, csphase)
    l = numpy.arange(lmax)
    nf = numpy.ones(lmax)
    nf[1:] = 1.0 / (l[1:] * (l[1:] + 1.0))
    W = d * (2 * numpy.pi * w)[None, None, None, :] * nf[None, None, :, None]
    W[1] = -W[1]
    X = numpy.fft.rfft(field, axis=-1, norm="forward")[..., :mmax]
    X0, X1 = X[..., 0, :, :], X[..., 1, :, :]
    def c(t, a):
        return numpy.einsum("mlk,...km->...lm", t, a)
    s = c(W[0], X0) + 1j * c(W[1], X1)
    t = 1j * c(W[1], X0) - c(W[0], X1)
    return numpy.stack([s, t], axis=-3)


def inverse(coeffs, nlat, nlon, theta, norm="ortho", csphase=True):
    lmax, mmax = coeffs.shape[-2:]
    d = dlegpoly(mmax, lmax, theta, norm, True, csphase)
    S, T = coeffs[..., 0, :, :], coeffs[..., 1, :, :]
    def c(t, a):
        return numpy.einsum("mlk,...lm->...km", t, a)
    v0 = c(d[0], S) + 1j * c(d[1], T)
    v1 = 1j * c(d[1], S) - c(d[0], T)
    V = numpy.stack([v0, v1], axis=-3)
    padded = numpy.zeros(V.shape[:-1] + (nlon // 2 + 1,), complex)
    padded[..., :mmax] = V
    return numpy.fft.irfft(padded, n=nlon, axis=-1, norm="forward")
