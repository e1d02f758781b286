//! A call of many small keys spread over the comm's threads, each thread taking whole
//! keys: it locks, sums and copies them where it is, instead of the caller doing the
//! per-key bookkeeping of every key alone while the other threads wait for the sums.
//!
//! It does what the inline runner does for the same call, in two rounds over the same
//! pieces of the call's keys (`Comm::share_keys`): first every key is locked (without
//! waiting), then, when every key is held, the sums and copies, each piece unlocked
//! when done. A key that another call holds, or anything this path does not do, hands
//! the call back, with every lock released and nothing changed, to the inline runner,
//! which waits for locks in key order: no lock is ever waited for here, so no deadlock
//! can come of taking locks on several threads at once.
//!
//! A call comes here once, in one of two ways. A planned call (queued, or run at once
//! behind a busy engine) comes with its plan. A blocking call on an idle engine comes
//! as its caller gave it, and the first round finds its keys through the plan's
//! lookups (`plan::Lookups`, each thread holding the store's table of keys for that
//! round only: the entries live as long as the store, and a call waiting for an out in
//! the second round must not keep an `init` waiting) and asks the plan's checks whether
//! it may run here, as well as locking them. A call that ran into anything (a failed
//! check, a busy key, a key given twice that a push locks twice, aliased arrays) is
//! handed back with its keys as found, in call order; its plan ([`Plan::new`]) then
//! groups and checks them and names the first error, as for any call, and the inline
//! runner runs it. A key not in the store (or pulled keys that are not the pushed
//! ones) hands back nothing: the ordinary path looks the keys up and names the first
//! unknown one. (Keys in another order are no reason to hand a call back: the
//! try-locks need no order, and each key's sum and copy is its own.)

use std::ops::Range;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::comm::{BroadcastJob, CLAIM_KEYS, Claims, ReduceJob};
use crate::error::Result;
use crate::kvstore::data::{Entry, Found, Group, Merger, Slot, Store};
use crate::kvstore::forms::Run;
use crate::kvstore::locks;
use crate::kvstore::plan::{LOOKED_UP, Like, Lookups, Plan, check_arrays};
use crate::kvstore::stats::Phase;
use crate::ndarray::{NDArray, overlapping_uses, used_twice};
use crate::timeline::{self, Arg};

/// Keys whose arrays a piece gathers at a time to sum and copy them.
const GATHERED: usize = 8;

/// The arrays of `GATHERED` keys, one after another: room for a few per key (one per
/// device, and an out) without a heap allocation.
type Gathered<'a> = SmallVec<[&'a NDArray; 64]>;

/// The keys of a call as the spread runner reads them.
#[derive(Clone, Copy)]
enum Source<'k, 'a> {
    /// A plan's groups: one per key, the same keys pushed and pulled (or one side empty).
    Planned { push: &'k [Group<'a>], pull: &'k [Group<'a>] },
    /// A call's runs as its caller gave them, to be looked up: the first round builds
    /// their groups.
    Given { push: &'k [Run<'a>], pull: &'k [Run<'a>] },
}

impl<'k, 'a> Source<'k, 'a> {
    fn len(self) -> usize {
        match self {
            Source::Planned { push, pull } => push.len().max(pull.len()),
            Source::Given { push, pull, .. } => push.len().max(pull.len()),
        }
    }

    /// Key `i`'s number of values, of outs, and its first array.
    fn counts(self, i: usize) -> (usize, usize, Option<&'a NDArray>) {
        match self {
            Source::Planned { push, pull } => {
                let (v, o) = (push.get(i).map_or(&[][..], |g| &g.arrays), pull.get(i).map_or(&[][..], |g| &g.arrays));
                (v.len(), o.len(), v.first().or(o.first()).copied())
            }
            Source::Given { push, pull, .. } => {
                let (v, o) = (push.get(i).map_or(&[][..], |r| r.1), pull.get(i).map_or(&[][..], |r| r.1));
                (v.len(), o.len(), v.first().or(o.first()))
            }
        }
    }

    /// Whether the call uses one array twice in a way whose order matters (see
    /// [`used_twice`]).
    fn used_twice(self) -> bool {
        match self {
            Source::Planned { push, pull } => used_twice((0..self.len()).map(|i| {
                let side = |gs: &'k [Group<'a>]| gs.get(i).map_or(&[][..], |g| &g.arrays[..]).iter().copied();
                (side(push), side(pull))
            })),
            Source::Given { push, pull, .. } => used_twice((0..self.len()).map(|i| {
                let side = |rs: &'k [Run<'a>]| rs.get(i).map_or(&[][..], |r| r.1).iter();
                (side(push), side(pull))
            })),
        }
    }

    /// Whether different arrays of the call overlap in memory, one of them written (see
    /// [`overlapping_uses`]).
    fn overlapping(self) -> bool {
        match self {
            Source::Planned { push, pull } => {
                let arrays = |gs: &'k [Group<'a>]| gs.iter().flat_map(|g| g.arrays.iter().copied());
                overlapping_uses(arrays(push), arrays(pull))
            }
            Source::Given { push, pull, .. } => {
                let arrays = |rs: &'k [Run<'a>]| rs.iter().flat_map(|r| r.1.iter());
                overlapping_uses(arrays(push), arrays(pull))
            }
        }
    }
}

