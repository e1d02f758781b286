#!/usr/bin/env python3
"""`make bench`'s PyTorch rows (issue 40): the same model, data, batch and optimizer
trained data-parallel on 2 ranks with `torch.nn.parallel.DistributedDataParallel`
(gloo) and with `kvstore.torch.DataParallel` over `dist_sync`, in one `mpirun -np 2`
job, the two in turn (DDP first in even rounds).

    mpirun -np 2 python torch_dp.py OUT_JSON

The model is kvstore-py/examples/train_digits.py's (an MLP of 5.0 M parameters on
scikit-learn's digits, global batch 50, SGD with momentum). Per trainer: the median
time of a training step (forward, backward, the gradients' sum over the ranks, the
optimizer step), the same step with no communication (each rank alone: the compute),
the communication alone (the gradients' sum with no compute), and the held-out accuracy
after the same epochs. Exposed communication = (step - compute) / communication alone.
Rank 0 writes OUT_JSON as the report's rows (name, median_s, limit_s, target).
"""

import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits

import kvstore as kv
import kvstore.torch

HIDDEN = 2200
BATCH = 50
TRAIN = 1500
LR = 0.05
MOMENTUM = 0.9
EPOCHS = 2
ROUNDS = 3  # rounds of timed steps, the trainers in turn
STEPS = 10  # timed steps per trainer per round


def model_of(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 10),
    )


