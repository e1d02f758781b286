#!/usr/bin/env bash
# dist_sync from Python: builds the kvstore-mpi wheel (`make python FEATURES=mpi`),
# installs it into a virtualenv (target/py-mpi-venv, kept between runs; the wheel is
# reinstalled every run), and runs kvstore-py/tests/test_dist.py there, which starts
# 2-rank jobs under mpirun: bit-identical training on every rank, desync errors, the
# KVSTORE_TIMEOUT watchdog, a rank that raises. KVSTORE_REQUIRE_MPI=1 makes a build
# without MPI fail instead of skip. Prints one line `python-mpi: N passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
logs=target/test-logs
mkdir -p "$logs"
venv=target/py-mpi-venv
fail() {
    echo "$1"
    tail -n 40 "$2" | sed 's/^/  /'
    echo "python-mpi: 0 passed, 1 failed"
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
(cd "$venv" && KVSTORE_REQUIRE_MPI=1 bin/python -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
    "$root/kvstore-py/tests/test_dist.py") 2>&1 | tee "$logs/python-mpi-pytest.log"
status=${PIPESTATUS[0]}
rm -rf "$TMPDIR"
summary=$(tail -n 1 "$logs/python-mpi-pytest.log")
passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
failed=$(echo "$summary" | grep -oE '[0-9]+ (failed|errors?)' | awk '{ n += $1 } END { print n + 0 }')
skipped=$(echo "$summary" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
if [ "$skipped" -ne 0 ]; then
    echo "python-mpi: $skipped tests skipped in the MPI build"
    failed=$((failed + skipped))
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
fi
echo "python-mpi: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
