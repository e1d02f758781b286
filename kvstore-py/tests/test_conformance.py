"""The conformance cases of the MXNet 1.9.1 reference (its §10, with the argument forms
of §2 and the errors of §3) that apply to a ``local`` store, written in MXNet's Python
forms with numpy arrays in place of NDArrays.

Where the store deliberately differs from MXNet (the project's docs/mxnet-differences.md),
the test checks the project's rule and says which difference it is: error
classes and messages are the project's, push copies (case 18), shapes and dtypes are
checked, sums run left to right with f16 accumulated in f32 (cases 16, 17), keys are
strings (``3`` is ``"3"``) and updates run in first-init order, unknown store kinds are
errors (case 22), and a failed call changes nothing.
"""

import json
import struct

import numpy as np
import pytest

import kvstore as kv
from kvstore import optimizer

SHAPE = (2, 3)


def ones(shape=SHAPE, dtype=np.float32):
    return np.ones(shape, dtype=dtype)


def zeros(shape=SHAPE, dtype=np.float32):
    return np.zeros(shape, dtype=dtype)


def pulled(store, key, shape=SHAPE, dtype=np.float32):
    out = zeros(shape, dtype)
    store.pull(key, out=out)
    return out


def all_equal(a, value):
    return a.size > 0 and bool((a == value).all())


class Recorder:
    """MXNet's tutorial updater ``stored += 2 * recv``, logging (key, recv) per call."""

    def __init__(self):
        self.calls = []

    def __call__(self, key, recv, stored):
        self.calls.append((key, recv.copy()))
        stored += recv * 2

    def keys(self):
        return [k for k, _ in self.calls]


# Cases 1-5 build on one store, as MXNet's tutorial does.
def test_cases_1_to_5_the_tutorial():
    store = kv.create("local")
    # 1: init then pull.
    store.init(3, ones() * 2)
    a = zeros()
    store.pull(3, out=a)
    assert all_equal(a, 2)
    # 2: a push with no updater assigns.
    store.push(3, ones() * 8)
    store.pull(3, out=a)
    assert all_equal(a, 8)
    # 3: four "devices" are summed; a pull writes every out.
    store.push(3, [ones() for _ in range(4)])
    outs = [zeros() for _ in range(4)]
    store.pull(3, out=outs)
    assert all(all_equal(o, 4) for o in outs)
    # 4: an updater set now changes later pushes only; it sees the int key 3.
    rec = Recorder()
    store.set_updater(rec)
    assert all_equal(pulled(store, 3), 4)
    store.push(3, ones())
    assert all_equal(pulled(store, 3), 6)
    assert rec.keys() == [3] and type(rec.calls[0][0]) is int
    assert all_equal(rec.calls[0][1], 1)
    # 5: a list of keys, one call per key in order; then four values per key.
    keys = [5, 7, 9]
    store.init(keys, [ones()] * 3)
    rec.calls.clear()
    store.push(keys, [ones()] * 3)
    b = [zeros() for _ in keys]
    store.pull(keys, out=b)
    assert all(all_equal(x, 3) for x in b)
    assert rec.keys() == [5, 7, 9]
    store.push(keys, [[ones()] * 4] * 3)
    store.pull(keys, out=b)
    assert all(all_equal(x, 11) for x in b)
    assert rec.keys() == [5, 7, 9] * 2
    assert all(all_equal(r, 4) for _, r in rec.calls[3:])


def test_case_6_string_keys_the_clojure_tutorial():
    store = kv.create("local")
    store.init("3", ones() * 2)
    assert all_equal(pulled(store, "3"), 2)
    store.push("3", ones() * 8)
    assert all_equal(pulled(store, "3"), 8)
    store.push(["3", "3", "3"], [ones()] * 3)
    a, b = zeros(), zeros()
    store.pull(["3", "3"], out=[a, b])
    assert all_equal(a, 3) and all_equal(b, 3)
    store.init(["5", "7", "9"], [ones()] * 3)
    store.push(["5", "7", "9"], [ones()] * 3)
    outs = [zeros() for _ in range(3)]
    store.pull(["5", "7", "9"], out=outs)
    assert all(all_equal(o, 1) for o in outs)
    assert store.keys() == ["3", "5", "7", "9"]


