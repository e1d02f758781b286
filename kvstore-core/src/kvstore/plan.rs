//! A call put together before any of its keys is locked: the second stage of every
//! push, pull and pushpull (after `forms.rs` turned the caller's forms into runs and
//! `Store::lookup` found their keys), and what the runners take.
//!
//! A [`Plan`] holds the call's keys grouped (one group per key, a repeated key's arrays
//! in call order, in index order: the order of updates and of locking), the keys to
//! lock with where each group's key is among them, the compression the call's sums use
//! (read once), and the result of every check of the call's arrays: shape and dtype
//! against the key's (kept on its entry and never changed, so read without a lock),
//! context, writable outs, float32 values under compression. The first error is the
//! first value's in key order, else the first out's, else compression's, by
//! construction. A runner takes the plan as it is: it looks nothing up and checks
//! nothing (under `dist_sync` it hands [`Plan::checked`] to the step the workers
//! compare, so that a call refused on one worker fails on all).
//!
//! The keys of a call are found here: `Store::lookup` for a call's runs, [`Lookups`]
//! for the spread runner's first round over a call as given (a batch of keys at a
//! time, on several threads), [`RowsPlan`] for a row-sparse push, whose plan holds its
//! row-sparse values, grouped and checked the same way.

use std::sync::Arc;

use smallvec::SmallVec;

use super::compression::Compression;
use super::data::{Entry, Found, Group, Store, Table};
use super::forms::{Run, Values};
use super::merge;
use super::steps::StepKey;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::{Key, Keys};
use crate::ndarray::{NDArray, RowSparse};

/// A call's keys, grouped and checked, with its lock set (see the module docs).
pub(super) struct Plan<'a> {
    pub(super) op: &'static str,
    /// The pushed keys: one group per key, in index order.
    pub(super) push: Vec<Group<'a>>,
    /// The pulled keys (outs): one group per key, in index order.
    pub(super) pull: Vec<Group<'a>>,
    /// The keys to lock, each once, in index order: `i` is `push[i]`'s key for `i` below
    /// `push.len()`, else `pull[i - push.len()]`'s.
    locks: Vec<usize>,
    /// Where each of `push`'s keys is among the locked ones.
    pub(super) push_slots: Vec<usize>,
    /// Where each of `pull`'s keys is among the locked ones.
    pub(super) pull_slots: Vec<usize>,
    /// The gradient compression of the call's sums, read once: what the workers compare
    /// is what the sums do.
    pub(super) compression: Option<Compression>,
    /// Every check of the call: its first error.
    pub(super) checked: Result<()>,
}

impl<'a> Plan<'a> {
    /// The plan of a call that pushes `push` and pulls `pull` (looked up, in call order).
    pub(super) fn new(store: &Store, op: &'static str, push: Found<'a>, pull: Found<'a>) -> Self {
        let compression = match push.is_empty() {
            true => None,
            false => *store.compression.read(),
        };
        Self::with(op, push, pull, compression)
    }

