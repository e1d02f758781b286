//! kvstore-commit: the durability of kvstore's stores, a layer over kvstore-core's seam
//! (`kvstore_core::backend::Durable`, `Seam`): commits (`KVStore::commit`,
//! `KVStore::restored`), the whole store as of a step, kept
//! in memory that outlives the process (`/dev/shm`), so that a job restarted after a
//! rank died resumes from its last commit instead of its last checkpoint on disk.
//!
//! A job has a name (`KVSTORE_JOB`; the launcher gives one that its restarts share) and
//! its commits live in a folder of their own, `DIR/kvstore-UID-JOB/storeN` (`DIR`:
//! `KVSTORE_COMMIT_DIR`, default `/dev/shm`; `N`: the order in which the process made
//! its `dist_sync` and `dist_async` stores, the same on every rank and in every run of
//! one program; a store's own internal stores have none).
//! A store of no group is its process's own: `localN-rankR`, R the rank its launcher
//! gave the process (0 without one), so that the ranks of a job do not share it. The folder is the
//! user's alone (0700, its files 0600): a folder or file of another owner, or one that
//! others may read or write, is refused with an error, never used.
//!
//! A commit of step S is one copy per host: the ranks whose commits' folder is the same
//! folder (its device and inode) write `step-S-rank-L-of-N.commit` together, L the
//! first of them (a header with the step, the rank, the number of ranks and the
//! lengths, a CRC-32 of the whole, then the store as a checkpoint, `checkpoint.rs`,
//! then L's `extra` bytes and L's gradient-compression residuals, which are each
//! rank's own), each rank a share of the tensors, in one pass over the data:
//! each tensor is copied into the file (through a shared mapping of the rank's range,
//! `mapped.rs`: a `write` call to `/dev/shm` costs three times a copy) and hashed as it goes (`Snapshot`), the
//! headers written last by L from every rank's checksums, which L checks against a
//! sample of each other rank's share hashed from its own memory (every rank of a
//! `dist_sync` job holds the same values). Each other rank writes its
//! own `extra` and residuals beside it (`step-S-rank-R-of-N.extra`). Files are written under a
//! temporary name and renamed; once every rank said it wrote its part, each writes
//! `step-S.done`. A commit is used only with its `done` mark: a rank killed during a
//! commit leaves no mark, and the job resumes from the commit before. The two newest
//! marked commits are kept, everything older is removed but the host's newest removed
//! copy, kept as L's spare for the next commit to write over (its memory in place).
//!
//! A `dist_async` store's keys live with their owners: at a commit, every rank waits for
//! its calls and meets the others; then the first rank of each host gathers the whole
//! store from the owners into a local store (`Seam::whole_snapshot`, as
//! `save_checkpoint` does; no push runs meanwhile, every rank being in the commit; kept for the next
//! commit to gather into, its memory in place) and writes the host's copy alone
//! (`Writing::alone`), while the host's other ranks write their `extra`. The
//! ranks agree through `Peers` (exchanges by request). A restore
//! checks the copy whole, then puts each rank's parts into its share one key at a time
//! (`Seam::install`), at any number of ranks.
//!
//! A store made with a job name restores, before its first call, the newest marked
//! commit that a rank can read whole: under `dist_sync` the ranks agree on the newest
//! step any of them has. When every rank has it, each loads its host's copy (the ranks
//! compare what they load by its contents' checksum: copies on other hosts hold the same
//! values, not the same bytes); when a rank lacks it (on a new host), every rank loads
//! the bytes of the lowest rank that has it, so a job restarts on as many ranks or on
//! more or fewer. `extra` is each rank's own, with its residuals (its record): a rank
//! gets its own from its host, or, when it moved, from a rank whose host has it
//! (`folder.rs`'s `fetch_records`), else the `extra` of the copy it loaded. Its residuals come back
//! when the job has as many ranks as the one that committed them; else they start again
//! at zero (said on stderr), as they would at the first compressed push.

//!
//! A store takes part once [`install`] ran in its process before it was made: the
//! `kvstore` facade and `kvstore-mpi` call it whenever they make a store, and
//! `kvstore-run` (this crate's launcher, `src/bin/kvstore-run.rs`) gives the job its name.
//!
//! ```
//! // A store of no job: a commit says how to make it durable.
//! # // SAFETY: the example's one thread, before any store reads the environment.
//! # unsafe { std::env::remove_var(kvstore_commit::JOB_VAR) };
//! kvstore_commit::install();
//! let kv = kvstore_core::KVStore::create("local")?;
//! let e = kv.commit(1, b"").expect_err("no job");
//! assert!(e.to_string().contains("KVSTORE_JOB"), "{e}");
//! # Ok::<(), kvstore_core::Error>(())
//! ```

