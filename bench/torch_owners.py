#!/usr/bin/env python3
"""`make bench`'s rows of `dist_sync` owners against PyTorch (issue 77), each in one
`mpirun` job, the two sides in turn:

    mpirun -np 2 python torch_owners.py zero OUT_JSON
    mpirun -np 4 python torch_owners.py scatter OUT_JSON
    mpirun -np 4 python torch_owners.py embedding OUT_JSON

``zero``: bench/torch_dp.py's model (an MLP of 5.0 M parameters on scikit-learn's
digits, global batch 50) trained with Adam by torch's ``ZeroRedundancyOptimizer`` over
``DistributedDataParallel`` (gloo: each rank updates its share of the parameters and
broadcasts it), and by ``kvstore.torch.DataParallel`` in ``"optimizer"`` mode (Adam in
the store, each key's state on its owners): the median step of each, and the optimizer
state each holds on a rank (torch's: its share's ``state`` tensors; kvstore's:
``stats()["held"]["state"]``).

``scatter``: a ``dist_sync`` push of one key of 64 MB of f32 split across the ranks'
owners (the reduce-scatter onto them, an SGD update of each part, the all-gather of the
parts) against the same work in torch's gloo: ``reduce_scatter`` then
``all_gather_into_tensor`` (and ``reduce_scatter`` alone, reported), or, where this
torch's gloo has no ``reduce_scatter`` (Debian's torch 1.13), ``all_reduce``, which
moves the same bytes, timed instead and named so.

``embedding`` (issue 78): a step on a 10^6 x 64 f32 embedding table with Adam, 1 % of
its rows a step on each rank: ``torch.nn.EmbeddingBag(sparse=True)`` under DDP (gloo
allreduces the table's sparse gradient) with ``SparseAdam``, against a ``dist_sync``
table on its owners: a row-sparse push of those rows' gradient and a ``row_sparse_pull``
of another rank's rows.

Rank 0 writes OUT_JSON as the report's rows (name, median_s, limit_s, target).
"""

import datetime
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import kvstore as kv
import kvstore.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_dp import BATCH, TRAIN, model_of  # noqa: E402 (the same model and data)

LR = 0.001
ROUNDS = 3  # rounds of timed steps, the two sides in turn
STEPS = 10  # timed steps per side per round
MB = 64


