"""kvstore: MXNet's KVStore, rebuilt in Rust, with MXNet's Python API.

A key-value store for data-parallel training: ``init`` parameters, ``push``
gradients from every device (the store sums them, then applies an optimizer or an
updater), and ``pull`` the new weights back to every device::

    import numpy as np
    import kvstore as kv

    store = kv.create("local")
    shape = (2, 3)
    store.init(3, np.ones(shape) * 2)
    a = np.zeros(shape)
    store.pull(3, out=a)                  # a is 2
    store.push(3, [np.ones(shape)] * 4)   # summed: 4
    store.pull(3, out=a)                  # a is 4

Arrays are numpy arrays, or anything with ``__dlpack__`` on the host (PyTorch, JAX,
MXNet's NDArray): the store reads pushed values where they are and pulls straight into
the caller's arrays, with no copy at the boundary. Keys are ints or strings (``3`` is
the key ``"3"``). Every call that waits releases the GIL.

Store kinds: ``local`` (and MXNet's other single-process names: ``device``,
``local_allreduce_cpu``, ``local_allreduce_device``, ``nccl``), and ``dist_sync``
(``dist``, ``dist_sync_device``, ``dist_device_sync``) and ``dist_async`` (each key's
owner applies every push as it arrives) across processes under ``mpirun``, with an MPI:
``pip install "kvstore[mpi]"`` installs Open MPI from the package index, and
``KVSTORE_MPI=system`` uses the system's (kvstore/_native.py).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generator, List, NamedTuple, Optional, Union


from . import _native

# The native module, with MPI or without (``KVSTORE_MPI``: kvstore/_native.py). The
# package's modules import it as ``kvstore._kvstore`` whichever it is (both have the
# interface of _kvstore.pyi).
if TYPE_CHECKING:
    from . import _kvstore
else:
    _kvstore = _native.load()
    sys.modules[__name__ + "._kvstore"] = _kvstore

from . import errors, lr_scheduler, optimizer, sparse
from .errors import (
    AlreadyInitializedError,
    ArgumentTypeError,
    BackendError,
    DeviceUnavailableError,
    DisposedError,
    DTypeMismatchError,
    InternalError,
    InvalidArgumentError,
    KeyNotInitializedError,
    KVStoreError,
    LengthMismatchError,
    ResourceExhaustedError,
    RowSparseValueError,
    ShapeMismatchError,
    StoreIOError,
    UnknownStoreKindError,
    UnsupportedError,
)

__version__: str = _kvstore.__version__

__all__ = [
    "__version__",
    "create",
    "KVStore",
    "Future",
    "Restored",
    "optimizer",
    "lr_scheduler",
    "sparse",
    "errors",
    *errors.__all__,
    "finalize",
]

Key = Union[int, str]


class Future:
    """The handle of a non-blocking call (``push_async``, ``pull_async``, ...), with
    the interface of :class:`concurrent.futures.Future`: ``result(timeout)``,
    ``exception(timeout)``, ``done()``, ``add_done_callback(fn)``; and awaitable in
    asyncio (``await kv.push_async(...)``). A call cannot be cancelled: ``cancel()``
    returns ``False``.
    """

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    def done(self) -> bool:
        """Whether the call is done (successfully or not)."""
        return self._native.done()

    def running(self) -> bool:
        """Whether the call is not done yet."""
        return not self._native.done()

    def cancel(self) -> bool:
        """Calls cannot be cancelled: always ``False``."""
        return False

    def cancelled(self) -> bool:
        """Always ``False``."""
        return False

    def result(self, timeout: Optional[float] = None) -> None:
        """Waits for the call (at most `timeout` seconds) and returns ``None``, or
        raises its error. Raises ``TimeoutError`` if it is still running then."""
        if not self._native.wait(timeout):
            raise TimeoutError(f"the call is still running after {timeout} s")
        self._native.result()

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Waits as ``result`` does and returns the call's error, or ``None``."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except KVStoreError as e:
            return e
        return None

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits at most `timeout` seconds; returns whether the call is done."""
        return self._native.wait(timeout)

    def add_done_callback(self, fn: Callable[["Future"], Any]) -> None:
        """Calls ``fn(self)`` once the call is done: at once if it is, else on the
        package's callback thread (with the GIL), in the order the calls finished. The
        store's threads go on meanwhile: `fn` may wait for other futures (a later call
        of the same store) or make blocking calls."""
        self._native.add_done_callback(lambda: fn(self))

    def __await__(self) -> Generator[Any, None, None]:
        loop = asyncio.get_running_loop()
        settled: asyncio.Future = loop.create_future()

        def wake(_: "Future") -> None:
            loop.call_soon_threadsafe(lambda: None if settled.done() else settled.set_result(None))

        self.add_done_callback(wake)
        yield from settled.__await__()
        return self.result(0)

    def __repr__(self) -> str:
        return f"<kvstore.Future {'done' if self.done() else 'running'}>"


