"""MXNet 1.9.1's nightly dist_sync test (tests/nightly/dist_sync_kvstore.py), its cases
written anew for kvstore.mxnet, run by test_dist_gluon.py as one rank of
`mpirun -np N python nightly_worker.py`.

`import kvstore.mxnet` makes `mx.kv.create("dist_sync")` this project's store, with the
optimizer state on owners (the default: a key under MXNET_KVSTORE_BIGARRAY_BOUND, 10^6
elements, owned whole by one rank, the 1200 x 1200 keys split across every rank). The
cases, as the nightly test has them:

- init: 100 small keys and 100 big ones, half float32 and half float16, each pulled
  right after its init.
- default keys: with MXNet's `test` optimizer (weight += rescale_grad * grad,
  rescale_grad 2), float32 and float16 keys, small and big; each rank pushes
  rank + 1, and after push i every rank pulls 1 + rate * n(n + 1)/2 * (i + 1).
- row-sparse keys: each rank pushes one row; a pull of random rows gets those rows'
  sums; pushes of all-zero rows leave the values as they were, and a pull of no rows
  gets zeros; a big table, each rank pushing every (2(rank + 1))-th of 30 % of its rows.
- 2-bit compression (threshold 0.5): pulls before any push, pushes of zeros, residuals
  that reach the threshold over several pushes, and random gradients, each pull
  against the quantisation computed here.
- gluon's Trainer over the store with a row-sparse parameter updates on the store.

Prints `rank R: done` at the end.
"""

import sys

import numpy as np

RATE = 2
SHAPE = (2, 3)
IRREGULAR = (1211, 1211)
BIG = (1200, 1200)  # above MXNET_KVSTORE_BIGARRAY_BOUND


def check(got, expected, what):
    got = got.asnumpy() if hasattr(got, "asnumpy") else got
    if not np.array_equal(got, np.broadcast_to(np.asarray(expected, dtype=got.dtype), got.shape)):
        raise AssertionError(f"{what}: got {got.ravel()[:6]}..., expected {np.asarray(expected).ravel()[:6]}...")


def two_bit(grad, residual, threshold):
    """2-bit quantisation of grad + residual: +-threshold where it reaches it, else 0;
    the new residual."""
    r = residual + grad
    out = np.where(r >= threshold, threshold, np.where(r <= -threshold, -threshold, 0.0))
    return out, r - out