def test_case_7_clojure_test_aggregate():
    shape = (4, 4)
    store = kv.create("local")
    store.init("a", zeros(shape))
    store.push("a", [ones(shape)] * 4)
    assert all_equal(pulled(store, "a", shape), 4)
    keys = ["b", "c", "d"]
    store.init(keys, [zeros(shape)] * 3)
    store.push(keys, [[ones(shape) * 2] * 4] * 3)
    outs = [zeros(shape) for _ in keys]
    store.pull(keys, out=outs)
    assert all(all_equal(o, 8) for o in outs)


def test_case_8_repeated_keys_are_grouped_and_summed():
    store = kv.create("local")
    store.init([5, 7], [zeros(), zeros()])
    store.push([5, 5, 7], [ones() * 1, ones() * 2, ones() * 10])
    outs = [zeros() for _ in range(3)]
    store.pull([5, 7, 5], out=outs)
    assert [float(o[0, 0]) for o in outs] == [3.0, 10.0, 3.0]
    assert all(all_equal(o, o[0, 0]) for o in outs)


def test_case_9_the_updater_runs_once_per_key_with_the_sum_in_first_init_order():
    store = kv.create("local")
    rec = Recorder()
    store.set_updater(rec)
    store.init([1, 2], [zeros(), zeros()])
    store.push([2, 1, 2, 1, 1], [ones() * v for v in [1, 2, 3, 4, 5]])
    assert [(k, float(r[0, 0])) for k, r in rec.calls] == [(1, 11.0), (2, 4.0)]
    assert all(all_equal(r, r[0, 0]) for _, r in rec.calls)
    assert all_equal(pulled(store, 1), 22) and all_equal(pulled(store, 2), 8)
    # String keys inited ['b', 'a']: 'b' first (MXNet gave bytes keys; here str).
    store.init(["b", "a"], [zeros(), zeros()])
    rec.calls.clear()
    store.push(["a", "b", "a"], [ones() * v for v in [1, 2, 3]])
    assert [(k, float(r[0, 0])) for k, r in rec.calls] == [("b", 2.0), ("a", 4.0)]
    assert all(type(k) is str for k in rec.keys())


def test_case_9_int_keys_update_in_first_init_order_not_sorted():
    # Difference 7: MXNet sorted int keys numerically (golden case
    # updater_call_order_int_keys_sorted); here updates follow first init.
    store = kv.create("local")
    rec = Recorder()
    store.set_updater(rec)
    store.init([2, 1], [zeros(), zeros()])
    store.push([1, 2, 1], [ones() * 5, ones() * 4, ones() * 6])
    assert [(k, float(r[0, 0])) for k, r in rec.calls] == [(2, 4.0), (1, 11.0)]


def test_case_11_errors_are_the_projects_classes_and_change_nothing():
    store = kv.create("local")
    store.init(3, ones())
    store.init("a", ones())
    # Re-init of an int or a string key.
    for key in (3, "a", "3"):
        with pytest.raises(kv.AlreadyInitializedError, match="duplicate init of key") as e:
            store.init(key, ones() * 9)
        assert e.value.code == "ALREADY_INITIALIZED" and e.value.key == str(key)
    # Pull or push of an unknown int or string key.
    for key in (100, "zz"):
        with pytest.raises(kv.KeyNotInitializedError, match="not initialized") as e:
            store.pull(key, out=zeros())
        assert e.value.key == str(key) and isinstance(e.value, KeyError)
        with pytest.raises(kv.KeyNotInitializedError):
            store.push(key, ones())
        with pytest.raises(kv.KeyNotInitializedError):
            store.pushpull(key, ones(), out=zeros())
    # Int then str: the same key, no "mixed key types" error (difference 7).
    assert all_equal(pulled(store, "3"), 1)
    store.push("3", ones() * 5)
    assert all_equal(pulled(store, 3), 5)
    # Pull into (4, 4) from (2, 3).
    with pytest.raises(kv.ShapeMismatchError, match="shape mismatch") as e:
        store.pull(3, out=zeros((4, 4)))
    assert (e.value.expected, e.value.got) == ((2, 3), (4, 4))
    assert all_equal(pulled(store, 3), 5) and all_equal(pulled(store, "a"), 1)
    assert store.keys() == [3, "a"]


