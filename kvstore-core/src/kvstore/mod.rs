//! The store: mirrors `KVStoreLocal` in MXNet's `src/kvstore/kvstore_local.h`, with
//! the deliberate differences listed in the crate docs.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::collective::Collective;
use crate::comm::{BroadcastJob, Comm, KeyBuffers};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::{Key, Keys};
use crate::ndarray::NDArray;
use crate::optimizer::states as opt_states;
use crate::optimizer::{KeyState, Optimizer, Runtime};
use crate::updater::Updater;
use forms::{Run, Values, flat_runs, flatten};

mod builder;
mod calls;
mod checkpoint;
mod compression;
pub(crate) mod forms;
mod fusion;
mod locks;
mod merge;
mod pending;
mod plan;
mod remote;
mod sparse;
mod spread;
mod steps;

pub use builder::KVStoreBuilder;
use calls::broadcast_args;
use locks::Held;
use merge::{Calls, Merger};
use pending::{Done, Unobserved};
pub use pending::{Pending, Release};
use plan::Plan;
pub use sparse::StorageType;

use crate::engine::Engine;

/// Laid out for a call on many keys: the lock and the value's handle (first in the
/// slot) come first, in 16 bytes that never straddle a cache line, so a call that
/// locks its keys reads one line of each key's entry.
#[repr(C)]
struct Entry {
    value: RwLock<Slot>,
    index: usize,
    key: Key,
    /// The value's first three dimensions (the rest in `long_shape`), its number of
    /// dimensions and dtype: fixed when the key is made (a value put in its place later,
    /// by a checkpoint, has the same), read by a call's plan without a lock.
    dims: [usize; 3],
    ndim: u8,
    dtype: DType,
    /// The value's shape when it has more than three dimensions (else empty).
    long_shape: Box<[usize]>,
}

impl Entry {
    /// The entry of a new key, at `index`, holding `slot`.
    fn new(key: Key, index: usize, slot: Slot) -> Arc<Self> {
        let (shape, dtype) = (slot.value.shape(), slot.value.dtype());
        let mut dims = [0; 3];
        let long_shape = match shape.len() {
            n @ 0..=3 => {
                dims[..n].copy_from_slice(shape);
                Box::default()
            }
            _ => shape.into(),
        };
        let ndim = u8::try_from(shape.len()).unwrap_or(u8::MAX);
        Arc::new(Entry { dims, ndim, dtype, value: RwLock::new(slot), index, key, long_shape })
    }

    /// The value's shape, which never changes.
    fn shape(&self) -> &[usize] {
        match self.long_shape.is_empty() {
            true => &self.dims[..usize::from(self.ndim).min(3)],
            false => &self.long_shape,
        }
    }

    /// The value's shape and dtype, which never change: what a call's arrays are checked
    /// against.
    fn like(&self) -> (&[usize], DType) {
        (self.shape(), self.dtype)
    }
}

/// A key's value and what lives next to it: the optimizer's state for the key, the
/// buffer its pushed values are summed into, and what the store's `Comm` keeps for it.
#[repr(C)]
struct Slot {
    value: NDArray,
    opt: Option<KeyState>,
    merge: Option<NDArray>,
    /// Custom updaters: the copy of the value the next update works on (the value
    /// before the last update, reused).
    spare: Option<NDArray>,
    buffers: KeyBuffers,
    /// Where the key's optimizer updates come among a call's keys: the order keys were
    /// initialised in, or that of the run a checkpoint resumed (`Table::next_order`).
    /// A schedule and NAdam's momentum depend on it.
    order: u64,
    /// Gradient compression's residuals, one per position of a push's values (the
    /// device each came from, in MXNet; one per key under dist_sync), made at the first
    /// compressed push; and buffers the next push writes its new residuals into, which
    /// become the residuals only when it succeeded.
    residuals: Vec<Vec<f32>>,
    residual_spares: Vec<Vec<f32>>,
    /// Whether the key is row-sparse (`sparse.rs`): its value is dense either way.
    row_sparse: bool,
}

impl Slot {
    fn new(value: NDArray, order: u64) -> Self {
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
    fn move_to(&mut self, ctx: Context) -> Result<()> {
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

/// The keys and their entries. A lookup per key of every call: the hasher is foldhash's
/// (seeded per process), about five times as fast as the default's on short keys.
#[derive(Default)]
struct Table {
    entries: foldhash::HashMap<Key, Arc<Entry>>,
    next_index: usize,
    /// The next key's [`Slot::order`]: `init` gives each key the next, and a loaded
    /// checkpoint gives its keys the next ones, in the file's order.
    next_order: u64,
}

impl Table {
    /// The next [`Slot::order`].
    fn take_order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order - 1
    }
}

/// A key-value store of arrays: `init` keys, `push` values (summed, then merged by the
/// updater), `pull` the stored values into outs.
///
/// Every call takes its keys as one key or a list ([`Keys`]: `3`, `"w"`, `&["5", "7"]`)
/// and its values as one array, a list or a list of lists ([`Values`]). With one key,
/// every value belongs to it; with a list of keys, values pair up with keys, and a
/// repeated key gets the sum of its values.
///
/// # Blocking and non-blocking calls
/// `push`, `pull`, `pushpull` and `broadcast` return when the call is done. Their
/// `_async` twins (`push_async`, ...) return a [`Pending`] at once and run the call on the
/// store's engine threads, so the caller can go on computing (MXNet's `push` returned at
/// once too). The blocking calls are the same calls followed by a wait, so both give the
/// same results, bit for bit:
/// - Calls on the same key take effect in the order they were made, from whatever
///   thread; calls on different keys run in parallel, on as many engine threads as the
///   store has ([`KVStoreBuilder::engine_threads`]: by default one per core but one, so
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
    engine: Arc<Engine>,
    store: Arc<Store>,
}

impl Drop for KVStore {
    /// Waits for the queued calls (a store's own engine then stops its threads).
    fn drop(&mut self) {
        self.engine.wait_idle();
    }
}

/// What a store's calls work on, shared with the engine threads that run them.
pub(crate) struct Store {
    collective: Option<Arc<dyn Collective>>,
    /// A `dist_async` store's link to the keys' owners (`kvstore/remote.rs`).
    remote: Option<Arc<remote::Shards>>,
    kind: String,
    /// How data moves and where keys live (`CommCpu` for `local` and `dist_sync`,
    /// `CommDevice` for `device` and `dist_sync_device`).
    comm: Box<dyn Comm>,
    table: RwLock<Table>,
    merger: RwLock<Merger>,
    /// Gradient compression, once set ([`KVStore::set_gradient_compression`]).
    compression: RwLock<Option<compression::Compression>>,
    unobserved: Unobserved,
    /// The number of this store's calls that communicated (`dist_sync`), for desync
    /// detection (`kvstore/steps.rs`).
    steps: std::sync::atomic::AtomicU64,
    /// Whether the steps are compared ([`KVStoreBuilder::compare_calls`]).
    compare_calls: bool,
    /// The fusion size of non-blocking calls across calls, 0 for none
    /// ([`KVStoreBuilder::fuse_calls`], `kvstore/fusion.rs`).
    fuse_bytes: usize,
    /// Back-pressure: see [`KVStoreBuilder::max_queued_calls`] (`usize::MAX`: none).
    max_queued_calls: usize,
    /// Back-pressure: see [`KVStoreBuilder::max_copied_bytes`] (`usize::MAX`: none).
    max_copied_bytes: usize,
}

impl fmt::Debug for KVStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KVStore")
            .field("kind", &self.store.kind)
            .field("keys", &self.store.table.read().entries.len())
            .finish_non_exhaustive()
    }
}