def main():
    out_json = sys.argv[1]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    workers = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(1)
    store = kv.create("dist_sync")
    assert (store.rank, store.num_workers) == (rank, workers)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=workers, timeout=datetime.timedelta(seconds=120))

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.tensor(np.random.default_rng(0).permutation(len(x)))
    train, test = order[:TRAIN], order[TRAIN:]
    loss_fn = torch.nn.CrossEntropyLoss()

    # The two trainers: the same starting weights, each its own copy.
    ddp_model = model_of(0)
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=LR, momentum=MOMENTUM)
    kv_model = model_of(0)
    kvdp = kvstore.torch.DataParallel(kv_model, store)
    kv_opt = torch.optim.SGD(kv_model.parameters(), lr=LR, momentum=MOMENTUM)
    trainers = {
        "ddp": (ddp, ddp_model, lambda: ddp_opt.step(), ddp_opt),
        "kvstore": (kvdp, kv_model, lambda: kvdp.step(kv_opt), kv_opt),
    }

    def step(name, shard):
        wrapper, model, finish, opt = trainers[name]
        opt.zero_grad()
        loss_fn(wrapper(x[shard]), y[shard]).backward()
        finish()

    def compute_only(name, shard):
        # The same step with no communication: the bare model, this rank's shard.
        _, model, _, opt = trainers[name]
        bare = model_of(1)
        bare.load_state_dict(model.state_dict())
        o = torch.optim.SGD(bare.parameters(), lr=LR, momentum=MOMENTUM)

        def run():
            o.zero_grad()
            loss_fn(bare(x[shard]), y[shard]).backward()
            o.step()

        return run

    shuffle = torch.Generator().manual_seed(1)
    batches = train[torch.randperm(TRAIN, generator=shuffle)].split(BATCH)
    shards = [b.view(workers, -1)[rank] for b in batches]

    # Warm up, then the timed rounds, the trainers in turn.
    for name in trainers:
        for s in shards[:3]:
            step(name, s)
    times = {"ddp": [], "kvstore": []}
    for r in range(ROUNDS):
        names = ["ddp", "kvstore"] if r % 2 == 0 else ["kvstore", "ddp"]
        for name in names:
            for s in shards[3 + r * STEPS : 3 + (r + 1) * STEPS]:
                dist.barrier()
                t = time.perf_counter()
                step(name, s)
                times[name].append(time.perf_counter() - t)

    # Compute alone (no communication) and communication alone (no compute).
    compute = []
    run = compute_only("ddp", shards[0])
    for _ in range(ROUNDS * STEPS):
        t = time.perf_counter()
        run()
        compute.append(time.perf_counter() - t)
    flat = torch.cat([p.detach().reshape(-1) for p in ddp_model.parameters()])
    gloo_comm, kv_comm = [], []
    grads = [torch.ones_like(p) for p in kv_model.parameters()]
    keys = kvdp.keys
    for _ in range(ROUNDS * STEPS):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(flat)
        gloo_comm.append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter()
        store.pushpull(keys, grads)
        kv_comm.append(time.perf_counter() - t)

    # Train both to the end of the same epochs, then the held-out accuracy.
    accuracy = {}
    for name in trainers:
        for epoch in range(EPOCHS):
            for s in shards:
                step(name, s)
        model = trainers[name][1]
        with torch.no_grad():
            accuracy[name] = (model(x[test]).argmax(1) == y[test]).float().mean().item()

    # The timeline's cost: kvstore.torch's step with the timeline written and without, in
    # turn, on a trainer and a store of its own (the trainers above are left as they were).
    tl_store = kv.create("dist_sync")
    tl_model = model_of(0)
    tl_dp = kvstore.torch.DataParallel(tl_model, tl_store)
    tl_opt = torch.optim.SGD(tl_model.parameters(), lr=LR, momentum=MOMENTUM)
    trace = os.path.join(tempfile.gettempdir(), f"kvstore-bench-torch-timeline-{os.getppid()}.json")
    tl_times = {True: [], False: []}
    for r in range(2 * ROUNDS):
        for on in [True, False] if r % 2 == 0 else [False, True]:
            if on:
                tl_store.start_timeline(trace)
            for s in [shards[(3 + r * STEPS + k) % len(shards)] for k in range(STEPS)]:
                dist.barrier()
                t = time.perf_counter()
                tl_opt.zero_grad()
                loss_fn(tl_dp(x[s]), y[s]).backward()
                tl_dp.step(tl_opt)
                tl_times[on].append(time.perf_counter() - t)
            if on:
                tl_store.stop_timeline()
                stem, ext = os.path.splitext(trace)
                for f in [f"{stem}.rank{rank}{ext}"] + ([trace] if rank == 0 else []):
                    if os.path.exists(f):
                        os.remove(f)

    med = {k: statistics.median(v) for k, v in times.items()}
    c = statistics.median(compute)
    comm = {"ddp": statistics.median(gloo_comm), "kvstore": statistics.median(kv_comm)}
    exposed = {k: max(0.0, med[k] - c) / comm[k] for k in med}
    if rank == 0:
        label = f"digits MLP 5.0 M, batch {BATCH}, {workers} ranks"
        rows = [
            {"name": f"torch: DDP (gloo) training step, {label}", "median_s": med["ddp"], "limit_s": None,
             "target": f"accuracy {accuracy['ddp']:.4f}; exposed communication {exposed['ddp']:.2f}"},
            {"name": f"torch: kvstore.torch (dist_sync) training step vs DDP, {label}", "median_s": med["kvstore"],
             "limit_s": med["ddp"],
             "target": f">= 1.25 (<= 0.8 x DDP); accuracy {accuracy['kvstore']:.4f} vs DDP {accuracy['ddp']:.4f} "
                       f"(within 0.005); exposed communication {exposed['kvstore']:.2f}"},
            {"name": f"torch: the same step without communication (compute), {label}", "median_s": c,
             "limit_s": None, "target": ""},
            {"name": "torch: gradients' sum alone, gloo allreduce of 20 MB", "median_s": comm["ddp"],
             "limit_s": None, "target": ""},
            {"name": "torch: gradients' sum alone, dist_sync pushpull of 6 keys, 20 MB", "median_s": comm["kvstore"],
             "limit_s": comm["ddp"], "target": "> 1: faster than gloo"},
            {"name": f"torch: kvstore.torch training step with the timeline written (vs off, in turn), {label}",
             "median_s": statistics.median(tl_times[True]), "limit_s": statistics.median(tl_times[False]),
             "target": ">= 0.97 (within 3 % of off)"},
        ]
        with open(out_json, "w") as f:
            json.dump(rows, f, indent=1)
        for r in rows:
            ratio = f"{r['limit_s'] / r['median_s']:.2f}" if r["limit_s"] else ""
            print(f"{r['name']:<80} {r['median_s'] * 1e3:9.3f} ms {ratio:>6}  {r['target']}")
        print(f"wrote {out_json}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
