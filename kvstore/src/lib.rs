//! `kvstore`: every kind of store with its backends, in one crate.
//!
//! `kvstore-core` is the whole semantics (keys, arrays, the store, its engine and
//! optimizers); the GPU (`kvstore-cuda`) and the worker group over MPI
//! (`kvstore-mpi`) are backends plugged into it. This crate puts them together, as a
//! program or a binding wants them: [`create`] makes any kind of store (a `dist_*`
//! kind over MPI), [`gpu`] names a GPU context with the CUDA backend installed, and
//! [`HostMemory`] wraps memory that another runtime owns as a store array. The Java and
//! Python bindings make their stores here and keep only their marshalling.
//!
//! ```
//! use kvstore::NDArray;
//! let kv = kvstore::create("local")?;
//! kv.init("w", &NDArray::zeros(&[2])?)?;
//! kv.push("w", &[NDArray::ones(&[2])?, NDArray::ones(&[2])?], 0)?;
//! assert_eq!(kv.pull_new("w", 0)?.to_vec::<f32>()?, [2.0, 2.0]);
//! kvstore::finalize()?; // ends MPI in a `dist_*` program; nothing here
//! # Ok::<(), kvstore::Error>(())
//! ```
//!
//! # Features
//! - `cuda`: GPU contexts through CUDA, loaded at run time (a build needs no toolkit;
//!   a machine without a GPU gets [`Error::DeviceUnavailable`] for them).
//! - `mpi`: `dist_sync` and `dist_async` stores over MPI (needs `libopenmpi-dev` and
//!   `libclang-dev` to build). Without it, [`create`] answers
//!   [`Error::Unsupported`] for `dist_*` kinds.

#![deny(missing_docs)]

mod host;

pub use host::HostMemory;
pub use kvstore_core::*;

/// The job's commits: its name's variable, its folder, its newest commit (kvstore-commit).
pub use kvstore_commit::{COMMIT_DIR_VAR, JOB_VAR, job_folder, newest_commit};

/// The GPU backend, with this crate's `cuda` feature.
#[cfg(feature = "cuda")]
pub use kvstore_cuda as cuda;
/// The worker group over MPI (`dist_sync`, `dist_async`); its `mpi` feature is this
/// crate's.
pub use kvstore_mpi as mpi;

/// Whether this build makes `dist_*` stores over MPI (the `mpi` feature).
pub const HAS_MPI: bool = cfg!(feature = "mpi");

/// Whether this build has GPU contexts (the `cuda` feature); whether a GPU can be used
/// here is [`gpu`]'s answer.
pub const HAS_CUDA: bool = cfg!(feature = "cuda");

/// What a Rust program lacking the `mpi` feature is told to add.
const CARGO_ROUTE: &str = "this kvstore was built without MPI: give its dependency the feature \
     (`kvstore = { version = \"...\", features = [\"mpi\"] }` in Cargo.toml)";

/// Creates a store of `kind`: `local` and `device` as [`KVStore::create`] does;
/// `dist_sync` (and MXNet's synchronous spellings) and `dist_async` over the MPI job,
/// started on first use.
///
/// ```
/// let kv = kvstore::create("device")?;
/// assert_eq!((kv.kind(), kv.rank(), kv.num_workers()), ("device", 0, 1));
/// # Ok::<(), kvstore::Error>(())
/// ```
///
/// # Errors
/// [`Error::Unsupported`] for every `dist_*` kind in a build without the `mpi` feature;
/// otherwise as [`KVStore::create`] and `kvstore_mpi::create`.
pub fn create(kind: &str) -> Result<KVStore> {
    create_or_say(kind, CARGO_ROUTE)
}

/// As [`create`], for a binding: in a build without the `mpi` feature, a `dist_*`
/// kind's error says `without_mpi`, the binding's own way to a build with MPI (a jar,
/// a wheel), where [`create`] names the Cargo feature.
///
/// # Errors
/// As [`create`].
pub fn create_or_say(kind: &str, without_mpi: &str) -> Result<KVStore> {
    kvstore_mpi::create_or_say(kind, without_mpi)
}

/// Ends MPI at the end of a `dist_*` program, on every rank after its last call.
/// Without MPI (the feature, or a program that made no `dist_*` store) it does nothing.
///
/// # Errors
/// [`Error::Backend`] when MPI fails to finalise.
pub fn finalize() -> Result<()> {
    kvstore_mpi::finalize()
}

/// The context of GPU `id`, with the CUDA backend installed (once per process: the
/// first GPU context a program names installs it). Without the `cuda` feature the
/// context is returned as it is, and every use of it fails with
/// [`Error::DeviceUnavailable`], as it would on a machine without a GPU.
///
/// ```
/// // On a machine without a GPU, or in a build without `cuda`, the answer says why.
/// match kvstore::gpu(0) {
///     Ok(ctx) => assert_eq!(ctx.to_string(), "gpu(0)"),
///     Err(e) => assert_eq!(e.kind(), kvstore::ErrorKind::DeviceUnavailable),
/// }
/// ```
///
/// # Errors
/// [`Error::DeviceUnavailable`], naming the context and why, when CUDA or the device
/// cannot be used; [`Error::Unsupported`] if another device backend is installed.
pub fn gpu(id: u32) -> Result<Context> {
    #[cfg(feature = "cuda")]
    kvstore_cuda::register().map_err(|e| match e {
        Error::DeviceUnavailable { reason, .. } => {
            Error::DeviceUnavailable { context: Context::gpu(id).to_string(), reason }
        }
        other => other,
    })?;
    Ok(Context::gpu(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_kinds_are_made_here_and_dist_kinds_need_mpi_or_say_so() {
        assert_eq!(create("Local").expect("local").kind(), "local");
        assert_eq!(create("lcoal").err().map(|e| e.kind()), Some(ErrorKind::UnknownStoreKind));
        if !HAS_MPI {
            for kind in ["dist_sync", "dist_async", "dist_device_sync"] {
                let e = create(kind).expect_err("no mpi");
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                assert!(e.to_string().contains(r#"kvstore = { version"#), "{e}");
                let e = create_or_say(kind, "use the other jar").expect_err("no mpi");
                assert!(e.to_string().contains("use the other jar"), "{e}");
            }
        }
    }

    #[test]
    fn a_gpu_context_names_itself_when_it_cannot_be_used() {
        match gpu(3) {
            Ok(ctx) => assert_eq!(ctx, Context::gpu(3)),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::DeviceUnavailable, "{e}");
                assert!(e.to_string().contains("gpu(3)"), "{e}");
            }
        }
    }
}
