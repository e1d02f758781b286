//! Writes that a store's engine will make to an array later (a non-blocking pull's
//! outs): until they are made, every access to the array's elements waits for them. So
//! no read of a pending out sees its old value, and no write to it is overwritten by
//! the pull.
//!
//! An array's pending writes belong to one engine at a time (`Inner::pending_owner`):
//! a call of another store's engine that uses the array waits, when it is made, until
//! they are done ([`PendingWrites::new`], and `lend` in `loan.rs`), so calls of
//! different stores on one array take effect in the order they were made. The owning
//! engine's threads do not wait for them: the engine orders every call after the calls
//! that write the arrays it uses (a pending array is one of the call's vars), and user
//! code it runs (an updater) reads an array that a later call of its store writes as it
//! is, before that call, as call order says. Every other access waits, on any thread:
//! on another engine's thread too, unless that wait could never end (`waits.rs`), which
//! is then an error.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};

use super::NDArray;
use crate::engine::{current_worker, release_writers_of, running_now, wait_for_calls_before_now};
use crate::error::Result;
use crate::waits;

/// Where accesses to arrays with pending writes wait; notified whenever an array's
/// pending writes end. One for the process: waiting is the rare case.
pub(super) static SETTLED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

/// How long an access waits for pending writes before it looks again, releasing a
/// batch of fused calls that may hold them since.
const RELOOK: std::time::Duration = std::time::Duration::from_millis(5);

thread_local! {
    /// Nanoseconds this thread waited for other calls' writes to arrays it was about to
    /// use ([`NDArray::wait_for_writes_but`]), since [`take_waited`] last took them: a
    /// call's `inputs` phase.
    static WAITED: Cell<u64> = const { Cell::new(0) };
}

/// The nanoseconds this thread waited for pending writes since the last call here (a
/// store counts them as its call's `inputs` phase), and starts counting again.
pub(crate) fn take_waited() -> u64 {
    WAITED.with(|w| w.replace(0))
}

thread_local! {
    /// Whether this thread is one of the reduction pool's: it runs parts of calls
    /// whose arrays were made ready for them, and store code only, so it never waits
    /// for pending writes and never reclaims loans.
    pub(super) static POOL_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as one of the reduction pool's (see [`POOL_THREAD`]).
pub(crate) fn mark_pool_thread() {
    POOL_THREAD.with(|t| t.set(true));
}

thread_local! {
    /// Whether this thread runs user code for a store (an updater, an `on_done`
    /// callback): on an engine's thread, its writes to arrays lent to queued calls
    /// copy them first, as any other thread's (see `loan.rs`).
    pub(super) static USER_CODE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, user code that a store calls (an updater, a callback), marked as such
/// on this thread (see [`USER_CODE`]).
pub(crate) fn as_user_code<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the flag back however `f` ends (a panic included).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            USER_CODE.with(|u| u.set(self.0));
        }
    }
    let _restore = Restore(USER_CODE.with(|u| u.replace(true)));
    f()
}

impl NDArray {
    /// The address of the shared buffer: one per buffer, the same for every clone.
    pub(crate) fn buffer_id(&self) -> usize {
        std::sync::Arc::as_ptr(&self.inner) as usize
    }

    /// Waits until no write is pending on this array, but those of the engine whose
    /// thread this is, or whose blocking call runs at once on it (see the module docs and
    /// [`crate::engine::run_now`]).
    ///
    /// # Errors
    /// On an engine's thread, when the wait could never end (`waits.rs`).
    pub(super) fn settle(&self) -> Result<()> {
        if self.inner.pending.load(Ordering::Acquire) == 0 || POOL_THREAD.with(Cell::get) {
            return Ok(());
        }
        let engine = match current_worker() {
            // A blocking call running at once here: its engine's writes of calls made
            // before it are waited for, those of later calls are not (`run_now`).
            0 => {
                let now = running_now();
                if now != 0 && self.inner.pending_owner.load(Ordering::Acquire) == now {
                    wait_for_calls_before_now();
                }
                now
            }
            worker => worker,
        };
        self.wait_for_writes_but(engine)
    }

