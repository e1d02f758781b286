"""Every error the package raises for bad input is a ``kvstore.KVStoreError`` (and the
builtin a Python user would catch: ``TypeError`` for an argument of the wrong type,
``ValueError`` for a wrong value), with a message that names what was wrong."""

import pathlib
import sys

import numpy as np
import pytest

import kvstore as kv
from kvstore import optimizer, sparse

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def store():
    s = kv.create("local")
    s.init(3, np.zeros((2, 2), np.float32))
    s.init("emb", sparse.zeros("row_sparse", (4, 2)))
    return s


def f32(shape=(2, 2)):
    return np.zeros(shape, np.float32)


def read_only(a):
    a.flags.writeable = False
    return a


# (what is done, the builtin it also is, what its message says)
BAD_INPUT = {
    "push_a_str": (lambda s: s.push(3, "abc"), TypeError, r"value: expected an array .*got a str"),
    "pull_into_a_list": (lambda s: s.pull(3, out=[[0.0, 0.0], [0.0, 0.0]]), TypeError, r"out: expected an array"),
    "push_async_a_str": (lambda s: s.push_async(3, "abc"), TypeError, r"value: expected an array"),
    "pull_into_a_row_sparse_out": (
        lambda s: s.pull("emb", out=sparse.zeros("row_sparse", (4, 2))),
        TypeError,
        r"out is a row-sparse array.*row_sparse_pull",
    ),
    "pushpull_of_a_row_sparse_value": (
        lambda s: s.pushpull("emb", sparse.zeros("row_sparse", (4, 2))),
        TypeError,
        r"row-sparse array",
    ),
    "push_mixing_row_sparse_and_dense": (
        lambda s: s.push(["emb", "emb"], [sparse.zeros("row_sparse", (4, 2)), f32((4, 2))]),
        TypeError,
        r"mixes row-sparse and dense",
    ),
    "a_float_key": (lambda s: s.push(1.5, f32()), TypeError, r"a key must be an int or a str, not float"),
    "a_complex_dtype": (lambda s: s.push(3, np.zeros((2, 2), np.complex64)), TypeError, r"dtype complex64"),
    "a_strided_value": (lambda s: s.push(3, np.zeros((2, 4), np.float32)[:, ::2]), ValueError, r"C-contiguous"),
    "a_read_only_out": (lambda s: s.pull(3, out=read_only(f32())), ValueError, r"out is read-only"),
    "compression_not_a_dict": (lambda s: s.set_gradient_compression(3), TypeError, r"takes a dict"),
    "create_with_an_int": (lambda s: kv.create(3), TypeError, r"name must be a str"),
    "set_updater_not_a_function": (lambda s: s.set_updater(3), TypeError, r"set_updater takes a function"),
    "set_optimizer_a_str": (lambda s: s.set_optimizer("sgd"), TypeError, r"kvstore.optimizer optimizer"),
    "an_optimizer_with_no_name": (lambda s: optimizer.Optimizer(), TypeError, r"needs a name"),
    "a_learning_rate_not_a_number": (
        lambda s: optimizer.SGD(learning_rate="fast"),
        TypeError,
        r"learning_rate must be a number",
    ),
    "a_schedule_not_the_packages": (lambda s: optimizer.SGD(lr_scheduler=object()), TypeError, r"lr_scheduler"),
    "sparse_zeros_of_csr": (lambda s: sparse.zeros("csr", (2, 2)), ValueError, r"storage type 'csr'"),
    "cast_storage_to_csr": (lambda s: sparse.cast_storage(f32(), "csr"), ValueError, r"storage type 'csr'"),
    "row_ids_of_strs": (
        lambda s: s.row_sparse_pull("emb", out=sparse.zeros("row_sparse", (4, 2)), row_ids=np.array(["a"])),
        TypeError,
        r"row_ids must be integers",
    ),
    "row_sparse_pull_into_a_dense_out": (
        lambda s: s.row_sparse_pull("emb", out=f32((4, 2)), row_ids=[0]),
        TypeError,
        r"row-sparse outs",
    ),
    "row_sparse_pull_with_no_row_ids": (
        lambda s: s.row_sparse_pull("emb", out=sparse.zeros("row_sparse", (4, 2))),
        ValueError,
        r"needs out= .* and row_ids=",
    ),
    "indices_of_two_dimensions": (
        lambda s: sparse.row_sparse_array((f32((2, 2)), np.array([[0], [1]])), shape=(4, 2)),
        ValueError,
        r"indices must be 1-D",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_raises_a_kvstore_error_that_is_also_the_builtin(store, case):
    call, builtin, message = BAD_INPUT[case]
    with pytest.raises(kv.KVStoreError, match=message) as e:
        call(store)
    assert isinstance(e.value, builtin), type(e.value).__mro__
    assert e.value.code == "INVALID_ARGUMENT"
    # The package's own classes, importable by their names.
    assert type(e.value).__module__ == "kvstore.errors", type(e.value)
    assert (store.pull(3) == 0).all()


def test_a_row_sparse_array_where_dense_ones_go_is_a_row_sparse_value_error(store):
    with pytest.raises(kv.RowSparseValueError) as e:
        store.pull("emb", out=sparse.zeros("row_sparse", (4, 2)))
    assert isinstance(e.value, kv.ArgumentTypeError) and isinstance(e.value, TypeError)
    assert not hasattr(kv._kvstore, "RowSparseValue")


def test_a_bfloat16_array_without_ml_dtypes_names_the_extra_to_install(store, monkeypatch):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    store.init("b", np.ones((2,), ml_dtypes.bfloat16))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # as if not installed
    with pytest.raises(kv.ArgumentTypeError, match=r"kvstore\[bfloat16\]"):
        store.pull("b")  # a new numpy array of the key's dtype


def test_the_bfloat16_extra_is_declared_and_the_guide_names_it():
    pyproject = (ROOT / "kvstore-py" / "pyproject.toml").read_text()
    assert 'bfloat16 = ["ml_dtypes' in pyproject
    guide = (ROOT / "docs" / "python.md").read_text()
    assert "kvstore[bfloat16]" in guide


def test_help_of_create_says_what_the_dist_kinds_do():
    doc = kv.create.__doc__
    assert "dist_async" in doc
    assert "``dist_async`` raises" not in doc
    assert 'pip install "kvstore[mpi]"' in doc and "UnsupportedError" in doc
    if not kv._kvstore._has_mpi():  # what it says without an MPI
        for kind in ("dist_sync", "dist_async"):
            with pytest.raises(kv.UnsupportedError, match=r"kvstore\[mpi\]"):
                kv.create(kind)