def test_section_3_shapes_and_dtypes_are_checked():
    # Difference 2: MXNet replaced the stored array on a single-value push of another
    # shape or dtype, and cast on pull; here all are errors that change nothing.
    store = kv.create("local")
    store.init(3, ones() * 2)
    with pytest.raises(kv.ShapeMismatchError):
        store.push(3, ones((3, 3)))
    with pytest.raises(kv.DTypeMismatchError) as e:
        store.push(3, ones(dtype=np.float64))
    assert (e.value.expected, e.value.got) == ("float32", "float64")
    with pytest.raises(kv.ShapeMismatchError, match="value 2 of 2"):
        store.push(3, [ones(), ones((3, 3))])
    with pytest.raises(kv.DTypeMismatchError, match="value 1 of 2"):
        store.push(3, [ones(dtype=np.float64), ones()])
    with pytest.raises(kv.DTypeMismatchError, match="value 2 of 2"):
        store.push(3, [ones(), ones(dtype=np.int32)])
    with pytest.raises(kv.DTypeMismatchError):
        store.pull(3, out=zeros(dtype=np.int32))
    with pytest.raises(kv.DTypeMismatchError):
        store.pull(3, out=zeros(dtype=np.float16))
    assert all_equal(pulled(store, 3), 2)
    assert store.pull(3).dtype == np.float32


def test_section_3_a_failed_list_call_changes_no_key():
    # Difference 8: lists are checked whole before any key is touched.
    store = kv.create("local")
    with pytest.raises(kv.AlreadyInitializedError, match="twice in this call"):
        store.init(["x", "y", "x"], [ones()] * 3)
    assert store.keys() == []
    store.init(["x", "y"], [ones(), ones()])
    with pytest.raises(kv.KeyNotInitializedError):
        store.push(["x", "nope"], [ones() * 7, ones()])
    with pytest.raises(kv.ShapeMismatchError):
        store.push(["x", "y"], [ones() * 7, ones((1,))])
    with pytest.raises(kv.LengthMismatchError) as e:
        store.push(["x", "y"], [ones() * 7])
    assert (e.value.expected, e.value.got) == (2, 1)
    assert all_equal(pulled(store, "x"), 1) and all_equal(pulled(store, "y"), 1)


def test_section_2_key_forms():
    store = kv.create("local")
    # Negative ints, '' and unicode are keys; ints and their strings are one key.
    keys = [-5, "", "ключ", 2**40]
    store.init(keys, [ones() * i for i in range(4)])
    for i, k in enumerate(keys):
        assert all_equal(pulled(store, k), i)
    assert all_equal(pulled(store, "-5"), 0) and all_equal(pulled(store, str(2**40)), 3)
    assert store.keys() == keys
    # Tuples are sequences too.
    store.push((-5, ""), (ones() * 7, ones() * 8))
    assert all_equal(pulled(store, -5), 7) and all_equal(pulled(store, ""), 8)
    # Floats, bools and numpy ints are not keys (MXNet took bool as an int).
    for bad in (1.5, True, np.int64(3), None):
        with pytest.raises(TypeError, match="key must be an int or a str"):
            store.push(bad, ones())


def test_section_2_empty_lists_do_nothing_but_their_key_must_exist():
    store = kv.create("local")
    store.init(5, ones())
    store.push([], [])
    store.pull([], out=[])
    store.push(5, [])
    store.pull(5, out=[])
    assert all_equal(pulled(store, 5), 1)
    # Difference 12: MXNet let these pass for a key never initialized.
    with pytest.raises(kv.KeyNotInitializedError):
        store.push(6, [])
    with pytest.raises(kv.KeyNotInitializedError):
        store.pull(6, out=[])


def test_section_0_more_values_than_the_first_multi_value_push_are_summed():
    # Difference 3: MXNet crashed here.
    store = kv.create("local")
    store.init(3, zeros())
    store.push(3, [ones()] * 2)
    assert all_equal(pulled(store, 3), 2)
    store.push(3, [ones()] * 4)
    assert all_equal(pulled(store, 3), 4)
    store.push(3, [ones()] * 9)
    assert all_equal(pulled(store, 3), 9)