class Restored(NamedTuple):
    """What a store restored when it was made (:meth:`KVStore.restored`): the ``step``
    and ``extra`` bytes given to the commit it resumed from."""

    step: int
    extra: bytes


class KVStore(_kvstore.KVStore):
    """A key-value store for data-parallel training (MXNet's ``mxnet.kvstore.KVStore``).

    Made by :func:`create`. Keys are ints or strings; values and outs are numpy arrays
    or DLPack arrays on the host, read and written in place. The argument forms are
    MXNet's:

    - one key and one array: ``kv.push(3, a)``;
    - one key and a list of arrays: ``kv.push(3, [a, b, c])`` sums them; ``kv.pull(3,
      out=[a, b])`` writes each;
    - a list of keys and a list of arrays, one per key: ``kv.push([3, 5], [a, b])``;
    - a list of keys and a list of lists: ``kv.push([3, 5], [[a, b], [c]])``;
    - a key repeated in a list: its values are summed (pushes) or each out written.

    ``init``, ``push``, ``pull``, ``pushpull`` and ``broadcast`` are the native
    module's own methods (no Python frame in between): see their docs.
    """

    def __init__(self, name: str = "local") -> None:
        # (The store itself is made by the native __new__.) Remembered for the exit
        # hook, which waits for the store's calls before the interpreter goes.
        _stores.add(self)

    def restored(self) -> Optional[Restored]:
        """The commit this store resumed from when it was made (see :meth:`commit`):
        ``Restored(step, extra)``, or ``None``. A training loop is written once::

            r = kv.restored()
            start = r.step + 1 if r else 0
        """
        got = self._restored()
        return None if got is None else Restored(*got)

    def set_optimizer(self, optimizer: "optimizer.Optimizer") -> None:
        """Runs `optimizer` on every push from now on (in the store, in Rust): a
        :mod:`kvstore.optimizer` optimizer, such as ``optimizer.SGD(learning_rate=0.1,
        momentum=0.9)`` or ``optimizer.create("adam")``. It replaces any updater."""
        if not isinstance(optimizer, globals()["optimizer"].Optimizer):
            raise ArgumentTypeError(
                "set_optimizer takes a kvstore.optimizer optimizer (e.g. kvstore.optimizer.SGD(...)), "
                f"not {type(optimizer).__name__}"
            )
        self._set_optimizer_json(optimizer._json())

    def set_updater(self, updater: Optional[Callable[[Any, Any, Any], None]]) -> None:
        """Runs ``updater(key, recv, stored)`` on every push from now on: `recv` is the
        sum pushed, `stored` the stored value (both numpy views of the store's memory,
        valid during the call: ``stored += recv * 2`` updates the key in place). The
        key comes as it was first given (an int key as an int). ``None`` goes back to
        assignment.

        The updater runs on the store's threads with the GIL held. If it raises, the
        push fails with :class:`BackendError` (the exception is its ``__cause__``) and
        the key keeps its value.
        """
        if updater is not None and not callable(updater):
            raise ArgumentTypeError(
                f"set_updater takes a function fn(key, recv, stored) (or None), not a {type(updater).__name__}"
            )
        self._set_updater(updater)

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> None:
        """Pulls only the rows `row_ids` of a row-sparse key into `out`, a
        :class:`kvstore.sparse.RowSparseNDArray` (MXNet's ``row_sparse_pull``).

        `row_ids` is an integer array (numpy, a list, MXNet's NDArray), in any order and
        with repeats: the out's ``indices`` become those ids sorted and de-duplicated,
        and its ``data`` those rows of the stored value (a row never pushed comes back
        as zeros). Forms: ``row_sparse_pull(k, out=o, row_ids=ids)``; several outs of
        one key, ``out=[o1, o2]``, with one `row_ids` for all or a list of one per out;
        a list of keys with a list of outs and a list of `row_ids`, one per key.

        Raises ``InvalidArgumentError`` for a key that is dense (pull it) or a row id
        out of range, ``KeyError`` for a key never initialized, ``TypeError`` for a dense
        out. Every pull is checked before any out changes.
        """
        sparse._row_sparse_pull(self, key, out, priority, row_ids)

    def stype(self, key: Any) -> str:
        """The storage type of `key`: ``"row_sparse"`` (initialized with, or assigned, a
        row-sparse value) or ``"default"``."""
        return _kvstore._stype(self, key)

    def push_async(self, key: Any, value: Any, priority: int = 0, copy: bool = True) -> Future:
        """``push``, non-blocking: returns a :class:`Future` at once.

        By default the values are copied now, so the caller may change them at once;
        while the copies of queued calls hold 256 MiB (``KVSTORE_MAX_COPIED_BYTES``),
        the call first waits for earlier calls to finish. With ``copy=False`` they are
        read in place, later: they must then not change until the future is done (as
        PyTorch's ``non_blocking`` copies require).
        Calls of one store take effect in the order they were made.
        """
        return Future(self._push_async(key, value, priority, copy))

    def pull_async(self, key: Any, out: Any, priority: int = 0) -> Future:
        """``pull``, non-blocking: `out` is written later and must not be read (or
        written) before the returned :class:`Future` is done."""
        return Future(self._pull_async(key, out, priority))

    def pushpull_async(self, key: Any, value: Any, out: Any = None, priority: int = 0, copy: bool = True) -> Future:
        """``pushpull``, non-blocking (`copy` as for ``push_async``; with no `out` the
        values are written, so they must not be used until it is done)."""
        return Future(self._pushpull_async(key, value, out, priority, copy))

    def broadcast_async(self, key: Any, value: Any, out: Any, priority: int = 0) -> Future:
        """``broadcast``, non-blocking: the keys are initialized before it returns;
        `out` is written later (see ``pull_async``)."""
        return Future(self._broadcast_async(key, value, out, priority))

    @property
    def optimizer(self) -> Optional[str]:
        """The registry name of the optimizer set, or ``None``."""
        return self._optimizer_name()

    def __repr__(self) -> str:
        return f"<kvstore.KVStore type={self.type!r} rank={self.rank} num_workers={self.num_workers}>"


