#!/usr/bin/env bash
# dist_sync from Python, with the wheel of `make python` (its MPI module):
#   - as a new user meets it (scripts/fresh-venv-mpi.sh, in a private mount namespace
#     where the system's Open MPI is hidden): a fresh virtualenv, `pip install WHEEL`
#     without MPI, then `pip install "WHEEL[mpi]"` (Open MPI from the package index), a
#     2-rank job under the venv's mpirun and a kvstore-run job whose rank is killed;
#   - with the system's Open MPI (KVSTORE_MPI=system, its mpirun on PATH), in a
#     virtualenv (target/py-mpi-venv, kept between runs; the wheel is reinstalled every
#     run): kvstore-py/tests/test_dist.py, which starts 2-rank jobs under mpirun:
#     bit-identical training on every rank, desync errors, the KVSTORE_TIMEOUT watchdog,
#     a rank that raises. Then gluon's Trainer over dist_sync
#     (kvstore-py/tests/test_dist_gluon.py: kvstore.mxnet under mpirun,
#     update_on_kvstore True and False, against one process; and test_gluon_resume.py: a
#     Trainer job resumed by kvstore-run after a rank was killed) in
#     target/py-mxnet-mpi-venv (mxnet 1.9.1, numpy<1.24, pytest; kept between runs,
#     rebuilt when missing, broken or made for other requirements: scripts/suite.sh's
#     ready_venv).
# KVSTORE_REQUIRE_MPI=1 makes a run without MPI (or a venv without mxnet) fail instead
# of skip. Every test is a test case in
# ${KVSTORE_REPORTS:-target/test-reports/python-mpi} (pytest's JUnit XML reports); prints
# one line `python-mpi: N passed, N failed` that totals them.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init python-mpi
# The MPI build must run everything: a skipped test is a failure.
skips_fail=1
export KVSTORE_REQUIRE_MPI=1
venv=target/py-mpi-venv
wheel=$(bash scripts/python-wheel.sh 2>"$logs/python-mpi-wheel.log" | tail -n 1) ||
    give_up "make python" "$logs/python-mpi-wheel.log"
wheel=$root/$wheel

# As a new user meets it: a machine without MPI (the system's hidden), a fresh venv.
fresh=$logs/python-mpi-fresh-venv.log
if unshare --mount --propagation private true 2>/dev/null; then
    unshare --mount --propagation private bash scripts/fresh-venv-mpi.sh "$wheel" "$root/target/py-fresh-venv" \
        "$logs/python-mpi-fresh-venv.results" >"$fresh" 2>&1
    while read -r verdict name; do
        if [ "$verdict" = ok ]; then pass "fresh venv: $name"; else fail "fresh venv: $name" "$fresh"; fi
    done <"$logs/python-mpi-fresh-venv.results"
    grep -q "kvstore-run resumes a job whose rank was killed" "$logs/python-mpi-fresh-venv.results" ||
        fail "fresh venv: the transcript ran to its end" "$fresh"
else
    fail "fresh venv: a private mount namespace (unshare --mount, which needs root)"
fi

# The system's Open MPI from here on (its mpirun on PATH).
export KVSTORE_MPI=system
make_venv() {
    python3 -m venv "$1" && "$1/bin/pip" install --quiet --upgrade pip && "$1/bin/pip" install --quiet pytest
}
cached_venv "$venv" pytest "import pytest" make_venv >"$logs/python-mpi-venv.log" 2>&1 ||
    give_up "making $venv" "$logs/python-mpi-venv.log"
"$venv/bin/pip" install --quiet --force-reinstall "$wheel" >"$logs/python-mpi-install.log" 2>&1 ||
    give_up "pip install $wheel" "$logs/python-mpi-install.log"
export TMPDIR=$root/target/py-mpi-tmp
rm -rf "$TMPDIR"
mkdir -p "$TMPDIR"

run_pytest pytest "$venv" bin/python "$root/kvstore-py/tests/test_dist.py"

# gluon over dist_sync: MXNet 1.9.1 in a cached venv (scripts/suite.sh's ready_venv).
mxnet_venv=target/py-mxnet-mpi-venv
mxlog=$logs/python-mpi-mxnet-venv.log
if ready_venv mxnet "$mxnet_venv" "$wheel" >"$mxlog" 2>&1; then
    run_pytest gluon "$mxnet_venv" bin/python -W ignore::DeprecationWarning "$root/kvstore-py/tests/test_dist_gluon.py" \
        "$root/kvstore-py/tests/test_gluon_resume.py"
else
    fail "setting up $mxnet_venv (mxnet 1.9.1)" "$mxlog"
fi

# kvstore.torch over dist_sync (kvstore-py/tests/test_torch_dp_dist.py: the digits
# example on 2 ranks, against 1; and test_torch_resume.py: DataParallel jobs resumed by
# kvstore-run after a rank was killed): Debian's PyTorch in target/py-torch-mpi-venv
# (cached too), with the same wheel.
torch_venv=target/py-torch-mpi-venv
torchlog=$logs/python-mpi-torch-venv.log
if ready_venv torch "$torch_venv" "$wheel" >"$torchlog" 2>&1; then
    KVSTORE_REQUIRE_TORCH=1 run_pytest torch "$torch_venv" bin/python "$root/kvstore-py/tests/test_torch_dp_dist.py" \
        "$root/kvstore-py/tests/test_torch_resume.py"
else
    fail "setting up $torch_venv (Debian's python3-torch, python3-sklearn)" "$torchlog"
fi

rm -rf "$TMPDIR"
totals
