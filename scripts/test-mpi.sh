#!/usr/bin/env bash
# The multi-rank suite: builds kvstore-mpi's tests with its `mpi` feature and runs them
# under `mpirun -np 2` and `-np 4` (every rank runs the same tests, in order), then
# checks that a worker dying mid-job ends the job within seconds. Prints one line
# `mpi: N passed, N failed` (a test counts once per run, if it passed on every rank).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-mpi.sh || { echo "mpi: 0 passed, 1 failed"; exit 1; }
# Open MPI refuses root unless told, and needs --oversubscribe for more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
logs=target/test-logs
mkdir -p "$logs"

artifacts=$(cargo test -p kvstore-mpi --features mpi --no-run --message-format=json 2>"$logs/mpi-build.log")
status=$?
bin=$(echo "$artifacts" | python3 scripts/cargo-executables.py | awk '$1 == "mpi" { print $2 }')
if [ "$status" -ne 0 ] || [ -z "$bin" ]; then
    tail -n 30 "$logs/mpi-build.log"
    echo "mpi: 0 passed, 1 failed"
    exit 1
fi
# The fixtures of a worker that dies mid-job and of one that is stuck (test targets that
# plain `cargo test` skips).
early_exit=$(cargo test -p kvstore-mpi --features mpi --test early_exit --no-run --message-format=json \
    2>>"$logs/mpi-build.log" | python3 scripts/cargo-executables.py | awk '$1 == "early_exit" { print $2 }')
stall=$(cargo test -p kvstore-mpi --features mpi --test stall --no-run --message-format=json \
    2>>"$logs/mpi-build.log" | python3 scripts/cargo-executables.py | awk '$1 == "stall" { print $2 }')
async_stall=$(cargo test -p kvstore-mpi --features mpi --test async_stall --no-run --message-format=json \
    2>>"$logs/mpi-build.log" | python3 scripts/cargo-executables.py | awk '$1 == "async_stall" { print $2 }')
async_early=$(cargo test -p kvstore-mpi --features mpi --test async_early_finish --no-run --message-format=json \
    2>>"$logs/mpi-build.log" | python3 scripts/cargo-executables.py | awk '$1 == "async_early_finish" { print $2 }')
if [ -z "$early_exit" ] || [ -z "$stall" ] || [ -z "$async_stall" ] || [ -z "$async_early" ]; then
    tail -n 30 "$logs/mpi-build.log"
    echo "mpi: 0 passed, 1 failed"
    exit 1
fi

passed=0
failed=0
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
    ok_ranks=0
    n=0
    f=0
    for file in $(find "$ranks" -name stdout 2>/dev/null); do
        read -r rp rf < <(bash scripts/count-results.sh cargo "$file")
        if grep -q '^test result: ok\. ' "$file" && [ "$rf" -eq 0 ]; then
            ok_ranks=$((ok_ranks + 1))
            n=$rp
        fi
        [ "$rf" -gt "$f" ] && f=$rf
    done
    if [ "$rc" -eq 0 ] && [ "$ok_ranks" -eq "$np" ] && [ "${n:-0}" -gt 0 ]; then
        echo "mpirun -np $np${bucket:+ with $bucket-byte buckets, no shared memory}: $n tests passed on every rank"
        passed=$((passed + n))
    else
        echo "mpirun -np $np${bucket:+ with $bucket-byte buckets}: exit $rc, $ok_ranks of $np ranks ok (logs: $out, $ranks)"
        tail -n 40 "$out"
        cat $(find "$ranks" -name stdout 2>/dev/null) | grep -E 'panicked|FAILED' | head -20
        failed=$((failed + (f > 0 ? f : 1)))
    fi
done

# A check that passed, with what it says; one that failed, with what it says and the
# end of its log.
pass() { echo "$1"; passed=$((passed + 1)); }
fail() { echo "$1"; tail -n 20 "$2"; failed=$((failed + 1)); }

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

