//! Builds a store: [`KVStoreBuilder`], its settings and their defaults (some read from
//! the environment).

use std::sync::Arc;

use parking_lot::RwLock;

use super::data::{Durable, KVStore, Merger, Owners, Store, Table};
use super::layout::Layout;
use super::{pending::Unobserved, run, stats};
use crate::collective::Collective;
use crate::comm::StoreKind;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::remote::Remote;

/// Builds a [`KVStore`] with settings other than the defaults.
pub struct KVStoreBuilder {
    kind: String,
    threads: usize,
    engine_threads: usize,
    collective: Option<Arc<dyn Collective>>,
    remote: Option<Arc<dyn Remote>>,
    compare_calls: bool,
    timeout: Option<std::time::Duration>,
    fuse_bytes: Option<usize>,
    max_queued_calls: Option<usize>,
    max_copied_bytes: Option<usize>,
    layout: Option<Layout>,
    bound: Option<usize>,
    /// Whether the store takes part in its job's commits (the installed
    /// [`MakeDurable`](crate::backend::MakeDurable) gives its durability): not the
    /// stores a store makes for itself ([`KVStore::internal_local`]).
    commits: bool,
    /// A durability of its own in place of the installed one's ([`KVStoreBuilder::durability`]).
    durable: Option<Box<dyn Durable>>,
}

/// The default bound on a store's queued calls ([`KVStoreBuilder::max_queued_calls`]).
const DEFAULT_MAX_QUEUED_CALLS: usize = 16_384;

/// The default bound on the bytes of copies made for queued calls
/// ([`KVStoreBuilder::max_copied_bytes`]): 256 MiB.
const DEFAULT_MAX_COPIED_BYTES: usize = 256 << 20;

