"""Quadrature rules, latitude support bands and polar halo radii (serial)."""

import numpy
import pytest
from numpy.polynomial import legendre as npleg

from mpisphere.partition import split_sizes
from mpisphere.geometry import latitude_support_band, polar_halo_radius
from mpisphere.quadrature import QUADRATURES as GRIDS
from mpisphere.quadrature import RULES, clenshaw_curtis, exact_degree, latitudes, legendre_gauss, lobatto, rule

SIZES = list(range(2, 30)) + [64, 91, 128, 181, 361]


def _legendre_values(kmax, x):
    """P_0..P_kmax at x, shape (kmax + 1, len(x)) (NumPy's own Legendre module)."""
    return numpy.array([npleg.legval(x, [0] * k + [1]) for k in range(kmax + 1)])


@pytest.mark.parametrize("rule", GRIDS)
@pytest.mark.parametrize("n", SIZES)
def test_exact_to_the_promised_degree_and_not_beyond(rule, n):
    theta, w = latitudes(n, rule)
    x = numpy.cos(theta)
    degree = exact_degree(n, rule)
    values = _legendre_values(degree + 1, x) @ w
    expected = numpy.zeros(degree + 2)
    expected[0] = 2.0
    numpy.testing.assert_allclose(values[:degree + 1], expected[:degree + 1], rtol=0, atol=1e-13 * max(1, n / 20))
    # every symmetric rule integrates odd polynomials; degree + 1 is even and must fail,
    # which shows the promise above is sharp
    assert (degree + 1) % 2 == 0
    assert abs(values[degree + 1]) > 1e-10  # roundoff is ~1e-16 here


@pytest.mark.parametrize("rule", GRIDS)
@pytest.mark.parametrize("n", SIZES)
def test_grid_layout(rule, n):
    theta, w = latitudes(n, rule)
    assert theta.shape == w.shape == (n,)
    assert numpy.all(numpy.diff(theta) > 0), "north pole first, colatitude increasing"
    numpy.testing.assert_allclose(theta + theta[::-1], numpy.pi, atol=1e-14)
    numpy.testing.assert_allclose(w, w[::-1], rtol=1e-13)
    assert numpy.all(w > 0)
    assert abs(w.sum() - 2.0) < 1e-13
    if rule in ("equiangular", "lobatto"):
        assert theta[0] == 0.0 and theta[-1] == numpy.pi
    else:
        assert 0.0 < theta[0] and theta[-1] < numpy.pi


@pytest.mark.parametrize("n", [1, 2, 3, 10, 64, 100])
def test_gauss_matches_numpy(n):
    theta, w = legendre_gauss(n)
    x_ref, w_ref = npleg.leggauss(n)
    numpy.testing.assert_allclose(numpy.cos(theta), x_ref[::-1], atol=1e-14)
    # NumPy's own small polar weights carry relative errors that depend on its version (6.4e-12 at n = 100 in
    # NumPy 2.2, 2e-12 in 2.4): compare on the scale of the largest weight, where both agree to about 1e-13
    numpy.testing.assert_allclose(w, w_ref[::-1], rtol=0, atol=1e-12 * w_ref.max())


@pytest.mark.parametrize("n", [361, 721, 1441])
def test_gauss_matches_scipy_at_high_resolution(n):
    special = pytest.importorskip("scipy.special")
    theta, w = legendre_gauss(n)
    x_ref, w_ref = special.roots_legendre(n)
    numpy.testing.assert_allclose(numpy.cos(theta), x_ref[::-1], atol=1e-14)
    # SciPy's weights differ from ours by up to ~1e-13 absolute (6e-9 relative) at the
    # node nearest each pole. Ours integrate P_0..P_{2n-1} to 1e-15 at n=721 and 1441
    # (checked by hand), and at n=64, checked against 40-digit mpmath, ours are within
    # 1e-13 relative and SciPy's within 1e-12. Exactness is tested above.
    numpy.testing.assert_allclose(w, w_ref[::-1], rtol=0, atol=2e-13)


