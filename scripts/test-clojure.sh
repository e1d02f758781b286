#!/usr/bin/env bash
# The Clojure suites, run against the built jar (the namespaces are loaded from
# target/kvstore.jar, so this tests the jar, not clojure/src):
#  1. clojure.test through the runner clojure/test/kvstore_test_runner.clj, which
#     prints `clojure: N passed, N failed` (N counts deftests; see its docstring);
#  2. the tutorial clojure/examples/tutorial.clj, run from an empty folder with
#     only the jar and Clojure's jars on the classpath, its output compared with
#     the values the tutorial shows: one line `clojure-examples: N passed, N failed`.
# Exits non-zero when anything failed.
#
# Needs: target/kvstore.jar (make jar) and Debian's clojure and
# libtest-check-clojure (installed here when missing and apt-get can).
# KVSTORE_JAR overrides the jar's path.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jar=${KVSTORE_JAR:-$root/target/kvstore.jar}
logs=$root/target/test-logs
mkdir -p "$logs"

share=/usr/share/java
clojure_jars="$share/clojure.jar:$share/spec.alpha.jar:$share/core.specs.alpha.jar"
test_jars="$share/test.check.jar"

missing_jars() {
    local j
    for j in ${clojure_jars//:/ } ${test_jars//:/ }; do
        [ -f "$j" ] || echo "$j"
    done
}

if [ -n "$(missing_jars)" ] && command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "installing Debian's clojure and libtest-check-clojure"
    for _ in 1 2 3 4 5; do
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q clojure libtest-check-clojure \
            >"$logs/clojure-apt.log" 2>&1 && break
        sleep 10 # apt may be locked by another apt process
    done
fi
if [ -n "$(missing_jars)" ]; then
    echo "missing: $(missing_jars | tr '\n' ' ')(apt-get install clojure libtest-check-clojure)"
    echo "clojure: 0 passed, 1 failed"
    exit 1
fi
if [ ! -f "$jar" ]; then
    echo "$jar not found: build it first (make jar)"
    echo "clojure: 0 passed, 1 failed"
    exit 1
fi

# -Dclojure.main.report=stderr: an uncaught error prints its trace here instead
# of into a temporary file.
java_opts=(-Dclojure.main.report=stderr)

# 1. clojure.test
java "${java_opts[@]}" -cp "$jar:$root/clojure/test:$clojure_jars:$test_jars" \
    clojure.main -m kvstore-test-runner 2>&1 | tee "$logs/clojure.log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ] && ! grep -qE '^clojure: [0-9]+ passed, [1-9][0-9]* failed$' "$logs/clojure.log"; then
    # The runner died before its summary (a JVM or classpath problem).
    echo "the Clojure test runner exited with status $status before its summary"
    echo "clojure: 0 passed, 1 failed"
fi

# 2. the tutorial, from an empty folder
expected='[2.0 2.0 2.0 2.0 2.0 2.0]
[8.0 8.0 8.0 8.0 8.0 8.0]
[3.0 3.0 3.0 3.0 3.0 3.0]
([3.0 3.0 3.0 3.0 3.0 3.0] [3.0 3.0 3.0 3.0 3.0 3.0])
([1.0 1.0 1.0 1.0 1.0 1.0] [1.0 1.0 1.0 1.0 1.0 1.0] [1.0 1.0 1.0 1.0 1.0 1.0])'
tmp=$(mktemp -d)
actual=$(cd "$tmp" && java "${java_opts[@]}" -cp "$jar:$clojure_jars" \
    clojure.main "$root/clojure/examples/tutorial.clj" 2>"$logs/clojure-tutorial.err")
tutorial_status=$?
rm -rf "$tmp"
if [ "$tutorial_status" -eq 0 ] && [ "$actual" = "$expected" ]; then
    echo "tutorial.clj: ok"
    echo "clojure-examples: 1 passed, 0 failed"
else
    echo "tutorial.clj: FAILED (exit status $tutorial_status)"
    diff <(echo "$expected") <(echo "$actual") | sed 's/^/  /'
    tail -n 30 "$logs/clojure-tutorial.err" | sed 's/^/  /'
    echo "clojure-examples: 0 passed, 1 failed"
    status=1
fi
exit "$status"
