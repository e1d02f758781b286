//! The seam a durability layer works through: what `Durable`'s implementations (the
//! job's folder of commits, `commit.rs`; an in-memory one in the tests below) may ask of
//! a store, and nothing else (`tests/tests/structure.rs` keeps `commit.rs` to it):
//!
//! - the peers: the workers its commits agree with ([`Store::peers`]);
//! - a snapshot of the whole state, gathering a `dist_async` store's keys from their
//!   owners inside ([`Store::whole_snapshot`]);
//! - install: a commit's checkpoint put into the store on every rank, all or nothing
//!   ([`Store::install`]);
//! - the rank's own record: its gradient-compression residuals
//!   ([`Store::set_residuals`]; the snapshot holds them) and, with owners, its share's
//!   optimizer counters ([`Store::own_counters`], [`Store::restore_own_counters`]);
//! - the optimizer a restore installed marked resumed ([`Store::mark_optimizer_resumed`]);
//!
//! and, as every feature, the step of a `dist_sync` call (`Store::check_step`) and the
//! ranks' agreement on an outcome (`Store::agree`).

use std::sync::Arc;

use parking_lot::Mutex;

use super::checkpoint::{self, Snapshot};
use super::data::{Entry, KVStore, Merger, Owners, Store};
use super::locks::Held;
use crate::collective::Collective;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ndarray::NDArray;

/// The workers a store's commits and restores agree with: a `dist_sync` store's group,
/// or a `dist_async` store's owners (exchanges by request: [`Owners::exchange`]).
#[derive(Clone, Copy)]
pub(super) enum Peers<'a> {
    Sync(&'a Arc<dyn Collective>),
    Async(&'a dyn Owners),
}

impl Peers<'_> {
    pub(super) fn rank(self) -> usize {
        match self {
            Peers::Sync(g) => g.rank(),
            Peers::Async(r) => r.rank(),
        }
    }

    pub(super) fn size(self) -> usize {
        match self {
            Peers::Sync(g) => g.size(),
            Peers::Async(r) => r.size(),
        }
    }

    /// Every worker's `mine` for `step`, in rank order ([`Collective::exchange`]).
    pub(super) fn exchange(self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self {
            Peers::Sync(g) => g.exchange(step, mine),
            Peers::Async(r) => r.exchange(step, mine),
        }
    }

    /// Worker `root`'s bytes (`mine` there, given back; elsewhere not read) on every
    /// worker, for the call `step`.
    pub(super) fn broadcast(self, step: &str, mine: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        let group = match self {
            Peers::Sync(group) => group,
            Peers::Async(remote) => return remote.broadcast(step, mine, root),
        };
        // The length first, then the bytes.
        let me = group.rank() == root;
        let len = NDArray::zeros_with(&[8], DType::U8, crate::Context::default())?;
        if me {
            len.write()?.bytes_mut().copy_from_slice(&(mine.len() as u64).to_le_bytes());
        }
        group.broadcast(&[&len], root)?;
        let bytes = u64::from_le_bytes(len.read()?.bytes().try_into().expect("8 bytes")) as usize;
        // In pieces of at most 1 GiB: one MPI broadcast counts its bytes in a C int.
        const PIECE: usize = 1 << 30;
        let mut got = Vec::with_capacity(if me { 0 } else { bytes });
        for at in (0..bytes).step_by(PIECE) {
            let n = PIECE.min(bytes - at);
            let buf = NDArray::zeros_with(&[n], DType::U8, crate::Context::default())?;
            if me {
                buf.write()?.bytes_mut().copy_from_slice(&mine[at..at + n]);
            }
            group.broadcast(&[&buf], root)?;
            if !me {
                got.extend_from_slice(buf.read()?.bytes());
            }
        }
        Ok(if me { mine } else { got })
    }
}

