"""Row-sparse arrays (MXNet's ``mx.nd.sparse`` for ``row_sparse`` storage).

A row-sparse array stands for a ``[rows, ...]`` array whose rows are zero except a
few: it holds those rows as one dense block (``data``, ``[len(indices), ...]``) and
their row numbers (``indices``, int64, strictly increasing). Embeddings push and pull
only the rows a batch touched::

    import numpy as np
    import kvstore
    from kvstore import sparse

    kv = kvstore.create("local")
    kv.init("emb", sparse.zeros("row_sparse", (1000, 8)))
    grad = sparse.row_sparse_array((np.ones((2, 8), np.float32), [3, 7]), shape=(1000, 8))
    kv.push("emb", grad)                            # only rows 3 and 7 are sent
    out = sparse.zeros("row_sparse", (1000, 8))
    kv.row_sparse_pull("emb", out=out, row_ids=np.array([7, 3, 7]))
    out.indices                                     # array([3, 7])

``init`` and ``push`` take row-sparse values in every form they take dense ones (all
values of one call row-sparse); ``row_sparse_pull`` fills row-sparse outs. A dense
``pull`` of a row-sparse key gives the whole array. With an optimizer that MXNet
updates lazily (SGD and Adam with ``lazy_update=True``, the default; AdaGrad; Ftrl), a
row-sparse push changes only its rows of the weight and of the optimizer's state.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _kvstore
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["RowSparseNDArray", "row_sparse_array", "zeros", "cast_storage"]


def _as_numpy(obj: Any) -> np.ndarray:
    """`obj` (numpy, a list, MXNet's NDArray, a CPU tensor) as a numpy array."""
    if hasattr(obj, "asnumpy"):
        obj = obj.asnumpy()
    return np.asarray(obj)


def _row_ids(obj: Any, what: str = "row_ids", flatten: bool = True) -> np.ndarray:
    """Row ids of any integer (or integral float) dtype as a 1-D int64 array. Row ids
    of more dimensions are flattened, as MXNet does (gluon pulls the rows of a batch of
    token sequences); a row-sparse array's indices must be 1-D."""
    ids = _as_numpy(obj)
    if ids.dtype == object or not (np.issubdtype(ids.dtype, np.integer) or np.issubdtype(ids.dtype, np.floating)):
        raise ArgumentTypeError(f"{what} must be integers, not an array of {ids.dtype}")
    if ids.ndim > 1 and not flatten:
        raise InvalidArgumentError(f"{what} must be 1-D, not of shape {ids.shape}")
    return np.ascontiguousarray(ids.reshape(-1).astype(np.int64))


class RowSparseNDArray:
    """A row-sparse array: the rows ``indices`` of a ``shape`` array, as ``data``.

    Made by :func:`row_sparse_array`, :func:`zeros` or :func:`cast_storage`; filled by
    ``KVStore.row_sparse_pull``. ``data`` is C-contiguous, of shape
    ``(len(indices),) + shape[1:]``; ``indices`` is int64 and strictly increasing.
    """

    __slots__ = ("_data", "_indices", "_shape")

    stype = "row_sparse"

    def __init__(self, data: np.ndarray, indices: np.ndarray, shape: Tuple[int, ...]) -> None:
        data = np.ascontiguousarray(data)
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        shape = tuple(int(d) for d in shape)
        _kvstore._check_row_sparse(data, indices, list(shape))
        self._data = data
        self._indices = indices
        self._shape = shape

    @property
    def data(self) -> np.ndarray:
        """The stored rows: ``(len(indices),) + shape[1:]``."""
        return self._data

    @property
    def indices(self) -> np.ndarray:
        """The row numbers of ``data``'s rows (int64, strictly increasing)."""
        return self._indices

    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape of the whole array."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The elements' dtype."""
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        """The number of elements of the whole array (as dense)."""
        return int(np.prod(self._shape, dtype=np.int64))

    def tostype(self, stype: str) -> Any:
        """``"default"``: the dense numpy array; ``"row_sparse"``: a copy of this one."""
        return cast_storage(self, stype)

    def asnumpy(self) -> np.ndarray:
        """The dense array (a new numpy array)."""
        dense = np.zeros(self._shape, self._data.dtype)
        dense[self._indices] = self._data
        return dense

    def copy(self) -> "RowSparseNDArray":
        return RowSparseNDArray(self._data.copy(), self._indices.copy(), self._shape)

    def _assign(self, other: "RowSparseNDArray") -> None:
        """Becomes `other` (same shape and dtype: checked by the caller)."""
        self._data = other._data
        self._indices = other._indices

    def __repr__(self) -> str:
        return (
            f"<RowSparseNDArray {'x'.join(map(str, self._shape))} {self._data.dtype} "
            f"rows={self._indices.tolist() if len(self._indices) <= 8 else len(self._indices)}>"
        )


def row_sparse_array(arg1: Any, shape: Optional[Sequence[int]] = None, dtype: Any = None) -> RowSparseNDArray:
    """A row-sparse array, as MXNet's ``mx.nd.sparse.row_sparse_array``:

    - ``row_sparse_array((data, indices), shape=...)``: the rows `indices` hold `data`
      (``(len(indices),) + shape[1:]``); indices must be strictly increasing and in
      range. With no `shape`, it is ``(max(indices) + 1,) + data.shape[1:]``.
    - ``row_sparse_array(shape_tuple)``: an empty one (no rows stored).
    - ``row_sparse_array(dense)``: the rows of `dense` with a non-zero element.
    - ``row_sparse_array(rsp)``: a copy.

    `dtype` (default: the data's, float32 for lists) casts the data. The data is copied.
    """
    if isinstance(arg1, RowSparseNDArray):
        data, indices, shp = arg1.data, arg1.indices, arg1.shape
        return RowSparseNDArray(np.array(data, dtype=dtype or data.dtype), indices.copy(), tuple(shape or shp))
    if isinstance(arg1, tuple) and arg1 and all(isinstance(d, (int, np.integer)) for d in arg1):
        return zeros("row_sparse", arg1, dtype=dtype)
    if isinstance(arg1, tuple) and len(arg1) == 2:
        raw = arg1[0]
        data = _as_numpy(raw)
        if dtype is None and not isinstance(raw, np.ndarray) and not hasattr(raw, "asnumpy"):
            dtype = np.float32
        data = np.array(data, dtype=dtype or data.dtype, order="C")
        indices = _row_ids(arg1[1], "indices", flatten=False)
        if shape is None:
            rows = int(indices.max()) + 1 if len(indices) else 0
            shape = (rows,) + tuple(data.shape[1:])
        return RowSparseNDArray(data, indices, tuple(shape))
    return cast_storage(np.asarray(_as_numpy(arg1), dtype=dtype), "row_sparse")


def zeros(stype: str, shape: Any, dtype: Any = None) -> Any:
    """MXNet's ``mx.nd.sparse.zeros``: ``"row_sparse"`` gives a row-sparse array with no
    rows stored; ``"default"`` a dense numpy array of zeros. `dtype` defaults to
    float32."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    dtype = np.dtype(dtype or np.float32)
    if stype == "default":
        return np.zeros(shape, dtype)
    if stype != "row_sparse":
        raise InvalidArgumentError(f"storage type {stype!r} is not supported: use 'row_sparse' or 'default'")
    if not shape:
        raise InvalidArgumentError("a row-sparse array has at least one dimension (its rows)")
    return RowSparseNDArray(np.zeros((0,) + shape[1:], dtype), np.zeros(0, np.int64), shape)


def cast_storage(array: Any, stype: str) -> Any:
    """`array` in storage `stype`: ``"default"`` (a dense numpy array) or
    ``"row_sparse"`` (the rows with a non-zero element). Always a new array."""
    if stype not in ("default", "row_sparse"):
        raise InvalidArgumentError(f"storage type {stype!r} is not supported: use 'row_sparse' or 'default'")
    if isinstance(array, RowSparseNDArray):
        return array.asnumpy() if stype == "default" else array.copy()
    dense = _as_numpy(array)
    if stype == "default":
        return np.array(dense)
    if dense.ndim == 0:
        raise InvalidArgumentError("a row-sparse array has at least one dimension (its rows)")
    rows = np.flatnonzero(dense.reshape(dense.shape[0], -1).any(axis=1)) if dense.shape[0] else np.zeros(0, np.int64)
    return RowSparseNDArray(np.ascontiguousarray(dense[rows]), rows.astype(np.int64), dense.shape)


def _is_list(obj: Any) -> bool:
    return isinstance(obj, (list, tuple))


def _pairs(key: Any, value: Any, op: str) -> List[Tuple[Any, List[Any]]]:
    """A call's (key, values) pairs in MXNet's forms (for the native module): one key
    and a value or a list of them; a list of keys and one value (or list) per key."""
    if _is_list(key):
        if not _is_list(value) or len(value) != len(key):
            got = len(value) if _is_list(value) else 1
            raise _kvstore_error("LENGTH_MISMATCH", f"{op}: {len(key)} keys and {got} values", len(key), got)
        pairs = [(k, list(v) if _is_list(v) else [v]) for k, v in zip(key, value)]
    else:
        pairs = [(key, list(value) if _is_list(value) else [value])]
    if op == "init":
        for k, vs in pairs:
            if len(vs) != 1:
                raise _kvstore_error("LENGTH_MISMATCH", f"init of key {k!r}: one value per key", 1, len(vs))
    return pairs


def _kvstore_error(code: str, message: str, expected: Any = None, got: Any = None, key: Any = None) -> Exception:
    from .errors import _from_native

    return _from_native(code, message, None if key is None else str(key), expected, got)


def _pull_plan(key: Any, out: Any, row_ids: Any) -> List[Tuple[Any, List[RowSparseNDArray], List[np.ndarray]]]:
    """``row_sparse_pull``'s forms as (key, outs, ids per out)."""

    def ids_list(ids: Any, n: int) -> List[np.ndarray]:
        # One set of ids (an array, or a list of numbers) for every out, or one per out.
        if _is_list(ids) and ids and not all(isinstance(i, (int, float, np.integer, np.floating)) for i in ids):
            if len(ids) != n:
                raise _kvstore_error("LENGTH_MISMATCH", f"row_sparse_pull: {n} outs and {len(ids)} row_ids", n, len(ids))
            return [_row_ids(i) for i in ids]
        one = _row_ids(ids)
        return [one] * n

    def outs_list(o: Any) -> List[RowSparseNDArray]:
        outs = list(o) if _is_list(o) else [o]
        for x in outs:
            if not isinstance(x, RowSparseNDArray):
                raise ArgumentTypeError(
                    f"row_sparse_pull writes row-sparse outs (kvstore.sparse.zeros('row_sparse', shape)), not a "
                    f"{type(x).__name__}: a dense array is filled by pull"
                )
        return outs

    if _is_list(key):
        if not _is_list(out) or len(out) != len(key):
            got = len(out) if _is_list(out) else 1
            raise _kvstore_error("LENGTH_MISMATCH", f"row_sparse_pull: {len(key)} keys and {got} outs", len(key), got)
        if not _is_list(row_ids) or len(row_ids) != len(key):
            got = len(row_ids) if _is_list(row_ids) else 1
            raise _kvstore_error("LENGTH_MISMATCH", f"row_sparse_pull: {len(key)} keys and {got} row_ids", len(key), got)
        plan = []
        for k, o, ids in zip(key, out, row_ids):
            outs = outs_list(o)
            plan.append((k, outs, ids_list(ids, len(outs))))
        return plan
    outs = outs_list(out)
    return [(key, outs, ids_list(row_ids, len(outs)))]


def _row_sparse_pull(store: Any, key: Any, out: Any, priority: int, row_ids: Any) -> None:
    """``KVStore.row_sparse_pull``: every pull is made, and checked against its out,
    before any out changes."""
    if out is None or row_ids is None:
        raise InvalidArgumentError("row_sparse_pull needs out= (row-sparse arrays) and row_ids=")
    results = []
    for k, outs, ids in _pull_plan(key, out, row_ids):
        for o, i in zip(outs, ids):
            data, indices, shape = _kvstore._row_sparse_pull(store, k, i, priority)
            got = RowSparseNDArray.__new__(RowSparseNDArray)
            got._data, got._indices, got._shape = data, indices, tuple(shape)
            if o.shape != got.shape:
                raise _kvstore_error(
                    "SHAPE_MISMATCH", f"row_sparse_pull of key {k!r}: out of shape {o.shape}", got.shape, o.shape, k
                )
            if o.dtype != got.dtype:
                raise _kvstore_error(
                    "DTYPE_MISMATCH", f"row_sparse_pull of key {k!r}: out of dtype {o.dtype}", str(got.dtype), str(o.dtype), k
                )
            results.append((o, got))
    for o, got in results:
        o._assign(got)
