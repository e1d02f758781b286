//! The store's data, at the bottom of `kvstore/`: each key's entry and slot, the table
//! that finds them, the store every call works on, and what merges a push. Its fields
//! are of types that know nothing of the store; what the store does lives in the
//! modules above (`calls.rs`, `plan.rs`, the runners, the features), in `impl` blocks
//! of their own, and its public API in `mod.rs`.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::collective::Collective;
use crate::comm::{Comm, KeyBuffers};
use crate::context::Context;
use crate::dtype::DType;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;
use crate::optimizer::{KeyState, Optimizer, Runtime};
use crate::updater::Updater;

use super::layout::{Balance, Layout, Owner};

/// Laid out for a call on many keys: what a call reads of each key's entry (its index,
/// shape and dtype, which never change, its key, the lock, and the value's handle,
/// first in the slot) fills the first line of an entry aligned to a cache line, so a
/// call that looks up, checks and locks its keys reads one line of each key's entry.
#[repr(C, align(64))]
pub(super) struct Entry {
    pub(super) index: usize,
    /// The value's number of dimensions, up to three of them each below 2^32, else
    /// [`Entry::LONG`]; its dimensions then; and its dtype: fixed when the key is made
    /// (a value put in its place later, by a checkpoint, has the same), read by a call's
    /// plan without a lock.
    pub(super) ndim: u8,
    pub(super) dtype: DType,
    pub(super) dims: [u32; 3],
    /// What the table finds the entry by (`Table::entries`).
    pub(super) key: Key,
    pub(super) value: RwLock<Slot>,
    /// The value's shape (what `dims` holds when it can).
    pub(super) shape: Box<[usize]>,
    /// Who updates the key under `dist_sync` with owners (`layout.rs`), fixed when the
    /// key is made.
    pub(super) owner: Owner,
}

impl Entry {
    /// [`Entry::ndim`] of a shape that `dims` cannot hold.
    pub(super) const LONG: u8 = u8::MAX;

    /// The entry of a new key, at `index`, holding `slot`, owned by `owner`.
    pub(super) fn new(key: Key, index: usize, slot: Slot, owner: Owner) -> Arc<Self> {
        let shape = slot.value.shape().to_vec();
        Self::of_shape(key, index, slot, owner, &shape)
    }

    /// [`Entry::new`] of a key of `shape` whose slot holds a part of it (a table whose
    /// rows live on their owners holds this rank's rows).
    pub(super) fn of_shape(key: Key, index: usize, slot: Slot, owner: Owner, shape: &[usize]) -> Arc<Self> {
        let dtype = slot.value.dtype();
        // (Dimensions past the value's are 1: their product is its size.)
        let mut dims = [1; 3];
        let short = shape.len() <= dims.len()
            && shape.iter().zip(&mut dims).all(|(&n, d)| u32::try_from(n).map(|n| *d = n).is_ok());
        let ndim = match short {
            true => shape.len() as u8,
            false => Self::LONG,
        };
        let shape = shape.into();
        Arc::new(Entry { index, ndim, dtype, dims, key, value: RwLock::new(slot), shape, owner })
    }

    /// The value's shape, which never changes.
    pub(super) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether `a` has the value's shape and dtype, reading the entry's first line only
    /// (unless the shape is [`Entry::LONG`]).
    pub(super) fn fits(&self, a: &NDArray) -> bool {
        a.dtype() == self.dtype
            && match self.ndim {
                Self::LONG => a.has_shape(&self.shape),
                n => a.has_dims(&self.dims[..usize::from(n)]),
            }
    }

    /// The bytes of the value (and of each of a call's arrays for it), from the entry's
    /// first line (unless the shape is [`Entry::LONG`]).
    pub(super) fn bytes(&self) -> u64 {
        let size: u64 = match self.ndim {
            Self::LONG => self.shape.iter().map(|&n| n as u64).product(),
            _ => self.dims.iter().map(|&n| u64::from(n)).product(),
        };
        size * self.dtype.size() as u64
    }

    /// The value's number of elements (a table's whole, on owners or not).
    pub(super) fn size(&self) -> usize {
        self.shape.iter().product()
    }

    /// The value's shape and dtype, which never change: what a call's arrays are checked
    /// against.
    pub(super) fn like(&self) -> (&[usize], DType) {
        (self.shape(), self.dtype)
    }
}

