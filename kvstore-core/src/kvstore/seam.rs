//! The seam a durability layer works through ([`Seam`]): what a [`Durable`] (the job's
//! folder of commits in the `kvstore-commit` crate; an in-memory one in the tests below)
//! may ask of a store, and nothing else:
//!
//! - the peers: the workers its commits agree with ([`Seam::peers`]);
//! - a snapshot of the whole state, gathering a `dist_async` store's keys from their
//!   owners inside ([`Seam::whole_snapshot`]), or one in which each `dist_sync` rank
//!   holds its own parts of the optimizer state ([`Seam::snapshot_in_parts`]);
//! - install: a commit's checkpoint put into the store on every rank, all or nothing
//!   ([`Seam::install`]);
//! - the rank's own record: its gradient-compression residuals
//!   ([`Seam::set_residuals`]; the snapshot holds them) and, with owners, its share's
//!   optimizer counters ([`Seam::own_counters`], [`Seam::restore_own_counters`]);
//! - the step of a `dist_sync` call ([`Seam::check_step`]) and the ranks' agreement on
//!   an outcome ([`Seam::agree`]).
//!
//! Here too: the process's [`MakeDurable`] ([`install_durability`]), which the builder
//! asks for each store's durability, and the store's side of a commit and a restore
//! (`Store::commit_now`, `Store::restore`).

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::checkpoint::{self, Snapshot};
use super::data::{Durable, Entry, KVStore, MakeDurable, Merger, Owners, Restored, Seam, Store};
use super::locks::Held;
use crate::collective::Collective;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ndarray::NDArray;

/// The workers a store's commits and restores agree with ([`Seam::peers`]): a
/// `dist_sync` store's group, or a `dist_async` store's owners (exchanges by request).
#[derive(Clone, Copy)]
pub struct Peers<'a>(Members<'a>);

