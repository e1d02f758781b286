#!/usr/bin/env bash
# Installs Open MPI and libclang (for the `mpi` crate's bindgen) from Debian, if missing.
set -euo pipefail
need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || need+=(libopenmpi-dev)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || need+=(libclang-dev)
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
for attempt in 1 2 3 4 5 6; do
    if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; then
        exit 0
    fi
    echo "apt-get failed (attempt $attempt), retrying in 10 s"
    sleep 10
done
echo "could not install ${need[*]}" >&2
exit 1