def test_equiangular_points():
    theta, w = clenshaw_curtis(5)
    numpy.testing.assert_allclose(theta, numpy.pi * numpy.arange(5) / 4)
    numpy.testing.assert_allclose(w, [1 / 15, 8 / 15, 12 / 15, 8 / 15, 1 / 15], rtol=1e-14)
    numpy.testing.assert_allclose(clenshaw_curtis(2)[1], [1.0, 1.0])
    numpy.testing.assert_allclose(lobatto(3)[1], [1 / 3, 4 / 3, 1 / 3], rtol=1e-14)


def test_bad_grids():
    with pytest.raises(ValueError, match="quadrature must be one of .*got 'gaussian'"):
        latitudes(10, "gaussian")
    with pytest.raises(ValueError, match="needs at least 2 latitudes, got 1"):
        clenshaw_curtis(1)
    with pytest.raises(ValueError, match="needs at least 2 latitudes"):
        lobatto(1)
    with pytest.raises(ValueError, match="latitudes: the lobatto rule needs at least 2 latitudes, got 1"):
        latitudes(1, "lobatto")
    with pytest.raises(TypeError, match="legendre_gauss: the number of latitudes must be an integer, got 3.5"):
        legendre_gauss(3.5)


def test_one_record_per_rule():
    """Every rule is one record: its nodes, exact degree, default truncation and aliases agree with each other."""
    assert set(RULES) == set(GRIDS) == {"equiangular", "legendre-gauss", "lobatto"}
    for name, record in RULES.items():
        assert rule(name) is record and rule(name.upper()) is record
        for alias in record.aliases:
            assert rule(alias) is record
        n = 9
        theta, w = record.nodes(n)
        assert len(theta) == n and exact_degree(n, name) == record.exact_degree(n)
        # the default truncation is one whose squares the rule integrates exactly
        assert 2 * (record.default_lmax(n) - 1) <= record.exact_degree(n)


# --- support bands ----------------------------------------------------------------

def _band_brute_force(lats_in, lats_out, cutoff):
    lo, hi = [], []
    for t in lats_out:
        inside = [i for i, s in enumerate(lats_in) if abs(s - t) <= cutoff]
        lo.append(inside[0] if inside else None)
        hi.append(inside[-1] if inside else None)
    return lo, hi


def _band_cases():
    rng = numpy.random.default_rng(3)
    cases = []
    for grid_in, grid_out in [("equiangular", "equiangular"), ("legendre-gauss", "equiangular"),
                              ("lobatto", "legendre-gauss")]:
        for n_in, n_out in [(13, 13), (25, 12), (9, 30)]:
            lats_in = latitudes(n_in, grid_in)[0]
            lats_out = latitudes(n_out, grid_out)[0]
            spacing = numpy.pi / n_in
            for cutoff in (0.0, 0.5 * spacing, spacing, 2 * spacing, 3.7 * spacing, 4.0):
                cases.append((lats_in, lats_out, cutoff))
    for _ in range(20):  # random latitudes, cutoffs that hit exact differences
        lats_in = numpy.sort(rng.uniform(0, numpy.pi, rng.integers(1, 30)))
        lats_out = numpy.sort(rng.uniform(0, numpy.pi, rng.integers(1, 30)))
        cutoff = abs(lats_in[rng.integers(len(lats_in))] - lats_out[rng.integers(len(lats_out))])
        cases.append((lats_in, lats_out, cutoff))
    # decimal grids where theta_out - cutoff rounds past theta_in
    cases.append((numpy.array([0.1, 0.2, 0.3, 0.4]), numpy.array([0.3, 0.5]), 0.2))
    return cases