# A worker that is alive but stuck (one of three), before a push and before finalize:
# with a 3 s timeout the job ends within seconds, the waiting ranks naming the stuck rank
# and the call.
stuck() {
    local at=$1 said=$2 log="$logs/mpi-stall-$1.log" start rc elapsed
    start=$(date +%s)
    KVSTORE_STALL_AT=$at KVSTORE_TIMEOUT=3 timeout 100 "${MPIRUN[@]}" -x KVSTORE_TIMEOUT -x KVSTORE_STALL_AT -np 3 \
        "$stall" >"$log" 2>&1
    rc=$?
    elapsed=$(($(date +%s) - start))
    if [ "$rc" -eq 86 ] && [ "$elapsed" -lt 30 ] && grep -q "$said" "$log" && ! grep -q "returned although" "$log"; then
        pass "a worker stuck before $at ended the job in ${elapsed} s: $(grep -m1 "$said" "$log")"
    else
        fail "a worker stuck before $at: exit $rc after ${elapsed} s (86: the watchdog; 124: the job hung)" "$log"
    fi
}
stuck push "push #2 has waited 3 s for rank 2, which never arrived"
stuck finalize "finalize has waited 3 s for rank 2, which never arrived"

# dist_async: a rank whose process stops (its serving thread too) while the others pull
# keys it owns: with a 3 s timeout the job ends within seconds, a waiting rank naming it.
log="$logs/mpi-async-stall.log"
start=$(date +%s)
KVSTORE_TIMEOUT=3 timeout 100 "${MPIRUN[@]}" -x KVSTORE_TIMEOUT -np 3 "$async_stall" >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
said="waited 3 s for rank 2 to answer a dist_async request"
if [ "$rc" -eq 86 ] && [ "$elapsed" -lt 30 ] && grep -q "$said" "$log" && ! grep -q "returned although" "$log"; then
    pass "a dist_async rank that stopped ended the job in ${elapsed} s: $(grep -m1 "$said" "$log")"
else
    fail "a dist_async rank that stopped: exit $rc after ${elapsed} s (86: the timeout; 124: the job hung)" "$log"
fi

# dist_async next to dist_sync: a rank inside a blocking dist_sync call answers no
# dist_async request (documented); the job ends after the timeout, and the messages say why.
log="$logs/mpi-async-in-dist-sync.log"
start=$(date +%s)
KVSTORE_TIMEOUT=3 timeout 100 "${MPIRUN[@]}" -x KVSTORE_TIMEOUT -np 2 "$async_stall" dist_sync >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
said="a rank inside a blocking dist_sync call answers no dist_async request"
if [ "$rc" -eq 86 ] && [ "$elapsed" -lt 30 ] && grep -q "$said" "$log" && ! grep -q "went on although" "$log"; then
    pass "a dist_async request to a rank inside a dist_sync call ended the job in ${elapsed} s, saying why"
else
    fail "a dist_async request to a rank inside a dist_sync call: exit $rc after ${elapsed} s (86: the timeout; 124: the job hung)" "$log"
fi

# dist_async: a rank that finalizes right after its last call goes on answering the
# pulls of a rank that is still working, until that one finalizes too.
log="$logs/mpi-async-early-finish.log"
timeout 100 "${MPIRUN[@]}" -np 2 "$async_early" >"$log" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && grep -q "every one saw its push" "$log"; then
    pass "a dist_async rank that finished early kept answering: $(grep -m1 "pulls after" "$log")"
else
    fail "a dist_async rank that finished early: exit $rc (124: the job hung)" "$log"
fi

# A worker that dies mid-job: the job must end, with an error, within seconds; once
# while the survivor waits in a blocking push, once with non-blocking pushes queued.
for mode in blocking nonblocking; do
    start=$(date +%s)
    if [ "$mode" = nonblocking ]; then
        KVSTORE_EARLY_EXIT_NONBLOCKING=1 timeout 60 "${MPIRUN[@]}" -x KVSTORE_EARLY_EXIT_NONBLOCKING -np 2 \
            "$early_exit" >"$logs/mpi-early-exit-$mode.log" 2>&1
    else
        timeout 60 "${MPIRUN[@]}" -np 2 "$early_exit" >"$logs/mpi-early-exit-$mode.log" 2>&1
    fi
    rc=$?
    elapsed=$(($(date +%s) - start))
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -lt 30 ] \
        && ! grep -q "push returned" "$logs/mpi-early-exit-$mode.log"; then
        pass "a worker that died ($mode pushes) ended the job in ${elapsed} s (exit $rc)"
    else
        fail "a worker that died ($mode pushes): exit $rc after ${elapsed} s (124: the job hung)" \
            "$logs/mpi-early-exit-$mode.log"
    fi
done

echo "mpi: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
