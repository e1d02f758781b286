"""A gluon Trainer job through kvstore.mxnet that commits every step, run by
test_gluon_resume.py.

`gluon_resume_job.py KIND UPDATE_ON_KVSTORE START STEPS DIE`: `kv = mx.kv.create(KIND)`
(`local`, or `dist_sync` under `kvstore-run`), a small MLP trained STEPS steps with
`gluon.Trainer(params, "adam", ..., kvstore=kv, update_on_kvstore=...)` (1 or 0) on
batches of each rank's own, `kv.commit(step, extra)` after each step. START says where
it starts: `resume` calls `kvstore.mxnet.resume(trainer, batch_size)` before the first
forward pass, `restored` reads `kv.restored()` (the Trainer made with a resumed store
pulled the commit's weights). The last rank
kills itself (SIGKILL) after committing step DIE, in the launcher's first run only
(KVSTORE_RUN_ATTEMPT 0, or unset); -1 never. Prints `restored STEP EXTRA` when it
resumed, and at the end `rank R weights HASH`: a hash of its final weights' bytes.
"""

import hashlib
import os
import signal
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore.mxnet  # mx.kv.create makes this project's store


def main(kind: str, update_on_kvstore: bool, start_by: str, steps: int, die: int) -> None:
    kv = mx.kv.create(kind)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=5), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    # The same starting weights in every run (the resumed run's are the commit's).
    rng = np.random.RandomState(7)
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, size=p.shape).astype(np.float32)))
    trainer = gluon.Trainer(
        net.collect_params(), "adam", {"learning_rate": 0.01, "wd": 1e-3}, kvstore=kv, update_on_kvstore=update_on_kvstore
    )
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if start_by == "resume":
        r = kvstore.mxnet.resume(trainer, 8 * kv.num_workers)
    else:
        r = kv.restored()
    if r is not None:
        # One write: mpirun would interleave the pieces of print's.
        os.write(1, f"restored {r.step} {r.extra.decode()}\n".encode())
    start = r.step + 1 if r else 0
    for step in range(start, steps):
        data = np.random.RandomState(1000 * step + kv.rank)
        x = mx.nd.array(data.randn(8, 5).astype(np.float32))
        y = mx.nd.array(data.randint(0, 3, size=8).astype(np.float32))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8 * kv.num_workers)
        kv.commit(step, f"loader at {step}".encode())
        last = kv.rank == kv.num_workers - 1
        if step == die and last and os.environ.get("KVSTORE_RUN_ATTEMPT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
    w = b"".join(p.data().asnumpy().tobytes() for p in net.collect_params().values())
    os.write(1, f"rank {kv.rank} weights {hashlib.sha256(w).hexdigest()}\n".encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
