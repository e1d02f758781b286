//! `kvstore._kvstore.KVStore`: the store, with MXNet's argument forms. The package's
//! `kvstore.KVStore` subclasses it (adding the optimizer objects and docs), so a call
//! made from Python reaches this code with no Python frame in between.

use std::collections::HashSet;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use kvstore::{KVStore as Store, Key, Keys, NDArray, Values};
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};

use crate::arrays::{CallArrays, Use, view, wrap};
use crate::errors::to_py;
use crate::pending::Pending;

/// A call's keys: one, or a list.
pub(crate) fn keys_of(obj: &Bound<'_, PyAny>) -> PyResult<Keys> {
    if is_list(obj) {
        return Ok(Keys::Many(map_items(obj, key_of)?));
    }
    Ok(Keys::One(key_of(obj)?))
}

/// One key: a str, or an int (`3` is the key `"3"`).
pub(crate) fn key_of(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Key::from(s.to_str()?));
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        return Ok(match obj.extract::<i64>() {
            Ok(i) => Key::from(i),
            Err(_) => Key::from(obj.str()?.to_str()?),
        });
    }
    let ty = obj.get_type().name().map_or_else(|_| "object".to_string(), |n| n.to_string());
    Err(crate::errors::type_error(format!("a key must be an int or a str, not {ty}")))
}

/// A call's arrays (values or outs) in the forms MXNet takes: one array, a list (one
/// key's arrays, or one per key), or a list with lists in it (one list per key).
pub(crate) enum Arrays {
    One(NDArray),
    Many(Vec<NDArray>),
    Nested(Vec<Vec<NDArray>>),
}

impl Arrays {
    pub(crate) fn values(&self) -> Values<'_> {
        match self {
            Arrays::One(a) => Values::One(a),
            Arrays::Many(v) => Values::Many(v),
            Arrays::Nested(v) => Values::Nested(v),
        }
    }
}

impl Arrays {
    fn any_on_device(&self) -> bool {
        let on_device = |a: &NDArray| !a.context().is_cpu();
        match self {
            Arrays::One(a) => on_device(a),
            Arrays::Many(v) => v.iter().any(on_device),
            Arrays::Nested(v) => v.iter().flatten().any(on_device),
        }
    }
}

/// `result`, once the GPU work of a blocking call on `arrays` is done when one of them
/// is a tensor on a GPU: the call returns with its writes to (and reads of) the
/// caller's tensors finished, whatever stream the caller uses next.
fn settled(result: kvstore::Result<()>, arrays: &[&Arrays]) -> kvstore::Result<()> {
    result?;
    #[cfg(feature = "cuda")]
    if arrays.iter().any(|a| a.any_on_device()) {
        kvstore::cuda::synchronize()?;
    }
    #[cfg(not(feature = "cuda"))]
    let _ = arrays;
    Ok(())
}

/// `err`, the reason this binding could not convert an argument of a call, once the
/// call was made all the same (by `make`) with the refusal in its arrays' place
/// (`Values::Refused`, `RowSparsePushes::Refused`): the store fails it as it fails the arguments it refuses itself,
/// so under `dist_sync` it takes its step and fails on every worker, and the workers'
/// next calls stay matched (refused here alone, it would be missing on this worker).
pub(crate) fn refusing(
    py: Python<'_>,
    err: PyErr,
    make: impl FnOnce(&kvstore::Error) -> kvstore::Result<()> + Send,
) -> PyErr {
    let reason = kvstore::Error::invalid_argument(err.value(py).to_string());
    crate::detach(py, || drop(make(&reason)));
    err
}

/// The keys of a call whose arguments were refused (they are not read).
pub(crate) fn no_keys() -> Keys {
    Keys::Many(Vec::new())
}

fn is_list(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()
}

/// `obj` as a call's arrays (see [`Arrays`]), wrapped in place for `usage`.
pub(crate) fn arrays_of<'py>(obj: &Bound<'py, PyAny>, usage: Use, what: &str) -> PyResult<Arrays> {
    arrays_in(obj, usage, what, None)
}

