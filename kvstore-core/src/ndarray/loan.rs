//! Reads that a store's engine will make later (a non-blocking push's values), without
//! copying the array when the call is made: the array is *lent* to the queued call. The
//! caller may still write it at once: a write before the call has read it first copies
//! the old contents for the call (copy on write), and a write while the call reads it
//! waits until the call is done with it. So a non-blocking push sums exactly what the
//! array held when the push was made, and costs a copy only when the caller overwrites
//! the array before the push ran.
//!
//! That holds for every writer: the callers' threads, and user code that an engine
//! runs (an updater writing an array lent to a queued call copies it for the call, as
//! the caller's thread would). Only the store's own writes on an engine's thread (a
//! pull writing its outs) leave loans alone: an engine orders every call that writes an
//! array after its own calls the array is lent to (the array is one of their vars), and
//! a call that writes an array lent to another engine's call reclaims that loan when it
//! is made, on the caller's thread ([`NDArray::reclaim_foreign`]). An array with writes
//! of another engine pending is lent once they are done (see `pending.rs`).
//!
//! A call done with its loan marks it returned and leaves the array alone: the
//! array's list of loans (and their count) is the caller's, who lends the array again
//! or writes it, so the call's thread does not take that memory from the caller's
//! core after every call. Returned loans leave the list when it is long and the array
//! is lent again (those at its front: calls end in about the order they were made), or
//! when its loans are looked at (a write, [`NDArray::is_lent`]).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::NDArray;
use super::pending::{POOL_THREAD, SETTLED, USER_CODE};
use crate::engine::{current_worker, running_now, wait_for_calls_before_now};
use crate::error::Result;
use crate::waits;

/// How many loans an array lists before lending it again drops the returned ones at
/// the front of its list: a few at once, so that a stream of calls lending the array
/// does not read back, at every call, the loan that the engine's thread just returned.
const PRUNE_AT: usize = 32;

/// One queued call's read of one array.
pub(crate) struct Loan {
    /// The engine of the call (see [`crate::engine::Engine::id`]).
    owner: usize,
    state: Mutex<State>,
}

/// Whether `loans` (an array's list, locked) holds a loan not returned of an engine
/// other than `engine`.
pub(super) fn foreign_loans(loans: &VecDeque<Arc<Loan>>, engine: usize) -> bool {
    loans.iter().any(|l| l.owner != engine && !l.is_returned())
}

impl Loan {
    /// Whether the call is done with the array (looked at only when a list of loans is
    /// trimmed, with the list locked: that lock is always taken before a loan's).
    fn is_returned(&self) -> bool {
        matches!(*self.state.lock(), State::Returned)
    }
}

/// Bytes held in copies made for queued calls ([`State::Copied`]), in every store:
/// what a store's non-blocking calls wait for when it passes the store's bound
/// (`KVStoreBuilder::max_copied_bytes`).
static COPIED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes held now in copies of lent arrays made for queued calls (see [`COPIED_BYTES`]).
pub(crate) fn copied_bytes() -> usize {
    COPIED_BYTES.load(Ordering::Acquire)
}

/// A copy made for a queued call, counted in [`COPIED_BYTES`] while the loan holds it.
struct CallCopy(NDArray);

impl CallCopy {
    fn new(array: NDArray) -> Self {
        COPIED_BYTES.fetch_add(array.size() * array.dtype().size(), Ordering::AcqRel);
        CallCopy(array)
    }
}

impl Drop for CallCopy {
    fn drop(&mut self) {
        COPIED_BYTES.fetch_sub(self.0.size() * self.0.dtype().size(), Ordering::AcqRel);
    }
}

/// A host copy a binding made for a queued call ([`NDArray::copy_for_queued_call`]),
/// counted in [`COPIED_BYTES`] until the array over it is dropped.
struct CountedCopy {
    words: Vec<u64>,
    len: usize,
}

impl super::ForeignMemory for CountedCopy {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
    /// The store's own memory: no other wrapper names it.
    fn shared(&self) -> bool {
        false
    }
}

impl Drop for CountedCopy {
    fn drop(&mut self) {
        COPIED_BYTES.fetch_sub(self.len, Ordering::AcqRel);
    }
}

