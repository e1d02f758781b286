"""The Python API: MXNet's call forms, arrays in place, errors, updaters and
optimizers, state files and checkpoints."""

import gc
import sys

import numpy as np
import pytest

import kvstore as kv
from kvstore import optimizer

SHAPE = (2, 3)


def f32(x, shape=SHAPE):
    return np.full(shape, x, dtype=np.float32)


@pytest.fixture
def store():
    return kv.create("local")


def test_version_is_the_workspace_version():
    import pathlib
    import re

    cargo = pathlib.Path(__file__).resolve().parents[2] / "Cargo.toml"
    if cargo.exists():
        text = cargo.read_text()
        ws = text[text.index("[workspace.package]") :]
        assert kv.__version__ == re.search(r'version = "([^"]+)"', ws).group(1)
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", kv.__version__)


def test_the_tutorial_in_numpy(store):
    store.init(3, f32(2))
    a = np.zeros(SHAPE, dtype=np.float32)
    store.pull(3, out=a)
    assert (a == 2).all()
    store.push(3, f32(8))
    store.pull(3, out=a)
    assert (a == 8).all()
    store.push(3, [f32(1)] * 4)
    store.pull(3, out=a)
    assert (a == 4).all()
    outs = [np.zeros(SHAPE, dtype=np.float32) for _ in range(4)]
    store.pull(3, out=outs)
    assert all((o == 4).all() for o in outs)
    keys = [5, 7, 9]
    store.init(keys, [f32(1)] * 3)
    store.push(keys, [f32(2)] * 3)
    b = [np.zeros(SHAPE, dtype=np.float32) for _ in keys]
    store.pull(keys, out=b)
    assert all((x == 2).all() for x in b)
    store.push(keys, [[f32(1)] * 4] * 3)
    c = [[np.zeros(SHAPE, dtype=np.float32) for _ in range(4)] for _ in keys]
    store.pull(keys, out=c)
    assert all((x == 4).all() for row in c for x in row)


def test_int_and_str_keys_are_one_key(store):
    store.init(3, f32(1))
    out = np.zeros(SHAPE, dtype=np.float32)
    store.pull("3", out=out)
    assert (out == 1).all()
    with pytest.raises(kv.AlreadyInitializedError):
        store.init("3", f32(1))
    assert store.keys() == [3]
    store.init("w", f32(1))
    assert store.keys() == [3, "w"]


def test_repeated_keys_in_a_list_are_summed(store):
    store.init(["a", "b"], [f32(0), f32(0)])
    store.push(["a", "b", "a"], [f32(1), f32(2), f32(3)])
    assert (store.pull("a") == 4).all()
    assert (store.pull("b") == 2).all()


def test_pull_with_no_out_returns_new_arrays(store):
    store.init(["a", "b"], [f32(1), np.arange(4, dtype=np.int64)])
    a = store.pull("a")
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == SHAPE and (a == 1).all()
    a += 1  # its own memory: the store is not changed
    assert (store.pull("a") == 1).all()
    both = store.pull(["a", "b"])
    assert isinstance(both, list) and both[1].tolist() == [0, 1, 2, 3]


def test_pushpull_with_and_without_out(store):
    store.init("w", f32(0))
    out = np.zeros(SHAPE, dtype=np.float32)
    store.pushpull("w", [f32(1), f32(2)], out=out)
    assert (out == 3).all()
    vals = [f32(5), f32(6)]
    store.pushpull("w", vals)
    assert all((v == 11).all() for v in vals)


def test_broadcast_initializes_and_pulls(store):
    x, y = np.zeros(SHAPE, np.float32), np.zeros(SHAPE, np.float32)
    store.broadcast("c", f32(5), out=[x, y])
    assert (x == 5).all() and (y == 5).all()
    with pytest.raises(kv.AlreadyInitializedError):
        store.broadcast("c", f32(5), out=x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8])
def test_every_dtype_sums_in_place(store, dtype):
    store.init("k", np.zeros(4, dtype=dtype))
    store.push("k", [np.full(4, 1, dtype=dtype), np.full(4, 2, dtype=dtype)])
    out = np.zeros(4, dtype=dtype)
    store.pull("k", out=out)
    assert out.tolist() == [3, 3, 3, 3]