/// The engine threads of a store built without [`KVStoreBuilder::engine_threads`]: one
/// per core but one, for the thread that makes the calls, at least 1 and at most 4 (the
/// calls they run spend most of their time in the reduction pool and in memory copies).
/// A worker more than that finds no core of its own: it takes its turns on the
/// caller's core while it waits for work, and every call the caller submits then costs
/// it a wake-up.
fn default_engine_threads() -> usize {
    engine_threads_for(std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// [`default_engine_threads`] on a machine of `cores` cores.
fn engine_threads_for(cores: usize) -> usize {
    cores.saturating_sub(1).clamp(1, 4)
}

impl KVStoreBuilder {
    /// A store's own local store (a `dist_async` owner's share, a gathered copy):
    /// never in the job's commits, with one engine thread (its calls are the store's
    /// own, one at a time).
    pub(super) fn internal() -> Self {
        KVStoreBuilder { commits: false, engine_threads: 1, ..KVStoreBuilder::new("local") }
    }

    /// With `durable` as its durability ([`Durable`]: what [`KVStore::commit`] writes
    /// and what the store restores when it is built), in place of the one the process's
    /// installed [`MakeDurable`](crate::backend::MakeDurable) gives (the job's folder
    /// of commits, where a job name is set).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use kvstore_core::backend::{Durable, Seam};
    /// use kvstore_core::{KVStore, NDArray, Restored, Result};
    ///
    /// /// Keeps the newest step committed (a real one keeps the store, from
    /// /// `Seam::whole_snapshot`, and gives it back to `Seam::install` in `restore`).
    /// struct Steps(Arc<AtomicU64>);
    ///
    /// impl Durable for Steps {
    ///     fn commit(&self, store: Seam<'_>, step: u64, _extra: &[u8], before: Result<()>) -> Result<()> {
    ///         store.check_step("commit")?;
    ///         before?;
    ///         self.0.store(step, Ordering::Relaxed);
    ///         Ok(())
    ///     }
    ///
    ///     fn restore(&self, _store: Seam<'_>) -> Result<Option<Restored>> {
    ///         Ok(None)
    ///     }
    /// }
    ///
    /// let newest = Arc::new(AtomicU64::new(0));
    /// let kv = KVStore::builder("local").durability(Box::new(Steps(Arc::clone(&newest)))).build()?;
    /// kv.init("w", &NDArray::zeros(&[2])?)?;
    /// kv.commit(7, b"")?;
    /// assert_eq!(newest.load(Ordering::Relaxed), 7);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    #[must_use]
    pub fn durability(mut self, durable: Box<dyn Durable>) -> Self {
        self.durable = Some(durable);
        self
    }

    /// A builder for a store of kind `kind`, with the default settings
    /// ([`KVStore::builder`]).
    pub(super) fn new(kind: &str) -> Self {
        KVStoreBuilder {
            kind: kind.to_string(),
            threads: 0,
            engine_threads: 0,
            collective: None,
            remote: None,
            compare_calls: true,
            timeout: None,
            fuse_bytes: None,
            max_queued_calls: None,
            max_copied_bytes: None,
            layout: None,
            bound: None,
            commits: true,
            durable: None,
        }
    }

    /// The number of reduction threads of the store's own pool (0, the default: one
    /// per core).
    pub fn num_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// The number of engine threads, which run the store's non-blocking calls (0, the
    /// default: one per core but one, at least 1 and at most 4). `dist_sync` stores
    /// ignore it: the stores of a worker group share one engine thread, so that their
    /// collectives run in the order of their calls on every worker.
    pub fn engine_threads(mut self, threads: usize) -> Self {
        self.engine_threads = threads;
        self
    }

    /// The group of workers a `dist_sync` store sums across (`kvstore-mpi` makes one
    /// over MPI).
    pub fn collective(mut self, group: Arc<dyn Collective>) -> Self {
        self.collective = Some(group);
        self
    }

    /// The transport a `dist_async` store reaches the keys' owners through
    /// (`kvstore-mpi` makes one over MPI).
    pub fn remote(mut self, remote: Arc<dyn Remote>) -> Self {
        self.remote = Some(remote);
        self
    }

    /// Whether the workers of a `dist_sync` store compare each call before its data
    /// moves (default `true`): desync detection, so that workers that push different
    /// keys or shapes, or skip a call, all fail that call with a message saying what
    /// each called, instead of hanging or summing different keys. It costs one small
    /// message exchange per call (`make bench` measures it); turn it off only for a
    /// program known to call alike on every worker.
    pub fn compare_calls(mut self, compare: bool) -> Self {
        self.compare_calls = compare;
        self
    }

    /// How long a collective operation of a `dist_sync` store may wait for the other
    /// workers before the job ends, with a message naming the call and the workers that
    /// never arrived (kvstore-mpi: default 10 minutes, or `KVSTORE_TIMEOUT` in seconds;
    /// it applies to every store of the worker group). Ignored by local stores.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The fusion size of a `dist_sync` store's non-blocking calls (default 1 MiB, or
    /// `KVSTORE_FUSE_BYTES`; 0 turns fusion off): non-blocking pushes and pushpulls of
    /// keys under a quarter of it, made one after another, are held back and run as one
    /// call once their values reach it (or another call is made, or one of them is
    /// waited for), so that they share one comparison of the workers' calls and one
    /// allreduce. Which calls fuse depends only on the sequence of calls, waits
    /// included: every worker must wait for a call, or read a pending out, at the same
    /// point of its calls (see the README, "Non-blocking calls"). Ignored by local
    /// stores.
    pub fn fuse_calls(mut self, bytes: usize) -> Self {
        self.fuse_bytes = Some(bytes);
        self
    }

    /// Where a `dist_sync` store's optimizer state lives and who runs each key's
    /// update (default [`Layout::Owners`], or `KVSTORE_LAYOUT`): with
    /// [`Layout::Owners`], each key's state lives on its owners only, as on MXNet's
    /// servers (a key under `MXNET_KVSTORE_BIGARRAY_BOUND` elements on one rank, a
    /// bigger one split across every rank), a push sums each part on its owner, which
    /// updates it, and the new values reach every rank; a row-sparse table's rows
    /// (values and state) live on their owners alone, split at rows, and
    /// `row_sparse_pull` asks the owners for them. The values every rank pulls are the
    /// same bits either way. Every rank must choose the same layout (ranks that
    /// differ fail their pushes, saying so). Ignored by the other kinds, and by
    /// `dist_sync_device`, whose keys stay replicated.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = Some(layout);
        self
    }

    /// The size, in elements, from which a `dist_sync` store with owners splits a key
    /// across every rank (default MXNet's 10^6, or `MXNET_KVSTORE_BIGARRAY_BOUND`); a
    /// smaller key is owned whole by one rank. Every rank must give the same.
    pub fn bigarray_bound(mut self, elements: usize) -> Self {
        self.bound = Some(elements);
        self
    }

    /// How many of the store's calls may be queued (made and not finished) before a
    /// non-blocking call waits, when it is made, for the queue to shrink (default
    /// 16,384, or `KVSTORE_MAX_QUEUED_CALLS`; 0 for no bound). Back-pressure: a loop that
    /// makes calls faster than the store runs them would otherwise hold ever more memory
    /// (each queued call holds its handle and its keys' lists; from Java, about 1.4 KB).
    /// Calls made on the store's own threads (an updater, an `on_done` callback) never
    /// wait for it: they could wait for themselves.
    pub fn max_queued_calls(mut self, calls: usize) -> Self {
        self.max_queued_calls = Some(calls);
        self
    }

    /// How many bytes the copies made for queued calls may hold (a write to a value lent
    /// to a queued push copies it for the push: see the type's docs), counted over every
    /// store of the process, before a non-blocking call of this store waits, when it is
    /// made, for its queued calls to run and free them (default 256 MiB, or
    /// `KVSTORE_MAX_COPIED_BYTES`; 0 for no bound). Calls made on the store's own threads
    /// never wait for it.
    pub fn max_copied_bytes(mut self, bytes: usize) -> Self {
        self.max_copied_bytes = Some(bytes);
        self
    }

    /// Creates the store.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore};
    /// let kv = KVStore::builder("local").num_threads(2).build()?;
    /// assert_eq!(kv.kind(), "local");
    /// // dist_sync needs a worker group: kvstore-mpi builds those stores.
    /// let e = KVStore::builder("dist_sync").build().err();
    /// assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::Unsupported));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::create`]; [`Error::Unsupported`] for `dist_sync` without a worker
    /// group, [`Error::InvalidArgument`] for a worker group on a local kind.
    pub fn build(self) -> Result<KVStore> {
        let kind = StoreKind::parse(&self.kind)?;
        match (kind.is_async(), &self.remote) {
            (true, None) => {
                return Err(Error::Unsupported {
                    what: format!(
                        "store kind \"{}\" without a transport",
                        crate::key::shorten(&self.kind.to_ascii_lowercase())
                    ),
                    hint: "create dist_async stores with kvstore-mpi, which joins the MPI job".to_string(),
                });
            }
            (false, Some(_)) => {
                return Err(Error::invalid_argument(format!(
                    "store kind \"{}\" takes no transport (use dist_async)",
                    crate::key::shorten(&self.kind)
                )));
            }
            _ => {}
        }
        match (kind.spans_processes(), &self.collective) {
            (true, None) => {
                return Err(Error::Unsupported {
                    what: format!(
                        "store kind \"{}\" without a worker group",
                        crate::key::shorten(&self.kind.to_ascii_lowercase())
                    ),
                    hint: "create dist_sync stores with kvstore-mpi, which joins the MPI job".to_string(),
                });
            }
            (false, Some(_)) => {
                return Err(Error::invalid_argument(format!(
                    "store kind \"{}\" is local: it takes no worker group (use dist_sync)",
                    crate::key::shorten(&self.kind)
                )));
            }
            _ => {}
        }
        if let (Some(group), Some(timeout)) = (&self.collective, self.timeout) {
            if timeout.is_zero() {
                return Err(Error::invalid_argument("timeout: a collective needs more than 0 s to complete"));
            }
            group.set_timeout(timeout);
        }
        if let (Some(remote), Some(timeout)) = (&self.remote, self.timeout) {
            if timeout.is_zero() {
                return Err(Error::invalid_argument("timeout: a request needs more than 0 s to be answered"));
            }
            remote.set_timeout(timeout);
        }
        let remote = self.remote.map(super::remote::Shards::new).transpose()?.map(|s| Arc::new(s) as Arc<dyn Owners>);
        use crate::settings::{FUSE_BYTES_VAR, MAX_COPIED_BYTES_VAR, MAX_QUEUED_CALLS_VAR, number};
        let fuse_bytes = number(self.fuse_bytes, FUSE_BYTES_VAR, run::fused::DEFAULT_FUSE_BYTES)?;
        let max_queued_calls = number(self.max_queued_calls, MAX_QUEUED_CALLS_VAR, DEFAULT_MAX_QUEUED_CALLS)?;
        let max_copied_bytes = number(self.max_copied_bytes, MAX_COPIED_BYTES_VAR, DEFAULT_MAX_COPIED_BYTES)?;
        // Owners where the keys' values live on the host (the devices' store keeps
        // replicas): the layout asked for, and the bound it splits keys at.
        let layout = match (&self.collective, kind.may_have_owners()) {
            (Some(_), true) => crate::settings::layout(self.layout)?,
            _ => Layout::Replicated,
        };
        let bound = match layout {
            Layout::Owners => match self.bound {
                Some(0) => {
                    return Err(Error::invalid_argument("bigarray_bound: expected a number of elements above 0"));
                }
                Some(n) => n,
                None => crate::settings::bigarray_bound()?,
            },
            Layout::Replicated => usize::MAX,
        };
        let grouped = self.collective.is_some() || remote.is_some();
        let commits = match (self.durable, self.commits) {
            (Some(durable), _) => Some(durable),
            (None, true) => super::seam::durability_for_next_store(grouped)?,
            (None, false) => None,
        };
        let store = Store {
            max_queued_calls: if max_queued_calls == 0 { usize::MAX } else { max_queued_calls },
            max_copied_bytes: if max_copied_bytes == 0 { usize::MAX } else { max_copied_bytes },
            fuse_bytes: if self.collective.is_some() { fuse_bytes } else { 0 },
            collective: self.collective,
            remote,
            kind: self.kind.to_ascii_lowercase(),
            comm: kind.comm(self.threads)?,
            table: RwLock::new(Table::default()),
            entries: boxcar::Vec::new(),
            merger: RwLock::new(Merger::Assign),
            compression: RwLock::new(None),
            unobserved: Unobserved::default(),
            steps: std::sync::atomic::AtomicU64::new(0),
            compare_calls: self.compare_calls,
            layout,
            bound,
            rows_on_owners: layout == Layout::Owners,
            holds_rows: std::sync::atomic::AtomicBool::new(false),
            counters: stats::Counters::default(),
            _timeline: crate::timeline::Hold::new(),
            commits,
            restored: std::sync::OnceLock::new(),
        };
        // The timeline, when KVSTORE_TIMELINE asks for it; under dist_sync, the flight
        // recorder too (a stalled or desynced job writes it).
        crate::timeline::start_from_env()?;
        if store.collective.is_some() || store.remote.is_some() {
            crate::timeline::flight_on();
        }
        let threads = match self.engine_threads {
            0 => default_engine_threads(),
            n => n,
        };
        let engine = match &store.collective {
            Some(group) => Engine::ordered_for(Arc::as_ptr(group) as *const () as usize)?,
            None => Arc::new(Engine::new(threads, false)?),
        };
        let kv = KVStore { engine, store: Arc::new(store) };
        // A durable store resumes from its newest commit ([`Durable::restore`]).
        if kv.store.commits.is_some() {
            kv.in_order("restore", |store| {
                if let Some(r) = store.restore()? {
                    store.mark_optimizer_resumed();
                    let _ = store.restored.set(r);
                }
                Ok(())
            })?;
        }
        if let Some(durable) = kv.store.commits.as_deref() {
            durable.built();
        }
        Ok(kv)
    }
}

#[cfg(test)]
mod tests {
    use super::engine_threads_for;

    #[test]
    fn the_default_engine_leaves_the_callers_thread_a_core() {
        assert_eq!(engine_threads_for(1), 1);
        assert_eq!(engine_threads_for(2), 1);
        assert_eq!(engine_threads_for(3), 2);
        assert_eq!(engine_threads_for(5), 4);
        assert_eq!(engine_threads_for(64), 4);
    }
}
