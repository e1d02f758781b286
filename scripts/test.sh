#!/usr/bin/env bash
# Runs the checks and suites of `make test` and ends with one line `N passed, N failed`
# that totals them. Every suite reports its tests as JUnit XML under target/test-reports/
# (SUITE/), and scripts/junit.py totals those files: each static check (fmt, clippy, doc,
# native, jar, ...) is one test case, by its exit status; each test of the cargo suites
# (cargo-nextest's report; the doc tests are one check), of the JVM side (JUnit,
# clojure.test, the examples, the Leiningen, deps.edn and Maven projects), of Python and
# of MPI (jobs on 2 and 4 ranks, the fault tests, chaos) is one or more cases of
# its suite's reports. A suite that exits with an error but reports no failed case counts
# one failure more.
#
#   scripts/test.sh [GROUP...]     the groups, in this order (default: all of them):
#     static    fmt, clippy, doc, the README's bench table, the documents' links and claims
#     rust      every cargo test of the workspace (with NVRTC; the GPU tests skip)
#     java      the native library and the jar, JUnit and the Java example, javadoc
#     clojure   the native library and the jar, clojure.test, the examples, the tools
#     projects  the native library and the jar, the projects of the README and docs/
#     python    the Python package's suite, with numpy, PyTorch and MXNet 1.9.1
#     mpi       kvstore-mpi under mpirun, Python and the JVM under mpirun, chaos
# `make test-rust`, `make test-java`, ... run one group each.
#
# The run has a TMPDIR of its own (a new folder kvstore-test.* in the system's), and
# ends with a no-litter check of that folder: what a suite leaves there is its own.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
all_groups=(static rust java clojure projects python mpi)
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=("${all_groups[@]}")
for g in "${groups[@]}"; do
    [[ " ${all_groups[*]} " == *" $g "* ]] || { echo "test.sh: unknown group $g (the groups: ${all_groups[*]})" >&2; exit 2; }
done
wants() { [[ " ${groups[*]} " == *" $1 "* ]]; }

# The run's own temporary folder: programs that honour TMPDIR (Rust's temp_dir, Python's
# tempfile, mktemp, the JVM suites through -Djava.io.tmpdir) put their files there. It
# is outside the clone: cargo projects made under it must not see this workspace.
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/kvstore-test.XXXXXX")
export TMPDIR

# Each check (`check NAME COMMAND...`, scripts/suite.sh) is one test case of the suite
# `checks`, passed when its command exits with 0.
rm -rf target/test-reports
suite_init checks

# A suite: a script that writes JUnit XML into $KVSTORE_REPORTS (target/test-reports/NAME).
# Its exit status counts too: an error with no failed case is one failed case more.
suite() {
    local name=$1 dir=$root/target/test-reports/$1
    shift
    KVSTORE_REPORTS=$dir "$@" 2>&1 | tee "$logs/$name.log"
    local status=${PIPESTATUS[0]} totals
    # (The suite printed its own totals.)
    python3 scripts/junit.py total --name "$name" "$dir" >/dev/null 2>&1
    totals=$?
    if [ "$totals" -eq 2 ]; then
        python3 scripts/junit.py case "$dir" "$name: the suite" "no test ran (exit status $status)"
    elif [ "$totals" -eq 0 ] && [ "$status" -ne 0 ]; then
        echo "$name exited with status $status without a failing test"
        python3 scripts/junit.py case "$dir" "$name: the suite" "exit status $status"
    fi
}

# The cargo suites, run by cargo-nextest: every test runs, in a process of its own, even
# after a failure, and its JUnit XML report is target/nextest/ci/junit.xml
# (.config/nextest.toml).
cargo_tests() {
    rm -f target/nextest/ci/junit.xml
    cargo nextest run --workspace --profile ci
    local status=$?
    mkdir -p "$KVSTORE_REPORTS"
    cp target/nextest/ci/junit.xml "$KVSTORE_REPORTS/" 2>/dev/null
    python3 scripts/junit.py total --name cargo "$KVSTORE_REPORTS"
    return "$status"
}

if wants static; then
    check fmt cargo fmt --all -- --check
    check clippy cargo clippy --workspace --all-targets -- -D warnings
    check doc env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
    # The README's performance table and docs/benchmarks.md's results are the ones the
    # results files give, and the links
    # of the README, ARCHITECTURE.md and the guides under docs/ lead somewhere.
    check readme-bench-table python3 bench/table.py --check README.md docs/benchmarks.md
    check doc-links python3 scripts/check_doc_links.py
    # What the guides claim and run: every program block run by the projects group,
    # mpirun lines that say what root and small machines need, counts that agree.
    check docs python3 scripts/check_docs.py
    # The reports' own tool: cases recorded twice, long names, totals.
    check junit-tool python3 scripts/test_junit.py
