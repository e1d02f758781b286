//! `kvstore-mpi`: `dist_sync` stores across processes and machines over MPI.
//!
//! A `dist_sync` store reduces the values pushed in each process, then sums those
//! across every process of the MPI job (allreduce, fused into buckets), then runs the
//! same updater or optimizer in every process, so every replica holds the same value.
//! `init` takes rank 0's value. Launch with `mpirun -np 4 app`, `mpirun -np 8 -H
//! a:4,b:4 app` or `srun`; run without a launcher, a program is a job of one worker.
//!
//! ```no_run
//! use kvstore_core::NDArray;
//! let kv = kvstore_mpi::create("dist_sync")?;
//! kv.init("w", &NDArray::zeros(&[2])?)?;              // every rank gets rank 0's value
//! let g = NDArray::full(&[2], (kv.rank() + 1) as f64)?;
//! kv.push("w", &g, 0)?;                                // summed over the ranks
//! kvstore_mpi::finalize()?;                            // on every rank, at the end
//! # Ok::<(), kvstore_core::Error>(())
//! ```
//!
//! # Bucket size
//! Small keys share allreduce buckets of 4 MiB; big keys span several. Set the size with
//! the environment variable `KVSTORE_MPI_BUCKET_BYTES` (read when MPI starts; a value
//! that is not a number makes [`create`] fail) or `group()?.set_bucket_bytes(n)`, the
//! same on every rank. Fusion pays where one allreduce is expensive (across machines);
//! through shared memory on one machine a bucket per key is about as fast.
//!
//! # Shared memory
//! Where every rank runs on one machine, fused buckets go through memory the ranks
//! share (an MPI-3 shared window) instead of MPI's messages, with the same bits. Turn
//! it off with `KVSTORE_MPI_SHARED_MEMORY=0` or `group()?.set_shared_memory(false)`;
//! a job confined to other transports (`mpirun --mca btl self,tcp`) does without it.
//!
//! # Hosts
//! A big key (a bucket or more) is summed with each rank owning 1/n of it. Across
//! machines with the same power of two (2 or more) of consecutive ranks each, it goes host by host
//! instead: through each machine's shared memory first, then over the network between
//! the machines, with the same bits (`group()?.used_hosts()` says whether the last big
//! key did). `KVSTORE_MPI_HOST_RANKS=K` makes blocks of K ranks count as machines, for
//! tests.
//!
//! # Features
//! `mpi` links MPI (needs `libopenmpi-dev` and `libclang-dev`). Without it, [`create`]
//! answers `Unsupported` for `dist_*` kinds.
//!
//! # Errors
//! Fail-stop, as MPI: a failed MPI call, a panic, or a rank that exits without
//! [`finalize`] aborts the whole job, and `mpirun` stops every rank within seconds, so
//! no call waits forever on a peer that is gone.

#[cfg(feature = "mpi")]
mod agree;
#[cfg(feature = "mpi")]
mod big;
#[cfg(feature = "mpi")]
mod clock;
#[cfg(feature = "mpi")]
mod collective;
#[cfg(feature = "mpi")]
mod fused;
#[cfg(feature = "mpi")]
mod group;
#[cfg(feature = "mpi")]
mod hosts;
#[cfg(feature = "mpi")]
mod parts;
#[cfg(feature = "mpi")]
mod remote;
#[cfg(feature = "mpi")]
mod runtime;
#[cfg(feature = "mpi")]
mod scatter;
#[cfg(feature = "mpi")]
mod settings;
#[cfg(feature = "mpi")]
mod shm;
#[cfg(feature = "mpi")]
mod tree;
#[cfg(feature = "mpi")]
mod watchdog;
#[cfg(feature = "mpi")]
mod wire;

#[cfg(feature = "mpi")]
pub use group::MpiGroup;
#[cfg(feature = "mpi")]
pub use remote::{MpiRemote, remote};
#[cfg(feature = "mpi")]
pub use runtime::{finalize, group};
#[cfg(feature = "mpi")]
pub use settings::{BUCKET_BYTES_VAR, HOST_CHUNK_BYTES_VAR, HOST_RANKS_VAR, SHARED_MEMORY_VAR, TIMEOUT_VAR};