impl NDArray {
    /// A copy of this array for a non-blocking call to read later, made by a binding
    /// that must copy when the call is made (its language writes arrays without the
    /// store seeing it, so copy on write cannot work there: Python's `push_async`).
    /// A host copy counts toward the store's bound on copied bytes
    /// (`KVStoreBuilder::max_copied_bytes`) until it is dropped, as the copies made on
    /// write for queued calls do; a device copy is [`NDArray::deep_copy`].
    ///
    /// # Errors
    /// As [`NDArray::deep_copy`].
    pub fn copy_for_queued_call(&self) -> Result<NDArray> {
        if !self.inner.on_host {
            return self.deep_copy();
        }
        let len = self.size() * self.dtype().size();
        // Words: aligned for every dtype.
        let mut copy = CountedCopy { words: vec![0; len.div_ceil(8)], len: 0 };
        {
            let storage = self.storage()?;
            let host =
                storage.host().ok_or_else(|| crate::Error::Internal("a host array without host memory".into()))?;
            bytemuck::cast_slice_mut(&mut copy.words)[..len].copy_from_slice(host.bytes());
        }
        COPIED_BYTES.fetch_add(len, Ordering::AcqRel);
        copy.len = len;
        NDArray::from_foreign(self.shape(), self.dtype(), Box::new(copy), true)
    }
}

enum State {
    /// Not read yet: the array itself will be read.
    Lent,
    /// The caller wrote the array first: the call reads this copy of the old contents.
    Copied(CallCopy),
    /// The call is reading the array itself, on the thread with this [`thread_token`]:
    /// writes wait (but that thread's own).
    Reading(usize),
    /// The call is done with it.
    Returned,
}

thread_local! {
    static TOKEN: u8 = const { 0 };
}

/// A number that tells this thread from every other thread alive.
fn thread_token() -> usize {
    TOKEN.with(|t| t as *const u8 as usize)
}

thread_local! {
    /// The loans of the queued call this thread runs, until it has read them for the
    /// last time (see [`values_read`]).
    static READING: RefCell<Vec<Arc<Loan>>> = const { RefCell::new(Vec::new()) };
}

/// The loans of a queued call that runs on this thread, listed (for [`values_read`])
/// until dropped.
pub(crate) struct Reading(());

impl Reading {
    pub(crate) fn new<'a>(lent: impl Iterator<Item = &'a Lent>) -> Self {
        READING.with(|r| r.borrow_mut().extend(lent.map(|l| Arc::clone(&l.loan))));
        Reading(())
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READING.with(|r| r.borrow_mut().clear());
    }
}

/// Says that the call this thread runs has read its values for the last time (its
/// sums are made; an optimizer's update of a single value read it too): their loans
/// end now, so that a write to one of them waits no longer, not until the whole call,
/// its updater included, is done. Only store code runs between a call's start and
/// this (user code, an updater, runs after), so the list is the call's own.
pub(crate) fn values_read() {
    READING.with(|r| {
        let mut loans = r.borrow_mut();
        if loans.is_empty() {
            return;
        }
        for loan in loans.drain(..) {
            let mut state = loan.state.lock();
            if matches!(*state, State::Reading(_)) {
                *state = State::Returned;
            }
        }
        // Taking the lock orders this notification after any waiter's check.
        let _guard = SETTLED.0.lock();
        SETTLED.1.notify_all();
    });
}

/// An array lent to a queued call; dropping it ends the loan (when the call is done).
pub(crate) struct Lent {
    array: NDArray,
    loan: Arc<Loan>,
}

impl NDArray {
    /// Lends the array to a call of engine `owner` that reads it later (see the module
    /// docs), once no other engine's writes to it are pending.
    ///
    /// # Errors
    /// As [`NDArray::settle`].
    pub(crate) fn lend(&self, owner: usize) -> Result<Lent> {
        // Writes of `owner` itself may be pending: its engine orders them.
        let mut loans = loop {
            let loans = self.inner.loans.lock();
            if !self.foreign_writes(owner) {
                break loans;
            }
            drop(loans);
            self.wait_for_writes_but(owner)?;
        };
        let loan = Arc::new(Loan { owner, state: Mutex::new(State::Lent) });
        if loans.len() >= PRUNE_AT {
            while loans.front().is_some_and(|l| l.is_returned()) {
                loans.pop_front();
                self.inner.lent.fetch_sub(1, Ordering::AcqRel);
            }
        }
        loans.push_back(Arc::clone(&loan));
        self.inner.lent.fetch_add(1, Ordering::AcqRel);
        drop(loans);
        Ok(Lent { array: self.clone(), loan })
    }

    /// Whether a queued call will read this array.
    pub(crate) fn is_lent(&self) -> bool {
        self.inner.lent.load(Ordering::Acquire) != 0 && !self.returned_dropped().is_empty()
    }

