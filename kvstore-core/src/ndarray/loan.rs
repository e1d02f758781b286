//! Reads that a store's engine will make later (a non-blocking push's values), without
//! copying the array when the call is made: the array is *lent* to the queued call. The
//! caller may still write it at once: a write before the call has read it first copies
//! the old contents for the call (copy on write), and a write while the call reads it
//! waits until the call is done with it. So a non-blocking push sums exactly what the
//! array held when the push was made, and costs a copy only when the caller overwrites
//! the array before the push ran.
//!
//! The store's own threads never reclaim a loan: an engine orders every call that
//! writes an array after its own calls the array is lent to (the array is one of their
//! vars), and a call that writes an array lent to another engine's call reclaims that
//! loan when it is made, on the caller's thread ([`NDArray::reclaim_foreign`]).

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::NDArray;
use super::pending::{SETTLED, STORE_THREAD};
use crate::error::Result;

/// One queued call's read of one array.
pub(crate) struct Loan {
    /// The engine of the call (see [`crate::engine::Engine::id`]).
    owner: usize,
    state: Mutex<State>,
}

enum State {
    /// Not read yet: the array itself will be read.
    Lent,
    /// The caller wrote the array first: the call reads this copy of the old contents.
    Copied(NDArray),
    /// The call is reading the array itself: writes wait.
    Reading,
    /// The call is done with it.
    Returned,
}

/// An array lent to a queued call; dropping it ends the loan (when the call is done).
pub(crate) struct Lent {
    array: NDArray,
    loan: Arc<Loan>,
}

impl NDArray {
    /// Lends the array to a call of engine `owner` that reads it later (see the module
    /// docs).
    pub(crate) fn lend(&self, owner: usize) -> Lent {
        let loan = Arc::new(Loan { owner, state: Mutex::new(State::Lent) });
        self.inner.loans.lock().push(Arc::clone(&loan));
        self.inner.lent.fetch_add(1, Ordering::AcqRel);
        Lent { array: self.clone(), loan }
    }

    /// Whether a queued call will read this array.
    pub(crate) fn is_lent(&self) -> bool {
        self.inner.lent.load(Ordering::Acquire) != 0
    }

    /// Before a write from outside the store: every loan not yet read gets a copy of
    /// the contents, and loans being read are waited for.
    pub(super) fn reclaim(&self) -> Result<()> {
        if !self.is_lent() || STORE_THREAD.with(Cell::get) {
            return Ok(());
        }
        self.reclaim_but(None)
    }

    /// Before a call that runs at once on this thread uses this array (`written`: as an
    /// out): waits for the writes other stores' queued calls will make to it, and gives
    /// the queued calls it is lent to a copy first when the call writes it. Done here,
    /// on the caller's thread, because the call's work may be shared out over the
    /// store's threads, which do neither.
    pub(crate) fn prepare_for_call(&self, written: bool) -> Result<()> {
        self.settle();
        if written { self.reclaim() } else { Ok(()) }
    }

    /// Before queueing a call of engine `owner` that writes this array: the loans of
    /// other engines' calls are reclaimed as [`NDArray::reclaim`] does (`owner`'s own
    /// calls it is lent to run before the call anyway).
    pub(crate) fn reclaim_foreign(&self, owner: usize) -> Result<()> {
        if !self.is_lent() {
            return Ok(());
        }
        self.reclaim_but(Some(owner))
    }

    fn reclaim_but(&self, owner: Option<usize>) -> Result<()> {
        loop {
            let loan = self.inner.loans.lock().iter().find(|l| Some(l.owner) != owner).cloned();
            let Some(loan) = loan else { return Ok(()) };
            if matches!(*loan.state.lock(), State::Lent) {
                // Copied without holding the loan: the copy may wait for a pending
                // write, and the call must stay free to start meanwhile.
                let copy = self.deep_copy()?;
                let mut state = loan.state.lock();
                if matches!(*state, State::Lent) {
                    *state = State::Copied(copy);
                    drop(state);
                    self.unlist(&loan);
                }
                continue;
            }
            let mut guard = SETTLED.0.lock();
            while matches!(*loan.state.lock(), State::Reading) {
                SETTLED.1.wait(&mut guard);
            }
        }
    }

    /// Takes `loan` off this array's list (once).
    fn unlist(&self, loan: &Arc<Loan>) {
        let mut loans = self.inner.loans.lock();
        if let Some(i) = loans.iter().position(|l| Arc::ptr_eq(l, loan)) {
            loans.swap_remove(i);
            self.inner.lent.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Lent {
    /// The array the call reads, on the store's thread: the array itself (writes to it
    /// wait from now until the loan ends), or the copy made when the caller wrote it.
    pub(crate) fn read(&self) -> NDArray {
        let mut state = self.loan.state.lock();
        match &*state {
            State::Copied(copy) => copy.clone(),
            _ => {
                *state = State::Reading;
                self.array.clone()
            }
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.array.unlist(&self.loan);
        *self.loan.state.lock() = State::Returned;
        // Taking the lock orders this notification after any waiter's check.
        let _guard = SETTLED.0.lock();
        SETTLED.1.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_write_before_the_read_copies_the_old_contents_for_the_call() {
        let a = NDArray::full(&[4], 1.0).unwrap();
        let lent = a.lend(0);
        assert!(a.is_lent());
        a.add_assign(1.0).unwrap(); // no wait: the loan gets a copy
        assert!(!a.is_lent());
        assert_eq!(lent.read().to_vec::<f32>().unwrap(), vec![1.0; 4]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.0; 4]);
        drop(lent);
    }

    #[test]
    fn a_write_while_the_call_reads_waits_until_the_loan_ends() {
        let a = NDArray::full(&[4], 1.0).unwrap();
        let lent = a.lend(0);
        let read = lent.read();
        assert!(read.same_storage(&a), "an unwritten loan reads the array itself");
        let writer = {
            let a = a.clone();
            std::thread::spawn(move || a.add_assign(1.0).unwrap())
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!writer.is_finished(), "the write did not wait for the call reading the array");
        assert_eq!(read.to_vec::<f32>().unwrap(), vec![1.0; 4]);
        drop(lent);
        writer.join().unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.0; 4]);
        assert!(!a.is_lent());
    }

    #[test]
    fn the_stores_threads_write_lent_arrays_without_copying() {
        let a = NDArray::full(&[2], 1.0).unwrap();
        let lent = a.lend(0);
        let a2 = a.clone();
        std::thread::spawn(move || {
            crate::ndarray::mark_store_thread();
            a2.add_assign(1.0).unwrap();
        })
        .join()
        .unwrap();
        assert!(a.is_lent(), "a store thread reclaimed a loan");
        assert_eq!(lent.read().to_vec::<f32>().unwrap(), vec![2.0; 2]);
    }
}
