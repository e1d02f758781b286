//! Fusion across calls (`dist_sync`): non-blocking pushes and pushpulls of small keys,
//! made one after another, are held back on the worker group's engine and run as one
//! call, whose keys then share one comparison of the workers' calls and one fused
//! allreduce, where each call alone would pay both round trips across the network.
//!
//! What joins a batch depends only on the sequence of calls, never on timing, so every
//! worker of a job makes the same batches:
//! - a call joins the held batch when it is a non-blocking `push` or `pushpull` of the
//!   same store, with the default merger or an optimizer (a custom updater's failure
//!   must reach its own call only), whose keys are each below a quarter of the store's
//!   fusion size ([`crate::KVStoreBuilder::fuse_calls`]; the call's keys together too)
//!   and not in the batch already (a second push of a key must follow the first), and
//!   that uses no array a call of the batch uses (a value that another call writes
//!   must be read after that write, two writes of one out must keep their order: in a
//!   batch every sum comes before any copy);
//! - a batch is released (queued to run) once its values reach the fusion size or it
//!   holds [`MAX_CALLS`] calls; when any other call of the group is made (blocking or
//!   not, on any of its stores: `Engine::submit` releases it first); and when a caller
//!   asks for one of its calls: [`crate::Pending::wait`], `wait_timeout`, `is_done`,
//!   [`crate::KVStore::wait_all`], a read or write of an out one of its calls writes
//!   (`ndarray/pending.rs`), a change of merger, dropping the store.
//!
//! A worker's own calls may cut its batch where the others' do not: it waits (or reads
//! a pending out) where they do not, its calls share an array where theirs do not, or
//! it refuses a call before looking it up (the caller refused the arguments,
//! [`crate::Values::Refused`], or named a key never initialised: a step of its own). Its
//! step then holds fewer calls than theirs, and the workers' comparison of their calls
//! cuts every worker's step to the fewest (`steps.rs`, [`Store::check_calls`]); the rest
//! are the next step. The workers thus make the same steps whenever they make the same
//! calls, and each call goes on or fails as it would alone, on every worker.
//!
//! A batch runs as one call that keeps each call's own outcome: each call is checked
//! alone, and one that fails its checks (on any worker) fails alone, on every worker,
//! with nothing changed for it; the others go on together, and an error after the
//! checks (a broken group) reaches each of them. The sums are bit-identical to the
//! calls run one by one: each key is summed alike wherever it sits in a fused buffer
//! (`kvstore-mpi`'s fixed tree on 3 or more workers).

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::engine::{self, Engine, HeldBatch, HeldCalls, Var, Vars};
use crate::error::{Error, Result};
use crate::kvstore::calls::{Copies, Input, Owned, borrow, borrow_inputs, start_reads};
use crate::kvstore::data::{Entry, Found, Group, Merger, Store};
use crate::kvstore::locks::Held;
use crate::kvstore::merge::Calls;
use crate::kvstore::pending::{Done, Pending};
use crate::kvstore::plan::Plan;
use crate::kvstore::stats::{CallSpan, Phase};
use crate::kvstore::steps::StepKey;
use crate::ndarray::PendingWrites;
use crate::timeline::{self, Arg};

/// The most calls one batch holds (the workers' comparison marks refused calls in a
/// 64-bit mask).
pub(in crate::kvstore) const MAX_CALLS: usize = 64;

/// The default fusion size of a `dist_sync` store: a batch is released once its values
/// reach 1 MiB, and keys of 256 KiB or more go alone. Measured on ResNet-50's tensors
/// over TCP, buckets of 1 MiB left less communication exposed than 256 KiB or 4 MiB.
pub(in crate::kvstore) const DEFAULT_FUSE_BYTES: usize = 1 << 20;

/// A call held in a batch: what `queue` would have queued.
struct Call {
    op: &'static str,
    push: Owned<Input>,
    pull: Owned,
    done: Arc<Done>,
    writes: PendingWrites,
    /// When it was made, and its flow on the timeline (0: none).
    made: (u64, u64),
}

