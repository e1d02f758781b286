"""gluon's Trainer over dist_sync, run by test_dist_gluon.py.

`gluon_worker.py dist OUT UPDATE_ON_KVSTORE ROWS DEVICES` (one rank of `mpirun -np 2`):
imports kvstore.mxnet, builds a small MLP on DEVICES devices (mx.cpu(0), ...) with
weights from a fixed seed, and trains it STEPS steps with `gluon.Trainer(..., "sgd",
..., kvstore="dist_sync", update_on_kvstore=...)`, device j of rank r fed shard
r * DEVICES + j (ROWS rows) of each batch, then writes its final weights' bytes to
OUT.<rank>.npy. UPDATE_ON_KVSTORE is 1 or 0.

`gluon_worker.py reference OUT UPDATE_ON_KVSTORE ROWS DEVICES STORE` (one process, no
MPI): the same net, weights and batches on DEVICES devices, device i fed shard i,
through the `device` store: STORE `native` is MXNet's own, `ours` this store's
(kvstore.mxnet). Writes OUT.npy.

Gluon uses no store with one device on one machine, but takes one for a dist kind
(mxnet/model.py `_create_kvstore`: `num_device == 1 and 'dist' not in kvstore`), so
every rank's Trainer pushes through the store: each step's gradients are summed over
the ranks, and then either the store's optimizer updates the weights
(update_on_kvstore=True: `set_optimizer`, `pushpull(grad, out=weight)`) or each rank's
own MXNet updater does (False: `pushpull(grad)` in place, then `updater`).
"""

import os
import sys

import numpy as np

STEPS = 10
IN, HIDDEN, OUT = 5, 8, 3
OPTIMIZER = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def shard(index: int, step: int, rows: int):
    """Shard `index` of batch `step` (each device's differ)."""
    rng = np.random.RandomState(100 * step + index)
    x = rng.randn(rows, IN).astype(np.float32)
    y = rng.randint(0, OUT, size=rows).astype(np.float32)
    return x, y


def build(mx, ctxs):
    from mxnet import gluon

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(HIDDEN, activation="relu", in_units=IN), gluon.nn.Dense(OUT, in_units=HIDDEN))
    net.initialize(mx.init.Zero(), ctx=ctxs)
    # Fixed weights, the same in every process (however many devices it has).
    rng = np.random.RandomState(7)
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, size=p.shape).astype(np.float32)))
    return net


def train(mx, net, ctxs, shards, rows, batch, kvstore, update_on_kvstore):
    """Trains `net` on `ctxs`, device i fed shard shards[i]; returns the trainer."""
    from mxnet import autograd, gluon

    trainer = gluon.Trainer(
        net.collect_params(), "sgd", dict(OPTIMIZER), kvstore=kvstore, update_on_kvstore=update_on_kvstore
    )
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        losses = []
        with autograd.record():
            for ctx, index in zip(ctxs, shards):
                x, y = shard(index, step, rows)
                losses.append(loss_fn(net(mx.nd.array(x, ctx=ctx)), mx.nd.array(y, ctx=ctx)))
        for loss in losses:
            loss.backward()
        trainer.step(batch)  # the whole batch, over every rank and device
    return trainer


def weights(net, ctx) -> np.ndarray:
    return np.concatenate([p.data(ctx).asnumpy().ravel() for p in net.collect_params().values()])


def dist(out: str, update_on_kvstore: bool, rows: int, devices: int) -> None:
    import mxnet as mx

    import kvstore.mxnet as kmx

    # The store's rank is known once the Trainer made it; the data is needed before.
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    ctxs = [mx.cpu(j) for j in range(devices)]
    net = build(mx, ctxs)
    shards = [rank * devices + j for j in range(devices)]
    trainer = train(mx, net, ctxs, shards, rows, 2 * devices * rows, "dist_sync", update_on_kvstore)
    kv = trainer._kvstore
    assert isinstance(kv, kmx.KVStore), type(kv)
    assert kv.type == "dist_sync", kv.type
    assert (kv.rank, kv.num_workers) == (rank, 2), (kv.rank, kv.num_workers)
    assert trainer._distributed is True
    assert trainer._update_on_kvstore == update_on_kvstore, trainer._update_on_kvstore
    w = [weights(net, c) for c in ctxs]
    assert all(x.tobytes() == w[0].tobytes() for x in w), "this rank's devices' weights differ"
    np.save(f"{out}.{rank}.npy", w[0])
    kv._barrier()
    print(f"rank {rank}: done, update_on_kvstore={update_on_kvstore}")


def reference(out: str, update_on_kvstore: bool, rows: int, devices: int, store: str) -> None:
    import mxnet as mx

    import kvstore.mxnet as kmx

    if store == "native":
        kmx.unregister()
    ctxs = [mx.cpu(i) for i in range(devices)]
    net = build(mx, ctxs)
    trainer = train(mx, net, ctxs, list(range(devices)), rows, devices * rows, "device", update_on_kvstore)
    kv = trainer._kvstore
    if store == "native":
        assert type(kv) is mx.kv.KVStore, type(kv)
    else:
        assert isinstance(kv, kmx.KVStore), type(kv)
    assert trainer._update_on_kvstore == update_on_kvstore, trainer._update_on_kvstore
    w = [weights(net, c) for c in ctxs]
    assert all(x.tobytes() == w[0].tobytes() for x in w), "the devices' weights differ"
    np.save(f"{out}.npy", w[0])


if __name__ == "__main__":
    mode, out, flag, rows, devices = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    assert flag in ("0", "1"), flag
    if mode == "dist":
        dist(out, flag == "1", rows, devices)
    elif mode == "reference":
        reference(out, flag == "1", rows, devices, sys.argv[6])
    else:
        raise SystemExit(f"unknown mode {mode}")