    /// The plans of a fused batch's calls (`run/fused.rs`), each planned and checked
    /// alone, with the store's compression read once for all: what the workers compare
    /// is what the sums do.
    pub(super) fn batch(store: &Store, calls: Vec<(&'static str, Found<'a>, Found<'a>)>) -> Vec<Self> {
        let compression = *store.compression.read();
        calls.into_iter().map(|(op, push, pull)| Self::with(op, push, pull, compression)).collect()
    }

    fn with(op: &'static str, push: Found<'a>, pull: Found<'a>, compression: Option<Compression>) -> Self {
        let (push, pull) = (Store::group(push), Store::group(pull));
        let (locks, push_slots, pull_slots) = lock_set(&push, &pull);
        let checked = push
            .iter()
            .try_for_each(|g| check_group(op, "value", g))
            .and_then(|()| pull.iter().try_for_each(|g| check_group(op, "out", g)))
            .and_then(|()| merge::compressible(compression, &push));
        Plan { op, push, pull, locks, push_slots, pull_slots, compression, checked }
    }

    /// The bytes the call pushes and pulls (every array of a key has its entry's).
    pub(super) fn bytes(&self) -> (u64, u64) {
        let bytes = |groups: &[Group<'_>]| groups.iter().map(|g| g.arrays.len() as u64 * g.entry.bytes()).sum();
        (bytes(&self.push), bytes(&self.pull))
    }

    /// The keys to lock, in index order.
    pub(super) fn entries(&self) -> Vec<&Arc<Entry>> {
        let n = self.push.len();
        self.locks.iter().map(|&i| if i < n { &self.push[i].entry } else { &self.pull[i - n].entry }).collect()
    }

    /// What the workers of a `dist_sync` store compare of a push: each pushed key with
    /// the shape and dtype of its first value.
    pub(super) fn step_keys(&self) -> Vec<StepKey<'_>> {
        self.push.iter().map(|g| (&g.entry.key, g.arrays[0].shape(), g.arrays[0].dtype())).collect()
    }
}

/// The union of `push`'s and `pull`'s keys (each in index order, each key once) in
/// index order, as positions in `push` then `pull`; and where each group's key is there.
fn lock_set(push: &[Group<'_>], pull: &[Group<'_>]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let n = push.len();
    let mut locks = Vec::with_capacity(n.max(pull.len()));
    let (mut push_slots, mut pull_slots) = (Vec::with_capacity(n), Vec::with_capacity(pull.len()));
    let (mut i, mut j) = (0, 0);
    loop {
        let take_push = match (push.get(i), pull.get(j)) {
            (None, None) => break,
            (Some(p), Some(q)) if p.entry.index == q.entry.index => {
                push_slots.push(locks.len());
                pull_slots.push(locks.len());
                locks.push(i);
                i += 1;
                j += 1;
                continue;
            }
            (Some(p), Some(q)) => p.entry.index < q.entry.index,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if take_push {
            push_slots.push(locks.len());
            locks.push(i);
            i += 1;
        } else {
            pull_slots.push(locks.len());
            locks.push(n + j);
            j += 1;
        }
    }
    (locks, push_slots, pull_slots)
}

pub(super) fn check_context(op: &'static str, key: &Key, a: &NDArray) -> Result<()> {
    crate::device::check_context(a.context()).map_err(|e| match e {
        Error::DeviceUnavailable { context, reason } => {
            Error::DeviceUnavailable { context, reason: format!("{op} of key \"{key}\": {reason}") }
        }
        other => other,
    })
}

/// Checks that an array of shape and dtype `got` may stand for `key`'s value, of shape
/// and dtype `expected`; the error names `key` and `context()` (made only on error).
pub(super) fn check_like(
    context: impl Fn() -> String,
    key: &Key,
    expected: (&[usize], DType),
    got: (&[usize], DType),
) -> Result<()> {
    if got.0 != expected.0 {
        return Err(Error::ShapeMismatch {
            context: context(),
            key: Some(key.clone()),
            expected: expected.0.to_vec(),
            got: got.0.to_vec(),
        });
    }
    if got.1 != expected.1 {
        return Err(Error::DTypeMismatch {
            context: context(),
            key: Some(key.clone()),
            expected: expected.1,
            got: got.1,
        });
    }
    Ok(())
}

/// What a call's arrays must be like: their key's (from its entry, without a lock), or
/// an array's (the value a spread call locked, a broadcast's value).
#[derive(Clone, Copy)]
pub(super) enum Like<'x> {
    Key(&'x Entry),
    Array(&'x NDArray),
}

impl Like<'_> {
    /// Whether `a` has the shape and dtype (reading only `a`'s first cache line, and
    /// the other array's, when both have one dimension).
    fn fits(self, a: &NDArray) -> bool {
        match self {
            Like::Key(e) => e.fits(a),
            Like::Array(v) => a.dtype() == v.dtype() && a.same_shape(v),
        }
    }

    /// Whether `a` passes [`check_arrays`] as one of the call's values (`out` false) or
    /// outs, and is ready on the host: no write pending, and an out not lent. A
    /// spread call's common case, told in one pass over `a`'s first cache line; an
    /// array for which it is false goes through the checks one by one.
    #[inline]
    pub(super) fn fits_ready(self, a: &NDArray, out: bool) -> bool {
        !a.on_device() && self.fits(a) && !a.is_pending() && !(out && (a.is_read_only() || a.is_lent()))
    }

    fn shape_dtype(&self) -> (&[usize], DType) {
        match self {
            Like::Key(e) => e.like(),
            Like::Array(v) => (v.shape(), v.dtype()),
        }
    }
}

/// Checks that every one of `key`'s `arrays` may stand for its value, of the shape and
/// dtype of `expected`, and, for outs (`what` "out"), that it may be written (see
/// [`NDArray::from_foreign`]): a call with a read-only out fails before its push.
pub(super) fn check_arrays<'x>(
    op: &'static str,
    what: &str,
    key: &Key,
    arrays: impl Iterator<Item = &'x NDArray> + Clone,
    expected: Like<'_>,
) -> Result<()> {
    for (i, a) in arrays.clone().enumerate() {
        if a.on_device() {
            check_context(op, key, a)?;
        }
        let context = || {
            let n = arrays.clone().count();
            if n == 1 {
                format!("{op} of key \"{key}\" ({what})")
            } else {
                format!("{op} of key \"{key}\" ({what} {} of {n})", i + 1)
            }
        };
        if !expected.fits(a) {
            check_like(context, key, expected.shape_dtype(), (a.shape(), a.dtype()))?;
        }
        if what == "out" && a.is_read_only() {
            return Err(Error::invalid_argument(format!("{}: the out is read-only", context())));
        }
    }
    Ok(())
}

/// Checks every array of `group` against its key (see [`check_arrays`]): no lock is
/// taken, as a key's shape and dtype never change.
pub(super) fn check_group(op: &'static str, what: &str, group: &Group<'_>) -> Result<()> {
    let e = &group.entry;
    check_arrays(op, what, &e.key, group.arrays.iter().copied(), Like::Key(e))
}

/// A row-sparse push put together before any of its keys is locked, as a [`Plan`] is:
/// its keys found once (a key not in the store, the first in call order, is the call's
/// error), grouped by key in index order (the order of updates and of locking; a key
/// given twice has its values in call order), and every value checked against its key
/// (shape, dtype, at least one value per key), the first error in key order. The
/// runner locks its keys together (`Store::push_rows`).
pub(super) struct RowsPlan {
    pub(super) keys: Vec<(Arc<Entry>, Vec<RowSparse>)>,
    /// Every check of the call: its first error.
    pub(super) checked: Result<()>,
}

impl RowsPlan {
    /// The plan of a row-sparse push of `pushes` (each key with its values, in call
    /// order); `Err` for a key not in the store.
    pub(super) fn new(store: &Store, pushes: &[(Key, Vec<RowSparse>)]) -> Result<Self> {
        const OP: &str = "push";
        let mut keys: Vec<(Arc<Entry>, Vec<RowSparse>)> = Vec::with_capacity(pushes.len());
        let table = store.table.read();
        for (key, values) in pushes {
            let entry =
                store.entry(&table, key).ok_or_else(|| Error::KeyNotInitialized { op: OP, key: key.clone() })?;
            keys.push((Arc::clone(entry), values.clone()));
        }
        drop(table);
        // (Stable: a key's values stay in call order.)
        keys.sort_by_key(|(e, _)| e.index);
        keys.dedup_by(|later, earlier| {
            let same = later.0.index == earlier.0.index;
            if same {
                earlier.1.append(&mut later.1);
            }
            same
        });
        let checked = keys.iter().try_for_each(|(entry, values)| {
            let key = &entry.key;
            let context = || format!("push_row_sparse of key \"{key}\"");
            if values.is_empty() {
                return Err(Error::LengthMismatch { context: context(), what: "values", expected: 1, got: 0 });
            }
            values.iter().try_for_each(|v| check_like(context, key, entry.like(), (v.shape(), v.dtype())))
        });
        Ok(RowsPlan { keys, checked })
    }

