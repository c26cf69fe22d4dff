#!/usr/bin/env bash
# Every check mpisphere's GPU paths need, in one command, for a GPU machine without MPI or a package index.
#
#   scripts/gpu_check.sh fetch        # here, with pip's index: the wheels into .whl/ (ignored by git, ~31 MB)
#   scripts/gpu_check.sh run [OUT]    # there (the device tool: carry [".whl"]), writing logs and JSON to OUT
#
# `run` (about 6 minutes on an H200, every step under its own timeout): a virtual environment over the
# machine's packages (CuPy, NumPy, PyTorch, pytest) plus the carried wheels (the pip MPICH runtime and
# mpi4py, pytest-mpi, ducc0, torch-harmonics); `python -m mpisphere diagnose`; the GPU tests at 1, 2 and 4
# ranks sharing the one GPU on the staging path, then on the CUDA-aware path only if diagnose says the MPI
# is CUDA-aware; the communication benchmark on device buffers at 2 ranks; the SHT against torch-harmonics
# with memory and bandwidth figures (scripts/bench_gpu.py). It exits non-zero when a test step fails, after
# running the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
P=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
WHEELS=(mpich==5.0.2 mpi4py==4.1.2 pytest-mpi==0.6 ducc0==0.42.0 torch-harmonics==0.9.3)

if [ "$mode" = fetch ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .whl
  for wheel in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${P[@]}" \
      -d .whl "$wheel" || { echo "gpu_check: could not fetch $wheel" >&2; exit 1; }
  done
  ls -la .whl
  exit 0
fi
[ "$mode" = run ] || { echo "usage: scripts/gpu_check.sh fetch | run [OUT]" >&2; exit 2; }

OUT=${2:-${OUT:-gpu-check-out}}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
failed=0
step() {  # step NAME SECONDS COMMAND...: run with a timeout, log to OUT/NAME.log, remember failures
  local name=$1 seconds=$2
  shift 2
  echo "== $name (timeout ${seconds}s): $*"
  SECONDS=0
  timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -25 "$OUT/$name.log"
  echo "== $name: exit $rc in ${SECONDS}s"
  return $rc
}

ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check: no wheels in .whl/: run 'scripts/gpu_check.sh fetch' here and carry .whl" >&2; exit 1; }
# the image's python3 is itself a virtual environment (CuPy, PyTorch, pytest live in it): a venv made from it
# sees only the base interpreter's packages, so a .pth file adds the image's site-packages after the wheels'
PYTHON=${PYTHON:-python3}
image_site=$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])') || exit 1
"$PYTHON" -m venv /tmp/gpu-venv || exit 1
venv_site=$(/tmp/gpu-venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
echo "$image_site" > "$venv_site/_image_packages.pth"
# into the venv, not --target: the mpich wheel's libmpi and mpiexec go to the venv's lib/ and bin/, where
# mpi4py looks for them
/tmp/gpu-venv/bin/python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
export PATH=/tmp/gpu-venv/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MPISPHERE_MPIEXEC="/tmp/gpu-venv/bin/mpiexec"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
python -c 'import cupy, mpi4py.MPI as M, numpy; print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount(), "numpy", numpy.__version__, M.Get_library_version().splitlines()[0])' \
  | tee "$OUT/versions.txt"

# without a working CuPy and device every GPU test would only be skipped: that is a failure here, not a pass
step cupy 60 python -c 'import cupy; n = cupy.cuda.runtime.getDeviceCount(); assert n > 0, "no CUDA device"; print(n, "device(s):", cupy.cuda.runtime.getDeviceProperties(0)["name"])' \
  || { echo "gpu_check: CuPy or the device is not usable: the GPU tests would all be skipped"; exit 1; }
step diagnose 120 mpiexec -n 2 python -m mpisphere diagnose || failed=1
cuda_aware=0
grep -q "CUDA-aware MPI: yes" "$OUT/diagnose.log" && cuda_aware=1

step tests-staged 240 env MPISPHERE_CUDA_AWARE=0 python -m pytest -q -p no:cacheprovider -m gpu --mpi-sizes=1,2,4 \
  --mpi-launch-timeout=200 tests || failed=1
if [ "$cuda_aware" = 1 ]; then
  step tests-cuda-aware 240 env MPISPHERE_CUDA_AWARE=1 python -m pytest -q -p no:cacheprovider -m gpu \
    --mpi-sizes=2 --mpi-launch-timeout=200 tests || failed=1
else
  echo "== tests-cuda-aware: not run: diagnose did not find a CUDA-aware MPI (the carried pip MPICH is not)"
fi
step bench-primitives 120 mpiexec -n 2 python scripts/bench_primitives.py --device gpu --grids 1x2 --repeats 11 \
  --json "$OUT/primitives-gpu.json" || true
step bench-sht 240 python scripts/bench_gpu.py --json "$OUT/sht-gpu.json" || true
echo "gpu_check: $([ $failed = 0 ] && echo OK || echo 'FAILED (see the logs above)'), logs and JSON in $OUT"
exit $failed
