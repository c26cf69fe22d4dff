"""The Legendre contraction on one rank (no MPI): the degree-triangle copy, the skipped polar entries."""

import numpy
import pytest

from mpisphere.backend import Workspace
from mpisphere.quadrature import latitudes
from mpisphere.sht import contraction
from mpisphere.sht.tables import NEGLIGIBLE, LegendreTables, scalar_tables, vector_tables


def _tables(starts, degrees=9):
    return LegendreTables(degrees, list(range(len(starts))), starts, 6, numpy.float64)


@pytest.mark.parametrize("zero", [True, False])
def test_copy_degrees_copies_the_triangle_between_layouts(rng, zero):
    starts = [0, 1, 1, 4, 8, 9]  # order j holds degrees starts[j] .. 8 (the last none)
    tables = _tables(starts)
    src = rng.standard_normal((3, 9, 6)) + 1j * rng.standard_normal((3, 9, 6))
    dst = numpy.full((9, 6, 3), 7.0 + 0j).transpose(2, 0, 1)  # another memory layout
    contraction.copy_degrees(tables, src, dst, zero=zero)
    held = numpy.arange(9)[:, None] >= numpy.asarray(starts)[None, :]
    assert numpy.array_equal(dst[:, held], src[:, held])
    assert numpy.all(dst[:, ~held] == (0 if zero else 7))


def test_copy_degrees_needs_increasing_first_degrees():
    tables = _tables([0, 4, 2])
    assert not contraction.degrees_are_triangular(tables)
    assert contraction.degrees_are_triangular(_tables([0, 2, 2, 5]))
    with pytest.raises(ValueError, match="first degrees must increase"):
        contraction.copy_degrees(tables, numpy.zeros((9, 3)), numpy.zeros((9, 3)))


def _real_tables(nlat, lmax, vector=False, quadrature="legendre-gauss"):
    theta, weights = latitudes(nlat, quadrature)
    orders = list(range(lmax))
    if vector:
        return vector_tables(lmax, orders, theta, None, True, numpy.float64), weights
    return scalar_tables(lmax, orders, theta, None, "ortho", True, False, numpy.float64), weights


def _dense(tables, nlat):
    """Each order's full ``(L, nlat)`` table (zero below its first degree), from the parity-split halves."""
    dense = numpy.zeros((len(tables.orders), tables.degrees, nlat))
    for j, start in enumerate(tables.starts):
        even, odd = tables.even[j], tables.odd[j]
        south = slice(nlat - 1, nlat - 1 - tables.n_north, -1)
        dense[j, start::2][:even.shape[0], :tables.n_half] = even
        dense[j, start::2][:even.shape[0], south] = even[:, :tables.n_north]
        dense[j, start + 1::2][:odd.shape[0], :tables.n_north] = odd
        dense[j, start + 1::2][:odd.shape[0], south] = -odd
    return dense


@pytest.mark.parametrize("vector", [False, True])
def test_the_skipped_polar_entries_are_negligible_and_there_are_some(vector):
    tables, _ = _real_tables(96, 96, vector)
    skipped = 0
    for j in range(len(tables.orders)):
        for table, first in ((tables.even[j], tables.even_from[j]), (tables.odd[j], tables.odd_from[j])):
            if not table.size:
                continue
            largest = max(abs(tables.even[j]).max(), abs(tables.odd[j]).max() if tables.odd[j].size else 0)
            assert numpy.all(abs(table[:, :first]) <= NEGLIGIBLE * largest)
            assert first == table.shape[1] - 1 or numpy.any(abs(table[:, first]) > NEGLIGIBLE * largest)
            skipped += table[:, :first].size
    assert skipped > 0.03 * sum(t.size for t in tables.even + tables.odd)  # 3.7% here, 12% at 361 x 361


@pytest.mark.parametrize("method", ["per-order", "batched"])
@pytest.mark.parametrize("nlat", [47, 48])
def test_contraction_matches_the_dense_tables_within_rounding(rng, method, nlat):
    """The dense sums within a rounding bound, plus what the skipped polar entries can hold.

    Those entries are at most ``NEGLIGIBLE`` times the order's largest value,
    so they add at most that times the sum of the order's input magnitudes.
    """
    tables, weights = _real_tables(nlat, nlat)
    dense = _dense(tables, nlat)
    largest = abs(dense).max(axis=(1, 2))[None, :, None]  # per order
    count, columns = len(tables.orders), 6
    eps = numpy.finfo(float).eps
    fourier = rng.standard_normal((nlat, count, columns))
    spectral = numpy.empty((tables.degrees, count, columns))
    contraction.analyze(tables, fourier, spectral, Workspace(), method, weights)
    weighted = fourier * weights[:, None, None]
    expected = numpy.einsum("jlk,kjc->ljc", dense, weighted)
    bound = 8 * nlat * eps * numpy.einsum("jlk,kjc->ljc", abs(dense), abs(weighted)) \
        + NEGLIGIBLE * largest * abs(weighted).sum(axis=0)
    assert numpy.all(abs(spectral - expected) <= bound)
    back = numpy.empty_like(fourier)
    contraction.synthesize(tables, spectral, back, Workspace(), method, weights)
    expected = weights[:, None, None] * numpy.einsum("jlk,ljc->kjc", dense, spectral)
    bound = weights[:, None, None] * (8 * nlat * eps * numpy.einsum("jlk,ljc->kjc", abs(dense), abs(spectral))
                                      + NEGLIGIBLE * largest * abs(spectral).sum(axis=0))
    assert numpy.all(abs(back - expected) <= bound)
