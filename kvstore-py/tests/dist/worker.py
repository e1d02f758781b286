"""One rank of a dist_sync job, run by test_dist.py under `mpirun -np 2`.

`worker.py train OUT`: trains a weight with SGD (momentum, a factor schedule) on
gradients that differ by rank, through blocking and non-blocking pushes, pulls and
pushpulls, then writes its final weights' bytes to OUT.<rank>.npy.
`worker.py desync`: the ranks push different keys; both must get the error at once,
then go on with a matched call. `worker.py stall`: rank 1 never pushes; the job must end
after KVSTORE_TIMEOUT seconds. `worker.py crash`: rank 1 raises; the job must end.
`worker.py leave HOW`: rank 1 leaves mid-training (`sys.exit`: `sys.exit(1)`;
`SystemExit`: `raise SystemExit(3)`; `os._exit`: `os._exit(2)`) while rank 0 pushes on;
`late`: both ranks end normally, rank 1 three seconds after rank 0.
`worker.py compressed OUT`: 2-bit compressed pushes (threshold 0.5) of gradients that
differ by rank, then `fp16` ones on another store; writes the pulled values of every
step to OUT.<rank>.npy.
`worker.py async OUT`: a dist_async store with a Python updater that adds each push
(run by the key's owner), pushes of both ranks (blocking and not), then the value after
a barrier written to OUT.<rank>.npy.
`worker.py rowsparse OUT`: row-sparse pushes of rows that differ by rank (no updater,
then lazy SGD), each step's dense value and a row_sparse_pull written to
OUT.<rank>.npy.
"""

import os
import sys
import time

import numpy as np

import kvstore as kv
from kvstore import lr_scheduler, optimizer


def gradient(rank: int, step: int, shape) -> np.ndarray:
    rng = np.random.default_rng(1000 * step + rank)
    return rng.standard_normal(shape).astype(np.float32)


def train(out: str) -> None:
    store = kv.create("dist_sync")
    rank, n = store.rank, store.num_workers
    assert n == 2, n
    assert store.type == "dist_sync"
    # Rank 0's value wins.
    store.init(3, np.full((4, 5), 1.0 + rank, dtype=np.float32))
    store.init("b", np.full(7, 2.0 + rank, dtype=np.float32))
    w = store.pull(3)
    assert np.array_equal(w, np.full((4, 5), 1.0, dtype=np.float32)), w
    # No optimizer yet: a push stores the sum over the workers.
    store.push("b", np.full(7, 1.0 + rank, dtype=np.float32))
    assert np.array_equal(store.pull("b"), np.full(7, 3.0, dtype=np.float32))
    store.set_optimizer(
        optimizer.SGD(
            learning_rate=0.05,
            momentum=0.9,
            wd=1e-3,
            lr_scheduler=lr_scheduler.FactorScheduler(step=3, factor=0.5),
        )
    )
    b = np.zeros(7, dtype=np.float32)
    for step in range(12):
        g, gb = gradient(rank, step, (4, 5)), gradient(rank + 10, step, 7)
        if step % 3 == 0:
            store.push(3, g)
            store.pushpull("b", gb, out=b)
        elif step % 3 == 1:
            f = store.push_async(3, g)
            store.pushpull_async("b", gb, out=b).result()
            f.result()
        else:
            store.push([3, "b"], [g, gb])
            store.pull("b", out=b)
    w = np.zeros((4, 5), dtype=np.float32)
    store.pull_async(3, w).result()
    store.wait_all()
    np.save(f"{out}.{rank}.npy", np.concatenate([w.ravel(), b]))
    store.barrier()
    print(f"rank {rank}: done")


def desync() -> None:
    store = kv.create("dist_sync")
    rank = store.rank
    store.init(["a", "b"], [np.zeros(3, dtype=np.float32)] * 2)
    try:
        store.push("a" if rank == 0 else "b", np.ones(3, dtype=np.float32))
    except kv.KVStoreError as e:
        print(f"rank {rank}: desync error {type(e).__name__}: {e}")
    else:
        raise AssertionError("different keys pushed on the two ranks did not fail")
    # The job goes on: a matched call works, and the refused pushes changed nothing.
    store.push("a", np.ones(3, dtype=np.float32))
    assert np.array_equal(store.pull("a"), np.full(3, 2.0, dtype=np.float32))
    assert np.array_equal(store.pull("b"), np.zeros(3, dtype=np.float32))
    print(f"rank {rank}: went on")


