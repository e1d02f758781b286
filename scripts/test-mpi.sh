#!/usr/bin/env bash
# The multi-rank suite: kvstore-mpi's tests with its `mpi` feature, run by cargo-nextest
# one at a time (profile `mpi` of .config/nextest.toml): its own unit tests, tests/mpi/ (every case as an MPI
# job of its own on 2 and 4 ranks and with 256-byte buckets, the settings that are not
# numbers, ranks with shared memory on and off), tests/faults.rs (jobs in which a worker
# dies, is stuck or stops), tests/timeline.rs (a job with a slow rank, its merged
# timeline and stats), tests/commits.rs (commits and kvstore-run), a training job on a
# cluster in a box (scripts/cluster.sh: 2 network namespaces of 2 ranks, against one
# host of 4) and tests/jvm.rs (the Clojure examples under mpirun, over
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

# Jobs across hosts, on a cluster in a box (scripts/cluster.sh): 2 hosts of 2 ranks each
# (shared memory within a host, TCP over a link shaped to 10 Gbit/s between them), of
# dist_sync (its state replicated, then on owners) and of dist_async stores, must end
# with the bits of the same job on one host of 4 ranks, on every rank; the replicated
# dist_sync's big key summed host by host on 2 hosts, flat on one, and flat (same bits)
# again with the ranks dealt to the hosts in turn. Skipped, and counted as skipped, where
# network namespaces cannot be made.
train=target/debug/fixture_train_job
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if why=$(bash scripts/cluster.sh check); then
    for run in dist_sync dist_async dist_sync_owners; do
        kind=${run%_owners}
        layout=replicated label=$kind
        [ "$run" = dist_sync_owners ] && layout=owners label="dist_sync with owners"
        name="cluster: 2 hosts x 2 ranks of $label, the bits of one host"
        log=$logs/mpi-cluster-$run.log
        {
            echo "== one host, 4 ranks"
            timeout 300 mpirun --oversubscribe --bind-to none -x KVSTORE_LAYOUT=$layout -np 4 "$train" "$kind" 3
            echo "== 2 hosts of 2 ranks"
            timeout 300 bash scripts/cluster.sh run -n 2 -s 2 -r 10gbit -- --oversubscribe --bind-to none \
                -x KVSTORE_LAYOUT=$layout -np 4 "$train" "$kind" 3
            if [ "$run" = dist_sync ]; then
                echo "== 2 hosts of 2 ranks, dealt in turn"
                timeout 300 bash scripts/cluster.sh run -n 2 -s 2 -r 10gbit -- --oversubscribe --bind-to none \
                    -x KVSTORE_LAYOUT=$layout --map-by node -np 4 "$train" "$kind" 3
            fi
        } >"$log" 2>&1
        if python3 - "$log" "$run" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
one, _, rest = text.partition("== 2 hosts of 2 ranks\n")
two, _, dealt = rest.partition("== 2 hosts of 2 ranks, dealt in turn")
line = re.compile(r"rank (\d) of 4 on (\S*): bits ([0-9a-f]{8}), host by host (true|false)")
a, b, c = line.findall(one), line.findall(two), line.findall(dealt)
hosts = {r: h for r, h, *_ in b}
by_hosts = sys.argv[2] == "dist_sync"
ok = (len(a) == 4 and len(b) == 4 and len({x for _, _, x, _ in a + b + c}) == 1
      and hosts.get("0") == hosts.get("1") != hosts.get("2") == hosts.get("3")
      and all(y == "false" for *_, y in a) and all(y == str(by_hosts).lower() for *_, y in b))
# dist_sync again with the ranks dealt to the hosts in turn (0 and 2 on one host): the
# big key sums flat, with the same bits.
if by_hosts:
    turns = {r: h for r, h, *_ in c}
    ok = ok and (len(c) == 4 and turns.get("0") == turns.get("2") != turns.get("1") == turns.get("3")
                 and all(y == "false" for *_, y in c))
sys.exit(0 if ok else 1)
PY
        then
            pass "$name"
        else
            fail "$name" "$log"
        fi
    done
else
    for kind in dist_sync dist_async "dist_sync with owners"; do
        skip "cluster: 2 hosts x 2 ranks of $kind, the bits of one host" "$why"
    done
fi
totals