/// One key's values or outs in a piece: a plan's group's, or a run's as given.
#[derive(Clone, Copy)]
enum Side<'k, 'a> {
    Grouped(&'k [&'a NDArray]),
    Given(&'a [NDArray]),
}

impl<'k, 'a> Side<'k, 'a> {
    fn of_group(g: Option<&'k Group<'a>>) -> Self {
        Side::Grouped(g.map_or(&[][..], |g| &g.arrays))
    }

    fn of_run(r: Option<&'k Run<'a>>) -> Self {
        Side::Given(r.map_or(&[][..], |r| r.1))
    }

    fn is_empty(self) -> bool {
        self.count() == 0
    }

    fn count(self) -> usize {
        match self {
            Side::Grouped(arrays) => arrays.len(),
            Side::Given(arrays) => arrays.len(),
        }
    }

    fn iter(self) -> impl Iterator<Item = &'a NDArray> + Clone {
        let (grouped, given) = match self {
            Side::Grouped(arrays) => (arrays, &[][..]),
            Side::Given(arrays) => (&[][..], arrays),
        };
        grouped.iter().copied().chain(given)
    }

    /// Whether `f` holds for every array (one slice's loop, not `iter`'s chain).
    #[inline]
    fn all(self, f: impl Fn(&NDArray) -> bool) -> bool {
        match self {
            Side::Grouped(arrays) => arrays.iter().all(|a| f(a)),
            Side::Given(arrays) => arrays.iter().all(f),
        }
    }

    /// Appends the arrays to `to`, and says where they are there.
    #[inline]
    fn gather(self, to: &mut Gathered<'a>) -> Range<usize> {
        let start = to.len();
        match self {
            Side::Grouped(arrays) => to.extend_from_slice(arrays),
            Side::Given(arrays) => to.extend(arrays),
        }
        start..to.len()
    }
}

/// What the first round made of one key of a piece: its entry and, when it was
/// locked, its guard.
struct Held<'k, G> {
    entry: &'k Arc<Entry>,
    guard: Option<G>,
}

/// What the first round made of one piece: its keys that are in the store, in call
/// order. Without a heap allocation (a piece has at most `CLAIM_KEYS` keys); written
/// where it lies, each key's entry beside its guard, so that a piece of a few large
/// keys touches a line or two of it, not one per field.
type Piece<'k, G> = SmallVec<[Held<'k, G>; CLAIM_KEYS]>;

/// What became of a blocking call offered to the spread runner before its keys were
/// looked up ([`Store::spread_given`]).
pub(in crate::kvstore) enum Given<'a> {
    /// It ran here, with this result.
    Ran(Result<()>),
    /// It is not a call this path runs (one key, too little work to share, a store
    /// with a worker group or another merger), or a key of it is not in the store: its
    /// keys are yet to be looked up (and the first unknown one named, by the plan).
    NotOne,
    /// Handed back, with nothing changed and no lock held: its keys as the first round
    /// found them, in call order, for its plan ([`Plan::new`], which checks them and
    /// names the first error).
    LookedUp { push: Found<'a>, pull: Found<'a> },
}

impl Store {
    /// Runs a planned call spread over the comm's threads; `None`, with nothing
    /// changed and no lock held, when it is not a call this path runs or a key is busy.
    ///
    /// The calls it runs: on a store with no worker group and the default merger (a push
    /// only sums), host arrays, every key with at least one array, and a pull of the
    /// same keys as the push, if both; the comm decides whether there is enough work to
    /// share ([`crate::comm::Comm::share_keys`]). A thread that runs an updater takes
    /// the ordinary path, which knows how such a call may lock.
    pub(in crate::kvstore) fn spread(&self, plan: &Plan<'_>) -> Option<Result<()>> {
        let (push, pull) = (&plan.push[..], &plan.pull[..]);
        let same_keys = push.is_empty()
            || pull.is_empty()
            || (push.len() == pull.len() && push.iter().zip(pull).all(|(a, b)| a.entry.index == b.entry.index));
        if !same_keys {
            return None;
        }
        match self.spread_keys(plan.op, Source::Planned { push, pull }) {
            Given::Ran(r) => Some(r),
            _ => None,
        }
    }

    /// [`Store::spread`] of a blocking call's keys as given, its plan built by the
    /// first round (see the module docs). For a caller that runs the call at once (its
    /// engine has nothing queued).
    pub(in crate::kvstore) fn spread_given<'a>(
        &self,
        op: &'static str,
        push: &[Run<'a>],
        pull: &[Run<'a>],
    ) -> Given<'a> {
        // Short calls are not looked at further.
        if !(push.is_empty() || pull.is_empty() || push.len() == pull.len()) || push.len().max(pull.len()) < 2 {
            return Given::NotOne;
        }
        self.spread_keys(op, Source::Given { push, pull })
    }

