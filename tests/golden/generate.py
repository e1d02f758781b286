#!/usr/bin/env python3
"""Golden-case generator for the kvstore crate: runs the real Apache MXNet
1.9.1 (CPU) KVStore and records what it does as JSON, so that the Rust tests
can replay the same operations and compare results without needing MXNet.

Each case creates a fresh ``mx.kv.create('local')`` (a few use ``'device'``)
store, optionally installs the ``add_twice`` updater via ``kv._set_updater``,
runs a list of init / push / pull / pushpull / broadcast operations, and
records the pulled values, the error class of every failing operation, and
the log of updater calls.  The JSON format is documented in
``tests/golden/README.md``.

How to run (from the repository root):

    python3 -m venv target/mxnet-venv
    target/mxnet-venv/bin/pip install mxnet==1.9.1 'numpy<1.24'
    target/mxnet-venv/bin/python tests/golden/generate.py > tests/golden/mxnet_local.json
    # or, equivalently:
    target/mxnet-venv/bin/python tests/golden/generate.py tests/golden/mxnet_local.json

The output is deterministic: every run gives byte-identical JSON.  Only
exact, deterministic behaviour is recorded (integer-valued data whose sums are
exact in every dtype; no wrapping int8/uint8 sums; no float16 rounding).

Deliberately NOT recorded, because the Rust store differs on purpose or MXNet
behaves badly there:
  * a single-value push whose shape or dtype differs from the stored value
    (MXNet silently replaces the stored value);
  * pushing more values to a key than its first multi-value push had
    (MXNet segfaults);
  * mixed int / str keys in one store; duplicate keys in one init list;
  * pulling into an out, or pushing values, of a different dtype than stored;
  * the aliasing behaviour (mutating an array after pushing it): every
    NDArray used here is freshly created for a single op;
  * partially applied list ops (e.g. ``init([8, 5])`` where 5 already exists
    inits 8 and then fails; ``push([5, 11])`` with 11 unknown pushes 5 and
    then fails) and ``init`` of a key after a failed push/pull of it (MXNet
    leaves a "none" entry behind, so the later init fails as a duplicate).
"""

import io
import json
import os
import sys

import numpy as np
import mxnet as mx

MXNET_VERSION = "1.9.1"
GENERATOR = "tests/golden/generate.py"
SHAPE = (2, 3)
DTYPES = ["float16", "float32", "float64", "uint8", "int8", "int32", "int64"]


# ---------------------------------------------------------------------------
# Case-description helpers.  An "array" is a plain dict
# {"shape", "dtype", "ctx", "data"}; a "spec" is the same without "data".
# ---------------------------------------------------------------------------

def arr(data, shape=SHAPE, dtype="float32", ctx=0):
    """Array spec with data: a scalar fill value or a flat/nested list."""
    n = int(np.prod(shape))
    if isinstance(data, (int, float)):
        flat = [data] * n
    else:
        flat = list(np.asarray(data).ravel().tolist())
    assert len(flat) == n, (shape, len(flat))
    return {"shape": list(shape), "dtype": dtype, "ctx": ctx, "data": flat}


def ones(v=1, shape=SHAPE, dtype="float32", ctx=0):
    return arr(v, shape, dtype, ctx)


def rng(start, shape=SHAPE, dtype="float32", ctx=0, step=1):
    """Distinct integer entries start, start+step, ... (row-major)."""
    n = int(np.prod(shape))
    return arr([start + step * i for i in range(n)], shape, dtype, ctx)


def out(shape=SHAPE, dtype="float32", ctx=0):
    return {"shape": list(shape), "dtype": dtype, "ctx": ctx}


def on_cpus(v, n=4, shape=SHAPE, dtype="float32"):
    """One array with fill ``v`` on each of cpu(0) .. cpu(n-1)."""
    return [ones(v, shape, dtype, ctx=i) for i in range(n)]


def outs_on_cpus(n=4, shape=SHAPE, dtype="float32"):
    return [out(shape, dtype, ctx=i) for i in range(n)]


def init(keys, values):
    return {"op": "init", "k": keys, "v": values}


def push(keys, values):
    return {"op": "push", "k": keys, "v": values}


def pull(keys, outs):
    return {"op": "pull", "k": keys, "o": outs}


def pushpull(keys, values, outs=None):
    return {"op": "pushpull", "k": keys, "v": values, "o": outs}


def broadcast(keys, values, outs):
    return {"op": "broadcast", "k": keys, "v": values, "o": outs}


