"""Associated Legendre functions: against scipy, orthonormality at high degree (serial)."""

import numpy
import pytest

from mpisphere.legendre import associated_legendre, degree_factors
from mpisphere.quadrature import latitudes

special = pytest.importorskip("scipy.special")


@pytest.mark.parametrize("csphase", [True, False])
def test_matches_scipy_orthonormal_harmonics(csphase):
    theta = numpy.linspace(0, numpy.pi, 41)  # poles included
    lmax = 70
    table = associated_legendre(lmax, range(lmax), theta, "ortho", csphase)
    for m in range(lmax):
        assert not table[m, :m].any(), "zero below the diagonal"
        for l in range(m, lmax):
            ref = special.sph_harm_y(l, m, theta, 0.0).real * (1 if csphase or m % 2 == 0 else -1)
            numpy.testing.assert_allclose(table[m, l], ref, rtol=0, atol=1e-13)


def test_subset_of_orders_equals_the_full_table():
    theta = latitudes(30, "legendre-gauss")[0]
    full = associated_legendre(40, range(40), theta)
    part = associated_legendre(40, [3, 17, 39, 45], theta)
    numpy.testing.assert_array_equal(part[:3], full[[3, 17, 39]])
    assert not part[3].any()  # m >= lmax: no degrees


@pytest.mark.parametrize("lmax, orders", [(1024, [0, 1, 2, 100, 377, 1000, 1023]),
                                          (3000, [1500, 2000, 2999])])
def test_orthonormal_at_high_degree(lmax, orders):
    """2 pi sum_k w_k P(l, m) P(l', m) = delta, with Gauss weights exact for the products.

    At lmax = 3000 and m = 2000, sin(theta)^m underflows over most of the sphere while
    the functions themselves are O(1) there: only a scaled recurrence gets this right.
    """
    theta, w = latitudes(lmax + 1, "legendre-gauss")
    table = associated_legendre(lmax, orders, theta)
    for i, m in enumerate(orders):
        rows = table[i, m:] * numpy.sqrt(2 * numpy.pi * w)
        gram = rows @ rows.T
        assert abs(gram - numpy.eye(len(gram))).max() < 5e-13, f"m={m}"


@pytest.mark.parametrize("norm", ["schmidt", "four-pi"])
def test_norm_factors(norm):
    theta = numpy.linspace(0.1, 3.0, 7)
    ortho = associated_legendre(12, range(12), theta)
    forward = associated_legendre(12, range(12), theta, norm)
    inverse = associated_legendre(12, range(12), theta, norm, inverse=True)
    l = numpy.arange(12)[None, :, None]
    scale = numpy.sqrt(4 * numpy.pi) / (numpy.sqrt(2 * l + 1) if norm == "schmidt" else 1)
    numpy.testing.assert_allclose(forward, ortho * scale, rtol=1e-14)
    numpy.testing.assert_allclose(inverse, ortho / scale, rtol=1e-14)
    numpy.testing.assert_allclose(degree_factors(12, norm, False) * degree_factors(12, norm, True), 1.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="norm must be one of .*got 'unit'"):
        associated_legendre(4, [0], [0.5], "unit")
    with pytest.raises(ValueError, match="orders must be non-negative"):
        associated_legendre(4, [-1], [0.5])
