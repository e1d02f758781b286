#!/usr/bin/env bash
# Builds target/kvstore.jar (or ${KVSTORE_JAR}): the Java API (clojure/java), the Clojure sources
# (clojure/src, at the jar root) and the native library at
# native/linux-x86_64/libkvstore_jni.so, where NativeLibrary looks for its bundled copy.
#
# The native library comes from ${KVSTORE_NATIVE_LIB:-target/release/libkvstore_jni.so}
# (`cargo build -p kvstore-jni --release`); without it this script fails, since a jar
# without it cannot work anywhere the library is not installed separately. Classes are
# compiled under ${KVSTORE_JVM_OUT:-target/jvm} (a separate folder lets a second build,
# with another CARGO_TARGET_DIR, run beside the default one).
set -euo pipefail
cd "$(dirname "$0")/.."

native=${KVSTORE_NATIVE_LIB:-target/release/libkvstore_jni.so}
if [ ! -f "$native" ]; then
    echo "jar.sh: native library '$native' not found." >&2
    echo "jar.sh: build it with 'cargo build -p kvstore-jni --release', or set KVSTORE_NATIVE_LIB to its path." >&2
    exit 1
fi

out=${KVSTORE_JVM_OUT:-target/jvm}
classes=$out/classes
staging=$out/jar-native
jar=${KVSTORE_JAR:-target/kvstore.jar}

mapfile -t sources < <(find clojure/java -name '*.java' | sort)
if [ "${#sources[@]}" -eq 0 ]; then
    echo "jar.sh: no Java sources under clojure/java" >&2
    exit 1
fi

# Fresh output folders, so a deleted source never leaves a stale class in the jar.
rm -rf "$classes" "$staging"
mkdir -p "$classes" "$staging/native/linux-x86_64"
javac --release 17 -Xlint:all -Werror -encoding UTF-8 -d "$classes" "${sources[@]}"
cp "$native" "$staging/native/linux-x86_64/libkvstore_jni.so"

args=(-C "$classes" . -C "$staging" native)
# The Clojure namespaces, if any are written yet.
if [ -d clojure/src ] && [ -n "$(find clojure/src -type f -print -quit)" ]; then
    args+=(-C clojure/src .)
fi

# Build next to the target, then rename: a failed build never leaves a half-written jar.
rm -f "$jar.tmp"
jar --create --file "$jar.tmp" "${args[@]}"
mv -f "$jar.tmp" "$jar"
echo "jar.sh: wrote $jar ($(jar --list --file "$jar" | grep -c '\.class$') classes, $(jar --list --file "$jar" | grep -c '\.clj[cs]\?$') Clojure files, native library from $native)"
