"""A drop-in store for Apache MXNet 1.9.1: ``import kvstore.mxnet`` makes
``mx.kv.create(name)`` (and so gluon's ``Trainer(..., kvstore=name)`` and
``Module.fit(..., kvstore=name)``) return this project's store for ``local``,
``device``, ``local_allreduce_cpu``, ``local_allreduce_device``, ``dist_sync``,
``dist_device_sync`` (``dist_sync_device``), ``dist`` and ``dist_async``
(``dist_async_device``, ``dist_device_async``)::

    import mxnet as mx
    import kvstore.mxnet

    kv = mx.kv.create("local")          # a kvstore.mxnet.KVStore
    kv.init(3, mx.nd.ones((2, 3)) * 2)
    a = mx.nd.zeros((2, 3))
    kv.pull(3, out=a)                    # written in place: a is 2

Every other name (``nccl``, ``teststore``, ...) stays MXNet's.
:func:`unregister` gives the names back to MXNet; :func:`native_create` makes MXNet's
own store whatever is registered.

The store (:class:`KVStore`) is an ``mx.kv.KVStore`` (a subclass with no native
handle), so gluon takes it for dense, sparse-gradient and row-sparse parameters
alike, and has every method and property of MXNet 1.9.1's ``mxnet.kvstore.KVStore``
with MXNet's signatures. Values and outs are ``mx.nd.NDArray`` and ``mx.np.ndarray`` arrays
on ``mx.cpu(i)`` (numpy arrays too), read and written in place through DLPack (each
call first waits for MXNet's pending writes to them).

- ``init``, ``push``, ``pull`` (``out`` is required, as in MXNet), ``pushpull`` and
  ``broadcast`` take MXNet's forms: one key, a list of keys, a key with a list of
  arrays, lists of lists, repeated keys. ``pull`` leaves a row-sparse out as it
  was, as MXNet does, unless ``ignore_sparse=False``; ``row_sparse_pull`` takes row
  ids of any shape (flattened, as in MXNet). A store's keys are ints or strs, the type
  of its first call's, as in MXNet: a key of the other type is MXNet's ``MXNetError``.
- ``_set_updater(fn)`` (and ``set_updater``, the same) calls ``fn(key, recv, stored)``
  as MXNet does: an int key as an int, a str key as ``bytes``; ``recv`` and ``stored``
  are ``mx.nd.NDArray`` views of the store's memory (also under ``npx.set_np()``, as
  in MXNet), so ``stored += recv * 2`` updates the key in place. They are valid
  during the call only. ``mx.optimizer.get_updater(opt)`` works as an updater (it runs
  MXNet's own Python optimizer), and ``save_optimizer_states`` then pickles its states
  as MXNet does.
- ``set_optimizer(opt)`` takes an ``mx.optimizer.Optimizer`` of the 16 kinds the store
  runs in Rust (SGD, ccSGD, NAG, Adam, AdaGrad, RMSProp, AdaDelta, Ftrl, Signum, SGLD,
  DCASGD, Adamax, Nadam, LAMB, LARS, FTML, LBSGD), with its hyper-parameters, its
  ``lr_scheduler`` (FactorScheduler, MultiFactorScheduler, PolyScheduler,
  CosineScheduler), ``multi_precision``, ``begin_num_update`` and the per-key
  ``lr_mult``/``wd_mult`` MXNet would use (``param_dict`` multipliers, as gluon sets
  them, ``set_lr_mult``/``set_wd_mult``, ``param_idx2name``). Later changes to the
  optimizer object (gluon's ``set_learning_rate``, ``rescale_grad`` for a new batch
  size, a parameter's ``lr_mult``) reach the store at the next push, with the
  optimizer's state kept. Any other MXNet optimizer (a user's own
  ``mx.optimizer.Optimizer`` subclass, ``Test``, a custom schedule, one that has
  already made updates itself) runs as MXNet's own Python update,
  ``mx.optimizer.get_updater(opt)``, set as the store's updater: as MXNet's local
  store runs it. Under ``dist_sync`` every worker runs it on the same sums in the
  same key order, so the replicas stay bit-identical when the optimizer's update is
  deterministic (one that draws random numbers must seed them alike on every
  worker); under ``dist_async`` each key's owner runs it. A kvstore.optimizer
  optimizer is taken as it is.
- ``save_optimizer_states``/``load_optimizer_states`` of an optimizer the store
  runs in Rust write and read the store's own state file (safetensors with JSON
  metadata), not MXNet's pickle; gluon's ``Trainer.save_states``/``load_states``
  work with it. The MXNet optimizer object itself makes no update: its
  ``num_update`` and the rate its ``learning_rate`` (gluon's
  ``trainer.learning_rate``) reports stay at their start, while the store counts.

Not supported, and why:

- arrays on ``mx.gpu(i)`` are a ``TypeError`` (copy them to ``mx.cpu()``); ``csr``
  NDArrays are a ``TypeError``. Row-sparse NDArrays work in ``init``, ``push`` and
  ``row_sparse_pull`` (their rows are copied at the boundary, not read in place).
- the ``handle`` attribute (MXNet's C handle) does not exist: the store is not
  MXNet's C++ one (so MXNet's profiler does not see it).

Where the results differ from MXNet's native store, the project's docs/mxnet-differences.md
says why: a push copies its values, shapes and dtypes are checked (a pull into an
out of another dtype converts, as in MXNet; a push must match), the updater runs in the order keys were first initialized (MXNet sorts int keys), and an
exception in an updater fails the push (MXNet prints it and goes on). The ``dist``
kinds need an MPI (``pip install "kvstore[mpi]"``) and ``mpirun``; ``_send_command_to_servers``
does nothing (there are no parameter servers).
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import mxnet as _mx  # type: ignore
import numpy as np
from mxnet.kvstore import KVStoreBase as _KVStoreBase  # type: ignore
from mxnet.kvstore.kvstore import KVStore as _NativeKVStore  # type: ignore

import kvstore as _kv
from kvstore import lr_scheduler as _sched
from kvstore import optimizer as _opt

__all__ = ["KVStore", "NAMES", "create", "native_create", "register", "unregister", "convert_optimizer", "resume"]

# The names registered in MXNet's kv_registry.
NAMES: Tuple[str, ...] = (
    "local",
    "device",
    "local_allreduce_cpu",
    "local_allreduce_device",
    "dist_sync",
    "dist_device_sync",
    "dist_sync_device",
    "dist",
    "dist_async",
    "dist_async_device",
    "dist_device_async",
)


def _to_mx(view: Any) -> Any:
    """An MXNet array over `view`'s memory (a numpy view of the store's), no copy."""
    try:
        nd = _mx.nd.from_dlpack(view.__dlpack__())
    except Exception:  # a dtype numpy does not export through DLPack (bool on numpy 1.x)
        nd = _mx.nd.from_numpy(view, zero_copy=True)
    return nd


def _check_arrays(obj: Any) -> None:
    """MXNet's csr arrays are refused with a clear message (row-sparse ones are
    converted by :func:`_values`, where a call takes them)."""
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _check_arrays(o)
        return
    stype = getattr(obj, "stype", "default")
    if stype not in ("default", "row_sparse"):
        raise _kv.ArgumentTypeError(f"a {stype} NDArray is not supported: use .tostype('default') or .tostype('row_sparse')")


def _has_row_sparse(obj: Any) -> bool:
    if isinstance(obj, (list, tuple)):
        return any(_has_row_sparse(o) for o in obj)
    return getattr(obj, "stype", "default") == "row_sparse"


def _values(obj: Any) -> Any:
    """A call's values with MXNet's row-sparse arrays as the store's (their data and
    indices copied); the same object when it has none."""
    _check_arrays(obj)
    if not _has_row_sparse(obj):
        return obj

    def convert(o: Any) -> Any:
        if isinstance(o, (list, tuple)):
            return [convert(x) for x in o]
        if getattr(o, "stype", "default") == "row_sparse":
            return _kv.sparse.row_sparse_array((o.data.asnumpy(), o.indices.asnumpy()), shape=o.shape)
        return o

    return convert(obj)


class _NotRowSparseOut(_kv.ArgumentTypeError, _mx.base.MXNetError):
    """A dense out given to ``row_sparse_pull``: MXNet's ``MXNetError`` (which its
    code catches) and the package's ``ArgumentTypeError``."""