/// The calls of one batch, and what decides whether the next joins.
struct Batch {
    store: Arc<Store>,
    calls: Vec<Call>,
    keys: HashSet<usize>,
    bytes: usize,
}

/// What a call brings to a batch: its keys (by index) and their bytes.
pub(in crate::kvstore) struct Fuse {
    keys: Vec<usize>,
    bytes: usize,
}

impl HeldBatch for Batch {
    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn into_job(self: Box<Self>) -> Arc<dyn engine::Job> {
        engine::job(move || engine::run_as(true, || self.run()))
    }
}

impl Batch {
    fn run(self) {
        let Batch { store, calls, keys, .. } = self;
        // Each call's wait in the batch and the queue, then the batch's run.
        let now = timeline::now();
        for c in &calls {
            store.counters.add(Phase::Queued, now.saturating_sub(c.made.0));
        }
        for c in &calls {
            timeline::span_apart("queued", c.made.0, now, c.made.1, vec![("fused", Arg::U(calls.len() as u64))]);
            timeline::flow_end(c.op, c.made.1, now);
        }
        let span = CallSpan::batch(keys.len(), now, || key_bytes(&calls));
        // What each call's handle is told once its step has run, apart from what the
        // steps read.
        let (calls, mut ends): (Vec<_>, Vec<_>) =
            calls.into_iter().map(|c| ((c.op, c.push, c.pull), Some((c.done, c.writes)))).unzip();
        let (values, _reading): (Vec<Copies>, Vec<_>) = calls.iter().map(|(_, push, _)| start_reads(push)).unzip();
        // Each call is done once its step has run (a batch cut into several steps,
        // `Store::check_calls`): its outs readable before its handle says so, as
        // `queue`'s. Its values are returned with the batch's.
        let mut finish = |first: usize, results: Vec<Result<()>>| {
            for (end, result) in ends[first..].iter_mut().zip(results) {
                if let Some((done, writes)) = end.take() {
                    drop(writes);
                    done.finish(result);
                }
            }
        };
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let found = calls
                .iter()
                .zip(&values)
                .map(|((op, push, pull), v)| (*op, borrow_inputs(push, v), borrow(pull)))
                .collect();
            store.push_pull_fused(Plan::batch(&store, found), &mut finish);
        }));
        if ran.is_err() {
            finish(0, (0..calls.len()).map(|_| Err(Error::Internal("fused calls panicked".into()))).collect());
        }
        drop(values);
        drop(span);
        drop(calls);
    }
}

/// Each key of a batch's calls, once, with its bytes: the `key_bytes` of the batch's
/// event, by which a summary of the timeline shares the batch's time among its keys
/// (its fused allreduce moves them as one buffer).
fn key_bytes(calls: &[Call]) -> Vec<(String, u64)> {
    let mut seen = HashSet::new();
    let entries = calls.iter().flat_map(|c| c.push.iter().map(|(e, _)| e).chain(c.pull.iter().map(|(e, _)| e)));
    entries.filter(|e| seen.insert(e.index)).map(|e| (e.key.as_str().to_string(), e.bytes())).collect()
}

