"""A kvstore.torch.DataParallel job resumes from its last commit with the bits of a job
that never stopped, in both modes: `DataParallel.commit` adds the torch state (the
module's, torch's Adam's, the random generator's) to the store's commit, a resumed
store's keys are adopted rather than initialized again, and `DataParallel.resume`
loads the rest (dist/torch_resume_job.py is the job).

resume_check.py runs the job, locally and under `kvstore-run`; scripts/test-python.sh
runs this file in target/py-torch-venv (no MPI: the launcher's tests skip),
scripts/test-python-mpi.sh in target/py-torch-mpi-venv.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from resume_check import launcher_runs, local_runs

try:
    import torch  # noqa: F401

    import kvstore.torch  # noqa: F401
except ImportError as e:
    if os.environ.get("KVSTORE_REQUIRE_TORCH") == "1":
        raise RuntimeError(f"KVSTORE_REQUIRE_TORCH=1 but `import torch` fails: {e}") from e
    pytest.skip("torch is not installed here (see scripts/test-python.sh)", allow_module_level=True)

JOB = pathlib.Path(__file__).resolve().parent / "dist" / "torch_resume_job.py"
MODES = ["sum", "optimizer"]
STEPS = 6


def states(out):
    """Each rank's hashes of its final weights and module state."""
    return sorted(re.findall(r"rank \d+ weights [0-9a-f]+ state [0-9a-f]+", out))


@pytest.mark.parametrize("mode", MODES)
def test_a_job_that_died_after_a_commit_resumes_with_the_bits_of_one_that_did_not(tmp_path, mode):
    whole, resumed = local_runs(tmp_path, JOB, "local", mode, STEPS)
    assert len(states(whole)) == 1
    assert states(resumed) == states(whole)


# Two runs of one job (a store is restored by the same store of the job's next run: the
# process's first `local` one here), each a program of PRELUDE and its own lines.
PRELUDE = """
import torch
import kvstore as kv
import kvstore.torch as kvt

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))

def model_without_buffers():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))

def train_one_step(dp, opt):
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    dp(x).sum().backward()
    dp.step(opt)
"""


def two_runs(tmp_path, first, second):
    """Runs `first`, then `second` as the resumed run of the same job; returns the
    second's standard output."""
    env = dict(os.environ, KVSTORE_JOB="two-runs", KVSTORE_COMMIT_DIR=str(tmp_path))
    for code in (first, second):
        done = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def refused_on_resume(tmp_path, first, make, *says):
    """Runs `first`, then the job's resumed run, in which `make` (a DataParallel) must
    raise an InvalidArgumentError that says each of `says`."""
    second = f"""
try:
    {make}
    raise AssertionError("resumed, not refused")
except kv.InvalidArgumentError as e:
    assert all(s in str(e) for s in {list(says)!r}), e
print("ok")
"""
    assert two_runs(tmp_path, first, second) == "ok\n"


def test_commit_keeps_the_programs_extra_apart_and_resume_puts_the_torch_state_back(tmp_path):
    saved = tmp_path / "expected.pt"
    first = f"""
m = model()
dp = kvt.DataParallel(m, kv.create("local"))
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
assert dp.resume(opt) is None
train_one_step(dp, opt)
torch.rand(3)  # the generator moves on, as dropout would move it
dp.commit(0, b"mine", optimizer=opt)
momentum = [opt.state[p]["momentum_buffer"] for p in m.parameters()]
torch.save((m.state_dict(), momentum, torch.get_rng_state()), {str(saved)!r})
"""
    second = f"""
state, momentum, rng = torch.load({str(saved)!r})
store = kv.create("local")
# The store's own extra holds the torch state after a header; the program's bytes
# come back whole from resume().
assert store.restored().step == 0
assert store.restored().extra.startswith(b"kvstore.torch state 1\\n" + (4).to_bytes(8, "little") + b"mine")
m = model()
dp = kvt.DataParallel(m, store)
for k, v in m.state_dict().items():  # the parameters and BatchNorm's running statistics
    assert torch.equal(v, state[k]), k
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
assert not torch.equal(torch.get_rng_state(), rng)
assert dp.resume(opt) == kv.Restored(0, b"mine")
assert torch.equal(torch.get_rng_state(), rng)
for p, b in zip(m.parameters(), momentum):
    assert torch.equal(opt.state[p]["momentum_buffer"], b)
assert dp.resume(opt) == kv.Restored(0, b"mine")  # once loaded: the step and extra only
print("ok")
"""
    assert two_runs(tmp_path, first, second) == "ok\n"


