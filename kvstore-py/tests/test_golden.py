"""MXNet 1.9.1's own results (tests/golden, recorded by its generators), replayed
through the Python API: every pulled value, error class and updater call of the
KVStore cases, and every optimizer step."""

import json
import math
import pathlib

import numpy as np
import pytest

import kvstore as kv
from kvstore import lr_scheduler, optimizer

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden"

# Where the store deliberately differs from MXNet (docs/mxnet-differences.md).
UPDATE_ORDER_DIFFERS = {"updater_call_order_int_keys_sorted"}

ERRORS = {
    "KeyNotInitialized": kv.KeyNotInitializedError,
    "AlreadyInitialized": kv.AlreadyInitializedError,
    "ShapeMismatch": kv.ShapeMismatchError,
    "LengthMismatch": kv.LengthMismatchError,
    "DTypeMismatch": kv.DTypeMismatchError,
}


def load(name):
    path = GOLDEN / name
    if not path.exists():
        pytest.skip(f"{path} is not here (the package was copied out of the repository)")
    return json.loads(path.read_text())


def array(spec, with_data):
    a = np.zeros(spec["shape"], dtype=spec["dtype"])
    if with_data:
        a[...] = np.array(spec["data"], dtype=np.float64).reshape(spec["shape"])
    return a


def key(k, ints):
    return int(k) if ints else k


def call_args(op, ints, values, out_keys=None, outs=None):
    """The Python call's key and arrays rebuilt from the flattened golden op."""
    keys = [key(k, ints) for k in op["keys"]]
    form = op["form"] if keys else "list"
    if form in ("single", "one_key_many_values"):
        k = keys[0]
        vals = values[0] if form == "single" and len(values) == 1 else list(values)
    elif form == "list":
        k, vals = keys, list(values)
    else:  # nested: consecutive runs of one key
        k, vals = [], []
        for kk, v in zip(keys, values):
            if k and k[-1] == kk:
                vals[-1].append(v)
            else:
                k.append(kk)
                vals.append([v])
    if outs is None:
        return k, vals, None
    if not isinstance(k, list):
        o = outs[0] if len(outs) == 1 else list(outs)
    elif len(outs) == len(k):
        o = list(outs)
    else:
        o = _group(k, [key(x, ints) for x in out_keys], outs)
    return k, vals, o


def _group(keys, out_keys, outs):
    groups, i = [], 0
    for k in keys:
        run = []
        while i < len(outs) and out_keys[i] == k:
            run.append(outs[i])
            i += 1
        groups.append(run)
    return groups


def replay(case):
    store = kv.create(case["store"])
    ints = case["int_keys"]
    calls = []
    if case["updater"] == "add_twice":

        def add_twice(k, recv, stored):
            calls.append((str(k), recv.astype(np.float64).ravel().tolist()))
            stored += recv * 2

        store.set_updater(add_twice)
    for i, op in enumerate(case["ops"]):
        kind = op["op"]
        got = None
        try:
            if kind == "pull":
                outs = [array(s, False) for s in op["outs"]]
                k, o, _ = call_args(op, ints, outs)
                store.pull(k, out=o)
                got = outs
            else:
                values = [array(s, True) for s in op["values"]]
                if kind in ("init", "push"):
                    k, v, _ = call_args(op, ints, values)
                    getattr(store, kind)(k, v)
                elif op.get("outs") is None:  # pushpull into the values
                    k, v, _ = call_args(op, ints, values)
                    store.pushpull(k, v)
                    got = values
                else:
                    outs = [array(s, False) for s in op["outs"]]
                    k, v, o = call_args(op, ints, values, op["out_keys"], outs)
                    getattr(store, kind)(k, v, out=o)
                    got = outs
        except kv.KVStoreError as e:
            want = op.get("error")
            assert want is not None, f"{case['name']} op {i}: unexpected {e!r}"
            assert isinstance(e, ERRORS[want]), f"{case['name']} op {i}: {e!r}, MXNet: {want}"
            continue
        assert "error" not in op, f"{case['name']} op {i}: MXNet raised {op['error']}, the store did not"
        if "expect" in op:
            for g, e in zip(got, op["expect"]):
                assert g.ravel().astype(np.float64).tolist() == e["data"], f"{case['name']} op {i}"
    expected = [(c["key"], [float(x) for x in c["input"]["data"]]) for c in case["updater_calls"]]
    if case["name"] in UPDATE_ORDER_DIFFERS:
        calls.sort()
        expected.sort()
    assert calls == expected, case["name"]


def test_every_kvstore_case_recorded_from_mxnet_replays():
    golden = load("mxnet_local.json")
    assert golden["mxnet_version"] == "1.9.1"
    for case in golden["cases"]:
        replay(case)


def schedule(spec):
    if spec is None:
        return None
    spec = dict(spec)
    kind = spec.pop("type")
    if "steps" in spec:
        spec["step"] = spec.pop("steps")
    return {
        "factor": lr_scheduler.FactorScheduler,
        "multifactor": lr_scheduler.MultiFactorScheduler,
        "poly": lr_scheduler.PolyScheduler,
        "cosine": lr_scheduler.CosineScheduler,
    }[kind](**spec)


TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3}


def test_every_optimizer_matches_mxnet_step_by_step():
    golden = load("mxnet_optimizers.json")
    checked = 0
    for case in golden["cases"]:
        if case["optimizer"] == "sgld":
            continue  # random noise: checked statistically by the Rust suite
        dtype = case["dtype"]
        opt = optimizer.create(case["optimizer"], lr_scheduler=schedule(case["scheduler"]), **case["params"])
        opt.set_lr_mult(case["lr_mult"])
        opt.set_wd_mult(case["wd_mult"])
        store = kv.create("local")
        for k in case["keys"]:
            store.init(k["key"], np.array(k["init"], dtype=dtype).reshape(k["shape"]))
        store.set_optimizer(opt)
        shapes = {k["key"]: k["shape"] for k in case["keys"]}
        for s, step in enumerate(case["steps"]):
            # One list push per step, as MXNet's generator made (a key's updates then
            # go in the keys' order, which a schedule's boundaries depend on).
            keys, vals = [], []
            for p in step["push"]:
                keys.append(p["key"])
                vals.append([np.array(v["data"], dtype=dtype).reshape(shapes[p["key"]]) for v in p["values"]])
            store.push(keys, vals)
            for k, want in step["pull"].items():
                got = store.pull(k).astype(np.float64).ravel()
                tol = TOLERANCE[dtype]
                for g, w in zip(got, want):
                    assert math.isclose(g, w, rel_tol=tol, abs_tol=tol), f"{case['name']} step {s} {k}: {g} vs {w}"
                    checked += 1
    assert checked > 1000
