#!/usr/bin/env bash
# `make bench`'s PyTorch rows: bench/torch_dp.py under `mpirun -np 2`, DDP (gloo)
# against kvstore.torch over dist_sync, written to OUT_JSON (default
# target/bench/torch-dp.json) for the report; then bench/torch_owners.py's rows beside
# it: ZeroRedundancyOptimizer against kvstore.torch with Adam on owners (2 ranks,
# torch-owners.json), gloo's reduce-scatter against a push onto owners (4 ranks,
# torch-scatter.json), and DDP's EmbeddingBag against a table on owners (4 ranks,
# torch-embedding.json). Runs in Debian's python3 with python3-torch
# and python3-sklearn (target/py-torch-mpi-venv, scripts/test-python-mpi.sh's, made by
# scripts/suite.sh's ready_venv when missing) with the wheel (its MPI module over the
# system's Open MPI: KVSTORE_MPI=system), built and
# reinstalled every run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench/torch-dp.json}
venv=target/py-torch-mpi-venv
mkdir -p "$(dirname "$out")"
dir=$(dirname "$out")
rm -f "$out" "$dir/torch-owners.json" "$dir/torch-scatter.json" "$dir/torch-embedding.json"
bash scripts/setup-mpi.sh
source scripts/suite.sh
wheel=$(bash scripts/python-wheel.sh | tail -n 1)
# The wheel's MPI module over the system's Open MPI, whose mpirun runs the jobs.
export KVSTORE_MPI=system
ready_venv torch "$venv" "$wheel"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
    "$venv/bin/python" bench/torch_dp.py "$out"
for run in "zero 2 torch-owners" "scatter 4 torch-scatter" "embedding 4 torch-embedding"; do
    set -- $run
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np "$2" \
        "$venv/bin/python" bench/torch_owners.py "$1" "$dir/$3.json"
done
