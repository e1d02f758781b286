#!/usr/bin/env bash
# `make bench`'s PyTorch rows: bench/torch_dp.py under `mpirun -np 2`, DDP (gloo)
# against kvstore.torch over dist_sync, written to OUT_JSON (default
# target/bench/torch-dp.json) for the report. Runs in Debian's python3 with python3-torch
# and python3-sklearn (target/py-torch-mpi-venv, made as scripts/test-python-mpi.sh makes
# it when missing) with the kvstore-mpi wheel, built and reinstalled every run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench/torch-dp.json}
venv=target/py-torch-mpi-venv
mkdir -p "$(dirname "$out")"
rm -f "$out"
bash scripts/setup-mpi.sh
bash scripts/apt-install.sh python3-torch python3-sklearn python3-venv
if ! "$venv/bin/python" -c "import torch, sklearn, numpy" 2>/dev/null; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install --quiet pytest 'numpy<2'
fi
wheel=$(KVSTORE_PY_FEATURES=mpi bash scripts/python-wheel.sh | tail -n 1)
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
    "$venv/bin/python" bench/torch_dp.py "$out"