CASES = []


def case(name, ops, store="local", updater=None):
    assert all(c["name"] != name for c in CASES), name
    CASES.append({"name": name, "store": store, "updater": updater, "ops": ops})


# ---------------------------------------------------------------------------
# The cases.
# ---------------------------------------------------------------------------

# 1. The Python KVStore tutorial.
case("python_tutorial_basic", [
    init(3, ones(2)),
    pull(3, out()),
    push(3, ones(8)),
    pull(3, out()),
    push(3, on_cpus(1)),
    pull(3, out()),
    pull(3, outs_on_cpus()),
])

# The tutorial continues on the same store with the updater installed while
# the stored value is 4; the case starts with 4 stored instead.
case("python_tutorial_updater", [
    init(3, ones(4)),
    push(3, ones(1)),
    pull(3, outs_on_cpus()),
    init([5, 7, 9], [ones(1), ones(1), ones(1)]),
    push([5, 7, 9], [ones(1), ones(1), ones(1)]),
    pull([5, 7, 9], [out(), out(), out()]),
    push([5, 7, 9], [on_cpus(1), on_cpus(1), on_cpus(1)]),
    pull([5, 7, 9], [outs_on_cpus(), outs_on_cpus(), outs_on_cpus()]),
], updater="add_twice")

# 2. The Clojure tutorial (string keys, no updater).
case("clojure_tutorial_str_keys", [
    init("3", ones(2)),
    pull("3", out()),
    push("3", ones(8)),
    pull("3", out()),
    push(["3", "3", "3"], [ones(1), ones(1), ones(1)]),
    pull("3", out()),
    pull(["3", "3"], [out(), out()]),
    init(["5", "7", "9"], [ones(1), ones(1), ones(1)]),
    push(["5", "7", "9"], [ones(1), ones(1), ones(1)]),
    pull(["5", "7", "9"], [out(), out(), out()]),
])

# 3. clojure-mxnet's test-aggregate.
case("clojure_test_aggregate", [
    init("a", ones(0, (4, 4))),
    push("a", [ones(1, (4, 4)) for _ in range(4)]),
    pull("a", out((4, 4))),
    init(["b", "c", "d"], [ones(0, (4, 4))] * 3),
    push(["b", "c", "d"], [[ones(2, (4, 4)) for _ in range(4)] for _ in range(3)]),
    pull(["b", "c", "d"], [out((4, 4)), out((4, 4)), out((4, 4))]),
])

# 4. Duplicate keys inside one push list are merged (summed) per key.
case("push_duplicate_keys_in_list", [
    init([5, 7], [ones(0), ones(0)]),
    push([5, 5, 7], [ones(1), ones(2), ones(10)]),
    pull([5, 7, 5], [out(), out(), out()]),
])

case("push_duplicate_keys_in_list_str", [
    init(["x", "y"], [ones(0, (3,)), ones(0, (3,))]),
    push(["y", "x", "y", "x"], [rng(1, (3,)), rng(10, (3,)), rng(100, (3,)), ones(-1, (3,))]),
    pull(["x", "y"], [out((3,)), out((3,))]),
])

# 5. Updater call log: one call per distinct key, with the merged sum.
case("updater_call_order_int_keys", [
    init(1, ones(0, (1,))),
    init(2, ones(0, (1,))),
    push([2, 1, 2, 1, 1], [ones(v, (1,)) for v in (1, 2, 3, 4, 5)]),
    pull([1, 2], [out((1,)), out((1,))]),
], updater="add_twice")

case("updater_call_order_str_keys", [
    init(["b", "a"], [ones(0, (1,)), ones(0, (1,))]),
    push(["a", "b", "a"], [ones(v, (1,)) for v in (1, 2, 3)]),
    pull(["a", "b"], [out((1,)), out((1,))]),
], updater="add_twice")

# String keys are ordered by first init, not by their text.
case("updater_call_order_str_keys_init_order", [
    init("3", ones(0, (1,))),
    init("5", ones(0, (1,))),
    init("7", ones(0, (1,))),
    init("1", ones(0, (1,))),
    push(["7", "3", "1"], [ones(v, (1,)) for v in (1, 2, 3)]),
    pull(["1", "3", "5", "7"], [out((1,))] * 4),
], updater="add_twice")