def timed_in_turn(sides, runs_of):
    """Each side's calls (`runs_of(name)`: the callables of a round), the sides in
    turn (the first side alternates), every call after a barrier: the medians."""
    times = {name: [] for name in sides}
    for r in range(ROUNDS):
        for name in sides if r % 2 == 0 else list(reversed(sides)):
            for run in runs_of(name, r):
                dist.barrier()
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def zero(rank, workers, store):
    from sklearn.datasets import load_digits
    from torch.distributed.optim import ZeroRedundancyOptimizer

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    train = torch.tensor(np.random.default_rng(0).permutation(len(x)))[:TRAIN]
    batches = train[torch.randperm(TRAIN, generator=torch.Generator().manual_seed(1))].split(BATCH)
    shards = [b.view(workers, -1)[rank] for b in batches]
    loss_fn = torch.nn.CrossEntropyLoss()

    z_model = model_of(0)
    z_ddp = torch.nn.parallel.DistributedDataParallel(z_model)
    z_opt = ZeroRedundancyOptimizer(z_model.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    k_model = model_of(0)
    k_dp = kvstore.torch.DataParallel(
        k_model, store, mode="optimizer", optimizer=kv.optimizer.Adam(learning_rate=LR, rescale_grad=1 / workers)
    )

    def zero_step(s):
        z_opt.zero_grad()
        loss_fn(z_ddp(x[s]), y[s]).backward()
        z_opt.step()

    def kv_step(s):
        k_model.zero_grad(set_to_none=False)
        loss_fn(k_dp(x[s]), y[s]).backward()
        k_dp.step()

    steps = {"zero": zero_step, "kvstore": kv_step}
    for s in shards[:3]:
        for run in steps.values():
            run(s)
    med = timed_in_turn(
        ["zero", "kvstore"],
        lambda name, r: [lambda s=s: steps[name](s) for s in shards[3 + r * STEPS : 3 + (r + 1) * STEPS]],
    )
    z_state = sum(
        t.numel() * t.element_size() for st in z_opt.optim.state.values() for t in st.values() if torch.is_tensor(t)
    )
    k_state = store.stats()["held"]["state"]
    states = [None] * workers
    dist.all_gather_object(states, (z_state, k_state))
    total = sum(p.numel() * 4 for p in k_model.parameters())
    z_mb = "/".join(f"{z / 1e6:.1f}" for z, _ in states)
    k_mb = "/".join(f"{k / 1e6:.1f}" for _, k in states)
    label = f"digits MLP 5.0 M, Adam, batch {BATCH}, {workers} ranks"
    return [
        {"name": f"torch: ZeroRedundancyOptimizer over DDP (gloo) training step, {label}", "median_s": med["zero"],
         "limit_s": None, "target": ""},
        {"name": f"torch: kvstore.torch, Adam on owners, vs ZeroRedundancyOptimizer over DDP, {label}",
         "median_s": med["kvstore"], "limit_s": med["zero"],
         "target": f">= 1.5; Adam's state per rank: kvstore {k_mb} MB, ZeRO {z_mb} MB (replicated: "
                   f"{2 * total / 1e6:.1f} MB)"},
    ]


def scatter(rank, workers, store):
    # (16 Mi elements: split across every rank at the default bound of 10^6.)
    n = MB * (1 << 20) // 4
    flat = torch.ones(n)
    outs = torch.empty(n // workers)
    parts = list(flat.split(n // workers))[:workers]
    full = torch.empty(n)
    rows = []
    try:
        dist.reduce_scatter(outs, parts)
    except RuntimeError:
        # Debian's torch 1.13: its gloo has no reduce_scatter; its all_reduce moves the
        # push's bytes (a reduce-scatter and an all-gather in one).
        gloo_name = f"gloo all_reduce (torch {torch.__version__}'s gloo has no reduce_scatter)"
        target = "reported: vs the all_reduce of the same bytes (target: >= 3 x gloo's reduce_scatter and"
        target += " all_gather, where torch has them)"

        def gloo():
            dist.all_reduce(flat)
    else:
        gloo_name = "gloo reduce_scatter and all_gather_into_tensor (the push's work)"
        target = ">= 3 x gloo's reduce_scatter and all_gather"

        def scatter_alone():
            dist.reduce_scatter(outs, parts)

        def gloo():
            dist.reduce_scatter(outs, parts)
            dist.all_gather_into_tensor(full, outs)

        alone = timed_in_turn(["gloo"], lambda name, r: [scatter_alone] * STEPS)["gloo"]
        rows.append({"name": f"torch: gloo reduce_scatter of {MB} MB f32, {workers} ranks", "median_s": alone,
                     "limit_s": None, "target": ""})

    grad = np.ones(n, dtype=np.float32)
    store.init("g", np.zeros(n, dtype=np.float32))
    store.set_optimizer(kv.optimizer.SGD(learning_rate=0.0))

    def push():
        store.push("g", grad)
        store.wait_all()

    for _ in range(2):
        gloo()
        push()
    calls = {"gloo": gloo, "kvstore": push}
    med = timed_in_turn(["gloo", "kvstore"], lambda name, r: [calls[name]] * STEPS)
    label = f"{MB} MB f32, {workers} ranks"
    return rows + [
        {"name": f"torch: {gloo_name} of {label}", "median_s": med["gloo"], "limit_s": None, "target": ""},
        {"name": f"torch: dist_sync push onto owners (reduce-scatter, update, all-gather) of {label}, vs gloo",
         "median_s": med["kvstore"], "limit_s": med["gloo"], "target": target},
    ]


def embedding(rank, workers, store):
    # A 10^6 x 64 f32 table (10^7 rows would hold 7.7 GB per rank under DDP, with
    # SparseAdam's state: more than this machine has for 4 ranks).
    rows, dim = 1_000_000, 64
    n = rows // 100

    def ids(step, r):
        return np.unique((np.arange(n, dtype=np.int64) * 2654435761 + step * 7919 + r * 104729) % rows)

    # DDP: the table on every rank; a step looks up 1 % of its rows (bags of one), runs
    # backward, allreduces the sparse gradient (gloo) and applies SparseAdam.
    table = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
    ddp = torch.nn.parallel.DistributedDataParallel(table)
    adam = torch.optim.SparseAdam(table.parameters(), lr=LR)

    def ddp_step(step):
        looked_up = torch.from_numpy(ids(step, rank)).view(-1, 1)
        adam.zero_grad()
        ddp(looked_up).sum().backward()
        adam.step()

    # kvstore: the table on its owners; a step pushes the same rows' gradient (ones,
    # what the sum's backward gives) and pulls another rank's rows, Adam on the owners.
    store.init("table", kv.sparse.zeros("row_sparse", (rows, dim)))
    store.set_optimizer(kv.optimizer.Adam(learning_rate=LR))
    out = kv.sparse.zeros("row_sparse", (rows, dim))

    def store_step(step):
        mine = ids(step, rank)
        grad = np.ones((len(mine), dim), dtype=np.float32)
        store.push("table", kv.sparse.row_sparse_array((grad, mine), shape=(rows, dim)))
        store.row_sparse_pull("table", out=out, row_ids=ids(step, (rank + 1) % workers))

    for step in range(2):
        ddp_step(step)
        store_step(step)
    steps = iter(range(2, 10_000))
    calls = {"ddp": ddp_step, "kvstore": store_step}
    med = timed_in_turn(["ddp", "kvstore"], lambda name, r: [lambda c=calls[name]: c(next(steps))] * STEPS)
    label = f"a 10^6 x {dim} f32 table with Adam, 1 % of its rows a step, {workers} ranks"
    return [
        {"name": f"torch: EmbeddingBag(sparse=True) under DDP (gloo) with SparseAdam, {label}",
         "median_s": med["ddp"], "limit_s": None, "target": ""},
        {"name": f"torch: dist_sync table on owners (push and row_sparse_pull), {label}, vs DDP's EmbeddingBag",
         "median_s": med["kvstore"], "limit_s": med["ddp"], "target": "reported: DDP allreduces the table's gradient"},
    ]


def main():
    what, out_json = sys.argv[1], sys.argv[2]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    workers = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(1)
    store = kv.create("dist_sync")
    assert (store.rank, store.num_workers) == (rank, workers)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo", rank=rank, world_size=workers, timeout=datetime.timedelta(seconds=300))
    rows = {"zero": zero, "scatter": scatter, "embedding": embedding}[what](rank, workers, store)
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump(rows, f, indent=1)
        for row in rows:
            print(f"{row['name']}: {row['median_s'] * 1e3:.1f} ms {row['target']}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
