"""A fixed number of operations per transform, whatever nlat, lmax and the batch: per-latitude loops caught on a CPU.

A GPU runs a transform as fast as its launches allow: a Python loop over
latitudes, degrees or orders that issues work per iteration makes the
launches grow with the grid (the reduce-scatter strategy once issued one
product per order: 361 launches a call at 721 latitudes). Under
``config.device_kernels`` NumPy arrays take the device code paths, so this
machine can count what a call issues: every line of mpisphere executed and
every call from mpisphere into a compiled function (NumPy's, ducc0's: what
becomes a kernel launch on a device), leaving out the agreement's polling
while the other ranks arrive (a wait, not work). Both must be the same at nlat 65 and
129 and at two batch sizes, for every strategy that runs on a device, every
transform and both directions, on grids of 1 and 4 ranks (also 2 under --mpi-full). (Smaller grids
split over more ranks leave some blocks empty or contiguous, which takes
other branches: a few lines more or less, not a loop.) A planted per-latitude loop fails the test
(the last test here).

The table-free strategy runs on the host only and calls ducc0 once per field
(ducc0 has no batch axis): its count must not depend on nlat or lmax, and
grows by the same amount per field.
"""

import gc
import sys
from pathlib import Path

import numpy
import pytest

from mpisphere import (DistributedInverseRealSHT, DistributedInverseRealVectorSHT, DistributedRealSHT,
                       DistributedRealVectorSHT, config)
from mpisphere.operators import ADJOINT, FORWARD
from mpisphere.sht.strategies import STRATEGIES

from helpers import random_array, rank_rng

# counted at 1 and 4 ranks (few_ranks): the 4-rank launch (2x2, both axes split) is not in the default matrix
pytestmark = [pytest.mark.mpi, pytest.mark.also_at(4)]

PACKAGE = str(Path(__file__).resolve().parent.parent / "mpisphere")
TRANSFORMS = [DistributedRealSHT, DistributedInverseRealSHT, DistributedRealVectorSHT, DistributedInverseRealVectorSHT]
DEVICE = [s.name for s in STRATEGIES if s.runs_on_device]
WAITING = str(Path(PACKAGE) / "agreement" / "stall.py")  # the agreement's polling while other ranks arrive


def operations(call, roots=(PACKAGE,), waits=()):
    """``(lines, compiled calls)`` that the code under ``roots`` (mpisphere's own) executes during ``call()``.

    Left out: the agreement's polling, and the functions named in ``waits``
    (``(file, function)``: other waits for other ranks).
    """
    counts = {"lines": 0, "calls": 0}

    def lines(frame, event, arg):
        if event == "line":
            counts["lines"] += 1
        return lines

    def counted(frame):
        """Code of ``roots``, but not inside a wait for other ranks (its polls depend on timing, not the sizes)."""
        if not frame.f_code.co_filename.startswith(roots):
            return False
        while frame is not None:
            if frame.f_code.co_filename == WAITING or (frame.f_code.co_filename, frame.f_code.co_name) in waits:
                return False
            frame = frame.f_back
        return True

    def frames(frame, event, arg):
        return lines if counted(frame) else None

    def compiled(frame, event, arg):
        if event == "c_call" and counted(frame):
            counts["calls"] += 1

    gc.collect()
    gc.disable()  # a collection during the call would run finalizers (and count their lines) at random
    sys.settrace(frames)
    sys.setprofile(compiled)
    try:
        call()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
        gc.enable()
    return counts["lines"], counts["calls"]


def counted(grid, cls, strategy, nlat, batch, direction, roots=(PACKAGE,)):
    op = cls(grid, nlat, 2 * nlat - 2, legendre=strategy, fft="numpy")
    synthesis = cls._synthesis
    domain_dtype = op.cdtype if synthesis else op.dtype
    x = random_array(rank_rng(grid.cart), op.domain_shape((batch,)), domain_dtype)
    if direction == ADJOINT:
        x = random_array(rank_rng(grid.cart), op.range_shape((batch,)), op.dtype if synthesis else op.cdtype)
    run = op.forward if direction == FORWARD else op.adjoint
    run(x)  # the first call builds the pipeline and uploads the padded tables
    return operations(lambda: run(x), roots)


def everywhere(grid, found):
    """Every rank's ``found`` (a verdict on one rank would leave the others waiting in the next test)."""
    return grid.cart.allgather(found)