    /// Whether writes of an engine other than `engine` (0: of any) are pending.
    pub(super) fn foreign_writes(&self, engine: usize) -> bool {
        self.inner.pending.load(Ordering::Acquire) != 0
            && (engine == 0 || self.inner.pending_owner.load(Ordering::Acquire) != engine)
    }

    /// Waits until no write of an engine other than `engine` (0: of any) is pending (as
    /// before a call of `engine` that reads this array is queued: see the module docs).
    ///
    /// # Errors
    /// As [`NDArray::settle`].
    /// The wait is timed (the waiting call's `inputs` phase: [`take_waited`], and an
    /// event of the timeline when it records).
    pub(crate) fn wait_for_writes_but(&self, engine: usize) -> Result<()> {
        if !self.foreign_writes(engine) {
            return Ok(());
        }
        let start = crate::timeline::now();
        let r = self.wait_for_foreign_writes(engine);
        let end = crate::timeline::now();
        WAITED.with(|w| w.set(w.get() + end.saturating_sub(start)));
        if crate::timeline::recording() {
            crate::timeline::complete("inputs", "phase", start, end, Vec::new());
        }
        r
    }

    fn wait_for_foreign_writes(&self, engine: usize) -> Result<()> {
        while self.foreign_writes(engine) {
            // A write a batch of fused calls holds back is released first (`kvstore/run/fused.rs`).
            release_writers_of(self.buffer_id());
            let owner = self.inner.pending_owner.load(Ordering::Acquire);
            let _waiting = waits::wait_for(owner, || {
                "an access to an array that a queued call of another store (or a later call of this one) writes"
                    .to_string()
            })?;
            // A batch that is about to hold the write (its call marks its outs before
            // it joins the batch) is released on a later look: the wait looks again
            // every few milliseconds.
            let mut guard = SETTLED.0.lock();
            if self.foreign_writes(engine) && self.inner.pending_owner.load(Ordering::Acquire) == owner {
                SETTLED.1.wait_for(&mut guard, RELOOK);
            }
        }
        Ok(())
    }