case("updater_call_order_int_keys_sorted", [
    init([9, 4, 6], [ones(0, (1,))] * 3),
    push([6, 9, 4], [ones(v, (1,)) for v in (1, 2, 3)]),
    pull([4, 6, 9], [out((1,))] * 3),
], updater="add_twice")

# 6. Errors (each followed by a pull showing the store is unchanged).
case("error_reinit_int_key", [
    init(3, ones(1)),
    init(3, ones(2)),
    pull(3, out()),
    init([3], [ones(5)]),
    pull(3, out()),
])

case("error_reinit_str_key", [
    init("s", ones(1)),
    init("s", ones(2)),
    pull("s", out()),
    init(["s"], [ones(5)]),
    pull("s", out()),
])

case("error_unknown_int_key", [
    init(3, ones(1)),
    pull(4, out()),
    push(4, ones(2)),
    pull(3, out()),
])

case("error_unknown_int_key_with_updater", [
    init(3, ones(1)),
    pull(4, out()),
    push(4, ones(2)),
    pull(3, out()),
], updater="add_twice")

case("error_unknown_str_key", [
    init("a", ones(1)),
    pull("b", out()),
    push("b", ones(2)),
    pull("a", out()),
])

case("error_unknown_str_key_with_updater", [
    init("a", ones(1)),
    pull("b", out()),
    push("b", ones(2)),
    pull("a", out()),
], updater="add_twice")

case("error_pull_wrong_shape", [
    init(3, ones(1)),
    pull(3, out((3, 2))),
    pull(3, out((4, 4))),
    pull(3, out()),
])

case("error_multi_push_wrong_shape", [
    init(3, ones(1)),
    push(3, [ones(1), ones(1, (4, 4))]),
    pull(3, out()),
    push(3, [ones(1, (4, 4)), ones(1, (4, 4))]),
    pull(3, out()),
    push(3, [ones(2), ones(3)]),
    pull(3, out()),
])

case("error_length_mismatch", [
    init(3, ones(1)),
    init([8, 9], [ones(1)]),
    push([3, 9], [ones(7)]),
    pull([3, 9], [out()]),
    pull(3, out()),
    pull([3], [out(), out()]),
    pull(3, out()),
])

case("error_length_mismatch_str", [
    init("a", ones(1)),
    init(["b", "c"], [ones(1), ones(1), ones(1)]),
    push(["a", "b"], [ones(7)]),
    pull(["a"], [out(), out()]),
    pull("a", out()),
])

case("error_broadcast_twice", [
    broadcast(11, ones(3), out()),
    broadcast(11, ones(4), out()),
    pull(11, out()),
])

# 7. pushpull.
case("pushpull_str_key_in_place", [
    init("w", ones(0)),
    pushpull("w", ones(3)),
    pull("w", out()),
])

case("pushpull_int_keys_nested_in_place", [
    init([1, 2], [ones(0), ones(0)]),
    pushpull([1, 2], [[ones(1), ones(1)], [ones(3)]]),
    pull([1, 2], [out(), out()]),
])

case("pushpull_with_outs", [
    init([1, 2], [ones(0), ones(0)]),
    pushpull([1, 2], [[ones(1, ctx=0), ones(2, ctx=1)], [ones(3)]],
             [[out(ctx=2)], [out(ctx=0), out(ctx=3)]]),
    pushpull(1, ones(6), out(ctx=1)),
    pull([1, 2], [out(), out()]),
])

case("pushpull_with_updater", [
    init(["p", "q"], [ones(1), ones(10)]),
    pushpull("p", ones(2), out()),
    pushpull(["p", "q"], [on_cpus(1, 2), on_cpus(-1, 3)],
             [outs_on_cpus(2), outs_on_cpus(3)]),
    pushpull("q", [ones(1), ones(2)]),
    pull(["p", "q"], [out(), out()]),
], updater="add_twice")

# 8. broadcast.
case("broadcast_single", [
    broadcast("b", ones(2), out()),
    pull("b", out()),
])

case("broadcast_multi_out", [
    broadcast("c", ones(5), [out(ctx=0), out(ctx=1)]),
    pull("c", out()),
    push("c", on_cpus(1, 2)),
    pull("c", out()),
])

case("broadcast_key_list", [
    broadcast([4, 8], [rng(1), rng(-6, (3,))], [[out(), out(ctx=1)], [out((3,), ctx=2)]]),
    pull([8, 4], [out((3,)), out()]),
])

