//! A call of many small keys spread over the comm's threads, each thread taking whole
//! keys: it locks, checks, sums and copies them where it is, instead of the caller doing
//! the per-key bookkeeping of every key alone while the other threads wait for the sums.
//!
//! It does what [`Store::push_pull`] does for the same call, in two passes over the
//! same pieces of the call's keys: first every key is locked (without waiting) and
//! checked, then, when every key is held and passed, the sums and copies. A failed
//! check changes nothing, and the error is the one the ordinary path reports (the
//! first value's error in key order, else the first out's). A key that another call
//! holds, or anything this path does not do, hands the call back, with every lock
//! released and nothing changed, to the ordinary path, which waits for locks in key
//! order: no lock is ever waited for here, so no deadlock can come of taking locks
//! on several threads at once.

use std::ops::{Deref, Range};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::{Entry, Group, Merger, Slot, Store, check_group, locks};
use crate::comm::{BroadcastJob, Claims, ReduceJob};
use crate::error::{Error, Result};

/// The guards of a piece's keys.
type Guards<G> = SmallVec<[G; 8]>;

/// The first error of some keys, by key position.
type First = Mutex<Option<(usize, Error)>>;

fn keep_first(first: &First, at: usize, e: Error) {
    let mut first = first.lock();
    if first.as_ref().is_none_or(|(i, _)| at < *i) {
        *first = Some((at, e));
    }
}

/// What a piece of the checking pass returns to stop the pass early: the reason (a
/// busy key, a failed check) is kept aside, and this error is never reported.
fn stopped() -> Error {
    Error::Internal("spread: a piece stopped early".into())
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
    pub(super) fn spread<'a>(&self, op: &'static str, push: &[Group<'a>], pull: &[Group<'a>]) -> Option<Result<()>> {
        let keys = if push.is_empty() { pull } else { push };
        // One key is no call to spread (and the common blocking call: it should cost
        // no more than these two comparisons here).
        if keys.len() < 2 {
            return None;
        }
        let same_keys = push.is_empty()
            || pull.is_empty()
            || (push.len() == pull.len() && push.iter().zip(pull).all(|(a, b)| a.entry.index == b.entry.index));
        if self.collective.is_some()
            || locks::inside_updater()
            || !same_keys
            || push.iter().chain(pull).any(|g| g.arrays.is_empty() || g.arrays.iter().any(|a| a.on_device()))
        {
            return None;
        }
        let merger = self.merger.try_read()?;
        if !push.is_empty() && !matches!(*merger, Merger::Assign) {
            return None;
        }
        let sizes: Vec<usize> = (0..keys.len())
            .map(|i| {
                let a = keys[i].arrays[0];
                let n = push.get(i).map_or(0, |g| g.arrays.len()) + pull.get(i).map_or(0, |g| g.arrays.len());
                a.size() * a.dtype().size() * (n + 1)
            })
            .collect();
        let r = if push.is_empty() {
            self.spread_locked(op, &sizes, push, pull, |e: &Entry| e.value.try_read())
        } else {
            self.spread_locked(op, &sizes, push, pull, |e: &Entry| e.value.try_write())
        };
        drop(merger);
        #[cfg(test)]
        tests::TAKEN.with(|t| t.set(t.get() + usize::from(r.is_some())));
        r
    }

    /// [`Store::spread`] with the keys locked by `lock` (shared for a pull, exclusive
    /// when the call pushes).
    ///
    /// In a first round the threads lock and check the keys of the pieces they take,
    /// and leave each piece's guards in its place; when every piece is checked
    /// (`Claims::all_done`) and nothing failed, they take the pieces again to sum and
    /// copy them, and unlock each piece when it is done. No key is unlocked before
    /// every key is locked, so the call still takes effect at once for other calls.
    fn spread_locked<'k, 'a, G: Deref<Target = Slot> + Send + Sync>(
        &self,
        op: &'static str,
        sizes: &[usize],
        push: &'k [Group<'a>],
        pull: &'k [Group<'a>],
        lock: impl Fn(&'k Entry) -> Option<G> + Sync,
    ) -> Option<Result<()>> {
        let keys = if push.is_empty() { pull } else { push };
        let handed_back = AtomicBool::new(false);
        let (value_error, out_error): (First, First) = Default::default();
        // Locks and checks the keys of `range`: their guards, in key order.
        let check = |range: Range<usize>| -> Result<Guards<G>> {
            let mut held = Guards::with_capacity(range.len());
            for i in range {
                let Some(guard) = lock(&keys[i].entry).filter(|g| !g.value.on_device()) else {
                    handed_back.store(true, Ordering::Relaxed);
                    return Err(stopped());
                };
                if let Some(g) = push.get(i)
                    && let Err(e) = check_group(op, "value", g, &guard.value)
                {
                    // Later keys' values cannot come first; earlier pieces finish.
                    keep_first(&value_error, i, e);
                    return Err(stopped());
                }
                if let Some(g) = pull.get(i)
                    && let Err(e) = check_group(op, "out", g, &guard.value)
                {
                    // A value's error comes first: the values of later keys are still
                    // checked.
                    keep_first(&out_error, i, e);
                }
                held.push(guard);
            }
            Ok(held)
        };
        // Sums and copies the keys of `range`, whose guards are `slots`.
        let run = |range: Range<usize>, slots: &[G]| -> Result<()> {
            if !push.is_empty() {
                let jobs: SmallVec<[ReduceJob<'_>; 8]> = push[range.clone()]
                    .iter()
                    .zip(slots)
                    .map(|(g, slot)| ReduceJob { inputs: &g.arrays, out: &slot.value })
                    .collect();
                self.comm.reduce(&jobs)?;
            }
            if !pull.is_empty() {
                let jobs: SmallVec<[BroadcastJob<'_>; 8]> = pull[range]
                    .iter()
                    .zip(slots)
                    .map(|(g, slot)| BroadcastJob { src: &slot.value, outs: &g.arrays })
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
            // Every key of the call is locked and checked (else it stopped); an out's
            // error stops nothing, so it is looked at here.
            if !claims.all_done() || out_error.lock().is_some() {
                return Ok(());
            }
            while let Some((p, range)) = claims.next() {
                let slots = std::mem::take(&mut *placed[p].lock());
                run(range, &slots)?;
            }
            Ok(())
        };
        // The result says only whether a piece stopped early; why is kept aside.
        let r = self.comm.share_keys(sizes, 2, &work)?;
        if handed_back.load(Ordering::Relaxed) {
            return None;
        }
        if let Some((_, e)) = value_error.into_inner().or(out_error.into_inner()) {
            return Some(Err(e));
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use crate::{Context, KVStore, NDArray, Result};

    thread_local! {
        /// Calls of this thread that ran spread (not handed back).
        pub(super) static TAKEN: Cell<usize> = const { Cell::new(0) };
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
    fn a_failing_spread_call_changes_nothing_and_reports_the_ordinary_error() -> Result<()> {
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
        assert_eq!(taken() - before, 1, "the call ran spread");
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
