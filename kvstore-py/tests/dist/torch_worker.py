"""One rank of a dist_sync job, run by test_torch_dp_dist.py under `mpirun -np 2`.

`torch_worker.py OUT`: each rank builds the same MLP from a different seed and wraps it
in kvstore.torch.DataParallel (sum mode): rank 0's weights must win. Then three steps
of torch SGD on rank-dependent batches; writes OUT.<rank>.npz with the weights after
wrapping (`init`), the averaged gradients of the first step (`grad`), this rank's own
first-step gradients (`own`) and the final weights (`final`).
"""

import sys

import numpy as np
import torch

import kvstore as kv
import kvstore.torch


def main(out: str) -> None:
    torch.set_num_threads(1)
    store = kv.create("dist_sync")
    rank = store.rank
    assert store.num_workers == 2
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    dp = kvstore.torch.DataParallel(model, store)
    flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts]).numpy().copy()  # noqa: E731
    init = flat(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = {}
    for step in range(3):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(dp(x), y).backward()
        if step == 0:
            saved["own"] = flat(p.grad for p in model.parameters())
        dp.synchronize()
        if step == 0:
            saved["grad"] = flat(p.grad for p in model.parameters())
        opt.step()
    np.savez(f"{out}.{rank}.npz", init=init, final=flat(model.parameters()), **saved)


if __name__ == "__main__":
    main(sys.argv[1])
