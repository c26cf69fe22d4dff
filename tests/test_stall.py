"""A rank that never arrives: the others report who waits where and who is missing, then abort at the deadline.

Serial tests: each launches a small program under ``mpiexec`` (with a
timeout of its own) whose ranks do not all make the same call, with a
report after 1 s and a deadline of 4 s, and reads what the ranks printed.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from mpisphere.testing import mpiexec_command

# a planned halo call on a column of ranks, replayed at its third call, where the last rank makes a mistake instead
PLANNED = """
        grid = ProcessGrid(MPI.COMM_WORLD, MPI.COMM_WORLD.size, 1)
        halo = HaloExchange(grid, 1, 1, extents=(12, 4))
        padded = numpy.zeros((grid.local_shape(12, 4)[0] + 2, 6))
        halo.update(padded)
        halo.update(padded)
        if grid.rank == grid.size - 1:
            {mistake}
        halo.update(padded)
        """

PROGRAMS = {
    # an operator built and called on some ranks only
    "called_on_some_ranks": """
        grid = ProcessGrid(MPI.COMM_WORLD)
        if grid.rank != grid.size - 1:
            ReduceFrom(grid.cart).forward(numpy.ones(3))
        """,
    # a rank that leaves early (it returns and finalises MPI) while the others call
    "rank_exits_early": """
        if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
            sys.exit(0)
        ReduceFrom(MPI.COMM_WORLD).forward(numpy.ones(3))
        """,
    # the last rank ends its program with the grid in use while the others transform
    "exits_with_the_grid_in_use": """
        grid = ProcessGrid(MPI.COMM_WORLD)
        if grid.rank == grid.size - 1:
            sys.exit(0)
        ReduceFrom(grid.cart).forward(numpy.ones(3))
        """,
    # a halo exchange whose last rank never calls it
    "halo_neighbour_missing": """
        grid = ProcessGrid(MPI.COMM_WORLD, MPI.COMM_WORLD.size, 1)
        halo = HaloExchange(grid, 1, 0, extents=(12, 4))
        if grid.rank != grid.size - 1:
            halo.forward(numpy.ones(grid.local_shape(12, 4)))
        """,
    # a planned halo call (replayed at the third call) whose last rank has ended its program with the grid in use
    "replay_neighbour_ended": PLANNED.format(mistake="sys.exit(0)"),
    # the last rank frees the grid while the others replay a planned halo call (each rank leaves the grid's block
    # with the exception it raised: the with statement frees the grid on every rank)
    "free_while_the_others_replay": """
        with ProcessGrid(MPI.COMM_WORLD, MPI.COMM_WORLD.size, 1) as grid:
            halo = HaloExchange(grid, 1, 1, extents=(12, 4))
            padded = numpy.zeros((grid.local_shape(12, 4)[0] + 2, 6))
            halo.update(padded)
            halo.update(padded)
            if grid.rank == grid.size - 1:
                grid.free()
            halo.update(padded)
        """,
    # a drop-in layer (a torch module) called on some ranks only: the waiting line is the user's, not torch's
    "dropin_called_on_some_ranks": """
        import torch
        import mpisphere.torch_harmonics as thd
        grid = ProcessGrid(MPI.COMM_WORLD, 1, MPI.COMM_WORLD.size)
        conv = thd.DistributedDiscreteContinuousConvS2(1, 1, (8, 16), (8, 16), (3,), process_grid=grid)
        if grid.rank != grid.size - 1:
            conv(torch.zeros(1, 1, *grid.local_shape(8, 16)))
        """,
    # two stalls in a row on one grid, the late rank changing: the last rank, then rank 0
    "late_rank_changes": """
        grid = ProcessGrid(MPI.COMM_WORLD)
        op = ReduceFrom(grid.cart)
        if grid.rank == grid.size - 1:
            time.sleep(1.5)
        op.forward(numpy.ones(3))
        if grid.rank == 0:
            time.sleep(1.5)
        op.forward(numpy.ones(3))
        grid.free()
        """,
}

HEADER = """
import sys
import time
import numpy
from mpi4py import MPI
from mpisphere import GatherFrom, HaloExchange, ProcessGrid, ReduceFrom
"""


def launch(name, ranks=3, report="0.5", deadline="2.5"):
    command = mpiexec_command() + ["-n", str(ranks), sys.executable, "-c",
                                   HEADER + textwrap.dedent(PROGRAMS[name])]
    env = dict(os.environ, MPISPHERE_STALL_REPORT=report, MPISPHERE_STALL_DEADLINE=deadline, OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name}: no report and no abort within 60 s:\n{exc.stderr}")
    return done.returncode, done.stdout + done.stderr


def test_a_call_made_on_some_ranks_only_is_reported_and_aborted():
    code, output = launch("called_on_some_ranks")
    assert code != 0, output
    for rank in (0, 1):
        assert f"mpisphere: rank {rank} of 3 has waited" in output, output
    assert "in ReduceFrom.forward's agreement over grid.cart (3 ranks)" in output, output
    # rank 2 went on to the end of its program, with the grid in use: named so once its note has come
    assert "waiting in it too: ranks 0, 1" in output and ("not arrived: rank 2" in output or "ended its program "
                                                          "(exited with the grid in use, without this call): rank 2"
                                                          in output), output
    assert "aborts the job now (MPISPHERE_STALL_DEADLINE)" in output, output
    # where each waiting rank made the call (the program is given with -c: '<string>', after its header)
    assert f"called at <string>:{4 + len(HEADER.splitlines())}" in output, output


def test_a_rank_that_exits_early_is_named():
    code, output = launch("rank_exits_early")
    assert code != 0, output
    assert "not arrived: rank 2" in output and "likely causes: a rank raised outside mpisphere" in output, output


def test_a_halo_neighbour_that_never_sends_is_named():
    code, output = launch("halo_neighbour_missing")
    assert code != 0, output
    assert "rank 1 of 3 has waited" in output and "in HaloExchange.forward for its neighbours" in output, output
    assert "not arrived: the messages of rank 2" in output, output


def test_no_report_before_its_time():
    """The same mistake with the report at 60 s and the deadline at 2.5 s: the abort comes without a report first."""
    code, output = launch("called_on_some_ranks", report="60", deadline="2.5")
    waited = [line for line in output.splitlines() if "has waited" in line]
    # the first rank at its deadline aborts the job: the other may not get to print
    assert code != 0 and waited and all("aborts the job now" in line for line in waited), output


def test_the_report_names_the_call_site_and_a_rank_that_ended_its_program():
    code, output = launch("exits_with_the_grid_in_use")
    assert code != 0, output
    # the user's line that waits (the program is given with -c: '<string>', line 5 of the program with its header)
    site = 5 + len(HEADER.splitlines())
    assert f"in ReduceFrom.forward's agreement over grid.cart (3 ranks), called at <string>:{site}." in output, output
    assert "ended its program (exited with the grid in use, without this call): rank 2" in output, output
    assert "not arrived" not in output.split("aborts the job now")[0], output


def reports_of(output, rank):
    """The stall reports rank ``rank`` printed, each as one text."""
    head = f"mpisphere: rank {rank} of "
    return [head + block.split("likely causes")[0] for block in output.split(head)[1:]]


@pytest.mark.parametrize("ranks", [3, 4])
def test_a_second_report_is_about_the_second_wait_only(ranks):
    """Notes left over from the first stall (read by nobody: the late rank did not wait) do not count as
    waiting ranks in the second: the late rank of the second call is named as not arrived. At 4 ranks too, where
    two ranks wait in both calls (each must list the others waiting in the same call, not in another)."""
    code, output = launch("late_rank_changes", ranks=ranks, report="0.5", deadline="30")
    assert code == 0, output
    last = ranks - 1
    waiting = "ranks 1, 2" if ranks == 3 else "ranks 1-3"
    reports = reports_of(output, last)   # late in the first call, waiting in the second
    assert len(reports) == 1 and f"waiting in it too: {waiting}" in reports[0] \
        and "not arrived: rank 0" in reports[0] and "waits in another call" not in reports[0], output
    for middle in range(1, last):  # wait in both
        reports = reports_of(output, middle)
        assert len(reports) == 2 and f"not arrived: rank {last}" in reports[0] and "not arrived: rank 0" in \
            reports[1], output
        assert f"waiting in it too: {'ranks 0-2' if ranks == 4 else 'ranks 0, 1'}" in reports[0], output
        assert f"waiting in it too: {waiting}" in reports[1], output
        assert not any("waits in another call" in report for report in reports), output


def test_a_replayed_halo_call_names_its_line_and_a_neighbour_that_ended_its_program():
    code, output = launch("replay_neighbour_ended", ranks=3)
    assert code != 0, output
    site = 9 + len(HEADER.splitlines())
    assert "rank 1 of 3 has waited" in output and f"in HaloExchange.update for its neighbours, called at " \
        f"<string>:{site}" in output, output
    assert "ended its program (exited with the grid in use, without this call): rank 2" in output, output


def test_a_rank_that_frees_the_grid_while_its_neighbour_replays_a_halo_call_raises_instead_of_waiting():
    """The last rank frees the grid while its neighbour replays a halo call (issue 56: they waited for each other
    until the deadline): the freeing rank answers the halo call, both raise at once naming the other's call and
    line, and no rank reports a stall."""
    code, output = launch("free_while_the_others_replay", ranks=2, report="2", deadline="6")
    assert code != 0, output
    assert "has waited" not in output and "aborts the job" not in output, output
    base = len(HEADER.splitlines())
    # each message is matched from its own text on: the two ranks' tracebacks share one stream, and Python writes
    # an exception's class and its message in separate writes, between which the other rank's lines may fall
    assert re.search(r"HaloExchange.update: rank 0 of 2 \(polar 0, azimuth 0\) cannot exchange its halo: "
                     r"south neighbour rank 1: is not making the same call .*rank 1: it is in ProcessGrid.free, "
                     rf"called at <string>:{8 + base}, not in a halo call", output), output
    assert re.search(r"ProcessGrid.free: rank 1 of 2: north neighbour rank 0 was in HaloExchange.update "
                     rf"on this grid \(halo call 3\) while this rank was in ProcessGrid.free, called at <string>:"
                     rf"{8 + base}: this rank answered that it is not in that call, and rank 0 raised there \(the grid "
                     r"is freed on every rank\)", output), output


def test_a_drop_in_layer_waiting_names_the_users_line_not_torchs():
    if os.environ.get("MPISPHERE_REQUIRE_TORCH") != "1":
        pytest.importorskip("torch")
    code, output = launch("dropin_called_on_some_ranks", ranks=2)
    assert code != 0, output
    assert f"called at <string>:{7 + len(HEADER.splitlines())}." in output, output
    assert "torch/" not in output.split("has waited")[1].split("\n")[0], output