/// A call's keys' entries, each with its arrays, in call order (a key may appear more
/// than once until [`Store::group`] merges it).
type Found<'a> = Vec<Group<'a>>;

/// The arrays of one key in one call, in call order.
struct Group<'a> {
    entry: Arc<Entry>,
    arrays: Arrays<'a>,
}

/// The arrays of one key in one call, without a heap allocation for up to four: a call
/// with many keys has one array per key and device, and an allocation per key costs
/// more than a small key's sum.
type Arrays<'a> = SmallVec<[&'a NDArray; 4]>;

fn check_context(op: &'static str, key: &Key, a: &NDArray) -> Result<()> {
    crate::device::check_context(a.context()).map_err(|e| match e {
        Error::DeviceUnavailable { context, reason } => {
            Error::DeviceUnavailable { context, reason: format!("{op} of key \"{key}\": {reason}") }
        }
        other => other,
    })
}

/// Checks that an array of shape and dtype `got` may stand for `key`'s value, of shape
/// and dtype `expected`; the error names `key` and `context()` (made only on error).
fn check_like(
    context: impl Fn() -> String,
    key: &Key,
    expected: (&[usize], DType),
    got: (&[usize], DType),
) -> Result<()> {
    if got.0 != expected.0 {
        return Err(Error::ShapeMismatch {
            context: context(),
            key: Some(key.clone()),
            expected: expected.0.to_vec(),
            got: got.0.to_vec(),
        });
    }
    if got.1 != expected.1 {
        return Err(Error::DTypeMismatch {
            context: context(),
            key: Some(key.clone()),
            expected: expected.1,
            got: got.1,
        });
    }
    Ok(())
}

/// What a call's arrays must be like: their key's (from its entry, without a lock), or
/// an array's (the value a spread call locked, a broadcast's value).
#[derive(Clone, Copy)]
enum Like<'x> {
    Key(&'x Entry),
    Array(&'x NDArray),
}

impl Like<'_> {
    /// Whether `a` has the shape and dtype (reading only `a`'s first cache line, and
    /// the other array's, when both have one dimension).
    fn fits(self, a: &NDArray) -> bool {
        match self {
            Like::Key(e) => a.dtype() == e.dtype && a.has_shape(e.shape()),
            Like::Array(v) => a.dtype() == v.dtype() && a.same_shape(v),
        }
    }

    fn shape_dtype(&self) -> (&[usize], DType) {
        match self {
            Like::Key(e) => e.like(),
            Like::Array(v) => (v.shape(), v.dtype()),
        }
    }
}

/// Checks that every one of `key`'s `arrays` may stand for its value, of the shape and
/// dtype of `expected`, and, for outs (`what` "out"), that it may be written (see
/// [`NDArray::from_foreign`]): a call with a read-only out fails before its push.
fn check_arrays<'x>(
    op: &'static str,
    what: &str,
    key: &Key,
    arrays: impl Iterator<Item = &'x NDArray> + Clone,
    expected: Like<'_>,
) -> Result<()> {
    for (i, a) in arrays.clone().enumerate() {
        if a.on_device() {
            check_context(op, key, a)?;
        }
        let context = || {
            let n = arrays.clone().count();
            if n == 1 {
                format!("{op} of key \"{key}\" ({what})")
            } else {
                format!("{op} of key \"{key}\" ({what} {} of {n})", i + 1)
            }
        };
        if !expected.fits(a) {
            check_like(context, key, expected.shape_dtype(), (a.shape(), a.dtype()))?;
        }
        if what == "out" && a.is_read_only() {
            return Err(Error::invalid_argument(format!("{}: the out is read-only", context())));
        }
    }
    Ok(())
}

/// Checks every array of `group` against its key (see [`check_arrays`]): no lock is
/// taken, as a key's shape and dtype never change.
fn check_group(op: &'static str, what: &str, group: &Group<'_>) -> Result<()> {
    let e = &group.entry;
    check_arrays(op, what, &e.key, group.arrays.iter().copied(), Like::Key(e))
}

impl KVStore {
    /// Creates a store of the given kind with the default settings.
    ///
    /// Kinds: `local` (reduce on the host) and `device` (reduce on the devices of the
    /// pushed values; on CPU contexts the same as `local`), case-insensitive, plus
    /// MXNet's spellings `local_update_cpu`, `local_allreduce_cpu` and
    /// `local_allreduce_device`.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore};
    /// let kv = KVStore::create("Local")?;
    /// assert_eq!(kv.kind(), "local");
    /// assert_eq!(KVStore::create("nccl").err().map(|e| e.kind()), Some(ErrorKind::Unsupported));
    /// assert_eq!(KVStore::create("lcoal").err().map(|e| e.kind()), Some(ErrorKind::UnknownStoreKind));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `dist_*` and `nccl` kinds, which this build lacks;
    /// [`Error::UnknownStoreKind`] for any other name (MXNet made those local stores).
    pub fn create(kind: &str) -> Result<Self> {
        Self::builder(kind).build()
    }

