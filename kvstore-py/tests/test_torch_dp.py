"""kvstore.torch.DataParallel on a `local` store, in one process: gradients hooked and
handed to the store during backward, and the results of a plain torch step.

PyTorch is not in the main test venv: scripts/test-python.sh runs this file in
target/py-torch-venv (Debian's python3-torch 1.13, with KVSTORE_REQUIRE_TORCH=1, under
which a missing torch fails instead of skipping). The mpirun half is
test_torch_dp_dist.py.
"""

import copy
import os

import numpy as np
import pytest

import kvstore as kv
from kvstore import optimizer

try:
    import torch

    import kvstore.torch as kvt
except ImportError as e:
    if os.environ.get("KVSTORE_REQUIRE_TORCH") == "1":
        raise RuntimeError(f"KVSTORE_REQUIRE_TORCH=1 but `import torch` fails: {e}") from e
    pytest.skip(
        "torch is not installed here: scripts/test-python.sh runs these tests in target/py-torch-venv",
        allow_module_level=True,
    )


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)
    )


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(7, 6, generator=g), torch.randint(0, 3, (7,), generator=g)


def loss_of(model, step):
    x, y = batch(step)
    return torch.nn.functional.cross_entropy(model(x), y)


def test_sum_mode_hands_each_gradient_over_during_backward_last_layer_first():
    model = mlp()
    dp = kvt.DataParallel(model, kv.create("local"))
    assert dp.keys == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    seen_during_backward = []
    # Backward computes the gradient of the first layer's output after the later
    # layers' parameter gradients, before the first layer's own: by then the later
    # layers' gradients must already be in the store's hands.
    def watch(module, inputs, out):
        out.register_hook(lambda g: seen_during_backward.append(sorted(dp._pending)))

    model[0].register_forward_hook(watch)
    launched = []
    launch = dp._launch
    dp._launch = lambda i: (launched.append(i), launch(i))
    loss_of(dp, 0).backward()
    assert seen_during_backward == [[2, 3, 4, 5]]
    assert sorted(dp._pending) == [0, 1, 2, 3, 4, 5]
    # Backward reaches the last layer first; each call's priority is -index.
    assert launched[:2] in ([4, 5], [5, 4]) and launched[-2:] in ([0, 1], [1, 0]), launched
    grads = [p.grad for p in model.parameters()]
    ptrs = [g.data_ptr() for g in grads]
    expected = [g.clone() for g in grads]
    dp.synchronize()
    assert dp._pending == {}
    # In place (no copy): the same tensors, and one worker's sum is its own gradient.
    assert [p.grad.data_ptr() for p in model.parameters()] == ptrs
    for p, e in zip(model.parameters(), expected):
        assert torch.equal(p.grad, e)
    # The store's keys hold the summed gradients.
    for k, p in zip(dp.keys, model.parameters()):
        assert torch.equal(torch.from_numpy(dp.store.pull(k)), p.grad)


def test_sum_mode_trains_exactly_as_plain_torch():
    model, reference = mlp(), mlp()
    dp = kvt.DataParallel(model, kv.create("local"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for step in range(5):
        opt.zero_grad()
        loss_of(dp, step).backward()
        dp.step(opt)
        ref_opt.zero_grad()
        loss_of(reference, step).backward()
        ref_opt.step()
    for p, r in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, r)
    assert not torch.equal(next(model.parameters()), next(mlp().parameters()))


def test_optimizer_mode_pulls_the_stores_sgd_step_into_the_parameters():
    model, reference = mlp(), mlp()
    store = kv.create("local")
    dp = kvt.DataParallel(model, store, mode="optimizer", optimizer=optimizer.SGD(learning_rate=0.1))
    assert store.optimizer == "sgd"
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ptrs = [p.data_ptr() for p in model.parameters()]
    for step in range(4):
        model.zero_grad()
        loss_of(dp, step).backward()
        dp.step()
        ref_opt.zero_grad()
        loss_of(reference, step).backward()
        # The gradient pushed is the plain one, untouched (bit for bit at the first step,
        # when the weights are the same).
        for p, r in zip(model.parameters(), reference.parameters()):
            if step == 0:
                assert torch.equal(p.grad, r.grad)
            torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-7)
        ref_opt.step()
        for p, r in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)
    assert [p.data_ptr() for p in model.parameters()] == ptrs  # written in place
    for k, p in zip(dp.keys, model.parameters()):
        assert np.array_equal(store.pull(k), p.detach().numpy())


def test_optimizer_mode_with_momentum_matches_torch_sgd():
    # MXNet's momentum (mom = m*mom - lr*g; w += mom) is torch's (buf = m*buf + g;
    # w -= lr*buf) up to rounding.
    model, reference = mlp(), mlp()
    sgd = optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=1e-3)
    dp = kvt.DataParallel(model, kv.create("local"), mode="optimizer", optimizer=sgd)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    for step in range(6):
        model.zero_grad()
        loss_of(dp, step).backward()
        dp.step()
        ref_opt.zero_grad()
        loss_of(reference, step).backward()
        ref_opt.step()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)


