#!/usr/bin/env bash
# Build kernels.f90 into a Python extension with numpy.f2py (meson backend: pip install meson ninja).
# The kernels need the MPI Fortran `mpi` module and libraries of the MPI that mpi4py loads: their -I, -L and -l
# flags come from the wrapper (MPIFC, default mpif90; Open MPI's --showme, MPICH's -show). Without the link
# flags the extension builds and then fails at import with "undefined symbol: mpi_allreduce_".
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
MPIFC=${MPIFC:-mpif90}
wrapper=$("$MPIFC" --showme 2>/dev/null || "$MPIFC" -show)
compile=() link=()
for token in $wrapper; do
  case "$token" in -I*) compile+=("$token") ;; -L*|-l*|-Wl,*) link+=("$token") ;; esac
done
# through the environment: meson takes FFLAGS and LDFLAGS as they are (f2py's own -l would be parsed)
FC=$(echo "$wrapper" | awk '{print $1}') FFLAGS="${compile[*]}" LDFLAGS="${link[*]}" \
  "$PYTHON" -m numpy.f2py -c kernels.f90 -m kernels --backend meson >build.log 2>&1 || { tail -30 build.log; exit 1; }
ls kernels*.so
