"""split_sizes and the batch-axis helpers, exhaustively on small sizes (serial)."""

import numpy
import pytest

from mpisphere.partition import (chunk_slice, flatten_leading, normalize_axis, offsets_of, split_along,
                                 split_offsets, split_sizes, unflatten_leading)


@pytest.mark.parametrize("n", range(1, 41))
def test_split_sizes_every_parts(n):
    for parts in range(1, n + 1):
        sizes = split_sizes(n, parts)
        assert len(sizes) == parts
        assert sum(sizes) == n
        assert min(sizes) >= 1
        assert max(sizes) - min(sizes) <= 1
        # the first n % parts chunks are the larger ones
        assert sizes == sorted(sizes, reverse=True)
        assert sizes.count(n // parts + 1) == (n % parts if n % parts else 0)
        offsets = split_offsets(n, parts)
        assert offsets == [sum(sizes[:i]) for i in range(parts)]
        for index in range(parts):
            sl = chunk_slice(n, parts, index)
            assert (sl.start, sl.stop) == (offsets[index], offsets[index] + sizes[index])


def test_split_sizes_examples():
    assert split_sizes(10, 4) == [3, 3, 2, 2]
    assert split_sizes(128, 3) == [43, 43, 42]
    assert split_sizes(361, 3) == [121, 120, 120]
    assert split_sizes(numpy.int64(5), numpy.int32(5)) == [1] * 5


@pytest.mark.parametrize("n, parts", [(3, 4), (0, 1), (1, 2), (39, 40)])
def test_split_sizes_empty_chunk_is_an_error(n, parts):
    with pytest.raises(ValueError, match=rf"n={n}.*parts={parts}"):
        split_sizes(n, parts)


@pytest.mark.parametrize("parts", [0, -1])
def test_split_sizes_parts_must_be_positive(parts):
    with pytest.raises(ValueError, match=rf"parts={parts}"):
        split_sizes(10, parts)


def test_split_sizes_rejects_non_integers():
    with pytest.raises(TypeError, match="n must be an integer"):
        split_sizes(10.0, 2)
    with pytest.raises(TypeError, match="parts must be an integer"):
        split_sizes(10, "2")


def test_chunk_slice_index_out_of_range():
    with pytest.raises(ValueError, match="index 4 out of range for 4 parts"):
        chunk_slice(10, 4, 4)


def test_offsets_of():
    assert offsets_of([3, 0, 2]) == [0, 3, 3]
    assert offsets_of([]) == []


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_split_along_views_every_axis(axis):
    x = numpy.arange(7 * 5 * 6).reshape(7, 5, 6)
    for parts in range(1, x.shape[axis] + 1):
        chunks = split_along(x, axis, parts)
        assert [c.shape[axis] for c in chunks] == split_sizes(x.shape[axis], parts)
        assert all(numpy.shares_memory(c, x) for c in chunks)
        numpy.testing.assert_array_equal(numpy.concatenate(chunks, axis=axis), x)


def test_split_along_errors():
    x = numpy.zeros((3, 4))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        split_along(x, 2, 2)
    with pytest.raises(ValueError, match="n=3.*parts=4"):
        split_along(x, 0, 4)


def test_normalize_axis():
    assert normalize_axis(-1, 3) == 2
    with pytest.raises(ValueError, match="axis -4 is out of range for an array of 3 dimensions"):
        normalize_axis(-4, 3)


LEAD_SHAPES = [(), (1,), (2,), (5,), (2, 3), (1, 1, 1), (0,), (4, 0)]


@pytest.mark.parametrize("lead", LEAD_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64, numpy.complex64, numpy.complex128])
@pytest.mark.parametrize("trailing", [1, 2, 3])
def test_flatten_unflatten_round_trip(lead, dtype, trailing):
    rng = numpy.random.default_rng(1)
    tail = (3, 4, 2)[:trailing]
    x = rng.standard_normal(lead + tail)
    if numpy.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(lead + tail)
    x = x.astype(dtype)
    m = int(numpy.prod(lead))
    for min_size in range(0, 8):
        flat, lead_shape, lead_size = flatten_leading(x, min_size, trailing)
        assert lead_shape == lead and lead_size == m
        assert flat.shape == (max(m, min_size),) + tail
        assert flat.dtype == x.dtype
        numpy.testing.assert_array_equal(flat[:m].reshape(x.shape), x)
        assert not flat[m:].any()  # padding is zeros
        if m >= min_size and m > 0:
            assert numpy.shares_memory(flat, x)  # no copy when no padding is needed
        back = unflatten_leading(flat, lead_shape, lead_size, trailing)
        assert back.shape == x.shape and back.dtype == x.dtype
        numpy.testing.assert_array_equal(back, x)


def test_unflatten_after_trailing_shape_change():
    x = numpy.ones((2, 3, 5, 6))
    flat, lead_shape, lead_size = flatten_leading(x, 8)
    y = numpy.ones((8, 4, 4))  # e.g. (nlat, nlon) -> (lmax, mmax)
    assert unflatten_leading(y, lead_shape, lead_size).shape == (2, 3, 4, 4)


def test_flatten_errors():
    with pytest.raises(ValueError, match="fewer than 3 trailing axes"):
        flatten_leading(numpy.ones((4, 4)), 1, 3)
    with pytest.raises(ValueError, match="fewer than lead_size=5"):
        unflatten_leading(numpy.ones((4, 2, 2)), (5,), 5)
    with pytest.raises(ValueError, match="expected 3 axes"):
        unflatten_leading(numpy.ones((4, 2)), (4,), 4)