def test_bfloat16_through_ml_dtypes(store):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (pip install ml_dtypes)")
    bf16 = ml_dtypes.bfloat16
    store.init("b", np.zeros(3, dtype=bf16))
    store.push("b", [np.full(3, 1.5, dtype=bf16)] * 2)
    got = store.pull("b")
    assert got.dtype == bf16 and got.astype(np.float32).tolist() == [3.0, 3.0, 3.0]


def test_values_are_read_in_place_and_outs_written_in_place(store):
    big = np.arange(1 << 16, dtype=np.float32)
    store.init("w", big)
    out = np.zeros_like(big)
    ptr = out.ctypes.data
    store.pull("w", out=out)
    assert out.ctypes.data == ptr and (out == big).all()
    view = out[: 1 << 15]  # a contiguous view: written through to `out`
    store.init("h", np.ones(1 << 15, dtype=np.float32))
    store.pull("h", out=view)
    assert (out[: 1 << 15] == 1).all() and (out[1 << 15 :] == big[1 << 15 :]).all()


def test_pushed_arrays_are_not_kept(store):
    store.init("w", f32(0))
    v = f32(1)
    before = sys.getrefcount(v)
    for _ in range(100):
        store.push("w", v)
        store.pull("w", out=v)
    gc.collect()
    assert sys.getrefcount(v) == before


def test_errors_are_typed_and_subclass_builtins(store):
    store.init("w", f32(0))
    with pytest.raises(KeyError) as e:
        store.pull("nope", out=f32(0))
    assert isinstance(e.value, kv.KeyNotInitializedError) and e.value.code == "KEY_NOT_INITIALIZED"
    assert e.value.key == "nope"
    with pytest.raises(ValueError) as e:
        store.push("w", f32(0, (3, 3)))
    assert isinstance(e.value, kv.ShapeMismatchError)
    assert (e.value.expected, e.value.got, e.value.key) == ((2, 3), (3, 3), "w")
    with pytest.raises(kv.DTypeMismatchError) as e:
        store.push("w", np.zeros(SHAPE, dtype=np.float64))
    assert (e.value.expected, e.value.got) == ("float32", "float64")
    with pytest.raises(kv.LengthMismatchError) as e:
        store.push(["w", "w"], [f32(1)] * 3)
    assert (e.value.expected, e.value.got) == (2, 3)
    with pytest.raises(kv.UnknownStoreKindError):
        kv.create("nonsense")
    with pytest.raises(NotImplementedError):
        kv.create("dist_async")
    assert (store.pull("w") == 0).all(), "no failed call changed the key"


@pytest.mark.skipif(kv._kvstore._has_mpi(), reason="an MPI was loaded: dist kinds are served")
def test_dist_kinds_without_mpi_name_the_extra():
    # Python's route to MPI, not a Rust program's (Cargo) or the JVM's (the jar).
    for kind in ("dist_sync", "dist_async", "dist_device_sync"):
        with pytest.raises(kv.UnsupportedError) as e:
            kv.create(kind)
        message = str(e.value)
        assert 'pip install "kvstore[mpi]"' in message and "KVSTORE_MPI=system" in message, message
        assert "Cargo.toml" not in message and "make jar" not in message, message


