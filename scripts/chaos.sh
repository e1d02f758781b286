#!/usr/bin/env bash
# The chaos suite: RUNS (default 6) runs of a 4-rank dist_sync training job
# (kvstore-mpi/tests/fixtures/chaos.rs) that saves a checkpoint every 4 steps, each with
# `kill -9` or `SIGSTOP` sent to a random rank at a random moment. A run passes when:
#  - the job ends within BOUND seconds (a dead rank ends it through MPI's fail-stop, a
#    stopped one through the watchdog, KVSTORE_TIMEOUT=5): no hang;
#  - every checkpoint on disk loads (into a fresh `local` store);
#  - a job resumed from the latest checkpoint, on 4 or on 2 ranks (chosen at random),
#    trains 8 more steps, every rank ending with the same weights (with no checkpoint
#    yet, the job starts over).
# Prints a line per run, the summary (runs, kills, stops, faults that came after the
# job had finished, hangs, checkpoints, resumes) and `chaos: N passed, N failed`.
# KVSTORE_CHAOS_SEED=n repeats a sequence; `make chaos` runs 100. A passing run's files
# are removed; a failing run's stay in target/test-logs/chaos/run-N.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-6}
steps=32 every=4 step_ms=20 bound=60 timeout_s=5
logs=target/test-logs/chaos
rm -rf "$logs"
mkdir -p "$logs"
bash scripts/setup-mpi.sh >"$logs/setup.log" 2>&1 || { tail -n 20 "$logs/setup.log"; echo "chaos: 0 passed, 1 failed"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KVSTORE_TIMEOUT=$timeout_s
MPIRUN=(mpirun --oversubscribe --bind-to none -x KVSTORE_TIMEOUT)
bin=$(cargo test -p kvstore-mpi --features mpi --test chaos --no-run --message-format=json 2>"$logs/build.log" |
    python3 scripts/cargo-executables.py | awk '$1 == "chaos" { print $2 }')
if [ -z "$bin" ]; then
    tail -n 30 "$logs/build.log"
    echo "chaos: 0 passed, 1 failed"
    exit 1
fi
seed=${KVSTORE_CHAOS_SEED:-$((($$ + $(date +%s)) % 32768))}
RANDOM=$seed
echo "chaos: $runs runs of a 4-rank job ($steps steps, a checkpoint every $every), seed $seed"

passed=0 failed=0 kills=0 stops=0 late=0 hangs=0 checkpoints=0 resumes=0 at_call=0 in_data=0 at_finalize=0
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# Ends every process of a run (found by the folder on its command line), and removes
# what killed processes leave behind: a rank's shared-memory segment, mpirun's session
# folder (those made since the run's `started` file, whose process is gone).
reap() {
    pkill -KILL -f "$bin train $1 " 2>/dev/null
    sleep 0.2
    find /dev/shm -maxdepth 1 -name 'vader_segment.*' -newer "$1/started" 2>/dev/null |
        while read -r f; do fuser -s "$f" 2>/dev/null || rm -f "$f"; done
    for d in /tmp/ompi.*/pid.*; do
        [ -d "$d" ] && [ "$d" -nt "$1/started" ] && ! kill -0 "${d##*pid.}" 2>/dev/null && rm -rf "$d"
    done
    rmdir /tmp/ompi.* 2>/dev/null
    return 0
}

for i in $(seq 1 "$runs"); do
    dir=$logs/run-$i
    mkdir -p "$dir"
    victim=$((RANDOM % 4))
    if [ $((RANDOM % 2)) -eq 0 ]; then fault=KILL; else fault=STOP; fi
    at_ms=$((500 + RANDOM % 4500))
    touch "$dir/started"
    start=$(now_ms)
    timeout -k 5 "$bound" "${MPIRUN[@]}" -np 4 "$bin" train "$dir" "$steps" "$every" "$step_ms" >"$dir/job.log" 2>&1 &
    job=$!
    sleep "$(printf '%d.%03d' $((at_ms / 1000)) $((at_ms % 1000)))"
    pid=$(cat "$dir/rank-$victim.pid" 2>/dev/null)
    what="SIG$fault to rank $victim at ${at_ms} ms"
    # A rank that has finalised MPI is done with the store: a fault then is "after".
    if [ -n "$pid" ] && [ ! -e "$dir/rank-$victim.done" ] && kill -0 "$pid" 2>/dev/null &&
        kill -"$fault" "$pid" 2>/dev/null; then
        if [ "$fault" = KILL ]; then kills=$((kills + 1)); else stops=$((stops + 1)); fi
    else
        what="$what: came after rank $victim had finished with MPI"
        late=$((late + 1))
    fi
    wait "$job"
    rc=$?
    took=$(($(now_ms) - start))
    reap "$dir"
    problems=()
    # (A rank killed by SIGKILL makes mpirun exit 137 too: only the time tells a hang.)
    if [ "$rc" -eq 124 ] || [ "$took" -ge $((bound * 1000)) ]; then
        hangs=$((hangs + 1))
        problems+=("the job did not end within $bound s")
    fi
    # What ended a job with a stopped rank: the watchdog, at a call's comparison, inside
    # a collective that moves data, or in finalize.
    if grep -q "never arrived" "$dir/job.log"; then
        at_call=$((at_call + 1))
    elif grep -q "has not moved" "$dir/job.log"; then
        in_data=$((in_data + 1))
    elif grep -q "MPI_Finalize has not returned" "$dir/job.log"; then
        at_finalize=$((at_finalize + 1))
    elif [ "$fault" = STOP ] && [[ "$what" != *finished* ]] && [ "$rc" -ne 0 ]; then
        problems+=("the job with a stopped rank ended without the watchdog")
    fi
    if "$bin" verify "$dir" >"$dir/verify.log" 2>&1; then
        checkpoints=$((checkpoints + $(grep -c ': loads' "$dir/verify.log")))
    else
        problems+=("a checkpoint does not load: $(grep -m1 FAILED "$dir/verify.log")")
    fi
    latest=$(find "$dir" -maxdepth 1 -name 'step-*.ckpt' | sort | tail -n 1)
    np=$((RANDOM % 2 == 0 ? 4 : 2))
    from=0
    [ -n "$latest" ] && from=$((10#$(basename "$latest" .ckpt | sed 's/^step-//')))
    to=$((from + 8))
    rm -f "$dir"/rank-*.pid "$dir"/rank-*.done
    timeout -k 5 "$bound" "${MPIRUN[@]}" -np "$np" "$bin" train "$dir" "$to" "$every" 0 ${latest:+"$latest"} \
        >"$dir/resume.log" 2>&1
    rrc=$?
    reap "$dir"
    agreed=$(grep -E "^rank [0-9]+: step $to weights " "$dir/resume.log" | awk '{ print $NF }' | sort -u)
    if [ "$rrc" -eq 0 ] && [ "$(grep -cE "^rank [0-9]+: step $to weights " "$dir/resume.log")" -eq "$np" ] &&
        [ "$(echo "$agreed" | wc -l)" -eq 1 ]; then
        resumes=$((resumes + 1))
    else
        problems+=("the resumed job (np $np, from step $from) failed: exit $rrc")
    fi
    line="run $i: $what; the job ended in ${took} ms (exit $rc); resumed on $np ranks from step $from to $to"
    if [ "${#problems[@]}" -eq 0 ]; then
        echo "$line: ok"
        passed=$((passed + 1))
        rm -rf "$dir"
    else
        echo "$line: FAILED: ${problems[*]} (files: $dir)"
        tail -n 15 "$dir/job.log" "$dir/resume.log"
        failed=$((failed + 1))
    fi
done
echo "chaos summary: runs $runs, kills $kills, stops $stops, faults after the job had finished $late," \
    "hangs $hangs, watchdog endings $((at_call + in_data + at_finalize)) ($at_call at a call's comparison, $in_data" \
    "inside a collective, $at_finalize in finalize), checkpoints loaded $checkpoints, resumes $resumes of $runs (seed $seed)"
echo "chaos: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
