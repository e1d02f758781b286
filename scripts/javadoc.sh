#!/usr/bin/env bash
# Builds the Javadoc of the Java API (the sources under kvstore-jni/java/src, package
# io.github.kvstore) into ${KVSTORE_JAVADOC_OUT:-target/javadoc}, with every doclint
# check of JDK 17's javadoc (-Xdoclint:all: accessibility, html, missing, reference,
# syntax) on the public and protected API, and -Werror. Exits non-zero on any warning or
# error; the output is also in target/test-logs/javadoc.log.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${KVSTORE_JAVADOC_OUT:-target/javadoc}
logs=target/test-logs
log=$logs/javadoc.log
mkdir -p "$logs"

mapfile -t sources < <(find kvstore-jni/java/src -name '*.java' | sort)
if [ "${#sources[@]}" -eq 0 ]; then
    echo "javadoc.sh: no Java sources under kvstore-jni/java/src" >&2
    exit 1
fi

rm -rf "$out"
mkdir -p "$out"
javadoc --release 17 -Xdoclint:all -Werror -Xmaxwarns 100000 -Xmaxerrs 100000 -quiet \
    -encoding UTF-8 -docencoding UTF-8 -charset UTF-8 \
    -doctitle "kvstore $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1) Java API" \
    -d "$out" "${sources[@]}" >"$log" 2>&1
status=$?
cat "$log"
# -Werror makes javadoc fail on a warning; the log is checked too, so that no warning
# can pass unnoticed whatever javadoc's exit status.
warnings=$(grep -c -E '(^|: )warning( -|:)' "$log")
if [ "$status" -ne 0 ] || [ "$warnings" -ne 0 ]; then
    echo "javadoc.sh: FAILED (javadoc exit status $status, $warnings warning(s)); see $log" >&2
    exit 1
fi
echo "javadoc.sh: wrote $out (${#sources[@]} sources, no warnings)"
