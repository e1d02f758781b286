"""Tensors on a GPU, through DLPack: a CUDA tensor is a gpu(i) array of the store over
the tensor's own memory. Without a GPU, such a tensor is a clear error and changes
nothing; with one (PyTorch with CUDA), pushes read and pulls write the tensors in
place. KVSTORE_REQUIRE_CUDA=1 turns the GPU tests' skip into a failure."""

import os

import numpy as np
import pytest

import kvstore as kv


class FakeCudaTensor:
    """Says it is on CUDA device 0; its memory is never reached without a GPU."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("a CUDA tensor's memory was asked for with no GPU to use it")


def has_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_a_cuda_tensor_without_a_usable_gpu_is_a_clear_error_and_changes_nothing():
    if has_gpu():
        pytest.skip("this machine has a GPU: the tests below use it")
    store = kv.create("local")
    store.init("w", np.ones(3, dtype=np.float32))
    with pytest.raises((kv.DeviceUnavailableError, TypeError)) as e:
        store.push("w", FakeCudaTensor())
    assert "gpu" in str(e.value).lower() or "cuda" in str(e.value).lower(), e.value
    with pytest.raises((kv.DeviceUnavailableError, TypeError)):
        store.pull("w", out=FakeCudaTensor())
    assert store.pull("w").tolist() == [1.0, 1.0, 1.0]


needs_gpu = pytest.mark.skipif(
    not has_gpu() and os.environ.get("KVSTORE_REQUIRE_CUDA") != "1",
    reason="no CUDA GPU with PyTorch here (KVSTORE_REQUIRE_CUDA=1 makes this a failure)",
)


@needs_gpu
def test_cuda_tensors_are_pushed_and_pulled_in_place():
    import torch

    store = kv.create("device")
    dev = torch.device("cuda", 0)
    store.init(3, torch.full((2, 3), 2.0, device=dev))
    grads = [torch.full((2, 3), float(i + 1), device=dev) for i in range(4)]
    store.push(3, grads)
    out = torch.zeros((2, 3), device=dev)
    ptr = out.data_ptr()
    store.pull(3, out=out)
    assert out.data_ptr() == ptr
    assert out.cpu().tolist() == [[10.0] * 3] * 2
    # Host and device values in one call; requires_grad tensors are read as data.
    w = torch.zeros(5, device=dev, requires_grad=True)
    store.init("w", torch.ones(5))
    store.pushpull("w", [torch.ones(5, device=dev), np.ones(5, dtype=np.float32)], out=w)
    assert w.detach().cpu().tolist() == [2.0] * 5
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int8, torch.uint8):
        key = f"d {dtype}"
        store.init(key, torch.ones(7, dtype=dtype, device=dev))
        store.push(key, [torch.ones(7, dtype=dtype, device=dev)] * 3)
        got = torch.zeros(7, dtype=dtype, device=dev)
        store.pull(key, out=got)
        assert got.cpu().tolist() == [3] * 7, dtype


@needs_gpu
def test_non_blocking_calls_on_cuda_tensors():
    import torch

    store = kv.create("device")
    dev = torch.device("cuda", 0)
    store.init("a", torch.zeros(1 << 20, device=dev))
    g = torch.ones(1 << 20, device=dev)
    store.push_async("a", g, copy=False).result()
    out = torch.empty(1 << 20, device=dev)
    store.pull_async("a", out).result()
    torch.cuda.synchronize()
    assert float(out.sum()) == float(1 << 20)


@needs_gpu
def test_cuda_tensors_that_are_not_contiguous_or_of_another_dtype_are_clear_errors():
    import torch

    store = kv.create("device")
    dev = torch.device("cuda", 0)
    store.init("m", torch.ones((3, 4), device=dev))
    with pytest.raises(ValueError, match="C-contiguous"):
        store.pull("m", out=torch.zeros((4, 3), device=dev).t())
    with pytest.raises(TypeError, match="not supported"):
        store.push("m", torch.ones((3, 4), dtype=torch.complex64, device=dev))
    assert store.pull("m").tolist() == [[1.0] * 4] * 3


def _busy(torch, ms):
    """Keeps the current stream busy for about `ms` milliseconds of GPU time."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(ms * 2_000_000))  # cycles at roughly 2 GHz
    else:
        a = torch.ones((2048, 2048), device="cuda")
        for _ in range(ms):
            a = a @ a / 2048


