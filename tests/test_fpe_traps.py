"""Every constructor and transform runs clean with floating-point traps on, as in a Fortran debug build.

A host model built with ``-ffpe-trap=invalid,zero,overflow`` turns any
operation that makes an inf or NaN into SIGFPE, also inside NumPy. The
script below enables the same traps with ``feenableexcept`` (glibc, through
ctypes) and then builds and runs the transforms (all rules and norms, up to
the 361 x 720 tables whose high orders underflow near the poles) with each
registered Legendre strategy named explicitly (``legendre="auto"`` chooses
by a cost model, so a test left to it checks whichever strategy this machine
picks), halo exchanges across the poles, the shallow-water model and its
adjoint, under ``mpiexec -n 2``; a trap kills the process with SIGFPE and
fails the test. It runs twice: with ducc0's build for this CPU, and with its
AVX2 build (``DUCC0_MAX_PSABI_LEVEL=3``, what a CPU without AVX-512 runs),
whose Legendre kernels raise the overflow flag in lanes they discard.
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

from mpisphere.sht.strategies import NAMES

grid = ms.ProcessGrid(MPI.COMM_WORLD)
rng = numpy.random.default_rng(0)
cases = [(q, norm, 33, 64) for q in ("equiangular", "legendre-gauss", "lobatto")
         for norm in ("ortho", "schmidt", "four-pi")] + [("legendre-gauss", "ortho", 361, 720)]
ran = set()
for legendre in NAMES:  # every registered strategy, named: what auto would choose depends on the machine
    for quadrature, norm, nlat, nlon in cases:
        for cls in (ms.DistributedRealSHT, ms.DistributedInverseRealSHT, ms.DistributedRealVectorSHT,
                    ms.DistributedInverseRealVectorSHT):
            op = cls(grid, nlat, nlon, quadrature=quadrature, norm=norm, legendre=legendre)
            for batch in ((1,), (3,)):  # one field, and a batch
                x = rng.standard_normal(op.domain_shape(batch + ((2,) if "Vector" in cls.__name__ else ())))
                x = x.astype(op.cdtype) if "Inverse" in cls.__name__ else x
                op.adjoint(op.forward(x))
            ran.add(op.strategy.name)
    for dtype in (numpy.float32, numpy.float64):
        ms.DistributedRealSHT(grid, 64, 128, quadrature="legendre-gauss", dtype=dtype, legendre=legendre).forward(
            numpy.ones(grid.local_shape(64, 128), dtype))
assert ran == set(NAMES), (ran, NAMES)
halo = ms.HaloExchange(grid, 2, 2, extents=(33, 64), poles="across", signs=(1, -1), quadrature="equiangular")
halo.adjoint(halo.forward(numpy.ones((2,) + grid.local_shape(33, 64))))
swe = ShallowWaterSolver(grid, 32, 64, dt=400.0, quadrature="legendre-gauss")
state = swe.timestep(swe.galewsky_initial_condition(), 3)
model = swe.linearize(state, 2)
model.adjoint(model.forward(1e-3 * state))
swe.diagnostics(state)
grid.free()
print(f"clean under traps: {','.join(sorted(ran))}", flush=True)  # one write: the ranks share the pipe
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
@pytest.mark.parametrize("ducc0_level", [None, "3"], ids=["ducc0-native", "ducc0-avx2"])
def test_transforms_halos_and_the_model_run_with_traps_enabled(tmp_path, ducc0_level):
    script = tmp_path / "traps.py"
    script.write_text(textwrap.dedent(SCRIPT))
    command = mpiexec_command() + ["-n", "2", sys.executable, str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("DUCC0_MAX_PSABI_LEVEL", None)
    if ducc0_level is not None:
        env["DUCC0_MAX_PSABI_LEVEL"] = ducc0_level  # ducc0's AVX2 build on any x86-64 that has AVX2 or more
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.count("clean under traps: reduce-scatter,table-free,transpose") == 2, \
        f"exit {done.returncode} (SIGFPE is -8 or 136):\n{done.stdout}\n{done.stderr[-4000:]}"


@needs_traps
def test_held_traps_drop_a_spurious_flag_and_keep_a_real_one(tmp_path):
    """``HeldTraps``: a kernel that overflows in a value it discards runs clean; one that writes an inf traps."""
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent(TRAPS) + textwrap.dedent('''
        import sys
        from mpisphere.fpenv import HeldTraps
        out = numpy.zeros(3)
        with HeldTraps((out,)):
            numpy.float64(1e300) * numpy.float64(1e300)  # overflow, discarded
            out[:] = 1.0
        assert libm.fegetexcept() & FE_OVERFLOW  # the caller's traps are back
        print("spurious flag dropped", flush=True)
        with HeldTraps((out,)):
            out[0] = numpy.float64(1e300) * numpy.float64(1e300)  # an inf in the output
        print("real flag lost", flush=True)
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "spurious flag dropped" in done.stdout, (done.returncode, done.stdout, done.stderr)
    assert done.returncode == -8 and "real flag lost" not in done.stdout, (done.returncode, done.stdout, done.stderr)
