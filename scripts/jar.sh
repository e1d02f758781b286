#!/usr/bin/env bash
# Builds target/<artifact>-<version>.jar: the Java API (kvstore-jni/java/src), the Clojure
# sources (clojure/src, at the jar root) and the native library at
# native/linux-x86_64/libkvstore_jni.so, where NativeLibrary looks for its bundled copy;
# its manifest carries the version (Implementation-Version) and META-INF/maven the POM,
# as a jar built by Maven does. Beside it: target/<artifact>-<version>.pom (what
# `make install` puts into the local Maven repository) and the link
# target/<artifact>.jar -> <artifact>-<version>.jar for commands that name no version.
#
# The artifact is ${KVSTORE_ARTIFACT:-kvstore} (io.github.kvstore/kvstore; the MPI build
# is io.github.kvstore/kvstore-mpi); the version is the workspace's (scripts/version.sh).
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
artifact=${KVSTORE_ARTIFACT:-kvstore}
version=$(bash scripts/version.sh)
jar=target/$artifact-$version.jar
pom=target/$artifact-$version.pom
case $artifact in
    kvstore) description="Apache MXNet's KVStore rebuilt in Rust: the Java API, clojure-mxnet's kvstore, ndarray, context and optimizer namespaces, and the native library (linux-x86_64)" ;;
    kvstore-mpi) description="kvstore built with dist_sync over MPI (needs Open MPI at run time): the Java API, the Clojure namespaces and the native library (linux-x86_64)" ;;
    *) echo "jar.sh: unknown artifact '$artifact' (kvstore or kvstore-mpi)" >&2; exit 1 ;;
esac

mapfile -t sources < <(find kvstore-jni/java/src -name '*.java' | sort)
if [ "${#sources[@]}" -eq 0 ]; then
    echo "jar.sh: no Java sources under kvstore-jni/java/src" >&2
    exit 1
fi

# Fresh output folders, so a deleted source never leaves a stale class in the jar.
rm -rf "$classes" "$staging"
mkdir -p "$classes" "$staging/native/linux-x86_64" "$staging/META-INF/maven/io.github.kvstore/$artifact"
javac --release 17 -Xlint:all -Werror -encoding UTF-8 -d "$classes" "${sources[@]}"
cp "$native" "$staging/native/linux-x86_64/libkvstore_jni.so"

# The POM: no dependencies (the Clojure namespaces need Clojure, which every Clojure
# project brings).
cat >"$pom.tmp" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.github.kvstore</groupId>
  <artifactId>$artifact</artifactId>
  <version>$version</version>
  <packaging>jar</packaging>
  <name>$artifact</name>
  <description>$description</description>
  <licenses>
    <license>
      <name>Apache-2.0</name>
      <url>https://www.apache.org/licenses/LICENSE-2.0</url>
    </license>
  </licenses>
</project>
POM
cp "$pom.tmp" "$staging/META-INF/maven/io.github.kvstore/$artifact/pom.xml"
printf 'groupId=io.github.kvstore\nartifactId=%s\nversion=%s\n' "$artifact" "$version" \
    >"$staging/META-INF/maven/io.github.kvstore/$artifact/pom.properties"
cat >"$staging/MANIFEST.MF" <<MF
Implementation-Title: $artifact
Implementation-Version: $version
Implementation-Vendor-Id: io.github.kvstore
Specification-Title: $artifact
Specification-Version: $version
Automatic-Module-Name: io.github.kvstore
MF

args=(-C "$classes" . -C "$staging" native -C "$staging" META-INF)
# The Clojure namespaces, if any are written yet.
if [ -d clojure/src ] && [ -n "$(find clojure/src -type f -print -quit)" ]; then
    args+=(-C clojure/src .)
fi

# Build next to the target, then rename: a failed build never leaves a half-written jar.
rm -f "$jar.tmp"
jar --create --file "$jar.tmp" --manifest "$staging/MANIFEST.MF" "${args[@]}"
mv -f "$jar.tmp" "$jar"
mv -f "$pom.tmp" "$pom"
ln -sfn "$(basename "$jar")" "target/$artifact.jar"
echo "jar.sh: wrote $jar and $pom, linked target/$artifact.jar ($(jar --list --file "$jar" | grep -c '\.class$') classes, $(jar --list --file "$jar" | grep -c '\.clj[cs]\?$') Clojure files, native library from $native)"