impl Store {
    /// Whether a non-blocking call may join a batch (see the module docs), and what it
    /// brings to it.
    pub(in crate::kvstore) fn fusable<'a>(
        &self,
        engine: &Engine,
        op: &'static str,
        push: &Found<'a>,
        pull: &Found<'a>,
    ) -> Option<Fuse> {
        let limit = self.fuse_bytes;
        if limit == 0 || !engine.is_ordered() || push.is_empty() || !matches!(op, "push" | "pushpull") {
            return None;
        }
        if !matches!(*self.merger.try_read()?, Merger::Assign | Merger::Optimizer(_)) {
            return None;
        }
        let mut keys = Vec::with_capacity(push.len() + pull.len());
        let mut bytes = 0usize;
        for g in push.iter().chain(pull) {
            let size = g.arrays.first().map_or(0, |a| a.size() * a.dtype().size());
            if size >= limit / 4 {
                return None;
            }
            bytes += size;
            keys.push(g.entry.index);
        }
        (bytes < limit / 4).then_some(Fuse { keys, bytes })
    }

    /// Holds a non-blocking call in the group engine's batch (joining the batch held
    /// now, or starting one) and returns its handle.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::kvstore) fn hold(
        self: &Arc<Self>,
        engine: &Arc<Engine>,
        op: &'static str,
        vars: Vars,
        push: Owned<Input>,
        pull: Owned,
        fuse: Fuse,
        made: (u64, u64),
    ) -> Pending {
        let done = Done::new(Arc::clone(&self.unobserved), engine.id());
        let outs: Vec<_> = pull.iter().flat_map(|(_, outs)| outs.iter().cloned()).collect();
        let out_ids: Vec<usize> = outs.iter().map(|a| a.buffer_id()).collect();
        let writes = match PendingWrites::new(engine.id(), outs) {
            Ok(writes) => writes,
            Err(e) => return Pending::finished(Err(e), Arc::clone(&self.unobserved)),
        };
        let call = Call { op, push, pull, done: Arc::clone(&done), writes, made };
        let owner = Arc::as_ptr(self);
        let mut held = engine.held();
        let (id, bytes, calls) = if let Some(open) = held.open()
            && let Some(batch) = open.calls.as_any().downcast_mut::<Batch>()
            && std::ptr::eq(Arc::as_ptr(&batch.store), owner)
            && fuse.keys.iter().all(|k| !batch.keys.contains(k))
            && !vars.iter().any(|v| matches!(v, Var::Array(_)) && open.vars.contains(v))
        {
            batch.calls.push(call);
            batch.keys.extend(&fuse.keys);
            batch.bytes += fuse.bytes;
            open.vars.extend(vars.iter().copied());
            open.outs.extend(&out_ids);
            (open.id, batch.bytes, batch.calls.len())
        } else {
            let batch = Batch {
                store: Arc::clone(self),
                calls: vec![call],
                keys: fuse.keys.into_iter().collect(),
                bytes: fuse.bytes,
            };
            (held.start(HeldCalls { id: 0, vars, outs: out_ids, calls: Box::new(batch) }), fuse.bytes, 1)
        };
        if bytes >= self.fuse_bytes || calls >= MAX_CALLS {
            held.release();
        }
        drop(held);
        Pending::held(done, engine, id)
    }
}

