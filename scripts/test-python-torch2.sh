#!/usr/bin/env bash
# `make test-torch2`: kvstore.torch and the PyTorch interop tests against PyTorch 2.x
# from PyPI, where `register_post_accumulate_grad_hook` exists (make test's torch is
# Debian's 1.13, which takes the AccumulateGrad-node fallback), and docs/python.md's
# PyTorch job on 2 ranks with `kvstore[mpi]`, straight through and with a rank killed. PyPI's torch is the CUDA
# build, about 5.4 GB with its nvidia-* packages, so it is not in `make test`: its venv,
# target/py-torch2-venv, is kept between runs. On a machine with a GPU the GPU tests run
# too (KVSTORE_REQUIRE_CUDA=1 makes their skip a failure). Prints one line
# `python-torch2: N passed, N failed` (from its JUnit XML report, in
# ${KVSTORE_REPORTS:-target/test-reports/python-torch2}).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init python-torch2
venv=target/py-torch2-venv
log=$logs/python-torch2-setup.log
make_venv() {
    python3 -m venv "$1" && "$1/bin/pip" install --quiet --upgrade pip &&
        "$1/bin/pip" install --quiet torch pytest numpy ml_dtypes scikit-learn
}
cached_venv "$venv" "torch pytest numpy ml_dtypes scikit-learn" "import torch, pytest, numpy, ml_dtypes, sklearn" \
    make_venv >"$log" 2>&1 || give_up "making $venv (PyPI torch)" "$log"
wheel=$(bash scripts/python-wheel.sh 2>>"$log" | tail -n 1) || give_up "make python" "$log"
install_wheel "$venv" "$wheel" >>"$log" 2>&1 || give_up "installing $wheel" "$log"
export TMPDIR
TMPDIR=$(mktemp -d "$root/target/py-torch2-tmp.XXXXXX")
KVSTORE_REQUIRE_TORCH=1 run_pytest pytest "$venv" bin/python -rs -k "not mxnet" \
    "$root/kvstore-py/tests/test_torch_dp.py" "$root/kvstore-py/tests/test_torch_resume.py" \
    "$root/kvstore-py/tests/test_interop.py" "$root/kvstore-py/tests/test_gpu.py"

# docs/python.md's PyTorch job (the folder torch-dp) as its reader runs it with this
# torch: `kvstore[mpi]` in the venv, the script on 2 ranks under the venv's mpirun, then
# under kvstore-run with a rank killed, each checked against the document's output.
source scripts/doc-steps.sh
"$venv/bin/pip" install --quiet "$wheel[mpi]" >>"$log" 2>&1 || give_up "installing $wheel[mpi]" "$log"
projects=$TMPDIR/projects
python3 scripts/readme_projects.py --mpi "$projects" "$root" docs/python.md >>"$log" 2>&1 ||
    give_up "the blocks of docs/python.md" "$log"
grep -P '^\w+\ttorch-dp\t' "$projects/steps.tsv" >"$projects/torch-dp.tsv" && mv "$projects/torch-dp.tsv" "$projects/steps.tsv"
ln -s "$root/$venv" "$projects/torch-dp/venv"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run_doc_steps "$projects" python-torch2
rm -rf "$TMPDIR"
totals
