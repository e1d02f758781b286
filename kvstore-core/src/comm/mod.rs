//! Where a store's data moves and where its keys live: the `Comm` trait, as MXNet's
//! `Comm` in `src/kvstore/comm.h`, with two implementations a store picks by its kind:
//! [`CommCpu`] (`local` and `dist_sync`: sums on the host, device values staged through
//! page-locked buffers it keeps per key; MXNet's `CommCPU`) and [`CommDevice`]
//! (`device`: places each key on a GPU by size and sums there; MXNet's `CommDevice`).
//! The store knows neither staging nor placement: it hands each push's keys to its
//! `Comm`, moves a key where the `Comm` says, sums what it returns, and keeps each key's
//! [`KeyBuffers`] for it. Another `Comm` (NCCL) plugs in the same way.
//!
//! Summation is deterministic in every `Comm`: for every element the values are added
//! left to right in the order given, f16/bf16 accumulate in f32 and round once, integers
//! wrap; results are bit-identical for any thread count and on devices.

use std::any::Any;
use std::ops::Range;

use crate::context::Context;
use crate::error::Result;
use crate::ndarray::NDArray;

mod cpu;
mod device;
mod kind;
mod share;

pub use cpu::CommCpu;

/// The most keys in one piece of [`Comm::share_keys`], however small they are: where
/// each key's bookkeeping costs more than its bytes (1000 keys of 16 f32), pieces of
/// 64 KiB (hundreds of keys) left a thread waiting at the rounds' barrier for most of a
/// piece (0.29–0.31 µs per key pushed and pulled, against 0.27 in pieces of 32).
pub(crate) const CLAIM_KEYS: usize = 32;
pub use device::CommDevice;
pub(crate) use kind::StoreKind;

/// Where one thread of [`Comm::share_keys`] takes its pieces of the keys, round by
/// round: every thread goes through the same rounds, and each round gives out every
/// piece once.
pub trait Claims {
    /// How many pieces there are; they are numbered from 0 in key order.
    fn pieces(&self) -> usize;

    /// The next piece of this round for this thread (its number and its keys): from its
    /// own part first, then from what is left of the others'. `None` when none is
    /// left, or when a thread failed. Asking for a piece marks the one taken before
    /// as done.
    fn next(&self) -> Option<(usize, Range<usize>)>;

    /// Marks this thread's last piece done, waits until every piece of the round is,
    /// and starts the next round: `true` then, `false` as soon as a thread failed.
    /// Called before `next` gave `None` in this round, it is `false` (and the threads
    /// stop): a piece left untaken would never be done.
    fn all_done(&self) -> bool;
}

/// One reduction: `out = inputs[0] + inputs[1] + ...`, element-wise, left to right.
pub struct ReduceJob<'a> {
    /// The values, in the order they are added. At least one.
    pub inputs: &'a [&'a NDArray],
    /// Where the sum goes; same shape and dtype as every input.
    pub out: &'a NDArray,
}

/// One broadcast: every array of `outs` gets a copy of `src`.
pub struct BroadcastJob<'a> {
    /// The value to copy.
    pub src: &'a NDArray,
    /// The destinations; same shape and dtype as `src`.
    pub outs: &'a [&'a NDArray],
}

/// Moves data between the arrays of one store: sums pushed values, copies pulled ones.
///
/// Callers validate shapes and dtypes first; a `Comm` still checks them and returns
/// [`Error::Internal`](crate::Error::Internal) rather than panicking on a mismatch.
pub trait Comm: Send + Sync {
    /// A short name for messages and benchmarks.
    fn name(&self) -> &'static str;

