"""strided_pieces: the views it returns read exactly the sources of every target, or it says None."""

import numpy
import pytest

from mpisphere.strided import strided_pieces


def read_back(pieces, n):
    """The source each target reads, from the pieces alone (-1 where no piece covers a target)."""
    found = numpy.full(n, -1)
    for targets, first, step in pieces:
        rows = numpy.arange(n)[targets]
        assert (found[rows] == -1).all(), "a target covered twice"
        found[rows] = first + step * numpy.arange(len(rows))
    return found


@pytest.mark.parametrize("start", [
    numpy.arange(40) + 3,                                   # a band that slides by one row
    numpy.arange(80) // 2,                                  # a grid twice as fine: each source read twice
    numpy.minimum(numpy.arange(50), 30),                    # a run that stops at the edge
    numpy.concatenate([numpy.arange(10), numpy.arange(10, 40, 3)]),
    (numpy.arange(90) * 2) // 3,                            # three targets for every two sources
    numpy.array([5]),
], ids=["slide", "twice", "edge", "two-steps", "three-halves", "one"])
def test_the_views_read_what_the_index_says(start):
    pieces = strided_pieces(start)
    assert pieces is not None and len(pieces) <= 4 * 6
    numpy.testing.assert_array_equal(read_back(pieces, len(start)), start)


def test_an_index_without_structure_is_left_to_a_gather():
    assert strided_pieces(numpy.random.default_rng(0).permutation(200)) is None