    /// A builder for a store of the given kind.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::builder("device").num_threads(2).build()?;
    /// kv.init("w", &NDArray::zeros(&[4])?)?;
    /// kv.push("w", &[NDArray::ones(&[4])?, NDArray::ones(&[4])?], 0)?;
    /// let out = NDArray::zeros(&[4])?;
    /// kv.pull("w", &out, 0)?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![2.0; 4]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn builder(kind: &str) -> KVStoreBuilder {
        KVStoreBuilder::new(kind)
    }

    /// The kind, lower-cased as given (MXNet's `type`).
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// assert_eq!(KVStore::create("Device")?.kind(), "device");
    /// assert_eq!(KVStore::create("local_allreduce_cpu")?.kind(), "local_allreduce_cpu");
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn kind(&self) -> &str {
        &self.store.kind
    }

    /// The name of the data mover: `"cpu"` (`CommCpu`: `local` and `dist_sync` stores)
    /// or `"device"` (`CommDevice`: `device` stores).
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// assert_eq!(KVStore::create("local")?.comm_name(), "cpu");
    /// assert_eq!(KVStore::create("device")?.comm_name(), "device");
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn comm_name(&self) -> &'static str {
        self.store.comm.name()
    }

    /// The rank of this worker: 0 for a local store.
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// // A dist_sync store (kvstore-mpi) gives this process's rank in the job.
    /// assert_eq!(KVStore::create("local")?.rank(), 0);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn rank(&self) -> usize {
        match &self.store.remote {
            Some(r) => r.rank(),
            None => self.store.collective.as_ref().map_or(0, |c| c.rank()),
        }
    }

    /// The number of workers: 1 for a local store.
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// // A dist_sync store (kvstore-mpi) gives the number of processes of the job.
    /// assert_eq!(KVStore::create("local")?.num_workers(), 1);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn num_workers(&self) -> usize {
        match &self.store.remote {
            Some(r) => r.size(),
            None => self.store.collective.as_ref().map_or(1, |c| c.size()),
        }
    }

    /// Waits for every worker: a local store has only this one, so it returns at once.
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// let kv = KVStore::create("local")?;
    /// // In a dist_sync store every worker must reach this call; here there is one.
    /// assert!(kv.barrier().is_ok());
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`] if the worker group is broken.
    pub fn barrier(&self) -> Result<()> {
        if let Some(remote) = &self.store.remote {
            // This worker's earlier calls are applied on their owners first.
            self.wait_all()?;
            return remote.barrier();
        }
        self.in_order("barrier", Store::barrier)
    }

    /// The number of dead nodes in `node_id`'s group: 0 for a local store.
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// assert_eq!(KVStore::create("local")?.num_dead_node(0), 0);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn num_dead_node(&self, _node_id: i32) -> usize {
        0
    }

    /// Whether destroying the store waits at a barrier first. A local store has no
    /// other worker to wait for, so this is accepted and changes nothing.
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// let kv = KVStore::create("local")?;
    /// kv.set_barrier_before_exit(false);
    /// assert!(kv.barrier().is_ok()); // the store is unchanged
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn set_barrier_before_exit(&self, _barrier_before_exit: bool) {}

    /// Sends a command to the parameter servers. A local store has none, so it does
    /// nothing, as MXNet's local store.
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// let kv = KVStore::create("local")?;
    /// assert!(kv.send_command_to_servers(0, "profile").is_ok());
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// None for a local store.
    pub fn send_command_to_servers(&self, _head: i32, _body: &str) -> Result<()> {
        Ok(())
    }

    /// Whether the store can do `capability` (`"optimizer"`, case-insensitive).
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore};
    /// let kv = KVStore::create("local")?;
    /// assert!(kv.is_capable("OPTIMIZER")?);
    /// assert_eq!(kv.is_capable("teleport").err().map(|e| e.kind()), Some(ErrorKind::InvalidArgument));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown capability, as MXNet.
    pub fn is_capable(&self, capability: &str) -> Result<bool> {
        if capability.eq_ignore_ascii_case("optimizer") {
            Ok(true)
        } else {
            Err(Error::invalid_argument(format!("unknown capability \"{}\"", crate::key::shorten(capability))))
        }
    }

    /// Sets MXNet's 2-bit gradient compression, for a `device` or `dist_sync` store: `[("type",
    /// "2bit"), ("threshold", "0.5")]` (the threshold `t` defaults to 0.5 and must be
    /// above 0; other names are ignored, as in MXNet). From then on every pushed value,
    /// even a single one, is quantised to {−t, 0, +t} with a residual per key and per
    /// position in the push's list of values (the device it came from) that carries
    /// what was not sent to the next push; the quantised values are summed and merged
    /// as ever. `init` and `pull` are not compressed. Values must be float32. The
    /// residuals are not saved in checkpoints (nor were they in MXNet).
    ///
    /// Under `dist_sync` each worker quantises its own sum of a key's values (one
    /// residual per key) and the workers exchange 2-bit codes, 16 to a 32-bit word (a
    /// sixteenth of the bytes), then add every worker's quantised values up in rank
    /// order: every worker gets the same bits. Every worker must set the same
    /// compression before the same call (a push where they differ fails on every worker).
    ///
    /// An extension for `dist_sync` only: `[("type", "fp16")]` or `"bf16"` rounds each
    /// worker's sums once to that 16-bit float for the wire (half the bytes, no
    /// residual), and the workers add them up in f32, in rank order.
    ///
    /// ```
    /// use kvstore_core::{Context, KVStore, NDArray};
    /// let kv = KVStore::create("device")?;
    /// kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "1")])?;
    /// kv.init("w", &NDArray::zeros(&[3])?)?;
    /// let g = NDArray::from_vec(&[3], vec![0.5f32, 1.5, -2.5])?;
    /// kv.push("w", &g, 0)?;
    /// assert_eq!(kv.pull_new("w", 0)?.to_vec::<f32>()?, [0.0, 1.0, -1.0]);
    /// kv.push("w", &g, 0)?; // the residuals 0.5, 0.5, -1.5 carried over
    /// assert_eq!(kv.pull_new("w", 0)?.to_vec::<f32>()?, [1.0, 1.0, -1.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for parameters MXNet refuses (no `type`, a type other
    /// than `2bit`, `fp16` or `bf16`, a threshold that is not a number above 0);
    /// [`Error::Unsupported`] on a `local` store (MXNet: "Gradient compression is not
    /// supported for this type of kvstore"), and for `fp16`/`bf16` on a `device` store.
    /// The store is unchanged then.
    pub fn set_gradient_compression(&self, params: &[(&str, &str)]) -> Result<()> {
        self.not_async("set_gradient_compression")?;
        let kind = &self.store.kind;
        if !kind.contains("device") && self.store.collective.is_none() {
            return Err(Error::Unsupported {
                what: format!("gradient compression on a {kind} store"),
                hint: "as in MXNet, it is for device and dist_sync stores (create(\"device\"))".to_string(),
            });
        }
        let compression = compression::parse(params)?;
        if matches!(compression, compression::Compression::Half(_)) && self.store.collective.is_none() {
            return Err(Error::Unsupported {
                what: format!("{} gradient compression on a {kind} store", params_type(params)),
                hint: "fp16 and bf16 round what crosses the network: they are for dist_sync stores; a device \
                       store takes MXNet's \"2bit\""
                    .to_string(),
            });
        }
        // Pushes made before this call are not compressed; those after are.
        self.settle()?;
        *self.store.compression.write() = Some(compression);
        Ok(())
    }

    /// Installs `updater`, replacing any earlier one. Pushes after this call merge
    /// through it instead of assigning; pushes in flight finish with the one they
    /// started with (this call waits for them).
    ///
    /// ```
    /// use kvstore_core::{KVStore, Key, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::ones(&[2])?)?;
    /// // Accumulate instead of assigning: stored += sum of the pushed values.
    /// kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| stored.add_assign(merged))?;
    /// kv.push("w", &NDArray::full(&[2], 3.0)?, 0)?;
    /// let out = NDArray::zeros(&[2])?;
    /// kv.pull("w", &out, 0)?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![4.0; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when called from inside an updater of this store (or,
    /// from an updater of another store, while this store is busy).
    pub fn set_updater(&self, updater: impl Updater + 'static) -> Result<()> {
        self.settle()?;
        if let Some(remote) = &self.store.remote {
            remote.set_updater(Arc::new(updater))?;
            return remote.barrier();
        }
        self.store.replace_merger("set_updater", Merger::Custom(Arc::new(updater)))
    }

    /// Removes the updater or optimizer: pushes assign the sum again (MXNet's default,
    /// ASSIGN). Waits for the pushes in flight, as [`KVStore::set_updater`].
    ///
    /// ```
    /// use kvstore_core::{KVStore, Key, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::ones(&[2])?)?;
    /// kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| stored.add_assign(merged))?;
    /// kv.clear_updater()?;
    /// kv.push("w", &NDArray::full(&[2], 5.0)?, 0)?;
    /// let out = NDArray::zeros(&[2])?;
    /// kv.pull("w", &out, 0)?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![5.0; 2]); // the sum replaced the value
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::set_updater`].
    pub fn clear_updater(&self) -> Result<()> {
        self.settle()?;
        if let Some(remote) = &self.store.remote {
            remote.clear_updater()?;
            return remote.barrier();
        }
        self.store.replace_merger("clear_updater", Merger::Assign)
    }

    /// Installs `optimizer` (MXNet's `set_optimizer`): every later push of gradients
    /// updates the weights with it. Replaces any updater; every key's optimizer state
    /// starts afresh. Waits for the pushes in flight; a state file saved or loaded at
    /// the same time is wholly of the old optimizer or wholly of the new one.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::ones(&[2])?)?;
    /// kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 0.5).build()?)?;
    /// kv.push("w", &NDArray::ones(&[2])?, 0)?; // a gradient: w -= 0.5 * 1
    /// let w = NDArray::zeros(&[2])?;
    /// kv.pull("w", &w, 0)?;
    /// assert_eq!(w.to_vec::<f32>()?, vec![0.5; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when called from inside an updater of this store.
    pub fn set_optimizer(&self, optimizer: Optimizer) -> Result<()> {
        self.settle()?;
        if let Some(remote) = &self.store.remote {
            // Every owner installs it before any worker pushes again.
            remote.set_optimizer(optimizer)?;
            return remote.barrier();
        }
        let runtime = Arc::new(Runtime::new(optimizer));
        let held = Held::new("set_optimizer", &self.store, &[])?;
        let mut merger = held.merger_write("set_optimizer", &self.store.merger)?;
        // With the merger held no push runs, so every key's state can be dropped; keys
        // initialised later start with none.
        let entries = self.store.entries();
        let entries: Vec<&Arc<Entry>> = entries.iter().collect();
        let mut guards = held.write("set_optimizer", &entries)?;
        for g in guards.iter_mut() {
            g.opt = None;
        }
        let old = std::mem::replace(&mut *merger, Merger::Optimizer(runtime));
        drop(guards);
        drop(merger);
        drop(old);
        Ok(())
    }

    /// The name of the installed optimizer, if any.
    ///
    /// ```
    /// use kvstore_core::{KVStore, Optimizer};
    /// let kv = KVStore::create("local")?;
    /// assert_eq!(kv.optimizer_name(), None);
    /// kv.set_optimizer(Optimizer::builder("Adam").build()?)?;
    /// assert_eq!(kv.optimizer_name(), Some("adam"));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn optimizer_name(&self) -> Option<&'static str> {
        if let Some(remote) = &self.store.remote {
            return remote.optimizer_name();
        }
        match &*self.store.merger.read() {
            Merger::Optimizer(r) => Some(r.optimizer().name()),
            _ => None,
        }
    }

    /// Writes every key's optimizer state, the update counters, the schedule's state and
    /// the hyper-parameters to `path` (safetensors with JSON metadata and a checksum of
    /// its contents). The file is one consistent snapshot: no push, `set_optimizer` or
    /// load runs while it is taken.
    ///
    /// The file is written beside `path` under a temporary name, flushed to disk and
    /// renamed over `path`, so a failed save leaves any old file whole. A symbolic link
    /// is written through (its target is replaced); a path that is a directory, a device,
    /// a FIFO or a socket is refused. Temporary files left by a process that died while
    /// saving to the same path are removed.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::ones(&[2])?)?;
    /// kv.set_optimizer(Optimizer::builder("adam").build()?)?;
    /// kv.push("w", &NDArray::ones(&[2])?, 0)?;
    /// let path = std::env::temp_dir().join(format!("kvstore-doc-save-{}.states", std::process::id()));
    /// kv.save_optimizer_states(&path)?;
    /// assert!(std::fs::metadata(&path).is_ok_and(|m| m.len() > 0));
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if no optimizer is set or `path` names something other
    /// than a regular file; [`Error::Io`] if the file cannot be written.
    pub fn save_optimizer_states(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.not_async("save_optimizer_states")?;
        const OP: &str = "save_optimizer_states";
        let path = path.as_ref();
        let target = opt_states::save_target(path, OP)?;
        self.settle()?;
        let held = Held::new(OP, &self.store, &[])?;
        let merger = held.merger_read(OP, &self.store.merger)?;
        let runtime = Store::runtime(OP, &merger)?;
        let entries = self.store.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let guards = held.read(OP, &locked)?;
        let keyed: Vec<(Key, Vec<usize>, &KeyState)> = entries
            .iter()
            .zip(&guards)
            .filter_map(|(e, g)| Some((e.key.clone(), g.value.shape().to_vec(), g.opt.as_ref()?)))
            .collect();
        let bytes = opt_states::encode(runtime, &runtime.snapshot(), &keyed)?;
        drop(guards);
        drop(merger);
        opt_states::write_file(&target, &bytes, OP)
    }

    /// Reads a file of [`KVStore::save_optimizer_states`] into the installed optimizer:
    /// the states of the keys in the file, the update counters and the schedule (the
    /// hyper-parameters stay those of the installed optimizer). Keys of the store that
    /// are not in the file start afresh. All or nothing: the file is checked whole
    /// (structure, checksum, counters) and against the store before anything changes,
    /// and no push or `set_optimizer` runs while it is loaded.
    ///
    /// Only regular files are read (a FIFO, a device or a directory is refused), and
    /// no more than the size the file's header declares.
    ///
    /// ```
    /// # use kvstore_core::{KVStore, NDArray, Optimizer};
    /// # let path = std::env::temp_dir().join(format!("kvstore-doc-load-{}.states", std::process::id()));
    /// # let (kv, w, g) = (KVStore::create("local")?, NDArray::zeros(&[1])?, NDArray::ones(&[1])?);
    /// # kv.init("w", &w)?;
    /// // A key "w" of zeros, and a gradient g of ones.
    /// let sgd = || Optimizer::builder("sgd").param("learning_rate", 0.5).param("momentum", 0.5).build();
    /// kv.set_optimizer(sgd()?)?;
    /// kv.push("w", &g, 0)?; // momentum -0.5, w -0.5
    /// kv.save_optimizer_states(&path)?;
    /// kv.set_optimizer(sgd()?)?; // the momentum starts afresh...
    /// kv.load_optimizer_states(&path)?; // ...and comes back from the file
    /// kv.pushpull("w", &g, &w, 0)?; // momentum 0.5 * -0.5 - 0.5, w -0.5 - 0.75
    /// assert_eq!(w.to_vec::<f32>()?, vec![-1.25]);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if no optimizer is set, the file is for another
    /// optimizer, or `path` is not a regular file; [`Error::Io`] for a missing,
    /// truncated or corrupted file; [`Error::KeyNotInitialized`] for a key of the file
    /// that the store lacks; [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`] for a
    /// state that does not fit its key.
    pub fn load_optimizer_states(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.not_async("load_optimizer_states")?;
        const OP: &str = "load_optimizer_states";
        let path = path.as_ref();
        let context = format!("{OP} from {}", crate::key::shorten(&path.display().to_string()));
        self.settle()?;
        let held = Held::new(OP, &self.store, &[])?;
        // Fail early, before reading, when no optimizer is set.
        Store::runtime(OP, &*held.merger_read(OP, &self.store.merger)?)?;
        let bytes = opt_states::read_file(path, &context)?;
        let merger = held.merger_write(OP, &self.store.merger)?;
        let runtime = Store::runtime(OP, &merger)?;
        let (snapshot, loaded) = opt_states::decode(runtime, &bytes, &context)?;
        runtime.check_snapshot(&snapshot, &context)?;
        let entries = self.store.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let mut guards = held.write(OP, &locked)?;
        let mut slots: Vec<opt_states::KeySlot<'_>> = entries
            .iter()
            .zip(guards.iter_mut())
            .map(|(e, g)| {
                let Slot { value, opt, .. } = &mut **g;
                opt_states::KeySlot { key: &e.key, weight: value, state: opt }
            })
            .collect();
        opt_states::install(runtime, loaded, &mut slots, OP, &context)?;
        runtime.restore(snapshot);
        Ok(())
    }

    /// The keys of the store, in the order they were first initialised.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init(&["b", "a"], &[NDArray::zeros(&[1])?, NDArray::zeros(&[1])?])?;
    /// kv.init(7, &NDArray::zeros(&[1])?)?;
    /// let keys = kv.keys();
    /// assert_eq!(keys.iter().map(|k| k.as_str()).collect::<Vec<_>>(), ["b", "a", "7"]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn keys(&self) -> Vec<Key> {
        let table = self.store.table.read();
        let mut entries: Vec<&Arc<Entry>> = table.entries.values().collect();
        entries.sort_by_key(|e| e.index);
        entries.iter().map(|e| e.key.clone()).collect()
    }

    /// The internal number of `key` (0, 1, 2, ... in order of first init), which
    /// MXNet's Scala and Clojure updaters received instead of string keys.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init(&["w", "b"], &[NDArray::zeros(&[1])?, NDArray::zeros(&[1])?])?;
    /// assert_eq!((kv.key_index("w"), kv.key_index("b")), (Some(0), Some(1)));
    /// assert_eq!(kv.key_index("nope"), None);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn key_index(&self, key: impl Into<Key>) -> Option<usize> {
        self.store.table.read().entries.get(&key.into()).map(|e| e.index)
    }

    /// Where `key`'s value lives: the host for `local` stores (they sum on the host;
    /// values of devices are staged through page-locked memory); for `device` stores
    /// the device the key was given at its first push from devices, where its sums and
    /// updates run (keys are spread over the devices by size).
    ///
    /// ```
    /// use kvstore_core::{Context, DType, ErrorKind, KVStore, NDArray};
    /// let kv = KVStore::create("device")?;
    /// kv.init("w", &NDArray::zeros_with(&[2], DType::F32, Context::cpu(1))?)?;
    /// // On a GPU machine (kvstore-cuda), keys pushed from gpu(i) arrays report a gpu(j).
    /// assert_eq!(kv.context_of("w")?, Context::cpu(1));
    /// assert_eq!(kv.context_of("nope").err().map(|e| e.kind()), Some(ErrorKind::KeyNotInitialized));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`]; [`Error::InvalidArgument`] when called from an
    /// updater running on this key.
    pub fn context_of(&self, key: impl Into<Key>) -> Result<Context> {
        let key = key.into();
        self.settle()?;
        let entry = self
            .store
            .table
            .read()
            .entries
            .get(&key)
            .cloned()
            .ok_or(Error::KeyNotInitialized { op: "context_of", key })?;
        let held = Held::new("context_of", &self.store, &[&entry])?;
        let guards = held.read("context_of", &[&entry])?;
        Ok(guards[0].value.context())
    }

    /// Initialises keys with copies of the values. All or nothing: on error no key of
    /// the call is added.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init(&["a", "b"], &[NDArray::ones(&[2])?, NDArray::zeros(&[3])?])?;
    /// let out = NDArray::zeros(&[2])?;
    /// kv.pull("a", &out, 0)?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![1.0; 2]);
    /// let again = kv.init("a", &NDArray::ones(&[2])?).err();
    /// assert_eq!(again.map(|e| e.kind()), Some(ErrorKind::AlreadyInitialized));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::AlreadyInitialized`] for a key the store holds or that appears twice in
    /// the call; [`Error::LengthMismatch`] for lists of different lengths;
    /// [`Error::DeviceUnavailable`] for a value on an unavailable device.
    pub fn init<'a>(&self, keys: impl Into<Keys>, values: impl Into<Values<'a>>) -> Result<()> {
        let pairs =
            flatten("init", keys.into(), values.into(), "values").map_err(|e| self.refused_everywhere("init", e))?;
        self.init_flat("init", pairs)
    }

    /// Pushes values: for each distinct key, sums its values left to right, then the
    /// updater merges the sum into the stored value (with none, the sum replaces it).
    /// Always copies: the store never keeps a reference to a pushed array.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init(3, &NDArray::zeros(&[2])?)?;
    /// kv.push(3, &[NDArray::full(&[2], 1.0)?, NDArray::full(&[2], 2.0)?], 0)?; // summed
    /// let out = NDArray::zeros(&[2])?;
    /// kv.pull(3, &out, 0)?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![3.0; 2]);
    /// assert_eq!(kv.push(4, &out, 0).err().map(|e| e.kind()), Some(ErrorKind::KeyNotInitialized));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`], [`Error::ShapeMismatch`], [`Error::DTypeMismatch`],
    /// [`Error::LengthMismatch`], or the updater's error. On any error the store keeps
    /// the values it had before the call.
    pub fn push<'a>(&self, keys: impl Into<Keys>, values: impl Into<Values<'a>>, priority: i32) -> Result<()> {
        let values = values.into();
        self.wake_for(values);
        let (push, pull) = self.store.push_args(keys.into(), values).map_err(|e| self.refused_everywhere("push", e))?;
        self.call("push", push, pull, priority)
    }

    /// Copies each key's stored value into its outs.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::full(&[2], 7.0)?)?;
    /// let outs = [NDArray::zeros(&[2])?, NDArray::zeros(&[2])?];
    /// kv.pull("w", &outs, 0)?; // every out gets the value
    /// assert_eq!(outs[1].to_vec::<f32>()?, vec![7.0; 2]);
    /// let wrong = NDArray::zeros(&[3])?;
    /// assert_eq!(kv.pull("w", &wrong, 0).err().map(|e| e.kind()), Some(ErrorKind::ShapeMismatch));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`], [`Error::ShapeMismatch`] or
    /// [`Error::DTypeMismatch`] (pull does not convert: use [`NDArray::as_type`]),
    /// [`Error::LengthMismatch`]. On error no out is written.
    pub fn pull<'a>(&self, keys: impl Into<Keys>, outs: impl Into<Values<'a>>, priority: i32) -> Result<()> {
        let outs = outs.into();
        self.wake_for(outs);
        let (push, pull) = self.store.pull_args(keys.into(), outs)?;
        self.call("pull", push, pull, priority)
    }

    /// Pulls `key`'s value into a new array on `cpu(0)`, of the value's shape and dtype
    /// (MXNet's `pull` needs an out; this makes one).
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`]; [`Error::InvalidArgument`] when called from an
    /// updater of this store.
    ///
    /// ```
    /// use kvstore_core::{DType, ErrorKind, KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init(3, &NDArray::full(&[2, 3], 2.0)?)?;
    /// let w = kv.pull_new(3, 0)?;
    /// assert_eq!((w.shape(), w.dtype()), (&[2, 3][..], DType::F32));
    /// assert_eq!(w.to_vec::<f32>()?, vec![2.0; 6]);
    /// assert_eq!(kv.pull_new("w", 0).unwrap_err().kind(), ErrorKind::KeyNotInitialized);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn pull_new(&self, key: impl Into<Key>, priority: i32) -> Result<NDArray> {
        let key = key.into();
        let entry = self.store.table.read().entries.get(&key).cloned();
        let entry = entry.ok_or_else(|| Error::KeyNotInitialized { op: "pull", key: key.clone() })?;
        // A key's shape and dtype never change once initialised (pushes are checked).
        let out = NDArray::zeros_with(entry.shape(), entry.dtype, Context::cpu(0))?;
        self.pull(key, &out, priority)?;
        Ok(out)
    }

    /// Push, then pull into `outs`, holding the keys in between so the outs see this
    /// push's result.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("g", &NDArray::zeros(&[2])?)?;
    /// let out = NDArray::zeros(&[2])?;
    /// kv.pushpull("g", &[NDArray::ones(&[2])?, NDArray::ones(&[2])?], &out, 0)?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![2.0; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::push`] and [`KVStore::pull`]; on error nothing changes.
    pub fn pushpull<'a, 'b>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Values<'a>>,
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Result<()> {
        let values = values.into();
        self.wake_for(values);
        let (push, pull) = self
            .store
            .pushpull_args(keys.into(), values, outs.into())
            .map_err(|e| self.refused_everywhere("pushpull", e))?;
        self.call("pushpull", push, pull, priority)
    }

    /// Push, then pull the result back into the pushed arrays themselves (MXNet's
    /// `pushpull` with `out=None`).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("g", &NDArray::zeros(&[2])?)?;
    /// let grads = [NDArray::full(&[2], 1.0)?, NDArray::full(&[2], 2.0)?];
    /// kv.pushpull_in_place("g", &grads, 0)?; // each array now holds the sum
    /// assert_eq!(grads[0].to_vec::<f32>()?, vec![3.0; 2]);
    /// assert_eq!(grads[1].to_vec::<f32>()?, vec![3.0; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::pushpull`].
    pub fn pushpull_in_place<'a>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Values<'a>>,
        priority: i32,
    ) -> Result<()> {
        let values = values.into();
        self.wake_for(values);
        let (push, pull) =
            self.store.in_place_args(keys.into(), values).map_err(|e| self.refused_everywhere("pushpull", e))?;
        self.call("pushpull", push, pull, priority)
    }

    /// Initialises the keys with the values, then pulls them into the outs.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// let outs = [NDArray::zeros(&[2])?, NDArray::zeros(&[2])?];
    /// kv.broadcast("w", &NDArray::full(&[2], 4.0)?, &outs, 0)?;
    /// assert_eq!(outs[1].to_vec::<f32>()?, vec![4.0; 2]);
    /// assert_eq!(kv.key_index("w"), Some(0)); // "w" is initialised now
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::init`], and [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`]
    /// for an out that does not match its value (checked before anything is stored).
    pub fn broadcast<'a, 'b>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Values<'a>>,
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Result<()> {
        let outs = outs.into();
        let (init, pull) =
            broadcast_args(keys.into(), values.into(), outs).map_err(|e| self.refused_everywhere("broadcast", e))?;
        let pull = self.broadcast_init(init, pull)?;
        self.wake_for(outs);
        self.call("broadcast", Vec::new(), pull, priority)
    }

    /// [`KVStore::pushpull`] on flat lists: `values[i]` is pushed to `keys[i]` and
    /// `outs[j]` pulled from `out_keys[j]`, so values and outs may differ in number per
    /// key. For bindings, which flatten their own call forms.
    ///
    /// ```
    /// use kvstore_core::{KVStore, Key, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init(&["a", "b"], &[NDArray::zeros(&[1])?, NDArray::zeros(&[1])?])?;
    /// let (a, b) = (Key::from("a"), Key::from("b"));
    /// let values = [NDArray::full(&[1], 1.0)?, NDArray::full(&[1], 2.0)?, NDArray::full(&[1], 5.0)?];
    /// let outs = [NDArray::zeros(&[1])?, NDArray::zeros(&[1])?];
    /// kv.pushpull_pairs(&[a.clone(), a.clone(), b.clone()], &values, &[a, b], &outs, 0)?;
    /// assert_eq!((outs[0].to_vec::<f32>()?, outs[1].to_vec::<f32>()?), (vec![3.0], vec![5.0]));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::pushpull`].
    pub fn pushpull_pairs(
        &self,
        keys: &[Key],
        values: &[NDArray],
        out_keys: &[Key],
        outs: &[NDArray],
        priority: i32,
    ) -> Result<()> {
        self.wake_for(Values::Many(values));
        let (push, pull) =
            flat_runs("pushpull", keys, values, out_keys, outs).map_err(|e| self.refused_everywhere("pushpull", e))?;
        self.call("pushpull", push, pull, priority)
    }

    /// [`KVStore::broadcast`] on flat lists, as [`KVStore::pushpull_pairs`].
    ///
    /// ```
    /// use kvstore_core::{KVStore, Key, NDArray};
    /// let kv = KVStore::create("local")?;
    /// let w = Key::from("w");
    /// let outs = [NDArray::zeros(&[2])?, NDArray::zeros(&[2])?];
    /// kv.broadcast_pairs(&[w.clone()], &[NDArray::full(&[2], 6.0)?], &[w.clone(), w], &outs, 0)?;
    /// assert_eq!((outs[0].to_vec::<f32>()?, outs[1].to_vec::<f32>()?), (vec![6.0; 2], vec![6.0; 2]));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::broadcast`].
    pub fn broadcast_pairs(
        &self,
        keys: &[Key],
        values: &[NDArray],
        out_keys: &[Key],
        outs: &[NDArray],
        priority: i32,
    ) -> Result<()> {
        let (init, pull) = flat_runs("broadcast", keys, values, out_keys, outs)
            .map_err(|e| self.refused_everywhere("broadcast", e))?;
        let pull = self.broadcast_init(init, pull)?;
        self.wake_for(Values::Many(outs));
        self.call("broadcast", Vec::new(), pull, priority)
    }
}

