"""A kvstore.torch.DataParallel job that commits every step, run by test_torch_resume.py.

`torch_resume_job.py KIND MODE STEPS DIE`: a store of KIND (`local`, or `dist_sync`
under `kvstore-run`), an MLP with BatchNorm (buffers) and dropout (torch's random
generator) wrapped in MODE (`sum`: torch's Adam; `optimizer`: the store's Adam), STEPS
steps on batches of each rank's own, a commit after each. The last rank kills itself
(SIGKILL) after committing step DIE, in the launcher's first run only (KVSTORE_RUN_ATTEMPT
0, or unset); -1 never. Prints `restored STEP EXTRA` when it resumed, and at the end
`rank R weights HASH state HASH`: hashes of the bytes of the parameters and of the
module's whole state.
"""

import hashlib
import os
import signal
import sys

import torch

import kvstore as kv
import kvstore.torch


def main(kind: str, mode: str, steps: int, die: int) -> None:
    torch.set_num_threads(1)
    store = kv.create(kind)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3)
    )
    if mode == "sum":
        dp = kvstore.torch.DataParallel(model, store)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        rescale = 1.0 / store.num_workers
        dp = kvstore.torch.DataParallel(
            model, store, mode="optimizer", optimizer=kv.optimizer.Adam(learning_rate=0.01, rescale_grad=rescale)
        )
        opt = None
    r = dp.resume(opt)
    if r is not None:
        # One write: mpirun would interleave the pieces of print's.
        os.write(1, f"restored {r.step} {r.extra.decode()}\n".encode())
    start = r.step + 1 if r else 0
    for step in range(start, steps):
        g = torch.Generator().manual_seed(1000 * step + store.rank)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        if opt is not None:
            opt.zero_grad()
        else:
            model.zero_grad()
        torch.nn.functional.cross_entropy(dp(x), y).backward()
        dp.step(opt)
        dp.commit(step, f"loader at {step}".encode(), optimizer=opt)
        last = store.rank == store.num_workers - 1
        if step == die and last and os.environ.get("KVSTORE_RUN_ATTEMPT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
    digest = lambda ts: hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in ts)).hexdigest()  # noqa: E731
    # The weights are every rank's; BatchNorm's running statistics each rank's own.
    os.write(1, f"rank {store.rank} weights {digest(model.parameters())} state {digest(model.state_dict().values())}\n".encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
