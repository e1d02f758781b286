//! `kvstore-core`: the semantics of Apache MXNet's KVStore in safe Rust.
//!
//! A store holds one array per key. `init` a key with an array, `push` one or many
//! arrays into it (they are **summed**, then an [`Updater`] merges the sum into the
//! stored value; by default the sum replaces it), and `pull` the value into one or many
//! output arrays. This crate is the local store (`local` and `device` kinds) with the
//! data model every other crate of the project builds on: [`NDArray`], [`Context`],
//! [`DType`], [`Key`], [`KVStore`], the [`Updater`] trait and [`Error`]. What backend
//! crates implement (the [`backend::Comm`] trait with [`backend::CommCpu`] and [`backend::CommDevice`], device
//! backends, worker groups) lives in [`backend`].
//!
//! ```
//! use kvstore_core::{Context, KVStore, NDArray};
//!
//! let kv = KVStore::create("local")?;
//! let shape = [2, 3];
//! kv.init(3, &NDArray::ones(&shape)?.mul(2.0)?)?;
//! let a = NDArray::zeros(&shape)?;
//! kv.pull(3, &a, 0)?;
//! assert_eq!(a.to_vec::<f32>()?, vec![2.0; 6]);
//!
//! // Values pushed from several devices are summed.
//! let b: Vec<NDArray> = (0..4)
//!     .map(|i| NDArray::ones_with(&shape, Default::default(), Context::cpu(i)))
//!     .collect::<Result<_, _>>()?;
//! kv.push(3, &b, 0)?;
//! kv.pull(3, &a, 0)?;
//! assert_eq!(a.to_vec::<f32>()?, vec![4.0; 6]);
//!
//! // A list of keys with repeats: each key is updated once, with its sum.
//! kv.push(&["3", "3", "3"], &b[..3], 0)?;
//! kv.pull(3, &a, 0)?;
//! assert_eq!(a.to_vec::<f32>()?, vec![3.0; 6]);
//! # Ok::<(), kvstore_core::Error>(())
//! ```
//!
//! Every call has a non-blocking twin (`push_async`, `pull_async`, `pushpull_async`,
//! `broadcast_async`) that returns a [`Pending`] at once and runs on the store's engine
//! threads, each key's calls in the order they were made (see [`KVStore`]).
//!
//! # Deliberate differences from MXNet 1.9.1
//! MXNet 1.9.1's behaviour is the contract, except for thirteen deliberate fixes (push
//! always copies, shapes and dtypes are checked, sums are deterministic, a failed call
//! changes nothing, ...). They are listed once, each with its test, in the repository's
//! `docs/mxnet-differences.md`.
//!
//! # Features
//! None. GPU arrays come from `kvstore-cuda` (a [`backend::DeviceBackend`] installed
//! with [`backend::register_backend`]), `dist_sync` from `kvstore-mpi` (a
//! [`backend::Collective`]).
//!
//! # Errors
//! Every fallible call returns [`Result`] with an [`Error`] whose [`Error::kind`] is a
//! stable [`ErrorKind`]. No user input reaches a panic.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod backend;
mod backoff;
mod collective;
mod comm;
mod context;
mod device;
mod dtype;
mod engine;
mod error;
mod files;
mod key;
mod kvstore;
mod ndarray;
mod optimizer;
mod remote;
mod settings;
pub mod timeline;
mod updater;
mod waits;

pub use context::{Context, DeviceType};
pub use dtype::{DType, Element};
pub use error::{Cause, Error, ErrorKind, Result};
pub use key::{Key, Keys, shorten};
pub use kvstore::forms::{RowSparsePushes, Values};
pub use kvstore::{
    CallCount, HeldBytes, KVStore, KVStoreBuilder, Layout, Pending, RankStats, Release, Restored, Stats, StorageType,
};
pub use ndarray::{ForeignMemory, NDArray, Operand, RowSparse};
pub use optimizer::{
    LrScheduler, Optimizer, OptimizerBuilder, OptimizerSpec, ParamValue, ScheduleKind, ScheduleSpec, WarmupMode,
    optimizer_names,
};
pub use updater::Updater;

/// The version of this library (the workspace's version, shared by every crate, the
/// jar and its Maven artifact).
///
/// ```
/// assert_eq!(kvstore_core::VERSION.split('.').count(), 3);
/// ```
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Re-exported so that users name `f16` and `bf16` elements without a direct dependency.
pub use half::{bf16, f16};

/// Writes `line` and a newline to standard error in one `write` call. The ranks of a
/// job share their terminal or pipe, and `eprintln!` writes a line in pieces, so
/// that another rank's output could land inside it; a line of up to 4 KiB written
/// whole to a pipe is never split. What the crates of this workspace say on standard
/// error goes through it ([`say!`]).
#[doc(hidden)]
pub fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut text = line.to_string();
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `eprintln!`, written in one `write` call ([`say`]).
#[doc(hidden)]
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say(format_args!($($arg)*))
    };
}
