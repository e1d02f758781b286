"""kvstore.mxnet's dist kinds under mpirun, run by test_dist_gluon.py.

`dropin_worker.py custom_sync OUT` (one rank of `mpirun -np 2`): `mx.kv.create("dist_sync")`
with an optimizer of the user's own (an `mx.optimizer.Optimizer` subclass registered
with MXNet, with a per-key state), which the store runs as MXNet's Python updater on
each key's owner (its result reaching every worker); each rank pushes its own gradients for STEPS steps, then writes the
weights it pulls to OUT.<rank>.npy. A pull with ignore_sparse=False is MXNet's error.

`dropin_worker.py custom_reference OUT` (one process, no MPI): the same pushes through
MXNet's own `local` store, each step's two ranks' gradients pushed as one list from two
devices, with the same optimizer (MXNet's set_optimizer runs its Python updater).
Writes OUT.npy.

`dropin_worker.py gluon_async OUT` (one rank of `mpirun -np 2`): gluon's Trainer with
`kvstore="dist_async"` on a linear model whose gradient does not depend on its weight
(loss = sum(w . x)), with SGD: every push applied once, in any order, gives the same
weight, as long as the values are exact in float32 (small integers times powers of
two). After a barrier each rank writes the weight it pulls to OUT.<rank>.npy and prints
the weight every push applied once gives.

`dropin_worker.py cast OUT` (one rank of `mpirun -np N`): as MXNet 1.9.1's nightly
dist_sync_kvstore.py (check_row_sparse_keys_with_zeros), float16 keys, row-sparse and
dense, small and big, pulled into float32 outs after pushes of zeros, under
`set_optimizer`: MXNet converts; and a str key on this int-keyed store is MXNet's error.
"""

import os
import sys

import numpy as np

STEPS = 6
SHAPES = {0: (3, 4), 1: (5,)}
IN = 4


def gradient(key: int, step: int, rank: int) -> np.ndarray:
    rng = np.random.RandomState(1000 * step + 10 * rank + key)
    return rng.uniform(-1, 1, size=SHAPES[key]).astype(np.float32)


def initial(key: int) -> np.ndarray:
    return np.random.RandomState(key).uniform(-1, 1, size=SHAPES[key]).astype(np.float32)


def register_optimizer(mx):
    @mx.optimizer.register
    class ScaledSignMomentum(mx.optimizer.Optimizer):
        """A user's optimizer: momentum over the sign of the gradient."""

        def create_state(self, index, weight):
            return mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype)

        def update(self, index, weight, grad, state):
            self._update_count(index)
            lr = self._get_lr(index)
            state[:] = 0.5 * state + mx.nd.sign(grad * self.rescale_grad) + grad * self.rescale_grad
            weight[:] = weight - lr * state

    return mx.optimizer.create("scaledsignmomentum", learning_rate=0.1, rescale_grad=0.5)


def custom_sync(out: str) -> None:
    import mxnet as mx

    import kvstore.mxnet as kmx

    kv = mx.kv.create("dist_sync")
    assert isinstance(kv, kmx.KVStore) and isinstance(kv, mx.kv.KVStore), type(kv)
    rank = kv.rank
    assert kv.num_workers == 2, kv.num_workers
    keys = sorted(SHAPES)
    kv.init(keys, [mx.nd.array(initial(k)) for k in keys])
    kv.set_optimizer(register_optimizer(mx))
    assert kv._kv.optimizer is None, "a user's optimizer runs as MXNet's Python updater"
    assert type(kv._updater.optimizer).__name__ == "ScaledSignMomentum"
    for step in range(STEPS):
        kv.push(keys, [mx.nd.array(gradient(k, step, rank)) for k in keys])
    outs = [mx.nd.zeros(SHAPES[k]) for k in keys]
    kv.pull(keys, out=outs)
    np.save(f"{out}.{rank}.npy", np.concatenate([o.asnumpy().ravel() for o in outs]))
    # As MXNet's dist stores: pull with ignore_sparse=False is refused.
    try:
        kv.pull(keys[0], out=mx.nd.zeros(SHAPES[0]).tostype("row_sparse"), ignore_sparse=False)
    except mx.base.MXNetError as e:
        assert "doesn't support ignore_sparse=False" in str(e), str(e)
    else:
        raise AssertionError("a dist store's pull took ignore_sparse=False")
    kv._barrier()
    print(f"rank {rank}: done")


