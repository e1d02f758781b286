"""Data-parallel training of a PyTorch MLP on scikit-learn's digits with kvstore.torch.

    mpirun -np 2 python train_digits.py         # dist_sync: each rank a shard of every batch
    python train_digits.py                      # one process, a local store, whole batches

Under mpirun (Open MPI's OMPI_COMM_WORLD_SIZE is set) the store is ``dist_sync`` (with
``pip install "kvstore[mpi]"``), else ``local`` (``--store`` chooses). An MLP of 5.0 M
parameters (64-2200-2200-10) learns the 8x8 digits (1797 images, no download: they come
with scikit-learn): 1500 to train on, the other 297 held out. Every epoch shuffles the
training images the same way on every rank; each global batch of 50 is cut into one
shard per rank, and kvstore.torch averages the gradients, so that the ranks train one
model: the run is deterministic and its weights match a one-process run on the whole
batches. Rank 0 prints, per epoch, the loss and accuracy on the held-out images::

    epoch 1 loss 0.2871 accuracy 0.9327

``--mode optimizer`` runs SGD in the store instead of torch's. ``--save PREFIX`` writes
each rank's final weights to PREFIX.<rank>.npy (float32, the parameters in order).
"""

import argparse
import os
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

import kvstore as kv
import kvstore.torch
from kvstore import optimizer as kv_optimizer

HIDDEN = 2200
BATCH = 50
TRAIN = 1500
LR = 0.05
MOMENTUM = 0.9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--mode", choices=kvstore.torch.MODES, default="sum")
    parser.add_argument("--store", default="dist_sync" if "OMPI_COMM_WORLD_SIZE" in os.environ else "local")
    parser.add_argument("--save", help="write the final weights to SAVE.<rank>.npy")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.tensor(np.random.default_rng(0).permutation(len(x)))
    train, test = order[:TRAIN], order[TRAIN:]

    model = torch.nn.Sequential(
        torch.nn.Linear(64, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 10),
    )
    store = kv.create(args.store)
    rank, workers = store.rank, store.num_workers
    assert BATCH % workers == 0, f"the batch of {BATCH} does not split into {workers} shards"
    if args.mode == "sum":
        dp = kvstore.torch.DataParallel(model, store)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    else:
        sgd = kv_optimizer.SGD(learning_rate=LR, momentum=MOMENTUM, rescale_grad=1.0 / workers)
        dp = kvstore.torch.DataParallel(model, store, mode="optimizer", optimizer=sgd)
        opt = None
    loss_fn = torch.nn.CrossEntropyLoss()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"{params / 1e6:.1f} M parameters, {workers} worker(s), store {store.type}, mode {args.mode}")

    shuffle = torch.Generator().manual_seed(1)
    start = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        model.train()
        batches = train[torch.randperm(TRAIN, generator=shuffle)].split(BATCH)
        for batch in batches:
            shard = batch.view(workers, -1)[rank]  # this rank's part of the batch
            model.zero_grad()
            loss_fn(dp(x[shard]), y[shard]).backward()
            dp.step(opt)
        model.eval()
        with torch.no_grad():
            out = model(x[test])
            loss = loss_fn(out, y[test]).item()
            accuracy = (out.argmax(1) == y[test]).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch} loss {loss:.4f} accuracy {accuracy:.4f}", flush=True)
    if rank == 0:
        print(f"{time.monotonic() - start:.1f} s", flush=True)
    if args.save:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        np.save(f"{args.save}.{rank}.npy", weights.numpy())


if __name__ == "__main__":
    main()
