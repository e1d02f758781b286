//! The group of worker processes a `dist_sync` store sums across. Core names no
//! transport: `kvstore-mpi` implements [`Collective`] over MPI, and tests implement it
//! with threads. MXNet's `dist_sync` summed on parameter servers; MXNet's allreduce
//! stores (Horovod, BytePS) and PyTorch DDP sum across the workers instead, which is
//! what a `dist_sync` store built with a `Collective` does.

use std::ops::Range;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ndarray::NDArray;

/// A fixed group of workers that every `dist_sync` store of a job shares.
///
/// Every worker calls the collective operations in the same order with arrays of the
/// same shapes and dtypes (the store guarantees this when every worker makes the same
/// store calls with the same keys, as MXNet required).
pub trait Collective: Send + Sync {
    /// A short name for messages (`"mpi"`).
    fn name(&self) -> &'static str;

    /// This worker's rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// The number of workers.
    fn size(&self) -> usize;

    /// Waits until every worker has called it.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken (a worker died).
    fn barrier(&self) -> Result<()>;

    /// For each `(source, destination)` pair, sums `source` element-wise across the
    /// workers into `destination` (same shape and dtype). A pair may name one array
    /// twice, to sum in place. Every worker ends with bit-identical destinations.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken.
    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()>;

    /// For each `(source, destination)` pair, the sums of [`Collective::allreduce_sum`]
    /// (the same bits) of the elements of `source` that `parts[j][r]` names for worker
    /// `r` (a range of flat elements per worker), each worker receiving its own range's
    /// only, into `destination` (of exactly that many elements): what a `dist_sync` push
    /// with owners moves to each key's owners (`kvstore/layout.rs`). The default sums
    /// everything on every worker ([`Collective::allreduce_sum`], into copies) and keeps
    /// this worker's range; a transport may move each worker's ranges to it alone, half
    /// an allreduce's bytes.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken; [`crate::Error::Internal`] for
    /// `parts` that do not fit the arrays.
    fn reduce_scatter_sum(&self, pairs: &[(&NDArray, &NDArray)], parts: &[Vec<Range<usize>>]) -> Result<()> {
        let rank = self.rank();
        check_parts("a reduce-scatter", pairs.iter().map(|(s, _)| *s), parts, self.size())?;
        if pairs.iter().zip(parts).any(|((_, d), p)| d.size() != p[rank].len()) {
            return Err(Error::Internal("a reduce-scatter's destination is not this worker's range".into()));
        }
        let sums = pairs
            .iter()
            .map(|(s, _)| NDArray::zeros_with(s.shape(), s.dtype(), crate::Context::default()))
            .collect::<Result<Vec<_>>>()?;
        let whole: Vec<(&NDArray, &NDArray)> = pairs.iter().zip(&sums).map(|((s, _), sum)| (*s, sum)).collect();
        self.allreduce_sum(&whole)?;
        for ((sum, (_, d)), p) in sums.iter().zip(pairs).zip(parts) {
            let each = d.dtype().size();
            d.write()?.bytes_mut().copy_from_slice(&sum.read()?.bytes()[p[rank].start * each..p[rank].end * each]);
        }
        Ok(())
    }

    /// For each array, worker `r`'s elements `parts[j][r]` (a range of flat elements
    /// per worker) copied from worker `r` to every other worker, for the call `step`:
    /// the owners' new values reaching every worker after a `dist_sync` push with
    /// owners. The default packs each worker's ranges into one buffer and moves it with
    /// [`Collective::all_gather`].
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken; [`crate::Error::Internal`] for
    /// `parts` that do not fit the arrays.
    fn all_gather_parts(&self, step: &str, arrays: &[&NDArray], parts: &[Vec<Range<usize>>]) -> Result<()> {
        gather_parts_through_bytes(self, step, arrays, parts)
    }

    /// Overwrites every array with the one of worker `root`.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken.
    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()>;

    /// Every worker's `mine` (at most [`MAX_RECORD`] bytes; every worker gives one of the
    /// same length) for the call `step` (`"push #812"`, for messages), in rank order: how
    /// the workers compare the calls they make before the data of a call moves (desync
    /// detection, `kvstore/steps.rs`). The default is [`Collective::all_gather`]'s; a
    /// transport may do better (kvstore-mpi: messages, which also tell which workers
    /// never arrived).
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken; [`crate::Error::Internal`]
    /// for a record longer than [`MAX_RECORD`].
    fn exchange(&self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_RECORD {
            return Err(Error::Internal(format!("a record of {} bytes to exchange", mine.len())));
        }
        if mine.is_empty() {
            // Every worker's empty record, one per worker.
            return Ok(vec![Vec::new(); self.size()]);
        }
        let all = self.all_gather(step, mine)?;
        Ok(all.chunks(mine.len().max(1)).take(self.size()).map(<[u8]>::to_vec).collect())
    }

    /// Every worker's `mine` (every worker gives the same number of bytes, any number)
    /// for the data of the call `step`, one after another in rank order (worker `r`'s
    /// at `r * mine.len()`): how compressed pushes move their 2-bit codes or 16-bit
    /// floats (`kvstore/compression.rs`). The default sums per-worker slots with
    /// [`Collective::allreduce_sum`]; a transport may do better (kvstore-mpi: MPI's
    /// allgather).
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken.
    fn all_gather(&self, step: &str, mine: &[u8]) -> Result<Vec<u8>> {
        let _ = step;
        let (n, world, rank) = (mine.len(), self.size(), self.rank());
        if n == 0 {
            return Ok(Vec::new());
        }
        let slots = NDArray::zeros_with(&[n * world], DType::U8, crate::Context::default())?;
        slots.write()?.bytes_mut()[rank * n..(rank + 1) * n].copy_from_slice(mine);
        self.allreduce_sum(&[(&slots, &slots)])?;
        slots.to_vec::<u8>()
    }