def custom_reference(out: str) -> None:
    import mxnet as mx

    import kvstore.mxnet as kmx

    kv = kmx.native_create("local")
    keys = sorted(SHAPES)
    kv.init(keys, [mx.nd.array(initial(k)) for k in keys])
    kv.set_optimizer(register_optimizer(mx))
    for step in range(STEPS):
        kv.push(keys, [[mx.nd.array(gradient(k, step, r), ctx=mx.cpu(r)) for r in range(2)] for k in keys])
    outs = [mx.nd.zeros(SHAPES[k]) for k in keys]
    kv.pull(keys, out=outs)
    np.save(f"{out}.npy", np.concatenate([o.asnumpy().ravel() for o in outs]))


def batch(step: int, rank: int) -> np.ndarray:
    # Small integers: every sum of them, in any order, is exact in float32.
    return np.random.RandomState(100 * step + rank).randint(-3, 4, size=(4, IN)).astype(np.float32)


def gluon_async(out: str) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon

    import kvstore.mxnet as kmx

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    net = gluon.nn.Dense(1, in_units=IN, use_bias=False)
    net.initialize(mx.init.Zero())
    w0 = np.arange(IN, dtype=np.float32).reshape(1, IN)
    net.weight.set_data(mx.nd.array(w0))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, kvstore="dist_async")
    for step in range(STEPS):
        x = mx.nd.array(batch(step, rank))
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(4)  # rescale_grad 1/4: the update is 0.125 * the gradient
    kv = trainer._kvstore
    assert isinstance(kv, kmx.KVStore) and isinstance(kv, mx.kv.KVStore), type(kv)
    assert kv.type == "dist_async" and (kv.rank, kv.num_workers) == (rank, 2), (kv.type, kv.rank)
    assert trainer._update_on_kvstore is True and trainer._distributed is True
    kv._barrier()  # every rank's pushes are applied
    w = mx.nd.zeros((1, IN))
    kv.pull(0, out=w)
    np.save(f"{out}.{rank}.npy", w.asnumpy())
    expected = w0 - 0.125 * sum(batch(s, r).sum(axis=0) for s in range(STEPS) for r in range(2))
    np.save(f"{out}.expected.npy", expected.astype(np.float32))
    kv._barrier()
    print(f"rank {rank}: done")


def cast(out: str) -> None:
    import mxnet as mx

    import kvstore.mxnet  # noqa: F401

    kv = mx.kv.create("dist_sync")
    shapes = {9: (2, 3), 97: (1200, 1200)}
    for k, shape in shapes.items():
        kv.init(k, mx.nd.ones(shape, dtype="float16").tostype("row_sparse"))
        kv.init(k + 1, mx.nd.ones(shape, dtype="float16") * 1.5)
    kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.5, rescale_grad=2))
    for _ in range(3):
        for k, shape in shapes.items():
            kv.push(k, mx.nd.sparse.zeros("row_sparse", shape, dtype="float16"))
            val = mx.nd.sparse.zeros("row_sparse", shape)
            kv.row_sparse_pull(k, out=val, row_ids=mx.nd.array(np.arange(shape[0])))
            assert val.dtype == np.float32 and (val.asnumpy() == 1).all(), val
            kv.row_sparse_pull(k, out=val, row_ids=mx.nd.array([]))
            assert (val.asnumpy() == 0).all()
            dense = mx.nd.zeros(shape, dtype="float64")
            kv.pull(k + 1, out=dense)
            assert (dense.asnumpy() == 1.5).all()
    try:
        kv.pull("9", out=mx.nd.zeros((2, 3)))
        raise AssertionError("a str key on an int-keyed store did not fail")
    except mx.base.MXNetError:
        pass
    print(f"rank {kv.rank}: done")


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    workers = {"custom_sync": custom_sync, "custom_reference": custom_reference, "gluon_async": gluon_async, "cast": cast}
    workers[mode](out)