impl Store {
    /// Every entry, in index order.
    fn entries(&self) -> Vec<Arc<Entry>> {
        let mut entries: Vec<Arc<Entry>> = self.table.read().entries.values().cloned().collect();
        entries.sort_by_key(|e| e.index);
        entries
    }

    fn init_pairs(&self, op: &'static str, pairs: Vec<(Key, &NDArray)>) -> Result<()> {
        let _held = Held::new(op, self, &[])?;
        let checked = self.check_init(op, &pairs);
        if self.collective.is_some() {
            let keys: Vec<steps::StepKey<'_>> = pairs.iter().map(|(k, v)| (k, v.shape(), v.dtype())).collect();
            self.check_step(op, &keys, checked)?;
        } else {
            checked?;
        }
        // Copy outside the table lock: copies of big arrays take a while. Where a value
        // is kept is the comm's business (`local`: on the host, in page-locked memory).
        let copies: Vec<NDArray> = pairs.iter().map(|(_, v)| self.comm.init_value(v)).collect::<Result<_>>()?;
        // dist_sync: every worker takes rank 0's values (MXNet: only rank 0's init
        // reaches the servers), before any is visible in this store.
        if let Some(group) = &self.collective {
            group.broadcast(&copies.iter().collect::<Vec<_>>(), 0)?;
        }
        // dist_async: rank 0's values go to the keys' owners; every worker waits until
        // they are there (whatever happened on rank 0).
        if let Some(remote) = &self.remote {
            let sent = match remote.rank() {
                0 => pairs.iter().zip(&copies).try_for_each(|((k, _), v)| remote.init(k, v)),
                _ => Ok(()),
            };
            let met = remote.barrier();
            sent?;
            met?;
        }
        let mut table = self.table.write();
        if let Some((k, _)) = pairs.iter().find(|(k, _)| table.entries.contains_key(k)) {
            return Err(Self::already(op, k));
        }
        for ((key, _), value) in pairs.into_iter().zip(copies) {
            let index = table.next_index;
            table.next_index += 1;
            let order = table.take_order();
            table.entries.insert(key.clone(), Entry::new(key, index, Slot::new(value, order)));
        }
        drop(table);
        self.collective.as_ref().map_or(Ok(()), |c| c.barrier())
    }

