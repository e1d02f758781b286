"""Row-sparse arrays and keys from Python: kvstore.sparse, init/push of row-sparse
values, row_sparse_pull in its forms, the errors, lazy optimizer updates, and MXNet
1.9.1's recorded results (tests/golden/mxnet_row_sparse.json) replayed bit for bit."""

import json
import pathlib

import numpy as np
import pytest

import kvstore as kv
from kvstore import optimizer, sparse

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden" / "mxnet_row_sparse.json"


def rsp(rows, data, shape, dtype=np.float32):
    return sparse.row_sparse_array((np.asarray(data, dtype).reshape((len(rows),) + tuple(shape[1:])), rows), shape=shape)


# -- the arrays -------------------------------------------------------------------


def test_row_sparse_array_forms_and_conversions():
    a = sparse.row_sparse_array((np.array([[1, 2], [3, 4]], np.float32), [0, 2]), shape=(4, 2))
    assert a.stype == "row_sparse" and a.shape == (4, 2) and a.dtype == np.float32
    assert a.indices.dtype == np.int64 and a.indices.tolist() == [0, 2]
    np.testing.assert_array_equal(a.tostype("default"), [[1, 2], [0, 0], [3, 4], [0, 0]])
    np.testing.assert_array_equal(a.asnumpy(), a.tostype("default"))
    # Shape inferred from the indices; lists of data are float32, as in MXNet.
    b = sparse.row_sparse_array(([[1.0, 1.0]], [5]))
    assert b.shape == (6, 2) and b.dtype == np.float32
    # From dense: the rows with a non-zero element.
    dense = np.array([[0, 0], [0, 5], [0, 0], [1, 0]], np.float64)
    c = sparse.row_sparse_array(dense)
    assert c.indices.tolist() == [1, 3] and c.dtype == np.float64
    np.testing.assert_array_equal(c.tostype("default"), dense)
    assert sparse.cast_storage(dense, "row_sparse").indices.tolist() == [1, 3]
    # An empty one from a shape, and zeros.
    e = sparse.row_sparse_array((3, 2))
    assert e.indices.size == 0 and e.data.shape == (0, 2)
    z = sparse.zeros("row_sparse", (5, 3), dtype=np.float64)
    assert z.shape == (5, 3) and z.dtype == np.float64 and z.data.shape == (0, 3)
    np.testing.assert_array_equal(sparse.zeros("default", (2,)), [0, 0])
    # A copy is its own.
    d = a.copy()
    d.data[0, 0] = 99
    assert a.data[0, 0] == 1
    assert a.tostype("row_sparse").indices.tolist() == [0, 2]


@pytest.mark.parametrize(
    "make, error, text",
    [
        (lambda: sparse.row_sparse_array((np.ones((2, 2), np.float32), [1, 0]), shape=(3, 2)), kv.InvalidArgumentError, "strictly increasing"),
        (lambda: sparse.row_sparse_array((np.ones((2, 2), np.float32), [1, 1]), shape=(3, 2)), kv.InvalidArgumentError, "strictly increasing"),
        (lambda: sparse.row_sparse_array((np.ones((1, 2), np.float32), [3]), shape=(3, 2)), kv.InvalidArgumentError, "out of range"),
        (lambda: sparse.row_sparse_array((np.ones((1, 2), np.float32), [-1]), shape=(3, 2)), kv.InvalidArgumentError, "out of range"),
        (lambda: sparse.row_sparse_array((np.ones((2, 2), np.float32), [0]), shape=(3, 2)), kv.InvalidArgumentError, "must have shape"),
        (lambda: sparse.row_sparse_array((np.ones((1, 3), np.float32), [0]), shape=(3, 2)), kv.InvalidArgumentError, "must have shape"),
        (lambda: sparse.row_sparse_array((np.ones((1, 2), np.float32), ["a"]), shape=(3, 2)), TypeError, "integers"),
        (lambda: sparse.zeros("csr", (3, 2)), ValueError, "csr"),
        (lambda: sparse.zeros("row_sparse", ()), ValueError, "dimension"),
        (lambda: sparse.row_sparse_array((np.ones((1, 2), np.bool_), [0]), shape=(3, 2)), TypeError, "dtype"),
    ],
)
def test_bad_row_sparse_arrays_are_clear_errors(make, error, text):
    with pytest.raises(error, match=text):
        make()


# -- the store ----------------------------------------------------------------------