fi

if wants rust; then
    # NVRTC from PyPI (no GPU needed): kvstore-cuda's kernels are compiled with it by
    # kvstore-cuda/tests/nvrtc.rs, which must then not skip.
    check nvrtc bash scripts/setup-nvrtc.sh
    nvrtc=$(tail -n 1 "$logs/checks-nvrtc.log")
    if [ -f "$nvrtc/libnvrtc.so.13" ]; then
        export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KVSTORE_REQUIRE_NVRTC=1
    fi

    # The cargo suites (cargo-nextest, installed once into cargo's bin folder), then the
    # doc tests, which nextest does not run, as one check.
    check nextest bash -c 'cargo nextest --version || cargo install --locked cargo-nextest@0.9.151'
    suite cargo cargo_tests
    check doctests cargo test --workspace --doc
fi

# The JVM side: build the native library and the jar once, then each suite.
if wants java || wants clojure || wants projects; then
    check native cargo build --release -p kvstore-jni
    check jar bash scripts/jar.sh
    if [ -f target/kvstore.jar ]; then
        wants java && suite junit bash scripts/test-java.sh
        wants clojure && suite clojure bash scripts/test-clojure.sh
        wants clojure && suite clojure-tools bash scripts/clojure-smoke.sh
        # The projects of the README and the guides (the quickstarts, deps.edn,
        # Leiningen, Maven, the GPU and dist_sync programs), offline.
        wants projects && suite user-projects bash scripts/test-user-projects.sh
    fi
    wants java && check javadoc bash scripts/javadoc.sh
fi

# Python: `pip install ./kvstore-py` into a fresh virtualenv, `import kvstore`, then its
# pytest suite (numpy, PyTorch and MXNet 1.9.1 arrays, dist_sync under mpirun).
if wants python; then
    suite python bash scripts/test-python.sh
fi

if wants mpi; then
    # Multi-rank: kvstore-mpi with its `mpi` feature (Open MPI from Debian), under mpirun,
    # and the JVM under mpirun over target/kvstore-mpi.jar (make jar FEATURES=mpi). It
    # rebuilds the JNI library with MPI, so it runs after every suite of the default jar.
    check clippy-mpi bash -c 'bash scripts/setup-mpi.sh && cargo clippy -p kvstore-mpi -p kvstore-jni --features kvstore-mpi/mpi,kvstore-jni/mpi --all-targets -- -D warnings'
    suite mpi bash scripts/test-mpi.sh
    # Python under mpirun: the wheel's MPI module, in a fresh venv with Open MPI from the
    # package index (the system's hidden), then over the system's Open MPI: 2-rank jobs.
    suite python-mpi bash scripts/test-python-mpi.sh
    # The guides' programs that need those MPI builds (docs/recovery.md's training loop in
    # five programs, each under kvstore-run with a rank killed), as the projects group
    # runs the others.
    suite doc-mpi bash scripts/test-doc-mpi.sh
    # Chaos, a bounded slice (6 runs; `make chaos` runs 100): a 4-rank training job that
    # checkpoints, with a random rank killed or stopped; it must end, its checkpoints
    # load and a job resumed from the latest trains on.
    # (kvstore-mpi/tests/chaos/: the suite runs itself under mpirun as the job.)
    suite chaos bash -c 'bash scripts/setup-mpi.sh >/dev/null 2>&1 &&
        KVSTORE_CHAOS_RUNS=6 cargo test -q -p kvstore-mpi --features mpi --test chaos'
fi

# No litter: every suite removes its temporary files from the run's TMPDIR. Not counted:
# the JVM's hsperfdata_* folder and Open MPI's session folder ompi.<host>.<uid>, each the
# runtime's own, shared by its processes and reused (Open MPI's outlives a job whose
# ranks the chaos suite kills).
litter=$(ls -A "$TMPDIR" | grep -v -e '^hsperfdata_' -e '^ompi\.' || true)
if [ -z "$litter" ]; then
    pass no-litter
else
    echo "no-litter: FAILED (left in $TMPDIR after the run):"
    echo "$litter" | sed 's/^/    /'
    record no-litter "left in $TMPDIR: $(echo $litter)"
fi
rm -rf "$TMPDIR"

python3 scripts/junit.py total target/test-reports