def test_a_resumed_program_must_call_resume_with_the_optimizer_before_its_first_step(tmp_path):
    first = """
m = model()
dp = kvt.DataParallel(m, kv.create("local"))
opt = torch.optim.Adam(m.parameters())
train_one_step(dp, opt)
dp.commit(0, optimizer=opt)
"""
    second = """
m = model()
dp = kvt.DataParallel(m, kv.create("local"))
opt = torch.optim.Adam(m.parameters())
try:
    train_one_step(dp, opt)
    raise AssertionError("a step before resume() ran")
except RuntimeError as e:
    assert "call dp.resume" in str(e), e
try:
    dp.resume()
    raise AssertionError("resume() without the optimizer of the commit")
except kv.InvalidArgumentError as e:
    assert "pass the optimizer" in str(e), e
assert dp.resume(opt).step == 0
print("ok")
"""
    assert two_runs(tmp_path, first, second) == "ok\n"


def test_sum_mode_refuses_a_commit_that_holds_no_torch_state(tmp_path):
    first = """
store = kv.create("local")
dp = kvt.DataParallel(model(), store)
train_one_step(dp, None)
store.commit(0, b"")  # the store's own commit: the weights stayed in torch
"""
    refused_on_resume(tmp_path, first, 'kvt.DataParallel(model(), kv.create("local"))', "did not make")


def test_optimizer_mode_refuses_a_stores_own_commit_for_a_module_with_buffers(tmp_path):
    """A commit of store.commit holds the weights, not a BatchNorm's running statistics:
    resumed from it, the job would go on with them at their start, silently."""
    first = """
store = kv.create("local")
dp = kvt.DataParallel(model(), store, mode="optimizer", optimizer=kv.optimizer.SGD(learning_rate=0.1))
train_one_step(dp, None)
store.commit(0, b"own")
"""
    sgd = "kv.optimizer.SGD(learning_rate=0.1)"
    make = f'kvt.DataParallel(model(), kv.create("local"), mode="optimizer", optimizer={sgd})'
    refused_on_resume(tmp_path, first, make, "not the module's buffers", "running_mean")


def test_a_damaged_torch_state_in_a_commit_is_an_invalid_argument(tmp_path):
    first = """
store = kv.create("local")
dp = kvt.DataParallel(model(), store)
train_one_step(dp, None)
header = b"kvstore.torch state 1\\n"
store.commit(0, header + (5).to_bytes(8, "little") + b"own" + b"not a torch file")
"""
    refused_on_resume(tmp_path, first, 'kvt.DataParallel(model(), kv.create("local"))', "not DataParallel.commit's")


def test_optimizer_mode_adopts_the_keys_of_a_stores_own_commit(tmp_path):
    saved = tmp_path / "weights.pt"
    first = f"""
m = model_without_buffers()
store = kv.create("local")
dp = kvt.DataParallel(m, store, mode="optimizer", optimizer=kv.optimizer.SGD(learning_rate=0.1))
train_one_step(dp, None)
store.commit(0, b"own")
torch.save(list(m.parameters()), {str(saved)!r})
"""
    second = f"""
m = model_without_buffers()
dp = kvt.DataParallel(m, kv.create("local"), mode="optimizer", optimizer=kv.optimizer.SGD(learning_rate=0.1))
assert all(torch.equal(p, w) for p, w in zip(m.parameters(), torch.load({str(saved)!r})))
assert dp.resume() == kv.Restored(0, b"own")
print("ok")
"""
    assert two_runs(tmp_path, first, second) == "ok\n"


@pytest.mark.parametrize("mode", MODES)
def test_kvstore_run_resumes_a_job_whose_rank_was_killed_with_the_bits_of_one_that_was_not(tmp_path, mode):
    whole, killed = launcher_runs(tmp_path, f"torch-{mode}", JOB, "dist_sync", mode, STEPS)
    whole = states(whole)
    assert len(whole) == 2 and whole[0].split()[3] == whole[1].split()[3], whole  # the ranks' weights
    assert states(killed) == whole
