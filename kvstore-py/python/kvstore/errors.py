"""The exceptions of kvstore: one class per error kind of the store.

Every class derives from :class:`KVStoreError` and also from the builtin exception a
Python user would catch for it: a key that was never initialized is a ``KeyError``,
a shape or dtype mismatch a ``ValueError``, an unsupported feature a
``NotImplementedError``, a file that cannot be written an ``OSError``::

    try:
        kv.pull("missing", out=a)
    except KeyError as e:          # or kvstore.KeyNotInitializedError
        print(e.code, e.key)       # KEY_NOT_INITIALIZED missing

Each exception has ``code`` (the error kind's stable name, shared with the Java and
Clojure bindings), ``key`` (the key concerned, or ``None``) and, for mismatches,
``expected`` and ``got`` (shapes as tuples, dtypes as names, lengths as ints).

An argument the package refuses before the store sees it is one too: a wrong value is
an :class:`InvalidArgumentError` (a ``ValueError``), an argument of a type the call
does not take an :class:`ArgumentTypeError` (a ``TypeError``; both have the code
``INVALID_ARGUMENT``)::

    try:
        kv.push(3, "abc")
    except TypeError as e:         # or kvstore.ArgumentTypeError, kvstore.KVStoreError
        print(e)                   # value of push must be an array ...
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "KVStoreError",
    "KeyNotInitializedError",
    "AlreadyInitializedError",
    "ShapeMismatchError",
    "DTypeMismatchError",
    "LengthMismatchError",
    "UnknownStoreKindError",
    "DeviceUnavailableError",
    "UnsupportedError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "RowSparseValueError",
    "DisposedError",
    "StoreIOError",
    "BackendError",
    "ResourceExhaustedError",
    "InternalError",
]


class KVStoreError(Exception):
    """The base class of every error the store raises.

    Attributes: ``code`` (e.g. ``"SHAPE_MISMATCH"``), ``key`` (or ``None``), and
    ``expected``/``got`` for mismatches (else ``None``).
    """

    code: str = "INTERNAL"

    def __init__(
        self,
        message: str,
        key: Optional[str] = None,
        expected: Any = None,
        got: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.expected = expected
        self.got = got

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (type(self), (self.message, self.key, self.expected, self.got))


class KeyNotInitializedError(KVStoreError, KeyError):
    """A key was used before ``init`` (or ``broadcast``)."""

    code = "KEY_NOT_INITIALIZED"


class AlreadyInitializedError(KVStoreError, ValueError):
    """``init`` or ``broadcast`` of a key the store already holds."""

    code = "ALREADY_INITIALIZED"


class ShapeMismatchError(KVStoreError, ValueError):
    """An array's shape differs from the key's."""

    code = "SHAPE_MISMATCH"


class DTypeMismatchError(KVStoreError, ValueError):
    """An array's dtype differs from the key's."""

    code = "DTYPE_MISMATCH"


class LengthMismatchError(KVStoreError, ValueError):
    """Lists of keys and of values (or outs) of different lengths."""

    code = "LENGTH_MISMATCH"


class UnknownStoreKindError(KVStoreError, ValueError):
    """``create`` was given a name no store has."""

    code = "UNKNOWN_STORE_KIND"


class DeviceUnavailableError(KVStoreError, RuntimeError):
    """A device (a GPU) was used that no backend serves."""

    code = "DEVICE_UNAVAILABLE"


class UnsupportedError(KVStoreError, NotImplementedError):
    """A feature this build or this store kind does not have."""

    code = "UNSUPPORTED"


class InvalidArgumentError(KVStoreError, ValueError):
    """An argument that is wrong on its own (a bad hyper-parameter, a bad path)."""

    code = "INVALID_ARGUMENT"


class ArgumentTypeError(KVStoreError, TypeError):
    """An argument of a type the call does not take (an object that is not an array,
    an array dtype the store does not have, a key that is neither an int nor a str),
    refused before the store sees it. Its code is ``INVALID_ARGUMENT``."""

    code = "INVALID_ARGUMENT"


class RowSparseValueError(ArgumentTypeError):
    """A row-sparse array given to a call that takes dense arrays (row-sparse values
    go to the blocking ``init`` and ``push``, row-sparse outs to ``row_sparse_pull``)."""


class DisposedError(KVStoreError, RuntimeError):
    """An object was used after it was closed."""

    code = "DISPOSED"


class StoreIOError(KVStoreError, OSError):
    """A file could not be read or written."""

    code = "IO"


class BackendError(KVStoreError, RuntimeError):
    """A backend failed: a device, MPI, or a Python updater (its exception is the
    ``__cause__``)."""

    code = "BACKEND"


class ResourceExhaustedError(KVStoreError, MemoryError):
    """The machine refused memory or threads; nothing changed."""

    code = "RESOURCE_EXHAUSTED"


class InternalError(KVStoreError, RuntimeError):
    """A bug in the library: please report it."""

    code = "INTERNAL"


_BY_CODE = {
    cls.code: cls
    for cls in (
        KeyNotInitializedError,
        AlreadyInitializedError,
        ShapeMismatchError,
        DTypeMismatchError,
        LengthMismatchError,
        UnknownStoreKindError,
        DeviceUnavailableError,
        UnsupportedError,
        InvalidArgumentError,
        DisposedError,
        StoreIOError,
        BackendError,
        ResourceExhaustedError,
        InternalError,
    )
}


def _from_native(code: str, message: str, key: Optional[str], expected: Any, got: Any) -> KVStoreError:
    """The exception for an error of the native module (called by it)."""
    return _BY_CODE.get(code, InternalError)(message, key, expected, got)
