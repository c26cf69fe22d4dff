#!/usr/bin/env bash
# Run the Fortran model on 1 to 6 ranks and grid shapes, under MPIRUN (default: mpirun, with Open MPI's flags
# when it is Open MPI). The embedded Python is PYTHON's (MPS_PYTHON, read by shim.c); bridge.py comes from here.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
MPS_PYTHON=$(command -v "$PYTHON")
export MPS_PYTHON
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
read -r -a launcher <<< "${MPIRUN:-mpirun}"
if "${launcher[0]}" --version 2>&1 | grep -q "Open MPI"; then
  launcher+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && launcher+=(--allow-run-as-root)
fi
for shape in "1 1" "2 1" "2 2" "3 1" "4 2" "6 3"; do
  read -r ranks npolar <<< "$shape"
  echo "+ ${launcher[*]} -n $ranks ./model $npolar"
  "${launcher[@]}" -n "$ranks" ./model "$npolar"
done
