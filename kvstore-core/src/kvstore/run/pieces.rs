//! A call of many small keys spread over the comm's threads, each thread taking whole
//! keys: it locks, checks, sums and copies them where it is, instead of the caller doing
//! the per-key bookkeeping of every key alone while the other threads wait for the sums.
//!
//! It does what [`Store::push_pull`] does for the same call, in two rounds over the
//! same pieces of the call's keys (`Comm::share_keys`): first every key is locked
//! (without waiting), then, when every key is held, the sums and copies, each piece
//! unlocked when done. A planned call comes here checked (`plan.rs`). A key that another
//! call holds, or anything this path does not do, hands the call back, with every lock
//! released and nothing changed, to the ordinary path, which waits for locks in key
//! order: no lock is ever waited for here, so no deadlock can come of taking locks on
//! several threads at once.
//!
//! A blocking call on an idle engine comes here as its caller gave it, before its keys
//! are looked up (`Store::spread_runs`): the first round also looks them up, checks its
//! arrays against them and that they are ready, which the caller would otherwise do
//! alone; a failed check hands the call back, and the ordinary path's plan reports it.

use std::ops::{Deref, Range};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::comm::{BroadcastJob, Claims, ReduceJob};
use crate::error::{Error, Result};
use crate::kvstore::forms::Run;
use crate::kvstore::plan::Plan;
use crate::kvstore::plan::{Like, check_arrays};
use crate::kvstore::{Entry, Group, Merger, Slot, Store, Table, locks};
use crate::ndarray::{NDArray, overlapping_uses, use_token};

/// The guards of a piece's keys.
type Guards<G> = SmallVec<[G; 8]>;

/// Keys whose arrays a piece gathers at a time to sum and copy them.
const GATHERED: usize = 8;

/// The arrays of `GATHERED` keys, one after another: room for a few per key (one per
/// device, and an out) without a heap allocation.
type Gathered<'a> = SmallVec<[&'a NDArray; 64]>;

/// Keys looked up together before the first of them is locked. A lock is a barrier for
/// the core's loads, so lookups made between locks take their cache misses one at a
/// time (with 100,000 keys, a list push spent a quarter of its time in them).
const LOOKED_UP: usize = 16;

/// What a piece of the first round returns to stop the round early: the reason (a busy
/// key, a failed check) is kept aside, and this error is never reported.
fn stopped() -> Error {
    Error::Internal("spread: a piece stopped early".into())
}

/// One key's values or outs in a call: looked up (in a group), or as the caller gave
/// them (in a run).
#[derive(Clone, Copy)]
enum Side<'k, 'a> {
    Grouped(&'k [&'a NDArray]),
    Given(&'a [NDArray]),
}

impl<'k, 'a> Side<'k, 'a> {
    fn len(self) -> usize {
        match self {
            Side::Grouped(arrays) => arrays.len(),
            Side::Given(arrays) => arrays.len(),
        }
    }

    fn is_empty(self) -> bool {
        self.len() == 0
    }

    fn iter(self) -> impl Iterator<Item = &'a NDArray> + Clone {
        let (grouped, given) = match self {
            Side::Grouped(arrays) => (arrays, &[][..]),
            Side::Given(arrays) => (&[][..], arrays),
        };
        grouped.iter().copied().chain(given)
    }

    /// Appends the arrays to `to`, and says where they are there.
    fn gather(self, to: &mut Gathered<'a>) -> Range<usize> {
        let start = to.len();
        to.extend(self.iter());
        start..to.len()
    }
}

