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

**Resuming a job** (``kvstore-run``, docs/recovery.md): commit through the wrapper, which
adds what lives in torch to the store's commit, and resume through it::

    dp = kvstore.torch.DataParallel(model, store)    # a resumed store: the commit's weights
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    r = dp.resume(opt)                                # None the first time
    start = r.step + 1 if r else 0
    for step in range(start, steps):
        ...
        dp.step(opt)
        dp.commit(step, loader_position, optimizer=opt)   # bytes of your own, as store.commit's

A resumed program makes the same calls as a fresh one, and ends with the bits of a run
that never stopped. On a store that restored a commit, the constructor does not
``init`` the keys the commit holds: it adopts them. In ``"optimizer"`` mode their values
are the weights, pulled into the parameters (and the store keeps the commit's optimizer
and its state: pass the same `optimizer`, or none). In ``"sum"`` mode they hold the last
sum of gradients, and the weights come from the commit: :meth:`commit` puts the module's
state there (its parameters and buffers; in ``"optimizer"`` mode the buffers and the
parameters not synchronized), the torch optimizer's state and torch's random generator's
state, each rank its own (a commit's ``extra`` is each rank's). Then
:meth:`resume` loads the optimizer's state and the generator's, and returns
``Restored(step, extra)`` with your own ``extra``. The store's own ``restored().extra``
holds them all in this format: the 22 bytes ``b"kvstore.torch state 1\\n"``, the length
of your ``extra`` (8 bytes, little-endian), your ``extra``, then ``torch.save`` of
``{"module": state_dict, "optimizer": state_dict or None, "rng":
torch.get_rng_state()}``. A program whose store restored such a commit calls
:meth:`resume` before its first :meth:`synchronize` (else that raises ``RuntimeError``),
with the optimizer when the commit holds one. What else the job needs (a learning-rate
schedule's ``state_dict()``, the data loader's position, numpy's generator) goes in your
``extra``. One wrapper commits a store (the state is its module's).
"""

from __future__ import annotations

import contextlib
import io
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch as _torch  # type: ignore

import kvstore as _kv
from kvstore import optimizer as _opt

__all__ = ["DataParallel"]

MODES = ("sum", "optimizer")

# A commit's extra as DataParallel.commit writes it (see the module's docs).
_STATE_HEADER = b"kvstore.torch state 1\n"


def _pack(extra: bytes, state: Dict[str, Any]) -> bytes:
    """The commit's extra: the program's `extra` and the torch `state`."""
    buf = io.BytesIO()
    buf.write(_STATE_HEADER + struct.pack("<Q", len(extra)) + extra)
    _torch.save(state, buf)
    return buf.getvalue()


def _unpack(blob: bytes) -> Optional[Tuple[bytes, Dict[str, Any]]]:
    """The program's extra and the torch state of a commit's extra, or None for an extra
    that :meth:`DataParallel.commit` did not write."""
    start = len(_STATE_HEADER) + 8
    if not blob.startswith(_STATE_HEADER) or len(blob) < start:
        return None
    (n,) = struct.unpack("<Q", blob[len(_STATE_HEADER) : start])
    if n > len(blob) - start:
        raise _kv.InvalidArgumentError(
            f"the commit's extra is not DataParallel.commit's: it says the program's bytes are {n}, "
            f"and holds {len(blob) - start}"
        )
    # The job's own bytes, from a folder of the job's user alone (torch 1.13's
    # weights_only loader refuses floats, which optimizer states hold).
    try:
        state = _torch.load(io.BytesIO(blob[start + n :]), weights_only=False)
    except Exception as e:
        raise _kv.InvalidArgumentError(f"the commit's extra is not DataParallel.commit's: its torch state: {e}") from e
    if not isinstance(state, dict) or not {"module", "optimizer"} <= set(state):
        raise _kv.InvalidArgumentError("the commit's extra is not DataParallel.commit's: no module and optimizer state")
    return blob[start : start + n], state


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
        self._resume(store)
        if optimizer is not None:
            store.set_optimizer(optimizer)
        for i, p in enumerate(self._params):
            self._hook(i, p)

    def _resume(self, store: _kv.KVStore) -> None:
        """Initializes the keys, or adopts those a resumed store holds, and puts the
        commit's module state back."""
        restored = store.restored()
        # What resume() returns, and the torch state it still has to load.
        self._restored = restored
        self._state: Optional[Dict[str, Any]] = None
        held = set()
        if restored is not None:
            unpacked = _unpack(restored.extra)
            if unpacked is not None:
                self._restored = _kv.Restored(restored.step, unpacked[0])
                self._state = unpacked[1]
            held = {str(k) for k in store.keys()}
        fresh = [i for i, k in enumerate(self._keys) if k not in held]
        # A commit of store.commit holds the keys alone: in "optimizer" mode the weights,
        # enough for a module without buffers (a BatchNorm's running statistics live in
        # torch, and would start again).
        buffers = [name for name, _ in self.module.named_buffers()]
        if self.mode == "optimizer" and len(fresh) < len(self._keys) and self._state is None and buffers:
            raise _kv.InvalidArgumentError(
                f'mode="optimizer": this store resumed a commit{self._of_step()} that DataParallel.commit did '
                f"not make: it holds the weights, not the module's buffers ({', '.join(buffers[:3])}"
                f"{', ...' if len(buffers) > 3 else ''}). Commit with dp.commit(step, extra), or start the job afresh"
            )
        if self.mode == "sum" and len(fresh) < len(self._keys) and self._state is None:
            raise _kv.InvalidArgumentError(
                f'mode="sum": this store resumed a commit{self._of_step()} that DataParallel.commit did '
                "not make: its keys hold gradients, and the weights and the torch optimizer's state live in torch. "
                "Commit with dp.commit(step, extra, optimizer=opt), or start the job afresh"
            )
        # A restored key holds the weights in "optimizer" mode (pulled), the last sum of
        # gradients in "sum" mode (the weights are the commit's module state).
        pulled = range(len(self._keys)) if self.mode == "optimizer" else fresh
        with _torch.no_grad():
            values = [p.detach() for p in self._params]
            if fresh:
                store.init([self._keys[i] for i in fresh], [values[i] for i in fresh])
            if pulled:
                # A fresh key: rank 0's values won, every rank starts from them.
                store.pull([self._keys[i] for i in pulled], out=[values[i] for i in pulled])
        if self._state is not None:
            got = self.module.load_state_dict(self._state["module"], strict=False)
            # In "optimizer" mode the commit's module state leaves out the store's keys.
            missing = sorted(set(got.missing_keys) - set(self._names if self.mode == "optimizer" else ()))
            if missing or got.unexpected_keys:
                raise _kv.InvalidArgumentError(
                    f"the commit{self._of_step()} holds the state of another model: missing {missing}, "
                    f"unexpected {sorted(got.unexpected_keys)}"
                )

    def _of_step(self) -> str:
        """The restored commit's step, as the errors say it."""
        return "" if self._restored is None else f" (of step {self._restored.step})"

    def resume(self, optimizer: Any = None) -> Optional[_kv.Restored]:
        """Where the job resumes: ``Restored(step, extra)`` of the commit the store
        restored (`extra`: the program's own bytes given to :meth:`commit`), or ``None``
        on a fresh start. For a commit of :meth:`commit`, the first call also loads the
        torch optimizer's state into `optimizer` (required when the commit holds one,
        refused when it holds none) and torch's random generator's state; it comes before
        the first :meth:`synchronize`. The module's state is back already (the
        constructor put it back)."""
        state, self._state = self._state, None
        if state is not None:
            saved = state["optimizer"]
            if (saved is None) != (optimizer is None):
                self._state = state
                raise _kv.InvalidArgumentError(
                    f"the commit{self._of_step()} holds "
                    + (
                        "no torch optimizer state (dp.commit was given no optimizer): call dp.resume()"
                        if saved is None
                        else "the torch optimizer's state: pass the optimizer, dp.resume(opt)"
                    )
                )
            if optimizer is not None:
                optimizer.load_state_dict(saved)
            _torch.set_rng_state(state["rng"])
        return self._restored

    def commit(self, step: int, extra: bytes = b"", optimizer: Any = None) -> None:
        """Commits the store (:meth:`kvstore.KVStore.commit`, a collective under
        ``dist_sync``) with the torch state the job needs to go on with the same bits:
        the module's state (``"optimizer"`` mode: but the synchronized parameters, which
        are the store's keys), `optimizer`'s state (a torch optimizer, ``"sum"`` mode)
        and torch's random generator's, beside `extra`, the program's own bytes
        (:meth:`resume` gives them back). Call it after a step, not between
        ``backward()`` and :meth:`synchronize`."""
        if optimizer is not None and self.mode == "optimizer":
            raise _kv.InvalidArgumentError('mode="optimizer": the store holds the optimizer; commit with no optimizer')
        if self._pending:
            raise RuntimeError("commit() between backward() and synchronize(): commit after the step")
        module = self.module.state_dict()
        if self.mode == "optimizer":
            module = {k: v for k, v in module.items() if k not in set(self._names)}
        state = {
            "module": module,
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "rng": _torch.get_rng_state(),
        }
        self.store.commit(step, _pack(bytes(extra), state))

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
        if self._state is not None:
            raise RuntimeError(
                f"this store resumed a commit{self._of_step()} made by DataParallel.commit: call "
                "dp.resume(opt) (the torch optimizer's state, the random generator's) before the first step"
            )
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
