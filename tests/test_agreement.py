"""The agreement module on its own: descriptions from constructor arguments, construction agreement, the guard."""

import threading

import numpy
import pytest

from mpisphere import Described, agree_construction
from mpisphere.agreement import CallGuard, describe_value, description_of

from helpers import raises


class _Model(Described):
    _per_rank = ("block",)

    def __init__(self, grid_like, dt, points, block, *, radius=6.37e6, name="model"):
        self.dt = dt


def test_every_argument_is_described_defaults_included():
    text = description_of(_Model(None, 600.0, numpy.arange(3.0), numpy.zeros((2, 5))))
    assert text.startswith("_Model(grid_like=None, dt=600.0, points=array((3,), float64, ")
    assert "block=per-rank float64 array of 2 axes" in text
    assert text.endswith("radius=6370000.0, name='model')")


def test_numbers_by_value_arrays_by_their_bytes():
    assert describe_value(0.3) != describe_value(0.1 + 0.2)  # different numbers, named both
    assert describe_value(numpy.float64(0.5)) == describe_value(0.5)
    a = numpy.array([0.1, 0.2, 0.3])
    b = numpy.array([0.3, 0.1, 0.3])  # the old weighted-sum digest could not tell these apart
    assert describe_value(a) != describe_value(b)
    assert describe_value(a) == describe_value(a.copy())
    assert describe_value(a[::-1].copy()[::-1]) == describe_value(a)  # a strided view of the same values
    nan = numpy.array([0.1, numpy.nan])
    assert describe_value(nan) == describe_value(nan.copy())  # identical NaNs are the same points
    assert describe_value(list(range(20))) == describe_value(list(range(20)))
    assert describe_value(list(range(20))) != describe_value(list(range(1, 21)))


def test_dtypes_and_classes():
    assert describe_value(numpy.float64) == describe_value(float) == describe_value(numpy.dtype("float64"))
    assert describe_value(threading.Event) == "threading.Event"


def test_objects_without_a_value_repr_are_described_by_type_not_address():
    one, two = threading.Event(), threading.Event()
    assert describe_value(one) == describe_value(two) == "a Event"


@pytest.mark.mpi
def test_construction_on_one_rank_of_one(comm):
    if comm.Get_size() != 1:
        pytest.skip("serial")
    agree_construction(_Model(None, 1.0, numpy.zeros(2), numpy.zeros(1)), comm)


@pytest.mark.mpi(min_size=2)
def test_construction_names_the_odd_rank(comm):
    last = comm.Get_size() - 1
    model = _Model(None, 900.0 if comm.Get_rank() == last else 600.0, numpy.zeros(2), numpy.zeros(comm.Get_rank() + 1))
    first = "rank 0" if last == 1 else f"ranks 0-{last - 1}" if last > 2 else "ranks 0, 1"
    with raises(ValueError, match=rf"^_Model: the {comm.Get_size()} ranks built it from different arguments: dt: "
                                         rf"{first} 600\.0, rank {last} 900\.0\n  fix: build _Model with the same dt "
                                         rf"on every rank .*\n(.*\n)?  rank {last} has: _Model\(.*dt=900\.0"):
        agree_construction(model, comm)
    # per-rank arguments (of different shapes here) never make the ranks disagree
    agree_construction(_Model(None, 600.0, numpy.zeros(2), numpy.zeros(comm.Get_rank() + 1)), comm)


def test_the_guard_refuses_another_thread_and_runs_its_refusal_on_leaving():
    guard = CallGuard()
    ran = []
    assert guard.enter()
    assert guard.enter()  # the same thread again (a call inside a call)
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(guard.enter(lambda: ran.append("refusal"))))
    thread.start()
    thread.join()
    assert outcome == [False] and ran == []
    guard.leave()
    assert ran == []  # still held by the outer call
    guard.leave()
    assert ran == ["refusal"] and not guard.held
    assert guard.enter(lambda: ran.append("never"))
    guard.leave()
    assert ran == ["refusal"]


@pytest.mark.mpi
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_composition_with_a_part_on_a_sub_communicator_agrees_and_reports(grid, debug):
    """The agreement over the grid with a part on grid.polar: each rank's group is named in what is gathered.

    Debug mode gathers every part always; a finding on one rank gathers them too.
    """
    from mpisphere import DistributedInverseRealSHT, DistributedRealSHT, GatherFromCopyTo, config
    nlat, nlon = 13, 24
    sht = DistributedRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    isht = DistributedInverseRealSHT(grid, nlat, nlon, quadrature="legendre-gauss")
    filtered = GatherFromCopyTo(grid.polar, axis=-2, extent=nlat) @ isht @ sht
    x = numpy.ones((2,) + sht.tile_shape)
    with config.override(debug=debug):
        assert filtered.forward(x).shape == (2, nlat, sht.tile_shape[1])
        if grid.size == 1:
            return
        last = grid.size - 1
        bad = numpy.ones((3,) + sht.tile_shape) if grid.rank == last else x  # a batch of 3 on the last rank
        with raises(ValueError, match=rf"^(GatherFromCopyTo @ DistributedInverseRealSHT @ DistributedRealSHT)"
                                      rf"\.forward: the {grid.size} ranks disagree on what they are about to do: "):
            filtered.forward(bad)