/// A key's value and what lives next to it: the optimizer's state for the key, the
/// buffer its pushed values are summed into, and what the store's `Comm` keeps for it.
#[repr(C)]
pub(super) struct Slot {
    pub(super) value: NDArray,
    pub(super) opt: Option<KeyState>,
    pub(super) merge: Option<NDArray>,
    /// Custom updaters: the copy of the value the next update works on (the value
    /// before the last update, reused).
    pub(super) spare: Option<NDArray>,
    pub(super) buffers: KeyBuffers,
    /// Where the key's optimizer updates come among a call's keys: the order keys were
    /// initialised in, or that of the run a checkpoint resumed (`Table::next_order`).
    /// A schedule and NAdam's momentum depend on it.
    pub(super) order: u64,
    /// Gradient compression's residuals, one per position of a push's values (the
    /// device each came from, in MXNet; one per key under dist_sync), made at the first
    /// compressed push; and buffers the next push writes its new residuals into, which
    /// become the residuals only when it succeeded.
    pub(super) residuals: Vec<Vec<f32>>,
    pub(super) residual_spares: Vec<Vec<f32>>,
    /// Whether the key is row-sparse (`sparse.rs`): its value is dense either way.
    pub(super) row_sparse: bool,
}

impl Slot {
    pub(super) fn new(value: NDArray, order: u64) -> Self {
        Slot {
            value,
            opt: None,
            merge: None,
            spare: None,
            buffers: KeyBuffers::default(),
            order,
            residuals: Vec::new(),
            residual_spares: Vec::new(),
            row_sparse: false,
        }
    }

    /// Moves the value and everything next to it to `ctx`.
    pub(super) fn move_to(&mut self, ctx: Context) -> Result<()> {
        if self.value.context() != ctx {
            self.value = self.value.copy_to(ctx)?;
        }
        if let Some(st) = &mut self.opt {
            for a in st.states.iter_mut().chain(st.master.iter_mut()) {
                if a.context() != ctx {
                    *a = a.copy_to(ctx)?;
                }
            }
        }
        self.merge = None;
        self.spare = None;
        Ok(())
    }
}

/// The keys: each key's entry, found by its key. A lookup per key of every call: the
/// hasher is foldhash's (seeded per process), about five times as fast as the
/// default's on short keys.
#[derive(Default)]
pub(super) struct Table {
    /// Every key's entry (the same as at its index of `Store::entries`), found by the
    /// key it holds on its first line. A slot of the set is one pointer, so the set of
    /// 100,000 keys takes 1 MB, not the 5 MB of a map from keys (whose slots a call's
    /// lookups reach at random): a lookup reads the set's slot, then the line of the
    /// entry that the call reads anyway. (Keys are never removed: the next key's index
    /// is their number.)
    pub(super) entries: foldhash::HashSet<ByKey>,
    /// The next key's [`Slot::order`]: `init` gives each key the next, and a loaded
    /// checkpoint gives its keys the next ones, in the file's order.
    pub(super) next_order: u64,
    /// The bytes each rank owns so far, where the next key goes (`layout.rs`).
    pub(super) balance: Balance,
}

/// An entry in [`Table::entries`]: hashed and compared as its key.
pub(super) struct ByKey(pub(super) Arc<Entry>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl std::hash::Hash for ByKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.key.hash(state);
    }
}

impl std::borrow::Borrow<Key> for ByKey {
    fn borrow(&self) -> &Key {
        &self.0.key
    }
}

impl Table {
    pub(super) fn contains_key(&self, key: &Key) -> bool {
        self.entries.contains(key)
    }

    /// The next [`Slot::order`].
    pub(super) fn take_order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order - 1
    }
}

