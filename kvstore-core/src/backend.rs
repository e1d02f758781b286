//! For backend authors: the traits and types a crate implements to give stores a new
//! kind of device or a new group of workers. Users of stores need nothing from here.
//!
//! - **A device backend**, as `kvstore-cuda`: implement [`DeviceBackend`] (and
//!   [`DeviceBuffer`] for its memory, [`PinnedMemory`] for page-locked host memory if it
//!   has any) and install it once per process with [`register_backend`]; from then on
//!   `gpu(i)` contexts are its devices. [`device_backend`] returns the installed one.
//!   The optional [`DeviceBackend::optimizer_step`] runs one optimizer step as a fused
//!   kernel ([`FusedStep`], [`FusedRule`], [`FusedArrays`]), as MXNet's update operators
//!   (`sgd_mom_update`, `adam_update`, ... in `src/operator/optimizer_op-inl.h`). MXNet
//!   had no such seam: its devices were compiled in (`Context::kGPU`, `mshadow`).
//! - **A group of workers**, as `kvstore-mpi`: implement [`Collective`] and give it to
//!   [`KVStoreBuilder::collective`](crate::KVStoreBuilder::collective) to build a
//!   `dist_sync` store. It stands where MXNet's `KVStoreDist` talked to the parameter
//!   servers through ps-lite (`src/kvstore/kvstore_dist.h`).
//! - **The data mover** of a store: [`Comm`] (MXNet's `Comm` in `src/kvstore/comm.h`),
//!   its jobs [`ReduceJob`] and [`BroadcastJob`], its view of a push's keys
//!   ([`PushKey`]) and what it keeps per key ([`KeyBuffers`]); [`CommCpu`] (MXNet's
//!   `CommCPU`, `local` and `dist_sync` stores) and [`CommDevice`] (MXNet's
//!   `CommDevice`, `device` stores) implement it. A new one (NCCL) plugs in beside them.
//! - [`in_background`]: whether the current thread runs a call in the background of
//!   its caller (a backend then waits without spinning); [`finish_group_calls`]: runs
//!   and waits for the calls of a group's stores (before the group shuts down).
//!
//! ```
//! use kvstore_core::backend::{Comm, CommCpu, ReduceJob};
//! use kvstore_core::NDArray;
//!
//! let comm = CommCpu::new(1)?;
//! let (a, b, out) = (NDArray::full(&[3], 1.0)?, NDArray::full(&[3], 2.0)?, NDArray::zeros(&[3])?);
//! comm.reduce(&[ReduceJob { inputs: &[&a, &b], out: &out }])?;
//! assert_eq!(out.to_vec::<f32>()?, vec![3.0; 3]);
//! assert!(kvstore_core::backend::device_backend().is_none()); // no GPU backend installed
//! # Ok::<(), kvstore_core::Error>(())
//! ```

pub use crate::collective::{Collective, MAX_RECORD, check_parts, gather_parts_through_bytes};
pub use crate::comm::{BroadcastJob, Claims, Comm, CommCpu, CommDevice, KeyBuffers, PushKey, ReduceJob};
pub use crate::device::{
    DeviceBackend, DeviceBuffer, FusedArrays, FusedRule, FusedStep, PinnedMemory, backend as device_backend,
    register_backend,
};
pub use crate::engine::in_background;
pub use crate::kvstore::{Durable, MakeDurable, Peers, Said, Seam, Snapshot, install_durability, ranks, word};
pub use crate::remote::{Handler, Remote};

/// Runs `f` on the bytes of `array` (read-locked meanwhile; a device array's staged
/// through host memory): for transports that move arrays of every dtype alike, straight
/// from their memory. The bytes are aligned for the array's dtype.
///
/// # Errors
/// A backend error for a device array.
pub fn with_bytes<R>(array: &crate::NDArray, f: impl FnOnce(&[u8]) -> R) -> crate::Result<R> {
    Ok(f(array.read()?.bytes()))
}

/// [`with_bytes`] of many arrays at once, each read-locked (in order) while `f` runs: a
/// transport's messages of several arrays in flight together, straight from their
/// memory. (An array's read lock is recursive: one given twice is locked twice.)
///
/// # Errors
/// A backend error for a device array.
pub fn with_all_bytes<R>(arrays: &[&crate::NDArray], f: impl FnOnce(Vec<&[u8]>) -> R) -> crate::Result<R> {
    let held = arrays.iter().map(|a| a.read()).collect::<crate::Result<Vec<_>>>()?;
    Ok(f(held.iter().map(|h| h.bytes()).collect()))
}

/// [`with_all_bytes`], mutably: each array write-locked (in order) while `f` runs, a
/// device array's staged copy written back before it returns. The arrays must be
/// distinct storages (one given twice would wait for itself).
///
/// # Errors
/// A backend error for a device array.
pub fn with_all_bytes_mut<R>(arrays: &[&crate::NDArray], f: impl FnOnce(Vec<&mut [u8]>) -> R) -> crate::Result<R> {
    let mut held = arrays.iter().map(|a| a.write()).collect::<crate::Result<Vec<_>>>()?;
    let r = f(held.iter_mut().map(|h| h.bytes_mut()).collect());
    for h in held {
        h.finish()?;
    }
    Ok(r)
}

/// For transports, at the end of a job (as `kvstore_mpi::finalize` does): stops the
/// timeline on every worker of `group` (each calls this) and merges every worker's
/// file into the timeline's path on worker 0, which logs the slowest worker
/// (`slowest rank: R (...)`) when `KVSTORE_TIMELINE` is set. Returns the file written
/// here; `None` where the timeline was off everywhere.
///
/// # Errors
/// [`crate::Error::Io`] when a file cannot be read or written; the group's errors.
pub fn finish_timeline(group: &dyn Collective) -> crate::Result<Option<std::path::PathBuf>> {
    crate::kvstore::finish_timeline(group, crate::settings::timeline_set())
}

/// Runs every call that the stores of the worker group `group` (the [`Collective`]
/// given to their builder) have queued or hold back for fusion, and waits until they
/// are done, with the calls made meanwhile: what a group's backend does before it shuts
/// down (as `kvstore_mpi::finalize`), so that no call is left unrun, or runs on a
/// group that is gone. Each call's result goes to its handle, as ever. Nothing to do
/// for a group with no stores, and from one of the group's engine threads (whose call
/// could never finish then).
pub fn finish_group_calls(group: &dyn Collective) {
    crate::engine::finish_calls_of_group(group as *const dyn Collective as *const () as usize);
}