def test_mxnet_s_example_init_pull_push_and_sum():
    # The semantics reference's example 19.
    store = kv.create("local")
    store.init("e", sparse.row_sparse_array(np.ones((3, 2), np.float32)))
    assert store.stype("e") == "row_sparse"
    out = sparse.zeros("row_sparse", (3, 2))
    store.row_sparse_pull("e", out=out, row_ids=np.array([2, 0, 2]))
    assert out.indices.tolist() == [0, 2]
    np.testing.assert_array_equal(out.tostype("default"), [[1, 1], [0, 0], [1, 1]])
    store.push("e", [rsp([0], [1, 1], (3, 2)), rsp([0, 2], [2, 2, 3, 3], (3, 2))])
    store.row_sparse_pull("e", out=out, row_ids=[0, 1, 2])
    assert out.indices.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(out.data, [[3, 3], [0, 0], [3, 3]])
    # A dense pull gives the whole value.
    np.testing.assert_array_equal(store.pull("e"), [[3, 3], [0, 0], [3, 3]])
    dense = np.zeros((3, 2), np.float32)
    store.pull("e", out=dense)
    np.testing.assert_array_equal(dense, [[3, 3], [0, 0], [3, 3]])


def test_row_sparse_pull_forms():
    store = kv.create("local")
    value = np.arange(12, dtype=np.float32).reshape(6, 2)
    store.init([3, "b"], [sparse.row_sparse_array(value), sparse.row_sparse_array(value * 10)])
    assert store.stype(3) == "row_sparse" and store.stype("3") == "row_sparse"
    o1, o2 = sparse.zeros("row_sparse", (6, 2)), sparse.zeros("row_sparse", (6, 2))
    # Many outs, one set of ids (any integer or integral float dtype).
    store.row_sparse_pull(3, out=[o1, o2], row_ids=np.array([5.0, 1.0]))
    assert o1.indices.tolist() == o2.indices.tolist() == [1, 5]
    np.testing.assert_array_equal(o2.data, value[[1, 5]])
    # Many outs, ids of their own.
    store.row_sparse_pull(3, out=[o1, o2], row_ids=[np.array([0], np.int32), [4, 4, 2]])
    assert o1.indices.tolist() == [0] and o2.indices.tolist() == [2, 4]
    np.testing.assert_array_equal(o2.data, value[[2, 4]])
    # A list of keys, each with its outs and ids.
    o3 = sparse.zeros("row_sparse", (6, 2))
    store.row_sparse_pull([3, "b"], out=[o1, [o2, o3]], row_ids=[[1], [[2], [3]]])
    np.testing.assert_array_equal(o1.data, value[[1]])
    np.testing.assert_array_equal(o2.data, value[[2]] * 10)
    np.testing.assert_array_equal(o3.data, value[[3]] * 10)
    # Empty ids: an empty result.
    store.row_sparse_pull("b", out=o3, row_ids=[])
    assert o3.indices.size == 0 and o3.data.shape == (0, 2)
    np.testing.assert_array_equal(o3.tostype("default"), np.zeros((6, 2)))


def test_push_forms_sum_row_wise_and_repeated_keys_sum():
    store = kv.create("local")
    store.init(["x", 5], [sparse.zeros("row_sparse", (4, 1)), sparse.zeros("row_sparse", (2, 2))])
    one = rsp([3], [1], (4, 1))
    store.push(["x", 5, "x"], [one, [rsp([1], [2, 2], (2, 2))], [rsp([0, 3], [4, 5], (4, 1))]])
    np.testing.assert_array_equal(store.pull("x").ravel(), [4, 0, 0, 6])
    np.testing.assert_array_equal(store.pull(5), [[0, 0], [2, 2]])
    # No updater: the sum replaces the whole value (MXNet's assign).
    store.push("x", one)
    np.testing.assert_array_equal(store.pull("x").ravel(), [0, 0, 0, 1])


def test_a_row_sparse_push_onto_a_dense_key_makes_it_row_sparse():
    store = kv.create("local")
    store.init("w", np.ones((3, 2), np.float32))
    assert store.stype("w") == "default"
    store.push("w", rsp([1], [5, 5], (3, 2)))
    assert store.stype("w") == "row_sparse"
    np.testing.assert_array_equal(store.pull("w"), [[0, 0], [5, 5], [0, 0]])


def test_lazy_sgd_changes_only_the_pushed_rows_with_weight_decay():
    # The semantics reference: w = 1, g = 0.5 in row 1, wd 0.1, lr 1: row 1 is 0.4.
    store = kv.create("local")
    store.init("w", np.ones((3, 2), np.float32))
    store.set_optimizer(optimizer.SGD(learning_rate=1.0, wd=0.1))
    store.push("w", rsp([1], [0.5, 0.5], (3, 2)))
    r = np.float32(0.9) - np.float32(0.5)
    np.testing.assert_array_equal(store.pull("w"), [[1, 1], [r, r], [1, 1]])


def test_a_custom_updater_gets_the_sum_dense():
    store = kv.create("local")
    store.init(7, sparse.zeros("row_sparse", (3, 1)))
    seen = []

    def update(key, recv, stored):
        seen.append((key, recv.copy()))
        stored += recv * 2

    store.set_updater(update)
    store.push(7, [rsp([2], [1], (3, 1)), rsp([0, 2], [1, 1], (3, 1))])
    assert seen[0][0] == 7
    np.testing.assert_array_equal(seen[0][1].ravel(), [1, 0, 2])
    np.testing.assert_array_equal(store.pull(7).ravel(), [2, 0, 4])


