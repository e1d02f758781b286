#!/usr/bin/env bash
# The Clojure suites, run against the built jar (the namespaces are loaded from
# target/kvstore.jar, so this tests the jar, not clojure/src):
#  1. clojure.test through the runner clojure/test/kvstore_test_runner.clj, which
#     writes a JUnit XML report (a case per deftest; see its docstring);
#  2. the examples, each run from an empty folder with only the jar and
#     Clojure's jars on the classpath: the tutorial clojure/examples/tutorial.clj,
#     its output compared with the values the tutorial shows, and the training
#     demo clojure/examples/train_linear.clj, whose final loss must be near the
#     noise floor and whose learned weights near the true ones: a case each.
# The reports go to ${KVSTORE_REPORTS:-target/test-reports/clojure}, and one line
# `clojure: N passed, N failed` totals them. Exits non-zero when anything failed.
#
# Needs: target/kvstore.jar (make jar) and Debian's clojure and
# libtest-check-clojure (installed here when missing and apt-get can).
# KVSTORE_JAR overrides the jar's path.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init clojure
jar=${KVSTORE_JAR:-$root/target/kvstore.jar}

share=/usr/share/java
clojure_jars="$share/clojure.jar:$share/spec.alpha.jar:$share/core.specs.alpha.jar"
test_jars="$share/test.check.jar"

missing_jars() {
    local j
    for j in ${clojure_jars//:/ } ${test_jars//:/ }; do
        [ -f "$j" ] || echo "$j"
    done
}

if [ -n "$(missing_jars)" ]; then
    bash scripts/apt-install.sh clojure libtest-check-clojure >"$logs/clojure-apt.log" 2>&1
fi
[ -z "$(missing_jars)" ] ||
    stop "Clojure's jars" "missing: $(missing_jars | tr '\n' ' ')(apt-get install clojure libtest-check-clojure)"
[ -f "$jar" ] || stop "the jar" "$jar not found: build it first (make jar)"

# -Dclojure.main.report=stderr: an uncaught error prints its trace here instead
# of into a temporary file.
java_opts=(-Dclojure.main.report=stderr -Djava.io.tmpdir="${TMPDIR:-/tmp}")

# Every JVM runs under `timeout` (generous limits), so that a hang fails the suite
# instead of stalling it: timeout exits 124 (137 after its KILL), a failure below.
runner_limit=600
example_limit=120
timed_out() {
    [ "$1" -eq 124 ] || [ "$1" -eq 137 ]
}

# 1. clojure.test: the runner writes a JUnit XML report.
report=$reports/clojure-junit.xml
timeout -k 10 "$runner_limit" java "${java_opts[@]}" -Dkvstore.junit.xml="$report" \
    -cp "$jar:$root/clojure/test:$clojure_jars:$test_jars" \
    clojure.main -m kvstore-test-runner 2>&1 | tee "$logs/clojure.log"
status=${PIPESTATUS[0]}
if [ ! -f "$report" ]; then
    # The runner died before its report (a JVM or classpath problem, or a hang).
    if timed_out "$status"; then
        why="the Clojure test runner did not finish within $runner_limit s (killed)"
    else
        why="the Clojure test runner exited with status $status before its report"
    fi
    echo "$why"
    record "the test runner" "$why"
fi

# 2. the examples, each from an empty folder

expected='[2.0 2.0 2.0 2.0 2.0 2.0]
[8.0 8.0 8.0 8.0 8.0 8.0]
[3.0 3.0 3.0 3.0 3.0 3.0]
([3.0 3.0 3.0 3.0 3.0 3.0] [3.0 3.0 3.0 3.0 3.0 3.0])
([1.0 1.0 1.0 1.0 1.0 1.0] [1.0 1.0 1.0 1.0 1.0 1.0] [1.0 1.0 1.0 1.0 1.0 1.0])'
tmp=$(mktemp -d)
actual=$(cd "$tmp" && timeout -k 10 "$example_limit" java "${java_opts[@]}" -cp "$jar:$clojure_jars" \
    clojure.main "$root/clojure/examples/tutorial.clj" 2>"$logs/clojure-tutorial.err")
tutorial_status=$?
rm -rf "$tmp"
if [ "$tutorial_status" -eq 0 ] && [ "$actual" = "$expected" ]; then
    echo "tutorial.clj: ok"
    record tutorial.clj
else
    echo "tutorial.clj: FAILED (exit status $tutorial_status$(timed_out "$tutorial_status" && echo ", timed out after $example_limit s"))"
    diff <(echo "$expected") <(echo "$actual") | sed 's/^/  /'
    tail -n 30 "$logs/clojure-tutorial.err" | sed 's/^/  /'
    record tutorial.clj "exit status $tutorial_status, or not the tutorial's values"
fi

# The training demo: the last epoch's loss below max_loss (the noise floor is
# 0.01) and every learned parameter within tolerance of the true one. The
# demo's own table is read, so the check does not trust the demo's arithmetic
# for the comparison.
max_loss=0.015
tolerance=0.05
tmp=$(mktemp -d)
(cd "$tmp" && timeout -k 10 "$example_limit" java "${java_opts[@]}" -cp "$jar:$clojure_jars" \
    clojure.main "$root/clojure/examples/train_linear.clj") >"$logs/clojure-train-linear.log" \
    2>"$logs/clojure-train-linear.err"
train_status=$?
rm -rf "$tmp"
verdict=$(awk -v max_loss="$max_loss" -v tol="$tolerance" '
    /^epoch +[0-9]+ +loss / { epochs++; loss = $4 }
    /^(w\[[0-9]+\]|b) / { params++; d = $2 - $3; if (d < 0) d = -d; if (d > worst) worst = d }
    END {
        if (epochs < 2 || params != 9) { printf "FAILED: %d epoch lines and %d parameter rows", epochs, params; exit }
        if (loss + 0 >= max_loss) { printf "FAILED: final loss %s is not below %s", loss, max_loss; exit }
        if (worst > tol) { printf "FAILED: a learned parameter is %.4f from the true one (tolerance %s)", worst, tol; exit }
        printf "ok (final loss %s < %s, parameters within %.4f <= %s of the true ones)", loss, max_loss, worst, tol
    }' "$logs/clojure-train-linear.log")
if [ "$train_status" -eq 0 ] && [[ "$verdict" == ok* ]]; then
    echo "train_linear.clj: $verdict"
    record train_linear.clj
else
    echo "train_linear.clj: ${verdict:-FAILED} (exit status $train_status$(timed_out "$train_status" && echo ", timed out after $example_limit s"))"
    sed 's/^/  /' "$logs/clojure-train-linear.log"
    tail -n 30 "$logs/clojure-train-linear.err" | sed 's/^/  /'
    record train_linear.clj "${verdict:-FAILED} (exit status $train_status)"
fi

totals || exit 1
exit "$status"
