"""Arrays that are not numpy arrays, as numpy views of the same memory (no copy).

The native module reads and writes numpy arrays in place; everything else comes here
first: PyTorch CPU tensors, anything with ``__dlpack__`` (JAX, CuPy on the host,
numpy itself), anything with ``__array_interface__``, and MXNet's ``NDArray``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, InvalidArgumentError


class _Capsule:
    """A DLPack capsule as numpy's ``from_dlpack`` wants it (an object with
    ``__dlpack__`` and ``__dlpack_device__``): for MXNet's NDArray, whose
    ``to_dlpack_for_read``/``to_dlpack_for_write`` return bare capsules."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple:
        return (1, 0)  # kDLCPU


def _describe(obj: Any) -> str:
    t = type(obj)
    return f"a {t.__qualname__}" if t.__module__ == "builtins" else f"a {t.__module__}.{t.__qualname__}"


class _Writable:
    """The memory of `view`, offered writable through ``__array_interface__`` (and
    kept alive: the array numpy makes of it has this object as its base)."""

    def __init__(self, view: np.ndarray) -> None:
        self._view = view
        interface = dict(view.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface


_NUMPY_1 = int(np.__version__.split(".")[0]) < 2


def _writable_view(view: np.ndarray, obj: Any) -> np.ndarray:
    """`view` made writable where numpy marked it read-only only because DLPack
    carries no such flag (the producer's memory is writable)."""
    if not view.flags.writeable:
        try:
            view.flags.writeable = True
        except ValueError:
            if not _NUMPY_1:
                raise InvalidArgumentError(f"out is read-only: the store writes it in place ({_describe(obj)})") from None
            # numpy 1.x marks every DLPack import read-only and refuses to unmark it
            # (and exports no read-only array): the same memory, writable.
            view = np.asarray(_Writable(view))
    return view


def as_numpy(obj: Any, writable: bool, what: str = "array") -> np.ndarray:
    """A numpy view of `obj`'s memory, without a copy; `writable` when the store
    writes it. Raises :class:`ArgumentTypeError` (a ``TypeError``) naming `what` (the
    call's "value", "out", ...) for an object that is not an array on the host."""
    # PyTorch: `.numpy()` is a writable view of a CPU tensor.
    if type(obj).__module__.startswith("torch") and hasattr(obj, "numpy"):
        if getattr(obj, "device", None) is not None and obj.device.type != "cpu":
            raise ArgumentTypeError(
                f"{what}: a tensor on {obj.device} is not supported yet: move it to the CPU (tensor.cpu())"
            )
        if getattr(obj, "requires_grad", False):
            obj = obj.detach()
        if str(obj.dtype) == "torch.bfloat16":
            # numpy has no bfloat16: the same memory, seen as ml_dtypes' bfloat16.
            try:
                import ml_dtypes
            except ImportError:
                raise ArgumentTypeError(
                    f"{what}: bfloat16 tensors need the ml_dtypes package: pip install 'kvstore[bfloat16]' "
                    "(or pip install ml_dtypes)"
                ) from None
            return obj.view(sys.modules["torch"].int16).numpy().view(ml_dtypes.bfloat16)
        return obj.numpy()
    # MXNet's NDArray (mx.nd and mx.np): through its own DLPack functions.
    if hasattr(obj, "to_dlpack_for_write") and hasattr(obj, "asnumpy"):
        ctx = getattr(obj, "context", None) or getattr(obj, "ctx", None)
        if ctx is not None and getattr(ctx, "device_type", "cpu") != "cpu":
            raise ArgumentTypeError(f"{what}: an MXNet array on {ctx} is not supported yet: copy it to mx.cpu()")
        obj.wait_to_read()
        capsule = obj.to_dlpack_for_write() if writable else obj.to_dlpack_for_read()
        view = np.from_dlpack(_Capsule(capsule))
        return _writable_view(view, obj) if writable else view
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device = obj.__dlpack_device__()
        if int(device[0]) not in (1, 3):  # kDLCPU, kDLCUDAHost
            raise ArgumentTypeError(f"{what}: {_describe(obj)} on DLPack device {tuple(device)} is not on the host")
        view = np.from_dlpack(obj)
        return _writable_view(view, obj) if writable else view
    if hasattr(obj, "__array_interface__"):
        view = np.asarray(obj)
        if writable and not view.flags.writeable:
            raise InvalidArgumentError(f"{what} is read-only: the store writes it in place ({_describe(obj)})")
        return view
    raise ArgumentTypeError(
        f"{what}: expected an array (numpy, a CPU tensor, or anything with __dlpack__ or __array_interface__), "
        f"got {_describe(obj)}"
    )