    fn already(op: &'static str, k: &Key) -> Error {
        Error::AlreadyInitialized {
            op,
            key: k.clone(),
            detail: "it was initialized before; init and broadcast take each key once",
        }
    }

    /// The checks of `init` before anything is copied.
    fn check_init(&self, op: &'static str, pairs: &[(Key, &NDArray)]) -> Result<()> {
        let mut seen = HashMap::new();
        for (k, v) in pairs {
            check_context(op, k, v)?;
            if seen.insert(k, ()).is_some() {
                return Err(Error::AlreadyInitialized {
                    op,
                    key: k.clone(),
                    detail: "the key appears twice in this call",
                });
            }
        }
        let table = self.table.read();
        match pairs.iter().find(|(k, _)| table.entries.contains_key(k)) {
            Some((k, _)) => Err(Self::already(op, k)),
            None => Ok(()),
        }
    }

    /// Waits for every worker (a step of its own: the workers compare their calls).
    fn barrier(&self) -> Result<()> {
        self.check_step("barrier", &[], Ok(()))?;
        self.collective.as_ref().map_or(Ok(()), |c| c.barrier())
    }

    /// Finds each run's entry; [`Store::group`] then groups them by key (values in
    /// call order), sorted by internal index, the order of updates and of locking.
    ///
    /// One table lookup per key as given (a key given again right after is looked up
    /// once), then a stable sort by index (linear when the keys come in the order they
    /// were initialised, as lists of parameters do), so a key's values stay in call
    /// order and repeated keys end up next to each other.
    fn lookup<'a>(&self, op: &'static str, runs: Vec<Run<'a>>) -> Result<Found<'a>> {
        let table = self.table.read();
        let mut found: Found<'a> = Vec::with_capacity(runs.len());
        for (key, arrays) in runs {
            let entry = match found.last() {
                Some(last) if last.entry.key == key => Arc::clone(&last.entry),
                _ => match table.entries.get(&key) {
                    Some(entry) => Arc::clone(entry),
                    None => return Err(Error::KeyNotInitialized { op, key }),
                },
            };
            found.push(Group { entry, arrays: arrays.iter().collect() });
        }
        Ok(found)
    }