def stall() -> None:
    store = kv.create("dist_sync")
    store.init("a", np.zeros(3, dtype=np.float32))
    if store.rank == 1:
        time.sleep(120)
    store.push("a", np.ones(3, dtype=np.float32))
    print(f"rank {store.rank}: the push returned")


def crash() -> None:
    store = kv.create("dist_sync")
    store.init("a", np.zeros(3, dtype=np.float32))
    if store.rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    store.push("a", np.ones(3, dtype=np.float32))
    print(f"rank {store.rank}: the push returned")


def leave(how: str) -> None:
    store = kv.create("dist_sync")
    store.init("a", np.zeros(3, dtype=np.float32))
    for _ in range(3):
        store.push("a", np.ones(3, dtype=np.float32))
    if store.rank == 1:
        print(f"rank 1 leaves: {how}", flush=True)
        if how == "sys.exit":
            sys.exit(1)
        elif how == "SystemExit":
            raise SystemExit(3)
        elif how == "os._exit":
            os._exit(2)
        time.sleep(3)
    elif how != "late":
        store.push("a", np.ones(3, dtype=np.float32))
        print("rank 0: the push returned")
    print(f"rank {store.rank} ends", flush=True)


def compressed(out: str) -> None:
    pulled = []
    for params in ({"type": "2bit", "threshold": 0.5}, {"type": "fp16"}):
        store = kv.create("dist_sync")
        store.set_gradient_compression(params)
        store.init("w", np.zeros(37, dtype=np.float32))
        for step in range(4):
            local = [gradient(store.rank, step, 37), gradient(store.rank + 10, step, 37)]
            store.push("w", local)
            pulled.append(store.pull("w"))
    np.save(f"{out}.{store.rank}.npy", np.stack(pulled))


def rowsparse(out: str) -> None:
    from kvstore import sparse

    store = kv.create("dist_sync")
    rank = store.rank
    store.init("emb", sparse.row_sparse_array(np.ones((10, 4), np.float32)))
    pulled = []
    for step in range(6):
        if step == 3:
            store.set_optimizer(optimizer.SGD(learning_rate=0.5))
        values = []
        for i in range(2):
            rows = sorted({(rank * 3 + step + 2 * i) % 10, (rank + 5 * i + step * 7) % 10})
            data = gradient(rank + 20 * i, step, (len(rows), 4))
            values.append(sparse.row_sparse_array((data, rows), shape=(10, 4)))
        store.push("emb", values)
        out_rows = sparse.zeros("row_sparse", (10, 4))
        store.row_sparse_pull("emb", out=out_rows, row_ids=np.array([9, 0, 4, 0]))
        assert out_rows.indices.tolist() == [0, 4, 9]
        pulled.append(np.concatenate([store.pull("emb").ravel(), out_rows.data.ravel()]))
    np.save(f"{out}.{rank}.npy", np.stack(pulled))


def async_sum(out: str) -> None:
    store = kv.create("dist_async")
    assert store.type == "dist_async", store.type
    rank = store.rank
    store.init(3, np.zeros(5, dtype=np.float32))
    store.init("big", np.zeros(1_000_001, dtype=np.float32))

    def add(key, recv, stored):
        stored += recv

    store.set_updater(add)
    for step in range(10):
        store.push(3, np.full(5, rank + step, dtype=np.float32))
        store.push("big", np.full(1_000_001, 1.0, dtype=np.float32))
        if step % 3 == 0:
            store.pull(3)
    store.push_async(3, np.full(5, 100, dtype=np.float32)).result()
    store.barrier()
    np.save(f"{out}.{rank}.npy", np.concatenate([store.pull(3), store.pull("big")[:3]]))


