#!/usr/bin/env bash
# Prints the project's version: the workspace version in Cargo.toml ([workspace.package]),
# which every crate, the jar, its manifest and its Maven artifact share.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(awk '/^\[workspace\.package\]/ { inside = 1; next }
               /^\[/ { inside = 0 }
               inside && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml)
if [ -z "$version" ]; then
    echo "version.sh: no version in [workspace.package] of Cargo.toml" >&2
    exit 1
fi
echo "$version"
