//! A fork-join work sharer over a rayon pool: the calling thread and the pool's threads
//! run a call's jobs together, each from a contiguous part of them, taking what is left
//! of the others' parts once done with its own, in rounds that every thread finishes
//! before any starts the next ([`Claims`]). `CommCpu` shares out its small jobs and the
//! keys of a spread call (`Comm::share_keys`) with it.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use rayon::ThreadPool;

use super::Claims;
use crate::backoff::Backoff;
use crate::error::{Error, Result};

/// Runs `one` over `jobs` on this thread and on the pool's other threads at once.
///
/// Each thread has a contiguous part of the jobs, which it runs in order, `per_claim`
/// at a time; a thread done with its part takes the rest of another's from its end.
/// The calling thread starts at once and the pool's threads join as they wake, so
/// a call does not wait for a sleeping thread to start its work, nor for the last
/// one to finish a larger share (on a 2-core machine whose threads woke 16–30 µs
/// late, that cost about 0.1 µs per key of a 1,000-key push, and as much of a
/// pull). Contiguous parts matter as much: plain loops over 1,000 keys of 1 Ki f32,
/// the keys dealt out three at a time in turn, took 0.51–0.57 µs per key to sum and
/// copy, against 0.30–0.46 µs in two halves. Jobs take only the locks of their own
/// arrays and start no nested parallel work, so no thread waits on a lock while
/// holding another's. After an error no more jobs start, and the first error is
/// returned.
pub(super) fn share_jobs<J: Sync>(
    pool: &ThreadPool,
    jobs: &[&J],
    per_claim: usize,
    one: impl Fn(&J) -> Result<()> + Sync,
) -> Result<()> {
    let pieces = (0..jobs.len()).step_by(per_claim.max(1)).map(|s| s..jobs.len().min(s + per_claim.max(1)));
    let work = |claims: &dyn Claims| -> Result<()> {
        while let Some((_, piece)) = claims.next() {
            jobs[piece].iter().try_for_each(|j| one(j))?;
        }
        Ok(())
    };
    share_pieces(pool, pieces.collect(), 1, &work).unwrap_or_else(|| jobs.iter().try_for_each(|j| one(j)))
}

/// Runs `work` once on this thread and once on each of the pool's other threads (as
/// many as there are pieces), each with its [`Claims`] of `pieces` in `rounds`
/// rounds, and returns the first error. `None`, with nothing run, for more pieces
/// than a part's bounds can count.
pub(super) fn share_pieces(
    pool: &ThreadPool,
    pieces: Vec<Range<usize>>,
    rounds: usize,
    work: &(dyn Fn(&dyn Claims) -> Result<()> + Sync),
) -> Option<Result<()>> {
    let threads = pool.current_num_threads().min(pieces.len()).max(1);
    let rounds = (0..rounds.max(1))
        .map(|_| {
            let done = (0..threads).map(|_| CachePadded::new(AtomicUsize::new(0))).collect();
            Some(Round { parts: Parts::new(pieces.len(), threads)?, done })
        })
        .collect::<Option<_>>()?;
    let shared = Sharing { rounds, pieces, threads, stop: AtomicBool::new(false) };
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    // The pool's threads at work on the call: the caller waits for them spinning,
    // not asleep in the pool's latch.
    let helping = CachePadded::new(AtomicUsize::new(0));
    let run = |me: usize| {
        let claims = ThreadClaims {
            shared: &shared,
            me,
            round: Cell::new(0),
            taken: Cell::new(false),
            drained: Cell::new(false),
        };
        let _stop_on_panic = StopOnPanic(&shared.stop);
        if let Err(e) = work(&claims) {
            shared.stop.store(true, Ordering::Release);
            failed.lock().get_or_insert(e);
        }
        // A piece taken last counts as done once `work` returns, whatever it did.
        claims.finish();
    };
    pool.in_place_scope(|s| {
        for me in 1..threads {
            let (run, helping) = (&run, &helping);
            s.spawn(move |_| {
                helping.fetch_add(1, Ordering::AcqRel);
                run(me);
                helping.fetch_sub(1, Ordering::AcqRel);
            });
        }
        run(0);
        wait_for_helpers(&helping);
    });
    Some(failed.into_inner().map_or(Ok(()), Err))
}

