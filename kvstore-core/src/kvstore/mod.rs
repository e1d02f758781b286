//! The store: mirrors `KVStoreLocal` in MXNet's `src/kvstore/kvstore_local.h`, with
//! the deliberate differences listed in the crate docs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::key::{Key, Keys};
use crate::ndarray::{NDArray, RowSparse};
use crate::optimizer::{Optimizer, Runtime};
use crate::timeline;
use crate::updater::Updater;
use forms::{RowSparsePushes, Values, flat_runs, flatten};

mod agree;
mod builder;
mod calls;
mod checkpoint;
mod compression;
mod data;
pub(crate) mod forms;
mod layout;
mod locks;
mod merge;
mod owned;
mod pending;
mod plan;
mod remote;
mod rows;
mod run;
mod saved;
mod seam;
mod sparse;
mod stats;
mod steps;

pub use agree::{Said, ranks, word};
pub use builder::KVStoreBuilder;
use calls::broadcast_args;
pub use checkpoint::Snapshot;
pub use data::{Durable, KVStore, MakeDurable, Restored, Seam};
use data::{Entry, Merger, Store};
pub use layout::Layout;
use locks::Held;
pub use pending::{Pending, Release};
use plan::RowsPlan;
pub use seam::{Peers, install_durability};
use sparse::RowIds;
pub use sparse::StorageType;
pub(crate) use stats::finish_timeline;
pub use stats::{CallCount, HeldBytes, LATE_MARGIN, Lateness, RankStats, Stats, slowest_rank};

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
    /// On a store that resumed a commit ([`KVStore::restored`]) with an optimizer, the
    /// first call before any push keeps that optimizer and its state when it sets the
    /// same optimizer with the same settings (a resumed program sets it as it did at its
    /// start), and is refused for another one; later calls, and calls after the
    /// restored optimizer updated a key, act as above.
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
    /// [`Error::InvalidArgument`] when called from inside an updater of this store, or
    /// when it is the first on a resumed store and sets another optimizer than the
    /// commit's.
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
        // A resumed program sets its optimizer as it did at its start: the restored one,
        // with its state, stays (a job resumed ends with an uninterrupted one's bits).
        if let Merger::Optimizer(restored) = &*merger
            && let Some(same) = restored.resumed_as(&runtime)
        {
            return match same {
                true => Ok(()),
                false => Err(Error::invalid_argument(format!(
                    "set_optimizer: this store resumed a commit{} with its optimizer and that optimizer's state; a \
                     resumed program sets the same optimizer with the same settings (the store then keeps that \
                     state), and this one differs ({}). Set the one the job ran with, or start the job afresh \
                     (remove its commits, or give the job another name)",
                    self.store.restored.get().map_or(String::new(), |r| format!(" of step {}", r.step)),
                    restored.differences(&runtime, "in the commit", "here").join("; "),
                ))),
            };
        }
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
        self.store.entries().iter().map(|e| e.key.clone()).collect()
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
        self.store.table.read().entries.get(&key.into()).map(|e| e.0.index)
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
        let entry = self.store.found("context_of", &key)?;
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
        let (push, pull) =
            self.store.push_args(keys.into(), values).map_err(|e| self.refused_pushing("push", values, e))?;
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
        let entry = self.store.found("pull", &key)?;
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
            .map_err(|e| self.refused_pushing("pushpull", values, e))?;
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
            self.store.in_place_args(keys.into(), values).map_err(|e| self.refused_pushing("pushpull", values, e))?;
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
    pub fn pushpull_pairs<'a, 'b>(
        &self,
        keys: &[Key],
        values: impl Into<Values<'a>>,
        out_keys: &[Key],
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Result<()> {
        let (values, outs) = (values.into(), outs.into());
        self.wake_for(values);
        let (push, pull) = flat_runs("pushpull", keys, values, out_keys, outs)
            .map_err(|e| self.refused_pushing("pushpull", values, e))?;
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
    pub fn broadcast_pairs<'a, 'b>(
        &self,
        keys: &[Key],
        values: impl Into<Values<'a>>,
        out_keys: &[Key],
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Result<()> {
        let (values, outs) = (values.into(), outs.into());
        let (init, pull) = flat_runs("broadcast", keys, values, out_keys, outs)
            .map_err(|e| self.refused_everywhere("broadcast", e))?;
        let pull = self.broadcast_init(init, pull)?;
        self.wake_for(outs);
        self.call("broadcast", Vec::new(), pull, priority)
    }

    /// What this store did since it was made or [`KVStore::reset_stats`]: calls and
    /// keys by kind, bytes pushed, pulled and on the wire, time in each phase, and
    /// under `dist_sync`, per worker, at how many collectives it arrived last and how
    /// late on average (see [`Stats`]).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::zeros(&[4])?)?;
    /// kv.push("w", &NDArray::ones(&[4])?, 0)?;
    /// let s = kv.stats();
    /// assert_eq!((s.calls["push"].calls, s.bytes_pushed), (1, 16));
    /// kv.reset_stats();
    /// assert!(kv.stats().calls.is_empty());
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        Stats { held: self.store.held_bytes(), ..self.store.counters.snapshot() }
    }

    /// Sets this store's counters ([`KVStore::stats`]) to zero.
    pub fn reset_stats(&self) {
        self.store.counters.reset();
    }

    /// Starts writing the timeline of this process's stores to `path` (see
    /// [`crate::timeline`]; as `KVSTORE_TIMELINE=path` does for a whole program). Under
    /// `dist_sync`, each worker writes its own file beside `path` (`trace.json` →
    /// `trace.rank1.json`) until [`KVStore::stop_timeline`] merges them.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when the file cannot be made.
    pub fn start_timeline(&self, path: impl AsRef<Path>) -> Result<()> {
        timeline::start(path)
    }

    /// Stops the timeline and closes its file; under `dist_sync` (a collective, as
    /// [`KVStore::barrier`]: every worker calls it) after this worker's calls are
    /// done, and worker 0 merges every worker's file into the path the timeline was
    /// started with, on rank 0's clock. Returns the file written here (the merged one
    /// on worker 0), or `None` when the timeline was off.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// let path = std::env::temp_dir().join(format!("kvstore-doc-{}.json", std::process::id()));
    /// kv.start_timeline(&path)?;
    /// kv.init("w", &NDArray::zeros(&[4])?)?;
    /// kv.push("w", &NDArray::ones(&[4])?, 0)?;
    /// assert_eq!(kv.stop_timeline()?, Some(path.clone()));
    /// let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    /// assert!(trace["traceEvents"].as_array().unwrap().iter().any(|e| e["name"] == "push"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when a file cannot be written; under `dist_sync`,
    /// an earlier call's error, and the group's errors.
    pub fn stop_timeline(&self) -> Result<Option<PathBuf>> {
        if self.store.collective.is_none() {
            return timeline::stop();
        }
        self.wait_all()?;
        let written = Arc::new(parking_lot::Mutex::new(None));
        let out = Arc::clone(&written);
        self.in_order("stop_timeline", move |store| {
            store.check_step("stop_timeline", &[], Ok(()))?;
            let group = store.collective.as_deref().ok_or_else(|| Error::Internal("no group".into()))?;
            *out.lock() = finish_timeline(group, false)?;
            Ok(())
        })?;
        Ok(written.lock().take())
    }

    /// Sets MXNet's 2-bit gradient compression, for a `device` or `dist_sync` store: `[("type",
    /// "2bit"), ("threshold", "0.5")]` (the threshold `t` defaults to 0.5 and must be
    /// above 0; other names are ignored, as in MXNet). From then on every pushed value,
    /// even a single one, is quantised to {−t, 0, +t} with a residual per key and per
    /// position in the push's list of values (the device it came from) that carries
    /// what was not sent to the next push; the quantised values are summed and merged
    /// as ever. `init` and `pull` are not compressed. Values must be float32. The
    /// residuals are not saved in checkpoints (nor were they in MXNet); commits keep
    /// each rank's ([`KVStore::commit`]).
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
        let compression = compression::accepted(&self.store.kind, self.store.collective.is_some(), params)?;
        // Pushes made before this call are not compressed; those after are.
        self.settle()?;
        *self.store.compression.write() = Some(compression);
        Ok(())
    }

    /// Refuses `op` on a `dist_async` store, which does not have it yet.
    pub(super) fn not_async(&self, op: &str) -> Result<()> {
        match self.store.remote {
            Some(_) => Err(Error::Unsupported {
                what: format!("{op} on a {} store", self.kind()),
                hint: "dist_async stores do not have it yet: use dist_sync".to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Saves the whole store to `path`: every key (name, shape, dtype, value), the
    /// optimizer with its hyper-parameters and per-key multipliers, every key's optimizer
    /// state and update count, and the schedule's state, with a CRC-32 of every tensor
    /// and of the file (safetensors with JSON metadata; see the module's docs in
    /// `kvstore/checkpoint.rs` for the layout). A custom updater is code and is not
    /// saved: the file says one was installed.
    ///
    /// The checkpoint is one consistent step: it waits for the calls made before it, and
    /// no push, `set_optimizer` or load runs while it is taken. The file is written as
    /// optimizer-state files are ([`KVStore::save_optimizer_states`]): to a temporary file
    /// beside `path`, flushed, renamed over `path`, and the directory flushed; special
    /// files are refused.
    ///
    /// Under `dist_sync` every worker calls it at the same point of its calls; rank 0
    /// writes the file, and every worker returns only once the file is durable (or fails,
    /// naming rank 0, if rank 0 could not write it).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer};
    /// let path = std::env::temp_dir().join(format!("kvstore-doc-ckpt-{}.safetensors", std::process::id()));
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::ones(&[2])?)?;
    /// kv.set_optimizer(Optimizer::builder("sgd").param("momentum", 0.9).build()?)?;
    /// kv.push("w", &NDArray::ones(&[2])?, 0)?;
    /// kv.save_checkpoint(&path)?;
    ///
    /// let resumed = KVStore::create("device")?; // any kind, any number of workers
    /// resumed.load_checkpoint(&path)?;
    /// assert_eq!(resumed.optimizer_name(), Some("sgd"));
    /// assert_eq!(resumed.pull_new("w", 0)?.to_vec::<f32>()?, kv.pull_new("w", 0)?.to_vec::<f32>()?);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `path` names something other than a regular file,
    /// or the call comes from inside an updater of this store; [`Error::Io`] if the file
    /// cannot be written (on every worker under `dist_sync`).
    pub fn save_checkpoint(&self, path: impl AsRef<Path>) -> Result<()> {
        if let Some(remote) = &self.store.remote {
            self.wait_all()?;
            return self.store.save_checkpoint_async(&**remote, path.as_ref());
        }
        let path: PathBuf = path.as_ref().to_path_buf();
        self.settle()?;
        self.in_order("save_checkpoint", move |store| store.save_checkpoint_now(&path))
    }

    /// Loads a file of [`KVStore::save_checkpoint`] into this store, of any kind and on
    /// any number of workers or devices:
    /// - every key of the file gets the file's value: a key the store has must have the
    ///   file's shape and dtype, and stays where it lives (its device); a key the store
    ///   lacks is initialised with it;
    /// - the file's optimizer is installed in the state it was saved in (counters,
    ///   schedule, every key's state), so training resumes exactly; a file saved with no
    ///   updater makes pushes assign again; a file saved with a custom updater keeps the
    ///   store's updater (set it before or after loading);
    /// - keys of the store that the file lacks keep their values, and their optimizer
    ///   state starts afresh;
    /// - from then on the file's keys are updated in the file's order (the order of the
    ///   run that saved it; a schedule and NAdam's momentum depend on the order of
    ///   updates within a call), after the store's other keys, however the store's keys
    ///   were initialised: the run resumes as it was.
    ///
    /// All or nothing: the file is read and checked whole (every tensor's CRC-32, the
    /// file's checksum, the optimizer, every key against the store) and every array is
    /// made before anything changes. It waits for the calls made before it, and no push
    /// runs while it loads.
    ///
    /// Under `dist_sync` every worker calls it with the same file (on a filesystem they
    /// share, or a copy each); the workers compare the files they read (the checksum of
    /// their contents, and their length), and if any worker could not read or check its
    /// file, or the files differ,
    /// every worker fails and none changes.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing, truncated or damaged file (or, under `dist_sync`,
    /// one that another worker could not read); [`Error::InvalidArgument`] for a path
    /// that is not a regular file or workers that read different files;
    /// [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`] for a key the store has with
    /// another shape or dtype.
    pub fn load_checkpoint(&self, path: impl AsRef<Path>) -> Result<()> {
        if let Some(remote) = &self.store.remote {
            self.wait_all()?;
            return self.store.load_checkpoint_async(&**remote, path.as_ref());
        }
        let path: PathBuf = path.as_ref().to_path_buf();
        self.settle()?;
        self.in_order("load_checkpoint", move |store| store.load_checkpoint_now(&path))
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
        if self.store.layout == Layout::Owners {
            // Every worker gathers the owners' states: a call of them all, in order.
            let path = path.as_ref().to_path_buf();
            return self.in_order(OP, move |store| store.save_optimizer_states_now(&path));
        }
        let path = path.as_ref();
        crate::optimizer::states::save_target(path, OP)?;
        self.settle()?;
        self.store.save_optimizer_states_now(path)
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
        self.store.load_optimizer_states_now(path, &context)
    }

    /// Commits the whole store as of this call: every key's value, the optimizer with
    /// its state and counters, this rank's gradient-compression residuals, the step and
    /// `extra` (the program's own bytes: its data
    /// loader's position, its generators' state), through the store's durability
    /// ([`Durable`]). The `kvstore` crate's stores (and the bindings') have the
    /// `kvstore-commit` crate's: memory that outlives the process (`/dev/shm`), never
    /// disk, where a store made later by a run of the same job (`KVSTORE_JOB`) restores
    /// the newest commit every rank completed ([`KVStore::restored`]); that crate's docs
    /// say where commits go and who may read them. A store of `kvstore-core` alone has
    /// none but one given to [`KVStoreBuilder::durability`].
    ///
    /// Under `dist_sync` and `dist_async` it is a collective, like `barrier`: every rank
    /// calls it at the same point of its calls, and it returns once every rank's commit
    /// is written (or fails on every rank, naming the ranks that could not write theirs).
    /// Under `dist_async` it first waits for the rank's own calls and for every rank to
    /// arrive, so that the commit holds every push made before it on any rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a store without a durability (made without a job
    /// name); [`Error::Io`] when the commit cannot be written.
    pub fn commit(&self, step: u64, extra: &[u8]) -> Result<()> {
        let extra = extra.to_vec();
        if let Some(remote) = &self.store.remote {
            // (From an updater of this store, the keys it holds would wait for it.)
            locks::check_reentry("commit", &self.store)?;
            // Every rank's pushes applied by their owners before any rank gathers, and
            // this rank's keys held until the commit ends.
            let waited = self.wait_all();
            let entries = self.store.entries();
            let _held = remote::held_for_gather(&entries);
            remote.barrier()?;
            return self.store.commit_now(step, &extra, waited);
        }
        self.settle()?;
        self.in_order("commit", move |store| store.commit_now(step, &extra, Ok(())))
    }

    /// What this store restored when it was made: the step and `extra` of the commit it
    /// resumed from ([`KVStore::commit`]), or `None` (no job name, or no commit yet). A
    /// training loop is written once: `let start = kv.restored().map_or(0, |r| r.step + 1);`.
    pub fn restored(&self) -> Option<Restored> {
        self.store.restored.get().cloned()
    }

    /// Initialises `key` with a row-sparse value: the key holds `value`'s rows, zero
    /// elsewhere, and is row-sparse ([`KVStore::row_sparse_pull`] reads it).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, RowSparse, StorageType};
    /// let kv = KVStore::create("local")?;
    /// let w = RowSparse::new(NDArray::from_vec(&[1, 2], vec![1.0f32, 2.0])?, vec![2], &[3, 2])?;
    /// kv.init_row_sparse("emb", &w)?;
    /// assert_eq!(kv.stype("emb")?, StorageType::RowSparse);
    /// assert_eq!(kv.pull_new("emb", 0)?.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::init`].
    pub fn init_row_sparse(&self, key: impl Into<Key>, value: &RowSparse) -> Result<()> {
        self.init_row_sparse_many(&[key.into()], std::slice::from_ref(value))
    }

    /// Initialises several keys with row-sparse values, one per key, as one `init`:
    /// when one key cannot be initialised (already initialised, repeated), none is.
    ///
    /// # Errors
    /// As [`KVStore::init`] ([`Error::LengthMismatch`] when the counts differ).
    pub fn init_row_sparse_many(&self, keys: &[Key], values: &[RowSparse]) -> Result<()> {
        self.not_async("init_row_sparse")?;
        if keys.len() != values.len() {
            return Err(Error::LengthMismatch {
                context: "init_row_sparse".into(),
                what: "values",
                expected: keys.len(),
                got: values.len(),
            });
        }
        if self.store.rows_on_owners {
            // dist_sync with owners: each table's rows to their owners, in call order.
            let (keys, values) = (keys.to_vec(), values.to_vec());
            let on_owners = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let taken = Arc::clone(&on_owners);
            self.in_order("init", move |store| match store.init_rows(&keys, &values) {
                Some(r) => r,
                None => {
                    taken.store(false, std::sync::atomic::Ordering::Relaxed);
                    Ok(())
                }
            })?;
            if on_owners.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
        }
        let dense = values.iter().map(RowSparse::to_dense).collect::<Result<Vec<_>>>()?;
        self.init(keys.to_vec(), &dense[..])?;
        for key in keys {
            let entry = self.entry("init", key)?;
            let marked = Arc::clone(&entry);
            self.on_keys("init", &[entry], move |store| store.mark_row_sparse(&marked))?;
        }
        Ok(())
    }

    /// The storage type of `key`: row-sparse once initialised with, or assigned, a
    /// row-sparse value.
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`].
    pub fn stype(&self, key: impl Into<Key>) -> Result<StorageType> {
        let key = key.into();
        let entry = self.entry("stype", &key)?;
        self.store.stype_of(&entry)
    }

    /// Pushes row-sparse values into `key`: they are summed row by row over the union
    /// of their rows (left to right, as dense sums), then merged as a dense push is:
    /// with no updater the sum replaces the whole value (rows it lacks become zero,
    /// MXNet's assign) and the key becomes row-sparse; an optimizer that MXNet updates
    /// lazily (SGD and Adam with `lazy_update`, the default; AdaGrad; Ftrl) changes the
    /// pushed rows only, of the weight and of its states; any other optimizer, and a
    /// custom updater, gets the sum as a dense gradient (zero in the other rows).
    ///
    /// Under `dist_sync` each worker sums its values, the sums cross between workers as
    /// their rows and indices (not densified), and every worker sums them in rank order
    /// and merges the result: every worker ends with the same bits.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer, RowSparse};
    /// let kv = KVStore::create("local")?;
    /// kv.init("emb", &NDArray::ones(&[3, 2])?)?;
    /// kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 1.0).param("wd", 0.1).build()?)?;
    /// let g = RowSparse::new(NDArray::full(&[1, 2], 0.5)?, vec![1], &[3, 2])?;
    /// kv.push_row_sparse("emb", &[g], 0)?;
    /// // Only row 1 changes, weight decay included: (1 - 1 * 0.1) * 1 - 1 * 0.5.
    /// let r = 0.9f32 - 0.5;
    /// assert_eq!(kv.pull_new("emb", 0)?.to_vec::<f32>()?, vec![1.0, 1.0, r, r, 1.0, 1.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`], [`Error::ShapeMismatch`], [`Error::DTypeMismatch`],
    /// [`Error::LengthMismatch`] for no value, or the updater's error. On error the key
    /// keeps its value. Under `dist_sync`, as a dense push: every worker must make the
    /// same call (else every worker fails it, naming each worker's call).
    pub fn push_row_sparse(&self, key: impl Into<Key>, values: &[RowSparse], priority: i32) -> Result<()> {
        self.push_row_sparse_many(&[(key.into(), values.to_vec())], priority)
    }

    /// Pushes row-sparse values into several keys: `pushes` pairs each key with its
    /// values (a key given twice has its values summed, in the order given, as a dense
    /// push's repeated keys). Every key, shape and dtype is checked before any key
    /// changes; then each key is pushed as [`KVStore::push_row_sparse`] does.
    ///
    /// # Errors
    /// As [`KVStore::push_row_sparse`]; a check that fails changes no key. The keys are
    /// updated in the order they were initialised, as a dense push's; an updater's
    /// error stops the call at its key (the keys before it keep their update).
    pub fn push_row_sparse_many<'a>(&self, pushes: impl Into<RowSparsePushes<'a>>, priority: i32) -> Result<()> {
        self.not_async("push_row_sparse")?;
        let _ = priority;
        let pushes = match pushes.into() {
            RowSparsePushes::Given(pushes) => pushes,
            RowSparsePushes::Refused(e) => return Err(self.refused_everywhere("push_row_sparse", e.clone())),
        };
        let _span = self.store.counters.span("push_row_sparse", pushes.len(), pushes.first().map(|(k, _)| k));
        // The rows pushed (their data), counted once the keys passed their checks.
        let bytes = stats::bytes_of(pushes.iter().flat_map(|(_, vs)| vs.iter().map(RowSparse::data)));
        if self.store.collective.is_some() {
            // dist_sync: in call order with the store's other collective calls.
            let pushes = pushes.to_vec();
            return self.in_order("push_row_sparse", move |store| {
                store.push_rows_across(&pushes)?;
                store.counters.bytes((bytes, 0));
                Ok(())
            });
        }
        let plan = RowsPlan::new(&self.store, pushes)?;
        plan.checked.clone()?;
        self.store.counters.bytes((bytes, 0));
        let entries: Vec<Arc<Entry>> = plan.keys.iter().map(|(e, _)| Arc::clone(e)).collect();
        self.on_keys("push", &entries, move |store| store.push_rows(&plan))
    }

    /// The rows `row_ids` of row-sparse `key` (any order, repeats allowed: sorted and
    /// de-duplicated, as MXNet does), as a row-sparse array whose indices are exactly
    /// those rows (a row the key holds as zeros comes back as zeros). Copies only those
    /// rows.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, RowSparse};
    /// let kv = KVStore::create("local")?;
    /// kv.init_row_sparse("emb", &RowSparse::from_dense(&NDArray::ones(&[3, 2])?)?)?;
    /// let got = kv.row_sparse_pull("emb", &[2, 0, 2], 0)?;
    /// assert_eq!(got.indices(), &[0, 2]);
    /// assert_eq!(got.data().to_vec::<f32>()?, vec![1.0; 4]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`]; [`Error::InvalidArgument`] for a key that is not
    /// row-sparse (MXNet: "PullRowSparse expects row_sparse src NDArray") or a row id
    /// out of range (MXNet returns a zero row for it). Under `dist_sync` it reads this
    /// worker's copy (every worker holds the same bits): nothing crosses between workers.
    pub fn row_sparse_pull(&self, key: impl Into<Key>, row_ids: &[i64], priority: i32) -> Result<RowSparse> {
        self.not_async("row_sparse_pull")?;
        let _ = priority;
        let key = key.into();
        let _span = self.store.counters.span("pull_row_sparse", 1, Some(&key));
        let entry = self.entry("row_sparse_pull", &key)?;
        let row_ids = RowIds::new(row_ids);
        if self.store.rows_of(&entry).is_some() {
            // Rows on their owners: asked of them, in call order.
            let pulled = Arc::new(parking_lot::Mutex::new(None));
            let into = Arc::clone(&pulled);
            self.in_order("row_sparse_pull", move |store| {
                *into.lock() = Some(store.pull_rows_across(&entry, row_ids)?);
                Ok(())
            })?;
            let pulled = pulled.lock().take().ok_or_else(|| Error::Internal("row_sparse_pull: no rows".into()))?;
            self.store.counters.bytes((0, stats::bytes_of([pulled.data()])));
            return Ok(pulled);
        }
        let read = Arc::clone(&entry);
        let pulled = self.on_keys("row_sparse_pull", &[entry], move |store| store.pull_rows(&read, row_ids))?;
        self.store.counters.bytes((0, stats::bytes_of([pulled.data()])));
        Ok(pulled)
    }

    /// A `local` store that a store makes for itself (a `dist_async` worker's share of
    /// the keys, the whole store gathered for a checkpoint or a commit): never in the
    /// job's commits, which are the user's stores' (`kvstore-commit`).
    pub(crate) fn internal_local() -> Result<KVStore> {
        // (One engine thread: its calls are the store's own, one at a time.)
        KVStoreBuilder::internal().build()
    }
}

#[cfg(test)]
mod tests;