    /// What every worker sends every other for the call `step`: `sends[d]` (any
    /// length, one per worker, this worker's own included) goes to worker `d`, and the
    /// result holds what each worker sent this one, in rank order. How a row-sparse
    /// push moves each row to its owner and `row_sparse_pull` asks the owners for rows
    /// (`kvstore/sparse.rs`). The default gathers every worker's sends on every worker
    /// (over [`Collective::all_gather`]) and keeps this worker's; a transport may move
    /// each worker's bytes to their destination alone (kvstore-mpi: MPI's alltoallv).
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken; [`crate::Error::Internal`] for
    /// `sends` that are not one per worker.
    fn all_to_all(&self, step: &str, sends: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        let (world, rank) = (self.size(), self.rank());
        if sends.len() != world {
            return Err(Error::Internal(format!("{step}: {} sends for {world} workers", sends.len())));
        }
        // Each worker's record: its sends' lengths, then the sends in order.
        let mut mine: Vec<u8> = sends.iter().flat_map(|s| (s.len() as u64).to_le_bytes()).collect();
        for s in sends {
            mine.extend_from_slice(s);
        }
        let lens = self.all_gather(step, &(mine.len() as u64).to_le_bytes())?;
        let lens: Vec<usize> = lens.chunks_exact(8).map(|b| crate::kvstore::word(b, 0) as usize).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        mine.resize(longest, 0);
        let all = self.all_gather(step, &mine)?;
        let cut = || Error::Internal(format!("{step}: a worker's sends are cut short"));
        (0..world)
            .map(|r| {
                let record = all.get(r * longest..(r + 1) * longest).ok_or_else(cut)?;
                let len = |d: usize| crate::kvstore::word(record, d * 8) as usize;
                let start = 8 * world + (0..rank).map(len).sum::<usize>();
                record.get(start..start + len(rank)).map(<[u8]>::to_vec).ok_or_else(cut)
            })
            .collect()
    }

    /// Sets how long a collective operation may wait for the workers before the job
    /// ends ([`crate::KVStoreBuilder::timeout`]); a transport without a watchdog ignores
    /// it.
    fn set_timeout(&self, timeout: std::time::Duration) {
        let _ = timeout;
    }
}

/// [`Collective::all_gather_parts`] over [`Collective::all_gather`]: each worker's
/// ranges packed in array order, padded to the longest worker's bytes.
///
/// # Errors
/// As [`Collective::all_gather_parts`].
pub fn gather_parts_through_bytes<C: Collective + ?Sized>(
    group: &C,
    step: &str,
    arrays: &[&NDArray],
    parts: &[Vec<Range<usize>>],
) -> Result<()> {
    let (world, rank) = (group.size(), group.rank());
    check_parts(step, arrays.iter().copied(), parts, world)?;
    let bytes_of = |r: usize| -> usize { arrays.iter().zip(parts).map(|(a, p)| p[r].len() * a.dtype().size()).sum() };
    let longest = (0..world).map(bytes_of).max().unwrap_or(0);
    if longest == 0 {
        return Ok(());
    }
    let mut mine = Vec::with_capacity(longest);
    for (a, p) in arrays.iter().zip(parts) {
        let each = a.dtype().size();
        mine.extend_from_slice(&a.read()?.bytes()[p[rank].start * each..p[rank].end * each]);
    }
    mine.resize(longest, 0);
    let all = group.all_gather(step, &mine)?;
    if all.len() != longest * world {
        return Err(Error::Internal(format!("{step}: gathered {} bytes, expected {}", all.len(), longest * world)));
    }
    // Where each worker's next range starts in its slot: its ranges come in array order.
    let mut at: Vec<usize> = (0..world).map(|r| r * longest).collect();
    for (a, p) in arrays.iter().zip(parts) {
        let each = a.dtype().size();
        if (0..world).any(|r| r != rank && !p[r].is_empty()) {
            let mut w = a.write()?;
            let bytes = w.bytes_mut();
            for r in (0..world).filter(|&r| r != rank) {
                let n = p[r].len() * each;
                bytes[p[r].start * each..p[r].end * each].copy_from_slice(&all[at[r]..at[r] + n]);
            }
        }
        for (r, at) in at.iter_mut().enumerate() {
            *at += p[r].len() * each;
        }
    }
    Ok(())
}

/// Checks that `parts` names a range of each array's elements per worker of `world`.
///
/// # Errors
/// [`crate::Error::Internal`] naming `what` where they do not.
pub fn check_parts<'a>(
    what: &str,
    arrays: impl ExactSizeIterator<Item = &'a NDArray>,
    parts: &[Vec<Range<usize>>],
    world: usize,
) -> Result<()> {
    let n = arrays.len();
    let fits = parts.len() == n
        && arrays.zip(parts).all(|(a, p)| p.len() == world && p.iter().all(|r| r.start <= r.end && r.end <= a.size()));
    match fits {
        true => Ok(()),
        false => Err(Error::Internal(format!("{what}: parts that do not fit the arrays"))),
    }
}

/// The longest record [`Collective::exchange`] takes.
pub const MAX_RECORD: usize = 1024;