    /// The groups of `found` (see [`Store::lookup`]).
    fn group(mut found: Found<'_>) -> Vec<Group<'_>> {
        // Keys in the order they were initialised, each once (lists of parameters):
        // already the groups.
        if found.is_sorted_by(|a, b| a.entry.index < b.entry.index) {
            return found;
        }
        found.sort_by_key(|g| g.entry.index);
        let mut groups: Vec<Group<'_>> = Vec::with_capacity(found.len());
        for g in found {
            match groups.last_mut() {
                Some(last) if last.entry.index == g.entry.index => last.arrays.extend(g.arrays),
                _ => groups.push(g),
            }
        }
        groups
    }

    /// Keys of a call that come with no array (an empty list of values or outs) must
    /// still be initialised, as with any other call on them.
    fn require_bare_keys(&self, op: &'static str, keys: &Keys, arrays: Values<'_>) -> Result<()> {
        let bare: Vec<&Key> = match (keys, arrays) {
            (Keys::One(k), Values::Many([])) => vec![k],
            (Keys::Many(ks), Values::Nested(vss)) => {
                ks.iter().zip(vss).filter(|(_, vs)| vs.is_empty()).map(|(k, _)| k).collect()
            }
            _ => return Ok(()),
        };
        let table = self.table.read();
        match bare.into_iter().find(|k| !table.entries.contains_key(*k)) {
            Some(k) => Err(Error::KeyNotInitialized { op, key: k.clone() }),
            None => Ok(()),
        }
    }

    /// The push algorithm (`KVStoreLocal::PushImpl`) followed by an optional pull, with
    /// every key of the call locked (written when it pushes), in index order, for the
    /// whole call: the plan of `push` and `pull` (see `plan.rs`), then its runner.
    /// `spread`: whether to offer the call to [`Store::spread`] first (not when it was
    /// found to be no call for that path already).
    fn push_pull<'a>(&self, op: &'static str, push: Found<'a>, pull: Found<'a>, spread: bool) -> Result<()> {
        if push.is_empty() && pull.is_empty() {
            return Ok(());
        }
        let plan = Plan::new(self, op, push, pull);
        if spread
            && plan.checked.is_ok()
            && let Some(r) = self.spread(&plan)
        {
            return r;
        }
        // Lock in index order, so that concurrent multi-key calls cannot deadlock.
        let entries = plan.entries();
        let held = Held::new(op, self, &entries)?;
        // Under dist_sync a refusal is this worker's step (the workers compare their
        // calls before the data moves); elsewhere it ends the call before any lock.
        if self.collective.is_none() {
            plan.checked.clone()?;
        }
        if plan.push.is_empty() {
            return self.pull_planned(&plan, &held, &entries);
        }
        // The merger is held for the whole call: the updater or optimizer it starts with
        // stays installed (and alive) until it ends.
        let merger = held.merger_read(op, &self.merger)?;
        let mut guards = held.write(op, &entries)?;
        if self.collective.is_some() {
            let checked = plan.checked.clone();
            self.check_push_step(op, &plan.step_keys(), checked, plan.compression, merger.identity())?;
        }
        let (push, pull) = (&plan.push, &plan.pull);
        self.apply(push, pull, &plan.push_slots, &plan.pull_slots, &mut guards, &merger, plan.compression, None)
    }