/// Spins while `helping` is not zero, for at most `HELPER_SPIN`: the pool's threads
/// that started on a shared call are working on it and finish about when the caller
/// does, so a wait of microseconds here saves a sleep and a wake-up (about 10 µs each
/// on a 2-core machine) in the pool's own wait, which follows. Threads that have not
/// started are not waited for here.
fn wait_for_helpers(helping: &AtomicUsize) {
    const HELPER_SPIN: std::time::Duration = std::time::Duration::from_micros(50);
    let mut since: Option<std::time::Instant> = None;
    let mut spins = 0u32;
    while helping.load(Ordering::Acquire) != 0 {
        std::hint::spin_loop();
        spins += 1;
        if spins.is_multiple_of(64) && since.get_or_insert_with(std::time::Instant::now).elapsed() > HELPER_SPIN {
            return;
        }
    }
}

/// The pieces of [`share_pieces`] cut into one contiguous part per thread, each an
/// unclaimed range `front..back` in one atomic word, taken from the front by its thread
/// and from the back by others.
struct Parts(Vec<CachePadded<AtomicU64>>);

impl Parts {
    /// `None` for more jobs than a part's bounds can count (then one thread runs them).
    fn new(jobs: usize, threads: usize) -> Option<Self> {
        u32::try_from(jobs).ok()?;
        let bound = |t: usize| (jobs * t / threads) as u64;
        Some(Parts((0..threads).map(|t| CachePadded::new(AtomicU64::new(bound(t) | bound(t + 1) << 32))).collect()))
    }

    /// Claims up to `n` jobs of part `p`, from its front or from its back.
    fn claim(&self, p: usize, n: usize, from_front: bool) -> Option<Range<usize>> {
        let part = &self.0[p];
        let mut cur = part.load(Ordering::Relaxed);
        loop {
            let (front, back) = ((cur & u64::from(u32::MAX)) as usize, (cur >> 32) as usize);
            if front >= back {
                return None;
            }
            let (taken, next) = match from_front {
                true => {
                    let end = back.min(front + n);
                    (front..end, end as u64 | (back as u64) << 32)
                }
                false => {
                    let start = front.max(back.saturating_sub(n));
                    (start..back, front as u64 | (start as u64) << 32)
                }
            };
            match part.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(taken),
                Err(seen) => cur = seen,
            }
        }
    }

    fn front(&self, p: usize, n: usize) -> Option<Range<usize>> {
        self.claim(p, n, true)
    }

    fn back(&self, p: usize, n: usize) -> Option<Range<usize>> {
        self.claim(p, n, false)
    }
}

/// What the threads of one [`share_pieces`] share: the pieces, the rounds, and
/// whether a thread failed.
struct Sharing {
    pieces: Vec<Range<usize>>,
    rounds: Vec<Round>,
    threads: usize,
    stop: AtomicBool,
}

/// One round of a [`share_pieces`]: who has taken which piece, and how many
/// pieces each thread has done.
struct Round {
    parts: Parts,
    done: Vec<CachePadded<AtomicUsize>>,
}

/// One thread's [`Claims`]: its round, whether it holds a piece not yet counted done,
/// and whether it was told that none is left in the round.
struct ThreadClaims<'s> {
    shared: &'s Sharing,
    me: usize,
    round: Cell<usize>,
    taken: Cell<bool>,
    drained: Cell<bool>,
}

impl ThreadClaims<'_> {
    /// This thread's round, while there is one.
    fn round(&self) -> Option<&Round> {
        self.shared.rounds.get(self.round.get())
    }

    fn finish(&self) {
        if self.taken.replace(false)
            && let Some(round) = self.round()
        {
            round.done[self.me].fetch_add(1, Ordering::Release);
        }
    }
}

