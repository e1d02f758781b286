"""Arrays from other libraries, read and written in place: PyTorch CPU tensors, MXNet
1.9.1 NDArrays, objects with only ``__dlpack__``/``__dlpack_device__``, and objects with
``__array_interface__``; and the errors for arrays the store cannot use in place.

PyTorch and MXNet are not in the main test venv: scripts/test-python.sh runs this file
again in target/py-torch-venv (Debian's python3-torch, with KVSTORE_REQUIRE_TORCH=1)
and in target/py-mxnet-venv (mxnet 1.9.1 and numpy<1.24, with KVSTORE_REQUIRE_MXNET=1),
where a missing import is a failure, not a skip. The DLPack and __array_interface__
tests run in every venv, so under numpy 2 and numpy 1.23/1.24 alike.
"""

import ctypes
import os
import threading

import numpy as np
import pytest

import kvstore as kv


def _import_or_skip(name, env, venv):
    try:
        return __import__(name)
    except ImportError as e:
        if os.environ.get(env) == "1":
            pytest.fail(f"{env}=1 but `import {name}` fails: {e}", pytrace=False)
        pytest.skip(f"{name} is not installed here: scripts/test-python.sh runs these tests in {venv}")


@pytest.fixture
def torch():
    return _import_or_skip("torch", "KVSTORE_REQUIRE_TORCH", "target/py-torch-venv")


@pytest.fixture
def mx():
    return _import_or_skip("mxnet", "KVSTORE_REQUIRE_MXNET", "target/py-mxnet-venv")


@pytest.fixture
def store():
    return kv.create("local")


class Gate:
    """An updater that holds a key's first push until `open()` (so calls queued behind
    it run later, at a known point), then assigns the pushed sum."""

    def __init__(self):
        self.event = threading.Event()

    def __call__(self, key, recv, stored):
        assert self.event.wait(30), "the gate was never opened"
        stored[...] = recv

    def open(self):
        self.event.set()


# ---------------------------------------------------------------- PyTorch


def test_torch_pull_writes_the_tensors_own_memory(torch, store):
    store.init("w", torch.arange(6, dtype=torch.float32).reshape(2, 3))
    out = torch.zeros(2, 3)
    ptr = out.data_ptr()
    store.pull("w", out=out)
    assert out.data_ptr() == ptr
    assert out.tolist() == [[0, 1, 2], [3, 4, 5]]
    # A contiguous view: the pull lands in its base tensor, around it unchanged.
    base = torch.full((10,), -1.0)
    store.init("v", torch.ones(4))
    store.pull("v", out=base[3:7])
    assert base.tolist() == [-1, -1, -1, 1, 1, 1, 1, -1, -1, -1]


def test_torch_push_sums_tensors_and_every_form_works(torch, store):
    store.init(["a", "b"], [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64)])
    store.push("a", [torch.ones(2, 3), torch.full((2, 3), 2.0), torch.full((2, 3), 3.0)])
    store.push(["a", "b", "b"], [torch.full((2, 3), 7.0), torch.arange(4), torch.arange(4) * 10])
    outs = [torch.zeros(2, 3), torch.zeros(2, 3)]
    bo = torch.zeros(4, dtype=torch.int64)
    store.pull(["a", "b"], out=[outs, bo])
    assert all((o == 7).all() for o in outs)
    assert bo.tolist() == [0, 11, 22, 33]
    # Tensors and numpy arrays together in one push.
    store.push("a", [torch.ones(2, 3), np.full((2, 3), 4, np.float32)])
    assert (store.pull("a") == 5).all()


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"])
def test_torch_every_dtype_round_trips(torch, store, name):
    dtype = getattr(torch, name)
    store.init("k", torch.zeros(5, dtype=dtype))
    store.push("k", [torch.full((5,), 2, dtype=dtype), torch.full((5,), 3, dtype=dtype)])
    out = torch.zeros(5, dtype=dtype)
    store.pull("k", out=out)
    assert out.dtype == dtype and out.tolist() == [5] * 5


def test_torch_pushed_tensors_are_read_in_place_with_copy_false(torch, store):
    store.init("w", torch.zeros(4))
    gate = Gate()
    store.set_updater(gate)
    first = store.push_async("w", torch.ones(4))  # held in the updater
    in_place = torch.full((4,), 2.0)
    copied = torch.full((4,), 3.0)
    f_in_place = store.push_async("w", in_place, copy=False)
    in_place += 40  # before the queued push runs: it reads the tensor then
    gate.open()
    first.result(30)
    f_in_place.result(30)
    assert store.pull("w").tolist() == [42.0] * 4
    # With copy=True (the default) the value is the one at the call.
    gate2 = Gate()
    store.set_updater(gate2)
    held = store.push_async("w", torch.zeros(4))
    f_copied = store.push_async("w", copied)
    copied += 40
    gate2.open()
    held.result(30)
    f_copied.result(30)
    assert store.pull("w").tolist() == [3.0] * 4


