#!/usr/bin/env bash
# `make bench`'s Python rows: kvstore from Python (numpy arrays) and MXNet 1.9.1's own
# store, timed in one process by bench/python.py, written to OUT_JSON (default
# target/bench/python.json) for the report.
#
# Runs in the MXNet venv, target/py-mxnet-venv (mxnet 1.9.1, numpy<1.24; the kvstore
# abi3 wheel imports there too): made when missing, reused when it has mxnet and numpy.
# The kvstore package is built from ./kvstore-py and reinstalled into it each run. When
# MXNet cannot be installed, the kvstore rows are still timed (in the same venv, with
# numpy alone) and the MXNet rows print SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench/python.json}
venv=target/py-mxnet-venv
logs=target/test-logs
mkdir -p "$logs" "$(dirname "$out")"
rm -f "$out"
# pip and maturin build under TMPDIR: keep their files out of /tmp, and apart from the
# test script's (target/py-tmp).
export TMPDIR=$PWD/target/py-bench-tmp
mkdir -p "$TMPDIR"
trap 'rm -rf "$TMPDIR"' EXIT
log=$logs/bench-python-venv.log
: >"$log"
if ! "$venv/bin/python" -c "import mxnet, numpy" >>"$log" 2>&1; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >>"$log" 2>&1
    if ! "$venv/bin/pip" install --quiet mxnet==1.9.1 'numpy<1.24' >>"$log" 2>&1; then
        echo "bench-python: MXNet 1.9.1 did not install (see $log): its rows will be skipped"
        "$venv/bin/pip" install --quiet numpy >>"$log" 2>&1
    fi
fi
# The package as built from this tree (pip fetches maturin; cargo builds in target/).
install_log=$logs/bench-python-install.log
# With the crate's `bench` feature: the Rust-side timing the rows are set against, which
# the shipped wheel leaves out (maturin reads MATURIN_PEP517_ARGS in a pip build).
MATURIN_PEP517_ARGS="--features bench" \
    "$venv/bin/pip" install --quiet --no-deps --force-reinstall ./kvstore-py >"$install_log" 2>&1 || {
    echo "bench-python: pip install ./kvstore-py failed:"
    tail -n 40 "$install_log" | sed 's/^/  /'
    exit 1
}
# From outside the source tree, so that the installed package is the one timed.
script=$PWD/bench/python.py
out_abs=$(realpath -m "$out")
(cd "$venv" && bin/python "$script" "$out_abs")
