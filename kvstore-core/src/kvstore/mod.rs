//! The store: mirrors `KVStoreLocal` in MXNet's `src/kvstore/kvstore_local.h`, with
//! the deliberate differences listed in the crate docs.

use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::key::{Key, Keys};
use crate::ndarray::NDArray;
use crate::optimizer::{Optimizer, Runtime};
use crate::updater::Updater;
use forms::{Values, flat_runs, flatten};

mod agree;
mod builder;
mod calls;
mod checkpoint;
mod commit;
mod compression;
mod data;
pub(crate) mod forms;
mod locks;
mod merge;
mod pending;
mod plan;
mod remote;
mod run;
mod sparse;
mod stats;
mod steps;

pub use builder::KVStoreBuilder;
use calls::broadcast_args;
pub use commit::{COMMIT_DIR_VAR, JOB_VAR, Restored, job_folder, newest_commit};
pub use data::KVStore;
use data::{Entry, Merger, Store};
use locks::Held;
pub use pending::{Pending, Release};
pub use sparse::StorageType;
pub(crate) use stats::finish_timeline;
pub use stats::{CallCount, LATE_MARGIN, Lateness, RankStats, Stats, slowest_rank};

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
                     (remove its commits, or give it another KVSTORE_JOB)",
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
        let entry = self.store.find(&key).ok_or(Error::KeyNotInitialized { op: "context_of", key })?;
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
        let entry = self.store.find(&key).ok_or_else(|| Error::KeyNotInitialized { op: "pull", key: key.clone() })?;
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

#[cfg(test)]
mod tests;
