"""A mistake on one rank raises on every rank, never a hang or a returned result (issue 11's table).

Each row of the table is a case in misuse_cases.py. The cases run under
``mpiexec`` at 2 and 4 ranks, debug mode off and on, one launch per
combination with a hard timeout. A row passes when every rank raised the
expected exception with a message matching the expected pattern; a rank that
returned, a rank stuck in the case (the launch's watchdog ends it) or a crash
fails the row.
"""

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mpisphere.testing import mpiexec_command

HERE = Path(__file__).parent
LAUNCH_TIMEOUT = 240

# case -> (exception type, pattern that every rank's message matches); {last} is the last rank
EXPECTED = {
    "chunk_width": ("ValueError", r"^GatherFrom.forward: rank {last} of {size}: expected 3 entries along axis -1"),
    "batch_gather_from": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree .* rank 1 has: .*"
                                        r"shape \(3, '\*'\)"),
    "batch_reduce_from": ("ValueError", r"^ReduceFrom.forward: the {size} ranks disagree .* rank 1 has: "
                                        r".*shape \(3, 4\)"),
    "batch_transpose": ("ValueError", r"^Transpose.forward: the {size} ranks disagree .* rank 1 has: .*shape \(3, "),
    "batch_halo": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its halo: .*"
                                 r"not making the same call"),
    "batch_sht": ("ValueError", r"^DistributedRealSHT.forward: the {size} ranks disagree .* rank 1 has: .*shape \(3, "),
    "dtype_gather_from": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree .* rank 1 has: .*float32"),
    "dtype_copy_to_adjoint": ("ValueError", r"^CopyTo.adjoint: the {size} ranks disagree .* rank 1 has: .*float32"),
    "out_shape": ("ValueError", r"^ReduceFrom.forward: rank 1 of {size}: out has shape \(2, 5\) float64, expected "
                                r"\(2, 4\) float64"),
    "out_dtype": ("ValueError", r"^ReduceFrom.forward: rank 1 of {size}: out has shape \(2, 4\) float32"),
    "out_read_only": ("ValueError", r"^ReduceFrom.forward: rank 1 of {size}: out is read-only"),
    "other_operator": ("ValueError", r"the {size} ranks disagree .* rank 1 has: GatherFromCopyTo\(.*\) adjoint"),
    "other_extent": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree .* rank 1 has: "
                                   r"GatherFrom\(grid.cart, axis=-1, extent=\d+\)"),
    "sht_lmax": ("ValueError", r"^DistributedRealSHT.forward: the {size} ranks disagree .* rank 1 has: "
                               r"DistributedRealSHT\(13 x 10, lmax=5"),
    "halo_wider_than_neighbour": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its halo"),
    "halo_tile_widths": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its halo: "
                                       r".*tiles of (widths|heights) \d+ and \d+ in one (column|row) of the grid"),
    "grid_dims": ("ValueError", r"^ProcessGrid: ranks asked for different grids: rank 0 npolar=1, .* rank 1 "
                                r"npolar={size}"),
    "grid_invalid_dims": ("ValueError", r"^rank 1: ProcessGrid: npolar must be positive, got npolar=0"),
    "debug_on_one_rank": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree .* rank 1 has: .*; debug$"),
    "two_threads_on_one_grid": ("RuntimeError", r"^ReduceFrom.forward: another thread is running an mpisphere "
                                                r"operation on the same grid .* grid.dup\(\)"),
}

SIZES = [2, 4]


@functools.lru_cache(maxsize=None)
def _launch(size, debug):
    """Run every case under ``mpiexec -n size``: ``({case: [record per rank]}, output)``."""
    launcher = mpiexec_command()
    if launcher is None:
        pytest.fail("no mpiexec found: install an MPI runtime (pip install 'mpisphere[mpich]')")
    folder = tempfile.mkdtemp(prefix="mpisphere-misuse-")
    cmd = [*launcher, "-n", str(size), sys.executable, str(HERE / "misuse_cases.py"), "--out", folder] + \
        (["--debug"] if debug else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=env,
                              start_new_session=True)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
    records = {}
    for path in sorted(Path(folder).glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records.setdefault(record["case"], []).append(record)
        path.unlink()
    os.rmdir(folder)
    return records, output


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", list(EXPECTED))
def test_mistake_on_one_rank_raises_on_every_rank(case, size, debug):
    records, output = _launch(size, debug)
    seen = records.get(case, [])
    if len(seen) != size:
        started = re.findall(r"START (\w+)", output)
        pytest.fail(f"{case}: {len(seen)} of {size} ranks finished the case (a hang or a crash; the launch was in "
                    f"{started[-1] if started else 'no case'} when it ended)\n--- output ---\n{output[-4000:]}")
    kind, pattern = EXPECTED[case]
    pattern = pattern.format(size=size, last=size - 1)
    for record in sorted(seen, key=lambda r: r["rank"]):
        assert record["outcome"] == "raised", f"{case}: rank {record['rank']} returned a result"
        assert record["type"] == kind, f"{case}: rank {record['rank']} raised {record['type']}: {record['message']}"
        assert re.search(pattern, record["message"]), \
            f"{case}: rank {record['rank']}'s message does not match {pattern!r}:\n{record['message']}"
