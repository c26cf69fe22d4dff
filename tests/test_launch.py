"""Launching: a world that is not what the launcher started (serial: each test runs its own process)."""

import os
import subprocess
import sys


def test_a_world_that_is_not_what_the_launcher_started_is_an_error():
    """srun with the wrong PMI plugin: a 4-task job whose processes each see a world of one."""
    script = "from mpisphere import ProcessGrid\nProcessGrid()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "HYDRA", "MPI_LOCAL"))}
    env["SLURM_STEP_NUM_TASKS"] = "4"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "RuntimeError: ProcessGrid: srun started 4 processes (SLURM_STEP_NUM_TASKS=4) but MPI.COMM_WORLD has 1 " \
           "rank" in done.stderr
    assert "srun --mpi=pmi2 for the pip MPICH" in done.stderr and "--mpi=pmix for Open MPI" in done.stderr
    env["MPISPHERE_IGNORE_LAUNCHER"] = "1"
    assert subprocess.run([sys.executable, "-c", script], env=env, timeout=120).returncode == 0


def test_world_mismatch_reads_every_launcher():
    from mpisphere.launch import world_mismatch
    assert world_mismatch(1, {}) is None
    assert world_mismatch(4, {"PMI_SIZE": "4"}) is None
    assert "OMPI_COMM_WORLD_SIZE=2" in world_mismatch(1, {"OMPI_COMM_WORLD_SIZE": "2"})
    assert "PMI_SIZE=3" in world_mismatch(1, {"PMI_SIZE": "3"})
    assert world_mismatch(1, {"PMI_SIZE": "1"}) is None
    # torchrun starts no MPI world: every process is a world of one
    message = world_mismatch(1, {"WORLD_SIZE": "4", "LOCAL_RANK": "2"})
    assert message.startswith("torchrun (or another torch.distributed launcher) started 4 processes (WORLD_SIZE=4) "
                              "but MPI.COMM_WORLD has 1 rank"), message
    assert "launch with mpiexec -n 4 python script.py (srun under Slurm) instead" in message, message
    assert world_mismatch(4, {"WORLD_SIZE": "4"}) is None
