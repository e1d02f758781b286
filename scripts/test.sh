#!/usr/bin/env bash
# Runs every check and suite of `make test` and ends with one line
# `N passed, N failed` that totals them: each static check (fmt, clippy, doc, native,
# jar) counts as one, each test of the cargo suites (unit, integration, doc tests) as
# one, and each suite of the JVM side (JUnit, clojure.test, tutorial, Leiningen and
# deps.edn smoke checks), of Python and of MPI (tests under mpirun -np 2 and 4, a dying worker)
# counts as its own script reports.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=target/test-logs
mkdir -p "$logs"
passed=0
failed=0
# What /tmp holds before the run: the run must leave nothing new there.
tmp_before=$(ls -A /tmp | sort)

check() {
    local name=$1
    shift
    if "$@" >"$logs/$name.log" 2>&1; then
        passed=$((passed + 1))
        echo "check $name: ok"
    else
        failed=$((failed + 1))
        echo "check $name: FAILED (last lines of $logs/$name.log):"
        tail -n 40 "$logs/$name.log"
    fi
}

check fmt cargo fmt --all -- --check
check clippy cargo clippy --workspace --all-targets -- -D warnings
check doc env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
# The README's performance table is the one its results files give, and the links of
# the README, ARCHITECTURE.md and the guides under docs/ lead somewhere.
check readme-bench-table python3 scripts/readme_bench_table.py --check README.md
check doc-links python3 scripts/check_doc_links.py

# NVRTC from PyPI (no GPU needed): kvstore-cuda's kernels are compiled with it by
# kvstore-cuda/tests/nvrtc.rs, which must then not skip.
check nvrtc bash scripts/setup-nvrtc.sh
nvrtc=$(tail -n 1 "$logs/nvrtc.log")
if [ -f "$nvrtc/libnvrtc.so.13" ]; then
    export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KVSTORE_REQUIRE_NVRTC=1
fi

# The cargo suites. `--no-fail-fast` runs every test binary even after a failure.
cargo test --workspace --no-fail-fast 2>&1 | tee "$logs/cargo.log"
status=${PIPESTATUS[0]}
read -r p f < <(bash scripts/count-results.sh cargo "$logs/cargo.log")
echo "cargo: $p passed, $f failed"
passed=$((passed + p))
failed=$((failed + f))
if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
    # A build error or a crashed test binary: no test reported the failure.
    echo "cargo test exited with status $status without a failing test (build error?)"
    failed=$((failed + 1))
fi
if [ "$p" -eq 0 ]; then
    echo "no cargo test ran"
    failed=$((failed + 1))
fi

# GPU: kvstore-cuda's tests skip visibly without a CUDA device (make gpu-bundle runs
# them on a GPU machine).
check gpu-skip bash scripts/check-gpu-skip.sh

# The JVM side: build the native library and the jar, then each suite script prints
# one or more lines `<suite>: N passed, N failed`, which are added up here.
check native cargo build --release -p kvstore-jni
check jar bash scripts/jar.sh

suite() {
    local name=$1
    shift
    "$@" 2>&1 | tee "$logs/$name.log"
    local status=${PIPESTATUS[0]}
    local p f
    read -r p f < <(bash scripts/count-results.sh suites "$logs/$name.log")
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "$name exited with status $status without a failing test"
        failed=$((failed + 1))
    fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
        echo "$name ran no test"
        failed=$((failed + 1))
    fi
}

if [ -f target/kvstore.jar ]; then
    suite junit bash scripts/test-java.sh
    suite clojure bash scripts/test-clojure.sh
    suite clojure-tools bash scripts/clojure-smoke.sh
    # The projects of the README and docs/projects.md (the quickstarts, deps.edn,
    # Leiningen, Maven), offline.
    suite user-projects bash scripts/test-user-projects.sh
fi
check javadoc bash scripts/javadoc.sh

# Python: `pip install ./kvstore-py` into a fresh virtualenv, `import kvstore`, then its
# pytest suite (numpy, PyTorch and MXNet 1.9.1 arrays, dist_sync under mpirun).
suite python bash scripts/test-python.sh

# Multi-rank: kvstore-mpi with its `mpi` feature (Open MPI from Debian), under mpirun.
check clippy-mpi bash -c 'bash scripts/setup-mpi.sh && cargo clippy -p kvstore-mpi -p kvstore-jni --features kvstore-mpi/mpi,kvstore-jni/mpi --all-targets -- -D warnings'
suite mpi bash scripts/test-mpi.sh
# Python under mpirun: the kvstore-mpi wheel (make python FEATURES=mpi), 2-rank jobs.
suite python-mpi bash scripts/test-python-mpi.sh
# Chaos, a bounded slice (6 runs; `make chaos` runs 100): a 4-rank training job that
# checkpoints, with a random rank killed or stopped; it must end, its checkpoints load
# and a job resumed from the latest trains on.
suite chaos bash scripts/chaos.sh 6
# The JVM under mpirun: target/kvstore-mpi.jar (make jar FEATURES=mpi) trains
# clojure/examples/dist_train.clj on 2 ranks. It rebuilds the JNI library with MPI,
# so it runs after every suite that uses the default jar.
suite mpi-jvm bash scripts/test-mpi-jvm.sh

# No litter: every suite removes its temporary files (the JVM's hsperfdata_* folder is
# the JVM's own, shared and reused).
litter=$(comm -13 <(echo "$tmp_before") <(ls -A /tmp | sort) | grep -v '^hsperfdata_' || true)
if [ -z "$litter" ]; then
    passed=$((passed + 1))
    echo "check no-litter: ok"
else
    failed=$((failed + 1))
    echo "check no-litter: FAILED (new in /tmp after the run):"
    echo "$litter" | sed 's/^/    /'
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
