#!/usr/bin/env bash
# `make bench`'s gloo and cluster rows (issue 58), by bench/cluster.py: 2 ranks on this
# machine over loopback TCP (a dist_sync push of 4 and 64 MB against torch's gloo
# allreduce of the same); then, on a cluster in a box (scripts/cluster.sh), 2 hosts of 2
# ranks over a 10 Gbit/s link (a 64 MB push against the link's bound and against gloo on
# the same hosts, and, by kvstore-mpi's MPI bench, against MPI moving its bytes with no
# sums), the same over 2 Gbit/s (where the link bounds the push), and 2 hosts of 1 rank
# over 1 Gbit/s (the push with 2-bit compression against the uncompressed one); written to OUT_JSON (default target/bench/cluster.json)
# for the report. In Debian's python3 with python3-torch (target/py-torch-mpi-venv, as
# bench/torch-dp.sh) with the wheel over the system's Open MPI. Where network namespaces cannot be made
# it says so and writes the loopback rows only.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench/cluster.json}
venv=target/py-torch-mpi-venv
mkdir -p "$(dirname "$out")"
rm -f "$out"
bash scripts/setup-mpi.sh
source scripts/suite.sh
wheel=$(bash scripts/python-wheel.sh | tail -n 1)
# The wheel's MPI module over the system's Open MPI, whose mpirun runs the jobs.
export KVSTORE_MPI=system
ready_venv torch "$venv" "$wheel"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GLOO_SOCKET_IFNAME=eth0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KVSTORE_BENCH_GLOO_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo mpirun --oversubscribe --bind-to none \
    --mca btl self,tcp -x KVSTORE_BENCH_GLOO_ADDR -x GLOO_SOCKET_IFNAME -np 2 \
    "$venv/bin/python" bench/cluster.py "$tmp/lo.json" "mpi 2 ranks over tcp, against gloo" 0 1 --sizes 4,64
parts=("$tmp/lo.json")
if why=$(bash scripts/cluster.sh check); then
    mpi=(--oversubscribe --bind-to none -x GLOO_SOCKET_IFNAME)
    bash scripts/cluster.sh run -n 2 -s 2 -r 10gbit -- "${mpi[@]}" -np 4 \
        "$venv/bin/python" bench/cluster.py "$tmp/10g.json" "cluster 2 hosts x 2 ranks, 10 Gbit/s" 10e9 2
    # The same at 2 Gbit/s, where the link, not the 4 ranks' work on this machine's
    # cores, bounds the push.
    bash scripts/cluster.sh run -n 2 -s 2 -r 2gbit -- "${mpi[@]}" -np 4 \
        "$venv/bin/python" bench/cluster.py "$tmp/2g.json" "cluster 2 hosts x 2 ranks, 2 Gbit/s" 2e9 2
    exe=$(bash bench/exe.sh kvstore-mpi mpi --features mpi)
    KVSTORE_BENCH_CLUSTER=1 KVSTORE_BENCH_LABEL="cluster 2 hosts x 2 ranks, 10 Gbit/s" \
        bash scripts/cluster.sh run -n 2 -s 2 -r 10gbit -- "${mpi[@]}" -x KVSTORE_BENCH_CLUSTER \
        -x KVSTORE_BENCH_LABEL -np 4 "$exe" "$tmp/10g-mpi.json"
    bash scripts/cluster.sh run -n 2 -s 1 -r 1gbit -- "${mpi[@]}" -np 2 \
        "$venv/bin/python" bench/cluster.py "$tmp/1g.json" "cluster 2 hosts x 1 rank, 1 Gbit/s" 1e9 2 --compressed
    parts+=("$tmp/10g.json" "$tmp/2g.json" "$tmp/10g-mpi.json" "$tmp/1g.json")
else
    echo "cluster bench: SKIP ($why)"
fi
python3 -c 'import json, sys; json.dump(sum((json.load(open(f)) for f in sys.argv[2:]), []), open(sys.argv[1], "w"), indent=1)' \
    "$out" "${parts[@]}"