def main(nrepeat: int) -> None:
    import mxnet as mx

    import kvstore.mxnet as kmx

    kv = mx.kv.create("dist_sync")
    assert isinstance(kv, kmx.KVStore), type(kv)
    rank, n = kv.rank, kv.num_workers

    # init
    for first, shape in ((200, SHAPE), (300, BIG)):
        keys = [str(first + i) for i in range(100)]
        for i, k in enumerate(keys):
            dtype = "float32" if i < len(keys) / 2 else "float16"
            kv.init(k, [mx.nd.ones(shape, dtype=dtype) * i])
            out = mx.nd.zeros(shape, dtype=dtype)
            kv.pull(k, out=out)
            check(out, i, f"init of key {k}")

    # the keys of the pushes
    dense = {"float32": (["3", "5", "7"], "99"), "float16": (["4", "6", "8"], "100")}
    sparse = {"float32": (["9", "11", "13"], "97"), "float16": (["10", "12", "14"], "98")}
    for dtype in ("float32", "float16"):
        small, big = dense[dtype]
        kv.init(small, [mx.nd.ones(SHAPE, dtype=dtype)] * 3)
        kv.init(big, mx.nd.ones(BIG, dtype=dtype))
        small, big = sparse[dtype]
        kv.init(small, [mx.nd.ones(SHAPE, dtype=dtype).tostype("row_sparse")] * 3)
        kv.init(big, mx.nd.ones(BIG, dtype=dtype).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.create("test", rescale_grad=RATE, multi_precision=True))

    for dtype in ("float16", "float32"):
        # default keys
        small, big = dense[dtype]
        for k, shape in [(k, SHAPE) for k in small] + [(big, BIG)]:
            for i in range(nrepeat):
                kv.push(k, mx.nd.ones(shape, dtype=dtype) * (rank + 1))
                out = mx.nd.zeros(shape, dtype=dtype)
                kv.pull(k, out=out)
                check(out, (n + 1) * n * RATE / 2 * (i + 1) + 1, f"{dtype} key {k}, push {i}")

        # row-sparse keys: each rank pushes its row
        small, big = sparse[dtype]
        grad = np.zeros(SHAPE, dtype=dtype)
        grad[rank % SHAPE[0]] = rank + 1
        rng = np.random.RandomState(rank)
        for i in range(nrepeat):
            kv.push(small[0], mx.nd.array(grad, dtype=dtype).tostype("row_sparse"))
            rows = rng.randint(SHAPE[0], size=SHAPE[0])
            out = mx.nd.zeros(SHAPE, stype="row_sparse", dtype=dtype)
            kv.row_sparse_pull(small[0], out=out, row_ids=mx.nd.array(rows.reshape(-1, 2)).astype(dtype))
            updated = np.ones(SHAPE)
            for r in range(n):
                updated[r % SHAPE[0]] += (r + 1) * RATE * (i + 1)
            expected = np.zeros(SHAPE)
            expected[rows] = updated[rows]
            check(out, expected, f"{dtype} row-sparse key {small[0]}, push {i}")

        # row-sparse pushes of zero rows
        for i in range(nrepeat):
            kv.push(small[1], mx.nd.sparse.zeros("row_sparse", SHAPE, dtype=dtype))
            kv.push(big, mx.nd.sparse.zeros("row_sparse", BIG, dtype=dtype))
            for k, shape in ((small[1], SHAPE), (big, BIG)):
                out = mx.nd.sparse.zeros("row_sparse", shape)
                kv.row_sparse_pull(k, out=out, row_ids=mx.nd.array(np.arange(shape[0])))
                check(out, 1, f"{dtype} row-sparse key {k} after pushes of zeros")
                kv.row_sparse_pull(k, out=out, row_ids=mx.nd.array([]))
                check(out, 0, f"{dtype} row-sparse key {k}, no rows pulled")

        # a big row-sparse table, each rank pushing its rows of 30 % of them (this key
        # went on from the pushes of zeros above, which left it at ones)
        chosen = np.argwhere(np.random.RandomState(123).rand(BIG[0]) < 0.3).ravel()
        rows_of = [chosen[:: 2 * (r + 1)] for r in range(n)]
        grad = np.zeros(BIG, dtype=dtype)
        grad[rows_of[rank]] = rank + 1
        rng = np.random.RandomState(rank)
        for i in range(nrepeat):
            kv.push(big, mx.nd.array(grad, dtype=dtype).tostype("row_sparse"))
            rows = rng.randint(BIG[0], size=BIG[0])
            out = mx.nd.zeros(BIG, stype="row_sparse", dtype=dtype)
            kv.row_sparse_pull(big, out=out, row_ids=mx.nd.array(rows.reshape(-1, 2)).astype(dtype))
            updated = np.ones(BIG)
            for r in range(n):
                updated[rows_of[r]] += (r + 1) * RATE * (i + 1)
            expected = np.zeros(BIG)
            expected[rows] = updated[rows]
            check(out, expected.astype(dtype), f"{dtype} big row-sparse key {big}, push {i}")

    # 2-bit compression, on new keys
    threshold = 0.5
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})
    compressed = [("1000", SHAPE), ("1200", IRREGULAR), ("1300", BIG)]
    for k, s in compressed:
        kv.init(k, mx.nd.zeros(s))
    for k, s in [("1001", SHAPE), ("1201", IRREGULAR), ("1301", BIG)]:
        kv.init(k, mx.nd.ones(s))
        out = mx.nd.zeros(s)
        kv.pull(k, out=out)
        check(out, 1, f"compressed store: key {k} as it was initialised")
    for k, s in compressed:
        out = mx.nd.ones(s)
        kv.pull(k, out=out)
        check(out, 0, f"compressed key {k} before any push")
        kv.push(k, mx.nd.zeros(s))
        kv.pull(k, out=out)
        check(out, 0, f"compressed key {k} after a push of zeros")
    for k, s in compressed:
        # below the threshold, then reaching it with the residual, and again
        value = 0.0
        for push, reaches in ((0.4, False), (threshold - 0.4, True), (0.2, False), (threshold - 0.2, True)):
            kv.push(k, mx.nd.ones(s) * push)
            value += threshold * RATE * n if reaches else 0.0
            out = mx.nd.zeros(s)
            kv.pull(k, out=out)
            check(out, value, f"compressed key {k} after a push of {push}")
        kv.push(k, mx.nd.ones(s) * threshold)
        value += RATE * n * threshold
        kv.pull(k, out=out)
        check(out, value, f"compressed key {k} after a push of the threshold")
    rng = np.random.RandomState(123)  # the same gradients on every rank
    for k, s in [("1002", SHAPE), ("1202", IRREGULAR), ("1302", BIG)]:
        kv.init(k, mx.nd.zeros(s))
        residual = np.zeros(s)
        for i in range(nrepeat):
            before = mx.nd.zeros(s)
            kv.pull(k, out=before)
            grad = rng.rand(*s).astype(np.float32)
            kv.push(k, mx.nd.array(grad))
            after = mx.nd.zeros(s)
            kv.pull(k, out=after)
            sent, residual = two_bit(grad.astype(np.float64), residual, threshold)
            np.testing.assert_allclose(
                (after - before).asnumpy(), sent * n * RATE, rtol=1e-5, atol=1e-5, err_msg=f"random pushes to {k}"
            )

    # gluon's Trainer on a store of its own (its keys are ints), with a row-sparse
    # parameter: updated on the store
    params = mx.gluon.ParameterDict()
    x = params.get("x", shape=(4, 2), lr_mult=1.0, stype="row_sparse")
    params.initialize(ctx=mx.cpu(0), init="zeros")
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=mx.kv.create("dist_sync"))
    x.row_sparse_data(mx.nd.arange(0, 4))
    assert trainer._kv_initialized and trainer._update_on_kvstore
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
