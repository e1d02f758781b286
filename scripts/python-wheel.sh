#!/usr/bin/env bash
# `make python`: builds the Python package's wheel into target/wheels/, a manylinux one
# (manylinux_2_17, glibc 2.17 or later: any x86_64 Linux pip supports), with maturin
# linking through zig against that glibc's symbols (`--zig --compatibility
# manylinux2014`), from a build virtualenv target/py-build that holds maturin, ziglang
# and auditwheel (which `make test` asks what the wheel needs: scripts/test-python.sh).
#
# KVSTORE_PY_FEATURES=mpi builds the kvstore-mpi distribution instead: the same
# package `kvstore`, with dist_sync over Open MPI (which it links and needs at run
# time, so the wheel keeps the system's MPI rather than bundling one: auditwheel is
# skipped and the wheel is tagged linux_x86_64). It is built from a staged copy of
# kvstore-py (target/py-mpi-src) whose pyproject.toml names the distribution
# kvstore-mpi and turns the feature on. Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
features=${KVSTORE_PY_FEATURES:-}
mkdir -p target/wheels
# pip and maturin build under TMPDIR: keep their files out of /tmp, in a folder of this
# run's own (another script may be building beside it).
mkdir -p target
TMPDIR=$(mktemp -d "$root/target/py-wheel-tmp.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
# The build tools, pinned to the ranges they were checked with (maturin reads the
# pyproject's [tool.maturin]; ziglang is the zig toolchain as a Python package).
tools="maturin>=1.9,<2 ziglang>=0.13,<0.14 auditwheel>=6,<7"
if [ ! -x target/py-build/bin/pip ] || [ "$(cat target/py-build/.kvstore-tools 2>/dev/null)" != "$tools" ]; then
    rm -rf target/py-build
    python3 -m venv target/py-build
    target/py-build/bin/pip install --quiet --upgrade pip
    # shellcheck disable=SC2086 # one requirement per word
    target/py-build/bin/pip install --quiet $tools
    echo "$tools" >target/py-build/.kvstore-tools
fi
case "$features" in
    "")
        src=kvstore-py
        dist=kvstore
        ;;
    mpi)
        bash scripts/setup-mpi.sh
        src=target/py-mpi-src
        dist=kvstore_mpi
        rm -rf "$src"
        mkdir -p "$src"
        cp -r kvstore-py/python kvstore-py/README.md "$src/"
        # The launcher (kvstore-commit's kvstore-run), a program of its own in the package,
        # run by the console script `kvstore-run` (kvstore/_run.py).
        cargo build --release --quiet -p kvstore-commit --bin kvstore-run >&2
        mkdir -p "$src/python/kvstore/bin"
        cp target/release/kvstore-run "$src/python/kvstore/bin/"
        # The package's pyproject.toml, renamed, with the feature and the crate's path.
        awk -v manifest="$root/kvstore-py/Cargo.toml" '
            /^name = "kvstore"$/ { print "name = \"kvstore-mpi\""; next }
            /^description = / { print "description = \"MXNet'"'"'s KVStore, rebuilt in Rust, with dist_sync across the processes of an MPI job (Open MPI)\""; next }
            /^manifest-path = / { print "manifest-path = \"" manifest "\""; print "features = [\"mpi\"]"; print "compatibility = \"linux\""; print "auditwheel = \"skip\""; next }
            /^\[project.optional-dependencies\]$/ { print "[project.scripts]"; print "kvstore-run = \"kvstore._run:main\""; print ""; print; next }
            { print }' kvstore-py/pyproject.toml >"$src/pyproject.toml"
        ;;
    *)
        echo "python-wheel.sh: unknown FEATURES '$features' (the Python package has: mpi)" >&2
        exit 2
        ;;
esac
version=$(bash scripts/version.sh)
rm -f target/wheels/"$dist"-"$version"-*.whl
if [ "$dist" = kvstore ]; then
    (cd "$src" && PATH="$root/target/py-build/bin:$PATH" maturin build --quiet --release --zig \
        --compatibility manylinux2014 -o "$root/target/wheels" >&2)
else
    target/py-build/bin/pip wheel --quiet --no-deps "./$src" -w target/wheels
fi
ls target/wheels/"$dist"-"$version"-*.whl
