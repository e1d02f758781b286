#!/usr/bin/env bash
# The multi-rank suite: builds kvstore-mpi's tests with its `mpi` feature and runs them
# under `mpirun -np 2` and `-np 4` (every rank runs the same tests, in order), checks
# that bad settings are refused and that ranks with shared memory on and off agree,
# then runs the fault tests (tests/faults.rs: jobs in which a worker dies, is stuck or
# stops, each spawning `mpirun` itself). Every test and check is a test case in
# ${KVSTORE_REPORTS:-target/test-reports/mpi} (a test of a run, once, passed if it passed
# on every rank); prints one line `mpi: N passed, N failed` that totals them.
set -uo pipefail
cd "$(dirname "$0")/.."
reports=${KVSTORE_REPORTS:-target/test-reports/mpi}
rm -rf "$reports"
mkdir -p "$reports"
# A check that passed, with what it says; one that failed, with what it says and the
# end of its log; the suite's totals.
pass() { echo "$1"; python3 scripts/junit.py case "$reports" "$1"; }
fail() { echo "$1"; [ -n "${2:-}" ] && tail -n 20 "$2"; python3 scripts/junit.py case "$reports" "$1" "${2:+log: $2}"; }
totals() { python3 scripts/junit.py total --name mpi "$reports"; }
bash scripts/setup-mpi.sh || { fail "Open MPI: scripts/setup-mpi.sh failed"; totals; exit 1; }
# Open MPI refuses root unless told, and needs --oversubscribe for more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
logs=target/test-logs
mkdir -p "$logs"

artifacts=$(cargo test -p kvstore-mpi --features mpi --no-run --message-format=json 2>"$logs/mpi-build.log")
status=$?
bin=$(echo "$artifacts" | python3 scripts/cargo-executables.py | awk '$1 == "mpi" { print $2 }')
if [ "$status" -ne 0 ] || [ -z "$bin" ]; then
    fail "the MPI tests build" "$logs/mpi-build.log"
    totals
    exit 1
fi
faults=$(echo "$artifacts" | python3 scripts/cargo-executables.py | awk '$1 == "faults" { print $2 }')
if [ -z "$faults" ]; then
    fail "the MPI fault tests build" "$logs/mpi-build.log"
    totals
    exit 1
fi

# np 2 and 4 with the default 4 MiB buckets; then np 2 with 256-byte buckets from the
# environment, so that every case also runs with keys split over many buckets, and with
# fused sums through MPI's messages instead of the machine's shared memory
# (KVSTORE_MPI_SHARED_MEMORY=0; the other runs use it, all their ranks being here). On 4
# ranks MPI's allreduce is told to use its ring, which sums each part of a buffer in
# another order: a key must still get the same bits alone and fused with others.
for run in 2 4 2:256; do
    np=${run%%:*}
    bucket=
    [ "$run" != "$np" ] && bucket=${run#*:}
    name="np$np${bucket:+-bucket$bucket}"
    out="$logs/mpi-$name.log"
    ranks="$logs/mpi-$name"
    rm -rf "$ranks"
    ring=()
    [ "$np" -ge 3 ] && ring=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
    # Each rank writes its own file (interleaved output would split result lines).
    env ${bucket:+KVSTORE_MPI_BUCKET_BYTES=$bucket KVSTORE_MPI_SHARED_MEMORY=0} timeout 300 "${MPIRUN[@]}" "${ring[@]}" \
        ${bucket:+-x KVSTORE_MPI_BUCKET_BYTES -x KVSTORE_MPI_SHARED_MEMORY} --output-filename "$ranks" -np "$np" "$bin" --test-threads=1 --color never >"$out" 2>&1
    rc=$?
    # Each rank's results, as the test harness printed them (Rust's harness has no other
    # report outside nightly): a test of the run passes if it passed on every rank.
    mapfile -t outputs < <(find "$ranks" -name stdout 2>/dev/null | sort)
    python3 scripts/junit.py libtest "$reports" "$name" "${outputs[@]}"
    what="mpirun -np $np${bucket:+ with $bucket-byte buckets, no shared memory}"
    if [ "$rc" -eq 0 ] && [ "${#outputs[@]}" -eq "$np" ]; then
        echo "$what: every rank finished"
    else
        fail "$what: exit $rc, ${#outputs[@]} of $np ranks wrote their results (logs: $out, $ranks)" "$out"
        cat "${outputs[@]}" 2>/dev/null | grep -E 'panicked|FAILED' | head -20
    fi
done

# A setting that is not a number (or not 0 or 1) is an error naming its variable (one
# process, the test of that setting alone): the bucket size, the stall timeout and the
# shared-memory switch.
bad_setting() {
    local var=$1 value=$2 test=$3 log="$logs/mpi-bad-$1.log"
    if env "$var=$value" timeout 120 "$bin" --exact "$test" >"$log" 2>&1 && grep -q "1 passed" "$log"; then
        pass "$var=$value is refused with a clear error"
    else
        fail "$var=$value: FAILED" "$log"
    fi
}
bad_setting KVSTORE_MPI_BUCKET_BYTES lots bucket_bytes_come_from_the_environment
bad_setting KVSTORE_TIMEOUT soon timeout_comes_from_the_environment
bad_setting KVSTORE_MPI_SHARED_MEMORY maybe shared_memory_comes_from_the_environment

# Ranks started with shared memory on and off (mpirun's MPMD form): the first fused sum
# agrees on MPI's messages for all, instead of one rank waiting at a barrier the other
# never reaches.
log=$logs/mpi-shared-memory-mixed.log
tests=(--test-threads=1 --exact a_key_sums_alike_alone_and_fused zz_finalize_mpi)
if timeout 120 "${MPIRUN[@]}" -x KVSTORE_MPI_SHARED_MEMORY=1 -np 1 "$bin" "${tests[@]}" : \
    -x KVSTORE_MPI_SHARED_MEMORY=0 -np 1 "$bin" "${tests[@]}" >"$log" 2>&1 &&
    [ "$(grep -c '2 passed' "$log")" -eq 2 ]; then
    pass "ranks started with shared memory on and off agree on MPI's messages"
else
    fail "ranks started with shared memory on and off: FAILED (124: the job hung)" "$log"
fi

# Jobs in which a worker dies, is stuck or stops (one job per test, so one at a time).
log=$logs/mpi-faults.log
"$faults" --test-threads=1 --color never >"$log" 2>&1
python3 scripts/junit.py libtest "$reports" faults "$log"
grep -E '^test .* (ok|FAILED)$' "$log"
grep -q '^test result: ok\.' "$log" || grep -A 30 -- '---- ' "$log" | head -60

totals