    /// The keys to lock, in index order.
    pub(super) fn entries(&self) -> Vec<&Arc<Entry>> {
        self.keys.iter().map(|(e, _)| e).collect()
    }
}

/// Keys looked up together before the first of them is locked. A lock is a barrier for
/// the core's loads, so lookups made between locks take their cache misses one at a
/// time (with 100,000 keys, a list push spent a quarter of its time in them).
pub(super) const LOOKED_UP: usize = 16;

/// The store's table of keys, read, for the plan of a call as given built a piece at a
/// time on several threads (the spread runner's first round, `run/pieces.rs`): each
/// piece finds its keys here, `LOOKED_UP` at a time; the plan's groups, checks and
/// first error are then [`Plan::new`]'s, from the entries found. Held for that round
/// only: the entries live as long as the store, and a call waiting for an out must not
/// keep an `init` waiting.
pub(super) struct Lookups<'s> {
    store: &'s Store,
    table: parking_lot::RwLockReadGuard<'s, Table>,
}

impl<'s> Lookups<'s> {
    pub(super) fn new(store: &'s Store) -> Self {
        Lookups { store, table: store.table.read() }
    }

    /// The entries of `keys` (at most [`LOOKED_UP`]) into `out`, `None` for a key not
    /// in the store; each entry's first line (index, shape, lock) loaded now, the loads
    /// overlapping, not one at a time between the locks that follow.
    pub(super) fn ahead<'k>(
        &self,
        keys: impl Iterator<Item = &'k Key>,
        out: &mut SmallVec<[Option<&'s Arc<Entry>>; LOOKED_UP]>,
    ) {
        out.clear();
        out.extend(keys.map(|key| self.store.entry(&self.table, key)));
        let lines = out.iter().flatten().fold(0, |acc, e| acc ^ e.index);
        std::hint::black_box(lines);
    }
}

