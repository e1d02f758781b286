#!/usr/bin/env bash
# The Python package: builds kvstore-py's wheel once the way pip does for a user
# (`pip wheel ./kvstore-py`: pip fetches maturin and builds the native module), installs
# it into a fresh virtualenv (target/py-venv), checks `import kvstore`, and runs its
# pytest suite there. Then runs the interop tests (test_interop.py) against the
# libraries themselves, with the same wheel:
#   - target/py-mxnet-venv: mxnet 1.9.1 and numpy<1.24, where the MXNet tests must run
#     (KVSTORE_REQUIRE_MXNET=1 turns a failed `import mxnet` into a failure), with
#     kvstore.mxnet's tests (test_mxnet_dropin.py, test_mxnet_examples.py);
#   - target/py-torch-venv: Debian's python3 with Debian's python3-torch (CPU, small;
#     PyPI's torch is the 5 GB CUDA build), KVSTORE_REQUIRE_TORCH=1 likewise, with
#     kvstore.torch's tests (test_torch_dp.py).
# Those two venvs are kept between runs (rebuilt when missing, broken or made for other
# requirements); the kvstore wheel is reinstalled into them every run. Installs the
# Debian packages they need (python3-torch, python3-venv, MXNet's libgomp1 and
# libquadmath0) through scripts/apt-install.sh.
# Every test and step is a test case in ${KVSTORE_REPORTS:-target/test-reports/python}
# (pytest's JUnit XML reports among them); prints one line `python: N passed, N failed`
# that totals them.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=target/test-logs
mkdir -p "$logs"
venv=target/py-venv
wheels=target/py-wheels
mxnet_venv=target/py-mxnet-venv
torch_venv=target/py-torch-venv
# What the cached venvs are made of: a venv made for other requirements is rebuilt.
mxnet_spec="mxnet==1.9.1 numpy<1.24 pytest"
torch_spec="debian-python3-torch pytest ml_dtypes<0.5 numpy<2"
# pip and maturin build under TMPDIR: keep their files out of /tmp.
export TMPDIR=$PWD/target/py-tmp
rm -rf "$venv" "$TMPDIR" "$wheels"
mkdir -p "$TMPDIR"
reports=${KVSTORE_REPORTS:-$PWD/target/test-reports/python}
rm -rf "$reports"
mkdir -p "$reports"
# record NAME [WHY]: a test case of this suite, passed, or failed saying why.
record() { python3 scripts/junit.py case "$reports" "$@"; }
finish() {
    rm -rf "$TMPDIR"
    python3 scripts/junit.py total --name python "$reports"
    exit
}
# A step that failed: its message and log's tail, counted as one failure.
step_failed() {
    echo "$1"
    tail -n 40 "$2" | sed 's/^/  /'
    record "$1" "log: $2"
}
fatal() {
    step_failed "$1" "$2"
    finish
}

# Debian's python3 makes venvs only with python3-venv (its ensurepip).
if ! python3 -c "import ensurepip" >/dev/null 2>&1; then
    bash scripts/apt-install.sh python3-venv >"$logs/python-venv.log" 2>&1 ||
        fatal "installing python3-venv failed" "$logs/python-venv.log"
fi
python3 -m venv "$venv" >>"$logs/python-venv.log" 2>&1 || fatal "python3 -m venv failed" "$logs/python-venv.log"
"$venv/bin/pip" install --quiet --upgrade pip >"$logs/python-pip.log" 2>&1 || fatal "pip upgrade failed" "$logs/python-pip.log"
built=$(bash scripts/python-wheel.sh 2>"$logs/python-install.log" | tail -n 1) ||
    fatal "make python failed" "$logs/python-install.log"
mkdir -p "$wheels"
cp "$built" "$wheels/"
wheel=$(ls "$PWD/$wheels"/kvstore-*.whl)
# The wheel installs on any x86_64 Linux with glibc 2.17 or later: auditwheel finds no
# symbol or library it needs beyond manylinux_2_17's. Counts as one test.
if target/py-build/bin/auditwheel show "$wheel" >"$logs/python-auditwheel.log" 2>&1 &&
    tr -s ' \n' ' ' <"$logs/python-auditwheel.log" | grep -q 'is consistent with the following platform tag: "manylinux_2_17_x86_64"'; then
    record "the wheel is manylinux_2_17_x86_64"
else
    echo "python: the wheel is not manylinux_2_17_x86_64 (auditwheel show):"
    sed 's/^/  /' "$logs/python-auditwheel.log"
    record "the wheel is manylinux_2_17_x86_64" "log: $logs/python-auditwheel.log"
fi
"$venv/bin/pip" install "$wheel" >>"$logs/python-install.log" 2>&1 ||
    fatal "pip install of the kvstore wheel failed" "$logs/python-install.log"
