//! This process's view of the MPI job ([`MpiGroup`]): its rank and size, the settings a
//! program may change while it runs (the buckets' bytes, the shared window, the stall
//! timeout), what the last sums took, and [`MpiGroup::with_mpi`], through which every
//! MPI call of a `dist_sync` store goes (the process's MPI lock and the watchdog). The
//! `Collective` it is lives in `collective.rs`; its sums in `tree.rs`, `fused.rs`,
//! `scatter.rs`, `big.rs` and `hosts.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kvstore_core::{Error, Result};
use mpi::topology::SimpleCommunicator;

use crate::runtime::{MPI, Mpi, SYNC_CALLS};
use crate::settings::{MIN_BUCKET_BYTES, Settings, millis};
use crate::watchdog;

/// This process's view of the MPI job.
pub struct MpiGroup {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) bucket_bytes: AtomicUsize,
    timeout_ms: AtomicU64,
    /// Whether fused sums may go through shared memory (see `shm.rs`).
    pub(crate) shared_memory: AtomicBool,
    /// Whether the last fused bucket went through shared memory.
    pub(crate) used_shared_memory: AtomicBool,
    /// Ranks per host where `KVSTORE_MPI_HOST_RANKS` sets them (see `hosts.rs`).
    pub(crate) host_ranks: Option<usize>,
    /// The most bytes of a chunk of a sum host by host (`KVSTORE_MPI_HOST_CHUNK_BYTES`).
    pub(crate) host_chunk_bytes: usize,
    /// Whether the last big sum went host by host.
    pub(crate) used_hosts: AtomicBool,
}

impl MpiGroup {
    /// The group of rank `rank` of `size`, as `settings` start it.
    pub(crate) fn new(rank: usize, size: usize, settings: &Settings) -> Self {
        MpiGroup {
            rank,
            size,
            bucket_bytes: AtomicUsize::new(settings.bucket_bytes),
            timeout_ms: AtomicU64::new(millis(settings.timeout)),
            shared_memory: AtomicBool::new(settings.shared_memory),
            used_shared_memory: AtomicBool::new(false),
            host_ranks: settings.host_ranks,
            host_chunk_bytes: settings.host_chunk_bytes,
            used_hosts: AtomicBool::new(false),
        }
    }

    /// The size, in bytes, of one fused allreduce.
    pub fn bucket_bytes(&self) -> usize {
        self.bucket_bytes.load(Ordering::Relaxed)
    }

    /// Sets the size, in bytes, of one fused allreduce (default 4 MiB, or
    /// `KVSTORE_MPI_BUCKET_BYTES` at start-up; at least 64): small keys share a bucket
    /// (of at most 512 KiB, where the packing copies stay in a core's cache), big keys
    /// (of a bucket or more) go straight through MPI in pieces of a bucket. Every rank
    /// must use the same size.
    pub fn set_bucket_bytes(&self, bytes: usize) {
        self.bucket_bytes.store(bytes.max(MIN_BUCKET_BYTES), Ordering::Relaxed);
    }

    /// Whether fused sums go through memory shared by the ranks where every rank of the
    /// job runs on one machine (default: yes, unless `KVSTORE_MPI_SHARED_MEMORY=0` or
    /// Open MPI's `btl` list leaves its shared-memory transport out, as `mpirun --mca btl
    /// self,tcp` does). The results are the same bits either way.
    pub fn shared_memory(&self) -> bool {
        self.shared_memory.load(Ordering::Relaxed)
    }

    /// Sets whether fused sums may go through shared memory (see
    /// [`MpiGroup::shared_memory`]); every rank must set the same, at the same point of
    /// its calls. The ranks decide at the job's first fused sum whether the shared
    /// memory exists at all: where some rank had it off then, it stays unused.
    pub fn set_shared_memory(&self, on: bool) {
        self.shared_memory.store(on, Ordering::Relaxed);
    }

    /// Whether the last fused sum went through shared memory: it did where that is on
    /// ([`MpiGroup::shared_memory`]) and every rank runs on this machine (with 2 ranks
    /// or more).
    pub fn used_shared_memory(&self) -> bool {
        self.used_shared_memory.load(Ordering::Relaxed)
    }

    /// Whether the last big sum (an array of a bucket or more) went host by host: the
    /// job runs on 2 machines or more, each with the same power of two (2 or more) of
    /// consecutive ranks (see `kvstore_mpi`'s docs on hosts). The results are the same
    /// bits either way.
    pub fn used_hosts(&self) -> bool {
        self.used_hosts.load(Ordering::Relaxed)
    }

    /// The stall timeout: a collective that has waited this long ends the job, with a
    /// message naming the call (and, when the workers compare their calls, the workers
    /// that never arrived). Default 10 minutes, or `KVSTORE_TIMEOUT` (seconds) at
    /// start-up.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets the stall timeout (see [`MpiGroup::timeout`]) for every store of the job on
    /// this worker; every worker should set the same.
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms.store(millis(timeout), Ordering::Relaxed);
    }

    pub(crate) fn with_world<T>(&self, f: impl FnOnce(&SimpleCommunicator) -> T) -> Result<T> {
        self.with_mpi(|mpi| f(&mpi.world))
    }

    /// Runs `f` with MPI, under the watchdog: a call that has not returned within the
    /// timeout ends the job (see `watchdog.rs`).
    pub(crate) fn with_mpi<T>(&self, f: impl FnOnce(&mut Mpi) -> T) -> Result<T> {
        SYNC_CALLS.store(true, Ordering::Relaxed);
        let shared = MPI.get().ok_or_else(|| Error::Internal("MPI is not initialised".into()))?;
        let mut guard = shared.0.lock();
        let mpi =
            guard.as_mut().ok_or_else(|| Error::Backend { backend: "mpi", message: "MPI was finalised".into() })?;
        let _watched = watchdog::Watched::start();
        Ok(f(mpi))
    }
}
