#!/usr/bin/env bash
# Compiles the JUnit tests (kvstore-jni/java/test) against target/kvstore.jar (or ${KVSTORE_JAR})
# into ${KVSTORE_JVM_OUT:-target/jvm}/test-classes and runs them
# with Debian's JUnit console launcher; then compiles the Java example
# kvstore-jni/java/examples/io/github/kvstore/examples/TrainLinear.java against the jar, as a
# user would (javac --release 17 -Xlint:all -Werror), and runs it: it checks its own
# result and must exit 0 with a last line `TrainLinear: ok (...)`. It counts as one more
# test. The launcher writes JUnit XML reports into ${KVSTORE_REPORTS:-target/test-reports/junit},
# this script its own checks as more (the example, a test class that failed before
# its tests, a launcher that failed without a failing test), and
# scripts/junit.py prints one line `junit: N passed, N failed` from them.
# Exits non-zero if anything failed. A test aborted by a JUnit assumption
# (`Assumptions.assumeTrue`) is a skip: it counts neither way and is reported on its
# own lines; the test prints why (`SKIP: ...`).
#
# The JVM runs with an empty java.library.path and no -Dkvstore.native.path, so the
# library comes from the jar's bundled copy (the loader's extraction path);
# LoaderTest starts fresh JVMs for the other places.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init junit

junit=${JUNIT_CONSOLE_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
jar=${KVSTORE_JAR:-target/kvstore.jar}
out=${KVSTORE_JVM_OUT:-target/jvm}
classes=$out/test-classes
log=$logs/junit.log

[ -f "$jar" ] || stop test-java.sh "$jar not found: run scripts/jar.sh first"
[ -f "$junit" ] || stop test-java.sh "$junit not found: install Debian's junit5 package (apt-get install junit5)"

mapfile -t sources < <(find kvstore-jni/java/test -name '*.java' | sort)
[ "${#sources[@]}" -gt 0 ] || stop test-java.sh "no test sources under kvstore-jni/java/test"

rm -rf "$classes"
mkdir -p "$classes" "$out/empty-library-path"
javac --release 17 -Xlint:all -Werror -encoding UTF-8 -cp "$jar:$junit" -d "$classes" "${sources[@]}" \
    || stop test-java.sh "the tests do not compile"

# Debian's launcher (JUnit Platform 1.9) has no `execute` subcommand: options go directly.
# It writes JUnit XML reports into $reports, and this script its own checks there too.
timeout 900 java \
    -Djava.library.path="$out/empty-library-path" \
    -Djava.io.tmpdir="${TMPDIR:-/tmp}" \
    -Dkvstore.test.expectBundled=true \
    -jar "$junit" \
    --disable-banner --disable-ansi-colors --details=tree --details-theme=ascii \
    --class-path "$classes" --class-path "$jar" \
    --select-package io.github.kvstore \
    --fail-if-no-tests \
    --reports-dir "$reports" \
    2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# What the XML reports cannot show: a class whose setup failed (a failed or aborted
# container), a crashed or timed-out JVM, or a launcher error.
containers=$(awk '/^\[ *[0-9]+ containers (failed|aborted) *\]$/ { gsub(/[^0-9]/, "", $2); n += $2 } END { print n + 0 }' "$log")
if [ "$containers" -gt 0 ]; then
    record "test classes" "$containers test class(es) failed or aborted before their tests"
fi
if [ "$status" -ne 0 ] && ! grep -q '<failure\|<error' "$reports"/TEST-junit-*.xml 2>/dev/null && [ "$containers" -eq 0 ]; then
    record "the launcher" "it exited with status $status without a failing test"
fi
if grep -q '^SKIP: ' "$log"; then
    echo "test-java.sh: skipped (aborted by an assumption):"
    grep '^SKIP: ' "$log" | sed 's/^/  /'
fi

# The example, from the jar alone (its bundled library, as above).
example_classes=$out/example-classes
example_log=$logs/java-example.log
rm -rf "$example_classes"
mkdir -p "$example_classes"
mapfile -t examples < <(find kvstore-jni/java/examples -name '*.java' | sort)
if [ "${#examples[@]}" -eq 0 ]; then
    record "TrainLinear" "no example under kvstore-jni/java/examples"
elif ! javac --release 17 -Xlint:all -Werror -encoding UTF-8 -cp "$jar" -d "$example_classes" "${examples[@]}" \
    >"$example_log" 2>&1; then
    echo "TrainLinear.java: FAILED (it does not compile)"
    sed 's/^/  /' "$example_log"
    record "TrainLinear" "it does not compile"
else
    timeout 300 java -Djava.library.path="$out/empty-library-path" -Djava.io.tmpdir="${TMPDIR:-/tmp}" \
        -cp "$jar:$example_classes" io.github.kvstore.examples.TrainLinear >"$example_log" 2>&1
    example_status=$?
    verdict=$(tail -n 1 "$example_log")
    if [ "$example_status" -eq 0 ] && [[ "$verdict" == "TrainLinear: ok"* ]]; then
        echo "$verdict"
        record "TrainLinear"
    else
        echo "TrainLinear.java: FAILED (exit status $example_status$( [ "$example_status" -eq 124 ] && echo ", timed out after 300 s"))"
        tail -n 40 "$example_log" | sed 's/^/  /'
        record "TrainLinear" "exit status $example_status"
    fi
fi

totals