# 9. Every dtype: init, multi-value push, pull, single push, pull elsewhere.
for dt in DTYPES:
    case("dtype_" + dt, [
        init(3, ones(1, dtype=dt)),
        pull(3, out(dtype=dt)),
        push(3, [ones(5, dtype=dt, ctx=i) for i in range(3)]),
        pull(3, out(dtype=dt)),
        push(3, ones(7, dtype=dt)),
        pull(3, out(dtype=dt, ctx=1)),
        pull(3, [out(dtype=dt, ctx=2), out(dtype=dt, ctx=3)]),
    ])

case("dtype_mixed_keys_with_updater", [
    init(["f16", "f64", "u8", "i8", "i32", "i64"],
         [ones(1, (2, 2), dt) for dt in ["float16", "float64", "uint8", "int8", "int32", "int64"]]),
    push(["f16", "f64", "u8", "i8", "i32", "i64"],
         [[ones(2, (2, 2), dt, ctx=0), ones(3, (2, 2), dt, ctx=1)]
          for dt in ["float16", "float64", "uint8", "int8", "int32", "int64"]]),
    pull(["f16", "f64", "u8", "i8", "i32", "i64"],
         [out((2, 2), dt) for dt in ["float16", "float64", "uint8", "int8", "int32", "int64"]]),
], updater="add_twice")

# 10. Empty lists do nothing.
case("empty_lists", [
    init(5, ones(1)),
    push([], []),
    pull([], []),
    push(5, []),
    pull(5, []),
    pull(5, out()),
])

# 11. Non-trivial data.
case("distinct_values_multi_device", [
    init(0, rng(0)),
    init(1, rng(-4, (2, 2, 2))),
    push(0, [rng(0, ctx=0), rng(-3, ctx=1)]),
    pull(0, out()),
    push(1, [rng(-4, (2, 2, 2), ctx=i, step=i + 1) for i in range(4)]),
    pull(1, out((2, 2, 2), ctx=3)),
    push([0, 1], [[rng(10 * i, ctx=i, step=-1) for i in range(2)],
                  [rng(i, (2, 2, 2), ctx=i) for i in range(3)]]),
    pull([0, 1], [[out(), out(ctx=1)], [out((2, 2, 2), ctx=2)]]),
])

case("distinct_values_int_dtypes", [
    init(["i8", "u8", "i64"], [rng(-3, dtype="int8"), rng(0, dtype="uint8"), rng(-100, dtype="int64")]),
    push(["i8", "u8", "i64"], [[rng(-10, dtype="int8", ctx=i, step=2) for i in range(3)],
                               [rng(i, dtype="uint8", ctx=i, step=3) for i in range(4)],
                               [rng(-1000000, dtype="int64", ctx=i, step=-7) for i in range(2)]]),
    pull(["i8", "u8", "i64"], [out(dtype="int8"), out(dtype="uint8"), out(dtype="int64")]),
])

case("distinct_values_with_updater", [
    init(2, rng(1, (2, 2, 2))),
    push(2, [rng(-8, (2, 2, 2), ctx=i) for i in range(3)]),
    pull(2, out((2, 2, 2))),
    push(2, rng(5, (2, 2, 2), ctx=2, step=-2)),
    pull(2, [out((2, 2, 2), ctx=1), out((2, 2, 2), ctx=2)]),
    push(2, [rng(0, (2, 2, 2), ctx=i) for i in (3, 1)]),
    pull(2, out((2, 2, 2), ctx=3)),
], updater="add_twice")

# 12. The 'device' store (integer-valued sums, so identical to 'local').
case("device_store_multi_cpu", [
    init([3, 4], [ones(1), rng(0, (4, 4))]),
    push(3, [ones(i + 1, ctx=i) for i in range(4)]),
    pull(3, outs_on_cpus()),
    push([3, 4], [[ones(2, ctx=i) for i in range(2)], [rng(i, (4, 4), ctx=i) for i in range(4)]]),
    pull([3, 4], [out(), out((4, 4), ctx=1)]),
], store="device")

case("device_store_with_updater", [
    init("d", rng(0)),
    push("d", [rng(1, ctx=i) for i in range(4)]),
    pull("d", outs_on_cpus()),
], store="device", updater="add_twice")

# More of the same spirit.
case("push_fewer_values_after_more", [
    init(3, ones(0)),
    push(3, on_cpus(1, 4)),
    pull(3, out()),
    push(3, on_cpus(2, 3)),
    pull(3, out()),
    push(3, on_cpus(5, 2)),
    pull(3, out()),
    push(3, ones(4, ctx=1)),
    pull(3, out()),
])