def few_ranks(grid, config):
    """Counted at 1 and 4 ranks (one rank; both axes split), and at 2 (each axis alone) under ``--mpi-full``: a loop
    over latitudes or orders shows on any grid, and tracing every line costs a minute of the suite at 3 and 6
    oversubscribed ranks (and half a minute at 2 ranks beside the serial tests)."""
    sizes = (1, 2, 4) if config.getoption("--mpi-full") else (1, 4)
    if grid.size not in sizes:
        pytest.skip(f"counted on grids of {', '.join(map(str, sizes))} ranks (--mpi-full: 1, 2 and 4)")


def batches(grid):
    """Two batch sizes that give every rank at least two fields (one field makes other layouts contiguous)."""
    return 2 * grid.size, 4 * grid.size


@pytest.mark.parametrize("strategy", DEVICE)
@pytest.mark.parametrize("cls", TRANSFORMS, ids=lambda c: c.__name__)
def test_device_kernels_issue_the_same_operations_at_every_size(grid, cls, strategy, request):
    few_ranks(grid, request.config)
    few, more = batches(grid)
    with config.override(device_kernels=True):
        for direction in (FORWARD, ADJOINT):
            small = counted(grid, cls, strategy, 65, few, direction)
            fine = counted(grid, cls, strategy, 129, few, direction)
            wide = counted(grid, cls, strategy, 65, more, direction)
            for rank, (s, f, w) in enumerate(everywhere(grid, (small, fine, wide))):
                assert s == f == w, (f"{cls.__name__} {strategy} {direction} on rank {rank}: (lines, compiled calls) "
                                     f"{s} at nlat 65, {f} at nlat 129, {w} with {more} fields")


@pytest.mark.parametrize("cls", TRANSFORMS, ids=lambda c: c.__name__)
def test_the_table_free_strategy_calls_ducc0_per_field_only(grid, cls, request):
    few_ranks(grid, request.config)
    few, _ = batches(grid)
    with config.override(device_kernels=True):  # the stages around it as on a device
        for direction in (FORWARD, ADJOINT):
            small = [counted(grid, cls, "table-free", 65, batch, direction) for batch in (few, 2 * few, 4 * few)]
            fine = counted(grid, cls, "table-free", 129, few, direction)
            for rank, (s, f) in enumerate(everywhere(grid, (small, fine))):
                assert s[0] == f, f"{cls.__name__} {direction} on rank {rank}: {s[0]} at nlat 65, {f} at nlat 129"
                for k in range(2):  # the same increase per field: from b to 2 b fields half that from 2 b to 4 b
                    assert 2 * (s[1][k] - s[0][k]) == s[2][k] - s[1][k], (cls.__name__, direction, rank, s)


def test_a_per_latitude_loop_is_caught(grid, monkeypatch):
    """The check itself: a kernel that loops over latitudes makes the counts differ."""
    from mpisphere.sht import contraction

    original = contraction._analyze_batched

    def looping(t, sym, anti, spectral):
        for k in range(sym.shape[0]):  # one operation per latitude, as a per-row kernel would launch
            sym[k] *= 1.0
        original(t, sym, anti, spectral)

    monkeypatch.setattr(contraction, "_analyze_batched", looping)
    roots = (PACKAGE, __file__)
    with config.override(device_kernels=True):
        small = counted(grid, DistributedRealSHT, "transpose", 65, 2 * grid.size, FORWARD, roots)
        fine = counted(grid, DistributedRealSHT, "transpose", 129, 2 * grid.size, FORWARD, roots)
    for rank, (s, f) in enumerate(everywhere(grid, (small, fine))):
        assert s != f and numpy.all(numpy.array(f) >= numpy.array(s)), (rank, s, f)


HALO = str(Path(PACKAGE) / "halo")
# the halo's own code but its neighbour round (halo/round.py), which polls for as long as the messages take
HALO_OWN = tuple(str(path) for path in sorted(Path(HALO).glob("*.py")) if path.name != "round.py")
# waits for the neighbours' reads, and a planned call's receives (it polls for as long as the messages take)
HALO_WAITS = {(str(Path(HALO) / "shared.py"), "await_acknowledgements"), (str(Path(HALO) / "planned.py"), "_arrive")}