def test_bad_arrays_are_clear_errors(store):
    store.init("w", np.zeros((4, 4), dtype=np.float32))
    strided = np.zeros((4, 8), dtype=np.float32)[:, ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        store.push("w", strided)
    with pytest.raises(ValueError, match="C-contiguous"):
        store.pull("w", out=strided)
    ro = np.zeros((4, 4), dtype=np.float32)
    ro.flags.writeable = False
    store.push("w", ro)  # a read-only value is fine
    with pytest.raises(ValueError, match="read-only"):
        store.pull("w", out=ro)
    with pytest.raises(ValueError, match="read-only"):
        store.pushpull("w", ro)
    with pytest.raises(TypeError, match="not supported"):
        store.push("w", np.zeros((4, 4), dtype=np.complex64))
    with pytest.raises(TypeError, match="array"):
        store.push("w", [[1.0] * 4] * 4)
    with pytest.raises(TypeError, match="key"):
        store.push(1.5, np.zeros((4, 4), dtype=np.float32))
    with pytest.raises(TypeError, match="key"):
        store.push(True, np.zeros((4, 4), dtype=np.float32))
    big_endian = np.zeros((4, 4), dtype=">f4")
    with pytest.raises(TypeError):
        store.push("w", big_endian)


def test_the_tutorials_updater_gets_int_keys(store):
    calls = []

    def update(key, recv, stored):
        calls.append(key)
        print("update on key: %d" % key)
        stored += recv * 2

    store._set_updater(update)
    store.init(3, f32(1))
    store.push(3, f32(1))
    assert (store.pull(3) == 3).all()
    store.push(3, [f32(1)] * 4)
    assert (store.pull(3) == 11).all()
    assert calls == [3, 3] and isinstance(calls[0], int)
    store.init("s", f32(0))
    store.set_updater(lambda key, recv, stored: calls.append(key))
    store.push("s", f32(1))
    assert calls[-1] == "s"


def test_an_updaters_exception_is_the_cause_whatever_thread_ran_it():
    # A blocking push queued behind a running non-blocking one runs its updater on an
    # engine thread; a push of many keys may run it on the comm's threads.
    import time

    store = kv.create("local")
    store.init("k", f32(1))
    calls = []
    boom = RuntimeError("second call")

    def updater(key, recv, stored):
        calls.append(key)
        if len(calls) == 1:
            time.sleep(0.2)
            return
        raise boom

    store.set_updater(updater)
    first = store.push_async("k", f32(1))
    with pytest.raises(kv.BackendError) as e:
        store.push("k", f32(1))
    assert e.value.__cause__ is boom
    first.result()
    for kind in ("local", "device"):
        many = kv.create(kind)
        keys = ["k%d" % i for i in range(256)]
        many.init(keys, [f32(0, (16,))] * 256)

        def refuse(key, recv, stored):
            if key == "k200":
                raise ValueError("refused " + key)
            stored += recv

        many.set_updater(refuse)
        for _ in range(10):
            with pytest.raises(kv.BackendError) as e:
                many.push(keys, [f32(1, (16,))] * 256)
            assert isinstance(e.value.__cause__, ValueError) and str(e.value.__cause__) == "refused k200", kind
            with pytest.raises(kv.BackendError) as e:
                many.push_async(keys, [f32(1, (16,))] * 256).result()
            assert isinstance(e.value.__cause__, ValueError), kind


def test_an_updater_that_raises_fails_its_push_and_the_key_keeps_its_value(store):
    store.init("w", f32(1))

    def bad(key, recv, stored):
        stored += 100  # written before it raises: put back
        raise ValueError("boom")

    store.set_updater(bad)
    with pytest.raises(kv.BackendError) as e:
        store.push("w", f32(1))
    assert isinstance(e.value.__cause__, ValueError) and str(e.value.__cause__) == "boom"
    assert (store.pull("w") == 1).all()
    with pytest.raises(TypeError):
        store.set_updater(42)
    store.set_updater(None)
    store.push("w", f32(7))
    assert (store.pull("w") == 7).all()


def test_optimizers_run_in_the_store(store):
    store.init("w", f32(1))
    store.set_optimizer(optimizer.SGD(learning_rate=0.1))
    store.push("w", f32(1))
    np.testing.assert_allclose(store.pull("w"), 0.9, rtol=1e-6)
    assert store.optimizer == "sgd"
    store.set_optimizer(optimizer.create("adam", learning_rate=0.01))
    assert store.optimizer == "adam"
    with pytest.raises(kv.InvalidArgumentError):
        optimizer.SGD(learnin_rate=0.1)
    with pytest.raises(kv.InvalidArgumentError):
        optimizer.create("nonsense")
    with pytest.raises(kv.InvalidArgumentError):
        optimizer.SGD(learning_rate=float("nan"))
    with pytest.raises(TypeError):
        store.set_optimizer("sgd")
    with pytest.raises(kv.UnsupportedError):
        optimizer.register(type("Mine", (), {}))


def test_every_optimizer_has_its_mxnet_class():
    for cls, name in [
        (optimizer.SGD, "sgd"),
        (optimizer.NAG, "nag"),
        (optimizer.Adam, "adam"),
        (optimizer.AdaGrad, "adagrad"),
        (optimizer.RMSProp, "rmsprop"),
        (optimizer.AdaDelta, "adadelta"),
        (optimizer.Ftrl, "ftrl"),
        (optimizer.Signum, "signum"),
        (optimizer.SGLD, "sgld"),
        (optimizer.DCASGD, "dcasgd"),
        (optimizer.Adamax, "adamax"),
        (optimizer.Nadam, "nadam"),
        (optimizer.LAMB, "lamb"),
        (optimizer.LARS, "lars"),
        (optimizer.FTML, "ftml"),
        (optimizer.LBSGD, "lbsgd"),
    ]:
        s = kv.create("local")
        s.init("w", f32(1))
        s.set_optimizer(cls(learning_rate=0.01))
        s.push("w", f32(0.5))
        assert s.optimizer == name
        assert not (s.pull("w") == 1).all(), name
    assert isinstance(optimizer.create("ccsgd"), optimizer.SGD)


def test_optimizer_states_and_checkpoints_round_trip(store, tmp_path):
    store.init(["a", "b"], [f32(1), f32(2)])
    store.set_optimizer(optimizer.Adam(learning_rate=0.01))
    for _ in range(3):
        store.push(["a", "b"], [f32(0.1), f32(-0.2)])
    states = tmp_path / "opt.states"
    store.save_optimizer_states(str(states), dump_optimizer=True)
    ckpt = tmp_path / "model.ckpt"
    store.save_checkpoint(ckpt)
    store.push(["a", "b"], [f32(0.1), f32(-0.2)])
    want = [store.pull("a"), store.pull("b")]

    other = kv.create("local")
    other.init(["a", "b"], [f32(0), f32(0)])
    other.set_optimizer(optimizer.Adam(learning_rate=0.01))
    other.load_checkpoint(ckpt)
    other.push(["a", "b"], [f32(0.1), f32(-0.2)])
    assert (other.pull("a") == want[0]).all() and (other.pull("b") == want[1]).all()
    with pytest.raises(OSError):
        other.load_optimizer_states(str(tmp_path / "missing"))
    other.load_optimizer_states(states)


def test_properties_and_capabilities(store):
    assert store.type == "local" and store.rank == 0 and store.num_workers == 1
    store.barrier()
    store._barrier()
    assert store.is_capable("optimizer") is True
    assert kv.create("device").type == "device"
    assert "local" in repr(store)


def test_help_explains_the_forms():
    assert "summed" in kv.KVStore.push.__doc__
    assert "new numpy arrays" in kv.KVStore.pull.__doc__
    assert kv.KVStore.push_async.__doc__ and kv.Future.result.__doc__


def test_lbsgd_takes_its_warmup_strategy_by_name():
    # LBSGD's warmup_strategy is a name, as in MXNet; other hyper-parameters stay numbers.
    s = kv.create("local")
    s.init("w", f32(1))
    s.set_optimizer(optimizer.LBSGD(learning_rate=0.1, warmup_strategy="sqrt", batch_scale=2, warmup_epochs=1))
    s.push("w", f32(0.5))
    assert (s.pull("w") == 1).all()  # the first push of a batch of two leaves the weight
    s.push("w", f32(0.5))
    assert (s.pull("w") < 1).all()
    with pytest.raises(TypeError, match="momentum must be a number"):
        optimizer.SGD(momentum="high")
    with pytest.raises(ValueError, match="batch_scale"):
        optimizer.LBSGD(batch_scale=0)


def test_mxnets_reduction_threads_variable_sizes_the_shared_pool():
    # MXNET_KVSTORE_REDUCTION_NTHREADS, read when the first store starts the shared
    # pool: its threads are named kvstore-cpu-N (counted from /proc, in a new process).
    import os
    import subprocess

    # A thread names itself once it runs: wait (up to 10 s) until the count stops
    # growing for a while, then print it.
    prog = (
        "import glob, time, kvstore\n"
        "s = kvstore.create('local')\n"
        "def count():\n"
        "    names = [open(p).read().strip() for p in glob.glob('/proc/self/task/*/comm')]\n"
        "    return sum(n.startswith('kvstore-cpu') for n in names)\n"
        "last, since, start = -1, time.monotonic(), time.monotonic()\n"
        "while time.monotonic() - start < 10:\n"
        "    n = count()\n"
        "    if n != last:\n"
        "        last, since = n, time.monotonic()\n"
        "    elif time.monotonic() - since > 0.5:\n"
        "        break\n"
        "    time.sleep(0.02)\n"
        "print(last)\n"
    )
    env = dict(os.environ, MXNET_KVSTORE_REDUCTION_NTHREADS="3")
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"
    env["MXNET_KVSTORE_REDUCTION_NTHREADS"] = "many"
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "MXNET_KVSTORE_REDUCTION_NTHREADS must be a number of threads" in out.stderr