case("nested_init_pull_shapes", [
    init([10, 20, 30], [ones(1, (1,)), rng(0, (3,)), rng(0, (4, 4))]),
    pull([10, 20, 30], [[out((1,)), out((1,), ctx=1)], [out((3,))], [out((4, 4), ctx=2)] * 3]),
    push([30, 10], [[rng(0, (4, 4), ctx=1), rng(16, (4, 4), ctx=2)], ones(9, (1,))]),
    pull([10, 30], [out((1,)), out((4, 4))]),
])

case("init_from_other_ctx", [
    init("k", rng(1, ctx=2)),
    pull("k", [out(ctx=0), out(ctx=3)]),
    push("k", [rng(0, ctx=3), rng(0, ctx=1)]),
    pull("k", out(ctx=1)),
])

case("updater_single_push_str_keys_many_values", [
    init(["w0", "w1"], [ones(0, (3,)), ones(0, (3,))]),
    push("w0", [rng(1, (3,), ctx=i) for i in range(4)]),
    push(["w1", "w0"], [ones(-2, (3,)), ones(1, (3,))]),
    push(["w1", "w1"], [ones(4, (3,)), ones(6, (3,))]),
    pull(["w0", "w1"], [out((3,)), out((3,))]),
], updater="add_twice")


# ---------------------------------------------------------------------------
# Runner.
# ---------------------------------------------------------------------------

def is_spec(x):
    return isinstance(x, dict)


def make_nd(spec, zeros=False):
    ctx = mx.cpu(spec["ctx"])
    if zeros:
        return mx.nd.zeros(tuple(spec["shape"]), ctx=ctx, dtype=spec["dtype"])
    data = np.array(spec["data"], dtype=spec["dtype"]).reshape(spec["shape"])
    assert (data.ravel().astype(np.float64) == np.array(spec["data"], dtype=np.float64)).all(), \
        "value not exactly representable: %r" % (spec,)
    return mx.nd.array(data, ctx=ctx, dtype=spec["dtype"])


def build(tree, zeros=False):
    """Spec / list / nested list -> NDArray / list / nested list."""
    if tree is None:
        return None
    if is_spec(tree):
        return make_nd(tree, zeros)
    return [build(t, zeros) for t in tree]


def num(x, dtype):
    if dtype.startswith("float"):
        f = float(x)
        assert f == int(f), "non-integral value %r" % f
        return int(f)
    return int(x)


def describe(nd, with_data=True):
    dtype = np.dtype(nd.dtype).name
    d = {"shape": list(nd.shape), "dtype": dtype, "ctx": nd.context.device_id}
    if with_data:
        d["data"] = [num(x, dtype) for x in nd.asnumpy().ravel().tolist()]
    return d


def flatten(keys, vals):
    """Flatten (keys, values) the way mxnet.kvstore.base._ctype_key_value
    does: one key per value.  For lists of keys whose length differs from the
    list of values (a LengthMismatch case) the keys are kept as given and the
    values flattened in order."""
    if isinstance(keys, list):
        if len(keys) != len(vals):
            return ([str(k) for k in keys],
                    [x for v in vals for x in (v if isinstance(v, list) else [v])])
        ks, vs = [], []
        for k, v in zip(keys, vals):
            k2, v2 = flatten(k, v)
            ks += k2
            vs += v2
        return ks, vs
    if isinstance(vals, list):
        return [str(keys)] * len(vals), list(vals)
    return [str(keys)], [vals]


def form_of(keys, vals):
    if not isinstance(keys, list):
        return "one_key_many_values" if isinstance(vals, list) else "single"
    return "nested" if any(isinstance(v, list) for v in vals) else "list"


def classify(exc):
    msg = str(exc)
    if isinstance(exc, AssertionError):
        kind = "LengthMismatch"
        text = "AssertionError: " + msg
    else:
        # Drop MXNet's "Traceback ... File ..., line N" prefix.
        text = msg.split("MXNetError: ")[-1].strip() if "MXNetError: " in msg else msg.strip()
        if ("has not been inited" in text or "doesn't exist" in text
                or "Check failed: !is_none()" in text):
            kind = "KeyNotInitialized"
        elif "duplicate init" in text:
            kind = "AlreadyInitialized"
        elif "shape mismatch" in text:
            kind = "ShapeMismatch"
        else:
            kind = "Other:" + text[:80]
    return kind, text[:200]


