"""The Legendre contraction's helpers on one rank (no MPI): the degree-triangle copy."""

import numpy
import pytest

from mpisphere.sht import contraction
from mpisphere.sht.tables import LegendreTables


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