def test_section_0_an_updater_that_raises_fails_its_push():
    # Difference 4: MXNet printed the exception and went on.
    store = kv.create("local")
    store.init(["p", "q"], [ones(), ones()])

    def half_bad(key, recv, stored):
        stored += recv
        if key == "q":
            raise RuntimeError("no")

    store.set_updater(half_bad)
    with pytest.raises(kv.BackendError):
        store.push(["p", "q"], [ones(), ones()])
    assert all_equal(pulled(store, "p"), 1) and all_equal(pulled(store, "q"), 1)


def test_case_12_sgd_defaults():
    store = kv.create("local")
    store.init(3, zeros((2, 2)))
    store.set_optimizer(optimizer.SGD())
    store.push(3, ones((2, 2)))
    np.testing.assert_allclose(pulled(store, 3, (2, 2)), np.full((2, 2), -0.01), rtol=1e-6)


def read_safetensors(path):
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    meta = header.pop("__metadata__")
    tensors = {}
    for name, spec in header.items():
        assert spec["dtype"] == "F32"
        lo, hi = spec["data_offsets"]
        tensors[name] = np.frombuffer(data[lo:hi], dtype="<f4").reshape(spec["shape"])
    return meta, tensors


def test_case_13_sgd_momentum_and_its_states_file(tmp_path):
    store = kv.create("local")
    store.init(["w1", "w0"], [ones((2, 2)), ones((2, 2))])
    store.set_optimizer(optimizer.SGD(learning_rate=0.1, momentum=0.9))
    for _ in range(2):
        store.push(["w0", "w1"], [ones((2, 2)) * 1, ones((2, 2)) * 2])
    np.testing.assert_allclose(pulled(store, "w0", (2, 2)), 0.71, rtol=1e-6)
    np.testing.assert_allclose(pulled(store, "w1", (2, 2)), 0.42, rtol=1e-6)
    # Difference 9: the states are safetensors with JSON metadata, not a pickle; the
    # keys are 'w1' then 'w0' (first-init order) with momentum -0.38 and -0.19.
    path = tmp_path / "sgd.states"
    store.save_optimizer_states(str(path))
    assert not path.read_bytes().startswith(b"\x80\x04")
    meta, tensors = read_safetensors(path)
    assert meta["optimizer"] == "sgd"
    keys = [k["key"] for k in json.loads(meta["keys"])]
    assert keys == ["w1", "w0"]
    np.testing.assert_allclose(tensors["k0.momentum"], -0.38, rtol=1e-6)
    np.testing.assert_allclose(tensors["k1.momentum"], -0.19, rtol=1e-6)
    # And the file loads back into a store that then steps identically.
    other = kv.create("local")
    other.init(["w1", "w0"], [pulled(store, "w1", (2, 2)), pulled(store, "w0", (2, 2))])
    other.set_optimizer(optimizer.SGD(learning_rate=0.1, momentum=0.9))
    other.load_optimizer_states(str(path))
    for s in (store, other):
        s.push(["w0", "w1"], [ones((2, 2)), ones((2, 2)) * 2])
    assert (pulled(other, "w0", (2, 2)) == pulled(store, "w0", (2, 2))).all()
    np.testing.assert_allclose(pulled(other, "w0", (2, 2)), 0.71 - 0.271, rtol=1e-5)


def test_case_14_pushpull_with_no_out_writes_the_values():
    store = kv.create("local")
    store.init("w", zeros())
    v = ones() * 3
    store.pushpull("w", v)
    assert all_equal(v, 3) and all_equal(pulled(store, "w"), 3)
    store.init([1, 2], [zeros(), zeros()])
    vals = [[ones() * 1, ones() * 2], [ones() * 3]]
    store.pushpull([1, 2], vals)
    assert all(all_equal(x, 3) for row in vals for x in row)
    assert all_equal(pulled(store, 1), 3) and all_equal(pulled(store, 2), 3)


