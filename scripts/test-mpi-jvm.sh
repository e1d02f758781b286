#!/usr/bin/env bash
# The JVM with MPI: builds target/kvstore-mpi-<version>.jar, linked from
# target/kvstore-mpi.jar (the JNI library with its `mpi` feature, as
# `make jar FEATURES=mpi` does), then
#  1. trains clojure/examples/dist_train.clj under `mpirun -np 2`: both ranks must
#     print the same weights to the last bit, the final loss must be near the noise
#     floor and the weights near the true ones;
#  2. runs it without mpirun: a job of one worker;
#  3. runs clojure/examples/dying_rank.clj under `mpirun -np 2`: a JVM rank that
#     throws must end the job within seconds (never a hang), with a failing status;
#  4. stops dist_train.clj after epoch 5 (--checkpoint-dir, --epochs 5) and restarts it
#     with --resume: it must end with the bits of step 1's job, which never stopped;
#  5. resumes that job's checkpoint in one process (fewer ranks): it must train on;
#  6. runs clojure/examples/async_sum.clj (a dist_async store with a Clojure updater on
#     the owners) under `mpirun -np 2`: every rank must pull every push of every rank;
#  7. runs clojure/examples/refused_rank.clj under `mpirun -np 2`: a disposed array on
#     rank 1 only, in each form of call, must fail that call on both ranks (never a
#     hang, never a later call of one rank met with this one of the other), and both
#     ranks must end with the same values.
# Each check is a test case in ${KVSTORE_REPORTS:-target/test-reports/mpi-jvm}; prints one
# line `mpi-jvm: N passed, N failed` that totals them.
#
# Needs Debian's clojure (scripts/setup-jvm.sh) and Open MPI (scripts/setup-mpi.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
logs=$root/target/test-logs
mkdir -p "$logs"
jar=$root/target/kvstore-mpi.jar
share=/usr/share/java
cp="$jar:$share/clojure.jar:$share/spec.alpha.jar:$share/core.specs.alpha.jar"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
java_opts=(-Dclojure.main.report=stderr)
reports=${KVSTORE_REPORTS:-$root/target/test-reports/mpi-jvm}
rm -rf "$reports"
mkdir -p "$reports"
pass() { echo "$1: ok${2:+ ($2)}"; python3 "$root/scripts/junit.py" case "$reports" "$1"; }
fail() { echo "$1: FAILED${2:+ ($2)}"; python3 "$root/scripts/junit.py" case "$reports" "$1" "${2:-failed}"; }
totals() { python3 "$root/scripts/junit.py" total --name mpi-jvm "$reports"; }

bash scripts/setup-mpi.sh || { fail "Open MPI" "scripts/setup-mpi.sh failed"; totals; exit 1; }
if ! cargo build --release -p kvstore-jni --features mpi >"$logs/mpi-jvm-build.log" 2>&1 ||
    ! KVSTORE_ARTIFACT=kvstore-mpi bash scripts/jar.sh >>"$logs/mpi-jvm-build.log" 2>&1; then
    tail -n 30 "$logs/mpi-jvm-build.log"
    fail "the MPI jar" "log: $logs/mpi-jvm-build.log"
    totals
    exit 1
fi