/// [`arrays_of`] for a blocking call, reusing the arrays of earlier calls (`call` holds
/// their objects until it returns: see `arrays::REUSED`).
fn arrays_in<'py>(
    obj: &Bound<'py, PyAny>,
    usage: Use,
    what: &str,
    call: Option<&mut CallArrays<'py>>,
) -> PyResult<Arrays> {
    let mut reuse = call.and_then(|c| c.reusing());
    if !is_list(obj) {
        return Ok(Arrays::One(wrap(obj, usage, what, reuse.as_mut())?));
    }
    let items = items_of(obj)?;
    let mut wrap_one = |a: &Bound<'py, PyAny>| wrap(a, usage, what, reuse.as_mut());
    if !items.iter().any(is_list) {
        return Ok(Arrays::Many(items.iter().map(&mut wrap_one).collect::<PyResult<_>>()?));
    }
    let nested = items
        .iter()
        .map(|item| match is_list(item) {
            true => map_items(item, &mut wrap_one),
            false => Ok(vec![wrap_one(item)?]),
        })
        .collect::<PyResult<_>>()?;
    Ok(Arrays::Nested(nested))
}

/// The items of `obj`, a list or tuple, or of another iterable.
fn items_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    obj.try_iter()?.collect()
}

/// `f` of each item of `obj`, a list or tuple (read in place: no iterator object), or
/// of another iterable.
pub(crate) fn map_items<'py, T>(
    obj: &Bound<'py, PyAny>,
    mut f: impl FnMut(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return list.iter().map(|item| f(&item)).collect();
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return tuple.iter().map(|item| f(&item)).collect();
    }
    obj.try_iter()?.map(|item| f(&item?)).collect()
}

/// The store, shared by its Python object and its updater's calls.
pub(crate) struct Shared {
    pub(crate) kv: Store,
    /// Keys first given as ints: an updater receives them as ints again.
    pub(crate) int_keys: RwLock<HashSet<Key>>,
}

impl Shared {
    /// `key` as the caller first wrote it: an int for an int key.
    pub(crate) fn key_object<'py>(&self, py: Python<'py>, key: &Key) -> PyResult<Bound<'py, PyAny>> {
        if self.int_keys.read().contains(key) {
            return match key.as_str().parse::<i64>() {
                Ok(i) => Ok(i.into_pyobject(py)?.into_any()),
                // Wider than 64 bits: Python's int of its digits.
                Err(_) => py.get_type::<PyInt>().call1((key.as_str(),)),
            };
        }
        Ok(PyString::new(py, key.as_str()).into_any())
    }
}

/// A key-value store for data-parallel training, with MXNet's Python API.
///
/// Create one with ``kvstore.create(name)``. See the package's ``KVStore`` for the
/// methods' documentation.
#[pyclass(subclass, frozen, module = "kvstore._kvstore", name = "KVStore")]
pub(crate) struct PyStore {
    /// Dropped by hand (see `Drop`): taken once, when the Python object goes.
    pub(crate) shared: ManuallyDrop<Arc<Shared>>,
}

impl Drop for PyStore {
    /// Dropping the store waits for its queued calls, whose Python updaters and
    /// callbacks need the GIL: the GIL is released meanwhile (holding it deadlocked).
    fn drop(&mut self) {
        // SAFETY: `shared` is taken once, here, and never used after.
        let shared = unsafe { ManuallyDrop::take(&mut self.shared) };
        // A child of fork(): the store's threads and locks are its parent's.
        if crate::lifecycle::forked() {
            std::mem::forget(shared);
            return;
        }
        // (Python frees the object with the GIL held, so this attach is the thread's
        // own; when the interpreter cannot be entered, the closure, and the store with
        // it, is dropped unrun.)
        let _ = Python::try_attach(move |py| crate::detach(py, move || drop(shared)));
    }
}