#![deny(missing_docs)]

mod folder;
mod mapped;
mod settings;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvstore_core::Result;
use kvstore_core::backend::{Durable, MakeDurable};

pub use settings::{COMMIT_DIR_VAR, JOB_VAR};

/// Installs the commits as the durability of the stores this process makes from now on
/// (once; a later call changes nothing): with a job name (`KVSTORE_JOB`), each store
/// commits to and restores from its folder of the job's ([`job_folder`]).
pub fn install() {
    let _ = kvstore_core::backend::install_durability(Box::new(Jobs));
}

/// The job's folders, one per store made with a job name.
struct Jobs;

/// The stores made with a job name so far in this process, with a worker group and
/// without: the next one's folder (each rank makes its group's stores in the same order;
/// its other stores are its own).
static STORES: AtomicUsize = AtomicUsize::new(0);
static LOCAL_STORES: AtomicUsize = AtomicUsize::new(0);

impl MakeDurable for Jobs {
    /// The folder of the next store made with a job name (`grouped`: a store of a worker
    /// group), made if need be; `None` without `KVSTORE_JOB`. A store of no group is
    /// its process's own: under a launcher, each rank's in a folder of its own
    /// (`localN-rankR`, R from the launcher's environment), so that ranks do not share it.
    fn for_next_store(&self, grouped: bool) -> Result<Option<Box<dyn Durable>>> {
        let Some(job) = settings::job()? else { return Ok(None) };
        let jobs = job_folder(&job)?;
        let (claim, name) = match grouped {
            true => Claim::next(&STORES, |n| format!("store{n}")),
            false => Claim::next(&LOCAL_STORES, |n| format!("local{n}-rank{}", settings::launcher_rank())),
        };
        Ok(Some(Box::new(folder::Folder::open(&jobs, &name, claim)?)))
    }

    fn how_to(&self) -> String {
        format!("set {JOB_VAR} (kvstore-run sets it) before making the store")
    }
}

/// A store's number among the process's stores of its kind (its folder's), claimed when
/// the store is made: given back when the store's build failed (see [`Durable::built`]),
/// unless a later store claimed the next already, so that a program that tries again
/// gets the same folder (its commits), not an empty one.
#[derive(Debug)]
pub(crate) struct Claim {
    counter: &'static AtomicUsize,
    number: usize,
    kept: std::sync::atomic::AtomicBool,
}

impl Claim {
    /// The next number of `counter`, claimed, with the folder's name `name` gives it.
    fn next(counter: &'static AtomicUsize, name: impl FnOnce(usize) -> String) -> (Claim, String) {
        let number = counter.fetch_add(1, Ordering::Relaxed);
        (Claim { counter, number, kept: false.into() }, name(number))
    }

    /// The store was built: the number is its own.
    pub(crate) fn keep(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !*self.kept.get_mut() {
            let _ = self.counter.compare_exchange(self.number + 1, self.number, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

/// The folder of job `job`'s commits on this host, `DIR/kvstore-UID-JOB` (`DIR`:
/// `KVSTORE_COMMIT_DIR`, default `/dev/shm`): what a launcher removes when the job
/// ended well. Nothing is made.
///
/// # Errors
/// [`kvstore_core::Error::InvalidArgument`] for a name that is not a job's;
/// [`kvstore_core::Error::Io`] when this process's user cannot be read.
pub fn job_folder(job: &str) -> Result<PathBuf> {
    settings::check_job(job)?;
    Ok(settings::commit_dir().join(format!("kvstore-{}-{job}", folder::uid()?)))
}

/// The step of job `job`'s newest commit on this host: the newest one marked done in
/// one of its stores' folders ([`job_folder`]); `None` where the host holds none (or the
/// job's name is not one). What a launcher tells a user who would resume the job by
/// hand.
pub fn newest_commit(job: &str) -> Option<u64> {
    let stores = std::fs::read_dir(job_folder(job).ok()?).ok()?;
    let stores = stores.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir()));
    let names = stores.filter_map(|e| std::fs::read_dir(e.path()).ok()).flatten().flatten().map(|f| f.file_name());
    names.filter_map(|n| done_step(n.to_str()?)).max()
}

/// The step a file named `name` marks done (`step-S.done`).
fn done_step(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.strip_suffix(".done")?.parse().ok()
}