#[cfg(not(feature = "mpi"))]
use kvstore_core::Error;
use kvstore_core::{KVStore, Result};

/// Creates a store of `kind`: `dist_sync` (and MXNet's synchronous spellings) and
/// `dist_async` over the MPI job; any other kind as `KVStore::create` does.
///
/// # Errors
/// [`kvstore_core::Error::Unsupported`], in a build without the `mpi` feature, for every
/// `dist_*` kind; otherwise as `KVStore::create`.
pub fn create(kind: &str) -> Result<KVStore> {
    create_or_say(kind, CARGO_ROUTE)
}

/// What a Rust program lacking the `mpi` feature is told to add.
const CARGO_ROUTE: &str = "this kvstore-mpi was built without MPI: give its dependency the feature \
     (`kvstore-mpi = { path = \"...\", features = [\"mpi\"] }` in Cargo.toml)";

/// As [`create`], for a binding: in a build without the `mpi` feature, a `dist_*` kind's
/// error says `without_mpi`, the binding's own way to a build with MPI (the jar or the
/// wheel), where [`create`] names the Cargo feature.
///
/// # Errors
/// As [`create`].
pub fn create_or_say(kind: &str, without_mpi: &str) -> Result<KVStore> {
    // Its commits (any kind of store, with a job name).
    kvstore_commit::install();
    let lower = kind.to_ascii_lowercase();
    if !lower.starts_with("dist") {
        return KVStore::create(kind);
    }
    if lower.contains("async") {
        return with_remote(kind, without_mpi);
    }
    with_group(kind, without_mpi)
}

/// Finalises MPI at the end of a `dist_sync` program. Without the `mpi` feature there
/// is no MPI to finalise, and this does nothing.
///
/// # Errors
/// None without the `mpi` feature.
#[cfg(not(feature = "mpi"))]
pub fn finalize() -> Result<()> {
    Ok(())
}

#[cfg(feature = "mpi")]
fn with_group(kind: &str, _without_mpi: &str) -> Result<KVStore> {
    KVStore::builder(kind).collective(group()?).build()
}

#[cfg(feature = "mpi")]
fn with_remote(kind: &str, _without_mpi: &str) -> Result<KVStore> {
    KVStore::builder(kind).remote(remote()?).build()
}

#[cfg(not(feature = "mpi"))]
fn with_remote(kind: &str, without_mpi: &str) -> Result<KVStore> {
    with_group(kind, without_mpi)
}

#[cfg(not(feature = "mpi"))]
fn with_group(kind: &str, without_mpi: &str) -> Result<KVStore> {
    Err(Error::Unsupported {
        what: format!("store kind \"{}\"", kvstore_core::shorten(kind)),
        hint: without_mpi.to_string(),
    })
}

#[cfg(test)]
mod tests {
    /// Without the feature (with it, `dist_async` is an MPI job's store).
    #[cfg(not(feature = "mpi"))]
    #[test]
    fn local_kinds_pass_through_and_async_is_refused() {
        assert_eq!(super::create("local").expect("local").kind(), "local");
        let e = super::create("dist_async").expect_err("async");
        assert_eq!(e.kind(), kvstore_core::ErrorKind::Unsupported);
    }

    /// Without the feature, the error says which crate lacks it and how to add it.
    #[cfg(not(feature = "mpi"))]
    #[test]
    fn without_the_feature_dist_sync_names_the_crate_and_the_feature() {
        for kind in ["dist_sync", "dist_async"] {
            let e = super::create(kind).expect_err("no mpi").to_string();
            assert!(e.contains("kvstore-mpi") && e.contains(r#"features = ["mpi"]"#), "{e}");
            // The JVM's and Python's routes are theirs to name, not a Rust program's.
            assert!(!e.contains("make jar") && !e.contains("make python"), "{e}");
        }
    }

    /// A binding's error names its own route to MPI, and only that.
    #[cfg(not(feature = "mpi"))]
    #[test]
    fn a_binding_names_its_own_route() {
        let e = super::create_or_say("dist_sync", "use the kvstore-mpi jar").expect_err("no mpi").to_string();
        assert!(e.ends_with("use the kvstore-mpi jar"), "{e}");
        assert!(!e.contains("Cargo.toml"), "{e}");
    }
}
