#!/usr/bin/env bash
# `make install`: puts target/<artifact>-<version>.jar and its POM into the local Maven
# repository, laid out as `mvn install` lays it out, so that Maven, Leiningen and
# tools.deps projects resolve io.github.kvstore/<artifact> "<version>" with no network:
#   <repo>/io/github/kvstore/<artifact>/<version>/<artifact>-<version>.{jar,pom}
#   <repo>/io/github/kvstore/<artifact>/<version>/_remote.repositories  (installed locally)
#   <repo>/io/github/kvstore/<artifact>/maven-metadata-local.xml         (versions present)
# The artifact is ${KVSTORE_ARTIFACT:-kvstore} (kvstore-mpi for the MPI build); the
# repository is ${M2_REPO:-$HOME/.m2/repository}. Build the jar first (make jar). The MPI
# build also installs the launcher kvstore-run (docs/recovery.md) into
# ${KVSTORE_BIN_DIR:-$HOME/.local/bin}.
set -euo pipefail
cd "$(dirname "$0")/.."

artifact=${KVSTORE_ARTIFACT:-kvstore}
version=$(bash scripts/version.sh)
repo=${M2_REPO:-$HOME/.m2/repository}
jar=target/$artifact-$version.jar
pom=target/$artifact-$version.pom
for f in "$jar" "$pom"; do
    if [ ! -f "$f" ]; then
        echo "install.sh: $f not found: build it first (make jar${KVSTORE_ARTIFACT:+ FEATURES=mpi})" >&2
        exit 1
    fi
done

base=$repo/io/github/kvstore/$artifact
dir=$base/$version
mkdir -p "$dir"
# Copy, then rename: a reader never sees a half-written jar.
for f in "$jar" "$pom"; do
    cp "$f" "$dir/.$(basename "$f").tmp"
    mv -f "$dir/.$(basename "$f").tmp" "$dir/$(basename "$f")"
done
# Maven Resolver's record of where the files came from: an empty repository id means
# installed locally, so no resolver ever tries to download or check them.
cat >"$dir/_remote.repositories" <<REMOTE
#NOTE: This is a Maven Resolver internal implementation file, its format can be changed without prior notice.
#$(date -u)
$artifact-$version.jar>=
$artifact-$version.pom>=
REMOTE

# The versions of the artifact in this repository (those with a POM), oldest first.
versions=$(find "$base" -mindepth 2 -maxdepth 2 -name "$artifact-*.pom" -printf '%h\n' | xargs -n1 basename | sort -V)
release=$(echo "$versions" | tail -n 1)
{
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo '<metadata>'
    echo '  <groupId>io.github.kvstore</groupId>'
    echo "  <artifactId>$artifact</artifactId>"
    echo '  <versioning>'
    echo "    <latest>$release</latest>"
    echo "    <release>$release</release>"
    echo '    <versions>'
    for v in $versions; do echo "      <version>$v</version>"; done
    echo '    </versions>'
    echo "    <lastUpdated>$(date -u +%Y%m%d%H%M%S)</lastUpdated>"
    echo '  </versioning>'
    echo '</metadata>'
} >"$base/maven-metadata-local.xml.tmp"
mv -f "$base/maven-metadata-local.xml.tmp" "$base/maven-metadata-local.xml"
echo "install.sh: installed io.github.kvstore/$artifact $version into ${dir/#$HOME/\~}"
if [ "$artifact" = kvstore-mpi ]; then
    bin=${KVSTORE_BIN_DIR:-$HOME/.local/bin}
    cargo build --release --quiet -p kvstore-commit --bin kvstore-run
    mkdir -p "$bin"
    cp target/release/kvstore-run "$bin/.kvstore-run.tmp"
    mv -f "$bin/.kvstore-run.tmp" "$bin/kvstore-run"
    echo "install.sh: installed the launcher kvstore-run into ${bin/#$HOME/\~}"
fi
