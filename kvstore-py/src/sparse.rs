//! Row-sparse values (`kvstore.sparse.RowSparseNDArray`) in the store's calls: `init`
//! and `push` of row-sparse values, and `row_sparse_pull`. The package's
//! `kvstore.sparse` holds the array class and turns a call's forms into pairs of a key
//! and its values (`_pairs`); this module hands them to core's row-sparse calls.
//!
//! A row-sparse array met where dense arrays are wrapped ([`crate::arrays::wrap`])
//! raises [`not_here`]'s `kvstore.RowSparseValueError`: `init` and `push` catch it and
//! take this module's way; every other call lets it through, a `TypeError` naming the
//! calls that take one.

use kvstore::{Key, RowSparse, RowSparsePushes, Values};
use numpy::{PyReadonlyArray1, ToPyArray};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::arrays::{Use, view, wrap};
use crate::errors::to_py;
use crate::store::{PyStore, key_of, map_items, no_keys, refusing, remember_int_keys};

/// `kvstore.sparse.RowSparseNDArray`, looked up once.
static RSP_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Whether `obj` is a `kvstore.sparse.RowSparseNDArray` (or of a subclass).
pub(crate) fn is_row_sparse(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    RSP_TYPE
        .get_or_try_init(py, || -> PyResult<Py<PyType>> {
            Ok(py.import("kvstore.sparse")?.getattr("RowSparseNDArray")?.cast_into::<PyType>()?.unbind())
        })
        .is_ok_and(|t| obj.is_instance(t.bind(py)).unwrap_or(false))
}

/// The error for a row-sparse array given as `what` to a call that takes dense ones.
pub(crate) fn not_here(what: &str) -> PyErr {
    crate::errors::row_sparse_value(format!(
        "{what} is a row-sparse array, and this call takes dense arrays: row-sparse values go to init and push \
         (blocking), row-sparse outs to row_sparse_pull; a dense copy is .tostype(\"default\")"
    ))
}

/// `obj`, a `RowSparseNDArray`, as core's row-sparse array over the same data block.
fn row_sparse_of(obj: &Bound<'_, PyAny>) -> PyResult<RowSparse> {
    if !is_row_sparse(obj) {
        let ty = obj.get_type().name().map_or_else(|_| "object".to_string(), |n| n.to_string());
        return Err(crate::errors::type_error(format!(
            "a call mixes row-sparse and dense values ({ty}): give them in separate calls"
        )));
    }
    let indices: PyReadonlyArray1<'_, i64> = obj.getattr("indices")?.extract()?;
    from_parts(&obj.getattr("data")?, indices, obj.getattr("shape")?.extract()?, "a row-sparse value's data")
}

/// Core's row-sparse array over `data` (read in place), `indices` and `shape`.
fn from_parts(
    data: &Bound<'_, PyAny>,
    indices: PyReadonlyArray1<'_, i64>,
    shape: Vec<usize>,
    what: &str,
) -> PyResult<RowSparse> {
    let data = wrap(data, Use::Read, what, None)?;
    RowSparse::new(data, indices.as_slice()?.to_vec(), &shape).map_err(to_py)
}

/// The (key, values) pairs of a call on row-sparse values, in its forms
/// (`kvstore.sparse._pairs`).
fn pairs_of(
    py: Python<'_>,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    op: &str,
) -> PyResult<Vec<(Key, Vec<RowSparse>)>> {
    let pairs = py.import("kvstore.sparse")?.call_method1("_pairs", (key, value, op))?;
    map_items(&pairs, |pair| {
        let pair = pair.cast::<PyTuple>()?;
        Ok((key_of(&pair.get_item(0)?)?, map_items(&pair.get_item(1)?, row_sparse_of)?))
    })
}

impl PyStore {
    /// `init` of row-sparse values: one per key, all keys or none.
    pub(crate) fn init_row_sparse(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let refused = |r: &_| self.shared.kv.init(no_keys(), Values::Refused(r));
        let pairs = pairs_of(py, key, value, "init").map_err(|e| refusing(py, e, refused))?;
        let (keys, values): (Vec<Key>, Vec<RowSparse>) = pairs.into_iter().map(|(k, mut vs)| (k, vs.remove(0))).unzip();
        crate::detach(py, || self.shared.kv.init_row_sparse_many(&keys, &values)).map_err(to_py)?;
        remember_int_keys(&self.shared, key)
    }

    /// `push` of row-sparse values (every value of the call row-sparse).
    pub(crate) fn push_row_sparse(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        priority: i32,
    ) -> PyResult<()> {
        let refused = |r: &_| self.shared.kv.push_row_sparse_many(RowSparsePushes::Refused(r), priority);
        let pairs = pairs_of(py, key, value, "push").map_err(|e| refusing(py, e, refused))?;
        crate::detach(py, || self.shared.kv.push_row_sparse_many(&pairs, priority)).map_err(to_py)
    }
}

/// The rows `row_ids` (int64, any order, repeats allowed) of row-sparse `key`, as
/// `(data, indices, shape)`: numpy arrays and the key's shape.
#[pyfunction]
pub(crate) fn _row_sparse_pull<'py>(
    py: Python<'py>,
    store: &PyStore,
    key: &Bound<'py, PyAny>,
    row_ids: PyReadonlyArray1<'py, i64>,
    priority: i32,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
    crate::lifecycle::not_forked()?;
    let key = key_of(key)?;
    let ids = row_ids.as_slice()?.to_vec();
    let rsp = crate::detach(py, || store.shared.kv.row_sparse_pull(key, &ids, priority)).map_err(to_py)?;
    let data = view(py, rsp.data())?;
    let indices = rsp.indices().to_pyarray(py).into_any();
    Ok((data, indices, PyTuple::new(py, rsp.shape())?))
}

/// The storage type of `key`: ``"default"`` or ``"row_sparse"``.
#[pyfunction]
pub(crate) fn _stype(py: Python<'_>, store: &PyStore, key: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    crate::lifecycle::not_forked()?;
    let key = key_of(key)?;
    crate::detach(py, || store.shared.kv.stype(key)).map(|s| s.name()).map_err(to_py)
}

/// Checks that `data`, `indices` and `shape` make a row-sparse array (what the store
/// would refuse: indices not strictly increasing or out of range, data rows that do
/// not match), raising the store's error.
#[pyfunction]
pub(crate) fn _check_row_sparse(
    data: &Bound<'_, PyAny>,
    indices: PyReadonlyArray1<'_, i64>,
    shape: Vec<usize>,
) -> PyResult<()> {
    from_parts(data, indices, shape, "data").map(drop)
}
