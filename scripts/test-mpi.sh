#!/usr/bin/env bash
# The multi-rank suite: kvstore-mpi's tests with its `mpi` feature, run by cargo-nextest
# one at a time (profile `mpi` of .config/nextest.toml): its own unit tests, tests/mpi/ (every case as an MPI
# job of its own on 2 and 4 ranks and with 256-byte buckets, the settings that are not
# numbers, ranks with shared memory on and off), tests/faults.rs (jobs in which a worker
# dies, is stuck or stops), tests/timeline.rs (a job with a slow rank, its merged
# timeline and stats) and tests/jvm.rs (the Clojure examples under mpirun, over
# target/kvstore-mpi.jar, which this script builds first as `make jar FEATURES=mpi`
# does). nextest's JUnit XML is the suite's report, in
# ${KVSTORE_REPORTS:-target/test-reports/mpi}; prints `mpi: N passed, N failed`.
#
# It rebuilds target/release/libkvstore_jni.so with MPI: `make test` runs it after the
# suites that build the default jar.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init mpi
bash scripts/setup-mpi.sh >"$logs/mpi-setup.log" 2>&1 || give_up "Open MPI" "$logs/mpi-setup.log"
bash scripts/setup-jvm.sh >"$logs/mpi-jvm-setup.log" 2>&1 || give_up "Clojure" "$logs/mpi-jvm-setup.log"
{ cargo build --release -p kvstore-jni --features mpi && KVSTORE_ARTIFACT=kvstore-mpi bash scripts/jar.sh; } \
    >"$logs/mpi-jar.log" 2>&1 || give_up "the MPI jar" "$logs/mpi-jar.log"
# (cargo-nextest: installed once into cargo's bin folder when missing, as test.sh does.)
cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest@0.9.151
rm -f target/nextest/mpi/junit.xml
cargo nextest run -p kvstore-mpi --features mpi --profile mpi --lib --test mpi --test faults --test timeline --test commits --test jvm
status=$?
cp target/nextest/mpi/junit.xml "$reports/" 2>/dev/null
ran "the MPI tests" "$status" "$reports/junit.xml"
totals
