#!/usr/bin/env python3
"""Golden cases of 2-bit gradient compression, recorded from Apache MXNet 1.9.1
(CPU): ``kv.set_gradient_compression({'type': '2bit', 'threshold': t})`` on a
``device`` store, then pushes of float32 values from one or more ``mx.cpu(i)``
contexts and a pull after each push. ``tests/tests/compression.rs`` replays every
case through the store and compares every pulled value bit for bit; the Python
suite (``kvstore-py/tests/test_compression.py``) replays them too.

Each case: a fresh ``mx.kv.create('device')`` store; the compression set before
(or, where ``after_init`` is true, after) ``init``; an optimizer where one is named
(``sgd`` with the given parameters, run by the store); then its steps. A step is
one ``push`` of a list of keys, each with its values (one per context, in order),
then a pull of every key. Values are random float32 (seeded), so the residuals
cross the threshold on some pushes and not on others.

Also recorded: the errors of bad parameters and of compression on ``local``.

Run from the repository root:

    target/py-mxnet-venv/bin/python tests/golden/generate_compression.py tests/golden/mxnet_compression.json

The output is deterministic (numpy's RandomState; float32 values written exactly).
"""

import json
import sys

import numpy as np
import mxnet as mx

MXNET_VERSION = "1.9.1"
GENERATOR = "tests/golden/generate_compression.py"


def f32(a):
    """Exact float32 values as Python floats (repr round-trips through f32)."""
    return [float(x) for x in np.asarray(a, dtype=np.float32).ravel()]


def run_case(name, threshold, keys, steps, optimizer=None, after_init=False, scale=1.0, seed=0):
    """keys: [(key, shape)]; steps: [[(key, n_values)]] (which keys get how many values)."""
    rs = np.random.RandomState(seed)
    kv = mx.kv.create("device")
    params = {"type": "2bit", "threshold": threshold}
    if not after_init:
        kv.set_gradient_compression(params)
    inits = {}
    for k, shape in keys:
        w = (rs.uniform(-1, 1, size=shape)).astype(np.float32)
        inits[k] = w
        kv.init(k, mx.nd.array(w, dtype="float32"))
    if after_init:
        kv.set_gradient_compression(params)
    if optimizer is not None:
        kv.set_optimizer(mx.optimizer.create(optimizer[0], **optimizer[1]))
    shapes = dict(keys)
    out_steps = []
    for step in steps:
        push = []
        pk, pv = [], []
        for k, n in step:
            values = []
            for c in range(n):
                g = (rs.uniform(-1, 1, size=shapes[k]) * scale).astype(np.float32)
                values.append({"ctx": c, "data": f32(g)})
                pk.append(k)
                pv.append(mx.nd.array(g, ctx=mx.cpu(c), dtype="float32"))
            push.append({"key": k, "values": values})
        kv.push(pk, pv)
        pulled = {}
        for k, shape in keys:
            out = mx.nd.zeros(shape, dtype="float32")
            kv.pull(k, out=out)
            pulled[k] = f32(out.asnumpy())
        out_steps.append({"push": push, "pull": pulled})
    return {
        "name": name,
        "threshold": threshold,
        "after_init": after_init,
        "optimizer": None if optimizer is None else {"name": optimizer[0], "params": optimizer[1]},
        "keys": [{"key": k, "shape": list(s), "init": f32(inits[k])} for k, s in keys],
        "steps": out_steps,
    }


def fixed_case(name, threshold, value, contexts, rounds):
    """The reference's examples: the same value pushed from `contexts` contexts, `rounds` times."""
    kv = mx.kv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})
    g = np.array(value, dtype=np.float32)
    kv.init("w", mx.nd.zeros(g.shape))
    steps = []
    for _ in range(rounds):
        kv.push("w", [mx.nd.array(g, ctx=mx.cpu(c)) for c in range(contexts)])
        out = mx.nd.zeros(g.shape)
        kv.pull("w", out=out)
        values = [{"ctx": c, "data": f32(g)} for c in range(contexts)]
        steps.append({"push": [{"key": "w", "values": values}], "pull": {"w": f32(out.asnumpy())}})
    return {
        "name": name,
        "threshold": threshold,
        "after_init": False,
        "optimizer": None,
        "keys": [{"key": "w", "shape": list(g.shape), "init": [0.0] * g.size}],
        "steps": steps,
    }


def error(name, kind, params):
    kv = mx.kv.create(kind)
    try:
        kv.set_gradient_compression(params)
    except Exception as e:  # MXNet raises MXNetError or Exception
        msg = str(e).strip().splitlines()
        msg = [m for m in msg if m.strip()]
        text = next((m for m in msg if "threshold" in m or "type" in m or "supported" in m), msg[-1] if msg else "")
        return {"name": name, "store": kind, "params": {k: str(v) for k, v in params.items()}, "mxnet_message": text.strip()[:200]}
    raise AssertionError(f"{name}: MXNet accepted {params}")


def main():
    cases = [
        fixed_case("reference_two_devices_t0.5", 0.5, [0.3, 0.6, -0.7, -0.2, 1.6], 2, 3),
        fixed_case("reference_one_device_t0.5", 0.5, [0.3, 0.6, -0.7, -0.2, 1.6], 1, 3),
        fixed_case("reference_t1_twice", 1.0, [0.5, 1.5, -2.5], 1, 2),
        run_case("random_one_key_three_devices", 0.3, [("w", (4, 5))], [[("w", 3)]] * 6, seed=1),
        # A key pushed from fewer contexts some steps (the first ones keep their residuals),
        # keys of several shapes, a length not a multiple of 16.
        run_case(
            "random_keys_varying_contexts",
            0.5,
            [("a", (37,)), ("b", (2, 3, 4)), ("c", (1,))],
            [[("a", 2), ("b", 2), ("c", 2)], [("a", 1), ("b", 2)], [("c", 2), ("a", 2)], [("b", 1), ("c", 1), ("a", 2)]] * 2,
            scale=0.7,
            seed=2,
        ),
        run_case("set_after_init", 0.25, [("w", (3, 7))], [[("w", 2)]] * 4, after_init=True, seed=3),
        run_case(
            "sgd_momentum",
            0.5,
            [("w", (6, 3)), ("v", (10,))],
            [[("w", 2), ("v", 2)]] * 5,
            optimizer=("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "rescale_grad": 0.5}),
            scale=2.0,
            seed=4,
        ),
        run_case("small_threshold", 0.01, [("w", (50,))], [[("w", 2)]] * 3, scale=0.02, seed=5),
    ]
    errors = [
        error("local_store", "local", {"type": "2bit", "threshold": 0.5}),
        error("no_type", "device", {"threshold": 0.5}),
        error("threshold_zero", "device", {"type": "2bit", "threshold": 0}),
        error("threshold_negative", "device", {"type": "2bit", "threshold": -1}),
        error("unknown_type", "device", {"type": "3bit", "threshold": 0.5}),
    ]
    doc = {"mxnet_version": mx.__version__, "generator": GENERATOR, "cases": cases, "errors": errors}
    assert doc["mxnet_version"] == MXNET_VERSION, doc["mxnet_version"]
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