@pytest.mark.parametrize("lats_in, lats_out, cutoff", _band_cases())
def test_support_band_agrees_with_brute_force(lats_in, lats_out, cutoff):
    lo, hi = latitude_support_band(lats_in, lats_out, cutoff)
    ref_lo, ref_hi = _band_brute_force(lats_in, lats_out, cutoff)
    for j in range(len(lats_out)):
        if ref_lo[j] is None:
            assert hi[j] < lo[j]
        else:
            assert (lo[j], hi[j]) == (ref_lo[j], ref_hi[j])


def test_support_band_errors():
    with pytest.raises(ValueError, match="latitudes must be 1-D arrays"):
        latitude_support_band([[0.1]], [0.1], 0.1)
    with pytest.raises(ValueError, match="increasing"):
        latitude_support_band([0.2, 0.1], [0.1], 0.1)
    with pytest.raises(ValueError, match="non-negative"):
        latitude_support_band([0.1], [0.1], -1.0)


def _radius_brute_force(lats_in, lats_out, cutoff, sizes_in, sizes_out):
    radius = 0
    starts_in = numpy.cumsum([0] + sizes_in[:-1])
    starts_out = numpy.cumsum([0] + sizes_out[:-1])
    for rank in range(len(sizes_in)):
        first, last = starts_in[rank], starts_in[rank] + sizes_in[rank] - 1
        for j in range(starts_out[rank], starts_out[rank] + sizes_out[rank]):
            for i, s in enumerate(lats_in):
                if abs(s - lats_out[j]) <= cutoff:
                    radius = max(radius, first - i, i - last)
    return radius


def _random_split(rng, n, parts):
    cuts = numpy.sort(rng.choice(numpy.arange(1, n), parts - 1, replace=False))
    return list(numpy.diff(numpy.concatenate([[0], cuts, [n]])).astype(int))


@pytest.mark.parametrize("seed", range(40))
def test_polar_halo_radius_agrees_with_brute_force(seed):
    rng = numpy.random.default_rng(seed)
    n_in, n_out = int(rng.integers(6, 40)), int(rng.integers(6, 40))
    parts = int(rng.integers(2, min(n_in, n_out, 6) + 1))
    grid_in, grid_out = rng.choice(GRIDS, 2)
    lats_in, lats_out = latitudes(n_in, grid_in)[0], latitudes(n_out, grid_out)[0]
    cutoff = float(rng.uniform(0, 0.6))
    sizes_in, sizes_out = _random_split(rng, n_in, parts), _random_split(rng, n_out, parts)
    expected = _radius_brute_force(lats_in, lats_out, cutoff, sizes_in, sizes_out)
    if expected > min(sizes_in):
        with pytest.raises(ValueError, match=rf"a halo of {expected} rows is wider than the smallest polar tile"):
            polar_halo_radius((sizes_in, sizes_out), lats_in, lats_out, cutoff)
    else:
        assert polar_halo_radius((sizes_in, sizes_out), lats_in, lats_out, cutoff) == expected


def test_polar_halo_radius_from_rank_count():
    lats = latitudes(361, "equiangular")[0]
    cutoff = 3.5 * numpy.pi / 360
    sizes = split_sizes(361, 4)
    expected = _radius_brute_force(lats, lats, cutoff, sizes, sizes)
    assert polar_halo_radius(4, lats, lats, cutoff) == expected == 3
    assert polar_halo_radius(1, lats, lats, cutoff) == 0
    with pytest.raises(ValueError, match="smallest polar tile"):
        polar_halo_radius(180, lats, lats, cutoff)  # chunks of 2 and 3 rows
    with pytest.raises(TypeError, match="grid_or_sizes"):
        polar_halo_radius("four", lats, lats, cutoff)
    with pytest.raises(ValueError, match=r"sizes \[180, 180\] / \[181, 180\] do not split 361 / 361 latitudes"):
        polar_halo_radius(([180, 180], [181, 180]), lats, lats, cutoff)