/// A key-value store of arrays: `init` keys, `push` values (summed, then merged by the
/// updater), `pull` the stored values into outs.
///
/// Every call takes its keys as one key or a list ([`Keys`](crate::Keys): `3`, `"w"`, `&["5", "7"]`)
/// and its values as one array, a list or a list of lists ([`Values`](crate::Values)). With one key,
/// every value belongs to it; with a list of keys, values pair up with keys, and a
/// repeated key gets the sum of its values.
///
/// # Blocking and non-blocking calls
/// `push`, `pull`, `pushpull` and `broadcast` return when the call is done. Their
/// `_async` twins (`push_async`, ...) return a [`Pending`](crate::Pending) at once and run the call on the
/// store's engine threads, so the caller can go on computing (MXNet's `push` returned at
/// once too). The blocking calls are the same calls followed by a wait, so both give the
/// same results, bit for bit:
/// - Calls on the same key take effect in the order they were made, from whatever
///   thread; calls on different keys run in parallel, on as many engine threads as the
///   store has ([`KVStoreBuilder::engine_threads`](crate::KVStoreBuilder::engine_threads): by default one per core but one, so
///   one on a machine of two cores, where they run in turn). `priority` orders calls
///   that are ready to run at the same time (higher first); it never changes a result,
///   and a `dist_sync` store ignores it (its calls run in the order made, on every
///   worker).
/// - A push's values may be reused as soon as it returns: it sums what they held when it
///   was made (they are lent to the queued call, not copied: a write before the call
///   read one copies it for the call first, a write while it reads waits). A pull's
///   outs are written later; until then, every access to them (`to_vec`, `copy_from`,
///   using one in another call) waits for the pull.
/// - A failed call changes nothing and reports its error to its own handle. A handle
///   dropped before its call failed leaves the error to [`KVStore::wait_all`].
/// - Dropping the store waits for its queued calls.
///
/// `KVStore` is `Send + Sync`.
pub struct KVStore {
    /// The store's own, or its worker group's for `dist_sync` stores.
    pub(super) engine: Arc<Engine>,
    pub(super) store: Arc<Store>,
}

impl Drop for KVStore {
    /// Waits for the queued calls (a store's own engine then stops its threads).
    fn drop(&mut self) {
        self.engine.wait_idle();
    }
}

/// What a store's calls work on, shared with the engine threads that run them.
pub(crate) struct Store {
    pub(super) collective: Option<Arc<dyn Collective>>,
    /// A `dist_async` store's link to the keys' owners (`kvstore/remote.rs`).
    pub(super) remote: Option<Arc<dyn Owners>>,
    pub(super) kind: String,
    /// How data moves and where keys live (`CommCpu` for `local` and `dist_sync`,
    /// `CommDevice` for `device` and `dist_sync_device`).
    pub(super) comm: Box<dyn Comm>,
    pub(super) table: RwLock<Table>,
    /// Every key's entry, at its index, added under the table's write lock and never
    /// removed nor moved: a call that looked its keys up holds their entries for as long
    /// as the store lives, not only while it holds the table (a call waiting for an out
    /// held the table, and an `init` on another thread waited for it for ever).
    pub(super) entries: boxcar::Vec<Arc<Entry>>,
    pub(super) merger: RwLock<Merger>,
    /// Gradient compression, once set ([`KVStore::set_gradient_compression`]).
    pub(super) compression: RwLock<Option<super::compression::Compression>>,
    pub(super) unobserved: super::pending::Unobserved,
    /// The number of this store's calls that communicated (`dist_sync`), for desync
    /// detection (`kvstore/steps.rs`).
    pub(super) steps: std::sync::atomic::AtomicU64,
    /// Whether the steps are compared ([`KVStoreBuilder::compare_calls`]).
    pub(super) compare_calls: bool,
    /// What [`KVStore::stats`] returns (`kvstore/stats.rs`).
    pub(super) counters: super::stats::Counters,
    /// Its hold on the timeline: the last store dropped closes the file
    /// ([`crate::timeline::Hold`]).
    pub(super) _timeline: crate::timeline::Hold,
    /// Where its commits go, with a job name ([`Durable`]).
    pub(super) commits: Option<Box<dyn Durable>>,
    /// The commit it restored when it was made.
    pub(super) restored: std::sync::OnceLock<Restored>,
    /// The fusion size of non-blocking calls across calls, 0 for none
    /// ([`KVStoreBuilder::fuse_calls`], `kvstore/run/fused.rs`).
    pub(super) fuse_bytes: usize,
    /// Back-pressure: see [`KVStoreBuilder::max_queued_calls`] (`usize::MAX`: none).
    pub(super) max_queued_calls: usize,
    /// Back-pressure: see [`KVStoreBuilder::max_copied_bytes`] (`usize::MAX`: none).
    pub(super) max_copied_bytes: usize,
    /// Where a `dist_sync` store's optimizer state lives ([`Layout`]; `Replicated` for
    /// the other kinds), and the big-array bound its owners split keys at.
    pub(super) layout: Layout,
    pub(super) bound: usize,
    /// Whether a row-sparse table's rows live on their owners alone (`rows.rs`), not on
    /// every rank: with owners.
    pub(super) rows_on_owners: bool,
    /// Whether a table whose rows live on their owners was added: the dense calls then
    /// look for such tables among their keys (`KVStore::call`).
    pub(super) holds_rows: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for KVStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KVStore")
            .field("kind", &self.store.kind)
            .field("keys", &self.store.table.read().entries.len())
            .finish_non_exhaustive()
    }
}

