#!/usr/bin/env python3
"""Golden cases of row-sparse values, recorded from Apache MXNet 1.9.1 (CPU).

``tests/tests/row_sparse.rs`` replays every case through the store and compares
every pulled value bit for bit (the Python suite replays them too).

A case: a fresh ``mx.kv.create('local')`` store; its keys initialised with a
row-sparse value (a dense random float32 block whose listed rows are zero, as
``tostype('row_sparse')`` stores it: only the non-zero rows); an optimizer where one
is named (created by ``mx.optimizer.create`` and run by the store); then its steps.
A step pushes, for each key, a list of row-sparse values (their rows listed, their
data random), then records the key's value pulled into a dense out and its
``row_sparse_pull`` for some row ids (unsorted, repeated).

MXNet 1.9.1 crashes (SIGSEGV) on some sequences of row-sparse pushes with some
optimizers: each case runs in a child process, and a case that crashes is recorded
as such (``"crashed": true``) with no steps; the store must give a result for it.

Also recorded: the errors of ``row_sparse_pull`` on a dense key and into a dense out.

Run from the repository root:

    target/py-mxnet-venv/bin/python tests/golden/generate_row_sparse.py tests/golden/mxnet_row_sparse.json

The output is deterministic (numpy's RandomState; float32 values written exactly).
"""

import json
import multiprocessing as mp
import sys

import numpy as np

MXNET_VERSION = "1.9.1"
GENERATOR = "tests/golden/generate_row_sparse.py"


def f32(a):
    """Exact float32 values as Python floats (repr round-trips through f32)."""
    return [float(x) for x in np.asarray(a, dtype=np.float32).ravel()]


def run_case(case, conn):
    import mxnet as mx

    sp = mx.nd.sparse
    rs = np.random.RandomState(case["seed"])
    kv = mx.kv.create("local")
    shape = tuple(case["shape"])
    init = rs.uniform(-1, 1, size=shape).astype(np.float32)
    init[case["zero_rows"]] = 0
    kv.init("w", mx.nd.array(init).tostype("row_sparse"))
    if case.get("optimizer"):
        name, params = case["optimizer"]
        kv.set_optimizer(mx.optimizer.create(name, **params))
    steps = []
    for step in case["steps"]:
        values = []
        for rows in step["values"]:
            data = rs.uniform(-1, 1, size=(len(rows),) + shape[1:]).astype(np.float32)
            values.append({"rows": rows, "data": f32(data)})
        arrays = [
            sp.row_sparse_array((np.array(v["data"], np.float32).reshape((len(v["rows"]),) + shape[1:]),
                                 np.array(v["rows"], np.int64)), shape=shape)
            for v in values
        ]
        kv.push("w", arrays if len(arrays) > 1 else arrays[0])
        dense = mx.nd.zeros(shape)
        kv.pull("w", out=dense)
        out = sp.zeros("row_sparse", shape)
        kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array(step["row_ids"], dtype="int64"))
        mx.nd.waitall()
        steps.append({
            "values": values,
            "dense": f32(dense.asnumpy()),
            "row_ids": step["row_ids"],
            "pulled_indices": [int(i) for i in out.indices.asnumpy()],
            "pulled_data": f32(out.data.asnumpy()),
        })
    conn.send({"init": f32(init), "steps": steps})


def record(case):
    parent, child = mp.Pipe(duplex=False)
    p = mp.get_context("fork").Process(target=run_case, args=(case, child))
    p.start()
    child.close()
    try:
        got = parent.recv() if parent.poll(120) else None
    except EOFError:  # the child died before it sent its results
        got = None
    p.join()
    out = {k: case[k] for k in ("name", "shape", "zero_rows", "optimizer", "seed")}
    out["pushes"] = case["steps"]
    if got is None or p.exitcode != 0:
        out["crashed"] = True
        out["exitcode"] = p.exitcode
        return out
    out.update(got)
    return out


def steps(*pushes, row_ids=(3, 0, 3, 1)):
    return [{"values": list(p), "row_ids": list(row_ids)} for p in pushes]


SHAPE = [6, 3]
# Each step: the rows of each pushed value (several values are summed).
PUSHES = steps([[0, 2]], [[1], [1, 4]], [[5], [0, 5]], [[2]], [[3]], [[0, 1, 2, 3, 4, 5]], [[4], [4]])

CASES = [
    {"name": "assign", "optimizer": None},
    {"name": "sgd", "optimizer": ["sgd", {"learning_rate": 0.1}]},
    {"name": "sgd_wd", "optimizer": ["sgd", {"learning_rate": 0.1, "wd": 0.1, "rescale_grad": 0.5}]},
    {"name": "sgd_momentum", "optimizer": ["sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}]},
    {"name": "sgd_momentum_clip", "optimizer": ["sgd", {"learning_rate": 0.2, "momentum": 0.5, "clip_gradient": 0.3}]},
    {"name": "sgd_not_lazy", "optimizer": ["sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1, "lazy_update": False}]},
    {"name": "adam", "optimizer": ["adam", {"learning_rate": 0.01, "wd": 0.01}]},
    {"name": "adam_not_lazy", "optimizer": ["adam", {"learning_rate": 0.01, "lazy_update": False}]},
    {"name": "adagrad", "optimizer": ["adagrad", {"learning_rate": 0.1}]},
    {"name": "ftrl", "optimizer": ["ftrl", {"learning_rate": 0.1, "lamda1": 0.01, "beta": 1.0, "wd": 0.01}]},
    {"name": "rmsprop", "optimizer": ["rmsprop", {"learning_rate": 0.01}]},
    {"name": "signum", "optimizer": ["signum", {"learning_rate": 0.01, "momentum": 0.9}]},
    # Three values summed (MXNet 1.9.1 crashed on this in some runs: the record says which).
    {"name": "assign_three_values", "optimizer": None, "steps": steps([[5], [0, 5], [2]])},
]


def errors():
    import mxnet as mx

    sp = mx.nd.sparse
    out = []

    def attempt(name, f):
        try:
            f()
            mx.nd.waitall()
            out.append({"name": name, "error": None})
        except mx.base.MXNetError as e:
            line = [l for l in str(e).splitlines() if "Check failed" in l][0]
            out.append({"name": name, "error": line.split(": ", 1)[1]})

    kv = mx.kv.create("local")
    kv.init("dense", mx.nd.ones((4, 2)))
    kv.init("rsp", mx.nd.ones((4, 2)).tostype("row_sparse"))
    ro = sp.zeros("row_sparse", (4, 2))
    attempt("row_sparse_pull of a dense key",
            lambda: kv.row_sparse_pull("dense", out=ro, row_ids=mx.nd.array([0])))
    attempt("row_sparse_pull into a dense out",
            lambda: kv.row_sparse_pull("rsp", out=mx.nd.zeros((4, 2)), row_ids=mx.nd.array([0])))
    return out


def main():
    cases = []
    for i, c in enumerate(CASES):
        c = dict(c, shape=SHAPE, zero_rows=[] if c["optimizer"] else [3], seed=100 + i)
        c.setdefault("steps", PUSHES)
        cases.append(record(c))
        print(c["name"], "crashed" if cases[-1].get("crashed") else "ok", file=sys.stderr)
    doc = {
        "mxnet_version": MXNET_VERSION,
        "generator": GENERATOR,
        "cases": cases,
        "errors": errors(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
