//! Shared test code of the kvstore workspace: the conformance cases of the reference
//! (`mxnet-kvstore-semantics.md` §10) and the property tests against a reference model
//! ([`properties`]), written once as functions of a [`Backend`]; [`backend_tests!`]
//! makes one `#[test]` of each per backend, so that the CPU, simulated-device and CUDA
//! test binaries run the same tests from one list (as candle's `test_device!`). The
//! `dist_sync` cases ([`dist_cases`]) are functions of a worker, for the thread and MPI
//! runners.
//!
//! The modules, one concern each: [`Backend`] and [`backend_tests!`] (`backends.rs`), the
//! conformance cases ([`cases`]), the property tests ([`properties`]), the checks of
//! device backends ([`device_checks`]) and the simulated one ([`sim_device`]), a worker
//! group of threads ([`ThreadGroup`], `threads.rs`) and the `dist_sync` cases it runs
//! ([`dist_cases`]), logging and gated updaters ([`CallLog`], [`Gate`], `updaters.rs`),
//! and small helpers ([`TempDir`], [`full`], `support.rs`).

/// The README's Rust quickstart, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The Rust programs of the guides under docs/, compiled and run as doc tests (those
/// that need kvstore-cuda or kvstore-mpi are `ignore` here and built and run as
/// projects by scripts/test-user-projects.sh).
#[cfg(doctest)]
pub mod guides {
    #[doc = include_str!("../../docs/nonblocking.md")]
    pub struct NonBlocking;
    #[doc = include_str!("../../docs/optimizers.md")]
    pub struct Optimizers;
    #[doc = include_str!("../../docs/checkpoints.md")]
    pub struct Checkpoints;
    #[doc = include_str!("../../docs/gpus.md")]
    pub struct Gpus;
    #[doc = include_str!("../../docs/dist-sync.md")]
    pub struct DistSync;
    #[doc = include_str!("../../docs/dist-async.md")]
    pub struct DistAsync;
    #[doc = include_str!("../../docs/compression.md")]
    pub struct Compression;
    #[doc = include_str!("../../docs/row-sparse.md")]
    pub struct RowSparse;
    #[doc = include_str!("../../docs/recovery.md")]
    pub struct Recovery;
}

pub mod async_cases;
mod backends;
pub mod cases;
pub mod device_checks;
pub mod dist_cases;
pub mod properties;
pub mod sim_device;
mod support;
mod thread_remote;
mod threads;
mod updaters;

pub use backends::{Backend, Cpu, Gpus};
pub use support::{TempDir, assert_all, bits, full, launcher, pseudo, pulled};
pub use thread_remote::{
    HubMember, ThreadHub, async_store, run_async_kind_workers, run_async_workers, run_async_workers_on,
};
pub use threads::{ThreadGroup, ThreadMember, dist_store, replicated_dist_store, run_members, run_workers};
pub use updaters::{CallLog, Gate, gated_assign, install_add_twice, install_logging_assign, open, open_later, wait_at};

/// The bench helpers, for the bench binaries outside criterion (the MPI and GPU benches).
#[path = "../../kvstore-core/benches/common/mod.rs"]
pub mod bench;

#[cfg(test)]
mod tests {
    /// The names of the `pub fn`s of `source` that start with `prefix`, sorted.
    fn shared(source: &str, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = source
            .lines()
            .filter_map(|l| l.strip_prefix("pub fn "))
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.split('(').next().unwrap_or(l).to_string())
            .collect();
        names.sort_unstable();
        names
    }

    fn sorted(names: &[&str]) -> Vec<String> {
        let mut names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        names.sort_unstable();
        names
    }

    /// A case or property written but missing from `backend_tests!`'s lists would run
    /// on no backend.
    #[test]
    fn every_shared_case_and_property_is_in_the_backend_tests_lists() {
        let cases: &[&str] = crate::backend_tests!(@cases names);
        assert_eq!(sorted(cases), shared(include_str!("cases.rs"), "case_"));
        let properties: &[&str] = crate::backend_tests!(@properties names);
        assert_eq!(sorted(properties), shared(include_str!("properties.rs"), ""));
    }
}
