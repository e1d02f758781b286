//! A Python updater, ``fn(key, recv, stored)``, as a store [`Updater`]: called on the
//! thread that runs the push (the caller's, or one of the store's engine threads) with
//! the GIL taken for the call. `recv` and `stored` are writable numpy views of the
//! store's memory, valid for the call (`stored += recv * 2` updates the key in place).
//!
//! An exception fails the push with a `BACKEND` error whose `__cause__` is the
//! exception, and the key keeps the value it had: core hands updaters a working copy
//! of the stored value and commits it only when the whole push succeeded.

use std::sync::{Arc, Weak};

use kvstore::{Error, Key, NDArray, Result, Updater};
use pyo3::prelude::*;

use crate::arrays::view;
use crate::store::Shared;

struct PyUpdater {
    f: Py<PyAny>,
    /// The store, for the keys' original form; weak, so that an updater kept by the
    /// store does not keep the store alive.
    shared: Weak<Shared>,
}

impl PyUpdater {
    fn call(&self, py: Python<'_>, key: &Key, merged: &NDArray, stored: &NDArray) -> PyResult<()> {
        let key_obj = match self.shared.upgrade() {
            Some(s) => s.key_object(py, key)?,
            None => key.as_str().into_pyobject(py)?.into_any(),
        };
        let (recv, value) = (view(py, merged)?, view(py, stored)?);
        self.f.call1(py, (key_obj, recv, value))?;
        Ok(())
    }
}

impl Updater for PyUpdater {
    fn update(&self, key: &Key, _index: usize, merged: &NDArray, stored: &NDArray) -> Result<()> {
        // `stored` is the store's working copy, committed only if every update of the
        // push succeeds: a failed update leaves the key as it was.
        crate::attach(|py| {
            self.call(py, key, merged, stored).map_err(|e| crate::errors::updater_failed(py, key.as_str(), e))
        })
        .unwrap_or_else(|| {
            Err(Error::Backend {
                backend: "python updater",
                message: format!("the Python interpreter is exiting: the updater was not called for key \"{key}\""),
            })
        })
    }
}

/// Installs `f` as `shared`'s updater.
pub(crate) fn install(shared: &Arc<Shared>, f: Py<PyAny>) -> PyResult<()> {
    Python::attach(|py| {
        if !f.bind(py).is_callable() {
            let ty = f.bind(py).get_type().name().map_or_else(|_| "object".to_string(), |n| n.to_string());
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "an updater must be callable as fn(key, recv, stored), not a {ty}"
            )));
        }
        Ok(())
    })?;
    let updater = PyUpdater { f, shared: Arc::downgrade(shared) };
    shared.kv.set_updater(updater).map_err(|e: Error| crate::errors::to_py(e))
}
