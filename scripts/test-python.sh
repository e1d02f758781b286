#!/usr/bin/env bash
# The Python package: installs kvstore-py into a fresh virtualenv the way a user does
# (`pip install ./kvstore-py`: pip fetches maturin and builds the native module), checks
# `import kvstore`, then runs its pytest suite and examples. Prints one line
# `python: N passed, N failed`. The virtualenv (target/py-venv) is rebuilt each run;
# pip's download cache makes later runs quick.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=target/test-logs
mkdir -p "$logs"
venv=target/py-venv
# pip and maturin build under TMPDIR: keep their files out of /tmp.
export TMPDIR=$PWD/target/py-tmp
rm -rf "$venv" "$TMPDIR"
mkdir -p "$TMPDIR"
fail() {
    echo "$1"
    tail -n 40 "$2" | sed 's/^/  /'
    echo "python: 0 passed, 1 failed"
    rm -rf "$TMPDIR"
    exit 1
}
python3 -m venv "$venv" >"$logs/python-venv.log" 2>&1 || fail "python3 -m venv failed" "$logs/python-venv.log"
"$venv/bin/pip" install --quiet --upgrade pip >"$logs/python-pip.log" 2>&1 || fail "pip upgrade failed" "$logs/python-pip.log"
"$venv/bin/pip" install ./kvstore-py >"$logs/python-install.log" 2>&1 ||
    fail "pip install ./kvstore-py failed" "$logs/python-install.log"
version=$("$venv/bin/python" -c "import kvstore; print(kvstore.__version__)" 2>"$logs/python-import.log") ||
    fail "import kvstore failed" "$logs/python-import.log"
if [ "$version" != "$(bash scripts/version.sh)" ]; then
    echo "kvstore.__version__ is $version, the workspace version is $(bash scripts/version.sh)"
    echo "python: 0 passed, 1 failed"
    exit 1
fi
"$venv/bin/pip" install --quiet pytest hypothesis ml_dtypes >"$logs/python-deps.log" 2>&1 ||
    fail "installing pytest, hypothesis and ml_dtypes failed" "$logs/python-deps.log"
# Run from outside the source tree, so that the installed package is the one tested.
(cd "$venv" && bin/python -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 "$OLDPWD/kvstore-py/tests") \
    2>&1 | tee "$logs/python-pytest.log"
status=${PIPESTATUS[0]}
summary=$(tail -n 1 "$logs/python-pytest.log")
passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
failed=$(echo "$summary" | grep -oE '[0-9]+ (failed|errors?)' | awk '{ n += $1 } END { print n + 0 }')
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
fi
# The install route itself counts as one test.
passed=$((passed + 1))
rm -rf "$TMPDIR"
echo "python: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
