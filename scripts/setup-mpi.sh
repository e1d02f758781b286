#!/usr/bin/env bash
# Installs Open MPI and libclang (for the `mpi` crate's bindgen) from Debian, if missing.
set -euo pipefail
need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || need+=(libopenmpi-dev)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || need+=(libclang-dev)
[ ${#need[@]} -eq 0 ] && exit 0
exec bash "$(dirname "$0")/apt-install.sh" "${need[@]}"