/// Records which keys of an `init` or `broadcast` were ints.
pub(crate) fn remember_int_keys(shared: &Shared, key: &Bound<'_, PyAny>) -> PyResult<()> {
    let int_key = |k: &Bound<'_, PyAny>| -> PyResult<Option<Key>> {
        let int = k.is_instance_of::<PyInt>() && !k.is_instance_of::<PyBool>();
        int.then(|| key_of(k)).transpose()
    };
    let ints: Vec<Key> = match is_list(key) {
        true => map_items(key, int_key)?.into_iter().flatten().collect(),
        false => int_key(key)?.into_iter().collect(),
    };
    if !ints.is_empty() {
        shared.int_keys.write().extend(ints);
    }
    Ok(())
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (name = "local"))]
    fn new(py: Python<'_>, name: &str) -> PyResult<Self> {
        crate::lifecycle::not_forked()?;
        // (Before the store starts its threads: a child of a fork from now on has some
        // of them missing.)
        crate::lifecycle::store_made();
        let kv = crate::detach(py, || crate::create_store(name)).map_err(to_py)?;
        Ok(PyStore { shared: ManuallyDrop::new(Arc::new(Shared { kv, int_keys: RwLock::new(HashSet::new()) })) })
    }

    /// Initializes a key (or a list of keys) with its value, copied into the store.
    /// Each key is initialized once: again is ``AlreadyInitializedError``. Under
    /// ``dist_sync`` rank 0's value wins.
    fn init(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let refused = |e| refusing(py, e, |r| self.shared.kv.init(no_keys(), Values::Refused(r)));
        let keys = keys_of(key).map_err(refused)?;
        // (Not reused: a key is initialised once.)
        let values = match arrays_of(value, Use::Read, "value") {
            Err(e) if crate::errors::is_row_sparse_value(py, &e) => return self.init_row_sparse(py, key, value),
            values => values.map_err(refused)?,
        };
        crate::detach(py, || settled(self.shared.kv.init(keys, values.values()), &[&values])).map_err(to_py)?;
        remember_int_keys(&self.shared, key)?;
        Ok(())
    }

    /// Pushes values into the store.
    ///
    /// Forms (MXNet's): one key and one array, ``push(3, a)``; one key and a list,
    /// ``push(3, [a, b, c])``, summed; a list of keys with one array each,
    /// ``push([3, 5], [a, b])``; a list of keys with a list each, ``push([3, 5],
    /// [[a, b], [c]])``. A key repeated in a list has its values summed.
    ///
    /// Each key's values are summed (left to right, in the order given), then the
    /// optimizer or updater merges the sum into the stored value; with neither set,
    /// the sum replaces it. Under ``dist_sync`` the sums are also summed across the
    /// workers first. Values are numpy (or DLPack) arrays on the host, read in place.
    /// `priority` is accepted for MXNet's sake. Errors change nothing: a push that
    /// fails leaves every key as it was.
    #[pyo3(signature = (key, value, priority = 0))]
    fn push(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>, priority: i32) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let refused = |e| refusing(py, e, |r| self.shared.kv.push(no_keys(), Values::Refused(r), priority));
        let keys = keys_of(key).map_err(refused)?;
        let mut call = CallArrays::default();
        let values = match arrays_in(value, Use::Read, "value", Some(&mut call)) {
            Err(e) if crate::errors::is_row_sparse_value(py, &e) => {
                return self.push_row_sparse(py, key, value, priority);
            }
            values => values.map_err(refused)?,
        };
        crate::detach(py, || settled(self.shared.kv.push(keys, values.values(), priority), &[&values])).map_err(to_py)
    }

    /// Pulls stored values into `out`, written in place, and returns ``None``. The
    /// forms are ``push``'s: ``pull(3, out=a)``, ``pull(3, out=[a, b])`` (each
    /// written), ``pull([3, 5], out=[a, b])``, ``pull([3, 5], out=[[a, b], [c]])``.
    /// Outs must be writable, C-contiguous and of the key's shape and dtype.
    ///
    /// With no `out`, pulls into new numpy arrays and returns them: one array for one
    /// key, a list for a list of keys.
    #[pyo3(signature = (key, out = None, priority = 0, ignore_sparse = true))]
    fn pull<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        priority: i32,
        ignore_sparse: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        crate::lifecycle::not_forked()?;
        let _ = ignore_sparse;
        let keys = keys_of(key)?;
        let Some(out) = out else {
            return self.pull_new(py, keys, priority).map(Some);
        };
        let mut call = CallArrays::default();
        let outs = arrays_in(out, Use::Write, "out", Some(&mut call))?;
        crate::detach(py, || settled(self.shared.kv.pull(keys, outs.values(), priority), &[&outs])).map_err(to_py)?;
        Ok(None)
    }

    /// Pushes `value`, then pulls the result into `out`, in one call; with no `out`,
    /// into the pushed arrays themselves (MXNet's rule), which must then be writable.
    #[pyo3(signature = (key, value, out = None, priority = 0))]
    fn pushpull(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        priority: i32,
    ) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let refused =
            |e| refusing(py, e, |r| self.shared.kv.pushpull_in_place(no_keys(), Values::Refused(r), priority));
        let keys = keys_of(key).map_err(refused)?;
        let mut call = CallArrays::default();
        match out {
            Some(out) => {
                let values = arrays_in(value, Use::Read, "value", Some(&mut call)).map_err(refused)?;
                let outs = arrays_in(out, Use::Write, "out", Some(&mut call)).map_err(refused)?;
                crate::detach(py, || {
                    settled(self.shared.kv.pushpull(keys, values.values(), outs.values(), priority), &[&values, &outs])
                })
                .map_err(to_py)
            }
            None => {
                let values = arrays_in(value, Use::Write, "value (written: pushpull with no out)", Some(&mut call))
                    .map_err(refused)?;
                crate::detach(py, || {
                    settled(self.shared.kv.pushpull_in_place(keys, values.values(), priority), &[&values])
                })
                .map_err(to_py)
            }
        }
    }

    /// Initializes the keys with `value` and pulls them into `out`: ``init`` then
    /// ``pull``. A key broadcast twice is ``AlreadyInitializedError``.
    #[pyo3(signature = (key, value, out, priority = 0))]
    fn broadcast(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        priority: i32,
    ) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let refused = |e| {
            refusing(py, e, |r| self.shared.kv.broadcast(no_keys(), Values::Refused(r), Values::Refused(r), priority))
        };
        let keys = keys_of(key).map_err(refused)?;
        // (Not reused: a key is broadcast once.)
        let values = arrays_of(value, Use::Read, "value").map_err(refused)?;
        let outs = arrays_of(out, Use::Write, "out").map_err(refused)?;
        crate::detach(py, || {
            settled(self.shared.kv.broadcast(keys, values.values(), outs.values(), priority), &[&values, &outs])
        })
        .map_err(to_py)?;
        remember_int_keys(&self.shared, key)?;
        Ok(())
    }

    /// Sets a Python updater ``fn(key, recv, stored)`` (``None``: back to assignment).
    fn _set_updater(&self, updater: Option<Py<PyAny>>) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        match updater {
            Some(f) => crate::updater::install(&self.shared, f),
            None => self.shared.kv.clear_updater().map_err(to_py),
        }
    }

    /// Sets the optimizer described by `json` (the package's optimizer classes make it).
    fn _set_optimizer_json(&self, py: Python<'_>, json: &str) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let opt = kvstore::OptimizerSpec::from_json(json).and_then(|s| s.build()).map_err(to_py)?;
        crate::detach(py, || self.shared.kv.set_optimizer(opt)).map_err(to_py)
    }

    /// The name of the optimizer set, or ``None``.
    fn _optimizer_name(&self) -> PyResult<Option<&'static str>> {
        crate::lifecycle::not_forked()?;
        Ok(self.shared.kv.optimizer_name())
    }

    /// Writes the optimizer's state (every key's, its counters, its hyper-parameters)
    /// to `fname`. `dump_optimizer` is accepted for MXNet's sake: the file always holds
    /// the hyper-parameters.
    #[pyo3(signature = (fname, dump_optimizer = false))]
    fn save_optimizer_states(&self, py: Python<'_>, fname: std::path::PathBuf, dump_optimizer: bool) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let _ = dump_optimizer;
        crate::detach(py, || self.shared.kv.save_optimizer_states(&fname)).map_err(to_py)
    }

    /// Loads an optimizer state file written by ``save_optimizer_states``.
    fn load_optimizer_states(&self, py: Python<'_>, fname: std::path::PathBuf) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.load_optimizer_states(&fname)).map_err(to_py)
    }

    /// Writes every key's value and optimizer state to `path` (one consistent
    /// snapshot), for ``load_checkpoint``.
    fn save_checkpoint(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.save_checkpoint(&path)).map_err(to_py)
    }

    /// Loads a checkpoint written by ``save_checkpoint``.
    fn load_checkpoint(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.load_checkpoint(&path)).map_err(to_py)
    }

    /// The store's kind, as given to ``create``.
    #[getter]
    fn r#type(&self) -> String {
        self.shared.kv.kind().to_string()
    }

    /// This worker's rank (0 outside ``dist_sync``).
    #[getter]
    fn rank(&self) -> usize {
        self.shared.kv.rank()
    }

    /// The number of workers (1 outside ``dist_sync``).
    #[getter]
    fn num_workers(&self) -> usize {
        self.shared.kv.num_workers()
    }

    /// Waits until every worker reached this barrier (at once with one worker).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.barrier()).map_err(to_py)
    }

    /// ``barrier``, under MXNet's other name.
    fn _barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.barrier(py)
    }

    /// Sets MXNet's 2-bit gradient compression, on a ``device`` or ``dist_sync`` store:
    /// ``set_gradient_compression({"type": "2bit", "threshold": 0.5})``. Every value
    /// pushed from then on, even a single one, is quantised to ``{-t, 0, +t}`` with a
    /// residual per key and per position in the push's list of values, which carries
    /// what was not sent to the next push; the quantised values are summed and merged
    /// as ever. ``init`` and ``pull`` are not compressed; values must be float32. Under
    /// ``dist_sync`` each worker quantises its own sum of a key (one residual per key)
    /// and the workers exchange 2-bit codes; every worker must set the same compression.
    /// ``{"type": "fp16"}`` or ``"bf16"`` (this store's extension, ``dist_sync`` only)
    /// rounds each worker's sums once to that 16-bit float for the wire instead.
    ///
    /// ``type`` is required and must be ``"2bit"``; ``threshold`` (default 0.5) must be
    /// above 0 (``ValueError`` otherwise); other names are ignored, as in MXNet. On a
    /// ``local`` store it raises ``UnsupportedError``.
    fn set_gradient_compression(&self, compression_params: &Bound<'_, PyAny>) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        let dict = compression_params.cast::<pyo3::types::PyDict>().map_err(|_| {
            crate::errors::type_error(
                "set_gradient_compression takes a dict, such as {\"type\": \"2bit\", \"threshold\": 0.5}",
            )
        })?;
        // As MXNet: every name and value as a string.
        let pairs: Vec<(String, String)> = dict
            .iter()
            .map(|(k, v)| Ok((k.str()?.to_str()?.to_string(), v.str()?.to_str()?.to_string())))
            .collect::<PyResult<_>>()?;
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.shared.kv.set_gradient_compression(&pairs).map_err(to_py)
    }

    /// Starts writing the timeline of this process's stores to ``path``: Chrome Trace
    /// Event Format JSON, which ``chrome://tracing`` and Perfetto open (as
    /// ``KVSTORE_TIMELINE=path`` does for a whole program). Under ``dist_sync`` each
    /// worker writes its own file beside ``path`` (``trace.rank1.json``) until
    /// ``stop_timeline`` merges them. Raises ``OSError`` when the file cannot be made.
    fn start_timeline(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        // (Making a file may block: other threads go on meanwhile.)
        crate::detach(py, || self.shared.kv.start_timeline(&path)).map_err(to_py)
    }

    /// Stops the timeline and closes its file; under ``dist_sync`` (every worker calls
    /// it, as ``barrier``) worker 0 merges every worker's file into the path it was
    /// started with. Returns the path of the file written here (the merged one on
    /// worker 0), or ``None`` when the timeline was off.
    fn stop_timeline(&self, py: Python<'_>) -> PyResult<Option<std::path::PathBuf>> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.stop_timeline()).map_err(to_py)
    }

    /// What this store did since it was made or ``reset_stats()``, as a dict:
    /// ``calls`` (by kind: ``{"push": {"calls": n, "keys": n}, ...}``),
    /// ``bytes_pushed``, ``bytes_pulled``, ``wire_bytes_sent``,
    /// ``wire_bytes_received``, ``phases`` (seconds in ``queued``, ``sum``, ``wire``,
    /// ``update``, ``copy``, ``ranks``), ``collectives`` and, under ``dist_sync``,
    /// ``ranks``: per worker ``{"rank", "held_up_s", "last", "mean_lateness_s"}`` (how
    /// long it held the others up in all, what names the slowest worker; at how many
    /// collectives it arrived last, more than 1 ms after the median of the others; and
    /// its mean lateness); and ``held``, the bytes the store holds on this worker now
    /// (``{"values", "state", "buffers"}``: values, optimizer state, push buffers; under
    /// ``dist_sync`` with owners, this worker's part of the state).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        use pyo3::types::PyDict;
        crate::lifecycle::not_forked()?;
        let s = self.shared.kv.stats();
        let d = PyDict::new(py);
        let calls = PyDict::new(py);
        for (op, c) in &s.calls {
            let one = PyDict::new(py);
            one.set_item("calls", c.calls)?;
            one.set_item("keys", c.keys)?;
            calls.set_item(op, one)?;
        }
        d.set_item("calls", calls)?;
        d.set_item("bytes_pushed", s.bytes_pushed)?;
        d.set_item("bytes_pulled", s.bytes_pulled)?;
        d.set_item("wire_bytes_sent", s.wire_bytes_sent)?;
        d.set_item("wire_bytes_received", s.wire_bytes_received)?;
        let phases = PyDict::new(py);
        for (phase, t) in &s.phases {
            phases.set_item(phase, t.as_secs_f64())?;
        }
        d.set_item("phases", phases)?;
        d.set_item("collectives", s.collectives)?;
        let ranks = s
            .ranks
            .iter()
            .map(|r| {
                let one = PyDict::new(py);
                one.set_item("rank", r.rank)?;
                one.set_item("held_up_s", r.held_up_s)?;
                one.set_item("last", r.last)?;
                one.set_item("mean_lateness_s", r.mean_lateness_s)?;
                Ok(one)
            })
            .collect::<PyResult<Vec<_>>>()?;
        d.set_item("ranks", ranks)?;
        let held = PyDict::new(py);
        held.set_item("values", s.held.values)?;
        held.set_item("state", s.held.state)?;
        held.set_item("buffers", s.held.buffers)?;
        d.set_item("held", held)?;
        Ok(d)
    }

    /// Commits the whole store as of this call (every key's value, the optimizer and
    /// its state, this rank's compression residuals, ``step`` and ``extra``, the
    /// program's own bytes) into memory that
    /// outlives the process (``/dev/shm``): a store made later by a run of the same job
    /// (``KVSTORE_JOB``, which ``kvstore-run`` sets) restores it (``restored()``). Under
    /// ``dist_sync`` and ``dist_async`` a collective, like ``barrier``. Raises ``InvalidArgumentError``
    /// for a store made without a job name, ``StoreIOError`` when it cannot be written.
    #[pyo3(signature = (step, extra = Vec::new()), text_signature = "(self, /, step, extra=b'')")]
    fn commit(&self, py: Python<'_>, step: u64, extra: Vec<u8>) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.commit(step, &extra)).map_err(to_py)
    }

    /// ``(step, extra)`` of the commit this store restored when it was made, or None.
    fn _restored<'py>(&self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, pyo3::types::PyBytes>)>> {
        crate::lifecycle::not_forked()?;
        Ok(self.shared.kv.restored().map(|r| (r.step, pyo3::types::PyBytes::new(py, &r.extra))))
    }

    /// Sets this store's counters (``stats()``) to zero.
    fn reset_stats(&self) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        self.shared.kv.reset_stats();
        Ok(())
    }

    /// Whether the store has a capability (``"optimizer"``).
    fn is_capable(&self, capability: &str) -> PyResult<bool> {
        crate::lifecycle::not_forked()?;
        self.shared.kv.is_capable(capability).map_err(to_py)
    }

    /// The keys the store holds, in the order they were initialized (ints as ints).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        crate::lifecycle::not_forked()?;
        self.shared.kv.keys().iter().map(|k| self.shared.key_object(py, k)).collect()
    }

    /// Waits until every non-blocking call made before it is done.
    fn wait_all(&self, py: Python<'_>) -> PyResult<()> {
        crate::lifecycle::not_forked()?;
        crate::detach(py, || self.shared.kv.wait_all()).map_err(to_py)
    }

    /// ``push``, non-blocking (see the package's docs for the rules on `copy`).
    #[pyo3(signature = (key, value, priority = 0, copy = true))]
    fn _push_async(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        priority: i32,
        copy: bool,
    ) -> PyResult<Pending> {
        crate::lifecycle::not_forked()?;
        let refused = |e| refusing(py, e, |r| self.shared.kv.push(no_keys(), Values::Refused(r), priority));
        let keys = keys_of(key).map_err(refused)?;
        let values = arrays_of(value, Use::Read, "value").and_then(|v| private(py, v, copy)).map_err(refused)?;
        Ok(Pending::new(crate::detach(py, || self.shared.kv.push_async(keys, values.values(), priority))))
    }

    /// ``pull``, non-blocking: `out` must not be read before the handle is done.
    #[pyo3(signature = (key, out, priority = 0))]
    fn _pull_async(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        priority: i32,
    ) -> PyResult<Pending> {
        crate::lifecycle::not_forked()?;
        let keys = keys_of(key)?;
        let outs = arrays_of(out, Use::Write, "out")?;
        Ok(Pending::new(crate::detach(py, || self.shared.kv.pull_async(keys, outs.values(), priority))))
    }

    /// ``pushpull``, non-blocking.
    #[pyo3(signature = (key, value, out = None, priority = 0, copy = true))]
    fn _pushpull_async(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        priority: i32,
        copy: bool,
    ) -> PyResult<Pending> {
        crate::lifecycle::not_forked()?;
        let refused =
            |e| refusing(py, e, |r| self.shared.kv.pushpull_in_place(no_keys(), Values::Refused(r), priority));
        let keys = keys_of(key).map_err(refused)?;
        match out {
            Some(out) => {
                let values =
                    arrays_of(value, Use::Read, "value").and_then(|v| private(py, v, copy)).map_err(refused)?;
                let outs = arrays_of(out, Use::Write, "out").map_err(refused)?;
                Ok(Pending::new(crate::detach(py, || {
                    self.shared.kv.pushpull_async(keys, values.values(), outs.values(), priority)
                })))
            }
            None => {
                let values = arrays_of(value, Use::Write, "value (written: pushpull with no out)").map_err(refused)?;
                Ok(Pending::new(crate::detach(py, || {
                    self.shared.kv.pushpull_in_place_async(keys, values.values(), priority)
                })))
            }
        }
    }

    /// ``broadcast``, non-blocking (the keys are initialized before it returns).
    #[pyo3(signature = (key, value, out, priority = 0))]
    fn _broadcast_async(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        priority: i32,
    ) -> PyResult<Pending> {
        crate::lifecycle::not_forked()?;
        let refused = |e| {
            refusing(py, e, |r| self.shared.kv.broadcast(no_keys(), Values::Refused(r), Values::Refused(r), priority))
        };
        let keys = keys_of(key).map_err(refused)?;
        let values = arrays_of(value, Use::Read, "value").map_err(refused)?;
        let outs = arrays_of(out, Use::Write, "out").map_err(refused)?;
        let handle =
            crate::detach(py, || self.shared.kv.broadcast_async(keys, values.values(), outs.values(), priority));
        remember_int_keys(&self.shared, key)?;
        Ok(Pending::new(handle))
    }
}