    /// Marks a write of a queued call of `engine` pending, once no other engine's
    /// writes are, and no other engine's call has the array on loan (those loans get
    /// their copies first: one lent since the caller reclaimed them is caught here).
    fn mark_pending(&self, engine: usize) -> Result<()> {
        loop {
            {
                let claim = self.inner.loans.lock();
                if super::loan::foreign_loans(&claim, engine) {
                    drop(claim);
                    self.reclaim_foreign(engine)?;
                    continue;
                }
                if !self.foreign_writes(engine) {
                    // The owner first: a reader that sees the count sees its owner.
                    self.inner.pending_owner.store(engine, Ordering::Release);
                    self.inner.pending.fetch_add(1, Ordering::AcqRel);
                    return Ok(());
                }
            }
            self.wait_for_writes_but(engine)?;
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
/// see `kvstore/calls.rs`); a long one's is freed now, so that a handle kept for
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
    /// Marks `arrays` as pending writes of a queued call of `engine`: from now on,
    /// accesses from other threads wait. An array with pending writes of another
    /// engine is marked once they are done (this waits for them).
    ///
    /// # Errors
    /// As [`NDArray::settle`]; no array is left marked.
    pub(crate) fn new(engine: usize, mut arrays: Vec<NDArray>) -> Result<Self> {
        for (i, a) in arrays.iter().enumerate() {
            if let Err(e) = a.mark_pending(engine) {
                arrays.truncate(i);
                drop(PendingWrites { arrays });
                return Err(e);
            }
        }
        Ok(PendingWrites { arrays })
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
        let mut writes = PendingWrites::new(A, outs.clone()).unwrap();
        assert!(outs.iter().all(NDArray::is_pending));
        writes.end();
        assert!(outs.iter().all(|a| !a.is_pending()) && writes.arrays.capacity() == 0);
    }

    /// Stand-ins for two engines' ids (real ids are addresses, never this small).
    const A: usize = 11;
    const B: usize = 12;

    #[test]
    fn reads_wait_for_pending_writes_except_on_the_owning_engines_threads() {
        let a = NDArray::zeros(&[4]).unwrap();
        let writes = PendingWrites::new(A, vec![a.clone()]).unwrap();
        assert!(a.is_pending());
        let read_on = |engine: usize| {
            let a = a.clone();
            std::thread::spawn(move || {
                crate::engine::set_current_worker(engine);
                a.to_vec::<f32>().unwrap()
            })
        };
        // A caller's thread, and another engine's thread, wait.
        let (reader, other_engine) = (read_on(0), read_on(B));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!reader.is_finished(), "the read did not wait for the pending write");
        assert!(!other_engine.is_finished(), "another engine's thread did not wait for the pending write");
        let writer = std::thread::spawn(move || {
            // The owning engine's threads do not wait for its pending writes: they make them.
            crate::engine::set_current_worker(A);
            a.copy_from(&NDArray::full(&[4], 5.0).unwrap()).unwrap();
            drop(writes);
        });
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), vec![5.0; 4]);
        assert_eq!(other_engine.join().unwrap(), vec![5.0; 4]);
    }

    #[test]
    fn another_engines_writes_are_marked_once_the_first_engines_are_done() {
        let a = NDArray::zeros(&[2]).unwrap();
        let first = PendingWrites::new(A, vec![a.clone()]).unwrap();
        // The same engine marks more at once: it orders its own calls.
        let again = PendingWrites::new(A, vec![a.clone()]).unwrap();
        let second = {
            let a = a.clone();
            std::thread::spawn(move || PendingWrites::new(B, vec![a]).unwrap())
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!second.is_finished(), "engine B marked a write while engine A's were pending");
        drop(first);
        std::thread::sleep(Duration::from_millis(10));
        assert!(!second.is_finished());
        drop(again);
        let second = second.join().unwrap();
        assert!(a.is_pending() && a.inner.pending_owner.load(Ordering::Acquire) == B);
        // Engine A's own thread now waits for B, and B's for nothing.
        drop(second);
        assert!(!a.is_pending());
    }

    #[test]
    fn a_copy_waits_for_its_outs_pending_write_holding_no_lock_of_its_source() {
        // The source below the out in address order, so that its lock is taken first.
        let (a, b) = (NDArray::zeros(&[4]).unwrap(), NDArray::full(&[4], 2.0).unwrap());
        let (src, out) = if a.buffer_id() < b.buffer_id() { (a, b) } else { (b, a) };
        src.copy_from(&NDArray::full(&[4], 2.0).unwrap()).unwrap();
        let writes = PendingWrites::new(A, vec![out.clone()]).unwrap();
        let copy = {
            let (src, out) = (src.clone(), out.clone());
            std::thread::spawn(move || out.copy_from(&src).unwrap())
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!copy.is_finished(), "the copy did not wait for the out's pending write");
        // The engine's write of the source (as a queued pull makes it) is not blocked by
        // the waiting copy: it held no lock of the source while it waited.
        let engine_write = {
            let src = src.clone();
            std::thread::spawn(move || {
                crate::engine::set_current_worker(A);
                src.copy_from(&NDArray::full(&[4], 3.0).unwrap()).unwrap();
            })
        };
        let start = std::time::Instant::now();
        while !engine_write.is_finished() {
            assert!(start.elapsed() < Duration::from_secs(5), "a waiting copy blocked a write of its source");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(writes);
        copy.join().unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![3.0; 4]);
    }

    #[test]
    fn an_engines_thread_may_not_wait_for_its_own_engines_writes_elsewhere() {
        let a = NDArray::zeros(&[2]).unwrap();
        let writes = PendingWrites::new(A, vec![a.clone()]).unwrap();
        // On A's thread, a call of engine B on the array would wait for A's write, which
        // may queue behind the call running there: an error, not a hang.
        let err = std::thread::spawn(move || {
            crate::engine::set_current_worker(A);
            PendingWrites::new(B, vec![a]).err()
        })
        .join()
        .unwrap()
        .expect("a wait for the thread's own engine");
        assert!(err.to_string().contains("would wait for ever"), "{err}");
        drop(writes);
    }
}
