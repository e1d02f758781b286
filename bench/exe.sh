#!/usr/bin/env bash
# Builds the bench target BENCH of package PKG (release, `cargo bench --no-run`, with any
# further cargo flags) and prints the path of its executable, for benches run outside
# cargo: under mpirun (kvstore-mpi's `mpi`) or copied into the GPU bundle (kvstore-cuda's
# `gpu`). Usage: exe.sh PKG BENCH [CARGO_FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=$1
bench=$2
shift 2
exe=$(cargo bench -p "$pkg" --bench "$bench" --no-run --message-format=json "$@" |
    python3 scripts/cargo-executables.py | awk -v b="$bench" '$1 == b { print $2 }' | tail -n 1)
if [ -z "$exe" ]; then
    echo "bench/exe.sh: cargo built no executable for bench $bench of $pkg" >&2
    exit 1
fi
echo "$exe"