    /// Runs every reduction of `jobs` (of different keys, so in any order).
    ///
    /// # Errors
    /// [`Error::Internal`](crate::Error::Internal) if a job's arrays disagree in shape or dtype.
    fn reduce(&self, jobs: &[ReduceJob<'_>]) -> Result<()>;

    /// Runs every broadcast of `jobs`.
    ///
    /// # Errors
    /// [`Error::Internal`](crate::Error::Internal) if a job's arrays disagree in shape or dtype.
    fn broadcast(&self, jobs: &[BroadcastJob<'_>]) -> Result<()>;

    /// A call that may share about `bytes` of work out ([`Comm::share_keys`]) is
    /// starting: a comm whose threads sleep when idle wakes one now, if it would share
    /// that much, so that it is up when the work is ready (waking one took 15–45 µs on
    /// a 2-core machine). By default nothing.
    fn wake(&self, _bytes: usize) {}

    /// Runs `work` once on each of this comm's threads, the caller's among them; the
    /// threads take consecutive pieces of `0..sizes.len()` (the keys of a call, key `i`
    /// moving `sizes[i]` bytes) from their [`Claims`], in `rounds` rounds that each give
    /// out every piece once, and wait at [`Claims::all_done`] until a round is done, so
    /// a call can check all its keys in one round before it changes any in the next.
    /// The first error of a `work` is returned, and no piece is given out after it. The
    /// pieces depend only on `sizes`; each has a few keys (at most `CLAIM_KEYS`) and is
    /// small enough that a `reduce` or `broadcast` of its keys, called from `work`, runs
    /// on the thread that calls it.
    ///
    /// `None`, with nothing run, when the comm does not share such work out: by
    /// default, and when there is too little work to share or a key big enough to be
    /// split on its own.
    fn share_keys(
        &self,
        _sizes: &[usize],
        _rounds: usize,
        _work: &(dyn Fn(&dyn Claims) -> Result<()> + Sync),
    ) -> Option<Result<()>> {
        None
    }

    /// The thread pool the comm splits host work over, for other host work of the
    /// store's that is big enough to split (a `row_sparse_pull` of many rows); `None`
    /// (the default) runs such work on the calling thread.
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        None
    }

    /// The array a store keeps for a value given to `init`: by default a copy in the
    /// value's context.
    ///
    /// # Errors
    /// The copy's (out of memory, a device failure).
    fn init_value(&self, value: &NDArray) -> Result<NDArray> {
        value.deep_copy()
    }

    /// Where each key of a push must live before it is summed, in the order of `keys`:
    /// `Some(context)` moves the key (its value, optimizer state and merge buffer) there
    /// first. By default every key stays where it is.
    ///
    /// The store calls `place` and `stage` only for pushes with a value on a device: a
    /// push of host values is summed where its values are.
    ///
    /// # Errors
    /// The comm's; no key has moved then.
    fn place(&self, keys: &mut [PushKey<'_, '_>]) -> Result<Vec<Option<Context>>> {
        Ok(vec![None; keys.len()])
    }

    /// What to sum for a key of a push: `None` for its values as given (the default),
    /// or copies the comm made of them, in the same order.
    ///
    /// # Errors
    /// The copies' (out of memory, a device failure).
    fn stage(&self, _key: &mut PushKey<'_, '_>) -> Result<Option<Vec<NDArray>>> {
        Ok(None)
    }
}

/// What a [`Comm`] keeps for one key of a store (its staging buffers, whether it placed
/// the key): made empty with the key, handed to the comm with the key at every push,
/// and dropped with the key. The store never looks inside.
#[derive(Default)]
pub struct KeyBuffers(Option<Box<dyn Any + Send + Sync>>);

impl KeyBuffers {
    /// Whether the comm's data for the key is a `T`.
    pub fn is<T: Any>(&self) -> bool {
        self.0.as_ref().is_some_and(|b| b.is::<T>())
    }

    /// The comm's data for the key, made by `make` at first use (or when a different
    /// type was stored).
    pub fn get_or_insert_with<T: Any + Send + Sync>(&mut self, make: impl FnOnce() -> T) -> &mut T {
        if !self.is::<T>() {
            self.0 = Some(Box::new(make()));
        }
        match self.0.as_mut().and_then(|b| b.downcast_mut::<T>()) {
            Some(t) => t,
            None => unreachable!("stored just above"),
        }
    }
}

/// One key of a push, as its [`Comm`] sees it before the sums.
pub struct PushKey<'k, 'a> {
    /// The values pushed to the key, in call order.
    pub values: &'k [&'a NDArray],
    /// The key's stored value (its shape, dtype and context).
    pub value: &'k NDArray,
    /// What the comm keeps for the key.
    pub buffers: &'k mut KeyBuffers,
}
