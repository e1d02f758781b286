"""Data-parallel training of PyTorch models through a store: ``kvstore.torch``.

Two lines adopt it in a training loop (CPU tensors)::

    import kvstore as kv
    import kvstore.torch

    store = kv.create("dist_sync")                           # or "local"
    dp = kvstore.torch.DataParallel(model, store)            # 1. wrap the model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in shard_of_every_batch:
        opt.zero_grad()
        loss_fn(dp(x), y).backward()    # each gradient goes to the store as soon as it is ready
        dp.synchronize()                # 2. wait: p.grad is now the average over the workers
        opt.step()

or, with the optimizer in the store (a :mod:`kvstore.optimizer` optimizer, run in Rust)::

    dp = kvstore.torch.DataParallel(model, store, mode="optimizer",
                                    optimizer=kv.optimizer.SGD(learning_rate=0.05, momentum=0.9,
                                                               rescale_grad=1 / store.num_workers))
    ...
        loss_fn(dp(x), y).backward()
        dp.step()                       # the new weights are in the parameters

What it does: it initializes one key per parameter (named ``key_prefix + name``, from
``model.named_parameters()``) with the parameter's values; under ``dist_sync`` rank 0's
values win, and every rank's parameters are overwritten with them, so every rank starts
equal. It hooks every parameter: as soon as backward has accumulated a gradient into
``p.grad``, the gradient is handed to the store with a non-blocking call (``pushpull``
in ``"sum"`` mode, ``push`` in ``"optimizer"`` mode), with priority ``-index`` so that the
first layers' calls (whose gradients backward produces last) go first.
:meth:`DataParallel.synchronize` waits for them:

- ``mode="sum"``: the store only sums. ``p.grad`` is overwritten in place with the sum
  over the workers, divided by ``store.num_workers`` (``average=False`` keeps the
  sum); then the caller's own torch optimizer steps.
- ``mode="optimizer"``: the store runs `optimizer` on the sum of the workers'
  gradients (pass ``rescale_grad=1 / store.num_workers`` to average them) and the new
  weights are pulled into ``p.data`` in place.

**No copies.** CPU gradients are read (and, in ``"sum"`` mode, written) in place:
``p.grad`` belongs to the store from the moment backward accumulated it until
:meth:`synchronize` (or :meth:`step`) returns. Do not zero, rescale, clip or otherwise
touch the gradients between ``backward()`` and ``synchronize()``; do it after (clipping)
or before the next ``backward()`` (zeroing). The parameters themselves must not change
in between either (the optimizer steps after ``synchronize``). ``synchronize`` checks
the gradients (torch's version counter, which the store's own writes leave alone): one
changed in place (``opt.zero_grad()`` too early) or replaced (``set_to_none``) while the
store had it raises ``RuntimeError``.

Rules of ``dist_sync`` (the calls of every rank are matched in order): every rank wraps
the same model, runs the same number of backward passes, and uses the same parameters
in each (a parameter that got no gradient is pushed, with a zero gradient, at
``synchronize``). Gradient accumulation over several backward passes: run all but the
last under ``with dp.no_sync():``. Buffers (BatchNorm's running statistics) are not
synchronized. Only CPU tensors are supported.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch as _torch  # type: ignore

import kvstore as _kv
from kvstore import optimizer as _opt

__all__ = ["DataParallel"]

MODES = ("sum", "optimizer")


class DataParallel:
    """Trains `module` data-parallel through `store` (see the module's docs).

    :param module: the model (a ``torch.nn.Module`` on the CPU); calling the wrapper
        calls it. Its parameters that require a gradient are synchronized.
    :param store: a :class:`kvstore.KVStore` (``local``, or ``dist_sync`` under
        ``mpirun``). In ``"sum"`` mode it must have no optimizer or updater set.
    :param mode: ``"sum"`` (the store averages gradients into ``p.grad``; the caller's
        torch optimizer steps) or ``"optimizer"`` (the store runs `optimizer` and the
        weights are pulled into the parameters).
    :param optimizer: in ``"optimizer"`` mode, the :mod:`kvstore.optimizer` optimizer
        set on the store (``None``: the store's own, which must be set).
    :param average: in ``"sum"`` mode, divide the sum by ``store.num_workers``.
    :param key_prefix: prefixes every key (to share a store between models).
    """

    def __init__(
        self,
        module: Any,
        store: _kv.KVStore,
        mode: str = "sum",
        optimizer: Optional[_opt.Optimizer] = None,
        average: bool = True,
        key_prefix: str = "",
    ) -> None:
        if mode not in MODES:
            raise _kv.InvalidArgumentError(f"mode must be one of {MODES}, not {mode!r}")
        if mode == "sum" and optimizer is not None:
            raise _kv.InvalidArgumentError(
                'mode="sum" runs the caller\'s torch optimizer: pass optimizer only with mode="optimizer"'
            )
        if mode == "sum" and store.optimizer is not None:
            raise _kv.InvalidArgumentError(f'mode="sum" needs a store with no optimizer (it has {store.optimizer!r})')
        if mode == "optimizer" and optimizer is None and store.optimizer is None:
            raise _kv.InvalidArgumentError('mode="optimizer" needs a kvstore.optimizer optimizer (optimizer=...)')
        self.module = module
        self.store = store
        self.mode = mode
        self.average = average
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        for name, p in named:
            if p.device.type != "cpu":
                raise _kv.ArgumentTypeError(f"parameter {name} is on {p.device}: only CPU tensors are supported")
            if not p.is_contiguous():
                # The store reads and writes each parameter in place, as one block.
                raise _kv.InvalidArgumentError(
                    f"parameter {name} is not contiguous (shape {tuple(p.shape)}, strides {p.stride()}): the "
                    "store reads and writes every parameter in place, as one block of memory; make it contiguous "
                    f"before wrapping the model (p = module.get_parameter({name!r}); p.data = p.data.contiguous()), "
                    "or leave it out of the synchronization (p.requires_grad_(False))"
                )
        self._names: List[str] = [n for n, _ in named]
        self._params: List[Any] = [p for _, p in named]
        self._keys: List[str] = [key_prefix + n for n in self._names]
        # The pending call of each parameter (by index) since the last synchronize, with
        # the gradient it reads in place and that gradient's version then.
        self._pending: Dict[int, Tuple[_kv.Future, Any, int]] = {}
        self._syncing = True
        self._hooks: List[Any] = []
        # The AccumulateGrad nodes hooked (torch < 2.1): kept alive here.
        self._accumulators: List[Any] = []
        if self._keys:
            with _torch.no_grad():
                values = [p.detach() for p in self._params]
                store.init(self._keys, values)
                # Rank 0's values won: every rank starts from them.
                store.pull(self._keys, out=values)
        if optimizer is not None:
            store.set_optimizer(optimizer)
        for i, p in enumerate(self._params):
            self._hook(i, p)

    def _hook(self, i: int, p: Any) -> None:
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            self._hooks.append(p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i)))
            return
        # The AccumulateGrad node of p (what DDP hooked before torch 2.1): its hooks run
        # once it has accumulated the gradient into p.grad.
        with _torch.enable_grad():
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        self._hooks.append(accumulator.register_hook(lambda *_, i=i: self._ready(i)))
        self._accumulators.append(accumulator)

    def _ready(self, i: int) -> None:
        """Backward has accumulated parameter `i`'s gradient: hands it to the store."""
        if not self._syncing:
            return
        if i in self._pending:
            raise RuntimeError(
                f"the gradient of {self._names[i]} was produced twice before synchronize(): "
                "run all but the last backward of an accumulation under `with dp.no_sync():`"
            )
        self._launch(i)

    def _launch(self, i: int) -> None:
        p = self._params[i]
        grad = p.grad
        if grad.device.type != "cpu" or grad.layout != _torch.strided:
            raise _kv.ArgumentTypeError(f"the gradient of {self._names[i]} is not a dense CPU tensor")
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        # copy=False: read (and in "sum" mode written) in place; p.grad must not change
        # until synchronize() has waited for it.
        # Named ranges in torch's own profiler's trace (``torch.profiler.profile()``).
        if self.mode == "sum":
            with _torch.profiler.record_function(f"kvstore.pushpull {self._names[i]}"):
                future = self.store.pushpull_async(self._keys[i], grad, priority=-i, copy=False)
        else:
            with _torch.profiler.record_function(f"kvstore.push {self._names[i]}"):
                future = self.store.push_async(self._keys[i], grad, priority=-i, copy=False)
        self._pending[i] = (future, grad, grad._version)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate into ``p.grad`` (as DDP's
        ``no_sync``): the next backward outside hands the accumulated gradients over."""
        previous, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = previous

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the module."""
        return self.module(*args, **kwargs)

    def synchronize(self) -> None:
        """Waits for this step's gradients. ``"sum"`` mode: ``p.grad`` is then the
        average (or sum) over the workers; ``"optimizer"`` mode: the parameters hold the
        store's new weights. Parameters whose gradient backward did not produce are
        handed over now (a missing ``p.grad`` as zeros)."""
        for i, p in enumerate(self._params):
            if i not in self._pending:
                if p.grad is None:
                    p.grad = _torch.zeros_like(p, memory_format=_torch.contiguous_format)
                self._launch(i)
        pending, self._pending = self._pending, {}
        pulls: List[_kv.Future] = []
        if self.mode == "optimizer":
            # Queued after each key's push: the weights the optimizer made from it.
            pulls = [self.store.pull_async(k, p.detach(), priority=-i) for i, (k, p) in enumerate(zip(self._keys, self._params))]
        errors = []
        with _torch.profiler.record_function("kvstore.synchronize"):
            for future in [f for f, _, _ in pending.values()] + pulls:
                try:
                    future.result()
                except Exception as e:  # wait for every call before raising
                    errors.append(e)
        if errors:
            raise errors[0]
        for i in sorted(pending):
            _, grad, version = pending[i]
            # torch counts in-place changes (zero_, mul_, ...); the store's writes are not
            # counted. A gradient changed or replaced while the store had it is an error.
            if self._params[i].grad is not grad or grad._version != version:
                raise RuntimeError(
                    f"the gradient of {self._names[i]} was changed or replaced between backward() and "
                    "synchronize(), while the store was reading it in place: zero the gradients "
                    "before backward(), not after"
                )
        if self.mode == "sum" and self.average and self.store.num_workers > 1:
            with _torch.no_grad():
                for p in self._params:
                    p.grad.div_(self.store.num_workers)

    def step(self, optimizer: Any = None) -> None:
        """:meth:`synchronize`, then ``optimizer.step()`` if a torch optimizer is given
        (``"sum"`` mode). In ``"optimizer"`` mode the store has stepped already."""
        self.synchronize()
        if optimizer is not None:
            if self.mode == "optimizer":
                raise _kv.InvalidArgumentError(
                    'mode="optimizer": the store runs the optimizer; call step() with no argument'
                )
            optimizer.step()

    def remove_hooks(self) -> None:
        """Unhooks the parameters (the keys stay in the store)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._accumulators.clear()

    @property
    def keys(self) -> List[str]:
        """The store's key of each synchronized parameter, in the module's order."""
        return list(self._keys)

    def __repr__(self) -> str:
        return f"<kvstore.torch.DataParallel mode={self.mode!r} params={len(self._params)} store={self.store!r}>"