    /// The runner of a pull (a plan that pushes nothing), its keys `entries`.
    fn pull_planned(&self, plan: &Plan<'_>, held: &Held, entries: &[&Arc<Entry>]) -> Result<()> {
        let op = plan.op;
        if let Some(remote) = &self.remote {
            // dist_async: the values come from their owners (into this worker's copies).
            let mut guards = held.write(op, entries)?;
            return self.apply_remote(remote, &[], &plan.pull, &[], &plan.pull_slots, &mut guards);
        }
        let guards = held.read(op, entries)?;
        let jobs: Vec<BroadcastJob<'_>> = plan
            .pull
            .iter()
            .zip(&guards)
            .map(|(g, stored)| BroadcastJob { src: &stored.value, outs: &g.arrays })
            .collect();
        self.comm.broadcast(&jobs)
    }
}

/// The `type` of gradient-compression parameters, for messages.
fn params_type(params: &[(&str, &str)]) -> String {
    params.iter().rev().find(|(k, _)| k.trim() == "type").map_or(String::new(), |(_, v)| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::{Entry, Slot};

    #[test]
    fn an_entry_starts_with_its_lock_and_the_value_handle() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(Entry, value), 0);
        assert_eq!(offset_of!(Slot, value), 0);
        // The lock's word, then the slot's handle, whose first word is what a call
        // reads (the array's address; then what the handle keeps alive, read only when
        // it is cloned or dropped): 16 bytes from an allocation's 16-byte aligned start,
        // within one cache line.
        assert!(size_of::<parking_lot::RawRwLock>() + crate::NDArray::HOT_BYTES <= 16);
    }
}