    fn spread_keys<'k, 'a>(&'k self, op: &'static str, keys: Source<'k, 'a>) -> Given<'a> {
        // One key is no call to spread (and the common blocking call: it should cost
        // no more than these comparisons here).
        if keys.len() < 2 || self.collective.is_some() || self.remote.is_some() || locks::inside_updater() {
            return Given::NotOne;
        }
        // A push holds the merger for the whole call (it only sums: the default merger;
        // with compression it quantises its values on the ordinary path). A pull never
        // reads it, and holds nothing that `set_updater` waits for while it waits for
        // its outs.
        let pushes = keys.counts(0).0 > 0;
        let merger = match pushes {
            true => match self.merger.try_read() {
                Some(m) if matches!(*m, Merger::Assign) && self.compression.read().is_none() => Some(m),
                _ => return Given::NotOne,
            },
            false => None,
        };
        let sizes: Vec<usize> = (0..keys.len())
            .map(|i| {
                let (values, outs, first) = keys.counts(i);
                first.map_or(0, |a| a.size() * a.dtype().size() * (values + outs + 1))
            })
            .collect();
        let r = match pushes {
            false => self.spread_locked(op, &sizes, keys, |e: &Entry| e.value.try_read()),
            true => self.spread_locked(op, &sizes, keys, |e: &Entry| e.value.try_write()),
        };
        drop(merger);
        #[cfg(test)]
        tests::TAKEN.with(|t| t.set(t.get() + usize::from(matches!(r, Given::Ran(_)))));
        r
    }

    /// [`Store::spread_keys`] with the keys locked by `lock` (shared for a pull,
    /// exclusive when the call pushes).
    ///
    /// In a first round the threads take pieces of the keys (building their groups,
    /// for a call as given), lock them, and leave each piece's guards in its place;
    /// when every piece is locked and nothing came up, they take the pieces again to
    /// sum and copy them, and unlock each piece when it is done. No key is unlocked
    /// before every key is locked, so the call still takes effect at once for other
    /// calls.
    fn spread_locked<'k, 'a, G: std::ops::Deref<Target = Slot> + Send + Sync>(
        &'k self,
        op: &'static str,
        sizes: &[usize],
        keys: Source<'k, 'a>,
        lock: impl Fn(&'k Entry) -> Option<G> + Sync,
    ) -> Given<'a> {
        // Set when anything came up: the round goes on building the plan, but locks
        // nothing more, and the call is handed back.
        let stop = AtomicBool::new(false);
        let stopped = || stop.store(true, Ordering::Relaxed);
        // The pieces run in no set order, each summing and copying its keys in turn: a
        // call whose outs alias each other or other keys' values needs the ordinary
        // path's order (every sum before any copy, outs written in order), and so does
        // one with different arrays over the same memory (views of one buffer that a
        // binding wrapped one by one), one of them written.
        if keys.counts(0).1 > 0 && (keys.used_twice() || keys.overlapping()) {
            stopped();
        }
        // Locks a key whose arrays are `values` and `outs`, unless something came up;
        // `on_host` when its arrays are known to be host arrays.
        let take = |entry: &'k Entry, values: Side<'_, '_>, outs: Side<'_, '_>, on_host: bool| -> Option<G> {
            let host = on_host || (values.all(|a| !a.on_device()) && outs.all(|a| !a.on_device()));
            let unfit = (values.is_empty() && outs.is_empty()) || !host;
            if unfit {
                stopped();
                return None;
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let guard = lock(entry).filter(|g| !g.value.on_device());
            if guard.is_none() {
                stopped();
            }
            guard
        };
        // Locks the keys of `range` of a planned call.
        let lock_planned =
            |push: &'k [Group<'a>], pull: &'k [Group<'a>], range: Range<usize>, piece: &mut Piece<'k, G>| {
                for i in range {
                    let (values, outs) = (Side::of_group(push.get(i)), Side::of_group(pull.get(i)));
                    let entry = push.get(i).or(pull.get(i)).map(|g| &g.entry).expect("a key of the call");
                    piece.push(Held { entry, guard: take(entry, values, outs, false) });
                }
            };
        // A call as given whose pulled keys are not its pushed ones (a key with no
        // value, another with no out), or with a key not in the store: the ordinary
        // path looks them up (and names the first unknown key).
        let unplanned = AtomicBool::new(false);
        // The bytes of a call as given, pushed and pulled: counted once it ran.
        let bytes = [AtomicU64::new(0), AtomicU64::new(0)];
        // Finds (through the plan's lookups), checks and locks the keys of `range` of a
        // call as given.
        let build = |lookups: &Lookups<'k>,
                     push: &'k [Run<'a>],
                     pull: &'k [Run<'a>],
                     range: Range<usize>,
                     piece: &mut Piece<'k, G>| {
            let mut looked_up = SmallVec::new();
            let mut moved = [0u64; 2];
            for i in range.clone() {
                let ahead = (i - range.start) % LOOKED_UP;
                if ahead == 0 {
                    let keys = (i..range.end.min(i + LOOKED_UP))
                        .map(|k| &push.get(k).or(pull.get(k)).expect("a key of the call").0);
                    lookups.ahead(keys, &mut looked_up);
                }
                let (pushed, pulled) = (push.get(i), pull.get(i));
                let other_keys = matches!((pushed, pulled), (Some(p), Some(q)) if p.0 != q.0);
                let Some(entry) = looked_up[ahead].filter(|_| !other_keys) else {
                    unplanned.store(true, Ordering::Relaxed);
                    stopped();
                    continue;
                };
                let (values, outs) = (Side::of_run(pushed), Side::of_run(pulled));
                let like = Like::Key(entry);
                let ready = values.all(|a| like.fits_ready(a, false)) && outs.all(|a| like.fits_ready(a, true));
                if !ready {
                    // A failed check hands the call back (its plan names the first error);
                    // so does an array that is pending, or an out that is lent: the
                    // ordinary path makes it ready (it waits for the one and copies the
                    // other first).
                    let failed = [("value", values), ("out", outs)]
                        .into_iter()
                        .any(|(what, arrays)| !arrays.is_empty() && check(op, what, entry, arrays).is_err());
                    if failed
                        || values.iter().any(|a| a.is_pending())
                        || outs.iter().any(|a| a.is_pending() || a.is_lent())
                    {
                        stopped();
                    }
                }
                let each = entry.bytes();
                moved[0] += values.count() as u64 * each;
                moved[1] += outs.count() as u64 * each;
                piece.push(Held { entry, guard: take(entry, values, outs, ready) });
            }
            for (total, m) in bytes.iter().zip(moved) {
                total.fetch_add(m, Ordering::Relaxed);
            }
        };
        // A push only sums, a pull only copies; a pushpull does both, alternating every
        // few keys: its sums and copies are timed a few keys at a time (two clock reads),
        // the others' as a whole.
        let (values, outs, _) = keys.counts(0);
        let (split, pushes) = (values > 0 && outs > 0, values > 0);
        // Sums and copies the keys of a piece, `held` (each locked): `sides(i)` are the
        // values and outs of its `i`th key. `took`: the time spent summing and copying,
        // added to when `split`.
        let run = |sides: &dyn Fn(usize) -> (Side<'k, 'a>, Side<'k, 'a>),
                   held: &[Held<'k, G>],
                   took: &mut [u64; 2]|
         -> Result<()> {
            let mut at = if split { timeline::now() } else { 0 };
            // A few keys at a time, their arrays gathered on the stack.
            for (start, held) in (0..held.len()).step_by(GATHERED).zip(held.chunks(GATHERED)) {
                let slots: SmallVec<[&Slot; GATHERED]> =
                    held.iter().map(|h| h.guard.as_deref().expect("a key locked in the first round")).collect();
                let mut arrays = Gathered::new();
                let spans: SmallVec<[(Range<usize>, Range<usize>); GATHERED]> = (start..start + held.len())
                    .map(|i| {
                        let (values, outs) = sides(i);
                        (values.gather(&mut arrays), outs.gather(&mut arrays))
                    })
                    .collect();
                let keys = || {
                    spans
                        .iter()
                        .map(|(values, outs)| (&arrays[values.clone()], &arrays[outs.clone()]))
                        .zip(slots.iter().copied())
                };
                let jobs: SmallVec<[ReduceJob<'_>; GATHERED]> = keys()
                    .filter(|((values, _), _)| !values.is_empty())
                    .map(|((values, _), slot)| ReduceJob { inputs: values, out: &slot.value })
                    .collect();
                self.comm.reduce(&jobs)?;
                let summed = if split { timeline::now() } else { 0 };
                let jobs: SmallVec<[BroadcastJob<'_>; GATHERED]> = keys()
                    .filter(|((_, outs), _)| !outs.is_empty())
                    .map(|((_, outs), slot)| BroadcastJob { src: &slot.value, outs })
                    .collect();
                self.comm.broadcast(&jobs)?;
                if split {
                    let copied = timeline::now();
                    took[0] += summed - at;
                    took[1] += copied - summed;
                    at = copied;
                }
            }
            Ok(())
        };
        // Each piece's result, from the round that builds and locks it to the round
        // that runs it (or to the hand-back).
        let placed: OnceLock<Vec<Mutex<Piece<'k, G>>>> = OnceLock::new();
        let work = |claims: &dyn Claims| -> Result<()> {
            let placed = placed.get_or_init(|| (0..claims.pieces()).map(|_| Mutex::default()).collect());
            // The table is held while the keys are looked up, not while the call waits
            // (at the barrier, or for its arrays): every lock of the round is tried.
            let lookups = matches!(keys, Source::Given { .. }).then(|| Lookups::new(self));
            while let Some((p, range)) = claims.next() {
                // Made in its place: a piece has room for `CLAIM_KEYS` keys, mostly unused.
                let piece = &mut *placed[p].lock();
                match keys {
                    Source::Planned { push, pull } => lock_planned(push, pull, range, piece),
                    Source::Given { push, pull } => {
                        build(lookups.as_ref().expect("the lookups"), push, pull, range, piece)
                    }
                }
            }
            drop(lookups);
            // Every key of the call is locked (unless something came up).
            if !claims.all_done() || stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            // This thread's part of the call: its time summing and copying, its keys.
            let (start, mut took, mut ran) = (timeline::now(), [0u64; 2], 0);
            let mut result = Ok(());
            while let Some((p, range)) = claims.next() {
                let mut piece = placed[p].lock();
                let sides = |i: usize| match keys {
                    Source::Planned { push, pull } => {
                        (Side::of_group(push.get(range.start + i)), Side::of_group(pull.get(range.start + i)))
                    }
                    Source::Given { push, pull, .. } => {
                        (Side::of_run(push.get(range.start + i)), Side::of_run(pull.get(range.start + i)))
                    }
                };
                ran += piece.len();
                result = run(&sides, &piece, &mut took);
                piece.clear();
                if result.is_err() {
                    break;
                }
            }
            let end = timeline::now();
            if !split {
                took[usize::from(!pushes)] = end - start;
            }
            self.counters.add(Phase::Sum, took[0]);
            self.counters.add(Phase::Copy, took[1]);
            if timeline::recording() && ran > 0 {
                // One event for the thread's part: its sums and copies alternate.
                let us = |ns: u64| Arg::F(ns as f64 / 1e3);
                let args = vec![("keys", Arg::U(ran as u64)), ("sum_us", us(took[0])), ("copy_us", us(took[1]))];
                timeline::complete("spread", "phase", start, end, args);
            }
            result
        };
        let Some(r) = self.comm.share_keys(sizes, 2, &work) else { return Given::NotOne };
        if !stop.load(Ordering::Relaxed) {
            // (A planned call's bytes were counted with its plan.)
            if matches!(keys, Source::Given { .. }) && r.is_ok() {
                self.counters.bytes((bytes[0].load(Ordering::Relaxed), bytes[1].load(Ordering::Relaxed)));
            }
            return Given::Ran(r);
        }
        let pieces: Vec<Piece<'k, G>> =
            placed.into_inner().unwrap_or_default().into_iter().map(Mutex::into_inner).collect();
        match keys {
            Source::Given { push, pull } if !unplanned.load(Ordering::Relaxed) => {
                // Each key of the call was found, in call order, piece after piece.
                let entries = pieces.iter().flat_map(|p| p.iter().map(|h| h.entry));
                let group = |runs: &[Run<'a>], entries| -> Found<'a> {
                    let arrays = |r: &Run<'a>| r.1.iter().collect();
                    runs.iter().zip(entries).map(|(r, e)| Group { entry: Arc::clone(e), arrays: arrays(r) }).collect()
                };
                let found = (group(push, entries.clone()), group(pull, entries));
                drop(pieces);
                Given::LookedUp { push: found.0, pull: found.1 }
            }
            _ => Given::NotOne,
        }
    }
}

/// Checks a key's values or outs (`what`) against its entry (`plan.rs`).
fn check(op: &'static str, what: &str, entry: &Entry, arrays: Side<'_, '_>) -> Result<()> {
    check_arrays(op, what, &entry.key, arrays.iter(), Like::Key(entry))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use crate::{Context, KVStore, NDArray, Result};

    thread_local! {
        /// Calls of this thread that ran spread (not handed back).
        pub(in crate::kvstore) static TAKEN: Cell<usize> = const { Cell::new(0) };
    }

    const KEYS: usize = 200;
    /// 200 keys of 512 f32, 4 values each: about 2 MiB in a call, in pieces of a few keys.
    const LEN: usize = 512;

    fn taken() -> usize {
        TAKEN.with(Cell::get)
    }

    /// A store on a pool of `threads` threads (1: every call takes the ordinary path),
    /// with keys `0..KEYS` initialised to their own number.
    fn store(threads: usize) -> Result<(KVStore, Vec<String>)> {
        let kv = KVStore::builder("local").num_threads(threads).build()?;
        let keys: Vec<String> = (0..KEYS).map(|k| format!("w{k}")).collect();
        let init: Vec<NDArray> = (0..KEYS).map(|k| NDArray::full(&[LEN], k as f64)).collect::<Result<_>>()?;
        kv.init(&keys, &init)?;
        Ok((kv, keys))
    }

    fn values(scale: f64) -> Result<Vec<Vec<NDArray>>> {
        (0..KEYS)
            .map(|k| {
                (0..4u32)
                    .map(|d| {
                        let v = scale * (k * 4 + d as usize) as f64;
                        NDArray::full_with(&[LEN], v, crate::DType::F32, Context::cpu(d))
                    })
                    .collect()
            })
            .collect()
    }

    fn zeros(n: usize) -> Result<Vec<NDArray>> {
        (0..n).map(|_| NDArray::zeros(&[LEN])).collect()
    }

    fn firsts(outs: &[NDArray]) -> Result<Vec<f32>> {
        outs.iter().map(|o| Ok(o.to_vec::<f32>()?[LEN - 1])).collect()
    }

    #[test]
    fn push_pull_and_pushpull_of_many_keys_run_spread_with_the_ordinary_results() -> Result<()> {
        let (kv, keys) = store(2)?;
        let (plain, _) = store(1)?;
        let vals = values(1.0)?;
        for kv in [&kv, &plain] {
            let before = taken();
            kv.push(&keys, &vals, 0)?;
            let outs = zeros(KEYS)?;
            kv.pull(&keys, &outs, 0)?;
            let sums: Vec<f32> = (0..KEYS).map(|k| (0..4).map(|d| (k * 4 + d) as f32).sum()).collect();
            assert_eq!(firsts(&outs)?, sums);
            let halves = values(0.5)?;
            let outs = zeros(KEYS)?;
            kv.pushpull(&keys, &halves, &outs, 0)?;
            assert_eq!(firsts(&outs)?, sums.iter().map(|s| s / 2.0).collect::<Vec<_>>());
            // Three calls, all spread on the store with two threads, none on the other.
            let spread = taken() - before;
            assert_eq!(spread, if std::ptr::eq(kv, &plain) { 0 } else { 3 });
        }
        Ok(())
    }

    #[test]
    fn a_refused_call_of_many_keys_is_not_spread_and_changes_nothing() -> Result<()> {
        let (kv, keys) = store(2)?;
        let (plain, _) = store(1)?;
        // An out of the wrong shape on key 3, and a value of the wrong shape on key 150:
        // the value's error comes first, as on the ordinary path.
        let vals = values(1.0)?;
        let mut bad_vals = values(1.0)?;
        bad_vals[150][2] = NDArray::zeros(&[LEN + 1])?;
        let mut outs = zeros(KEYS)?;
        outs[3] = NDArray::zeros(&[2])?;
        let before = taken();
        let spread_err = kv.pushpull(&keys, &bad_vals, &outs, 0).unwrap_err();
        // Its plan refused it: no key was locked.
        assert_eq!(taken() - before, 0, "a refused call ran spread");
        let plain_err = plain.pushpull(&keys, &bad_vals, &outs, 0).unwrap_err();
        assert_eq!(spread_err.to_string(), plain_err.to_string());
        assert!(spread_err.to_string().contains("w150"), "{spread_err}");
        // Only the out's error left: it is reported, and still nothing changed.
        let spread_err = kv.pushpull(&keys, &vals, &outs, 0).unwrap_err();
        let plain_err = plain.pushpull(&keys, &vals, &outs, 0).unwrap_err();
        assert_eq!(spread_err.to_string(), plain_err.to_string());
        assert!(spread_err.to_string().contains("w3"), "{spread_err}");
        let now = zeros(KEYS)?;
        kv.pull(&keys, &now, 0)?;
        assert_eq!(firsts(&now)?, (0..KEYS).map(|k| k as f32).collect::<Vec<_>>());
        assert!(outs.iter().all(|o| o.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0)));
        Ok(())
    }

    #[test]
    fn a_call_as_given_reports_what_its_plan_would_in_any_key_order() -> Result<()> {
        // The first round checks the call where its pieces are: an unknown key is
        // reported before any failed check, a failed value before a failed out, each the
        // first in key order (the order the keys were initialised), whatever piece or
        // order of the call it is in.
        let (kv, keys) = store(2)?;
        let (plain, _) = store(1)?;
        let mut vals = values(1.0)?;
        vals[20][1] = NDArray::zeros(&[3])?;
        vals[170][0] = NDArray::zeros(&[4])?;
        let mut outs = zeros(KEYS)?;
        outs[10] = NDArray::zeros(&[5])?;
        let mut unknown = keys.clone();
        unknown[190] = "nope".into();
        let reversed = |v: &[String]| v.iter().rev().cloned().collect::<Vec<_>>();
        for keys in [keys.clone(), reversed(&keys), unknown.clone(), reversed(&unknown)] {
            let flip = keys[0] != "w0";
            let (vals, outs) = match flip {
                true => (vals.iter().rev().cloned().collect(), outs.iter().rev().cloned().collect()),
                false => (vals.clone(), outs.clone()),
            };
            let before = taken();
            let err = kv.pushpull(&keys, &vals, &outs, 0).unwrap_err().to_string();
            assert_eq!(err, plain.pushpull(&keys, &vals, &outs, 0).unwrap_err().to_string());
            let expected = if keys.iter().any(|k| k == "nope") { "nope" } else { "\"w20\"" };
            assert!(err.contains(expected), "{err}");
            let pull_err = kv.pull(&keys, &outs, 0).unwrap_err().to_string();
            assert_eq!(pull_err, plain.pull(&keys, &outs, 0).unwrap_err().to_string());
            let expected = if keys.iter().any(|k| k == "nope") { "nope" } else { "\"w10\"" };
            assert!(pull_err.contains(expected), "{pull_err}");
            assert_eq!(taken(), before, "a refused call ran spread");
        }
        let now = zeros(KEYS)?;
        kv.pull(&keys, &now, 0)?;
        assert_eq!(firsts(&now)?, (0..KEYS).map(|k| k as f32).collect::<Vec<_>>());
        Ok(())
    }

    #[test]
    fn a_call_as_given_waits_for_pending_outs_and_copies_lent_ones() -> Result<()> {
        // Another store's engine is held up by a slow first push; behind it, queued
        // pushes have the odd outs on loan (its updater adds them up), then queued
        // pulls will write the even ones.
        let (kv, keys) = store(2)?;
        let other = KVStore::builder("local").num_threads(1).build()?;
        other.init("slow", &NDArray::zeros(&[LEN])?)?;
        other.set_updater(|_: &crate::Key, _, merged: &NDArray, stored: &NDArray| {
            if merged.to_vec::<f32>()?[0] == 7.0 {
                std::thread::sleep(std::time::Duration::from_millis(150));
                return stored.copy_from(merged);
            }
            stored.add_assign(merged)
        })?;
        let outs: Vec<NDArray> = (0..KEYS).map(|k| NDArray::full(&[LEN], -1.0 - k as f64)).collect::<Result<_>>()?;
        for lend in [true, false] {
            let mut queued = vec![other.push_async("slow", &NDArray::full(&[LEN], 7.0)?, 0)];
            for out in outs.iter().skip(usize::from(lend)).step_by(2) {
                queued.push(if lend { other.push_async("slow", out, 0) } else { other.pull_async("slow", out, 0) });
            }
            // A blocking pull of every key into those outs: it writes each after the
            // queued push that reads it has a copy, and after the queued pull did.
            kv.pull(&keys, &outs, 0)?;
            queued.into_iter().try_for_each(|p| p.wait())?;
            if lend {
                let slow = NDArray::zeros(&[LEN])?;
                other.pull("slow", &slow, 0)?;
                let lent: f32 = (1..KEYS).step_by(2).map(|k| -1.0 - k as f32).sum();
                assert_eq!(slow.to_vec::<f32>()?[0], 7.0 + lent, "a queued push read a pulled value");
            }
            assert_eq!(firsts(&outs)?, (0..KEYS).map(|k| k as f32).collect::<Vec<_>>(), "a queued pull wrote last");
        }
        Ok(())
    }

    #[test]
    fn calls_whose_outs_alias_values_or_each_other_give_the_ordinary_results() -> Result<()> {
        let (kv, keys) = store(2)?;
        let (plain, _) = store(1)?;
        let value = |k: usize| NDArray::full(&[LEN], 1000.0 + k as f64);
        for kv in [&kv, &plain] {
            let before = taken();
            // Each key's out is the value pushed to the key half the list away: every
            // sum reads its value before any copy writes it.
            let vals: Vec<NDArray> = (0..KEYS).map(value).collect::<Result<_>>()?;
            let outs: Vec<NDArray> = (0..KEYS).map(|k| vals[(k + KEYS / 2) % KEYS].clone()).collect();
            kv.pushpull(&keys, &vals, &outs, 0)?;
            assert_eq!(firsts(&outs)?, (0..KEYS).map(|k| 1000.0 + k as f32).collect::<Vec<_>>());
            // One out for every key: it ends with the last key's value.
            let one = NDArray::zeros(&[LEN])?;
            kv.pull(&keys, &vec![one.clone(); KEYS], 0)?;
            assert_eq!(firsts(std::slice::from_ref(&one))?, vec![1000.0 + (KEYS - 1) as f32]);
            // Neither ran spread; a pushpull in place, whose values are its own outs, does.
            assert_eq!(taken() - before, 0);
            let in_place: Vec<NDArray> = (0..KEYS).map(value).collect::<Result<_>>()?;
            kv.pushpull_in_place(&keys, &in_place, 0)?;
            assert_eq!(taken() - before, usize::from(!std::ptr::eq(kv, &plain)));
            let stored = zeros(KEYS)?;
            kv.pull(&keys, &stored, 0)?;
            assert_eq!(firsts(&stored)?, (0..KEYS).map(|k| 1000.0 + k as f32).collect::<Vec<_>>());
            assert_eq!(firsts(&in_place)?, (0..KEYS).map(|k| 1000.0 + k as f32).collect::<Vec<_>>());
        }
        Ok(())
    }

    #[test]
    fn aliased_outs_are_found_while_other_threads_use_the_same_arrays() -> Result<()> {
        // Key w0's out is the value pushed to the last key: alone, the call takes the
        // ordinary path (every sum before any copy). Another thread's calls that read
        // the same array (on another store) must not hide that: they once did, when a
        // call's uses of an array were marks on the array itself, and then the last
        // key stored w0's sum in a few calls of a hundred.
        let (kv, keys) = store(2)?;
        let (other, _) = store(2)?;
        let x = NDArray::zeros(&[LEN])?;
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| -> Result<()> {
            let reader = s.spawn(|| -> Result<()> {
                let mut vals = zeros(KEYS)?;
                vals[5] = x.clone();
                let outs = zeros(KEYS)?;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    other.pushpull(&keys, &vals, &outs, 0)?;
                }
                Ok(())
            });
            let start = std::time::Instant::now();
            let mut wrong = 0;
            while start.elapsed() < std::time::Duration::from_millis(1500) {
                x.copy_from(&NDArray::full(&[LEN], 1.5)?)?;
                let mut vals: Vec<NDArray> = (0..KEYS).map(|_| NDArray::full(&[LEN], 100.0)).collect::<Result<_>>()?;
                vals[KEYS - 1] = x.clone();
                let mut outs = zeros(KEYS)?;
                outs[0] = x.clone();
                kv.pushpull(&keys, &vals, &outs, 0)?;
                wrong += usize::from(kv.pull_new(keys[KEYS - 1].as_str(), 0)?.to_vec::<f32>()?[0] != 1.5);
                assert_eq!(x.to_vec::<f32>()?[0], 100.0, "w0's sum is in its out");
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().expect("the reading thread panicked")?;
            assert_eq!(wrong, 0, "the last key stored another key's sum");
            Ok(())
        })
    }

    /// A spread pull of every key, whose last out another thread holds the data of
    /// while it calls `meanwhile` on the store: both must return (`what` names the
    /// call for the failure). The store, for what the caller checks after.
    /// (Threads of their own, not scoped: a test that found them waiting for each other
    /// fails instead of waiting too.)
    fn pull_while_an_out_is_held(
        what: &str,
        meanwhile: impl FnOnce(&KVStore) -> Result<()> + Send + 'static,
    ) -> Result<std::sync::Arc<KVStore>> {
        let (kv, keys) = store(2)?;
        let (kv, keys) = (std::sync::Arc::new(kv), std::sync::Arc::new(keys));
        let x = NDArray::zeros(&[LEN])?;
        let (done, finished) = std::sync::mpsc::channel();
        let holder = {
            let (kv, x, done) = (kv.clone(), x.clone(), done.clone());
            std::thread::spawn(move || {
                let r = x.with_data(|_: &[f32]| {
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    meanwhile(&kv)
                });
                let _ = done.send(r.and_then(|r| r));
            })
        };
        let puller = {
            let (kv, keys, x) = (kv.clone(), keys.clone(), x.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let r = zeros(KEYS).and_then(|mut outs| {
                    outs[KEYS - 1] = x;
                    kv.pull(&keys[..], &outs, 0)
                });
                let _ = done.send(r);
            })
        };
        for _ in 0..2 {
            finished
                .recv_timeout(std::time::Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{what} and a spread pull waited for each other"))?;
        }
        holder.join().expect("the holding thread panicked");
        puller.join().expect("the pulling thread panicked");
        assert_eq!(x.to_vec::<f32>()?[0], (KEYS - 1) as f32);
        Ok(kv)
    }

    #[test]
    fn a_spread_pull_waiting_for_an_out_does_not_hold_up_set_updater() -> Result<()> {
        // A thread holds an out's data and installs an updater meanwhile; another
        // thread's pull of many keys, spread, waits for that out. The pull held the
        // store's merger while it waited, so that both waited for ever (a store on one
        // thread, whose pull takes no merger, returned).
        pull_while_an_out_is_held("set_updater", |kv| {
            kv.set_updater(|_: &crate::Key, _, merged: &NDArray, stored: &NDArray| stored.copy_from(merged))
        })?;
        Ok(())
    }

    #[test]
    fn a_spread_pull_waiting_for_an_out_does_not_hold_up_init() -> Result<()> {
        // As above, with `init` of a new key: the pull held the store's table of keys
        // (read) while it waited for the out, and `init` waited for the table.
        let kv = pull_while_an_out_is_held("init", |kv| kv.init("new", &NDArray::full(&[2], 5.0)?))?;
        assert_eq!(kv.pull_new("new", 0)?.to_vec::<f32>()?, vec![5.0; 2]);
        Ok(())
    }

    #[test]
    fn calls_with_a_repeated_or_unknown_key_give_the_ordinary_results() -> Result<()> {
        let (kv, keys) = store(2)?;
        let (plain, _) = store(1)?;
        let mut vals = values(1.0)?;
        let mut again = keys.clone();
        again.push("w5".into());
        vals.push(vals[5].clone());
        let mut unknown = keys.clone();
        unknown.push("nope".into());
        for kv in [&kv, &plain] {
            kv.push(&again, &vals, 0)?;
            let err = kv.push(&unknown, &vals, 0).unwrap_err();
            assert!(err.to_string().contains("nope"), "{err}");
        }
        let outs = [zeros(KEYS)?, zeros(KEYS)?];
        kv.pull(&keys, &outs[0], 0)?;
        plain.pull(&keys, &outs[1], 0)?;
        assert_eq!(firsts(&outs[0])?, firsts(&outs[1])?);
        assert_eq!(firsts(&outs[0])?[5], 2.0 * (20 + 21 + 22 + 23) as f32);
        Ok(())
    }

    #[test]
    fn concurrent_spread_calls_on_the_same_keys_never_mix() -> Result<()> {
        // Four threads pushpull every key (two of them in reverse order) with their own
        // values: each call holds all its keys from its first check to its last copy,
        // so its outs are its own sums. A key busy with another call hands the call to
        // the ordinary path, which waits in key order: no deadlock either way.
        let (kv, keys) = store(2)?;
        let rev: Vec<String> = keys.iter().rev().cloned().collect();
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..4usize)
                .map(|t| {
                    let (kv, keys) = (&kv, if t % 2 == 0 { &keys } else { &rev });
                    s.spawn(move || -> Result<()> {
                        let vals: Vec<Vec<NDArray>> = (0..KEYS)
                            .map(|_| (0..2).map(|_| NDArray::full(&[LEN], t as f64)).collect())
                            .collect::<Result<_>>()?;
                        for _ in 0..30 {
                            let outs = zeros(KEYS)?;
                            kv.pushpull(keys, &vals, &outs, 0)?;
                            assert!(firsts(&outs)?.iter().all(|&x| x == 2.0 * t as f32), "thread {t} saw another call");
                        }
                        Ok(())
                    })
                })
                .collect();
            threads.into_iter().try_for_each(|t| t.join().expect("a calling thread panicked"))
        })
    }
}
