//! Store errors as Python exceptions: one class per error kind, defined in the
//! package's `kvstore.errors` (each also subclasses the builtin a Python user would
//! catch), made here with the error's code, message, key and shapes or dtypes.
//!
//! An exception raised by a Python updater fails its push with a `BACKEND` error; the
//! exception itself is kept here (by the error's message, which names it uniquely) and
//! becomes the `__cause__` of the exception the push raises.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use kvstore_core::Error;
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// The updater exceptions not yet raised as causes, newest last (a bounded list: a
/// failed non-blocking push nobody waits for leaves its exception here).
static CAUSES: Mutex<VecDeque<(String, PyErr)>> = Mutex::new(VecDeque::new());
/// How many causes are kept at most.
const MAX_CAUSES: usize = 64;

/// The store error for `err`, an exception a Python updater raised for `key`: its
/// message names the exception, and the exception is kept to become the cause.
pub(crate) fn updater_failed(py: Python<'_>, key: &str, err: PyErr) -> Error {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let what = err.value(py).repr().map_or_else(|_| "an exception".to_string(), |r| r.to_string());
    let message = format!("the updater raised {what} for key \"{key}\" (updater error #{n})");
    let mut causes = CAUSES.lock();
    if causes.len() == MAX_CAUSES {
        causes.pop_front();
    }
    causes.push_back((message.clone(), err));
    Error::Backend { backend: "python updater", message }
}

/// The kept updater exception whose error message is `message`, taken.
fn take_cause(message: &str) -> Option<PyErr> {
    let mut causes = CAUSES.lock();
    let at = causes.iter().position(|(m, _)| message.contains(m.as_str()))?;
    causes.remove(at).map(|(_, e)| e)
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
    if let Error::Backend { .. } = err
        && let Some(cause) = take_cause(&message)
    {
        exc.set_cause(py, Some(cause));
    }
    Ok(exc)
}