# Every store made, until it is garbage: the exit hook waits for their calls.
_stores: "weakref.WeakSet[KVStore]" = weakref.WeakSet()


def _wait_at_exit() -> None:
    """At interpreter exit (after the program's own exit hooks, registered later):
    waits for every store's non-blocking calls, whose updaters and callbacks need the
    interpreter, then keeps the store's threads out of it."""
    for store in list(_stores):
        try:
            store.wait_all()
        except Exception:  # each call's error belongs to its future
            pass
    _kvstore._exiting()


atexit.register(_wait_at_exit)

# A child of fork() has none of the stores' threads: once the parent made a store,
# every store call in the child fails with UnsupportedError naming fork.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_kvstore._forked)


def create(name: str = "local") -> KVStore:
    """A new store of kind `name` (MXNet's ``mx.kv.create``).

    ``local``, ``device``, ``local_allreduce_cpu``, ``local_allreduce_device`` and
    ``nccl`` are single-process stores. ``dist_sync`` (``dist``, ``dist_sync_device``,
    ``dist_device_sync``: every worker holds every key, updated alike) and
    ``dist_async`` (``dist_async_device``, ``dist_device_async``: each key's owner
    applies every push as it arrives) span the processes of an ``mpirun`` job and need
    an MPI (``pip install "kvstore[mpi]"``, or ``KVSTORE_MPI=system``): without one they
    raise :class:`UnsupportedError` naming the extra. An unknown name raises
    :class:`UnknownStoreKindError`, a name that is not a str :class:`ArgumentTypeError`.
    In a child of ``fork()`` of a process that made a store, this and every other store
    call raise :class:`UnsupportedError` naming fork.
    """
    if not isinstance(name, str):
        raise ArgumentTypeError(f"name must be a str, not {type(name).__name__}")
    if (name == "dist" or name.startswith("dist_")) and not _kvstore._has_mpi() and not _native.has_mpi_module():
        raise UnsupportedError(
            f'store kind "{name}" needs MPI, and this kvstore was built from source without its MPI module '
            '(kvstore/_with_mpi): install the wheel of `make python` with `pip install "WHEEL[mpi]"` '
            "(docs/python.md)"
        )
    store = KVStore(name)
    if store.type.startswith("dist"):
        _finalize_at_exit("async" in store.type)
    return store


def finalize() -> None:
    """Ends MPI at the end of a ``dist_sync`` job (every rank, after its last call).

    It first runs every non-blocking call still pending, then ends MPI; a store call
    after it fails. A program need not call it: when a program that made a
    ``dist_sync`` store ends normally (exit status 0), this runs by itself. When it
    ends with another status (an uncaught exception, ``sys.exit(1)``), it does not:
    the rank then aborts the MPI job with its status, so that the other ranks end too
    instead of waiting for it. Does nothing without MPI.
    """
    global _finalized
    _kvstore._finalize()
    _finalized = True


# Whether an uncaught exception is ending the program (set by the hook below), and
# whether the program called finalize() itself (the hook then does not call it again).
_failed = False
_finalized = False
_hooked = False


def _finalize_at_exit(serving: bool) -> None:
    """Arranges the end-of-program finalize of a dist job. Only C's ``exit()`` knows
    the exit status (Python's atexit hooks run before it), so the native module's exit
    handler finalizes at status 0 and at any other lets the rank abort the job with
    it. A ``dist_async`` rank (`serving`) answers the others' calls until every rank
    arrives at finalize, running its Python updater for them, so it finalizes in an
    atexit hook while the interpreter lives, unless an uncaught exception ends it."""
    global _hooked
    _kvstore._finalize_at_exit()
    if _hooked or not serving:
        return
    _hooked = True
    previous = sys.excepthook

    def note_failure(*exc_info: Any) -> None:
        global _failed
        _failed = True
        previous(*exc_info)

    sys.excepthook = note_failure

    def at_exit() -> None:
        if not _failed and not _finalized:
            _kvstore._finalize()

    atexit.register(at_exit)