impl Store {
    /// The workers of the store's job, if it has any.
    pub(super) fn peers(&self) -> Option<Peers<'_>> {
        match (&self.collective, &self.remote) {
            (Some(group), _) => Some(Peers::Sync(group)),
            (None, Some(remote)) => Some(Peers::Async(&**remote)),
            (None, None) => None,
        }
    }

    /// Whether the store's keys live with their owners (`dist_async`): its snapshots
    /// then gather them, and each rank's share has optimizer counters of its own.
    pub(super) fn has_owners(&self) -> bool {
        self.remote.is_some()
    }

    /// This rank's share's optimizer counters, for its own record (empty without owners,
    /// or without an optimizer).
    pub(super) fn own_counters(&self) -> Vec<u8> {
        self.remote.as_ref().map(|r| r.optimizer_state()).unwrap_or_default()
    }

    /// Restores this rank's share's optimizer counters from [`Store::own_counters`]'s
    /// bytes (nothing to do without owners).
    pub(super) fn restore_own_counters(&self, context: &str, bytes: &[u8]) -> Result<()> {
        self.remote.as_ref().map_or(Ok(()), |r| r.restore_optimizer_state(context, bytes))
    }

    /// `write` of a snapshot of the whole state. With owners (`dist_async`), of the store
    /// as they hold it, gathered when `gather` (a host's first rank) into `kept`'s copy
    /// (the copy of its last gather, kept again for the next), else of an empty store
    /// (the rank writes its own record only). The caller makes sure no push runs.
    pub(super) fn whole_snapshot(
        &self,
        op: &'static str,
        gather: bool,
        kept: &Mutex<Option<KVStore>>,
        write: &mut dyn FnMut(&Snapshot<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(remote) = &self.remote else { return self.snapshot(op, |s| write(s)) };
        let copy = match gather {
            true => remote.gathered(&self.entries(), kept.lock().take())?,
            false => KVStore::internal_local()?,
        };
        let wrote = copy.store.snapshot(op, |s| write(s));
        if gather && wrote.is_ok() {
            // Kept for its arrays only: the store's updater or optimizer is not held
            // alive by it.
            *copy.store.merger.write() = Merger::Assign;
            *kept.lock() = Some(copy);
        }
        wrote
    }

    /// Installs a commit's checkpoint in the store, all or nothing on every rank. A
    /// `dist_async` store's is read and checked whole first, on every rank, then each
    /// rank puts its parts into its share one key at a time (as `load_checkpoint` does),
    /// so that it never holds a second copy of the store: a rank that then fails (out of
    /// memory for a key) fails the restore on every rank with the keys before it in
    /// place, and the job starts again from the commit.
    pub(super) fn install(&self, context: &str, checkpoint: Result<&[u8]>) -> Result<()> {
        const OP: &str = "restore";
        let Some(remote) = &self.remote else { return self.load_checkpoint_bytes(OP, context, checkpoint).map(|_| ()) };
        let loaded = checkpoint.and_then(|checkpoint| checkpoint::read(checkpoint, context));
        // (The ranks do not compare what they loaded: each host's copy holds the
        // optimizer counters of its writer's share, which differ from host to host; each
        // rank's own come from its record.)
        let what = "could not read or check the commit";
        self.agree(OP, context, loaded.as_ref().map(|_| 0).map_err(|_| ()), what)?;
        let file = loaded?;
        let installed = self.install_loaded(&**remote, file);
        self.agree(OP, context, installed.as_ref().map(|_| 0).map_err(|_| ()), "could not install the commit")?;
        installed
    }

    /// Sets the keys' gradient-compression residuals to those of a commit
    /// ([`encode_residuals`]): all of them, or none when one does not fit its key.
    pub(super) fn set_residuals(&self, context: &str, residuals: Vec<(String, Vec<Vec<f32>>)>) -> Result<()> {
        const OP: &str = "restore";
        let damaged = |why: String| Error::Io {
            context: context.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("its residuals: {why}")),
        };
        let held = Held::new(OP, self, &[])?;
        let entries = self.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let mut guards = held.write(OP, &locked)?;
        let mut found = Vec::with_capacity(residuals.len());
        for (key, positions) in &residuals {
            let i = entries.iter().position(|e| e.key.as_str() == key);
            let i = i.ok_or_else(|| damaged(format!("key \"{key}\" is not in the store")))?;
            let size = guards[i].value.size();
            if let Some(p) = positions.iter().find(|p| p.len() != size) {
                return Err(damaged(format!("key \"{key}\" has {size} values, a residual {}", p.len())));
            }
            found.push(i);
        }
        for (i, (_, positions)) in found.into_iter().zip(residuals) {
            guards[i].residual_spares = Vec::new();
            guards[i].residuals = positions;
        }
        Ok(())
    }

    /// Marks the optimizer a restore installed (this store's, or its share's under
    /// `dist_async`) as resumed: the program's first `set_optimizer` of the same one
    /// keeps it ([`KVStore::set_optimizer`]).
    pub(super) fn mark_optimizer_resumed(&self) {
        let share = self.remote.as_ref().map(|r| r.share());
        for store in std::iter::once(self).chain(share) {
            if let Merger::Optimizer(rt) = &*store.merger.read() {
                rt.mark_resumed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The seam with a durability kept in memory: what a commit and its restore promise
    //! (the step, the user's bytes, the whole state bit for bit, the optimizer resumed,
    //! the calls before it in it) checked with neither a folder of commits nor a job of
    //! several processes.

    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::kvstore::builder::KVStoreBuilder;
    use crate::kvstore::data::{Durable, Restored, Store};
    use crate::{KVStore, NDArray, Optimizer, Result};

    /// A commit kept in memory: its step, its checkpoint, the user's bytes, the residuals.
    type Kept = (u64, Vec<u8>, Vec<u8>, Vec<(String, Vec<Vec<f32>>)>);

    /// The newest commit of a job, in memory, shared by the job's stores.
    struct InMemory(Arc<Mutex<Option<Kept>>>);

    impl Durable for InMemory {
        fn commit(&self, store: &Store, step: u64, extra: &[u8], before: Result<()>) -> Result<()> {
            store.check_step("commit", &[], Ok(()))?;
            before?;
            let mut kept = None;
            store.whole_snapshot("commit", true, &Mutex::new(None), &mut |snap| {
                let residuals = snap.residuals.iter().map(|(k, r)| (k.to_string(), r.to_vec())).collect();
                kept = Some((step, snap.to_bytes()?, extra.to_vec(), residuals));
                Ok(())
            })?;
            *self.0.lock() = kept;
            Ok(())
        }

        fn restore(&self, store: &Store) -> Result<Option<Restored>> {
            let Some((step, checkpoint, extra, residuals)) = self.0.lock().clone() else { return Ok(None) };
            store.install("restore", Ok(&checkpoint))?;
            if !residuals.is_empty() {
                store.set_residuals("restore", residuals)?;
            }
            Ok(Some(Restored { step, extra }))
        }
    }

    fn store(job: &Arc<Mutex<Option<Kept>>>) -> KVStore {
        KVStoreBuilder::new("local").durable(Box::new(InMemory(Arc::clone(job)))).build().expect("a store")
    }

    fn adam() -> Optimizer {
        Optimizer::builder("adam").param("learning_rate", 0.1).build().expect("adam")
    }

    /// Step `s`'s gradient.
    fn grad(s: usize) -> NDArray {
        NDArray::from_vec(&[4], (0..4).map(|i| (i as f32 + 1.0) * (s as f32 + 0.5) - 2.0).collect()).expect("an array")
    }

    fn bits(kv: &KVStore) -> Vec<u32> {
        let value = kv.pull_new("w", 0).expect("a pull");
        value.to_vec::<f32>().expect("f32").into_iter().map(f32::to_bits).collect()
    }

    #[test]
    fn a_store_resumes_from_a_commit_in_memory_with_the_bits_of_one_that_ran_on() -> Result<()> {
        let job = Arc::new(Mutex::new(None));
        let first = store(&job);
        assert_eq!(first.restored(), None);
        first.set_optimizer(adam())?;
        first.init("w", &NDArray::ones(&[4])?)?;
        for s in 0..3 {
            first.push("w", &grad(s), 0)?;
        }
        first.commit(3, b"batch 3")?;
        let at_commit = first.pull_new("w", 0)?;
        // The first store runs on; a second resumes from the commit, its program sets the
        // same optimizer (which keeps the restored state), and takes the same steps.
        let second = store(&job);
        assert_eq!(second.restored(), Some(Restored { step: 3, extra: b"batch 3".to_vec() }));
        assert_eq!(bits(&first), bits(&second));
        second.set_optimizer(adam())?;
        for s in 3..6 {
            first.push("w", &grad(s), 0)?;
            second.push("w", &grad(s), 0)?;
        }
        assert_eq!(bits(&first), bits(&second));
        // The same steps from the committed values with a fresh optimizer end elsewhere:
        // the equality above is the restored optimizer state's.
        let fresh = store(&Arc::new(Mutex::new(None)));
        fresh.set_optimizer(adam())?;
        fresh.init("w", &at_commit)?;
        for s in 3..6 {
            fresh.push("w", &grad(s), 0)?;
        }
        assert_ne!(bits(&fresh), bits(&first));
        Ok(())
    }

    #[test]
    fn a_commit_holds_the_calls_made_before_it_and_replaces_the_one_before() -> Result<()> {
        let job = Arc::new(Mutex::new(None));
        let kv = store(&job);
        kv.init("w", &NDArray::zeros(&[4])?)?;
        kv.commit(1, b"one")?;
        // A non-blocking push made before the commit is in it.
        let pushed = kv.push_async("w", &grad(0), 0);
        kv.commit(2, b"two")?;
        pushed.wait()?;
        let resumed = store(&job);
        assert_eq!(resumed.restored(), Some(Restored { step: 2, extra: b"two".to_vec() }));
        assert_eq!(bits(&resumed), bits(&kv));
        assert_eq!(resumed.pull_new("w", 0)?.to_vec::<f32>()?, grad(0).to_vec::<f32>()?);
        Ok(())
    }
}