def test_torch_pushpull_with_no_out_writes_the_tensors(torch, store):
    store.init("w", torch.zeros(3))
    vals = [torch.ones(3), torch.full((3,), 2.0)]
    ptrs = [v.data_ptr() for v in vals]
    store.pushpull("w", vals)
    assert [v.tolist() for v in vals] == [[3.0] * 3] * 2
    assert [v.data_ptr() for v in vals] == ptrs


def test_torch_async_pull_into_a_tensor(torch, store):
    store.init(["a", "b"], [torch.full((2, 2), 6.0), torch.full((3,), 9, dtype=torch.int32)])
    a, b = torch.zeros(2, 2), torch.zeros(3, dtype=torch.int32)
    store.pull_async(["a", "b"], out=[a, b]).result(30)
    assert a.tolist() == [[6.0, 6.0]] * 2 and b.tolist() == [9, 9, 9]


def test_torch_requires_grad_tensors_work(torch, store):
    w = torch.full((2, 3), 1.5, requires_grad=True)
    store.init("w", w)
    store.push("w", [w * 2, torch.ones(2, 3, requires_grad=True)])  # a non-leaf, a leaf
    out = torch.zeros(2, 3, requires_grad=True)
    ptr = out.data_ptr()
    store.pull("w", out=out)
    assert out.requires_grad and out.data_ptr() == ptr
    assert out.detach().tolist() == [[4.0] * 3] * 2


def test_torch_a_non_contiguous_tensor_is_a_value_error(torch, store):
    store.init("w", torch.zeros(4, 3))
    t = torch.zeros(3, 4).t()
    assert t.shape == (4, 3) and not t.is_contiguous()
    with pytest.raises(ValueError, match="C-contiguous"):
        store.pull("w", out=t)
    with pytest.raises(ValueError, match="C-contiguous"):
        store.push("w", t)
    assert (t == 0).all()
    store.push("w", t.contiguous() + 1)  # the remedy
    assert (store.pull("w") == 1).all()


def test_torch_a_tensor_of_an_unsupported_dtype_is_a_type_error(torch, store):
    store.init("w", torch.zeros(2, 3))
    with pytest.raises(TypeError, match="dtype bool is not supported"):
        store.push("w", torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="dtype complex64 is not supported"):
        store.pull("w", out=torch.zeros(2, 3, dtype=torch.complex64))
    assert (store.pull("w") == 0).all()


def test_torch_a_tensor_not_on_the_cpu_is_a_type_error(torch, store):
    # A CUDA tensor is the store's gpu(i) array (test_gpu.py); a tensor on a device
    # with no route to the store (meta here; mps, xla) is a TypeError naming it.
    store.init("w", torch.zeros(2, 3))
    with pytest.raises(TypeError, match="tensor on meta is not supported yet: move it to the CPU"):
        store.push("w", torch.empty(2, 3, device="meta"))
    with pytest.raises(TypeError, match="tensor on meta is not supported yet"):
        store.pull("w", out=torch.empty(2, 3, device="meta"))
    assert (store.pull("w") == 0).all()


# ---------------------------------------------------------------- MXNet 1.9.1


def mx_data_ptr(mx, nd):
    # After MXNet's own pending write: MXNet allocates an array's memory lazily, and
    # asking for its pointer while the op that makes it is queued races with it.
    nd.wait_to_read()
    ptr = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(nd.handle, ctypes.byref(ptr)))
    return ptr.value


def test_mxnet_is_1_9_1(mx):
    assert mx.__version__ == "1.9.1"


def test_mxnet_pull_writes_the_ndarrays_own_memory(mx, store):
    store.init(3, mx.nd.ones((2, 3)) * 2)
    out = mx.nd.zeros((2, 3))
    ptr = mx_data_ptr(mx, out)
    store.pull(3, out=out)
    assert mx_data_ptr(mx, out) == ptr
    assert out.asnumpy().tolist() == [[2.0] * 3] * 2
    # A slice of an NDArray is a view: the pull lands in its base.
    base = mx.nd.full((10,), -1)
    view = base[2:8]
    assert mx_data_ptr(mx, view) == mx_data_ptr(mx, base) + 2 * 4
    store.init("v", mx.nd.ones((6,)) * 5)
    store.pull("v", out=view)
    assert base.asnumpy().tolist() == [-1, -1] + [5] * 6 + [-1, -1]


