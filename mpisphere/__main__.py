"""``python -m mpisphere diagnose`` / ``calibrate``: what MPI and GPU path, and this machine's Legendre rates.

``diagnose`` prints the MPI library mpi4py loaded, the CUDA-aware decision and where it
came from, and, when a GPU is visible and the decision is "CUDA-aware", tries
one device-buffer ``Sendrecv`` in a child process: a library that wrongly
claims CUDA support usually crashes on device pointers, and it is better that
the child crashes here than a user's job later. Run it on one rank, on the
kind of node the job will use (``srun -n 1 python -m mpisphere diagnose``).

``calibrate`` measures the rates ``legendre="auto"`` chooses each
batch's Legendre strategy by (``mpisphere.sht.strategies.MachineModel``)
and prints them, or writes them with ``--out FILE`` for
``MPISPHERE_MACHINE_MODEL=FILE``. Run it on one core of a compute node, as
the transforms run there (``OMP_NUM_THREADS=1 srun -n 1 python -m mpisphere
calibrate --out machine.json``).
"""

import argparse
import subprocess
import sys

_DEVICE_PROBE = r"""
import cupy
from mpi4py import MPI
comm = MPI.COMM_SELF
send = cupy.arange(1024, dtype=cupy.float64)
recv = cupy.zeros_like(send)
cupy.cuda.get_current_stream().synchronize()
comm.Sendrecv([send, MPI.DOUBLE], 0, 7, [recv, MPI.DOUBLE], 0, 7)
assert bool((recv == send).all()), "received data differs"
print("ok")
"""


def _device_probe(timeout):
    try:
        done = subprocess.run([sys.executable, "-c", _DEVICE_PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"the probe hung for {timeout} s"
    if done.returncode == 0 and done.stdout.strip().endswith("ok"):
        return True, "a device-buffer Sendrecv worked"
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return False, f"the probe failed (exit {done.returncode}): " + " | ".join(tail)


def diagnose(out=sys.stdout, probe_timeout=120):
    """Print the report; returns the process exit status (0 when nothing is wrong)."""
    import numpy
    import mpi4py
    from mpi4py import MPI

    from . import __version__, backend, cuda_aware
    from .launch import world_mismatch
    from .settings import config

    status = 0
    write = out.write
    write(f"mpisphere {__version__}, mpi4py {mpi4py.__version__}, numpy {numpy.__version__}, "
          f"Python {sys.version.split()[0]}\n")
    write(f"MPI library: {cuda_aware.mpi_library_path() or 'unknown'}\n")
    version = MPI.Get_library_version().replace("\x00", "")  # Open MPI ends it with a NUL: grep calls logs binary
    write(f"MPI version: {version.splitlines()[0].strip()} "
          f"(standard {'.'.join(map(str, MPI.Get_version()))})\n")
    write(f"ranks in COMM_WORLD: {MPI.COMM_WORLD.Get_size()}\n")
    mismatch = world_mismatch(MPI.COMM_WORLD.Get_size())
    if mismatch:
        write(f"  -> {mismatch}\n")
        status = 1
    try:
        import cupy
        devices = backend.visible_device_count()
        write(f"CuPy {cupy.__version__}: {devices} visible CUDA device(s)\n")
    except ImportError:
        devices = 0
        write("CuPy: not installed (host arrays only)\n")
    aware, source = cuda_aware.decide(MPI.COMM_WORLD)
    write(f"CUDA-aware MPI: {'yes' if aware else 'no'} -- {source}\n")
    path = cuda_aware.describe_path(aware, source, config.force_staging)
    if devices:
        write(f"path for device buffers: {path}\n")
    else:  # no GPU here: what a GPU node with this MPI would do, said as such
        write(f"device buffers: none on this machine (no GPU visible); with this MPI library on a GPU node: "
              f"{path}\n")
    write(f"config: {config!r}\n")
    if devices and aware:
        ok, what = _device_probe(probe_timeout)
        write(f"device-buffer probe: {what}\n")
        if not ok:
            write("  -> this MPI library does not handle device buffers: set MPISPHERE_CUDA_AWARE=0 to stage "
                  "through host memory, or fix the MPI installation\n")
            status = 1
    elif devices:
        write("device-buffer probe: skipped (staging through host memory is used, which always works)\n")
    else:
        write("device-buffer probe: skipped (no GPU)\n")
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mpisphere",
                                     description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("diagnose", help="report the MPI library and the GPU buffer path")
    cmd.add_argument("--probe-timeout", type=float, default=120, help="seconds for the device-buffer probe")
    cmd = sub.add_parser("calibrate", help="measure this machine's Legendre rates (for legendre='auto')")
    cmd.add_argument("--out", default=None, help="write them as JSON here (for MPISPHERE_MACHINE_MODEL)")
    cmd.add_argument("--repeats", type=int, default=5, help="timed runs of each kernel (the median is kept)")
    args = parser.parse_args(argv)
    if args.command == "diagnose":
        return diagnose(probe_timeout=args.probe_timeout)
    if args.command == "calibrate":
        return calibrate(args.out, args.repeats)
    return 2


def calibrate(path=None, repeats=5, out=sys.stdout):
    """Measure and print (or write) this machine's ``mpisphere.sht.strategies.MachineModel``."""
    from .sht.calibration import calibrate as measure
    from .sht.strategies import MachineModel
    from .sht.strategies.machine import MODEL_VARIABLE

    model = measure(repeats=repeats)
    defaults = MachineModel()
    out.write(f"{model.describe()}\n(defaults: {defaults.describe()})\n")
    if path:
        with open(path, "w") as f:
            f.write(model.as_json() + "\n")
        out.write(f"written to {path}: export {MODEL_VARIABLE}={path} on every rank\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
