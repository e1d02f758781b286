//! The group of worker processes a `dist_sync` store sums across. Core names no
//! transport: `kvstore-mpi` implements [`Collective`] over MPI, and tests implement it
//! with threads. MXNet's `dist_sync` summed on parameter servers; MXNet's allreduce
//! stores (Horovod, BytePS) and PyTorch DDP sum across the workers instead, which is
//! what a `dist_sync` store built with a `Collective` does.

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

    /// Sets how long a collective operation may wait for the workers before the job
    /// ends ([`crate::KVStoreBuilder::timeout`]); a transport without a watchdog ignores
    /// it.
    fn set_timeout(&self, timeout: std::time::Duration) {
        let _ = timeout;
    }
}

/// The longest record [`Collective::exchange`] takes.
pub const MAX_RECORD: usize = 1024;