/// The keys of a call as a spread call reads them.
#[derive(Clone, Copy)]
enum CallKeys<'k, 'a> {
    /// Looked up and grouped (one group per key), their arrays made ready for the call.
    Groups { push: &'k [Group<'a>], pull: &'k [Group<'a>] },
    /// As the caller gave them, looked up here in `table`. An array that is pending, or
    /// an out that is lent, hands the call back (the ordinary path waits for the one
    /// and copies the other first), and so does a failed check: the ordinary path
    /// then reports it as it does any other.
    Runs { table: &'k Table, push: &'k [Run<'a>], pull: &'k [Run<'a>] },
}

impl<'k, 'a> CallKeys<'k, 'a> {
    fn len(self) -> usize {
        match self {
            CallKeys::Groups { push, pull } => push.len().max(pull.len()),
            CallKeys::Runs { push, pull, .. } => push.len().max(pull.len()),
        }
    }

    /// Key `i`'s values and outs (empty for none).
    fn arrays(self, i: usize) -> (Side<'k, 'a>, Side<'k, 'a>) {
        match self {
            CallKeys::Groups { push, pull } => {
                let side = |g: Option<&'k Group<'a>>| Side::Grouped(g.map_or(&[][..], |g| &g.arrays));
                (side(push.get(i)), side(pull.get(i)))
            }
            CallKeys::Runs { push, pull, .. } => {
                let side = |r: Option<&'k Run<'a>>| Side::Given(r.map_or(&[][..], |r| r.1));
                (side(push.get(i)), side(pull.get(i)))
            }
        }
    }

    /// Key `i`'s entry, when the call may go on with it here.
    fn entry(self, i: usize) -> Option<&'k Entry> {
        match self {
            CallKeys::Groups { push, pull } => push.get(i).or(pull.get(i)).map(|g| &*g.entry),
            CallKeys::Runs { table, push, pull } => {
                let key = match (push.get(i), pull.get(i)) {
                    (Some(p), Some(q)) if p.0 != q.0 => return None,
                    (Some((key, _)), _) | (None, Some((key, _))) => key,
                    (None, None) => return None,
                };
                let (values, outs) = self.arrays(i);
                let unready =
                    values.iter().any(|a| a.is_pending()) || outs.iter().any(|a| a.is_pending() || a.is_lent());
                if unready {
                    return None;
                }
                table.entries.get(key).map(|e| &**e)
            }
        }
    }

    /// Whether the call's arrays are checked here: a call as given is, a planned one was
    /// (see `plan.rs`). A failed check hands the call back, to fail on the ordinary path.
    fn checks_here(self) -> bool {
        matches!(self, CallKeys::Runs { .. })
    }
}

/// What became of a call offered to the spread path.
pub(in crate::kvstore) enum Spread {
    /// It ran here, with this result.
    Ran(Result<()>),
    /// It is not a call this path runs (one key, too little work to share, a store
    /// with a worker group or another merger): offered again, it would not be either.
    NotOne,
    /// Handed back, with nothing changed and no lock held: a key was busy, or
    /// something this path does not do came up.
    HandedBack,
}

impl Spread {
    /// The result of a call that ran here.
    fn ran(self) -> Option<Result<()>> {
        match self {
            Spread::Ran(r) => Some(r),
            Spread::NotOne | Spread::HandedBack => None,
        }
    }
}

impl Store {
    /// [`Store::push_pull`] of `push` and `pull` (grouped), spread over the comm's
    /// threads; `None`, with nothing changed and no lock held, when the call is not one
    /// this path runs or a key is busy.
    ///
    /// The calls it runs: on a store with no worker group and the default merger (a push
    /// only sums), host arrays, every key with at least one array, and a pull of the
    /// same keys as the push, if both; the comm decides whether there is enough work to
    /// share ([`crate::comm::Comm::share_keys`]). A thread that runs an updater takes
    /// the ordinary path, which knows how such a call may lock.
    pub(in crate::kvstore) fn spread(&self, plan: &Plan<'_>) -> Option<Result<()>> {
        let (op, push, pull) = (plan.op, &plan.push[..], &plan.pull[..]);
        let same_keys = push.is_empty()
            || pull.is_empty()
            || (push.len() == pull.len() && push.iter().zip(pull).all(|(a, b)| a.entry.index == b.entry.index));
        if !same_keys {
            return None;
        }
        self.spread_keys(op, CallKeys::Groups { push, pull }).ran()
    }

    /// [`Store::spread`] of a blocking call's keys as given, before anything else is
    /// done with them: the lookups, the checks that its arrays are ready and the key
    /// checks are spread too. For a caller that runs the call at once (its engine has
    /// nothing queued); a call handed back goes to the ordinary path, which does all
    /// that again on its own (and need not offer the call to [`Store::spread`] when
    /// it is [`Spread::NotOne`]).
    pub(in crate::kvstore) fn spread_runs<'a>(&self, op: &'static str, push: &[Run<'a>], pull: &[Run<'a>]) -> Spread {
        // Short calls are not looked at further, nor is the table locked for them.
        if !(push.is_empty() || pull.is_empty() || push.len() == pull.len()) || push.len().max(pull.len()) < 2 {
            return Spread::NotOne;
        }
        let table = self.table.read();
        self.spread_keys(op, CallKeys::Runs { table: &table, push, pull })
    }

    fn spread_keys(&self, op: &'static str, keys: CallKeys<'_, '_>) -> Spread {
        // One key is no call to spread (and the common blocking call: it should cost
        // no more than these comparisons here).
        if keys.len() < 2 || self.collective.is_some() || self.remote.is_some() || locks::inside_updater() {
            return Spread::NotOne;
        }
        let (values, _) = keys.arrays(0);
        let Some(merger) = self.merger.try_read() else { return Spread::HandedBack };
        // Pushes with compression quantise their values on the ordinary path.
        if !values.is_empty() && (!matches!(*merger, Merger::Assign) || self.compression.read().is_some()) {
            return Spread::NotOne;
        }
        let sizes: Vec<usize> = (0..keys.len())
            .map(|i| {
                let (values, outs) = keys.arrays(i);
                values
                    .iter()
                    .chain(outs.iter())
                    .next()
                    .map_or(0, |a| a.size() * a.dtype().size() * (values.len() + outs.len() + 1))
            })
            .collect();
        let r = if values.is_empty() {
            self.spread_locked(op, &sizes, keys, |e: &Entry| e.value.try_read())
        } else {
            self.spread_locked(op, &sizes, keys, |e: &Entry| e.value.try_write())
        };
        drop(merger);
        #[cfg(test)]
        tests::TAKEN.with(|t| t.set(t.get() + usize::from(matches!(r, Spread::Ran(_)))));
        r
    }

    /// [`Store::spread`] with the keys locked by `lock` (shared for a pull, exclusive
    /// when the call pushes).
    ///
    /// In a first round the threads look the keys of the pieces they take up, lock
    /// and check them, and leave each piece's guards in its place; when every piece is
    /// checked (`Claims::all_done`) and nothing failed, they take the pieces again to
    /// sum and copy them, and unlock each piece when it is done. No key is unlocked
    /// before every key is locked, so the call still takes effect at once for other
    /// calls.
    fn spread_locked<'k, 'a, G: Deref<Target = Slot> + Send + Sync>(
        &self,
        op: &'static str,
        sizes: &[usize],
        keys: CallKeys<'k, 'a>,
        lock: impl Fn(&'k Entry) -> Option<G> + Sync,
    ) -> Spread {
        let handed_back = AtomicBool::new(false);
        // The pieces run in no set order, each summing and copying its keys in turn: a
        // call whose outs alias each other or other keys' values needs the ordinary
        // path's order (every sum before any copy, outs written in order).
        let token = (!keys.arrays(0).1.is_empty()).then(use_token);
        let aliased = |values: Side<'_, '_>, outs: Side<'_, '_>| {
            let Some(token) = token else { return false };
            let in_place = values.len() == outs.len() && values.iter().zip(outs.iter()).all(|(v, o)| v.same_storage(o));
            (!in_place && values.iter().any(|v| v.used_again(token, false)))
                || outs.iter().any(|o| o.used_again(token, true))
        };
        // Different arrays over the same memory (views of one buffer that a binding
        // wrapped one by one) have marks of their own: such a call, one of them written,
        // is handed back whole.
        if token.is_some() {
            let values = (0..keys.len()).flat_map(|i| keys.arrays(i).0.iter());
            if overlapping_uses(values, (0..keys.len()).flat_map(|i| keys.arrays(i).1.iter())) {
                return Spread::HandedBack;
            }
        }
        let hand_back = || {
            handed_back.store(true, Ordering::Relaxed);
            stopped()
        };
        // Looks up, locks and checks the keys of `range`: their guards, in key order.
        let check = |range: Range<usize>| -> Result<Guards<G>> {
            let mut held = Guards::with_capacity(range.len());
            let mut looked_up: SmallVec<[Option<&Entry>; LOOKED_UP]> = SmallVec::new();
            for i in range.clone() {
                let ahead = (i - range.start) % LOOKED_UP;
                if ahead == 0 {
                    looked_up.clear();
                    looked_up.extend((i..range.end.min(i + LOOKED_UP)).map(|k| keys.entry(k)));
                }
                let (values, outs) = keys.arrays(i);
                if values.is_empty() && outs.is_empty() || values.iter().chain(outs.iter()).any(|a| a.on_device()) {
                    return Err(hand_back());
                }
                let Some(entry) = looked_up[ahead] else { return Err(hand_back()) };
                if aliased(values, outs) {
                    return Err(hand_back());
                }
                let Some(guard) = lock(entry).filter(|g| !g.value.on_device()) else {
                    return Err(hand_back());
                };
                // A call as given is checked here, against the value it locked (its line
                // is read for the sums anyway); a planned call was checked by its plan.
                let checked = |what, arrays: Side<'_, '_>| {
                    let like = Like::Array(&guard.value);
                    arrays.is_empty() || check_arrays(op, what, &entry.key, arrays.iter(), like).is_ok()
                };
                if keys.checks_here() && !(checked("value", values) && checked("out", outs)) {
                    return Err(hand_back());
                }
                held.push(guard);
            }
            Ok(held)
        };
        // Sums and copies the keys of `range`, whose guards are `slots`.
        let run = |range: Range<usize>, slots: &[G]| -> Result<()> {
            // A few keys at a time, their arrays gathered on the stack.
            for (start, slots) in range.step_by(GATHERED).zip(slots.chunks(GATHERED)) {
                let mut arrays = Gathered::new();
                let spans: SmallVec<[(Range<usize>, Range<usize>); GATHERED]> = (start..start + slots.len())
                    .map(|i| {
                        let (values, outs) = keys.arrays(i);
                        (values.gather(&mut arrays), outs.gather(&mut arrays))
                    })
                    .collect();
                let sides =
                    || spans.iter().map(|(values, outs)| (&arrays[values.clone()], &arrays[outs.clone()])).zip(slots);
                let jobs: SmallVec<[ReduceJob<'_>; GATHERED]> = sides()
                    .filter(|((values, _), _)| !values.is_empty())
                    .map(|((values, _), slot)| ReduceJob { inputs: values, out: &slot.value })
                    .collect();
                self.comm.reduce(&jobs)?;
                let jobs: SmallVec<[BroadcastJob<'_>; GATHERED]> = sides()
                    .filter(|((_, outs), _)| !outs.is_empty())
                    .map(|((_, outs), slot)| BroadcastJob { src: &slot.value, outs })
                    .collect();
                self.comm.broadcast(&jobs)?;
            }
            Ok(())
        };
        // Each piece's guards, from the round that checks it to the round that runs it.
        let placed: OnceLock<Vec<Mutex<Guards<G>>>> = OnceLock::new();
        let work = |claims: &dyn Claims| -> Result<()> {
            let placed = placed.get_or_init(|| (0..claims.pieces()).map(|_| Mutex::default()).collect());
            while let Some((p, range)) = claims.next() {
                *placed[p].lock() = check(range)?;
            }
            // Every key of the call is locked and checked (else it stopped).
            if !claims.all_done() {
                return Ok(());
            }
            while let Some((p, range)) = claims.next() {
                let slots = std::mem::take(&mut *placed[p].lock());
                run(range, &slots)?;
            }
            Ok(())
        };
        // The result says only whether a piece stopped early; why is kept aside.
        let Some(r) = self.comm.share_keys(sizes, 2, &work) else { return Spread::NotOne };
        if handed_back.load(Ordering::Relaxed) {
            return Spread::HandedBack;
        }
        Spread::Ran(r)
    }
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
