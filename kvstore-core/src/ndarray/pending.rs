//! Writes that a store's engine will make to an array later (a non-blocking pull's
//! outs): until they are made, every access to the array's elements waits for them. So
//! no read of a pending out sees its old value, and no write to it is overwritten by
//! the pull.
//!
//! The store's own threads (engine workers and the reduction pool) never wait here: the
//! engine orders every call after the calls that write the arrays it uses (a pending
//! array is one of the call's vars), so what they access is never pending for them.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};

use super::NDArray;

/// Where accesses to arrays with pending writes wait; notified whenever an array's
/// pending writes end. One for the process: waiting is the rare case.
pub(super) static SETTLED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

thread_local! {
    /// Whether this thread is one of the store's own (see the module docs).
    pub(super) static STORE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as one of the store's own: an engine worker or a thread of
/// the reduction pool.
pub(crate) fn mark_store_thread() {
    STORE_THREAD.with(|t| t.set(true));
}

impl NDArray {
    /// The address of the shared buffer: one per buffer, the same for every clone.
    pub(crate) fn buffer_id(&self) -> usize {
        std::sync::Arc::as_ptr(&self.inner) as usize
    }

    /// Waits until no write is pending on this array (not on the store's own threads).
    pub(super) fn settle(&self) {
        if self.inner.pending.load(Ordering::Acquire) == 0 || STORE_THREAD.with(Cell::get) {
            return;
        }
        // A write a batch of fused calls holds back is released first (`kvstore/fusion.rs`).
        crate::engine::release_writers_of(self.buffer_id());
        let mut guard = SETTLED.0.lock();
        while self.inner.pending.load(Ordering::Acquire) != 0 {
            SETTLED.1.wait(&mut guard);
        }
    }

    /// Whether a write to this array by a queued call is pending: an access now waits
    /// for it.
    pub fn is_pending(&self) -> bool {
        self.inner.pending.load(Ordering::Acquire) != 0
    }
}

/// The most bytes a queued call's emptied list keeps (see [`empty_list`]).
const KEPT_BYTES: usize = 512;

/// Empties a list of a queued call that ran. A short list's memory is kept, for the
/// call's last holder to free (the thread that made the call, when it keeps the handle:
/// see `kvstore/nonblocking.rs`); a long one's is freed now, so that a handle kept for
/// long does not hold it (a few blocks freed on the engine's thread per call of many
/// keys cost little).
pub(crate) fn empty_list<T>(list: &mut Vec<T>) {
    match list.capacity() * std::mem::size_of::<T>() > KEPT_BYTES {
        true => *list = Vec::new(),
        false => list.clear(),
    }
}

/// The outs of a queued call: pending from creation until ended ([`PendingWrites::end`])
/// or dropped.
pub(crate) struct PendingWrites {
    arrays: Vec<NDArray>,
}

impl PendingWrites {
    /// Marks `arrays` as pending: from now on, accesses from other threads wait.
    pub(crate) fn new(arrays: Vec<NDArray>) -> Self {
        for a in &arrays {
            a.inner.pending.fetch_add(1, Ordering::AcqRel);
        }
        PendingWrites { arrays }
    }

    /// Ends the writes (the call wrote its outs): accesses no longer wait. A short
    /// list's memory is kept, for whoever drops it ([`empty_list`]).
    pub(crate) fn end(&mut self) {
        if self.arrays.is_empty() {
            return;
        }
        for a in &self.arrays {
            a.inner.pending.fetch_sub(1, Ordering::AcqRel);
        }
        empty_list(&mut self.arrays);
        // Taking the lock orders this notification after any waiter's check.
        let _guard = SETTLED.0.lock();
        SETTLED.1.notify_all();
    }
}

impl Drop for PendingWrites {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_emptied_list_keeps_its_memory_only_when_short() {
        let kept = KEPT_BYTES / std::mem::size_of::<u32>();
        let mut short: Vec<u32> = Vec::with_capacity(kept);
        short.extend(0..kept as u32);
        empty_list(&mut short);
        assert!(short.is_empty() && short.capacity() >= kept);
        let mut long: Vec<u32> = (0..1000).collect();
        empty_list(&mut long);
        assert!(long.is_empty() && long.capacity() == 0);
        // The outs of a call of many keys: no longer pending, and the list let go.
        let outs: Vec<NDArray> = (0..100).map(|_| NDArray::zeros(&[2]).unwrap()).collect();
        let mut writes = PendingWrites::new(outs.clone());
        assert!(outs.iter().all(NDArray::is_pending));
        writes.end();
        assert!(outs.iter().all(|a| !a.is_pending()) && writes.arrays.capacity() == 0);
    }

    #[test]
    fn reads_wait_for_pending_writes_except_on_the_stores_threads() {
        let a = NDArray::zeros(&[4]).unwrap();
        let writes = PendingWrites::new(vec![a.clone()]);
        assert!(a.is_pending());
        let reader = {
            let a = a.clone();
            std::thread::spawn(move || a.to_vec::<f32>().unwrap())
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!reader.is_finished(), "the read did not wait for the pending write");
        let writer = std::thread::spawn(move || {
            // The store's own threads do not wait for pending writes: they make them.
            mark_store_thread();
            a.copy_from(&NDArray::full(&[4], 5.0).unwrap()).unwrap();
            drop(writes);
        });
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), vec![5.0; 4]);
    }
}