def test_mxnet_the_tutorial_with_ndarrays(mx, store):
    shape = (2, 3)
    store.init(3, mx.nd.ones(shape) * 2)
    a = mx.nd.zeros(shape)
    store.pull(3, out=a)
    assert (a.asnumpy() == 2).all()
    store.push(3, mx.nd.ones(shape) * 8)
    store.pull(3, out=a)
    assert (a.asnumpy() == 8).all()
    store.push(3, [mx.nd.ones(shape)] * 4)
    b = [mx.nd.zeros(shape) for _ in range(4)]
    store.pull(3, out=b)
    assert all((x.asnumpy() == 4).all() for x in b)
    calls = []

    def update(key, input, stored):
        calls.append(key)
        stored += input * 2

    store.set_updater(update)
    store.push(3, mx.nd.ones(shape))
    store.pull(3, out=a)
    assert (a.asnumpy() == 6).all() and calls == [3]
    store.init([5, 7, 9], [mx.nd.ones(shape)] * 3)
    store.push([5, 7, 9], [[mx.nd.ones(shape)] * 4] * 3)
    c = [mx.nd.zeros(shape) for _ in range(3)]
    store.pull([5, 7, 9], out=c)
    assert all((x.asnumpy() == 9).all() for x in c) and calls == [3, 5, 7, 9]


def test_mxnet_dtypes_and_numpy_style_arrays(mx, store):
    store.init("h", mx.nd.zeros((4,), dtype="float16"))
    store.push("h", [mx.nd.ones((4,), dtype="float16") * 1.5] * 2)
    h = mx.nd.zeros((4,), dtype="float16")
    store.pull("h", out=h)
    assert h.dtype == np.float16 and h.asnumpy().tolist() == [3.0] * 4
    store.init("i", mx.nd.zeros((3,), dtype="int32"))
    store.push("i", [mx.nd.array([1, 2, 3], dtype="int32"), mx.nd.array([10, 20, 30], dtype="int32")])
    i = mx.nd.zeros((3,), dtype="int32")
    store.pull("i", out=i)
    assert i.asnumpy().tolist() == [11, 22, 33]
    # mx.np arrays (MXNet's numpy interface) go in and out too.
    store.init("n", mx.np.ones((2, 2)))
    store.push("n", [mx.np.ones((2, 2)), mx.np.ones((2, 2)) * 2])
    n = mx.np.zeros((2, 2))
    ptr = mx_data_ptr(mx, n)
    store.pull("n", out=n)
    assert mx_data_ptr(mx, n) == ptr and n.asnumpy().tolist() == [[3.0, 3.0]] * 2


def test_mxnet_pending_writes_are_waited_for(mx, store):
    # MXNet computes lazily: the value of `x * 3 + 1` is written by MXNet's engine;
    # the store waits for it before reading.
    x = mx.nd.ones((1000,))
    for _ in range(20):
        x = x * 3 + 1
        x = (x - 1) / 3
    y = x * 7
    store.init("y", mx.nd.zeros((1000,)))
    store.push("y", y)
    assert (store.pull("y") == 7).all()


def test_mxnet_pushed_ndarrays_are_read_in_place_with_copy_false(mx, store):
    store.init("w", mx.nd.zeros((4,)))
    gate = Gate()
    store.set_updater(gate)
    held = store.push_async("w", mx.nd.ones((4,)))
    v = mx.nd.ones((4,)) * 2
    fut = store.push_async("w", v, copy=False)
    v += 40
    v.wait_to_read()
    gate.open()
    held.result(30)
    fut.result(30)
    assert store.pull("w").tolist() == [42.0] * 4


def test_mxnet_wrong_shape_is_the_stores_error(mx, store):
    store.init("w", mx.nd.zeros((2, 3)))
    with pytest.raises(kv.ShapeMismatchError):
        store.pull("w", out=mx.nd.zeros((3, 2)))
    with pytest.raises(kv.DTypeMismatchError):
        store.push("w", mx.nd.zeros((2, 3), dtype="float64"))


# ---------------------------------------------------------------- DLPack only