impl Store {
    /// Finds each run's entry; [`Store::group`] then groups them by key (values in
    /// call order), sorted by internal index, the order of updates and of locking.
    ///
    /// One table lookup per key as given (a key given again right after is looked up
    /// once), then a stable sort by index (linear when the keys come in the order they
    /// were initialised, as lists of parameters do), so a key's values stay in call
    /// order and repeated keys end up next to each other.
    pub(super) fn lookup<'a>(&self, op: &'static str, runs: Vec<Run<'a>>) -> Result<Found<'a>> {
        let table = self.table.read();
        let mut found: Found<'a> = Vec::with_capacity(runs.len());
        for (key, arrays) in runs {
            let entry = match found.last() {
                Some(last) if last.entry.key == key => Arc::clone(&last.entry),
                _ => match self.entry(&table, &key) {
                    Some(entry) => Arc::clone(entry),
                    None => return Err(Error::KeyNotInitialized { op, key }),
                },
            };
            found.push(Group { entry, arrays: arrays.iter().collect() });
        }
        Ok(found)
    }

    /// The groups of `found` (see [`Store::lookup`]).
    pub(super) fn group(mut found: Found<'_>) -> Vec<Group<'_>> {
        // Keys in the order they were initialised, each once (lists of parameters):
        // already the groups.
        if found.is_sorted_by(|a, b| a.entry.index < b.entry.index) {
            return found;
        }
        found.sort_by_key(|g| g.entry.index);
        let mut groups: Vec<Group<'_>> = Vec::with_capacity(found.len());
        for g in found {
            match groups.last_mut() {
                Some(last) if last.entry.index == g.entry.index => last.arrays.extend(g.arrays),
                _ => groups.push(g),
            }
        }
        groups
    }

    /// Keys of a call that come with no array (an empty list of values or outs) must
    /// still be initialised, as with any other call on them.
    pub(super) fn require_bare_keys(&self, op: &'static str, keys: &Keys, arrays: Values<'_>) -> Result<()> {
        let bare: Vec<&Key> = match (keys, arrays) {
            (Keys::One(k), Values::Many([])) => vec![k],
            (Keys::Many(ks), Values::Nested(vss)) => {
                ks.iter().zip(vss).filter(|(_, vs)| vs.is_empty()).map(|(k, _)| k).collect()
            }
            _ => return Ok(()),
        };
        let table = self.table.read();
        match bare.into_iter().find(|k| !table.contains_key(k)) {
            Some(k) => Err(Error::KeyNotInitialized { op, key: k.clone() }),
            None => Ok(()),
        }
    }
}