    /// The list of loans, without those returned.
    fn returned_dropped(&self) -> parking_lot::MutexGuard<'_, VecDeque<Arc<Loan>>> {
        let mut loans = self.inner.loans.lock();
        let mut dropped = 0;
        loans.retain(|l| {
            let returned = l.is_returned();
            dropped += u32::from(returned);
            !returned
        });
        self.inner.lent.fetch_sub(dropped, Ordering::AcqRel);
        loans
    }

    /// Before a write: every loan not yet read gets a copy of the contents, and loans
    /// being read are waited for (see the module docs for the store's own writes,
    /// which skip this, and a call's user code, which skips the loans of the call it
    /// runs in).
    pub(super) fn reclaim(&self) -> Result<()> {
        let store_thread = current_worker() != 0 || POOL_THREAD.with(Cell::get);
        if (store_thread && !USER_CODE.with(Cell::get)) || !self.is_lent() {
            return Ok(());
        }
        let (me, now) = (thread_token(), running_now());
        // A blocking call running at once here (`run_now`): once its engine's calls made
        // before it are done, that engine's loans left are later calls', made after it
        // took its arrays: those already reading are concurrent with it, and may be
        // waiting for the locks this thread holds.
        if now != 0 && self.returned_dropped().iter().any(|l| l.owner == now) {
            wait_for_calls_before_now();
        }
        self.reclaim_if(|l| {
            let state = l.state.lock();
            let later = now != 0 && l.owner == now && matches!(*state, State::Reading(_));
            !later && (!store_thread || !matches!(*state, State::Reading(t) if t == me))
        })
    }

    /// Before a call that runs at once on this thread uses this array (`written`: as an
    /// out): waits for the writes other stores' queued calls will make to it, and gives
    /// the queued calls it is lent to a copy first when the call writes it. Done here,
    /// on the caller's thread, because the call's work may be shared out over the
    /// store's threads, which do neither.
    pub(crate) fn prepare_for_call(&self, written: bool) -> Result<()> {
        self.settle()?;
        if written { self.reclaim() } else { Ok(()) }
    }

    /// Before queueing a call of engine `owner` that writes this array: the loans of
    /// other engines' calls are reclaimed as [`NDArray::reclaim`] does (`owner`'s own
    /// calls it is lent to run before the call anyway).
    pub(crate) fn reclaim_foreign(&self, owner: usize) -> Result<()> {
        if !self.is_lent() {
            return Ok(());
        }
        self.reclaim_if(|l| l.owner != owner)
    }

    /// Reclaims the loans that `which` picks: copies for those not read yet, waits for
    /// those being read.
    fn reclaim_if(&self, which: impl Fn(&Loan) -> bool) -> Result<()> {
        loop {
            let loan = self.returned_dropped().iter().find(|l| which(l)).cloned();
            let Some(loan) = loan else { return Ok(()) };
            if matches!(*loan.state.lock(), State::Lent) {
                // Copied without holding the loan: the copy may wait for a pending
                // write, and the call must stay free to start meanwhile.
                let copy = self.deep_copy()?;
                let mut state = loan.state.lock();
                if matches!(*state, State::Lent) {
                    *state = State::Copied(CallCopy::new(copy));
                    drop(state);
                    self.unlist(&loan);
                }
                continue;
            }
            // Started reading since it was picked: picked again, or left alone.
            if !which(&loan) {
                continue;
            }
            let _waiting = waits::wait_for(loan.owner, || {
                "a write to an array that a running call of another store (or of this one) reads".to_string()
            })?;
            let mut guard = SETTLED.0.lock();
            while matches!(*loan.state.lock(), State::Reading(_)) {
                SETTLED.1.wait(&mut guard);
            }
        }
    }

    /// Takes `loan` off this array's list (once).
    fn unlist(&self, loan: &Arc<Loan>) {
        let mut loans = self.inner.loans.lock();
        if let Some(i) = loans.iter().position(|l| Arc::ptr_eq(l, loan)) {
            loans.remove(i);
            self.inner.lent.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Lent {
    /// Starts the call's read, on the store's thread: `None` when the call reads the
    /// array itself ([`Lent::array`]; writes to it wait from now until the loan ends),
    /// or the copy made when the caller wrote it first.
    pub(crate) fn start_read(&self) -> Option<NDArray> {
        let mut state = self.loan.state.lock();
        match &*state {
            State::Copied(copy) => Some(copy.0.clone()),
            _ => {
                *state = State::Reading(thread_token());
                None
            }
        }
    }

    /// The array lent.
    pub(crate) fn array(&self) -> &NDArray {
        &self.array
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
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

    /// A stand-in for an engine's id (real ids are addresses, never this small).
    const E: usize = 21;

    #[test]
    fn a_copy_for_a_queued_call_counts_toward_the_copied_bytes_until_dropped() {
        // Other tests copy a few bytes meanwhile: this test's 24,000 stand out.
        const LEN: usize = 24_000;
        const SLACK: usize = 4096;
        let a = NDArray::from_vec(&[3, 1000], (0..3000).map(f64::from).collect::<Vec<_>>()).unwrap();
        let before = copied_bytes();
        let copy = a.copy_for_queued_call().unwrap();
        let with = copied_bytes();
        assert!(with + SLACK >= before + LEN, "{before} then {with}");
        assert_eq!((copy.shape(), copy.dtype()), (a.shape(), a.dtype()));
        assert_eq!(copy.to_vec::<f64>().unwrap(), a.to_vec::<f64>().unwrap());
        a.add_assign(1.0).unwrap();
        assert_eq!(copy.to_vec::<f64>().unwrap()[..2], [0.0, 1.0]);
        let odd = NDArray::from_vec(&[3], vec![1u8, 2, 3]).unwrap().copy_for_queued_call().unwrap();
        assert_eq!(odd.to_vec::<u8>().unwrap(), vec![1, 2, 3]);
        drop((copy, odd));
        assert!(copied_bytes() + LEN <= with + SLACK, "{with} then {}", copied_bytes());
    }

    #[test]
    fn a_write_before_the_read_copies_the_old_contents_for_the_call() {
        let a = NDArray::full(&[4], 1.0).unwrap();
        let lent = a.lend(E).unwrap();
        assert!(a.is_lent());
        a.add_assign(1.0).unwrap(); // no wait: the loan gets a copy
        assert!(!a.is_lent());
        assert_eq!(lent.start_read().expect("a copy").to_vec::<f32>().unwrap(), vec![1.0; 4]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.0; 4]);
        drop(lent);
    }

    #[test]
    fn a_write_while_the_call_reads_waits_until_the_loan_ends() {
        let a = NDArray::full(&[4], 1.0).unwrap();
        let lent = a.lend(E).unwrap();
        assert!(lent.start_read().is_none(), "an unwritten loan reads the array itself");
        let read = lent.array();
        assert!(read.same_storage(&a));
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
    fn returned_loans_stay_listed_until_the_array_is_lent_again_or_looked_at() {
        let a = NDArray::zeros(&[4]).unwrap();
        for _ in 0..100 {
            let lent = a.lend(E).unwrap();
            std::thread::spawn(move || {
                assert!(lent.start_read().is_none());
                drop(lent);
            })
            .join()
            .unwrap();
            // The call's thread left the array's list alone; lending again drops the
            // returned loans once there are a few, so the list does not grow.
            let listed = a.inner.loans.lock().len();
            assert!((1..=PRUNE_AT).contains(&listed), "{listed} loans listed");
        }
        assert!(!a.is_lent());
        assert!(a.inner.loans.lock().is_empty());
    }

    #[test]
    fn a_write_copies_for_unread_loans_and_skips_returned_ones_behind_them() {
        let a = NDArray::full(&[2], 1.0).unwrap();
        let (first, second) = (a.lend(E).unwrap(), a.lend(E).unwrap());
        std::thread::spawn(move || drop(second)).join().unwrap();
        assert!(a.is_lent(), "the first loan is not returned");
        a.add_assign(1.0).unwrap();
        assert_eq!(first.start_read().expect("a copy").to_vec::<f32>().unwrap(), vec![1.0; 2]);
        assert!(!a.is_lent());
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.0; 2]);
    }

    #[test]
    fn the_stores_own_writes_on_its_thread_leave_loans_and_its_user_code_copies_them() {
        let a = NDArray::full(&[2], 1.0).unwrap();
        let lent = a.lend(E).unwrap();
        let on_engine = |user_code: bool, a: NDArray| {
            std::thread::spawn(move || {
                crate::engine::set_current_worker(E);
                match user_code {
                    true => crate::ndarray::as_user_code(|| a.add_assign(1.0)).unwrap(),
                    false => a.add_assign(1.0).unwrap(),
                }
            })
            .join()
            .unwrap();
        };
        // The store's own write (a pull into its out): the engine ordered it.
        on_engine(false, a.clone());
        assert!(a.is_lent(), "a store's own write reclaimed a loan");
        // An updater's write: the loan gets a copy first, as from the caller's thread.
        on_engine(true, a.clone());
        assert!(!a.is_lent(), "user code on the engine's thread did not reclaim the loan");
        assert_eq!(lent.start_read().expect("a copy").to_vec::<f32>().unwrap(), vec![2.0; 2]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![3.0; 2]);
    }

    #[test]
    fn user_code_writes_what_its_own_call_reads_without_waiting_for_itself() {
        let a = NDArray::full(&[2], 1.0).unwrap();
        let lent = a.lend(E).unwrap();
        std::thread::spawn(move || {
            crate::engine::set_current_worker(E);
            assert!(lent.start_read().is_none());
            // The updater of the very call that reads the array writes it.
            crate::ndarray::as_user_code(|| a.add_assign(1.0)).unwrap();
            assert_eq!(lent.array().to_vec::<f32>().unwrap(), vec![2.0; 2]);
        })
        .join()
        .unwrap();
    }
}