version=$("$venv/bin/python" -c "import kvstore; print(kvstore.__version__)" 2>"$logs/python-import.log") ||
    fatal "import kvstore failed" "$logs/python-import.log"
if [ "$version" != "$(bash scripts/version.sh)" ]; then
    echo "kvstore.__version__ is $version, the workspace version is $(bash scripts/version.sh)" >"$logs/python-import.log"
    fatal "wrong version" "$logs/python-import.log"
fi
# The install route itself counts as one test.
record "the wheel installs and imports"
"$venv/bin/pip" install --quiet pytest hypothesis ml_dtypes mypy >"$logs/python-deps.log" 2>&1 ||
    fatal "installing pytest, hypothesis, ml_dtypes and mypy failed" "$logs/python-deps.log"

# Runs pytest with `python` (from outside the source tree, so that the installed package
# is the one tested), logging to target/test-logs/python-pytest-NAME.log, its JUnit XML
# report in $reports/pytest-NAME/report.xml. Usage: run_pytest NAME PYTHON PYTEST-ARGS...
run_pytest() {
    local name=$1 python=$2
    shift 2
    local log=$logs/python-pytest-$name.log report=$reports/pytest-$name/report.xml
    echo "== pytest ($name)"
    (cd "$TMPDIR" && "$python" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
        --junitxml="$report" "$@") 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    python3 scripts/junit.py ran "$reports" "pytest ($name)" "$status" "$report"
}

run_pytest main "$PWD/$venv/bin/python" "$PWD/kvstore-py/tests"

# A cached venv: kept if it was made from `spec` and `check` succeeds in it, else
# rebuilt by `make`. Usage: cached_venv DIR SPEC CHECK-PYTHON-CODE MAKE-FUNCTION
cached_venv() {
    local dir=$1 spec=$2 check=$3 make=$4
    if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.kvstore-spec" 2>/dev/null)" = "$spec" ] &&
        "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
        return 0
    fi
    rm -rf "$dir"
    "$make" "$dir" || return 1
    "$dir/bin/python" -c "$check" || return 1
    echo "$spec" >"$dir/.kvstore-spec"
}

make_mxnet_venv() {
    python3 -m venv "$1" &&
        "$1/bin/pip" install --quiet --upgrade pip &&
        "$1/bin/pip" install --quiet mxnet==1.9.1 'numpy<1.24' pytest
}

make_torch_venv() {
    # Debian's python3 (python3-torch is built for it), seeing its site-packages.
    /usr/bin/python3 -m venv --system-site-packages "$1" &&
        "$1/bin/pip" install --quiet pytest 'ml_dtypes<0.5' 'numpy<2'
}

# Installs the kvstore wheel into a cached venv (every run: the wheel is new).
install_wheel() {
    "$1/bin/pip" install --quiet --force-reinstall --no-deps "$wheel"
}

mxlog=$logs/python-mxnet-venv.log
if bash scripts/apt-install.sh libgomp1 libquadmath0 >"$mxlog" 2>&1 &&
    cached_venv "$mxnet_venv" "$mxnet_spec" "import mxnet, pytest, numpy" make_mxnet_venv >>"$mxlog" 2>&1 &&
    install_wheel "$mxnet_venv" >>"$mxlog" 2>&1; then
    # test_interop.py's MXNet half, and kvstore.mxnet (the drop-in store for MXNet)
    # against MXNet's own store, with its examples.
    KVSTORE_REQUIRE_MXNET=1 run_pytest mxnet "$PWD/$mxnet_venv/bin/python" -W ignore::DeprecationWarning \
        -k "not torch" "$PWD/kvstore-py/tests/test_interop.py" "$PWD/kvstore-py/tests/test_mxnet_dropin.py" \
        "$PWD/kvstore-py/tests/test_mxnet_examples.py"
else
    step_failed "setting up $mxnet_venv (mxnet 1.9.1) failed" "$mxlog"
fi

torchlog=$logs/python-torch-venv.log
if bash scripts/apt-install.sh python3-torch python3-venv >"$torchlog" 2>&1 &&
    cached_venv "$torch_venv" "$torch_spec" "import torch, pytest, numpy, ml_dtypes" make_torch_venv >>"$torchlog" 2>&1 &&
    install_wheel "$torch_venv" >>"$torchlog" 2>&1; then
    KVSTORE_REQUIRE_TORCH=1 run_pytest torch "$PWD/$torch_venv/bin/python" \
        -k "not mxnet" "$PWD/kvstore-py/tests/test_interop.py" "$PWD/kvstore-py/tests/test_torch_dp.py"
else
    step_failed "setting up $torch_venv (Debian's python3-torch) failed" "$torchlog"
fi

finish