def chain(out: str) -> None:
    """Non-blocking pushpulls, each pushing the row the one before it writes (with
    `copy=False`, so the row is read when the call runs): each call's wrapper of its row
    is the one the call before made, so it runs after that call wrote it."""
    store = kv.create("dist_sync")
    rank = store.rank
    store.init(list(range(11)), [np.zeros(1000, np.float32)] * 11)
    rows = np.zeros((12, 1000), np.float32)
    rows[0] = 1
    # A key of its own each: only the rows order the calls.
    futures = [store.pushpull_async(i, rows[i], out=rows[i + 1], copy=False) for i in range(11)]
    for f in futures:
        f.result()
    np.save(f"{out}.{rank}.npy", rows)


def refused() -> None:
    """An argument rank 1 refuses before its call reaches the store (not contiguous, of
    dtype object, a list; row-sparse values that do not pair with the keys) fails that
    call on both ranks, and the next calls stay matched; before, rank 1's next push met
    rank 0's first, and rank 0 waited at the third."""
    store = kv.create("dist_sync")
    rank = store.rank
    store.init("w", np.zeros((4, 2), np.float32))
    good = np.ones((4, 2), np.float32)
    bads = [np.ones((4, 4), np.float32)[:, ::2], np.ones((4, 2), dtype=object), [[1.0, 2.0]] * 4]
    for i, bad in enumerate(bads):
        for call in ("push", "push_async", "pushpull"):
            value = bad if rank == 1 else good
            try:
                if call == "push":
                    store.push("w", value)
                elif call == "push_async":
                    store.push_async("w", value).result()
                else:
                    store.pushpull("w", value, out=np.zeros((4, 2), np.float32))
                print(f"rank {rank}: {call} {i} went through", flush=True)
            except kv.KVStoreError as e:
                print(f"rank {rank}: {call} {i} refused: {type(e).__name__}", flush=True)
            store.push("w", np.full((4, 2), rank + 1, np.float32))
            assert (store.pull("w") == 3).all(), store.pull("w")
    # Row-sparse values rank 1 cannot pair with its keys (two keys, one value): its push
    # and its init fail on both ranks too, and change nothing.
    rows = kv.sparse.row_sparse_array((np.ones((1, 2), np.float32), [1]), shape=(3, 2))
    store.init("e", kv.sparse.row_sparse_array((3, 2)))
    for call in ("push_row_sparse", "init_row_sparse"):
        keys, values = (["e", "e"], [rows]) if rank == 1 else ("e", rows)
        try:
            if call == "push_row_sparse":
                store.push(keys, values)
            else:
                store.init(["f", "g"] if rank == 1 else "f", values)
            print(f"rank {rank}: {call} went through", flush=True)
        except kv.KVStoreError as e:
            print(f"rank {rank}: {call} refused: {type(e).__name__}", flush=True)
        store.push("w", np.full((4, 2), rank + 1, np.float32))
        assert (store.pull("w") == 3).all(), store.pull("w")
    assert (store.pull("e") == 0).all(), store.pull("e")
    assert "f" not in store.keys(), store.keys()
    print(f"rank {rank}: went on", flush=True)


def slow(path: str, slow_rank: str) -> None:
    """30 pushes of 4 keys, rank ``slow_rank`` sleeping 40 ms before each, with the
    timeline started from code and stopped (merged on rank 0) at the end."""
    import time

    store = kv.create("dist_sync")
    rank = store.rank
    store.start_timeline(path)
    keys = ["a", "b", "c", "d"]
    values = [np.ones(1024, np.float32) for _ in keys]
    store.init(keys, values)
    for _ in range(30):
        if str(rank) == slow_rank:
            time.sleep(0.040)
        store.push(keys, values)
    written = store.stop_timeline()
    stats = store.stats()
    held = [round(r["held_up_s"] * 1e3) for r in stats["ranks"]]
    print(f"rank {rank}: wrote {written}; last {[r['last'] for r in stats['ranks']]} held {held}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "train":
        train(sys.argv[2])
    elif mode == "compressed":
        compressed(sys.argv[2])
    elif mode == "rowsparse":
        rowsparse(sys.argv[2])
    elif mode == "async":
        async_sum(sys.argv[2])
    elif mode == "chain":
        chain(sys.argv[2])
    elif mode == "slow":
        slow(sys.argv[2], sys.argv[3])
    elif mode == "leave":
        leave(sys.argv[2])
    else:
        {"desync": desync, "stall": stall, "crash": crash, "refused": refused}[mode]()
