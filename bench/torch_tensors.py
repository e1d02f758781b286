#!/usr/bin/env python3
"""PyTorch's `a + b + c + d` on four 64 Mi f32 arrays on cuda:0, timed as bench_gpu times
its 4-input reduction (median of 21 runs after 3 warm-ups, each waiting for the GPU).

    torch_tensors.py GPU_JSON OUT_JSON

Reads bench_gpu's rows from GPU_JSON and writes OUT_JSON with PyTorch's time and the
row comparing the two (ratio = PyTorch's time / kvstore's: > 1 means kvstore is
faster). Prints `SKIP: ...` and writes nothing without PyTorch or a CUDA device.
"""
import json
import sys
import time


def main() -> int:
    gpu_json, out_json = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed: torch_tensors")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: PyTorch sees no CUDA device: torch_tensors")
        return 0
    try:
        rows = json.load(open(gpu_json))
    except OSError:
        print(f"SKIP: no bench_gpu results in {gpu_json}: torch_tensors")
        return 0
    ours = next(r for r in rows if "4-input reduce of 64 Mi f32" in r["name"])
    n = 64 << 20
    a, b, c, d = (torch.full((n,), 1.0 + i, dtype=torch.float32, device="cuda:0") for i in range(4))

    def run():
        s = a + b + c + d
        torch.cuda.synchronize()
        return s

    for _ in range(3):
        run()
    times = []
    for _ in range(21):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    times.sort()
    t = times[len(times) // 2]
    assert bool((run() == 10.0).all()), "torch sum is wrong"
    name = torch.cuda.get_device_name(0)
    out = [
        {"name": f"{name}: torch a+b+c+d of 64 Mi f32 (torch {torch.__version__})", "median_s": t, "limit_s": None},
        {"name": f"{name}: kvstore 4-input reduce vs torch a+b+c+d", "median_s": ours["median_s"], "limit_s": t},
    ]
    json.dump(out, open(out_json, "w"), indent=1)
    for r in out:
        ratio = f"{r['limit_s'] / r['median_s']:.2f}" if r["limit_s"] else ""
        print(f"{r['name']:<72} {r['median_s'] * 1e3:>9.3f} ms {ratio:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
