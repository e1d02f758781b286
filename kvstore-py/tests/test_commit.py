"""Commits from Python: ``commit(step, extra)`` and ``restored()``. A job run with
``KVSTORE_JOB`` that dies after a commit resumes from it when run again, with the
same values as a run that never died; a store without a job name cannot commit."""

import os
import subprocess
import sys

import numpy as np
import pytest

import kvstore as kv

_JOB = """
import sys
import numpy as np
import kvstore as kv
from kvstore import optimizer

steps, die = int(sys.argv[1]), int(sys.argv[2])
store = kv.create("local")
r = store.restored()
if r is None:
    store.init("w", np.zeros(4, np.float32))
    store.set_optimizer(optimizer.SGD(learning_rate=0.1, momentum=0.9))
    start = 0
else:
    print("restored", r.step, r.extra.decode())
    start = r.step + 1
for step in range(start, steps):
    store.push("w", np.full(4, step + 1, np.float32))
    store.commit(step, f"loader at {step}".encode())
    if step == die:
        sys.stdout.flush()
        import os
        os._exit(3)
out = np.zeros(4, np.float32)
store.pull("w", out=out)
print("w", out.tobytes().hex())
"""


def _run(tmp_path, job, *args):
    env = {**os.environ, "KVSTORE_JOB": job, "KVSTORE_COMMIT_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", _JOB, *map(str, args)], env=env, capture_output=True, text=True, timeout=120)


def test_a_job_that_died_resumes_from_its_last_commit(tmp_path):
    whole = _run(tmp_path, "whole", 5, -1)
    assert whole.returncode == 0, whole.stderr
    assert _run(tmp_path, "died", 5, 2).returncode == 3
    resumed = _run(tmp_path, "died", 5, -1)
    assert resumed.returncode == 0, resumed.stderr
    assert "restored 2 loader at 2" in resumed.stdout
    last = lambda out: [l for l in out.splitlines() if l.startswith("w ")]  # noqa: E731
    assert last(resumed.stdout) == last(whole.stdout)


def test_a_store_without_a_job_name_cannot_commit():
    store = kv.create("local")
    store.init("w", np.zeros(2, np.float32))
    with pytest.raises(kv.InvalidArgumentError, match="KVSTORE_JOB"):
        store.commit(0, b"x")
    assert store.restored() is None
