"""A bag-of-words classifier whose embedding table lives in the store.

Each step, a rank pulls from the store the rows of the table its batch needs
(``row_sparse_pull``), runs a ``torch.nn.EmbeddingBag`` over just those rows and a linear
head, and pushes the rows' gradients back as a row-sparse array; the store runs Adam
lazily on those rows. Under ``mpirun`` the store is ``dist_sync``: each rank holds its
own rows of the table and of their Adam state only (1/n of them), and a push sends each
row to its owner, so the table may be bigger than any one machine.

    mpirun -np 2 python train_embeddings.py --rows 10000000

Tokens come from a vocabulary of ``--vocab`` words spread over the table's rows; a bag's
label is whether most of its words are "positive" (even-numbered): the model must learn
each word's embedding.
"""

import argparse
import os
import sys

import numpy as np
import torch

import kvstore
from kvstore import optimizer, sparse

BAG = 9


def say(line):
    """Prints `line` in one write: the ranks' lines reach mpirun's output whole."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def batch(rng, vocab, rows, size):
    """`size` bags of BAG words: their rows of the table, and their labels."""
    words = rng.integers(0, vocab, size=(size, BAG))
    labels = ((words % 2 == 0).sum(axis=1) > BAG // 2).astype(np.int64)
    # Word k lives at row k * 2654435761 mod rows: spread over every rank's rows.
    return (words * 2654435761) % rows, labels


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    torch.manual_seed(0)
    kv = kvstore.create("dist_sync" if "OMPI_COMM_WORLD_SIZE" in os.environ else "local")
    rank, ranks = kv.rank, kv.num_workers
    shape = (args.rows, args.dim)

    # The table starts as zeros (no row stored: nothing to send), the head at random
    # (rank 0's values reach every rank).
    kv.init("embedding", sparse.zeros("row_sparse", shape))
    head = torch.nn.Linear(args.dim, 2)
    kv.init("head.weight", head.weight.detach().numpy())
    kv.init("head.bias", head.bias.detach().numpy())
    # Sums of the ranks' gradients, averaged: each rank's batch is 1/ranks of the step's.
    kv.set_optimizer(optimizer.create("adam", learning_rate=0.05, rescale_grad=1.0 / ranks))

    rng = np.random.default_rng(rank)
    for step in range(1, args.steps + 1):
        rows, labels = batch(rng, args.vocab, args.rows, args.batch)
        needed, at = np.unique(rows, return_inverse=True)
        # The rows this batch needs, from their owners.
        pulled = sparse.zeros("row_sparse", shape)
        kv.row_sparse_pull("embedding", out=pulled, row_ids=needed)
        bag = torch.nn.EmbeddingBag(len(needed), args.dim, mode="mean", sparse=True)
        bag.weight.data = torch.from_numpy(pulled.data)
        head.weight.data = torch.from_numpy(kv.pull("head.weight"))
        head.bias.data = torch.from_numpy(kv.pull("head.bias"))
        head.zero_grad()
        logits = head(bag(torch.from_numpy(at.reshape(args.batch, BAG))))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
        loss.backward()
        # The embedding's gradient is sparse: its rows of the batch, back to the table's rows.
        grad = bag.weight.grad.coalesce()
        local = grad.indices()[0].numpy()
        kv.push("embedding", sparse.row_sparse_array((grad.values().numpy(), needed[local]), shape=shape))
        kv.push("head.weight", head.weight.grad.numpy())
        kv.push("head.bias", head.bias.grad.numpy())
        if step % 50 == 0 and rank == 0:
            accuracy = (logits.argmax(dim=1).numpy() == labels).mean()
            say(f"step {step} loss {loss.item():.4f} accuracy {accuracy:.2f}")

    held = kv.stats()["held"]
    table = args.rows * args.dim * 4
    say(
        f"rank {rank} of {ranks} holds {held['values'] / table:.3f} of the table's values and "
        f"{held['state'] / (2 * table):.3f} of its Adam state"
    )


if __name__ == "__main__":
    main()