/// Where each group's key is among `entries` (a batch's locked keys, in index order,
/// which hold every key of its calls).
fn slots(entries: &[&Arc<Entry>], groups: &[Group<'_>]) -> Vec<usize> {
    groups.iter().map(|g| entries.partition_point(|e| e.index < g.entry.index)).collect()
}

impl Store {
    /// Runs a batch's calls as one (see the module docs).
    ///
    /// `plans`: the calls' plans ([`Plan::batch`]: each planned and checked alone,
    /// before anything is locked, with one compression).
    ///
    /// As one step, or several where another worker's step holds fewer of them
    /// ([`Store::check_calls`]): each step runs the calls every worker's holds.
    ///
    /// `done(first, results)`: the results of a step's calls, from call `first` on, as
    /// each step ends.
    fn push_pull_fused(&self, mut plans: Vec<Plan<'_>>, done: &mut dyn FnMut(usize, Vec<Result<()>>)) {
        for plan in plans.iter().filter(|p| p.checked.is_ok()) {
            self.counters.bytes(plan.bytes());
        }
        let mut first = 0;
        while !plans.is_empty() {
            let (ran, rest) = self.fused_step(plans);
            let n = ran.len();
            done(first, ran);
            (first, plans) = (first + n, rest);
        }
    }

    /// One step of [`Store::push_pull_fused`]: the results of the first calls of
    /// `plans`, and the plans of the calls left for the next step.
    fn fused_step<'a>(&self, mut plans: Vec<Plan<'a>>) -> (Vec<Result<()>>, Vec<Plan<'a>>) {
        const OP: &str = "push";
        let n = plans.len();
        let every = |e: Error| ((0..n).map(|_| Err(e.clone())).collect::<Vec<_>>(), Vec::new());
        let compression = plans.first().and_then(|p| p.compression);
        let mut owned: Vec<Arc<Entry>> = plans.iter().flat_map(Plan::entries).map(Arc::clone).collect();
        owned.sort_by_key(|e| e.index);
        owned.dedup_by_key(|e| e.index);
        let entries: Vec<&Arc<Entry>> = owned.iter().collect();
        let locked = Held::new(OP, self, &entries)
            .and_then(|held| Ok((held.merger_read(OP, &self.merger)?, held.write(OP, &entries)?, held)));
        let (merger, mut guards, _held) = match locked {
            Ok(l) => l,
            Err(e) => return every(e),
        };
        // Where each call's keys are among the locked ones.
        let at: Vec<(Vec<usize>, Vec<usize>)> =
            plans.iter().map(|p| (slots(&entries, &p.push), slots(&entries, &p.pull))).collect();
        // An optimizer's refusal of a key (an integer weight) is a check too: it fails
        // that call alone, as when made blocking.
        let optimizer = |push: &[Group<'_>], at: &[usize]| match &*merger {
            Merger::Optimizer(rt) => {
                push.iter().zip(at).try_for_each(|(g, &i)| rt.check_weight(&g.entry.key, &guards[i].value))
            }
            _ => Ok(()),
        };
        let local: Vec<Result<()>> = plans
            .iter()
            .zip(&at)
            .map(|(p, (push_at, _))| p.checked.clone().and_then(|()| optimizer(&p.push, push_at)))
            .collect();
        let counts: Vec<(&'static str, usize)> = plans.iter().map(|p| (p.op, p.push.len())).collect();
        // The workers compare each key with its stored shape and dtype (the same on every
        // worker): a value of another shape on one worker is that worker's refusal of
        // its call, which fails that call alone, not a difference that fails the batch.
        let keys: Vec<StepKey<'_>> =
            plans.iter().flat_map(|p| &p.push).map(|g| (&g.entry.key, g.entry.shape(), g.entry.dtype)).collect();
        let mut results = match self.check_calls(OP, &counts, &keys, local, compression, merger.identity()) {
            Ok(r) => r,
            Err(e) => return every(e),
        };
        // The calls past this step's are the next step's.
        let rest = plans.split_off(results.len());
        // The calls that go on, their keys in index order (the order of their slots),
        // each with its call's number. (A custom updater, installed after the calls
        // were made and fused, updates each call's keys alone: see `Store::apply`.)
        let (mut push, mut pull) = (Vec::new(), Vec::new());
        for (n, ((plan, (p_at, q_at)), r)) in plans.into_iter().zip(at).zip(&results).enumerate() {
            if r.is_ok() {
                push.extend(plan.push.into_iter().zip(p_at).map(|(g, i)| (g, i, n)));
                pull.extend(plan.pull.into_iter().zip(q_at).map(|(g, i)| (g, i, n)));
            }
        }
        if push.is_empty() {
            return (results, rest);
        }
        push.sort_by_key(|(_, i, _)| *i);
        pull.sort_by_key(|(_, i, _)| *i);
        let (push, (push_slots, push_calls)): (Vec<Group<'_>>, (Vec<usize>, Vec<usize>)) =
            push.into_iter().map(|(g, i, n)| (g, (i, n))).unzip();
        let (pull, (pull_slots, pull_calls)): (Vec<Group<'_>>, (Vec<usize>, Vec<usize>)) =
            pull.into_iter().map(|(g, i, n)| (g, (i, n))).unzip();
        let mut calls = Calls { push: push_calls, pull: pull_calls, results: &mut results };
        let applied =
            self.apply(&push, &pull, &push_slots, &pull_slots, &mut guards, &merger, compression, Some(&mut calls));
        if let Err(e) = applied {
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(e.clone());
            }
        }
        (results, rest)
    }
}