/// What a store restored from a commit: its step and the user's bytes
/// ([`KVStore::restored`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The step given to the commit.
    pub step: u64,
    /// The bytes given to the commit (a data loader's position, a generator's state).
    pub extra: Vec<u8>,
}

/// A `dist_async` store's keys' owners, behind the one seam the store knows
/// (`kvstore/remote.rs`: `Shards`, over a `Remote` transport): each key lives, with its
/// optimizer state, on the worker or workers that own its parts; this worker's own
/// parts live in its share, a local store.
pub(super) trait Owners: Send + Sync {
    /// This worker's rank among the job's workers.
    fn rank(&self) -> usize;
    /// The number of workers.
    fn size(&self) -> usize;
    /// Gives key `key`'s first value to its owners.
    fn init(&self, key: &Key, value: &NDArray) -> Result<()>;
    /// Sends `sum` (this worker's sum of a push) to the key's owners, which merge it.
    fn push(&self, key: &Key, sum: &NDArray) -> Result<()>;
    /// Reads the key's value from its owners into `into`.
    fn pull(&self, key: &Key, into: &NDArray) -> Result<()>;
    /// Waits until every worker has called it (answering requests meanwhile).
    fn barrier(&self) -> Result<()>;
    /// Every worker's `mine` for the call `step`, in rank order.
    fn exchange(&self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Worker `root`'s bytes (`mine` there) on every worker, for the call `step`.
    fn broadcast(&self, step: &str, mine: Vec<u8>, root: usize) -> Result<Vec<u8>>;
    /// This worker's share: the local store of the parts it owns.
    fn share(&self) -> &Store;
    /// Installs `optimizer` on this worker's share.
    fn set_optimizer(&self, optimizer: Optimizer) -> Result<()>;
    /// Installs `updater` on this worker's share.
    fn set_updater(&self, updater: Arc<dyn Updater>) -> Result<()>;
    /// Removes the share's updater.
    fn clear_updater(&self) -> Result<()>;
    /// The name of the share's optimizer, if it has one.
    fn optimizer_name(&self) -> Option<&'static str>;
    /// The share's optimizer state (its store-wide counters) as bytes, for a commit.
    fn optimizer_state(&self) -> Vec<u8>;
    /// Restores the share's optimizer state from [`Owners::optimizer_state`]'s bytes.
    fn restore_optimizer_state(&self, context: &str, bytes: &[u8]) -> Result<()>;
    /// The whole store as the owners hold it, the keys of `entries` gathered into a local
    /// store (into `kept`, the copy of an earlier gather, when given), with the optimizer.
    fn gathered(&self, entries: &[Arc<Entry>], kept: Option<KVStore>) -> Result<KVStore>;
    /// Puts this worker's parts of `key` (its whole `value` and `state`, as loaded) into
    /// its share: their names there.
    fn restore_key(&self, key: &Key, value: &NDArray, state: Option<&KeyState>) -> Result<Vec<Key>>;
}

/// What makes a store durable, behind the one seam the store knows: it commits the
/// store as of a step, and restores the newest whole commit when the store is made.
/// Core has none: a layer implements it (the `kvstore-commit` crate: a job's folder of
/// commits in memory that outlives the process) and installs what makes one for each
/// store ([`MakeDurable`], [`install_durability`](crate::backend::install_durability)).
/// It sees the store through [`Seam`] alone, lent for the call: the store calls
/// `commit` in call order (its calls before it done, every rank at the same point) and
/// `restore` while it is built, and a `Durable` uses the `Seam` within those calls only
/// (it does not call the store's own API from them: under `dist_sync` such a call is
/// refused, and elsewhere it would not be in the commit it runs inside).
pub trait Durable: Send + Sync {
    /// Commits `store` as of `step`, with the user's `extra` bytes (`before`: whether
    /// this rank's calls before it went well; every rank takes part whatever it says).
    ///
    /// # Errors
    /// Why the commit failed, the same kind on every rank.
    fn commit(&self, store: Seam<'_>, step: u64, extra: &[u8], before: Result<()>) -> Result<()>;

    /// Restores the newest whole commit into `store`: what it restored, or `None`.
    ///
    /// # Errors
    /// Why nothing could be restored, the same kind on every rank.
    fn restore(&self, store: Seam<'_>) -> Result<Option<Restored>>;

    /// Called once the store is built, its restore done: what the durability claimed
    /// for the store (the job's folder's number) is the store's from now on. One
    /// dropped without this call belonged to a build that failed, and may give back
    /// what it claimed, so that the program's next try claims the same.
    fn built(&self) {}
}

/// What gives each store its durability, installed once per process
/// ([`install_durability`](crate::backend::install_durability)): the builder asks it for
/// every store that takes part in its job's commits.
pub trait MakeDurable: Send + Sync {
    /// The durability of the next store made (`grouped`: a store of a worker group,
    /// made in the same order on every rank), or `None` where the process has none (no
    /// job name).
    ///
    /// # Errors
    /// Why the store cannot be made durable (a job name that is not one, a folder of
    /// another user's): the store is not made.
    fn for_next_store(&self, grouped: bool) -> Result<Option<Box<dyn Durable>>>;

    /// What a user does for a store to be durable (said by a commit on a store that is
    /// not): "set KVSTORE_JOB".
    fn how_to(&self) -> String;
}

/// A store as its durability sees it ([`Durable`]): the handful of methods it may call
/// (`kvstore/seam.rs`), nothing else of the store.
#[derive(Clone, Copy)]
pub struct Seam<'a>(pub(super) &'a Store);

/// A call's keys' entries, each with its arrays, in call order (a key may appear more
/// than once until [`Store::group`] merges it).
pub(super) type Found<'a> = Vec<Group<'a>>;

/// The arrays of one key in one call, in call order.
pub(super) struct Group<'a> {
    pub(super) entry: Arc<Entry>,
    pub(super) arrays: Arrays<'a>,
}

/// The arrays of one key in one call, without a heap allocation for up to four: a call
/// with many keys has one array per key and device, and an allocation per key costs
/// more than a small key's sum.
pub(super) type Arrays<'a> = SmallVec<[&'a NDArray; 4]>;

