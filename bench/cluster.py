#!/usr/bin/env python3
"""`make bench`'s cluster rows (issue 58): run by bench/cluster.sh under
scripts/cluster.sh, on "hosts" that are network namespaces joined by links shaped to
RATE bits per second.

    mpirun -np N python cluster.py OUT_JSON LABEL RATE HOSTS [--compressed] [--sizes MB,...]

Times, in turn, a `dist_sync` push of 64 MB of f32 (or each of --sizes) and torch's gloo
allreduce of the same (gloo is what a PyTorch user would pick), ROUNDS times each, and
reports their medians, and the push against the link's bound: an allreduce of S bytes
over n hosts moves 2(n - 1)/n * S bytes across each host's link (in each direction), at
RATE bits per second (0: no link, no bound). With --compressed it times instead the
push with 2-bit compression (threshold 0.5) against the uncompressed one. gloo meets at
KVSTORE_BENCH_GLOO_ADDR (default 10.77.0.1, the cluster's host 0). Rank 0 writes
OUT_JSON as the report's rows (name, median_s, limit_s, target).
"""

import datetime
import json
import os
import statistics
import sys
import time

import numpy as np

import kvstore as kv

ROUNDS = 7


def timed(barrier, f):
    barrier()
    start = time.perf_counter()
    f()
    barrier()
    return time.perf_counter() - start


def main():
    out, label, rate, hosts = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    flags = sys.argv[5:]
    compressed = "--compressed" in flags
    sizes = [int(x) for x in flags[flags.index("--sizes") + 1].split(",")] if "--sizes" in flags else [64]
    store = kv.create("dist_sync")
    rank, size = store.rank, store.num_workers
    if compressed:
        packed = kv.create("dist_sync")
        packed.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    else:
        import torch
        import torch.distributed as dist

        addr = os.environ.get("KVSTORE_BENCH_GLOO_ADDR", "10.77.0.1")
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:29533", rank=rank, world_size=size,
            timeout=datetime.timedelta(seconds=120),
        )
    rows = []
    for mb in sizes:
        floats = mb << 18
        grad = np.full(floats, 0.25, np.float32) + np.arange(floats, dtype=np.float32) % 7
        store.init(f"plain{mb}", np.zeros(floats, np.float32))
        push = lambda: store.push(f"plain{mb}", grad)  # noqa: E731
        if compressed:
            packed.init(f"packed{mb}", np.zeros(floats, np.float32))
            other = lambda: packed.push(f"packed{mb}", grad)  # noqa: E731
        else:
            tensor = torch.from_numpy(grad.copy())
            other = lambda: dist.all_reduce(tensor)  # noqa: E731
        times = {"push": [], "other": []}
        for f in (push, other):  # warm up: connections, buffers
            timed(store.barrier, f)
        for r in range(ROUNDS):
            pair = [("push", push), ("other", other)]
            for name, f in pair if r % 2 == 0 else pair[::-1]:
                times[name].append(timed(store.barrier, f))
        med = {k: statistics.median(v) for k, v in times.items()}
        if rate > 0:
            rows.append(
                {
                    "name": f"{label}: dist_sync push of {mb} MB f32, vs the link's bound",
                    "median_s": med["push"],
                    "limit_s": 2 * (hosts - 1) / hosts * floats * 4 / (rate / 8),
                    "target": ">= 0.85 of the link's bound (2(n-1)/n S / rate, n hosts)",
                }
            )
        if compressed:
            rows.append(
                {
                    "name": f"{label}: the same push 2-bit compressed, vs uncompressed",
                    "median_s": med["other"],
                    "limit_s": med["push"],
                    "target": ">= 4 (the link carries 1/16 of the bytes)",
                }
            )
        else:
            rows.append({"name": f"{label}: gloo allreduce of {mb} MB f32 (torch)", "median_s": med["other"]})
            rows.append(
                {
                    "name": f"{label}: dist_sync push of {mb} MB f32, vs gloo",
                    "median_s": med["push"],
                    "limit_s": med["other"],
                    "target": ">= 1.5 x gloo" if mb < 64 else ">= 1.25 x gloo",
                }
            )
    if rank == 0:
        for row in rows:
            limit = f" vs {row['limit_s'] * 1e3:.1f} ms" if "limit_s" in row else ""
            print(f"{row['name']}: {row['median_s'] * 1e3:.1f} ms{limit}", flush=True)
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    kv.finalize()


if __name__ == "__main__":
    main()