@pytest.mark.parametrize("shared", [False, True], ids=["messages", "shared"])
def test_a_halo_call_issues_the_same_operations_at_every_size(grid, shared, request):
    """One copy (or sum) per block whatever the tile and the batch: no loop over rows or fields on either path.

    On a device each copy is one kernel (a CuPy slice assignment); counted here on the host path, whose copies
    go by runs (one NumPy call per block too). Only the halo's own code is counted, not its neighbour round
    (``halo/round.py``, which polls for as long as the messages take).
    """
    few_ranks(grid, request.config)
    from mpisphere import HaloExchange
    found = []
    for nlat, batch in ((33, 2), (65, 2), (33, 6)):
        halo = HaloExchange(grid, 2, 2, extents=(nlat, 2 * nlat))
        padded = halo.zeros(batch) if shared else numpy.zeros((batch,) + halo.zeros(batch).shape[1:])
        padded[...] = rank_rng(grid.cart).standard_normal(padded.shape)
        halo.update(padded)
        halo.accumulate(padded)  # plans and copies made
        found.append((operations(lambda: halo.update(padded), HALO_OWN, HALO_WAITS),
                      operations(lambda: halo.accumulate(padded), HALO_OWN, HALO_WAITS)))
    for rank, counts in enumerate(everywhere(grid, found)):
        assert counts[0] == counts[1] == counts[2], f"rank {rank}: (update, accumulate) counts {counts}"


DISCO = str(Path(PACKAGE) / "disco")


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transpose"])
def test_a_disco_convolution_issues_the_same_operations_at_every_size(grid, transposed, request):
    """Forward, adjoint and gradients: a loop over basis functions and band offsets only (3 rows at the default
    cutoff at every resolution), none over rows, channels or fields. Only the convolution's own code is counted
    (the halo, transposes and FFT stages are counted by their own tests; their rounds poll while messages travel).
    """
    few_ranks(grid, request.config)
    from mpisphere import DiscoConvS2, DiscoConvTransposeS2
    found = []
    with config.override(device_kernels=True):
        for nlat, batch, channels in ((17, 2, 2), (33, 2, 2), (17, 4, 3)):
            shape = (nlat, 2 * nlat - 2)
            weight = numpy.random.default_rng(3).standard_normal((channels, channels, 2))
            cls = DiscoConvTransposeS2 if transposed else DiscoConvS2
            op = cls(grid, shape, shape, (3,), weight, fft="numpy")
            x = rank_rng(grid.cart).standard_normal(op.domain_shape((batch,)))
            y = rank_rng(grid.cart).standard_normal(op.range_shape((batch,)))
            op.forward(x), op.adjoint(y), op.gradients(x, y)   # pipelines and tables made
            found.append((operations(lambda: op.forward(x), (DISCO,)), operations(lambda: op.adjoint(y), (DISCO,)),
                          operations(lambda: op.gradients(x, y), (DISCO,))))
    for rank, counts in enumerate(everywhere(grid, found)):
        assert counts[0] == counts[1] == counts[2], f"rank {rank}: (forward, adjoint, gradients) counts {counts}"


ATTENTION = str(Path(PACKAGE) / "attention")


def test_neighbourhood_attention_issues_the_same_operations_for_any_batch_and_channels(grid, request):
    """Forward and gradients: the operations do not grow with the batch or the channels. They do grow with the
    output rows (a few calls per row and arc: docs/benchmarks.md, "Attention on the sphere"), which a GPU kernel
    for all rows at once would remove; that is not built."""
    few_ranks(grid, request.config)
    from mpisphere import NeighborhoodAttentionS2
    found = []
    with config.override(device_kernels=True):
        for batch, channels in ((1, 2), (3, 4)):
            op = NeighborhoodAttentionS2(grid, channels, (17, 32), (17, 32))
            rng = numpy.random.default_rng(5)
            op.set_parameters(**{n: rng.standard_normal((channels, channels))
                                 for n in ("q_weights", "k_weights", "v_weights", "proj_weights")})
            x = rank_rng(grid.cart).standard_normal((batch, channels) + op.tile_out)
            op.forward(x), op.gradients(x, x)
            found.append((operations(lambda: op.forward(x), (ATTENTION,)),
                          operations(lambda: op.gradients(x, x), (ATTENTION,))))
    for rank, counts in enumerate(everywhere(grid, found)):
        assert counts[0] == counts[1], f"rank {rank}: (forward, gradients) counts {counts}"