/// What a push does with the sum of its values.
#[derive(Clone)]
pub(super) enum Merger {
    /// MXNet's default: the sum replaces the value.
    Assign,
    /// A custom updater.
    Custom(Arc<dyn Updater>),
    /// An optimizer installed by `set_optimizer`.
    Optimizer(Arc<Runtime>),
}

impl Store {
    /// Every entry, in index order: the keys of the table as it is now (an `init` on
    /// another thread adds its keys all at once, or not yet).
    pub(super) fn entries(&self) -> Vec<Arc<Entry>> {
        let table = self.table.read();
        self.entries.iter().take(table.entries.len()).map(|(_, e)| Arc::clone(e)).collect()
    }

    /// Key `key`'s entry, looked up in `table` (this store's, locked): held for as long
    /// as the store lives.
    #[inline]
    pub(super) fn entry<'s>(&'s self, table: &Table, key: &Key) -> Option<&'s Arc<Entry>> {
        let ByKey(entry) = table.entries.get(key)?;
        Some(&self.entries[entry.index])
    }

    /// Key `key`'s entry.
    pub(super) fn find(&self, key: &Key) -> Option<Arc<Entry>> {
        self.entry(&self.table.read(), key).cloned()
    }

    /// Key `key`'s entry, or, for a key never initialised, `op`'s error saying so.
    pub(super) fn found(&self, op: &'static str, key: &Key) -> Result<Arc<Entry>> {
        self.find(key).ok_or_else(|| Error::KeyNotInitialized { op, key: key.clone() })
    }

    /// Adds key `key` with its first slot, under the table's write lock.
    pub(super) fn add_entry(&self, table: &mut Table, key: Key, slot: Slot) {
        let index = table.entries.len();
        let owner = self.place(&mut table.balance, &slot.value);
        self.insert_entry(table, Entry::new(key, index, slot, owner));
    }

    /// Adds `entry`, the next key's (at index `table.entries.len()`), under the table's
    /// write lock.
    pub(super) fn insert_entry(&self, table: &mut Table, entry: Arc<Entry>) {
        let index = entry.index;
        table.entries.insert(ByKey(Arc::clone(&entry)));
        let at = self.entries.push(entry);
        debug_assert_eq!(at, index, "entries are added under the table's write lock, in index order");
    }
}
