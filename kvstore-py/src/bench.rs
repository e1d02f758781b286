//! What `make bench` needs of the native module beyond the API (bench/python.py):
//! built only with the crate's `bench` feature (bench/python.sh), so that the
//! shipped wheel carries none of it.

use kvstore::{KVStore as Store, Keys, Values};
use pyo3::prelude::*;

use crate::arrays::Use;
use crate::errors::to_py;
use crate::store::{Arrays, PyStore, arrays_of, keys_of};

/// For `make bench` (bench/python.py): the seconds each of `runs` calls of
/// `op` ("push" or "pull") takes when made from Rust, on arrays wrapped once, so that
/// the Python rows are set against the same calls without Python, in the same process
/// and moment. Not part of the API.
#[pyfunction]
pub(crate) fn _time_calls_from_rust(
    py: Python<'_>,
    store: &PyStore,
    op: &str,
    key: &Bound<'_, PyAny>,
    arrays: &Bound<'_, PyAny>,
    runs: usize,
) -> PyResult<Vec<f64>> {
    crate::lifecycle::not_forked()?;
    let keys = keys_of(key)?;
    let kv = &store.shared.kv;
    type Call = fn(&Store, Keys, Values<'_>) -> kvstore::Result<()>;
    let (arrays, call): (Arrays, Call) = match op {
        "push" => (arrays_of(arrays, Use::Read, "value")?, |kv, k, v| kv.push(k, v, 0)),
        "pull" => (arrays_of(arrays, Use::Write, "out")?, |kv, k, v| kv.pull(k, v, 0)),
        _ => return Err(crate::errors::value_error(format!("op must be \"push\" or \"pull\", not {op:?}"))),
    };
    crate::detach(py, || {
        (0..runs)
            .map(|_| {
                let start = std::time::Instant::now();
                call(kv, keys.clone(), arrays.values())?;
                Ok(start.elapsed().as_secs_f64())
            })
            .collect::<kvstore::Result<Vec<_>>>()
    })
    .map_err(to_py)
}
