#!/usr/bin/env bash
# The multi-rank suite: kvstore-mpi's tests with its `mpi` feature, run by cargo-nextest
# one at a time (profile `mpi` of .config/nextest.toml): tests/mpi/ (every case as an MPI
# job of its own on 2 and 4 ranks and with 256-byte buckets, the settings that are not
# numbers, ranks with shared memory on and off), tests/faults.rs (jobs in which a
# worker dies, is stuck or stops) and tests/jvm.rs (the Clojure examples under mpirun,
# over target/kvstore-mpi.jar, which this script builds first as `make jar
# FEATURES=mpi` does). nextest's JUnit XML is the suite's report, in
# ${KVSTORE_REPORTS:-target/test-reports/mpi}; prints `mpi: N passed, N failed`.
#
# It rebuilds target/release/libkvstore_jni.so with MPI: `make test` runs it after the
# suites that build the default jar.
set -uo pipefail
cd "$(dirname "$0")/.."
reports=${KVSTORE_REPORTS:-target/test-reports/mpi}
rm -rf "$reports"
mkdir -p "$reports"
mkdir -p target/test-logs
if ! bash scripts/setup-mpi.sh; then
    python3 scripts/junit.py case "$reports" "Open MPI" "scripts/setup-mpi.sh failed"
elif ! bash scripts/setup-jvm.sh >target/test-logs/mpi-jar.log 2>&1 ||
    ! cargo build --release -p kvstore-jni --features mpi >>target/test-logs/mpi-jar.log 2>&1 ||
    ! KVSTORE_ARTIFACT=kvstore-mpi bash scripts/jar.sh >>target/test-logs/mpi-jar.log 2>&1; then
    tail -n 40 target/test-logs/mpi-jar.log
    python3 scripts/junit.py case "$reports" "the MPI jar" "log: target/test-logs/mpi-jar.log"
else
    # (cargo-nextest: installed once into cargo's bin folder when missing, as test.sh does.)
    cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest@0.9.151
    rm -f target/nextest/mpi/junit.xml
    cargo nextest run -p kvstore-mpi --features mpi --profile mpi --test mpi --test faults --test jvm
    status=$?
    cp target/nextest/mpi/junit.xml "$reports/" 2>/dev/null
    python3 scripts/junit.py ran "$reports" "the MPI tests" "$status" "$reports/junit.xml"
fi
python3 scripts/junit.py total --name mpi "$reports"