class _DistIgnoreSparse(_kv.UnsupportedError, _mx.base.MXNetError):
    """``pull(..., ignore_sparse=False)`` on a ``dist`` store: MXNet's ``MXNetError``
    and the package's ``UnsupportedError``."""


class _MixedKeyTypes(_kv.ArgumentTypeError, _mx.base.MXNetError):
    """A key of the other type than the store's keys: MXNet's ``MXNetError`` ("Mixed
    key types are not allowed") and the package's ``ArgumentTypeError``."""


def _key_type(key: Any) -> type:
    """``str`` or ``int``: the type of a call's keys (MXNet's ``_ctype_key_value``
    refuses a list that mixes them)."""
    keys = key if isinstance(key, (list, tuple)) else (key,)
    types = {str if isinstance(k, str) else int for k in keys}
    if len(types) > 1:
        raise _MixedKeyTypes(f"inconsistent types of keys detected: {list(keys)!r}")
    return types.pop() if types else int


def _assign(out: Any, value: np.ndarray) -> None:
    """Writes `value` into `out` converted to the out's dtype, as MXNet's copy does."""
    if isinstance(out, np.ndarray):
        np.copyto(out, value, casting="unsafe")
    else:
        out[:] = value


def _pairs(key: Any, out: Any) -> List[Tuple[Any, Any]]:
    """A call's (key, array) pairs in MXNet's forms (``_ctype_key_value``): one key and
    an array or a list of them; a list of keys, each with an array or a list."""
    if isinstance(key, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(key):
            got = len(out) if isinstance(out, (list, tuple)) else 1
            raise _kv.LengthMismatchError(f"pull: {len(key)} keys and {got} outs", None, len(key), got)
        return [p for k, o in zip(key, out) for p in _pairs(k, o)]
    if isinstance(out, (list, tuple)):
        return [(key, o) for o in out]
    return [(key, out)]


class _OptimizerUpdater:
    """What ``KVStore._updater`` holds after ``set_optimizer`` of an MXNet optimizer:
    gluon's ``Trainer.load_states`` reads ``kvstore._updater.optimizer``."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer


class KVStore(_NativeKVStore):
    """This project's store with MXNet 1.9.1's ``mxnet.kvstore.KVStore`` interface
    (see the module's documentation). Made by ``mx.kv.create(name)`` once
    ``kvstore.mxnet`` is imported, or by :func:`create`.

    It is an ``mx.kv.KVStore`` (a subclass that overrides every method and property,
    and has no MXNet handle): gluon's ``Trainer`` takes only those for sparse
    gradients."""

    # The type of the store's keys, int or str, fixed by its first call as in MXNet.
    _keys_are: Optional[type] = None

    def __init__(self, name: str = "local") -> None:
        # MXNet's __init__ takes a native handle: this store has none.
        self._kv = _kv.create(name)
        # MXNet's: the updater set (set_optimizer: an object with .optimizer).
        self._updater: Any = None
        # An MXNet optimizer set with set_optimizer, and the JSON last installed for it.
        self._mx_optimizer: Any = None
        self._installed: Any = None
        self._scheduler_lr: Optional[float] = None
        self._sync_lock = threading.Lock()
        # The keys of the commit this store resumed (kvstore-run, docs/recovery.md) that no
        # init or broadcast has named yet: the first that names one adopts it.
        self._restored_keys = {str(k) for k in self._kv.keys()} if self._kv.restored() is not None else set()

    def __del__(self) -> None:
        # MXNet's frees its native handle; the store frees itself.
        pass

    # -- the calls -------------------------------------------------------------

    def init(self, key: Any, value: Any) -> None:
        """Initializes a key (or list of keys) with a copy of its value (MXNet's ``init``).
        On a store that resumed a commit, a key the commit holds keeps the commit's value
        (the first init of it is skipped, see :meth:`commit`)."""
        self._check_keys(key)
        if self._restored_keys:
            call = self._adopt(key, value)
            if call is None:
                return
            key, value = call
        self._kv.init(key, _values(value))

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Pushes values (MXNet's ``push``): each key's values are summed, then the
        optimizer or updater merges the sum, or it replaces the stored value."""
        self._check_keys(key)
        value = _values(value)
        self._sync_optimizer()
        self._kv.push(key, value, priority)

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Pulls the stored values into `out`, written in place (MXNet's ``pull``:
        `out` is required).

        A row-sparse out is left as it was (MXNet's ``ignore_sparse=True``: pull its
        rows with ``row_sparse_pull``); with ``ignore_sparse=False`` it becomes the
        key's whole value, its non-zero rows stored. A ``dist`` store refuses
        ``ignore_sparse=False``, as MXNet's does."""
        assert out is not None, "pull needs out= (the arrays to write), as MXNet's pull does"
        self._check_keys(key)
        if not ignore_sparse and "dist" in self.type:
            raise _DistIgnoreSparse("dist kvstore pull doesn't support ignore_sparse=False")
        _check_arrays(out)
        if not _has_row_sparse(out):
            self._pull_cast(key, out, priority, ignore_sparse=ignore_sparse)
            return
        keys, outs, sparse = [], [], []
        for k, o in _pairs(key, out):
            if getattr(o, "stype", "default") != "row_sparse":
                keys.append(k)
                outs.append(o)
            elif not ignore_sparse:
                # Pulled dense, with the dense outs (one call: checked before any out
                # changes), then stored into the row-sparse out.
                dense = np.zeros(o.shape, dtype=o.dtype)
                keys.append(k)
                outs.append(dense)
                sparse.append((o, dense))
            else:
                warnings.warn(
                    f"pull of key {k!r}: a row-sparse out is left as it was (ignore_sparse=True, as in MXNet): "
                    "pull its rows with row_sparse_pull",
                    stacklevel=2,
                )
        if keys:
            self._pull_cast(keys, outs, priority)
        with _mx.autograd.pause():
            for o, dense in sparse:
                _mx.nd.array(dense, ctx=o.context, dtype=o.dtype).tostype("row_sparse").copyto(o)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        """Pushes `value` and pulls the result into `out` (MXNet's ``pushpull``); with
        no `out`, into the pushed arrays."""
        self._check_keys(key)
        _check_arrays(value)
        if out is not None:
            _check_arrays(out)
        self._sync_optimizer()
        self._kv.pushpull(key, value, out=out, priority=priority)

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        """Initializes the keys with `value` and pulls them into `out` (MXNet's
        ``broadcast``). On a store that resumed a commit, a key the commit holds is
        pulled into its outs instead (see :meth:`commit`)."""
        self._check_keys(key)
        if self._restored_keys:
            call = self._adopt(key, value, out, priority=priority)
            if call is None:
                return
            key, value, out = call
        _check_arrays(value)
        _check_arrays(out)
        self._kv.broadcast(key, value, out, priority)

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> None:
        """Pulls the rows `row_ids` of a row-sparse key into `out`, MXNet row-sparse
        arrays (MXNet's ``row_sparse_pull``: the forms of
        :meth:`kvstore.KVStore.row_sparse_pull`). The rows are pulled into the store's
        row-sparse arrays, then copied into the outs (converted to their dtype, as
        MXNet does)."""
        assert out is not None, "row_sparse_pull needs out="
        assert row_ids is not None, "row_sparse_pull needs row_ids="
        self._check_keys(key)
        dtypes: Dict[str, Any] = {}

        def mirror(k: Any, o: Any) -> Any:
            if isinstance(o, (list, tuple)):
                many = isinstance(k, (list, tuple)) and len(k) == len(o)
                keys = k if many else [k] * len(o)
                return [mirror(kk, x) for kk, x in zip(keys, o)]
            if getattr(o, "stype", "default") != "row_sparse":
                raise _NotRowSparseOut(
                    "Expected row_sparse storage type for row_sparse_pull values, "
                    f"but detected storage type {getattr(o, 'stype', type(o).__name__)}"
                )
            return _kv.sparse.zeros("row_sparse", o.shape, dtype=dtypes.get(str(k), o.dtype))

        outs = self._cast_retry(
            dtypes,
            lambda: mirror(key, out),
            lambda outs: self._kv.row_sparse_pull(key, out=outs, priority=priority, row_ids=row_ids),
        )

        def copy_back(mine: Any, theirs: Any) -> None:
            if isinstance(mine, list):
                for m, t in zip(mine, theirs):
                    copy_back(m, t)
                return
            got = _mx.nd.sparse.row_sparse_array(
                (mine.data, mine.indices), shape=mine.shape, dtype=theirs.dtype, ctx=theirs.context
            )
            got.copyto(theirs)

        # gluon pulls a row-sparse weight's rows inside autograd.record() (its
        # SparseEmbedding's forward); MXNet's pull writes them outside the graph.
        with _mx.autograd.pause():
            copy_back(outs, out)

    def _check_keys(self, key: Any) -> None:
        """MXNet's rule: a store's keys are all ints or all strs, the type of its first
        call's keys (the native store takes both: ``3`` is ``"3"``)."""
        kind = _key_type(key)
        if self._keys_are is None:
            self._keys_are = kind
        elif kind is not self._keys_are:
            raise _MixedKeyTypes(
                f"key {key!r}: this store's keys are {self._keys_are.__name__}s, and mixed key types are not allowed"
            )

    @staticmethod
    def _cast_retry(dtypes: Dict[str, Any], make: Callable[[], Any], call: Callable[[Any], Any]) -> Any:
        """Runs ``call(make())`` where `make` builds the outs to pull into, each of the
        dtype in `dtypes` (str(key) to the key's dtype) or else the caller's out's. The
        store refuses an out of another dtype than its key's before any out changes: the
        key's dtype is then noted and the call made again, as many times as keys differ.
        Returns the outs pulled into."""
        while True:
            outs = make()
            try:
                call(outs)
                return outs
            except _kv.DTypeMismatchError as e:
                if e.key is None or str(e.key) in dtypes:
                    raise
                dtypes[str(e.key)] = np.dtype(e.expected)

    def _pull_cast(self, key: Any, out: Any, priority: int, **kwargs: Any) -> None:
        """A dense pull into `out`; an out of another dtype than its key's is pulled
        into an array of the key's dtype, then converted into it, as MXNet's pull does
        (the native store refuses it)."""
        try:
            self._kv.pull(key, out=out, priority=priority, **kwargs)
            return
        except _kv.DTypeMismatchError:
            pass
        pairs = _pairs(key, out)
        dtypes: Dict[str, Any] = {}

        def make() -> List[Any]:
            return [o if str(k) not in dtypes else np.empty(o.shape, dtypes[str(k)]) for k, o in pairs]

        keys = [k for k, _ in pairs]
        pulled = self._cast_retry(dtypes, make, lambda outs: self._kv.pull(keys, out=outs, priority=priority, **kwargs))
        with _mx.autograd.pause():
            for (_, o), p in zip(pairs, pulled):
                if p is not o:
                    _assign(o, p)

    def set_gradient_compression(self, compression_params: Dict[str, Any]) -> None:
        """MXNet's 2-bit compression (``{"type": "2bit", "threshold": 0.5}``) on a
        ``device`` store, as :meth:`kvstore.KVStore.set_gradient_compression`; on
        ``local`` MXNet's own ``Exception``."""
        if "device" not in self.type and "dist" not in self.type:
            raise _kv.UnsupportedError("Gradient compression is not supported for this type of kvstore")
        self._kv.set_gradient_compression(compression_params)

    # -- updaters and optimizers -----------------------------------------------

    def _set_updater(self, updater: Optional[Callable[[Any, Any, Any], None]]) -> None:
        """Calls ``updater(key, recv, stored)`` on every push from now on, as MXNet
        does: an int key as an int, a str key as ``bytes``; `recv` and `stored` are
        MXNet arrays over the store's memory, valid during the call."""
        if updater is None:
            self._kv.set_updater(None)
            self._updater = None
            self._mx_optimizer = self._installed = None
            return
        if not callable(updater):
            raise _kv.ArgumentTypeError(f"an updater must be callable as fn(key, recv, stored), not a {type(updater).__name__}")

        def call(key: Any, recv: Any, stored: Any) -> None:
            if isinstance(key, str):
                key = key.encode()
            r, s = _to_mx(recv), _to_mx(stored)
            updater(key, r, s)
            # MXNet computes lazily: its writes to `stored` are done before the
            # store's memory is used again.
            s.wait_to_read()
            r.wait_to_read()

        self._kv.set_updater(call)
        self._updater = updater
        self._mx_optimizer = self._installed = None

    def set_updater(self, updater: Optional[Callable[[Any, Any, Any], None]]) -> None:
        """``_set_updater`` (MXNet 1.9.1 has only the underscored name)."""
        self._set_updater(updater)

    def set_optimizer(self, optimizer: Any) -> None:
        """Runs `optimizer` on every push from now on: an ``mx.optimizer.Optimizer``
        of the 16 kinds the store has runs in the store, in Rust (mapped with its
        hyper-parameters, schedule and multipliers: see :func:`convert_optimizer`); any
        other MXNet optimizer (a user's own subclass, ``Test``, a schedule the store
        does not have, one that has already made updates) runs as MXNet's own Python
        update, ``mx.optimizer.get_updater(optimizer)``, as the updater of the store
        (on every worker of a ``dist_sync`` job, on each key's owner under
        ``dist_async``); a ``kvstore.optimizer`` optimizer is taken as it is."""
        if isinstance(optimizer, _opt.Optimizer):
            self._kv.set_optimizer(optimizer)
            self._updater = _OptimizerUpdater(optimizer)
            self._mx_optimizer = self._installed = None
            return
        try:
            described = _describe(optimizer, True, None)
        except _NotInStore:
            self._set_updater(_mx.optimizer.get_updater(optimizer))
            return
        converted = described.build()
        with self._sync_lock:
            self._kv.set_optimizer(converted)
            self._updater = _OptimizerUpdater(optimizer)
            self._mx_optimizer = optimizer
            self._installed = described.key
            # With a schedule the rate cannot be set again (MXNet's set_learning_rate
            # refuses), but reading it moves the schedule's base_lr: kept as it is now.
            self._scheduler_lr = converted.learning_rate if optimizer.lr_scheduler is not None else None

    def _sync_optimizer(self) -> None:
        """Installs the MXNet optimizer's hyper-parameters again if they changed since
        (a new learning rate, rescale_grad, multiplier), keeping every key's state."""
        opt = self._mx_optimizer
        if opt is None:
            return
        described = _describe(opt, False, self._scheduler_lr)
        if described.key == self._installed:
            return
        with self._sync_lock:
            if described.key == self._installed:
                return
            converted = described.build()
            fd, path = tempfile.mkstemp(prefix="kvstore-mxnet-", suffix=".states")
            os.close(fd)
            try:
                self._kv.save_optimizer_states(path)
                self._kv.set_optimizer(converted)
                self._kv.load_optimizer_states(path)
            finally:
                os.unlink(path)
            self._installed = described.key

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Writes the optimizer's states to `fname`: the store's state file for an
        optimizer of ``set_optimizer``; the updater's pickled states (MXNet's format)
        for an ``mx.optimizer.get_updater`` updater."""
        assert self._updater is not None, "Cannot save states for distributed training"
        if isinstance(self._updater, _OptimizerUpdater):
            self._sync_optimizer()
            self._kv.save_optimizer_states(fname, dump_optimizer)
            return
        if not hasattr(self._updater, "get_states"):
            raise _kv.ArgumentTypeError("save_optimizer_states: the updater set has no get_states() (set an optimizer)")
        with open(fname, "wb") as fout:
            fout.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname: str) -> None:
        """Loads a file written by ``save_optimizer_states``."""
        assert self._updater is not None, "Cannot load states for distributed training"
        if isinstance(self._updater, _OptimizerUpdater):
            self._sync_optimizer()
            self._kv.load_optimizer_states(fname)
            return
        if not hasattr(self._updater, "set_states"):
            raise _kv.ArgumentTypeError("load_optimizer_states: the updater set has no set_states() (set an optimizer)")
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())

    # -- commits: resuming a job ------------------------------------------------

    def commit(self, step: int, extra: bytes = b"") -> None:
        """Commits the whole store (:meth:`kvstore.KVStore.commit`: every key, the
        optimizer and its state, `step` and `extra`, your own bytes) into memory that
        outlives the process, for ``kvstore-run`` to resume the job from
        (docs/recovery.md). Under ``dist_sync`` a collective, like ``barrier``.

        A gluon program commits the store it gave its ``Trainer`` (``kv =
        mx.kv.create(...)``, ``Trainer(..., kvstore=kv)``) after ``trainer.step``, and
        reads ``kv.restored()`` (or calls :func:`resume`) to know where to start.
        Resumed, it makes the calls of a fresh start: the Trainer's ``set_optimizer`` of
        the same optimizer keeps the commit's (and its state), and its ``init`` and
        ``broadcast`` of a key the commit holds adopt it (``broadcast`` pulls the
        commit's weights into the parameters; a ``Trainer`` made with this store pulls
        them when it is made, before the first forward pass). This needs
        ``update_on_kvstore=True``: with False the weights and the optimizer live in
        MXNet, and ``broadcast`` of a restored key raises ``ValueError``."""
        self._sync_optimizer()
        self._kv.commit(step, extra)

    def restored(self) -> Optional["_kv.Restored"]:
        """``Restored(step, extra)`` of the commit this store resumed from, or ``None``
        (:meth:`kvstore.KVStore.restored`)."""
        return self._kv.restored()

    def _adopt(self, key: Any, value: Any, out: Any = None, priority: Optional[int] = None) -> Optional[Tuple[Any, ...]]:
        """``init`` (no `priority`) or ``broadcast`` of a resumed store: adopts the keys of
        the call that the commit holds and no call named yet (``broadcast`` pulls each
        into its outs), and returns the call's arguments for the other keys, or None
        when none is left."""
        many = isinstance(key, (list, tuple))
        keys = list(key) if many else [key]
        columns = [value] if priority is None else [value, out]
        if many and any(not isinstance(c, (list, tuple)) or len(c) != len(keys) for c in columns):
            return (key, *columns)  # the store says what is wrong
        rows = list(zip(keys, *[list(c) if many else [c] for c in columns]))
        adopted = {str(k) for k in keys} & self._restored_keys
        if not adopted:
            return (key, *columns)
        if priority is not None:
            if self._updater is None:
                raise _kv.InvalidArgumentError(
                    f"broadcast of key {sorted(adopted)[0]!r}: this store resumed a commit, whose keys hold the last "
                    "sums of gradients, not weights, for the store has no optimizer (update_on_kvstore=False "
                    "keeps the weights and the optimizer in MXNet): a commit resumes update_on_kvstore=True only"
                )
            for k, _, o in rows:
                if str(k) in adopted:
                    self.pull(k, out=o, priority=priority)
        self._restored_keys -= adopted
        rest = [r for r in rows if str(r[0]) not in adopted]
        if not rest:
            return None
        return tuple(list(c) for c in zip(*rest))

    # -- properties and the rest ---------------------------------------------

    def is_capable(self, capability: str) -> bool:
        """Whether the store can do `capability`: ``"optimizer"`` is ``True``; any
        other is MXNet's ``ValueError``."""
        if capability.lower() == _KVStoreBase.OPTIMIZER:
            return True
        raise _kv.InvalidArgumentError("Unknown capability: {}".format(capability))

    @property
    def type(self) -> str:
        """The store's kind, as given to ``create`` (lower-cased by MXNet)."""
        return self._kv.type

    @property
    def rank(self) -> int:
        """This worker's rank (0 outside ``dist_sync``)."""
        return self._kv.rank

    @property
    def num_workers(self) -> int:
        """The number of workers (1 outside ``dist_sync``)."""
        return self._kv.num_workers

    def _barrier(self) -> None:
        """Waits until every worker reached this barrier (at once with one worker)."""
        self._kv.barrier()

    def barrier(self) -> None:
        """``_barrier``."""
        self._kv.barrier()

    def _send_command_to_servers(self, head: int, body: str) -> None:
        """Does nothing: the store has no parameter servers (MXNet's local store does
        nothing either)."""

    @property
    def store(self) -> "_kv.KVStore":
        """The underlying :class:`kvstore.KVStore` (numpy views, ``push_async``, ...)."""
        return self._kv

    def __repr__(self) -> str:
        return f"<kvstore.mxnet.KVStore type={self.type!r} rank={self.rank} num_workers={self.num_workers}>"


# -- optimizers -----------------------------------------------------------------


def _optimizer_table() -> Dict[type, Tuple[str, List[Tuple[str, str]]]]:
    """Each MXNet optimizer class the store runs: its registry name, and its own
    hyper-parameters as (the store's name, the MXNet attribute)."""
    o = _mx.optimizer

    def same(*names: str) -> List[Tuple[str, str]]:
        return [(n, n) for n in names]

    sgd = same("momentum", "lazy_update")
    return {
        o.SGD: ("sgd", sgd),
        o.ccSGD: ("sgd", sgd),
        o.NAG: ("nag", same("momentum")),
        o.Adam: ("adam", same("beta1", "beta2", "epsilon", "lazy_update")),
        o.AdaGrad: ("adagrad", [("eps", "float_stable_eps")]),
        o.RMSProp: ("rmsprop", same("gamma1", "gamma2", "epsilon", "centered", "clip_weights")),
        o.AdaDelta: ("adadelta", same("rho", "epsilon")),
        o.Ftrl: ("ftrl", same("lamda1", "beta")),
        o.Signum: ("signum", same("momentum", "wd_lh")),
        o.SGLD: ("sgld", []),
        o.DCASGD: ("dcasgd", same("momentum", "lamda")),
        o.Adamax: ("adamax", same("beta1", "beta2")),
        o.Nadam: ("nadam", same("beta1", "beta2", "epsilon", "schedule_decay")),
        o.LAMB: ("lamb", same("beta1", "beta2", "epsilon", "lower_bound", "upper_bound", "bias_correction")),
        o.LARS: ("lars", same("momentum", "eta", "eps", "momentum_correction", "lazy_update")),
        o.FTML: ("ftml", same("beta1", "beta2", "epsilon")),
        o.LBSGD: (
            "lbsgd",
            same("momentum", "warmup_strategy", "warmup_epochs", "batch_scale", "updates_per_epoch"),
        ),
    }


class _NotInStore(Exception):
    """An MXNet optimizer the store cannot run as MXNet would (``set_optimizer`` then
    runs MXNet's Python update instead)."""


class _NotInStoreType(_NotInStore, _kv.ArgumentTypeError):
    """A class (of optimizer or schedule) the store does not have."""


class _NotInStoreValue(_NotInStore, _kv.InvalidArgumentError):
    """An optimizer or schedule whose progress cannot be carried into the store."""


# Hyper-parameters that are switches (MXNet takes any truthy value).
_BOOL_PARAMS = ("lazy_update", "centered", "bias_correction", "momentum_correction")


def _convert_scheduler(s: Any, check_fresh: bool) -> Tuple[_sched.LRScheduler, float]:
    """The store's schedule for an MXNet schedule, and the learning rate MXNet uses
    with it (its current ``base_lr``, which the optimizer's learning_rate replaced).
    Reads only the fields a schedule never changes, but for that ``base_lr``."""
    m = _mx.lr_scheduler
    # The rate the schedule was made with: MXNet's warm-up (and poly and cosine decay)
    # start from it even when the optimizer's learning_rate replaced base_lr.
    warm = dict(
        base_lr=float(s.warmup_final_lr),
        warmup_steps=int(s.warmup_steps),
        warmup_begin_lr=float(s.warmup_begin_lr),
        warmup_mode=s.warmup_mode,
    )
    t = type(s)
    if t is m.FactorScheduler:
        if check_fresh and s.count != 0:
            raise _NotInStoreValue("the FactorScheduler has already advanced (count > 0): pass a fresh schedule")
        out: _sched.LRScheduler = _sched.FactorScheduler(
            step=int(s.step), factor=float(s.factor), stop_factor_lr=float(s.stop_factor_lr), **warm
        )
    elif t is m.MultiFactorScheduler:
        if check_fresh and s.cur_step_ind != 0:
            raise _NotInStoreValue("the MultiFactorScheduler has already advanced: pass a fresh schedule")
        out = _sched.MultiFactorScheduler(step=[int(x) for x in s.step], factor=float(s.factor), **warm)
    elif t is m.PolyScheduler:
        warm["base_lr"] = float(s.base_lr_orig)
        out = _sched.PolyScheduler(max_update=int(s.max_update), pwr=float(s.power), final_lr=float(s.final_lr), **warm)
    elif t is m.CosineScheduler:
        warm["base_lr"] = float(s.base_lr_orig)
        out = _sched.CosineScheduler(max_update=int(s.max_update), final_lr=float(s.final_lr), **warm)
    else:
        raise _NotInStoreType(
            f"lr_scheduler {t.__module__}.{t.__qualname__} cannot run in the store: it runs MXNet's "
            "FactorScheduler, MultiFactorScheduler, PolyScheduler and CosineScheduler"
        )
    return out, float(s.base_lr)


def _multipliers(opt: Any, which: str) -> Dict[str, float]:
    """Per-key multipliers as MXNet's ``_get_lrs``/``_get_wds`` find them, keyed by
    the store's key (``str(index)``)."""
    mults = opt.lr_mult if which == "lr" else opt.wd_mult
    attr = "lr_mult" if which == "lr" else "wd_mult"
    indices: List[Any] = list(opt.param_dict) + list(mults) + list(opt.idx2name)
    out: Dict[str, float] = {}
    for index in indices:
        if index in opt.param_dict:
            m = getattr(opt.param_dict[index], attr)
        elif index in mults:
            m = mults[index]
        elif index in opt.idx2name:
            m = mults.get(opt.idx2name[index], 1.0)
        else:
            continue
        out.setdefault(str(index), float(m))
    return {k: v for k, v in out.items() if v != 1.0}


def convert_optimizer(optimizer: Any, check_fresh: bool = True, scheduler_lr: Optional[float] = None) -> _opt.Optimizer:
    """The ``kvstore.optimizer`` optimizer that runs `optimizer` (an
    ``mx.optimizer.Optimizer``) as MXNet would: its class's registry name, its
    hyper-parameters, schedule, ``multi_precision``, ``begin_num_update`` and per-key
    multipliers. Raises ``TypeError`` for an optimizer or schedule the store does not
    have, and (with `check_fresh`) ``ValueError`` for one that has already made
    updates itself (its update counts and states stay in MXNet). `scheduler_lr`, with
    a schedule, is the learning rate to use instead of the schedule's ``base_lr``
    (which MXNet changes when its ``learning_rate`` is read)."""
    return _describe(optimizer, check_fresh, scheduler_lr).build()


def _describe(optimizer: Any, check_fresh: bool, scheduler_lr: Optional[float]) -> "_Description":
    """`optimizer` as plain data (see :func:`convert_optimizer`)."""
    if not isinstance(optimizer, _mx.optimizer.Optimizer):
        raise _kv.ArgumentTypeError(
            f"set_optimizer takes an mx.optimizer.Optimizer (or a kvstore.optimizer one), not {type(optimizer).__name__}"
        )
    table = _optimizer_table()
    entry = table.get(type(optimizer))
    if entry is None:
        t = type(optimizer)
        names = ", ".join(sorted({c.__name__ for c in table}))
        raise _NotInStoreType(
            f"optimizer {t.__module__}.{t.__qualname__} cannot run in the store: it runs MXNet's {names} "
            "(set_optimizer runs another one as MXNet's Python update, mx.optimizer.get_updater(opt))"
        )
    name, own = entry
    if check_fresh and (optimizer.num_update != optimizer.begin_num_update or any(optimizer._all_index_update_counts.values())):
        raise _NotInStoreValue(
            f"the {type(optimizer).__name__} optimizer has already made updates: its update counts and states "
            "cannot be carried into the store; pass a fresh optimizer"
        )
    if name == "nadam" and check_fresh and optimizer.m_schedule != 1.0:
        raise _NotInStoreValue("the Nadam optimizer's momentum schedule has advanced: pass a fresh optimizer")
    if name == "dcasgd" and check_fresh and optimizer.weight_previous:
        raise _NotInStoreValue("the DCASGD optimizer holds previous weights: pass a fresh optimizer")
    params: Dict[str, Any] = {}
    scheduler = None
    if optimizer.lr_scheduler is not None:
        scheduler, lr = _convert_scheduler(optimizer.lr_scheduler, check_fresh)
        if scheduler_lr is not None:
            lr = scheduler_lr
    else:
        lr = optimizer.lr
    params["learning_rate"] = float(lr)
    params["wd"] = float(optimizer.wd)
    params["rescale_grad"] = float(optimizer.rescale_grad)
    if optimizer.clip_gradient is not None:
        params["clip_gradient"] = float(optimizer.clip_gradient)
    params["multi_precision"] = bool(optimizer.multi_precision)
    params["begin_num_update"] = int(optimizer.begin_num_update)
    for ours, theirs in own:
        v = getattr(optimizer, theirs)
        if v is None:
            continue
        params[ours] = bool(v) if ours in _BOOL_PARAMS else (v if isinstance(v, str) else float(v))
    if name == "lbsgd" and optimizer.updates_per_epoch:
        # MXNet keeps begin_epoch only as the count it starts from.
        params["begin_epoch"] = float(optimizer.init_updates // optimizer.updates_per_epoch)
    return _Description(name, params, scheduler, _multipliers(optimizer, "lr"), _multipliers(optimizer, "wd"))


class _Description:
    """An MXNet optimizer as plain data (compared cheaply before each push)."""

    def __init__(
        self,
        name: str,
        params: Dict[str, Any],
        scheduler: Optional[_sched.LRScheduler],
        lr_mult: Dict[str, float],
        wd_mult: Dict[str, float],
    ) -> None:
        self.name, self.params, self.scheduler = name, params, scheduler
        self.key = (name, params, scheduler._spec() if scheduler is not None else None, lr_mult, wd_mult)

    def build(self) -> _opt.Optimizer:
        converted = _opt.create(self.name, lr_scheduler=self.scheduler, **self.params)
        lr_mult, wd_mult = self.key[3], self.key[4]
        if lr_mult:
            converted.set_lr_mult(lr_mult)
        if wd_mult:
            converted.set_wd_mult(wd_mult)
        return converted


# -- resuming a gluon job -----------------------------------------------------------


def resume(trainer: Any, batch_size: int) -> Optional["_kv.Restored"]:
    """Starts gluon's `trainer` as its first ``step(batch_size)`` does, before the first
    forward pass, and returns ``Restored(step, extra)`` of the commit its store resumed
    from, or ``None`` (a fresh start, where it changes no bit of the training): the
    Trainer sets the store's optimizer (the commit's is kept, with its state) and
    adopts the store's keys, whose weights are pulled into the parameters, so that the
    first forward pass uses the commit's weights (gluon's Trainer does this at its first
    ``step``, after that pass). A Trainer made with a store object
    (``Trainer(..., kvstore=kv)``) that resumed a commit pulls the commit's weights
    when it is made, so there this call is optional; a Trainer given a store's name
    makes its store here. Parameters whose initialization is deferred (a layer made
    without ``in_units``) are left to the first ``step``: give them their shapes."""
    trainer._check_and_rescale_grad(trainer._scale / batch_size)
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    store = trainer._kvstore
    if not isinstance(store, KVStore):
        raise _kv.ArgumentTypeError(
            f"resume: the trainer's store is {type(store).__name__}, not kvstore.mxnet's (gluon uses no store for one "
            "device of a local kind): pass it one, Trainer(..., kvstore=mx.kv.create(name))"
        )
    return store.restored()


def _pull_restored_weights(trainer: Any) -> None:
    """A gluon Trainer made with a store that resumed a commit with an optimizer (its
    keys are the weights): pulls the commit's weights into the parameters now, before
    the first forward pass (gluon pulls them at its first ``step``, after that pass)."""
    store = trainer._kvstore_params.get("kvstore")
    if not isinstance(store, KVStore) or not store._restored_keys or store._kv.optimizer is None:
        return
    for param in trainer._params:
        index = trainer._param2idx[param.name]
        if str(index) in store._restored_keys and param._data is not None and param._stype == "default":
            store.pull(index, out=param.list_data())


def _trainer_init(init: Callable[..., None]) -> Callable[..., None]:
    """gluon's ``Trainer.__init__``, then :func:`_pull_restored_weights`."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _pull_restored_weights(self)

    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    __init__.__doc__ = init.__doc__
    return __init__


_mx.gluon.Trainer.__init__ = _trainer_init(_mx.gluon.Trainer.__init__)


# -- creation and the registry ----------------------------------------------------


def create(name: str = "local") -> KVStore:
    """A new store of kind `name` with MXNet's interface (what ``mx.kv.create(name)``
    returns for the registered names)."""
    if not isinstance(name, str):
        raise _kv.ArgumentTypeError("name must be a string")
    return KVStore(name.lower())


def native_create(name: str = "local") -> Any:
    """MXNet's own native store of kind `name` (``mxnet.kvstore.KVStore``), whatever
    the registry holds: what ``mx.kv.create`` does for a name not registered."""
    from mxnet.base import _LIB, KVStoreHandle, c_str, check_call  # type: ignore
    from mxnet.kvstore.kvstore import KVStore as NativeKVStore  # type: ignore

    if not isinstance(name, str):
        raise _kv.ArgumentTypeError("name must be a string")
    handle = KVStoreHandle()
    check_call(_LIB.MXKVStoreCreate(c_str(name.lower()), ctypes.byref(handle)))
    return NativeKVStore(handle)


def _store_class(name: str) -> type:
    """A subclass whose ``__name__`` is `name` (MXNet's registry key is the class's
    lower-cased name, and ``mx.kv.create`` calls it with no argument)."""

    def __init__(self: KVStore) -> None:
        KVStore.__init__(self, name)

    return type(
        name,
        (KVStore,),
        {"__init__": __init__, "__module__": __name__, "__doc__": f"The ``{name}`` store (``mx.kv.create('{name}')``)."},
    )


_CLASSES: Dict[str, type] = {name: _store_class(name) for name in NAMES}


def register() -> None:
    """Registers the store in MXNet's ``KVStoreBase.kv_registry`` for :data:`NAMES`
    (done when the module is imported)."""
    for name, cls in _CLASSES.items():
        _KVStoreBase.kv_registry[name] = cls


def unregister() -> None:
    """Gives :data:`NAMES` back to MXNet's native stores."""
    for name, cls in _CLASSES.items():
        if _KVStoreBase.kv_registry.get(name) is cls:
            del _KVStoreBase.kv_registry[name]


register()
