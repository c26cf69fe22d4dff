#!/usr/bin/env bash
# Build the shim (C, embedding the Python that runs mpisphere) and the Fortran model.
#   PYTHON (default python3): the interpreter whose mpisphere the model uses
#   MPICC, MPIFC (default mpicc, mpif90): the MPI compiler wrappers of the MPI mpi4py loads
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
MPICC=${MPICC:-mpicc}
MPIFC=${MPIFC:-mpif90}
read -r include libdir version < <("$PYTHON" -c \
  'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("LIBDIR"), s.get_config_var("LDVERSION"))')
"$MPICC" -O2 -fPIC -shared -I"$include" shim.c -L"$libdir" -lpython"$version" -Wl,-rpath,"$libdir" -o libmpsshim.so
# -ffpe-trap: a debug build that stops on invalid operations, division by zero and overflow, also inside
# NumPy and mpisphere (which run clean under it)
"$MPIFC" -O2 -g -ffpe-trap=invalid,zero,overflow model.f90 -L. -lmpsshim -Wl,-rpath,'$ORIGIN' -o model
echo "built $(pwd)/model"
