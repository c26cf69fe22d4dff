"""Is this process's MPI world the one the launcher started?

``srun`` with a PMI plugin that the MPI library does not speak (Debian's
default ``--mpi=none``, or ``pmix`` for the pip MPICH) starts every process
as a world of its own: a 4-task job becomes four 1-rank jobs that each
compute the whole problem and exit 0. The launcher's environment still says
how many tasks it started, so the mismatch can be seen.
"""

import os

__all__ = ["LAUNCHER_VARIABLES", "world_mismatch"]

# variable -> launcher that sets it to the number of processes it started
LAUNCHER_VARIABLES = (
    ("SLURM_STEP_NUM_TASKS", "srun"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_SIZE", "a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)"),
    ("PMIX_SIZE", "a PMIx launcher"),
    ("WORLD_SIZE", "torchrun (or another torch.distributed launcher)"),  # last: MPI launchers may set it too
)

IGNORE_VARIABLE = "MPISPHERE_IGNORE_LAUNCHER"


def world_mismatch(world_size, environ=None):
    """A message explaining the mismatch, or ``None`` when the world is what was launched.

    Parameters
    ----------
    world_size : int
        ``MPI.COMM_WORLD.Get_size()``.
    environ : mapping, optional
        Default ``os.environ``.
    """
    environ = os.environ if environ is None else environ
    if world_size != 1 or environ.get(IGNORE_VARIABLE, "").strip() in ("1", "yes", "true"):
        return None
    for variable, launcher in LAUNCHER_VARIABLES:
        try:
            started = int(environ.get(variable, "1"))
        except ValueError:
            continue
        if started > 1:
            srun = variable.startswith("SLURM")
            if srun:
                fix = ("choose the PMI plugin your MPI speaks: srun --mpi=pmi2 for the pip MPICH "
                       "(the mpich extra), srun --mpi=pmix for Open MPI (srun --mpi=list shows what Slurm offers; "
                       "SLURM_MPI_TYPE sets the default), or launch with the MPI library's own mpiexec")
            elif variable == "WORLD_SIZE":
                fix = (f"torchrun starts processes without an MPI world: launch with mpiexec -n {started} python "
                       "script.py (srun under Slurm) instead; PyTorch's own torch.distributed (NCCL, DDP) can then "
                       "be set up from the MPI ranks (docs/porting.md)")
            else:
                fix = ("launch with the mpiexec of the MPI library mpi4py loaded (python -m mpisphere diagnose "
                       "names it)")
            return (f"{launcher} started {started} processes ({variable}={started}) but MPI.COMM_WORLD has 1 "
                    f"rank: every process is running alone, as its own MPI job. {fix[0].upper()}{fix[1:]}. "
                    f"Set {IGNORE_VARIABLE}=1 if the processes are meant to run alone.")
    return None
