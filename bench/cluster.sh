#!/usr/bin/env bash
# `make bench`'s cluster rows (issue 58): bench/cluster.py on a cluster in a box
# (scripts/cluster.sh): 2 hosts of 2 ranks over a 10 Gbit/s link (a dist_sync push of
# 64 MB against the link's bound and against torch's gloo allreduce on the same hosts),
# and 2 hosts of 1 rank over 1 Gbit/s (the push with 2-bit compression against the
# uncompressed one), written to OUT_JSON (default target/bench/cluster.json) for the
# report. In Debian's python3 with python3-torch (target/py-torch-mpi-venv, as
# bench/torch-dp.sh) with the kvstore-mpi wheel. Where network namespaces cannot be made
# it says so and writes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench/cluster.json}
venv=target/py-torch-mpi-venv
mkdir -p "$(dirname "$out")"
rm -f "$out"
if ! why=$(bash scripts/cluster.sh check); then
    echo "cluster bench: SKIP ($why)"
    exit 0
fi
bash scripts/setup-mpi.sh
source scripts/suite.sh
wheel=$(KVSTORE_PY_FEATURES=mpi bash scripts/python-wheel.sh | tail -n 1)
ready_venv torch "$venv" "$wheel"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GLOO_SOCKET_IFNAME=eth0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi=(--oversubscribe --bind-to none -x GLOO_SOCKET_IFNAME)
bash scripts/cluster.sh run -n 2 -s 2 -r 10gbit -- "${mpi[@]}" -np 4 \
    "$venv/bin/python" bench/cluster.py "$tmp/10g.json" "cluster 2 hosts x 2 ranks, 10 Gbit/s" 10e9 2
bash scripts/cluster.sh run -n 2 -s 1 -r 1gbit -- "${mpi[@]}" -np 2 \
    "$venv/bin/python" bench/cluster.py "$tmp/1g.json" "cluster 2 hosts x 1 rank, 1 Gbit/s" 1e9 2 --compressed
python3 -c 'import json, sys; json.dump(sum((json.load(open(f)) for f in sys.argv[2:]), []), open(sys.argv[1], "w"), indent=1)' \
    "$out" "$tmp/10g.json" "$tmp/1g.json"
