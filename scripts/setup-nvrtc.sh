#!/usr/bin/env bash
# NVRTC (CUDA 13) from PyPI's nvidia-cuda-nvrtc wheel, unpacked into target/nvrtc (no
# CUDA toolkit, no GPU needed): `make test` compiles kvstore-cuda's kernels with it.
# Prints the folder that holds libnvrtc.so.13.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/nvrtc
lib=$(find "$dir" -name 'libnvrtc.so.13' -printf '%h\n' 2>/dev/null | head -n 1 || true)
if [ -z "$lib" ]; then
    mkdir -p "$dir/wheels"
    for try in 1 2 3; do
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" 'nvidia-cuda-nvrtc==13.*' >&2 && break
        [ "$try" -eq 3 ] && { echo "setup-nvrtc: pip could not download nvidia-cuda-nvrtc" >&2; exit 1; }
        sleep 5
    done
    python3 - "$dir" <<'PY'
import glob, sys, zipfile
d = sys.argv[1]
for whl in glob.glob(f"{d}/wheels/*.whl"):
    zipfile.ZipFile(whl).extractall(f"{d}/unpacked")
PY
    lib=$(find "$dir" -name 'libnvrtc.so.13' -printf '%h\n' | head -n 1)
fi
[ -n "$lib" ] || { echo "setup-nvrtc: no libnvrtc.so.13 in the wheel" >&2; exit 1; }
cd "$lib" && pwd
