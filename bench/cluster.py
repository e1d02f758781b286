#!/usr/bin/env python3
"""`make bench`'s cluster rows (issue 58): run by bench/cluster.sh under
scripts/cluster.sh, on "hosts" that are network namespaces joined by links shaped to
RATE bits per second.

    mpirun -np N python cluster.py OUT_JSON LABEL RATE HOSTS [--compressed]

Times, in turn, a `dist_sync` push of 64 MB of f32 and torch's gloo allreduce of the same
64 MB (gloo is what a PyTorch user would pick), ROUNDS times each, and reports their
medians against the link's bound: an allreduce of S bytes over n hosts moves
2(n - 1)/n * S bytes across each host's link (in each direction), at RATE. With
--compressed it times instead the same push with 2-bit compression (threshold 0.5)
against the uncompressed one. Rank 0 writes OUT_JSON as the report's rows (name,
median_s, limit_s, target).
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
FLOATS = 16 << 20  # 64 MB of f32


def timed(barrier, f):
    barrier()
    start = time.perf_counter()
    f()
    barrier()
    return time.perf_counter() - start


def main():
    out, label, rate, hosts = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    compressed = "--compressed" in sys.argv[5:]
    store = kv.create("dist_sync")
    rank, size = store.rank, store.num_workers
    grad = np.full(FLOATS, 0.25, np.float32) + np.arange(FLOATS, dtype=np.float32) % 7
    store.init("plain", np.zeros(FLOATS, np.float32))
    bound = 2 * (hosts - 1) / hosts * FLOATS * 4 / (rate / 8)
    times = {"push": [], "other": []}
    if compressed:
        packed = kv.create("dist_sync")
        packed.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        packed.init("packed", np.zeros(FLOATS, np.float32))
        other = lambda: packed.push("packed", grad)  # noqa: E731
    else:
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method="tcp://10.77.0.1:29533", rank=rank, world_size=size,
            timeout=datetime.timedelta(seconds=120),
        )
        tensor = torch.from_numpy(grad.copy())
        other = lambda: dist.all_reduce(tensor)  # noqa: E731
    push = lambda: store.push("plain", grad)  # noqa: E731
    for f in (push, other):  # warm up: connections, buffers
        timed(store.barrier, f)
    for r in range(ROUNDS):
        pair = [("push", push), ("other", other)]
        for name, f in pair if r % 2 == 0 else pair[::-1]:
            times[name].append(timed(store.barrier, f))
    med = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        rows = [
            {
                "name": f"{label}: dist_sync push of 64 MB f32, vs the link's bound",
                "median_s": med["push"],
                "limit_s": bound,
                "target": ">= 0.85 of the link's bound (2(n-1)/n S / rate, n hosts)",
            }
        ]
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
            rows.append(
                {
                    "name": f"{label}: gloo allreduce of 64 MB f32 (torch)",
                    "median_s": med["other"],
                    "limit_s": bound,
                    "target": "the peer, vs the link's bound",
                }
            )
            rows.append(
                {
                    "name": f"{label}: dist_sync push of 64 MB f32, vs gloo",
                    "median_s": med["push"],
                    "limit_s": med["other"],
                    "target": ">= 1.25 x gloo",
                }
            )
        for row in rows:
            print(f"{row['name']}: {row['median_s'] * 1e3:.1f} ms vs {row['limit_s'] * 1e3:.1f} ms", flush=True)
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    kv.finalize()


if __name__ == "__main__":
    main()