def test_case_15_broadcast():
    store = kv.create("local")
    a = zeros()
    store.broadcast("b", ones() * 2, out=a)
    assert all_equal(a, 2)
    with pytest.raises(kv.AlreadyInitializedError, match='duplicate init of key "b"'):
        store.broadcast("b", ones() * 2, out=a)
    x, y = zeros(), zeros()
    store.broadcast("c", ones() * 5, out=[x, y])
    assert all_equal(x, 5) and all_equal(y, 5)
    assert store.keys() == ["b", "c"]


def push_sum(kind, values, dtype):
    store = kv.create(kind)
    store.init(0, np.zeros(1, dtype=dtype))
    store.push(0, [np.array([v], dtype=dtype) for v in values])
    return pulled(store, 0, (1,), dtype)[0]


@pytest.mark.parametrize("kind", ["local", "device"])
def test_case_16_f16_sums_accumulate_in_f32_and_round_once(kind):
    # Difference 5: MXNet's local gave 2048 for [1, 2048, 1] and [1, 1, 2048].
    for values in ([1, 2048, 1], [2048, 1, 1], [1, 1, 2048]):
        got = push_sum(kind, values, np.float16)
        assert got == np.float16(2050) and got.dtype == np.float16, (values, got)
    assert push_sum(kind, [60000, 60000], np.float16) == np.inf


@pytest.mark.parametrize("kind", ["local", "device"])
def test_case_17_f32_sums_run_left_to_right(kind):
    # Difference 5: MXNet's local gave 1e8.
    assert push_sum(kind, [4, 4, 1e8], np.float32) == np.float32(100000008)
    assert push_sum(kind, [1e8, 4, 4], np.float32) == np.float32(1e8)


def test_case_18_push_copies():
    # Difference 1: MXNet aliased a single pushed array (42 here); the store copies.
    store = kv.create("local")
    store.init(3, zeros())
    g = ones()
    store.push(3, g)
    g[:] = 42
    assert all_equal(pulled(store, 3), 1)
    h = [ones() * 2, ones() * 3]
    store.push(3, h)
    h[0][:] = 42
    assert all_equal(pulled(store, 3), 5)
    # init and pull copy too (as in MXNet).
    v = ones() * 6
    store.init(4, v)
    v[:] = 0
    out = pulled(store, 4)
    out[:] = -1
    assert all_equal(pulled(store, 4), 6)
    # A non-blocking push copies at the call unless copy=False.
    k = ones() * 7
    fut = store.push_async(3, k)
    k[:] = 42
    fut.result(10)
    assert all_equal(pulled(store, 3), 7)


def test_case_21_pushpull_on_a_local_store():
    # MXNet ran this on its plugin 'teststore' (an allreduce with no stored value);
    # on `local` the key is initialized first. The plugin's "no optimizer" part does
    # not apply: a local store is optimizer-capable.
    store = kv.create("local")
    store.init(1, zeros())
    a, b = zeros(), zeros()
    store.pushpull(1, [ones()] * 2, out=[a, b])
    assert all_equal(a, 2) and all_equal(b, 2)
    store.pushpull(1, [a, b])
    assert all_equal(a, 4) and all_equal(b, 4)
    assert store.is_capable("optimizer") is True
    with pytest.raises(kv.InvalidArgumentError, match="capability"):
        store.is_capable("teleport")


def test_case_22_metadata():
    store = kv.create("local")
    assert (store.type, store.rank, store.num_workers) == ("local", 0, 1)
    assert kv.create("LOCAL").type == "local"
    assert kv.create().type == "local"
    assert kv.create("device").type == "device"
    with pytest.raises(TypeError):
        kv.create(3)
    # Difference 6: MXNet made 'horovod' (any unknown name) a local store.
    for name in ("horovod", "byteps", "foo", ""):
        with pytest.raises(kv.UnknownStoreKindError):
            kv.create(name)
    with pytest.raises(NotImplementedError):
        kv.create("dist_async")
    store.barrier()


def test_int_keys_wider_than_64_bits_come_back_as_ints():
    store = kv.create("local")
    big = 2**70
    store.init([big, -5], [np.zeros(2)] * 2)
    assert store.keys() == [big, -5]
    seen = []
    store.set_updater(lambda key, recv, stored: seen.append(key))
    store.push(big, np.ones(2))
    assert seen == [big] and isinstance(seen[0], int)
