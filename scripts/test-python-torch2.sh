#!/usr/bin/env bash
# `make test-torch2`: kvstore.torch and the PyTorch interop tests against PyTorch 2.x
# from PyPI, where `register_post_accumulate_grad_hook` exists (make test's torch is
# Debian's 1.13, which takes the AccumulateGrad-node fallback). PyPI's torch is the CUDA
# build, about 5.4 GB with its nvidia-* packages, so it is not in `make test`: its venv,
# target/py-torch2-venv, is kept between runs. On a machine with a GPU the GPU tests run
# too (KVSTORE_REQUIRE_CUDA=1 makes their skip a failure). Prints one line
# `python-torch2: N passed, N failed` (from its JUnit XML report, in
# ${KVSTORE_REPORTS:-target/test-reports/python-torch2}).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv=target/py-torch2-venv
logs=target/test-logs
mkdir -p "$logs"
log=$logs/python-torch2.log
: >"$log"
reports=${KVSTORE_REPORTS:-$root/target/test-reports/python-torch2}
rm -rf "$reports"
mkdir -p "$reports"
totals() { python3 scripts/junit.py total --name python-torch2 "$reports"; }
fail() {
    echo "$1"
    tail -n 30 "$log" | sed 's/^/  /'
    python3 scripts/junit.py case "$reports" "$1" "log: $log"
    totals
    exit 1
}
if ! "$venv/bin/python" -c "import torch, pytest, numpy, ml_dtypes, sklearn" >>"$log" 2>&1; then
    rm -rf "$venv"
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet --upgrade pip &&
        "$venv/bin/pip" install --quiet torch pytest numpy ml_dtypes scikit-learn; } >>"$log" 2>&1 ||
        fail "making $venv (PyPI torch) failed"
fi
wheel=$(bash scripts/python-wheel.sh 2>>"$log" | tail -n 1) || fail "make python failed"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel" >>"$log" 2>&1 || fail "installing $wheel failed"
tmp=$(mktemp -d "$root/target/py-torch2-tmp.XXXXXX")
(cd "$venv" && TMPDIR=$tmp KVSTORE_REQUIRE_TORCH=1 bin/python -m pytest -q -rs -p no:cacheprovider -k "not mxnet" \
    --junitxml="$reports/pytest.xml" \
    "$root/kvstore-py/tests/test_torch_dp.py" "$root/kvstore-py/tests/test_interop.py" \
    "$root/kvstore-py/tests/test_gpu.py") 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
rm -rf "$tmp"
python3 scripts/junit.py ran "$reports" pytest "$status" "$reports/pytest.xml"
totals
