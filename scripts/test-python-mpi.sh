#!/usr/bin/env bash
# dist_sync from Python: builds the kvstore-mpi wheel (`make python FEATURES=mpi`),
# installs it into a virtualenv (target/py-mpi-venv, kept between runs; the wheel is
# reinstalled every run), and runs kvstore-py/tests/test_dist.py there, which starts
# 2-rank jobs under mpirun: bit-identical training on every rank, desync errors, the
# KVSTORE_TIMEOUT watchdog, a rank that raises. Then, with the same wheel, gluon's
# Trainer over dist_sync (kvstore-py/tests/test_dist_gluon.py: kvstore.mxnet under
# mpirun, update_on_kvstore True and False, against one process) in
# target/py-mxnet-mpi-venv (mxnet 1.9.1, numpy<1.24, pytest; kept between runs, rebuilt
# when missing, broken or made for other requirements, as scripts/test-python.sh keeps
# its venvs; MXNet's libgomp1 and libquadmath0 through scripts/apt-install.sh).
# KVSTORE_REQUIRE_MPI=1 makes a build without MPI (or a venv without mxnet) fail
# instead of skip. Every test is a test case in
# ${KVSTORE_REPORTS:-target/test-reports/python-mpi} (pytest's JUnit XML reports); prints
# one line `python-mpi: N passed, N failed` that totals them.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
logs=target/test-logs
mkdir -p "$logs"
venv=target/py-mpi-venv
reports=${KVSTORE_REPORTS:-$root/target/test-reports/python-mpi}
rm -rf "$reports"
mkdir -p "$reports"
totals() { python3 scripts/junit.py total --name python-mpi "$reports"; }
# A step that failed: its message and log's tail, as a failed case.
step_failed() {
    echo "$1"
    tail -n 40 "$2" | sed 's/^/  /'
    python3 scripts/junit.py case "$reports" "$1" "log: $2"
}
fail() {
    step_failed "$1" "$2"
    totals
    exit 1
}
wheel=$(KVSTORE_PY_FEATURES=mpi bash scripts/python-wheel.sh 2>"$logs/python-mpi-wheel.log" | tail -n 1) ||
    fail "make python FEATURES=mpi failed" "$logs/python-mpi-wheel.log"
if [ ! -x "$venv/bin/pytest" ]; then
    rm -rf "$venv"
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet --upgrade pip &&
        "$venv/bin/pip" install --quiet pytest; } >"$logs/python-mpi-venv.log" 2>&1 ||
        fail "making $venv failed" "$logs/python-mpi-venv.log"
fi
"$venv/bin/pip" install --quiet --force-reinstall "$wheel" >"$logs/python-mpi-install.log" 2>&1 ||
    fail "pip install $wheel failed" "$logs/python-mpi-install.log"
export TMPDIR=$root/target/py-mpi-tmp
rm -rf "$TMPDIR"
mkdir -p "$TMPDIR"

# Runs pytest with `python` from its venv's folder (so that the installed package is the
# one tested), logging to target/test-logs/python-mpi-NAME.log, its JUnit XML report in
# $reports/pytest-NAME/report.xml (a skip is a failure: the MPI build must run everything).
# Usage: run_pytest NAME VENV PYTEST-ARGS...
run_pytest() {
    local name=$1 dir=$2
    shift 2
    local log=$logs/python-mpi-$name.log report=$reports/pytest-$name/report.xml
    (cd "$dir" && KVSTORE_REQUIRE_MPI=1 bin/python -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
        --junitxml="$report" "$@") 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    python3 scripts/junit.py ran "$reports" "pytest ($name)" "$status" "$report" --no-skips
}

run_pytest pytest "$venv" "$root/kvstore-py/tests/test_dist.py"

# gluon over dist_sync: MXNet 1.9.1 in a cached venv, as scripts/test-python.sh keeps
# target/py-mxnet-venv (its .kvstore-spec names what it was made from).
mxnet_venv=target/py-mxnet-mpi-venv
mxnet_spec="mxnet==1.9.1 numpy<1.24 pytest"
mxnet_check="import mxnet, pytest, numpy"
make_mxnet_venv() {
    rm -rf "$mxnet_venv"
    python3 -m venv "$mxnet_venv" &&
        "$mxnet_venv/bin/pip" install --quiet --upgrade pip &&
        "$mxnet_venv/bin/pip" install --quiet mxnet==1.9.1 'numpy<1.24' pytest &&
        "$mxnet_venv/bin/python" -c "$mxnet_check" &&
        echo "$mxnet_spec" >"$mxnet_venv/.kvstore-spec"
}
mxlog=$logs/python-mpi-mxnet-venv.log
if bash scripts/apt-install.sh libgomp1 libquadmath0 >"$mxlog" 2>&1 && {
    { [ -x "$mxnet_venv/bin/python" ] && [ "$(cat "$mxnet_venv/.kvstore-spec" 2>/dev/null)" = "$mxnet_spec" ] &&
        "$mxnet_venv/bin/python" -c "$mxnet_check" >/dev/null 2>&1; } || make_mxnet_venv >>"$mxlog" 2>&1
} && "$mxnet_venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel" >>"$mxlog" 2>&1; then
    run_pytest gluon "$mxnet_venv" -W ignore::DeprecationWarning "$root/kvstore-py/tests/test_dist_gluon.py"
else
    step_failed "setting up $mxnet_venv (mxnet 1.9.1) failed" "$mxlog"
fi

# kvstore.torch over dist_sync (kvstore-py/tests/test_torch_dp_dist.py: the digits
# example on 2 ranks, against 1): Debian's python3 with python3-torch and python3-sklearn
# in target/py-torch-mpi-venv (kept while its .kvstore-spec holds), with the same wheel.
torch_venv=target/py-torch-mpi-venv
torch_spec="debian-python3-torch python3-sklearn pytest numpy<2"
torch_check="import torch, sklearn, pytest, numpy"
torchlog=$logs/python-mpi-torch-venv.log
if bash scripts/apt-install.sh python3-torch python3-sklearn python3-venv >"$torchlog" 2>&1 && {
    { [ -x "$torch_venv/bin/python" ] && [ "$(cat "$torch_venv/.kvstore-spec" 2>/dev/null)" = "$torch_spec" ] &&
        "$torch_venv/bin/python" -c "$torch_check" >/dev/null 2>&1; } ||
        { rm -rf "$torch_venv" && /usr/bin/python3 -m venv --system-site-packages "$torch_venv" &&
            "$torch_venv/bin/pip" install --quiet pytest 'numpy<2' && "$torch_venv/bin/python" -c "$torch_check" &&
            echo "$torch_spec" >"$torch_venv/.kvstore-spec"; } >>"$torchlog" 2>&1
} && "$torch_venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel" >>"$torchlog" 2>&1; then
    KVSTORE_REQUIRE_TORCH=1 run_pytest torch "$torch_venv" "$root/kvstore-py/tests/test_torch_dp_dist.py"
else
    step_failed "setting up $torch_venv (Debian's python3-torch, python3-sklearn) failed" "$torchlog"
fi

rm -rf "$TMPDIR"
totals
