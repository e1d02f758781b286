"""2-bit gradient compression through the Python API: every case MXNet 1.9.1
recorded (tests/golden/mxnet_compression.json, by generate_compression.py)
replayed bit for bit, and MXNet's parameter errors."""

import json
import pathlib

import numpy as np
import pytest

import kvstore as kv
from kvstore import optimizer

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden" / "mxnet_compression.json"


def golden():
    if not GOLDEN.exists():
        pytest.skip(f"{GOLDEN} is not here (the package was copied out of the repository)")
    return json.loads(GOLDEN.read_text())


def cases():
    return golden()["cases"] if GOLDEN.exists() else []


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_every_recorded_case_replays_bit_for_bit(case):
    store = kv.create("device")
    params = {"type": "2bit", "threshold": case["threshold"]}
    if not case["after_init"]:
        store.set_gradient_compression(params)
    shapes = {k["key"]: tuple(k["shape"]) for k in case["keys"]}
    for k in case["keys"]:
        store.init(k["key"], np.array(k["init"], np.float32).reshape(k["shape"]))
    if case["after_init"]:
        store.set_gradient_compression(params)
    if case["optimizer"]:
        store.set_optimizer(optimizer.create(case["optimizer"]["name"], **case["optimizer"]["params"]))
    for s, step in enumerate(case["steps"]):
        keys, values = [], []
        for push in step["push"]:
            for v in push["values"]:
                keys.append(push["key"])
                values.append(np.array(v["data"], np.float32).reshape(shapes[push["key"]]))
        store.push(keys, values)
        for k, want in step["pull"].items():
            got = store.pull(k).ravel()
            want = np.array(want, np.float32)
            assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (case["name"], s, k, got, want)


def test_parameters_mxnet_refuses_raise_and_a_local_store_has_none():
    for e in golden()["errors"]:
        store = kv.create(e["store"])
        err = kv.UnsupportedError if e["store"] == "local" else ValueError
        with pytest.raises(err):
            store.set_gradient_compression(e["params"])
    with pytest.raises(TypeError, match="dict"):
        kv.create("device").set_gradient_compression("2bit")