def test_no_sync_accumulates_and_the_next_backward_hands_the_sum_over():
    model, reference = mlp(), mlp()
    dp = kvt.DataParallel(model, kv.create("local"))
    with dp.no_sync():
        loss_of(dp, 0).backward()
    assert dp._pending == {}
    loss_of(dp, 1).backward()
    assert sorted(dp._pending) == list(range(6))
    dp.synchronize()
    loss_of(reference, 0).backward()
    loss_of(reference, 1).backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, r.grad)


def test_a_second_backward_before_synchronize_is_an_error():
    dp = kvt.DataParallel(mlp(), kv.create("local"))
    loss_of(dp, 0).backward()
    with pytest.raises(RuntimeError, match="produced twice before synchronize"):
        loss_of(dp, 1).backward()


def test_a_parameter_without_gradient_is_pushed_as_zeros_at_synchronize():
    model = mlp()
    model.add_module("unused", torch.nn.Linear(2, 2))
    store = kv.create("local")
    dp = kvt.DataParallel(model, store)
    loss_of(model[:5], 0).backward()
    assert sorted(dp._pending) == list(range(6))
    store.push("unused.bias", torch.ones(2))  # the key held the weights, then this
    dp.synchronize()
    assert torch.equal(model.unused.bias.grad, torch.zeros(2))
    assert np.array_equal(store.pull("unused.bias"), np.zeros(2, np.float32))


def test_wrapping_initializes_the_keys_from_the_parameters():
    model = mlp(3)
    before = copy.deepcopy(model)
    store = kv.create("local")
    dp = kvt.DataParallel(model, store, key_prefix="m/")
    assert dp.keys[0] == "m/0.weight"
    for k, p in zip(dp.keys, before.parameters()):
        assert np.array_equal(store.pull(k), p.detach().numpy())
    for p, b in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, b)
    dp.remove_hooks()
    loss_of(model, 0).backward()
    assert dp._pending == {}


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode must be one of"):
        kvt.DataParallel(mlp(), kv.create("local"), mode="mean")
    with pytest.raises(ValueError, match="needs a kvstore.optimizer optimizer"):
        kvt.DataParallel(mlp(), kv.create("local"), mode="optimizer")
    store = kv.create("local")
    store.set_optimizer(optimizer.SGD(learning_rate=0.1))
    with pytest.raises(ValueError, match="needs a store with no optimizer"):
        kvt.DataParallel(mlp(), store)
    with pytest.raises(ValueError, match="pass optimizer only with"):
        kvt.DataParallel(mlp(), kv.create("local"), optimizer=optimizer.SGD(learning_rate=0.1))


@pytest.mark.parametrize("mode", ["sum", "optimizer"])
def test_a_non_contiguous_parameter_is_refused_by_name_with_what_to_do(mode):
    model = mlp()
    with torch.no_grad():
        # The same values, stored transposed (as after a .t() of a weight).
        model[2].weight = torch.nn.Parameter(model[2].weight.detach().t().contiguous().t())
    assert not model[2].weight.is_contiguous()
    store = kv.create("local")
    opt = optimizer.SGD(learning_rate=0.1) if mode == "optimizer" else None
    with pytest.raises(kv.InvalidArgumentError, match=r"parameter 2\.weight is not contiguous") as e:
        kvt.DataParallel(model, store, mode=mode, optimizer=opt)
    assert isinstance(e.value, ValueError) and ".contiguous()" in str(e.value)
    assert store.keys() == []  # refused before any key was made
    # What the message says to do.
    with torch.no_grad():
        model.get_parameter("2.weight").data = model.get_parameter("2.weight").data.contiguous()
    dp = kvt.DataParallel(model, store, mode=mode, optimizer=opt)
    loss_of(dp, 0).backward()
    dp.step(None if mode == "optimizer" else torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("set_to_none", [False, True])
def test_zeroing_the_gradients_before_synchronize_is_an_error(set_to_none):
    model = mlp()
    dp = kvt.DataParallel(model, kv.create("local"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of(dp, 0).backward()
    opt.zero_grad(set_to_none=set_to_none)
    with pytest.raises(RuntimeError, match="0.weight was changed or replaced between backward"):
        dp.synchronize()
    # The next step is a normal one.
    opt.zero_grad()
    loss_of(dp, 1).backward()
    dp.step(opt)


@pytest.mark.parametrize("mode", ["sum", "optimizer"])
def test_pushes_and_the_wait_are_named_ranges_in_torchs_profiler(mode):
    model = mlp()
    store = kv.create("local")
    if mode == "optimizer":
        dp = kvt.DataParallel(model, store, mode="optimizer", optimizer=optimizer.SGD(learning_rate=0.1))
    else:
        dp = kvt.DataParallel(model, store)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss_of(dp, 0).backward()
        dp.synchronize()
    names = {e.name for e in prof.events()}
    verb = "pushpull" if mode == "sum" else "push"
    assert {f"kvstore.{verb} {k}" for k in dp.keys} <= names, sorted(names)
    assert "kvstore.synchronize" in names