@needs_gpu
def test_a_tensor_written_on_the_callers_stream_is_read_after_that_write():
    # DLPack's stream rule: the producer (PyTorch) orders the store's stream after its
    # own current stream, so a push reads what the caller's stream wrote, with no
    # synchronize in between, even when that stream is not the default one.
    import torch

    store = kv.create("device")
    dev = torch.device("cuda", 0)
    n = 1 << 20
    store.init("s", torch.zeros(n, device=dev))
    side = torch.cuda.Stream()
    for step in range(1, 6):
        with torch.cuda.stream(side):
            g = torch.zeros(n, device=dev)
            _busy(torch, 20)
            g.fill_(float(step))
            store.push("s", g)
        assert store.pull("s").min() == step and store.pull("s").max() == step, step


@needs_gpu
def test_a_tensor_pulled_into_is_ready_for_the_callers_stream():
    import torch

    store = kv.create("device")
    dev = torch.device("cuda", 0)
    n = 1 << 20
    store.init("r", torch.zeros(n, device=dev))
    side = torch.cuda.Stream()
    for step in range(1, 6):
        big = torch.full((n,), float(step), device=dev)
        store.push("r", big)
        with torch.cuda.stream(side):
            out = torch.zeros(n, device=dev)
            store.pull("r", out=out)
            total = out.sum()  # on `side`, right after the pull returned
        side.synchronize()
        assert float(total) == float(step * n), step


@needs_gpu
def test_tensors_lent_to_the_store_are_freed_with_them():
    import gc

    import torch

    dev = torch.device("cuda", 0)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev)
    for _ in range(3):
        store = kv.create("device")
        store.init("f", torch.zeros(1 << 22, device=dev))
        futs = [store.push_async("f", torch.ones(1 << 22, device=dev), copy=False) for _ in range(8)]
        out = torch.empty(1 << 22, device=dev)
        store.pull("f", out=out)
        for f in futs:
            f.result()
        assert float(out[0]) == 1.0
        del store, futs, out
        gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(dev) == before


COMMIT_JOB = """
import os, sys
import numpy as np
import torch
import kvstore as kv

steps, die = int(sys.argv[1]), int(sys.argv[2])
dev = torch.device("cuda", 0)
store = kv.create("device")
store.set_gradient_compression({"type": "2bit", "threshold": 0.5})
s = store.restored()
if s is None:
    store.init("w", torch.linspace(-1.0, 1.0, 1001, device=dev))
    store.set_optimizer(kv.optimizer.Adam(learning_rate=0.01))
    start = 0
else:
    print("restored", s.step, s.extra.decode())
    start = s.step + 1
for step in range(start, steps):
    g = torch.sin(torch.arange(1001, device=dev, dtype=torch.float32) * (step + 1))
    store.push("w", [g, g * 2.0])
    store.commit(step, b"at %d" % step)
    if step == die:
        os._exit(3)
out = torch.zeros(1001, device=dev)
store.pull("w", out=out)
print("w", out.cpu().numpy().tobytes().hex())
"""


@needs_gpu
def test_commits_of_cuda_tensors_restore_the_same_bits(tmp_path):
    import subprocess
    import sys

    def run(job, *args):
        env = dict(os.environ, KVSTORE_JOB=job, KVSTORE_COMMIT_DIR=str(tmp_path))
        env.pop("OMPI_COMM_WORLD_RANK", None)
        return subprocess.run([sys.executable, "-c", COMMIT_JOB, *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=300)

    def said(p, word):
        return [line for line in p.stdout.splitlines() if line.startswith(word + " ")]

    whole = run("never-died", 5, -1)
    assert whole.returncode == 0, whole.stderr
    died = run("died", 5, 2)
    assert died.returncode == 3, died.stderr
    resumed = run("died", 5, -1)
    assert resumed.returncode == 0, resumed.stderr
    assert said(resumed, "restored") == ["restored 2 at 2"], resumed.stdout
    assert said(whole, "w") and said(resumed, "w") == said(whole, "w")