def key_str(key):
    return key.decode() if isinstance(key, bytes) else str(key)


def all_keys(tree):
    if isinstance(tree, list):
        return [k for t in tree for k in all_keys(t)]
    return [tree]


def run_case(c):
    kv = mx.kv.create(c["store"])
    calls = []
    if c["updater"] == "add_twice":
        def add_twice(key, inp, stored):
            calls.append((key_str(key), inp.copy()))
            stored += inp * 2
        kv._set_updater(add_twice)
    else:
        assert c["updater"] is None

    key_types = {type(k) for op in c["ops"] for k in all_keys(op["k"])}
    assert len(key_types) <= 1, "mixed key types in %s" % c["name"]
    int_keys = key_types == {int}

    ops = []
    for op in c["ops"]:
        kind = op["op"]
        keys = op["k"]
        vals = build(op.get("v"))
        outs = build(op.get("o"), zeros=True)
        rec = {"op": kind}
        fn = {"init": kv.init, "push": kv.push, "pull": kv.pull,
              "pushpull": kv.pushpull, "broadcast": kv.broadcast}[kind]
        if kind == "pull":
            fkeys, fouts = flatten(keys, outs)
            rec["keys"] = fkeys
            rec["form"] = form_of(keys, outs)
            rec["outs"] = [describe(o, False) for o in fouts]
            args = (keys,)
            kwargs = {"out": outs}
        else:
            fkeys, fvals = flatten(keys, vals)
            rec["keys"] = fkeys
            rec["form"] = form_of(keys, vals)
            rec["values"] = [describe(v) for v in fvals]
            args = (keys, vals)
            kwargs = {}
            if kind in ("pushpull", "broadcast"):
                kwargs["out"] = outs
                if outs is None:
                    rec["outs"] = None
                    fouts = fvals
                else:
                    okeys, fouts = flatten(keys, outs)
                    rec["out_keys"] = okeys
                    rec["outs"] = [describe(o, False) for o in fouts]
        try:
            fn(*args, **kwargs)
            mx.nd.waitall()
        except (mx.base.MXNetError, AssertionError) as e:
            mx.nd.waitall()
            rec["error"], rec["mxnet_message"] = classify(e)
            if rec["error"] == "LengthMismatch":
                # must stay recognisable from the flattened lists
                assert len(rec["keys"]) != len(rec.get("values", rec.get("outs"))), c["name"]
        else:
            if kind in ("pull", "pushpull", "broadcast"):
                rec["expect"] = [describe(o) for o in fouts]
        ops.append(rec)

    mx.nd.waitall()
    result = {
        "name": c["name"],
        "store": c["store"],
        "updater": c["updater"],
        "int_keys": int_keys,
        "ops": ops,
        "updater_calls": [{"key": k, "input": describe(v)} for k, v in calls],
    }
    del kv
    return result


def render(doc):
    """Readable, stable JSON: one line per op / updater call."""
    def one(x):
        return json.dumps(x, ensure_ascii=True, separators=(", ", ": "))

    w = io.StringIO()
    w.write("{\n")
    w.write('  "mxnet_version": %s,\n' % one(doc["mxnet_version"]))
    w.write('  "generator": %s,\n' % one(doc["generator"]))
    w.write('  "cases": [\n')
    for ci, c in enumerate(doc["cases"]):
        w.write("    {\n")
        for field in ("name", "store", "updater", "int_keys"):
            w.write('      "%s": %s,\n' % (field, one(c[field])))
        for field in ("ops", "updater_calls"):
            items = c[field]
            if not items:
                w.write('      "%s": []' % field)
            else:
                w.write('      "%s": [\n' % field)
                for i, it in enumerate(items):
                    w.write("        " + one(it) + ("," if i + 1 < len(items) else "") + "\n")
                w.write("      ]")
            w.write(",\n" if field == "ops" else "\n")
        w.write("    }" + ("," if ci + 1 < len(doc["cases"]) else "") + "\n")
    w.write("  ]\n}\n")
    text = w.getvalue()
    assert json.loads(text) == doc
    return text


def main(argv):
    if mx.__version__ != MXNET_VERSION:
        sys.exit("expected MXNet %s, found %s" % (MXNET_VERSION, mx.__version__))
    doc = {
        "mxnet_version": MXNET_VERSION,
        "generator": GENERATOR,
        "cases": [run_case(c) for c in CASES],
    }
    text = render(doc)
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)