impl Claims for ThreadClaims<'_> {
    fn pieces(&self) -> usize {
        self.shared.pieces.len()
    }

    fn next(&self) -> Option<(usize, Range<usize>)> {
        self.finish();
        let s = self.shared;
        let claimed = match (self.round(), s.stop.load(Ordering::Acquire)) {
            (Some(round), false) => round.parts.front(self.me, 1).or_else(|| {
                (1..s.threads).map(|k| (self.me + k) % s.threads).find_map(|other| round.parts.back(other, 1))
            }),
            _ => None,
        };
        match claimed {
            Some(p) => {
                self.taken.set(true);
                Some((p.start, s.pieces[p.start].clone()))
            }
            None => {
                self.drained.set(true);
                None
            }
        }
    }

    fn all_done(&self) -> bool {
        self.finish();
        let s = self.shared;
        let Some(round) = self.round().filter(|_| self.drained.replace(false)) else {
            s.stop.store(true, Ordering::Release);
            return false;
        };
        // The wait is for pieces other threads are working on, never for one not yet
        // taken: this thread took what was left.
        let mut backoff = Backoff::new(64);
        loop {
            if s.stop.load(Ordering::Acquire) {
                return false;
            }
            if round.done.iter().map(|d| d.load(Ordering::Acquire)).sum::<usize>() == s.pieces.len() {
                self.round.set(self.round.get() + 1);
                return true;
            }
            backoff.snooze();
        }
    }
}

/// Stops the other threads of a [`share_pieces`] when its thread panics: they may
/// be waiting for its piece.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(threads: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    #[test]
    fn shared_jobs_run_once_each_and_an_error_stops_later_claims() {
        let pool = pool(3);
        let jobs: Vec<usize> = (0..1000).collect();
        let refs: Vec<&usize> = jobs.iter().collect();
        for per_claim in [1, 7, 1000] {
            let runs: Vec<AtomicUsize> = jobs.iter().map(|_| AtomicUsize::new(0)).collect();
            share_jobs(&pool, &refs, per_claim, |&j| {
                runs[j].fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1), "per claim {per_claim}");
        }
        // Job 10 fails: its error is returned, and no claim starts after it. Jobs that
        // start later can only be the rest of the claims the other two threads hold
        // (at most 5 jobs each).
        let (failed, after) = (std::sync::atomic::AtomicBool::new(false), AtomicUsize::new(0));
        let e = share_jobs(&pool, &refs, 5, |&j| {
            if failed.load(Ordering::SeqCst) {
                after.fetch_add(1, Ordering::SeqCst);
            }
            if j == 10 {
                let e = Error::Internal("job 10".into());
                failed.store(true, Ordering::SeqCst);
                return Err(e);
            }
            // Jobs long enough that none can start between the flag and the stop.
            std::thread::sleep(std::time::Duration::from_micros(500));
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e.to_string(), Error::Internal("job 10".into()).to_string());
        assert!(after.load(Ordering::SeqCst) <= 2 * 5, "{} jobs started after the error", after.load(Ordering::SeqCst));
    }

    #[test]
    fn parts_hand_out_every_job_once_from_both_ends() {
        // Four threads take from their own part's front, then from the others' backs,
        // all at once: every job is taken exactly once, and each claim is contiguous.
        for (jobs, threads) in [(1000, 4), (7, 4), (3, 2), (100_003, 3)] {
            let parts = Parts::new(jobs, threads).unwrap();
            let taken: Vec<AtomicUsize> = (0..jobs).map(|_| AtomicUsize::new(0)).collect();
            std::thread::scope(|s| {
                for me in 0..threads {
                    let (parts, taken) = (&parts, &taken);
                    s.spawn(move || {
                        let take = |r: Range<usize>| r.for_each(|j| _ = taken[j].fetch_add(1, Ordering::Relaxed));
                        while let Some(r) = parts.front(me, 1 + me) {
                            take(r);
                        }
                        for other in (1..threads).map(|k| (me + k) % threads) {
                            while let Some(r) = parts.back(other, 3) {
                                take(r);
                            }
                        }
                    });
                }
            });
            assert!(taken.iter().all(|t| t.load(Ordering::Relaxed) == 1), "{jobs} jobs over {threads} threads");
        }
        assert!(Parts::new(1 << 33, 2).is_none());
    }
}