impl PyStore {
    /// A pull into new numpy arrays: one per key.
    fn pull_new<'py>(&self, py: Python<'py>, keys: Keys, priority: i32) -> PyResult<Bound<'py, PyAny>> {
        match keys {
            Keys::One(k) => {
                let a = crate::detach(py, || self.shared.kv.pull_new(k, priority)).map_err(to_py)?;
                view(py, &a)
            }
            Keys::Many(ks) => {
                let arrays = crate::detach(py, || {
                    ks.into_iter().map(|k| self.shared.kv.pull_new(k, priority)).collect::<Vec<_>>()
                })
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .map_err(to_py)?;
                let views = arrays.iter().map(|a| view(py, a)).collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, views)?.into_any())
            }
        }
    }
}

/// A non-blocking push's values as the call reads them: private copies (`copy`), or
/// the caller's own arrays, which must then not change until the call is done. The
/// copies count toward the store's bound on copied bytes (`max_copied_bytes`) until
/// the call is done with them, so a loop that pushes faster than the store runs the
/// calls waits instead of holding ever more copies.
fn private(py: Python<'_>, arrays: Arrays, copy: bool) -> PyResult<Arrays> {
    if !copy {
        return Ok(arrays);
    }
    // Without the GIL: a copy first waits for the array's pending writes, and the calls
    // that make them may be waiting for a Python updater.
    crate::detach(py, || {
        let dup = NDArray::copy_for_queued_call;
        Ok(match arrays {
            Arrays::One(a) => Arrays::One(dup(&a)?),
            Arrays::Many(v) => Arrays::Many(v.iter().map(dup).collect::<kvstore::Result<_>>()?),
            Arrays::Nested(v) => Arrays::Nested(
                v.iter().map(|l| l.iter().map(dup).collect::<kvstore::Result<_>>()).collect::<kvstore::Result<_>>()?,
            ),
        })
    })
    .map_err(to_py)
}
