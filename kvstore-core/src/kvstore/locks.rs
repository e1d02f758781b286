//! Key locking: which keys a call holds, in which order it locks them, and the
//! re-entrancy rule for updaters (a call from an updater on the store that runs it
//! fails instead of waiting for itself).

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::data::{Entry, Merger, Slot, Store};
use crate::error::{Error, Result};
use crate::key::Key;

thread_local! {
    /// The keys this thread has locked, as (store address, key index): an updater runs
    /// while its push holds the push's keys, and a call from it on one of those keys
    /// must fail instead of waiting for itself forever. [`Held`] values live on the
    /// stack, so entries are added and removed last in, first out.
    static HELD: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
    /// The length of [`HELD`] at which a call on another store may wait (see
    /// [`nested_call`]).
    static MAY_WAIT_AT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `f`, a store's call on another store that never calls back into it (a
/// `dist_async` worker's call on its own share), as if no key were held: it may wait
/// for that store's keys. Calls nested deeper (from that store's updaters) are
/// refused or locked without waiting, as ever.
pub(super) fn nested_call<T>(f: impl FnOnce() -> T) -> T {
    let at = HELD.with(|held| held.borrow().len());
    let before = MAY_WAIT_AT.with(|m| m.replace(Some(at)));
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            MAY_WAIT_AT.with(|m| m.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// Whether this thread holds keys it must not wait behind (it holds keys of a store
/// and is not in a [`nested_call`] at that depth).
fn holds_keys(held: &[(usize, usize)]) -> bool {
    !held.is_empty() && MAY_WAIT_AT.with(|m| m.get()) != Some(held.len())
}

/// Whether this thread holds keys it must not wait behind ([`holds_keys`]).
pub(super) fn holds_any_keys() -> bool {
    HELD.with(|held| holds_keys(&held.borrow()))
}

/// Marks keys as locked by this thread until dropped, and decides how to lock them.
///
/// An updater runs while its push holds the push's keys and the store's merger. A call
/// from it on the same store fails: it could wait for itself, or for another thread
/// that waits for the keys it holds. A call from it on another store locks without
/// waiting (and fails if a key or the merger is busy), so that two stores whose
/// updaters call each other cannot deadlock.
///
/// Lock order: the store's merger (when the call takes it) before its keys, keys in
/// index order; nothing waits for the merger while holding keys.
pub(super) struct Held {
    /// The length of [`HELD`] before this call's keys were added.
    mark: usize,
    /// Whether this thread already holds keys (of another store): lock without waiting.
    nonblocking: bool,
}

/// The error of a call from inside an updater on the store that runs it.
fn reentry(op: &'static str) -> Error {
    Error::invalid_argument(format!(
        "{op} from inside an updater of this store: a push holds its keys until its updates \
         finish, so an updater may not call the store that runs it"
    ))
}

/// Fails when this thread runs an updater of `store` (checked before a call is queued,
/// which would otherwise wait behind the push that runs the updater).
pub(super) fn check_reentry(op: &'static str, store: &Store) -> Result<()> {
    let store = store as *const Store as usize;
    match HELD.with(|held| held.borrow().iter().any(|&(s, _)| s == store)) {
        true => Err(reentry(op)),
        false => Ok(()),
    }
}

/// Whether this thread runs an updater (of any store): it may then not wait for another
/// store's calls.
pub(super) fn inside_updater() -> bool {
    HELD.with(|held| holds_keys(&held.borrow()))
}

/// The error of a call from an updater on another store whose keys are busy.
pub(super) fn busy_store(op: &'static str) -> Error {
    Error::invalid_argument(format!(
        "{op} from inside an updater of another store: that store's keys are busy with earlier calls, and an \
         updater may not wait for them (two stores' updaters could wait for each other)"
    ))
}

impl Held {
    pub(super) fn new(op: &'static str, store: &Store, entries: &[&Arc<Entry>]) -> Result<Self> {
        let store = store as *const Store as usize;
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if held.iter().any(|&(s, _)| s == store) {
                return Err(reentry(op));
            }
            let mark = held.len();
            let nonblocking = holds_keys(&held);
            // A call with no key (set_updater, ...) still marks the store, so that its
            // own nested calls are refused too.
            if entries.is_empty() {
                held.push((store, usize::MAX));
            }
            held.extend(entries.iter().map(|e| (store, e.index)));
            Ok(Held { mark, nonblocking })
        })
    }

    fn busy(op: &'static str, key: &Key) -> Error {
        Error::invalid_argument(format!(
            "{op} of key \"{key}\" from inside an updater of another store: the key is busy, and an updater \
             may not wait for a key (two stores' updaters could wait for each other)"
        ))
    }

    fn merger_busy(op: &'static str) -> Error {
        Error::invalid_argument(format!(
            "{op} from inside an updater of another store: that store is busy (a push, or a change of its \
             updater or optimizer, is running), and an updater may not wait for it"
        ))
    }

    /// The store's merger, shared: what pushes hold for their whole duration, so that
    /// the updater or optimizer they started with stays installed until they end.
    pub(super) fn merger_read<'a>(
        &self,
        op: &'static str,
        m: &'a RwLock<Merger>,
    ) -> Result<RwLockReadGuard<'a, Merger>> {
        match self.nonblocking {
            false => Ok(m.read()),
            true => m.try_read().ok_or_else(|| Self::merger_busy(op)),
        }
    }

    /// The store's merger, exclusive: waits for the pushes in flight.
    pub(super) fn merger_write<'a>(
        &self,
        op: &'static str,
        m: &'a RwLock<Merger>,
    ) -> Result<RwLockWriteGuard<'a, Merger>> {
        match self.nonblocking {
            false => Ok(m.write()),
            true => m.try_write().ok_or_else(|| Self::merger_busy(op)),
        }
    }

    /// Read locks on `entries`, in order.
    pub(super) fn read<'a>(
        &self,
        op: &'static str,
        entries: &[&'a Arc<Entry>],
    ) -> Result<Vec<RwLockReadGuard<'a, Slot>>> {
        entries
            .iter()
            .map(|e| match self.nonblocking {
                false => Ok(e.value.read()),
                true => e.value.try_read().ok_or_else(|| Self::busy(op, &e.key)),
            })
            .collect()
    }

    /// Write locks on `entries`, in order.
    pub(super) fn write<'a>(
        &self,
        op: &'static str,
        entries: &[&'a Arc<Entry>],
    ) -> Result<Vec<RwLockWriteGuard<'a, Slot>>> {
        entries
            .iter()
            .map(|e| match self.nonblocking {
                false => Ok(e.value.write()),
                true => e.value.try_write().ok_or_else(|| Self::busy(op, &e.key)),
            })
            .collect()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|held| held.borrow_mut().truncate(self.mark));
    }
}
