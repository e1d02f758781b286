#!/usr/bin/env bash
# Compiles the JUnit tests (kvstore-jni/java/test) against target/kvstore.jar (or ${KVSTORE_JAR})
# into ${KVSTORE_JVM_OUT:-target/jvm}/test-classes and runs them
# with Debian's JUnit console launcher; then compiles the Java example
# kvstore-jni/java/examples/io/github/kvstore/examples/TrainLinear.java against the jar, as a
# user would (javac --release 17 -Xlint:all -Werror), and runs it: it checks its own
# result and must exit 0 with a last line `TrainLinear: ok (...)`. It counts as one more
# test. Prints one line `junit: N passed, N failed`.
# Exits non-zero if any test failed, if a test class could not even start, or if no test
# ran. A test aborted by a JUnit assumption (`Assumptions.assumeTrue`) is a skip: it
# counts neither way and is reported on its own line, `test-java.sh: N skipped`; the
# test prints why (`SKIP: ...`).
#
# The JVM runs with an empty java.library.path and no -Dkvstore.native.path, so the
# library comes from the jar's bundled copy (the loader's extraction path);
# LoaderTest starts fresh JVMs for the other places.
set -uo pipefail
cd "$(dirname "$0")/.."

junit=${JUNIT_CONSOLE_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
jar=${KVSTORE_JAR:-target/kvstore.jar}
out=${KVSTORE_JVM_OUT:-target/jvm}
classes=$out/test-classes
logs=target/test-logs
log=$logs/junit.log
mkdir -p "$logs"

fail() {
    echo "test-java.sh: $*" >&2
    echo "junit: 0 passed, 1 failed"
    exit 1
}

[ -f "$jar" ] || fail "$jar not found: run scripts/jar.sh first"
[ -f "$junit" ] || fail "$junit not found: install Debian's junit5 package (apt-get install junit5)"

mapfile -t sources < <(find kvstore-jni/java/test -name '*.java' | sort)
[ "${#sources[@]}" -gt 0 ] || fail "no test sources under kvstore-jni/java/test"

rm -rf "$classes"
mkdir -p "$classes" "$out/empty-library-path"
javac --release 17 -Xlint:all -Werror -encoding UTF-8 -cp "$jar:$junit" -d "$classes" "${sources[@]}" \
    || fail "the tests do not compile"

# Debian's launcher (JUnit Platform 1.9) has no `execute` subcommand: options go directly.
timeout 900 java \
    -Djava.library.path="$out/empty-library-path" \
    -Dkvstore.test.expectBundled=true \
    -jar "$junit" \
    --disable-banner --disable-ansi-colors --details=tree --details-theme=ascii \
    --class-path "$classes" --class-path "$jar" \
    --select-package io.github.kvstore \
    --fail-if-no-tests \
    2>&1 | tee "$log"
status=${PIPESTATUS[0]}

count() {
    # The summary's lines look like "[        12 tests successful      ]".
    awk -v what="$1" '$0 ~ "^\\[ *[0-9]+ " what " *\\]$" { gsub(/[^0-9]/, "", $2); n = $2 } END { print n + 0 }' "$log"
}
successful=$(count "tests successful")
failed=$(( $(count "tests failed") + $(count "containers failed") + $(count "containers aborted") ))
skipped=$(count "tests aborted")
if [ "$skipped" -gt 0 ]; then
    echo "test-java.sh: $skipped skipped (aborted by an assumption):"
    grep '^SKIP: ' "$log" | sed 's/^/  /'
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    # A crashed or timed-out JVM, or a launcher error: no test reported it.
    echo "test-java.sh: the launcher exited with status $status without a failing test" >&2
    failed=1
fi
if [ "$successful" -eq 0 ] && [ "$failed" -eq 0 ]; then
    echo "test-java.sh: no test ran" >&2
    failed=1
fi

# The example, from the jar alone (its bundled library, as above).
example_classes=$out/example-classes
example_log=$logs/java-example.log
rm -rf "$example_classes"
mkdir -p "$example_classes"
mapfile -t examples < <(find kvstore-jni/java/examples -name '*.java' | sort)
if [ "${#examples[@]}" -eq 0 ]; then
    echo "test-java.sh: no example under kvstore-jni/java/examples" >&2
    failed=$((failed + 1))
elif ! javac --release 17 -Xlint:all -Werror -encoding UTF-8 -cp "$jar" -d "$example_classes" "${examples[@]}" \
    >"$example_log" 2>&1; then
    echo "TrainLinear.java: FAILED (it does not compile)"
    sed 's/^/  /' "$example_log"
    failed=$((failed + 1))
else
    timeout 300 java -Djava.library.path="$out/empty-library-path" -cp "$jar:$example_classes" \
        io.github.kvstore.examples.TrainLinear >"$example_log" 2>&1
    example_status=$?
    verdict=$(tail -n 1 "$example_log")
    if [ "$example_status" -eq 0 ] && [[ "$verdict" == "TrainLinear: ok"* ]]; then
        echo "$verdict"
        successful=$((successful + 1))
    else
        echo "TrainLinear.java: FAILED (exit status $example_status$( [ "$example_status" -eq 124 ] && echo ", timed out after 300 s"))"
        tail -n 40 "$example_log" | sed 's/^/  /'
        failed=$((failed + 1))
    fi
fi

echo "junit: $successful passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$successful" -gt 0 ]