def test_bad_calls_are_clear_errors_and_change_nothing():
    store = kv.create("local")
    store.init("e", sparse.row_sparse_array(np.ones((3, 2), np.float32)))
    store.init("d", np.ones(3, np.float32))
    store.init("f", sparse.zeros("row_sparse", (3, 2)))
    before = store.pull("e")
    good = rsp([0], [9, 9], (3, 2))
    # A key of another shape among several: no key changes.
    with pytest.raises(kv.ShapeMismatchError):
        store.push(["e", "f"], [good, rsp([0], [1, 1, 1], (3, 3))])
    np.testing.assert_array_equal(store.pull("e"), before)
    np.testing.assert_array_equal(store.pull("f"), np.zeros((3, 2)))
    with pytest.raises(kv.DTypeMismatchError):
        store.push("e", rsp([0], [1, 1], (3, 2), np.float64))
    with pytest.raises(KeyError):
        store.push(["e", "missing"], [good, good])
    np.testing.assert_array_equal(store.pull("e"), before)
    # Mixed row-sparse and dense values.
    with pytest.raises(TypeError, match="mixes row-sparse and dense"):
        store.push("e", [good, np.ones((3, 2), np.float32)])
    with pytest.raises(kv.LengthMismatchError):
        store.push(["e", "f"], [good])
    np.testing.assert_array_equal(store.pull("e"), before)
    # row_sparse_pull of a dense key (MXNet: "PullRowSparse expects row_sparse src").
    out = sparse.zeros("row_sparse", (3,))
    with pytest.raises(kv.InvalidArgumentError, match="dense"):
        store.row_sparse_pull("d", out=out, row_ids=[1])
    # A dense out (MXNet: "Expected row_sparse storage type for row_sparse_pull values").
    with pytest.raises(TypeError, match="row-sparse outs"):
        store.row_sparse_pull("e", out=np.zeros((3, 2), np.float32), row_ids=[1])
    # Ids out of range; an out of another shape; one bad out among several: no out changes.
    o1, o2 = sparse.zeros("row_sparse", (3, 2)), sparse.zeros("row_sparse", (4, 2))
    with pytest.raises(kv.InvalidArgumentError):
        store.row_sparse_pull("e", out=o1, row_ids=[3])
    with pytest.raises(kv.ShapeMismatchError):
        store.row_sparse_pull("e", out=[o1, o2], row_ids=[0])
    assert o1.indices.size == 0
    with pytest.raises(kv.LengthMismatchError):
        store.row_sparse_pull("e", out=[o1, o1], row_ids=[[0], [1], [2]])
    with pytest.raises(ValueError, match="row_ids"):
        store.row_sparse_pull("e", out=o1)
    with pytest.raises(KeyError):
        store.row_sparse_pull("missing", out=o1, row_ids=[0])
    # Row-sparse arrays where a call takes dense ones.
    for call in (
        lambda: store.pull("e", out=o1),
        lambda: store.pushpull("e", good, out=np.zeros((3, 2), np.float32)),
        lambda: store.push_async("e", good),
    ):
        with pytest.raises(TypeError, match="row-sparse"):
            call()
    # Init: a key twice in one call inits none.
    with pytest.raises(kv.AlreadyInitializedError):
        store.init(["g", "e"], [good, good])
    assert "g" not in store.keys()
    np.testing.assert_array_equal(store.pull("e"), before)


# -- MXNet's results ------------------------------------------------------------------


def test_mxnet_s_recorded_row_sparse_results_replay_bit_for_bit():
    if not GOLDEN.exists():
        pytest.skip(f"{GOLDEN} is not here (the package was copied out of the repository)")
    golden = json.loads(GOLDEN.read_text())
    assert golden["mxnet_version"] == "1.9.1"
    assert len(golden["cases"]) >= 12
    for case in golden["cases"]:
        name, shape = case["name"], tuple(case["shape"])
        store = kv.create("local")
        store.init("w", sparse.row_sparse_array(np.array(case["init"], np.float32).reshape(shape)))
        if case["optimizer"] is not None:
            opt_name, params = case["optimizer"]
            store.set_optimizer(optimizer.create(opt_name, **params))
        out = sparse.zeros("row_sparse", shape)
        for s, step in enumerate(case["steps"]):
            values = [rsp(v["rows"], v["data"], shape) for v in step["values"]]
            store.push("w", values)
            dense = store.pull("w")
            want = np.array(step["dense"], np.float32).reshape(shape)
            assert dense.tobytes() == want.tobytes(), f"{name}, step {s}: dense pull"
            store.row_sparse_pull("w", out=out, row_ids=step["row_ids"])
            assert out.indices.tolist() == step["pulled_indices"], f"{name}, step {s}"
            want = np.array(step["pulled_data"], np.float32)
            assert out.data.ravel().tobytes() == want.tobytes(), f"{name}, step {s}: row_sparse_pull"
