#!/usr/bin/env bash
# `make gpu-bundle`: builds kvstore-cuda's GPU tests and GPU bench (release), and the
# Python wheel with its GPU tests, into one folder, target/gpu-bundle (or $1), with a run script, for a machine that has an NVIDIA
# GPU and CUDA 13 but no Rust toolchain and no JDK. There: `bash run.sh [OUT_DIR]`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-bundle}
mkdir -p "$out"
artifacts=$(cargo test -p kvstore-cuda --release --no-run --message-format=json)
bins=$(echo "$artifacts" | python3 scripts/cargo-executables.py --tests)
[ -n "$bins" ] || { echo "gpu-bundle: no test binary was built" >&2; exit 1; }
rm -f "$out"/test-* "$out"/bench_gpu
while read -r name exe; do
    cp "$exe" "$out/test-$name"
done <<<"$bins"
cp "$(bash bench/exe.sh kvstore-cuda gpu)" "$out/bench_gpu"
cp bench/torch_tensors.py "$out/bench_torch.py"
# The Python package and its GPU tests (CUDA tensors through DLPack), with pytest's
# wheels: the GPU machine may have PyTorch but no pytest, and no network.
rm -rf "$out/py"
mkdir -p "$out/py/wheels"
cp "$(bash scripts/python-wheel.sh | tail -n 1)" "$out/py/wheels/"
target/py-build/bin/pip download --quiet --only-binary :all: --dest "$out/py/wheels" pytest
cp kvstore-py/tests/test_gpu.py "$out/py/"
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU test binary of this folder with KVSTORE_REQUIRE_CUDA=1 (a missing GPU
# fails instead of skipping), then the GPU bench and, where PyTorch is installed,
# PyTorch's a+b+c+d on the same arrays. Writes ${1:-.}/gpu-tests.log, gpu-bench.log,
# gpu.json, torch.json and gpu-results.json (all of them, with the machine: the file
# bench/results/<device>-<date>.json is a copy of it).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
# NVRTC and (if only libnccl.so.2 exists) NCCL from Python's nvidia-* packages, when the
# system has no CUDA toolkit on the library path.
for d in $(python3 -c 'import nvidia, os; p = list(nvidia.__path__)[0]; [print(os.path.join(p, x, "lib")) for x in sorted(os.listdir(p))]' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH KVSTORE_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu-tests.log" 2>&1
status=0
for t in "$here"/test-*; do
    echo "== $(basename "$t")" >>"$out/gpu-tests.log"
    "$t" --test-threads=1 --nocapture >>"$out/gpu-tests.log" 2>&1 || status=1
done
# The Python package's GPU tests, run by the system's Python (its PyTorch and numpy,
# wherever they are installed) with the bundled wheels unpacked into a folder of their
# own: a virtualenv would hide packages installed in the user's site folder.
if python3 -c 'import torch, numpy' 2>/dev/null; then
    echo "== python test_gpu.py" >>"$out/gpu-tests.log"
    rm -rf "$out/py-tools" "$out/py-site"
    if python3 -m venv "$out/py-tools" >>"$out/gpu-tests.log" 2>&1 &&
        "$out/py-tools/bin/pip" install --quiet --no-index --no-deps --target "$out/py-site" \
            "$here"/py/wheels/*.whl >>"$out/gpu-tests.log" 2>&1; then
        (cd "$here/py" && PYTHONPATH="$out/py-site" python3 -m pytest -q -rs -p no:cacheprovider test_gpu.py) \
            >>"$out/gpu-tests.log" 2>&1 || status=1
    else
        echo "FAILED: installing the kvstore wheel" >>"$out/gpu-tests.log"
        status=1
    fi
    rm -rf "$out/py-tools" "$out/py-site"
else
    echo "SKIP: no PyTorch with numpy here: the Python GPU tests did not run" >>"$out/gpu-tests.log"
fi
grep -E '^test result|FAILED|panicked|passed|failed' "$out/gpu-tests.log"
"$here/bench_gpu" "$out/gpu.json" >"$out/gpu-bench.log" 2>&1 || status=1
python3 "$here/bench_torch.py" "$out/gpu.json" "$out/torch.json" >>"$out/gpu-bench.log" 2>&1 || status=1
cat "$out/gpu-bench.log"
# One file for bench/results/<device>-<date>.json: the machine, every row with its ratio
# (limit / median), and the test summary lines.
python3 - "$out" <<'PY' || status=1
import json, os, subprocess, sys, time
out = sys.argv[1]
q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader", "-i", "0"],
                   capture_output=True, text=True).stdout.strip().split(", ")
rows = []
for f in ("gpu.json", "torch.json"):
    try:
        rows += json.load(open(os.path.join(out, f)))
    except OSError:
        pass
for r in rows:
    r["ratio"] = r["limit_s"] / r["median_s"] if r.get("limit_s") else None
log = open(os.path.join(out, "gpu-tests.log")).read().splitlines()
tests = [l for l in log if l.startswith(("== ", "test result", "SKIP")) or "FAILED" in l or "panicked" in l
         or " passed" in l or " failed" in l]
result = {"device": q[0], "driver": q[1] if len(q) > 1 else None, "memory": q[2] if len(q) > 2 else None,
          "date": time.strftime("%Y-%m-%d"), "KVSTORE_REQUIRE_CUDA": "1", "tests": tests, "rows": rows}
json.dump(result, open(os.path.join(out, "gpu-results.json"), "w"), indent=1)
print("wrote", os.path.join(out, "gpu-results.json"))
PY
exit $status
RUN
chmod +x "$out/run.sh"
echo "gpu-bundle: wrote $out ($(ls "$out" | tr '\n' ' '))"
