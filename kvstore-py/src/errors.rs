//! Store errors as Python exceptions: one class per error kind, defined in the
//! package's `kvstore.errors` (each also subclasses the builtin a Python user would
//! catch), made here with the error's code, message, key and shapes or dtypes.
//!
//! An argument refused before the store sees it is one of the package's classes too:
//! [`type_error`] (`ArgumentTypeError`, a `TypeError`), [`value_error`]
//! (`InvalidArgumentError`, a `ValueError`) and [`row_sparse_value`]
//! (`RowSparseValueError`, an `ArgumentTypeError`).
//!
//! An exception raised by a Python updater fails its push with a `BACKEND` error that
//! carries the exception itself ([`Error::Raised`]), on whatever thread the updater
//! ran; it becomes the `__cause__` of the exception the push raises.

use kvstore::{Cause, Error};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

/// The store error for `err`, an exception a Python updater raised for `key`: its
/// message names the exception, which rides inside as the cause.
pub(crate) fn updater_failed(py: Python<'_>, key: &str, err: PyErr) -> Error {
    let what = err.value(py).repr().map_or_else(|_| "an exception".to_string(), |r| r.to_string());
    let message = format!("the updater raised {what} for key \"{key}\"");
    Error::Raised { backend: "python updater", message, cause: Cause::new(err) }
}

/// The Python exception for a store error.
pub(crate) fn to_py(err: Error) -> PyErr {
    Python::attach(|py| make(py, &err).unwrap_or_else(|e| e))
}

fn make(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let message = err.to_string();
    let key = err.key().map(|k| k.as_str().to_string());
    let (expected, got): (Option<Py<PyAny>>, Option<Py<PyAny>>) = match err {
        Error::ShapeMismatch { expected, got, .. } => {
            (Some(PyTuple::new(py, expected)?.into_any().unbind()), Some(PyTuple::new(py, got)?.into_any().unbind()))
        }
        Error::DTypeMismatch { expected, got, .. } => (
            Some(expected.to_string().into_pyobject(py)?.into_any().unbind()),
            Some(got.to_string().into_pyobject(py)?.into_any().unbind()),
        ),
        Error::LengthMismatch { expected, got, .. } => {
            (Some(expected.into_pyobject(py)?.into_any().unbind()), Some(got.into_pyobject(py)?.into_any().unbind()))
        }
        _ => (None, None),
    };
    let errors = match py.import("kvstore.errors") {
        Ok(m) => m,
        // The native module alone (not through the package): a plain exception.
        Err(_) => return Ok(PyRuntimeError::new_err(format!("{}: {message}", err.kind().code()))),
    };
    let exc = errors.call_method1("_from_native", (err.kind().code(), message.as_str(), key, expected, got))?;
    let exc = PyErr::from_value(exc);
    if let Error::Raised { cause, .. } = err
        && let Some(cause) = cause.downcast_ref::<PyErr>()
    {
        exc.set_cause(py, Some(cause.clone_ref(py)));
    }
    Ok(exc)
}

/// The package's `kvstore.errors` classes for arguments refused here, looked up once.
static ARGUMENT_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static ROW_SPARSE_VALUE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `kvstore.errors.<name>`, looked up once into `cell`.
fn class<'py>(py: Python<'py>, cell: &'static PyOnceLock<Py<PyType>>, name: &str) -> PyResult<&'py Py<PyType>> {
    cell.get_or_try_init(py, || Ok(py.import("kvstore.errors")?.getattr(name)?.cast_into::<PyType>()?.unbind()))
}

/// An exception of class `kvstore.errors.<name>` saying `message`; `fallback`'s when the
/// package cannot be imported (the native module alone).
fn argument_error(
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    message: String,
    fallback: fn(String) -> PyErr,
) -> PyErr {
    Python::attach(|py| match class(py, cell, name) {
        Ok(cls) => match cls.bind(py).call1((message.as_str(),)) {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        },
        Err(_) => fallback(message),
    })
}

/// An argument of a type the call does not take: `kvstore.ArgumentTypeError` (a
/// `TypeError`).
pub(crate) fn type_error(message: impl Into<String>) -> PyErr {
    argument_error(&ARGUMENT_TYPE, "ArgumentTypeError", message.into(), PyTypeError::new_err)
}

/// An argument with a wrong value: `kvstore.InvalidArgumentError` (a `ValueError`).
pub(crate) fn value_error(message: impl Into<String>) -> PyErr {
    argument_error(&INVALID_ARGUMENT, "InvalidArgumentError", message.into(), PyValueError::new_err)
}

/// A row-sparse array where the call takes dense ones: `kvstore.RowSparseValueError`
/// (an `ArgumentTypeError`), which `init` and `push` catch to take the row-sparse way.
pub(crate) fn row_sparse_value(message: impl Into<String>) -> PyErr {
    argument_error(&ROW_SPARSE_VALUE, "RowSparseValueError", message.into(), PyTypeError::new_err)
}

/// Whether `err` is a [`row_sparse_value`] error.
pub(crate) fn is_row_sparse_value(py: Python<'_>, err: &PyErr) -> bool {
    class(py, &ROW_SPARSE_VALUE, "RowSparseValueError").is_ok_and(|cls| err.is_instance(py, cls.bind(py)))
}
