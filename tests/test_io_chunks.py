"""The chunk plan of mpisphere.io, in one process: every owner's chunks assembled from every rank's part.

The all-to-all is simulated by slicing each rank's send buffer by the
counts, so the test checks the offsets both sides compute on their own
against the global array (the serial reference), for uneven splits and
order sets that are not ranges.
"""

import math

import numpy
import pytest

from mpisphere.io.chunks import TARGET_CHUNK_BYTES, ChunkPlan, Parts, band_rows
from mpisphere.sht.orders import order_assignment


def _exchange(send_buffers, send_counts):
    """What each rank receives: rank r's buffer cut by its counts, concatenated in rank order."""
    size = len(send_buffers)
    pieces = [numpy.split(buf, numpy.cumsum(counts)[:-1]) for buf, counts in zip(send_buffers, send_counts)]
    return [numpy.concatenate([pieces[r][o] for r in range(size)]) for o in range(size)]


def _cases():
    yield "tiles 2x3 uneven", Parts.of_grid(2, 3, 11, 13), (2, 3), 3
    yield "tiles 3x1", Parts.of_grid(3, 1, 7, 5), (), 2
    yield "tiles 1x4 one band", Parts.of_grid(1, 4, 5, 9), (3,), 5
    yield "orders balanced 2x3", Parts.of_grid(2, 3, 12, 12, order_assignment(12, 12, 3, "balanced")), (2,), 4
    yield "more ranks than chunks", Parts.of_grid(2, 3, 4, 7), (), 4


@pytest.mark.parametrize("name, parts, lead, rows", list(_cases()), ids=[c[0] for c in _cases()])
def test_owners_assemble_the_global_chunks_and_parts_come_back(name, parts, lead, rows):
    rng = numpy.random.default_rng(3)
    whole = rng.standard_normal(lead + (parts.n0, parts.n1))
    flat = whole.reshape((math.prod(lead), parts.n0, parts.n1))
    plan = ChunkPlan(parts, lead, rows)
    size = parts.size
    assert sum(plan.counts) == plan.nchunks == math.prod(lead) * math.ceil(parts.n0 / rows)
    local = [numpy.ascontiguousarray(flat[:, parts.rows[r]][:, :, parts.cols[r]]) for r in range(size)]

    send_counts = [plan.counts_to_owners(r) for r in range(size)]
    sends = [numpy.empty(sum(c)) for c in send_counts]
    for r in range(size):
        assert plan.pack_parts(r, local[r], sends[r]) == sends[r].size
    received = _exchange(sends, send_counts)
    covered = numpy.zeros(flat.shape, int)
    for o in range(size):
        assert [send_counts[r][o] for r in range(size)] == plan.counts_from_parts(o)
        assert plan.counts_from_parts(o)[o] == 0  # a rank's own pieces skip the exchange
        regions = [numpy.full(plan.region_shape(g), numpy.nan) for g in plan.regions(o)]
        plan.copy_own(o, local[o], regions)
        plan.unpack_regions(o, received[o], regions)
        for region, data in zip(plan.regions(o), regions):
            selection = plan.selection(region)
            b = numpy.ravel_multi_index(selection[:-2], lead) if lead else 0
            numpy.testing.assert_array_equal(data, flat[b][selection[-2:]])
            covered[b][selection[-2:]] += 1
    assert (covered == 1).all(), "every element stored by exactly one owner"

    # reading: the owners cut their regions, every rank gets its part back
    regions_of = {o: [flat[numpy.ravel_multi_index(plan.selection(g)[:-2], lead) if lead else 0]
                      [plan.selection(g)[-2:]] for g in plan.regions(o)] for o in range(size)}
    back_counts = [plan.counts_from_parts(o) for o in range(size)]
    back_sends = [numpy.empty(sum(c)) for c in back_counts]
    for o in range(size):
        plan.pack_regions(o, regions_of[o], back_sends[o])
    back = _exchange(back_sends, back_counts)
    for r in range(size):
        part = numpy.full_like(local[r], numpy.nan)
        plan.copy_own(r, part, regions_of[r], to_regions=False)
        plan.unpack_parts(r, back[r], part)
        numpy.testing.assert_array_equal(part, local[r])


def test_an_append_writes_after_the_existing_leading_entries():
    plan = ChunkPlan(Parts.of_grid(1, 2, 4, 6), (2, 3), 2, lead_offset=5)
    selections = [plan.selection(g) for o in range(2) for g in plan.regions(o)]
    assert sorted({s[0] for s in selections}) == [5, 6]


@pytest.mark.parametrize("n0, n1, itemsize, lead, ranks", [
    (721, 1440, 8, 32, 4), (721, 1440, 8, 1, 6), (17, 30, 8, 1, 6), (3, 5, 4, 1, 6), (4001, 8000, 8, 1, 2)])
def test_bands_are_near_the_target_and_many_enough(n0, n1, itemsize, lead, ranks):
    rows = band_rows(n0, n1, itemsize, lead, ranks)
    assert 1 <= rows <= n0
    bands = math.ceil(n0 / rows)
    assert rows == 1 or rows * n1 * itemsize <= TARGET_CHUNK_BYTES
    assert lead * bands >= min(ranks, lead * n0)
