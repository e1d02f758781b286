//! A worker group of threads in one process ([`ThreadGroup`]): `dist_sync` stores
//! without MPI, for the thread runner of the `dist_sync` cases.

use std::sync::{Arc, Mutex};

use kvstore_core::{DType, KVStore, NDArray, Result};

/// A worker group of threads in one process: each thread is a worker with its own
/// store, and the collective operations meet at barriers. It runs the `dist_sync`
/// semantics without MPI (kvstore-mpi runs the same cases across processes).
pub struct ThreadGroup {
    size: usize,
    barrier: std::sync::Barrier,
    deposits: Mutex<Vec<Vec<NDArray>>>,
}

/// One worker's view of a [`ThreadGroup`].
pub struct ThreadMember {
    group: Arc<ThreadGroup>,
    rank: usize,
}

impl ThreadGroup {
    /// A group of `size` workers; hand `member(r)` to the thread of rank `r`.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(ThreadGroup {
            size,
            barrier: std::sync::Barrier::new(size),
            deposits: Mutex::new(vec![Vec::new(); size]),
        })
    }

    /// The worker of rank `rank`.
    pub fn member(self: &Arc<Self>, rank: usize) -> Arc<ThreadMember> {
        Arc::new(ThreadMember { group: Arc::clone(self), rank })
    }
}

impl ThreadMember {
    /// Deposits copies of `arrays`, waits for every worker, runs `read` over every
    /// worker's deposits (in rank order), then waits again so deposits stay until all
    /// have read them.
    fn exchange(&self, arrays: &[&NDArray], read: impl FnOnce(&[Vec<NDArray>]) -> Result<()>) -> Result<()> {
        let copies = arrays.iter().map(|a| a.deep_copy()).collect::<Result<Vec<_>>>()?;
        self.group.deposits.lock().expect("deposits")[self.rank] = copies;
        self.group.barrier.wait();
        let all = self.group.deposits.lock().expect("deposits").clone();
        let r = read(&all);
        self.group.barrier.wait();
        r
    }
}

impl kvstore_core::backend::Collective for ThreadMember {
    fn name(&self) -> &'static str {
        "threads"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.size
    }
    fn barrier(&self) -> Result<()> {
        self.group.barrier.wait();
        Ok(())
    }
    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()> {
        let sources: Vec<&NDArray> = pairs.iter().map(|p| p.0).collect();
        self.exchange(&sources, |all| {
            for (j, (_, out)) in pairs.iter().enumerate() {
                // Rank order on every worker: bit-identical results everywhere; f16 and
                // bf16 accumulate in f32 and round once, as the MPI group does.
                let dtype = all[0][j].dtype();
                let wide = |a: &NDArray| match dtype {
                    DType::F16 | DType::BF16 => a.as_type(DType::F32),
                    _ => a.deep_copy(),
                };
                let sum = wide(&all[0][j])?;
                for worker in &all[1..] {
                    sum.add_assign(&wide(&worker[j])?)?;
                }
                out.copy_from(&sum.as_type(dtype)?)?;
            }
            Ok(())
        })
    }
    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()> {
        self.exchange(arrays, |all| {
            for (j, out) in arrays.iter().enumerate() {
                out.copy_from(&all[root][j])?;
            }
            Ok(())
        })
    }
}

/// A `dist_sync` store of the worker `member` (several stores of one worker share its
/// group, as the stores of one MPI process do).
pub fn dist_store(member: &Arc<ThreadMember>) -> KVStore {
    let group: Arc<dyn kvstore_core::backend::Collective> = Arc::clone(member) as _;
    KVStore::builder("dist_sync").num_threads(1).collective(group).build().expect("dist_sync")
}

/// [`dist_store`] with every worker holding every key's optimizer state and running
/// every update (`Layout::Replicated`): where a test's updater runs on every worker.
pub fn replicated_dist_store(member: &Arc<ThreadMember>) -> KVStore {
    let group: Arc<dyn kvstore_core::backend::Collective> = Arc::clone(member) as _;
    KVStore::builder("dist_sync")
        .num_threads(1)
        .collective(group)
        .layout(kvstore_core::Layout::Replicated)
        .build()
        .expect("dist_sync")
}

/// Runs `worker(rank, member)` on `size` threads, each a worker of one [`ThreadGroup`],
/// and returns their results in rank order.
pub fn run_members<T: Send + 'static>(
    size: usize,
    worker: impl Fn(usize, Arc<ThreadMember>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let group = ThreadGroup::new(size);
    let worker = Arc::new(worker);
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (member, worker) = (group.member(rank), Arc::clone(&worker));
            std::thread::spawn(move || worker(rank, member))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("worker panicked")).collect()
}

/// Runs `worker(rank, store)` on `size` threads, each with a `dist_sync` store of one
/// [`ThreadGroup`], and returns their results in rank order.
pub fn run_workers<T: Send + 'static>(
    size: usize,
    worker: impl Fn(usize, KVStore) -> T + Send + Sync + 'static,
) -> Vec<T> {
    run_members(size, move |rank, member| worker(rank, dist_store(&member)))
}
