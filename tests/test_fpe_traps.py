"""Every constructor and transform runs clean with floating-point traps on, as in a Fortran debug build.

A host model built with ``-ffpe-trap=invalid,zero,overflow`` turns any
operation that makes an inf or NaN into SIGFPE, also inside NumPy. The
script below enables the same traps with ``feenableexcept`` (glibc, through
ctypes) and then builds and runs the transforms (all rules and norms, up to
the 361 x 720 tables whose high orders underflow near the poles), halo
exchanges across the poles, the shallow-water model and its adjoint, under
``mpiexec -n 2``; a trap kills the process with SIGFPE and fails the test.
"""

import ctypes.util
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from mpisphere.testing import mpiexec_command

# NumPy is imported before the traps go on: NumPy 2.2's own import trips them (numpy/_core/getlimits.py
# computes the float limits); 2.4 does not. What is tested is mpisphere, from its import on.
TRAPS = '''
import ctypes, ctypes.util
import numpy
libm = ctypes.CDLL(ctypes.util.find_library("m"))
FE_INVALID, FE_DIVBYZERO, FE_OVERFLOW = 0x01, 0x04, 0x08  # x86-64 glibc
assert libm.feenableexcept(FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW) != -1
assert libm.fegetexcept() & FE_INVALID
'''

SCRIPT = TRAPS + '''
import numpy
from mpi4py import MPI
import mpisphere as ms
from mpisphere.examples import ShallowWaterSolver

grid = ms.ProcessGrid(MPI.COMM_WORLD)
rng = numpy.random.default_rng(0)
cases = [(q, norm, 33, 64) for q in ("equiangular", "legendre-gauss", "lobatto")
         for norm in ("ortho", "schmidt", "four-pi")] + [("legendre-gauss", "ortho", 361, 720)]
for quadrature, norm, nlat, nlon in cases:
    for cls in (ms.DistributedRealSHT, ms.DistributedInverseRealSHT, ms.DistributedRealVectorSHT,
                ms.DistributedInverseRealVectorSHT):
        op = cls(grid, nlat, nlon, quadrature=quadrature, norm=norm)
        x = rng.standard_normal(op.domain_shape((1, 2) if "Vector" in cls.__name__ else (1,)))
        x = x.astype(op.cdtype) if "Inverse" in cls.__name__ else x
        op.adjoint(op.forward(x))
for dtype in (numpy.float32, numpy.float64):
    ms.DistributedRealSHT(grid, 64, 128, quadrature="legendre-gauss", dtype=dtype).forward(
        numpy.ones(grid.local_shape(64, 128), dtype))
halo = ms.HaloExchange(grid, 2, 2, extents=(33, 64), poles="across", signs=(1, -1), quadrature="equiangular")
halo.adjoint(halo.forward(numpy.ones((2,) + grid.local_shape(33, 64))))
swe = ShallowWaterSolver(grid, 32, 64, dt=400.0, quadrature="legendre-gauss")
state = swe.timestep(swe.galewsky_initial_condition(), 3)
model = swe.linearize(state, 2)
model.adjoint(model.forward(1e-3 * state))
swe.diagnostics(state)
grid.free()
print("clean under traps", flush=True)
'''


needs_traps = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64" or ctypes.util.find_library("m") is None,
    reason="feenableexcept with x86-64 glibc's flag values")


@needs_traps
def test_the_traps_catch_a_division_by_zero(tmp_path):
    """The harness can fail: the same preamble, then 1/0 in NumPy, dies of SIGFPE."""
    script = tmp_path / "zero.py"
    script.write_text(textwrap.dedent(TRAPS) + "import numpy\nnumpy.float64(1.0) / numpy.zeros(1)\nprint('no trap')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == -8 and "no trap" not in done.stdout, (done.returncode, done.stdout, done.stderr)


@needs_traps
def test_transforms_halos_and_the_model_run_with_traps_enabled(tmp_path):
    script = tmp_path / "traps.py"
    script.write_text(textwrap.dedent(SCRIPT))
    command = mpiexec_command() + ["-n", "2", sys.executable, str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.count("clean under traps") == 2, \
        f"exit {done.returncode} (SIGFPE is -8 or 136):\n{done.stdout}\n{done.stderr[-4000:]}"