class DLPackOnly:
    """An array that offers nothing but the DLPack protocol (a numpy array inside)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class ArrayInterfaceOnly:
    """An array that offers nothing but ``__array_interface__``."""

    def __init__(self, array, read_only=False):
        self._array = array
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], read_only)
        self.__array_interface__ = interface


def test_dlpack_only_objects_are_read_and_written_in_place(store):
    backing = np.zeros((2, 3), dtype=np.float32)
    out = DLPackOnly(backing)
    store.init("w", DLPackOnly(np.arange(6, dtype=np.float32).reshape(2, 3)))
    store.pull("w", out=out)
    assert backing.tolist() == [[0, 1, 2], [3, 4, 5]]
    store.push("w", [DLPackOnly(np.ones((2, 3), np.float32)), DLPackOnly(np.full((2, 3), 2, np.float32))])
    other = np.zeros((2, 3), np.float32)
    store.pull("w", out=[out, DLPackOnly(other)])
    assert (backing == 3).all() and (other == 3).all()
    vals = [DLPackOnly(np.ones((2, 3), np.float32)) for _ in range(2)]
    store.pushpull("w", vals)
    assert all((v._array == 2).all() for v in vals)
    store.pull_async("w", out=out).result(30)
    assert (backing == 2).all()


def test_dlpack_only_values_are_read_in_place_with_copy_false(store):
    store.init("w", np.zeros(4, np.float32))
    gate = Gate()
    store.set_updater(gate)
    held = store.push_async("w", np.ones(4, np.float32))
    backing = np.full(4, 2, np.float32)
    fut = store.push_async("w", DLPackOnly(backing), copy=False)
    backing += 40
    gate.open()
    held.result(30)
    fut.result(30)
    assert store.pull("w").tolist() == [42.0] * 4


@pytest.mark.parametrize("device", [(4, 0), (7, 1), (10, 0), (14, 2)])
def test_a_dlpack_device_that_is_not_the_host_is_a_type_error(store, device):
    # OpenCL, Vulkan, ROCm, oneAPI: no route to the store (CUDA, (2, i), is the
    # store's gpu(i): test_gpu.py).
    class OnDevice:
        def __dlpack__(self, *args, **kwargs):
            raise AssertionError("a device array must not be imported")

        def __dlpack_device__(self):
            return device

    store.init("w", np.ones(3, np.float32))
    pattern = rf"OnDevice on DLPack device \({device[0]}, {device[1]}\) is not on the host"
    with pytest.raises(TypeError, match=pattern):
        store.push("w", OnDevice())
    with pytest.raises(TypeError, match=pattern):
        store.pull("w", out=OnDevice())
    with pytest.raises(TypeError, match="expected an array"):
        store.push("w", object())
    assert store.pull("w").tolist() == [1.0] * 3


# ---------------------------------------------------------------- __array_interface__


def test_array_interface_objects_are_read_and_written_in_place(store):
    backing = np.zeros(5, dtype=np.int64)
    store.init("w", ArrayInterfaceOnly(np.arange(5, dtype=np.int64)))
    store.pull("w", out=ArrayInterfaceOnly(backing))
    assert backing.tolist() == [0, 1, 2, 3, 4]
    store.push("w", [ArrayInterfaceOnly(np.full(5, 3, np.int64)), ArrayInterfaceOnly(np.full(5, 4, np.int64))])
    store.pull("w", out=ArrayInterfaceOnly(backing))
    assert backing.tolist() == [7] * 5
    # A read-only interface is a fine value and a ValueError as an out.
    store.push("w", ArrayInterfaceOnly(np.full(5, 9, np.int64), read_only=True))
    frozen = np.zeros(5, np.int64)
    with pytest.raises(ValueError, match="read-only"):
        store.pull("w", out=ArrayInterfaceOnly(frozen, read_only=True))
    assert (frozen == 0).all() and (store.pull("w") == 9).all()


def test_a_strided_array_interface_out_is_a_value_error(store):
    store.init("w", np.zeros(3, np.float32))
    strided = np.zeros(6, np.float32)[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        store.pull("w", out=ArrayInterfaceOnly(strided))


def test_torch_bfloat16_tensors_are_read_and_written_in_place(torch, store):
    pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    store.init("bf", torch.ones(4, dtype=torch.bfloat16))
    store.push("bf", [torch.full((4,), 1.5, dtype=torch.bfloat16)] * 2)
    out = torch.zeros(4, dtype=torch.bfloat16)
    ptr = out.data_ptr()
    store.pull("bf", out=out)
    assert out.data_ptr() == ptr
    assert out.float().tolist() == [3.0] * 4