#[derive(Clone, Copy)]
enum Members<'a> {
    Sync(&'a Arc<dyn Collective>),
    Async(&'a dyn Owners),
}

impl Peers<'_> {
    /// This worker's rank.
    pub fn rank(self) -> usize {
        match self.0 {
            Members::Sync(g) => g.rank(),
            Members::Async(r) => r.rank(),
        }
    }

    /// The number of workers.
    pub fn size(self) -> usize {
        match self.0 {
            Members::Sync(g) => g.size(),
            Members::Async(r) => r.size(),
        }
    }

    /// Every worker's `mine` for `step`, in rank order: records of any length up to
    /// [`MAX_RECORD`](crate::backend::MAX_RECORD) bytes (a group's workers say their
    /// lengths first, and the records cross padded to the longest, so that records of
    /// different lengths never desync the group).
    ///
    /// # Errors
    /// The transport's; [`Error::InvalidArgument`] on every worker when a record is
    /// longer than `MAX_RECORD`.
    pub fn exchange(self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let group = match self.0 {
            Members::Sync(group) => group,
            Members::Async(remote) => return remote.exchange(step, mine),
        };
        let lens = group.exchange(&format!("{step} (lengths)"), &(mine.len() as u64).to_le_bytes())?;
        let lens: Vec<usize> = lens.iter().map(|r| super::agree::word(r, 0) as usize).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        if longest > crate::collective::MAX_RECORD {
            return Err(Error::invalid_argument(format!(
                "{step}: a record of {longest} bytes to exchange (at most {})",
                crate::collective::MAX_RECORD
            )));
        }
        let mut padded = mine.to_vec();
        padded.resize(longest, 0);
        let all = group.exchange(step, &padded)?;
        Ok(all
            .into_iter()
            .zip(lens)
            .map(|(mut record, len)| {
                record.truncate(len);
                record
            })
            .collect())
    }

    /// Worker `root`'s bytes (`mine` there, given back; elsewhere not read) on every
    /// worker, for the call `step`.
    ///
    /// # Errors
    /// The transport's; [`Error::InvalidArgument`] for a `root` that is not a rank.
    pub fn broadcast(self, step: &str, mine: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        if root >= self.size() {
            return Err(Error::invalid_argument(format!(
                "{step}: a broadcast from rank {root} of a job of {} ranks",
                self.size()
            )));
        }
        let group = match self.0 {
            Members::Sync(group) => group,
            Members::Async(remote) => return remote.broadcast(step, mine, root),
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

/// The process's [`MakeDurable`], once installed.
static DURABILITY: OnceLock<Box<dyn MakeDurable>> = OnceLock::new();

/// Installs the process's [`MakeDurable`], once: `false` when one was installed already
/// (which stays). Stores made before it have no durability.
pub fn install_durability(make: Box<dyn MakeDurable>) -> bool {
    DURABILITY.set(make).is_ok()
}

/// The durability of the next store made (see [`MakeDurable::for_next_store`]): `None`
/// without an installed [`MakeDurable`].
pub(super) fn durability_for_next_store(grouped: bool) -> Result<Option<Box<dyn Durable>>> {
    DURABILITY.get().map_or(Ok(None), |make| make.for_next_store(grouped))
}

impl Store {
    /// The workers of the store's job, if it has any.
    pub(super) fn peers(&self) -> Option<Peers<'_>> {
        match (&self.collective, &self.remote) {
            (Some(group), _) => Some(Peers(Members::Sync(group))),
            (None, Some(remote)) => Some(Peers(Members::Async(&**remote))),
            (None, None) => None,
        }
    }

    /// Commits now (the caller ordered it after the calls before it; `before`: whether
    /// this rank's calls before it went well), through the store's durability.
    pub(super) fn commit_now(&self, step: u64, extra: &[u8], before: Result<()>) -> Result<()> {
        let durable = self.commits.as_deref().ok_or_else(|| {
            let how = DURABILITY.get().map_or_else(
                || "make it through the `kvstore` crate or a binding, which have commits".to_string(),
                |make| make.how_to(),
            );
            Error::invalid_argument(format!("commit: the store takes part in no job's commits; {how}"))
        })?;
        durable.commit(Seam(self), step, extra, before)
    }

    /// Restores the newest whole commit, when the store has a durability: what it
    /// restored, or `None`.
    pub(super) fn restore(&self) -> Result<Option<Restored>> {
        self.commits.as_deref().map_or(Ok(None), |durable| durable.restore(Seam(self)))
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

impl<'a> Seam<'a> {
    /// The workers of the store's job, if it has any.
    pub fn peers(self) -> Option<Peers<'a>> {
        self.0.peers()
    }

    /// Whether the store's keys live with their owners (`dist_async`): its snapshots
    /// then gather them, and each rank's share has optimizer counters of its own.
    pub fn has_owners(self) -> bool {
        self.0.remote.is_some()
    }

    /// This rank's share's optimizer counters, for its own record (empty without owners,
    /// or without an optimizer).
    pub fn own_counters(self) -> Vec<u8> {
        self.0.remote.as_ref().map(|r| r.optimizer_state()).unwrap_or_default()
    }

    /// Restores this rank's share's optimizer counters from [`Seam::own_counters`]'s
    /// bytes (nothing to do without owners).
    ///
    /// # Errors
    /// Bytes that are not such counters.
    pub fn restore_own_counters(self, context: &str, bytes: &[u8]) -> Result<()> {
        self.0.remote.as_ref().map_or(Ok(()), |r| r.restore_optimizer_state(context, bytes))
    }

    /// Checks that this rank makes the same `dist_sync` call as every other (a store
    /// of no group: nothing to check), as every call does first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] where a rank makes another call (the ranks desync).
    pub fn check_step(self, op: &'static str) -> Result<()> {
        self.0.check_step(op, &[], Ok(()))
    }

    /// Every rank says whether `outcome` went well (with a hash of what it read, which
    /// must be the same on every rank); an error on every rank where one failed or the
    /// hashes differ (`what_failed`: what a failed rank could not do). A store of no
    /// group: nothing to agree.
    ///
    /// # Errors
    /// [`Error::Io`] naming the ranks that failed or differ.
    pub fn agree(
        self,
        op: &str,
        context: &str,
        outcome: std::result::Result<u64, ()>,
        what_failed: &str,
    ) -> Result<()> {
        self.0.agree(op, context, outcome, what_failed)
    }

    /// `write` of a snapshot of the whole state. With owners (`dist_async`), of the store
    /// as they hold it, gathered when `gather` (a host's first rank) into `kept`'s copy
    /// (the copy of its last gather, kept again for the next), else of an empty store
    /// (the rank writes its own record only). The caller makes sure no push runs (every
    /// rank is in the same commit).
    ///
    /// # Errors
    /// `write`'s, or the gather's.
    pub fn whole_snapshot(
        self,
        op: &'static str,
        gather: bool,
        kept: &Mutex<Option<KVStore>>,
        write: &mut dyn FnMut(&Snapshot<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(remote) = &self.0.remote else { return self.0.snapshot(op, false, |s| write(s)) };
        let copy = match gather {
            true => remote.gathered(&self.0.entries(), kept.lock().take())?,
            false => KVStore::internal_local()?,
        };
        let wrote = copy.store.snapshot(op, false, |s| write(s));
        if gather && wrote.is_ok() {
            // Kept for its arrays only: the store's updater or optimizer is not held
            // alive by it.
            *copy.store.merger.write() = Merger::Assign;
            *kept.lock() = Some(copy);
        }
        wrote
    }

    /// `write` of a snapshot in which each rank holds its own: a `dist_sync` store whose
    /// optimizer state lives on owners gives each state tensor as this rank's part
    /// ([`Snapshot::parts`]) and gathers nothing, so the ranks that write it together
    /// must be all of the job's; a store without owners, its whole state. (A
    /// `dist_async` store's keys are gathered by [`Seam::whole_snapshot`] only.)
    ///
    /// # Errors
    /// `write`'s; [`Error::Internal`] for a `dist_async` store.
    pub fn snapshot_in_parts(self, op: &'static str, write: &mut dyn FnMut(&Snapshot<'_>) -> Result<()>) -> Result<()> {
        if self.0.remote.is_some() {
            return Err(Error::Internal(format!("{op}: a dist_async store's snapshot is gathered whole")));
        }
        self.0.snapshot(op, true, |s| write(s))
    }

    /// Installs a commit's checkpoint in the store, all or nothing on every rank. A
    /// `dist_async` store's is read and checked whole first, on every rank, then each
    /// rank puts its parts into its share one key at a time (as `load_checkpoint` does),
    /// so that it never holds a second copy of the store: a rank that then fails (out of
    /// memory for a key) fails the restore on every rank with the keys before it in
    /// place, and the job starts again from the commit.
    ///
    /// # Errors
    /// The same kind on every rank: bytes that are not a checkpoint, or a rank that
    /// could not install them.
    pub fn install(self, context: &str, checkpoint: Result<&[u8]>) -> Result<()> {
        const OP: &str = "restore";
        let store = self.0;
        let Some(remote) = &store.remote else {
            return store.load_checkpoint_bytes(OP, context, checkpoint).map(|_| ());
        };
        let loaded = checkpoint.and_then(|checkpoint| checkpoint::read(checkpoint, context));
        // (The ranks do not compare what they loaded: each host's copy holds the
        // optimizer counters of its writer's share, which differ from host to host; each
        // rank's own come from its record.)
        let what = "could not read or check the commit";
        store.agree(OP, context, loaded.as_ref().map(|_| 0).map_err(|_| ()), what)?;
        let file = loaded?;
        let installed = store.install_loaded(&**remote, file);
        store.agree(OP, context, installed.as_ref().map(|_| 0).map_err(|_| ()), "could not install the commit")?;
        installed
    }

    /// Sets the keys' gradient-compression residuals to those of a commit
    /// (key, one residual per device): all of them, or none when one does not fit its key.
    ///
    /// # Errors
    /// [`Error::Io`] (invalid data) naming a key the store lacks or a residual of
    /// another length than its key's value.
    pub fn set_residuals(self, context: &str, residuals: Vec<(String, Vec<Vec<f32>>)>) -> Result<()> {
        const OP: &str = "restore";
        let damaged = |why: String| Error::Io {
            context: context.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("its residuals: {why}")),
        };
        let held = Held::new(OP, self.0, &[])?;
        let entries = self.0.entries();
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
    use crate::kvstore::data::{Durable, Restored, Seam};
    use crate::{KVStore, NDArray, Optimizer, Result};

    /// A commit kept in memory: its step, its checkpoint, the user's bytes, the residuals.
    type Kept = (u64, Vec<u8>, Vec<u8>, Vec<(String, Vec<Vec<f32>>)>);

    /// The newest commit of a job, in memory, shared by the job's stores.
    struct InMemory(Arc<Mutex<Option<Kept>>>);

    impl Durable for InMemory {
        fn commit(&self, store: Seam<'_>, step: u64, extra: &[u8], before: Result<()>) -> Result<()> {
            store.check_step("commit")?;
            before?;
            let mut kept = None;
            store.whole_snapshot("commit", true, &Mutex::new(None), &mut |snap| {
                let residuals = snap.residuals().iter().map(|(k, r)| (k.to_string(), r.to_vec())).collect();
                kept = Some((step, snap.to_bytes()?, extra.to_vec(), residuals));
                Ok(())
            })?;
            *self.0.lock() = kept;
            Ok(())
        }

        fn restore(&self, store: Seam<'_>) -> Result<Option<Restored>> {
            let Some((step, checkpoint, extra, residuals)) = self.0.lock().clone() else { return Ok(None) };
            store.install("restore", Ok(&checkpoint))?;
            if !residuals.is_empty() {
                store.set_residuals("restore", residuals)?;
            }
            Ok(Some(Restored { step, extra }))
        }
    }

    fn store(job: &Arc<Mutex<Option<Kept>>>) -> KVStore {
        KVStoreBuilder::new("local").durability(Box::new(InMemory(Arc::clone(job)))).build().expect("a store")
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

    /// Core alone has no durability: a store's commit is refused, saying where stores
    /// that commit are made, and the store keeps what it held.
    #[test]
    fn a_store_of_core_alone_refuses_to_commit_and_keeps_its_values() -> Result<()> {
        let kv = KVStore::create("local")?;
        kv.init("w", &grad(1))?;
        let e = kv.commit(1, b"").expect_err("no durability");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("takes part in no job's commits"), "{e}");
        assert_eq!(kv.restored(), None);
        assert_eq!(kv.pull_new("w", 0)?.to_vec::<f32>()?, grad(1).to_vec::<f32>()?);
        Ok(())
    }
}
