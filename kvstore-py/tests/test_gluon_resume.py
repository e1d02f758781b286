"""gluon's Trainer through kvstore.mxnet resumes from its last commit with the bits of
a job that never stopped: the resumed program makes a fresh start's calls, the
Trainer's `set_optimizer` of the same optimizer keeps the commit's with its state, and
its `init`/`broadcast` of a key the commit holds adopt it (dist/gluon_resume_job.py is
the job: a Trainer made with a resumed store, or `kvstore.mxnet.resume(trainer,
batch_size)`, puts the commit's weights in the parameters before the first forward
pass).

resume_check.py runs the job, locally and under `kvstore-run`; scripts/test-python.sh
runs this file in target/py-mxnet-venv (no MPI: the launcher's tests skip),
scripts/test-python-mpi.sh in target/py-mxnet-mpi-venv.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from resume_check import launcher_runs, local_runs

try:
    import mxnet  # noqa: F401
except ImportError:
    if os.environ.get("KVSTORE_REQUIRE_MXNET") == "1":
        raise
    pytest.skip("mxnet is not installed here (see scripts/test-python.sh)", allow_module_level=True)

JOB = pathlib.Path(__file__).resolve().parent / "dist" / "gluon_resume_job.py"
STEPS = 6
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def weights(out):
    """Each rank's hash of its final weights."""
    return sorted(re.findall(r"rank \d+ weights [0-9a-f]+", out))


def test_a_trainer_job_that_died_after_a_commit_resumes_with_the_bits_of_one_that_did_not(tmp_path):
    whole, resumed = local_runs(tmp_path, JOB, "local", 1, "resume", STEPS, env=ENV)
    assert len(weights(whole)) == 1
    assert weights(resumed) == weights(whole)


def test_update_on_kvstore_false_cannot_resume_and_says_so(tmp_path):
    # The store's keys hold the last sums of gradients: adopting them as weights would
    # go on from wrong weights without a word.
    with pytest.raises(AssertionError, match="update_on_kvstore=True only"):
        local_runs(tmp_path, JOB, "local", 0, "resume", STEPS, env=ENV)


# The first run commits; the second, the same job resumed, checks.
FIRST = """
import mxnet as mx
import kvstore.mxnet
kv = mx.kv.create("local")
assert kv.restored() is None
kv.init([3, 4], [mx.nd.ones((2,)), mx.nd.ones((3,))])
kv.push(3, mx.nd.full((2,), 5.0))
kv.commit(0, b"mine")
"""
SECOND = """
import mxnet as mx
import kvstore
import kvstore.mxnet
kv = mx.kv.create("local")
assert kv.restored() == kvstore.Restored(0, b"mine")
# 3 is the commit's (its value kept), 5 is initialized.
kv.init([3, 5], [mx.nd.zeros((2,)), mx.nd.full((4,), 2.0)])
out, new = mx.nd.zeros((2,)), mx.nd.zeros((4,))
kv.pull([3, 5], out=[out, new])
assert out.asnumpy().tolist() == [5.0, 5.0] and new.asnumpy().tolist() == [2.0] * 4
try:
    kv.init(3, mx.nd.zeros((2,)))  # adopted once: init again is an error again
    raise AssertionError("a second init of an adopted key")
except kvstore.AlreadyInitializedError:
    pass
# broadcast of a key of the commit pulls it (with an optimizer the keys are weights).
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
outs = [mx.nd.zeros((3,)), mx.nd.zeros((3,))]
kv.broadcast(4, mx.nd.zeros((3,)), outs)
assert [o.asnumpy().tolist() for o in outs] == [[1.0] * 3] * 2
print("ok")
"""


def test_init_adopts_a_key_of_the_commit_once_and_broadcast_pulls_it(tmp_path):
    env = dict(ENV, KVSTORE_JOB="two-runs", KVSTORE_COMMIT_DIR=str(tmp_path))
    for code in (FIRST, SECOND):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "ok\n"


def test_kvstore_run_resumes_a_trainer_job_whose_rank_was_killed_with_the_bits_of_one_that_was_not(tmp_path):
    # The program reads kv.restored() only: the Trainer made with the resumed store
    # pulled the commit's weights before the first forward pass.
    forward = ["OMP_NUM_THREADS"]
    whole, killed = launcher_runs(tmp_path, "gluon", JOB, "dist_sync", 1, "restored", STEPS, env=ENV, forward=forward)
    whole = weights(whole)
    assert len(whole) == 2 and whole[0].split()[-1] == whole[1].split()[-1], whole
    assert weights(killed) == whole