# The checks of the training run: read from each rank's output, not trusted from
# the demo. $1: the check's name; $2...: the ranks' stdout files.
check_training() {
    local name=$1
    shift
    local verdict
    verdict=$(awk -v ranks="$#" '
        /epoch +[0-9]+ +loss / { loss[FILENAME] = $NF }
        / (w\[[0-9]+\]|b) / { params++; d = $(NF-1) - $NF; if (d < 0) d = -d; if (d > worst) worst = d }
        / bits / { sub(/^rank [0-9]+: bits /, ""); bits[$0]++; nbits++ }
        END {
            if (nbits != ranks) { printf "FAILED: %d of %d ranks printed their weights", nbits, ranks; exit }
            n = 0; for (b in bits) n++
            if (n != 1) { printf "FAILED: the ranks hold different weights"; exit }
            if (params != 9 * ranks) { printf "FAILED: %d parameter rows", params; exit }
            for (f in loss) if (loss[f] + 0 >= 0.015) { printf "FAILED: final loss %s is not below 0.015", loss[f]; exit }
            if (worst > 0.05) { printf "FAILED: a weight is %.4f from the true one", worst; exit }
            printf "ok: the same weights on %d ranks, final loss %s, within %.4f of the true weights", ranks, loss[f], worst
        }' "$@")
    if [[ "$verdict" == ok* ]]; then pass "$name" "${verdict#ok: }"; else fail "$name" "$verdict"; fi
}

dist_train=(java "${java_opts[@]}" -cp "$cp" clojure.main "$root/clojure/examples/dist_train.clj")

# 1. Two ranks, each rank's output in its own file.
out=$logs/mpi-jvm-dist-train
rm -rf "$out"
timeout -k 10 300 "${MPIRUN[@]}" --output-filename "$out" -np 2 "${dist_train[@]}" >"$out.log" 2>&1
rc=$?
mapfile -t files < <(find "$out" -name stdout 2>/dev/null | sort)
if [ "$rc" -eq 0 ] && [ "${#files[@]}" -eq 2 ]; then
    check_training "dist_train.clj, mpirun -np 2" "${files[@]}"
else
    fail "dist_train.clj, mpirun -np 2" "exit $rc, ${#files[@]} rank outputs; log $out.log"
    tail -n 30 "$out.log"
fi
grep -q '<failure' "$reports"/*.xml 2>/dev/null && cat "${files[@]}" 2>/dev/null | tail -n 40

# dist_train.clj in one process, without mpirun (a job of one worker): $1 the check's
# name, $2 its log, $3 a line the log must hold, then the script's arguments.
single() {
    local name=$1 log=$2 expect=$3 rc
    shift 3
    timeout -k 10 300 "${dist_train[@]}" "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "$expect" "$log"; then
        check_training "$name" "$log"
    else
        fail "$name" "exit $rc"
        tail -n 30 "$log"
    fi
}

# 2. No mpirun: a job of one worker.
single "dist_train.clj without mpirun" "$logs/mpi-jvm-single.log" "over 1 ranks"

# 3. A rank that fails: the job ends within 30 s, with a failing status.
start=$(date +%s)
timeout -k 10 120 "${MPIRUN[@]}" -np 2 java "${java_opts[@]}" -cp "$cp" clojure.main \
    "$root/clojure/examples/dying_rank.clj" >"$logs/mpi-jvm-dying.log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -lt 30 ] && ! grep -q "push returned" "$logs/mpi-jvm-dying.log" &&
    grep -q "rank 1 fails before its push" "$logs/mpi-jvm-dying.log"; then
    pass "a JVM rank that throws" "the job ended in ${elapsed} s, exit $rc"
else
    fail "a JVM rank that throws" "exit $rc after ${elapsed} s (124: the job hung)"
    tail -n 20 "$logs/mpi-jvm-dying.log"
fi

# 4. A job stopped after epoch 5 (checkpoints at epochs 2 and 4), restarted with
# --resume on its checkpoint folder: it resumes from epoch 4 and ends with the weights
# of the job of step 1, which never stopped, to the last bit.
ck=$logs/mpi-jvm-checkpoints
rm -rf "$ck" "$logs"/mpi-jvm-stopped* "$logs"/mpi-jvm-resumed*
timeout -k 10 300 "${MPIRUN[@]}" -np 2 "${dist_train[@]}" --checkpoint-dir "$ck" --epochs 5 \
    >"$logs/mpi-jvm-stopped.log" 2>&1
rc=$?
timeout -k 10 300 "${MPIRUN[@]}" --output-filename "$logs/mpi-jvm-resumed" -np 2 "${dist_train[@]}" \
    --checkpoint-dir "$ck" --resume "$ck" >"$logs/mpi-jvm-resumed.log" 2>&1
rrc=$?
mapfile -t resumed < <(find "$logs/mpi-jvm-resumed" -name stdout 2>/dev/null | sort)
bits_of() { grep -h ' bits ' "$@" 2>/dev/null | sed 's/^rank [0-9]*: //' | sort -u; }
if [ "$rc" -eq 0 ] && [ "$rrc" -eq 0 ] && [ "${#resumed[@]}" -eq 2 ] && [ -f "$ck/epoch-04.ckpt" ] &&
    [ "$(cat "${resumed[@]}" | grep -c "resumed from $ck/epoch-04.ckpt at epoch 4 on 2 ranks")" -eq 2 ] &&
    [ -n "$(bits_of "${files[@]}")" ] && [ "$(bits_of "${files[@]}")" = "$(bits_of "${resumed[@]}")" ]; then
    pass "dist_train.clj stopped after epoch 5, restarted with --resume" \
        "resumed from epoch-04.ckpt, the same bits as the job that never stopped"
else
    fail "dist_train.clj stopped after epoch 5, restarted with --resume" "exit $rc then $rrc; logs $logs/mpi-jvm-resumed*"
    tail -n 20 "$logs/mpi-jvm-stopped.log" "$logs/mpi-jvm-resumed.log"
    cat "${resumed[@]}" 2>/dev/null | tail -n 20
fi

# 5. The checkpoint of the 2-rank job resumed by one process (fewer ranks): it trains on.
single "dist_train.clj resumed on 1 rank from the 2 ranks' checkpoint" "$logs/mpi-jvm-fewer.log" \
    "resumed from $ck/epoch-04.ckpt at epoch 4 on 1 ranks" --resume "$ck/epoch-04.ckpt"

# 6. dist_async from Clojure: every push of both ranks (10 + 10 steps of rank + step,
# then 100 each) lands once: 2 * 45 + 10 + 200 = 300; the split key 20.
out=$logs/mpi-jvm-async-sum.log
timeout -k 10 300 "${MPIRUN[@]}" -np 2 java "${java_opts[@]}" -cp "$cp" clojure.main "$root/clojure/examples/async_sum.clj" \
    >"$out" 2>&1
rc=$?
sums=$(grep -c ": sum 300.0$" "$out")
bigs=$(grep -c ": big 20.0$" "$out")
if [ "$rc" -eq 0 ] && [ "$sums" -eq 2 ] && [ "$bigs" -eq 2 ]; then
    pass "async_sum.clj (dist_async), mpirun -np 2" "both ranks pulled 300 and 20"
else
    fail "async_sum.clj (dist_async), mpirun -np 2" "exit $rc, $sums sums and $bigs big keys right; log $out"
    tail -n 30 "$out"
fi

# 7. A call that rank 1 refuses in Java (a disposed array) fails on both ranks as that
# call; the ranks' next calls stay matched. Each rank prints `rank R: ok` if all held.
out=$logs/mpi-jvm-refused-rank.log
timeout -k 10 120 "${MPIRUN[@]}" -np 2 java "${java_opts[@]}" -cp "$cp" clojure.main "$root/clojure/examples/refused_rank.clj" \
    >"$out" 2>&1
rc=$?
oks=$(grep -c "^rank [01]: ok$" "$out")
if [ "$rc" -eq 0 ] && [ "$oks" -eq 2 ]; then
    pass "refused_rank.clj, mpirun -np 2" "a disposed array on one rank fails its call on both"
else
    fail "refused_rank.clj, mpirun -np 2" "exit $rc$( [ "$rc" -eq 124 ] && echo " (the job hung)"), $oks of 2 ranks ok; log $out"
    tail -n 30 "$out"
fi

totals
