//! How a store's calls reach its engine: the one path of every push, pull, pushpull
//! and broadcast, blocking or not, and the non-blocking API itself.
//!
//! A call is looked up (its keys must exist), then either runs at once on the caller's
//! thread, when it is blocking and none of its keys or outs is busy with an earlier
//! call ([`Engine::may_run_now`]), or is queued on the engine with the arrays it needs: a
//! non-blocking push borrows its values (the caller may write them at once: a write
//! before the call read them copies them for it, `ndarray/loan.rs`), a
//! blocking one shares them (its caller waits); a pull's outs are marked pending until
//! it wrote them. The work itself is the same function either way
//! ([`Store::push_pull`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use smallvec::SmallVec;

use super::run::pieces::Given;
use parking_lot::Mutex;

use super::data::{Entry, Found, Group, KVStore, Slot, Store};
use super::forms::{Run, Values, flat_runs, pairs_of, runs};
use super::locks;
use super::locks::Held;
use super::pending::HasDone;
use super::pending::{Done, Pending};
use super::plan::{Like, Plan, check_arrays, check_context};
use super::stats::{CallSpan, Phase};
use super::steps;
use crate::engine::{self, Job, Var, Vars};
use crate::error::{Error, Result};
use crate::key::{Key, Keys};
use crate::ndarray::{Lent, NDArray, PendingWrites, Reading, empty_list};
use crate::waits;
use std::collections::HashMap;

/// A call's keys with their arrays (or what stands for them), held by the call itself so
/// it can run after its caller returned.
pub(super) type Owned<T = NDArray> = Vec<(Arc<Entry>, SmallVec<[T; 4]>)>;

/// A call's keys as given, each with its arrays: what it pushes and what it pulls.
type Pairs<'a> = (Vec<Run<'a>>, Vec<Run<'a>>);

/// A broadcast's values and outs (what `init` and the pull take).
pub(super) fn broadcast_args<'a>(keys: Keys, values: Values<'a>, outs: Values<'a>) -> Result<Pairs<'a>> {
    let init = runs("broadcast", keys.clone(), values, "values")?;
    Ok((init, runs("broadcast", keys, outs, "outs")?))
}

/// The pairs of each call form, the same for its blocking and non-blocking twin. Keys
/// that come with no array must still be initialised, as with any other call on them.
impl Store {
    /// A call's one plan (see `plan.rs`), built here for every runner but the fused one,
    /// then its runner: the spread runner when `spread` (the call was not offered to it
    /// yet), its checks passed and it takes it (`run/pieces.rs`), else the ordinary one
    /// (`run/inline.rs`).
    pub(super) fn push_pull<'a>(&self, op: &'static str, push: Found<'a>, pull: Found<'a>, spread: bool) -> Result<()> {
        if push.is_empty() && pull.is_empty() {
            return Ok(());
        }
        let plan = Plan::new(self, op, push, pull);
        if plan.checked.is_ok() {
            self.counters.bytes(plan.bytes());
        }
        if spread
            && plan.checked.is_ok()
            && let Some(r) = self.spread(&plan)
        {
            return r;
        }
        self.run_inline(&plan)
    }
}

impl Store {
    pub(super) fn push_args<'a>(&self, keys: Keys, values: Values<'a>) -> Result<Pairs<'a>> {
        self.require_bare_keys("push", &keys, values)?;
        Ok((runs("push", keys, values, "values")?, Vec::new()))
    }

    pub(super) fn pull_args<'a>(&self, keys: Keys, outs: Values<'a>) -> Result<Pairs<'a>> {
        self.require_bare_keys("pull", &keys, outs)?;
        Ok((Vec::new(), runs("pull", keys, outs, "outs")?))
    }

    pub(super) fn pushpull_args<'a>(&self, keys: Keys, values: Values<'a>, outs: Values<'a>) -> Result<Pairs<'a>> {
        self.require_bare_keys("pushpull", &keys, values)?;
        self.require_bare_keys("pushpull", &keys, outs)?;
        let push = runs("pushpull", keys.clone(), values, "values")?;
        Ok((push, runs("pushpull", keys, outs, "outs")?))
    }

    /// `pushpull` into the pushed arrays themselves.
    pub(super) fn in_place_args<'a>(&self, keys: Keys, values: Values<'a>) -> Result<Pairs<'a>> {
        self.require_bare_keys("pushpull", &keys, values)?;
        let pairs = runs("pushpull", keys, values, "values")?;
        Ok((pairs.clone(), pairs))
    }
}

/// Makes a call's arrays ready for it to run on the caller's thread
/// ([`NDArray::prepare_for_call`]): its values to be read, its outs to be written.
fn prepare_for_call(push: &Found<'_>, pull: &Found<'_>) -> Result<()> {
    for value in push.iter().flat_map(|g| &g.arrays) {
        value.prepare_for_call(false)?;
    }
    for out in pull.iter().flat_map(|g| &g.arrays) {
        out.prepare_for_call(true)?;
    }
    Ok(())
}

/// `owned` as the call's keys with their arrays.
pub(super) fn borrow(owned: &Owned) -> Found<'_> {
    owned.iter().map(|(e, arrays)| Group { entry: Arc::clone(e), arrays: arrays.iter().collect() }).collect()
}

/// A call's keys with what `f` makes of each array, for a call that holds them.
fn own<T>(found: Found<'_>, f: impl Fn(&NDArray) -> T) -> Owned<T> {
    found.into_iter().map(|g| (g.entry, g.arrays.into_iter().map(&f).collect())).collect()
}

/// [`own`] with a fallible `f`: its first error.
fn try_own<T>(found: Found<'_>, f: impl Fn(&NDArray) -> Result<T>) -> Result<Owned<T>> {
    found.into_iter().map(|g| Ok((g.entry, g.arrays.into_iter().map(&f).collect::<Result<_>>()?))).collect()
}

/// The vars of a call: its keys, and the arrays it uses that an earlier queued call
/// writes; a queued call also takes all its arrays (a call queued later that writes
/// one of them then runs after it: a pull into a value it pushes cannot overtake its
/// read). A call that runs at once needs no more: its caller waits, an array it uses is
/// not pending for anyone else, and an array it writes that a queued call will read
/// leaves that call a copy first (`ndarray/loan.rs`).
fn vars_of<'f, 'a>(push: &'f Found<'a>, pull: &'f Found<'a>, queued: bool) -> impl Iterator<Item = Var> {
    let keys = push.iter().chain(pull).map(|g| Var::Key(g.entry.index));
    let arrays = push.iter().chain(pull).flat_map(|g| g.arrays.iter());
    keys.chain(arrays.filter(move |a| queued || a.is_pending()).map(|a| Var::Array(a.buffer_id())))
}

/// A queued push's value: shared with a caller that waits for the call, or lent by
/// one that does not (see `ndarray/loan.rs`).
pub(super) enum Input {
    Shared(NDArray),
    Lent(Lent),
}

impl Input {
    /// Starts the call's read, once it runs: `None` when it reads [`Input::array`]
    /// itself, else the copy to read instead (see [`Lent::start_read`]).
    fn start_read(&self) -> Option<NDArray> {
        match self {
            Input::Shared(_) => None,
            Input::Lent(l) => l.start_read(),
        }
    }

    fn array(&self) -> &NDArray {
        match self {
            Input::Shared(a) => a,
            Input::Lent(l) => l.array(),
        }
    }
}

/// The copies a queued push reads instead of its values, by key and value (`None`: the
/// value itself), from [`start_reads`].
pub(super) type Copies = Vec<SmallVec<[Option<NDArray>; 4]>>;

/// Starts the reads of a queued push's values, once the call runs; the loans are
/// listed for [`crate::ndarray::values_read`] until the [`Reading`] is dropped.
pub(super) fn start_reads(push: &Owned<Input>) -> (Copies, Reading) {
    let copies = push.iter().map(|(_, inputs)| inputs.iter().map(Input::start_read).collect()).collect();
    let lent = push.iter().flat_map(|(_, inputs)| inputs.iter()).filter_map(|i| match i {
        Input::Lent(l) => Some(l),
        Input::Shared(_) => None,
    });
    (copies, Reading::new(lent))
}

/// A queued push's keys with the arrays it reads (`copies`: from [`start_reads`]). The
/// values themselves are borrowed, not cloned: the engine's thread leaves alone the
/// memory that their callers' threads write.
pub(super) fn borrow_inputs<'a>(push: &'a Owned<Input>, copies: &'a Copies) -> Found<'a> {
    push.iter()
        .zip(copies)
        .map(|((e, inputs), copies)| Group {
            entry: Arc::clone(e),
            arrays: inputs.iter().zip(copies).map(|(i, c)| c.as_ref().unwrap_or_else(|| i.array())).collect(),
        })
        .collect()
}

/// A queued call and its handle's state, one allocation that the engine and the call's
/// [`Pending`] share. The engine's thread runs the call and gives back at once what it
/// borrowed (the values' loans, the outs' pending writes and its references to keys and
/// outs) before it finishes the handle, and lets go of the store after, but the memory
/// goes with the last holder: the caller's thread when it keeps the handle until the
/// call is done (the JNI layer keeps the handles of Java's and Clojure's calls on their
/// threads until they are done, for this), see [`Job`]. Whatever panics, the handle is
/// finished.
struct Queued {
    done: Done,
    op: &'static str,
    /// Whether the caller goes on without waiting (see [`crate::backend::in_background`]).
    background: bool,
    work: Mutex<Work>,
}

/// What a queued call works on; emptied once it ran (short lists keep their memory:
/// [`empty_list`]).
struct Work {
    store: Option<Arc<Store>>,
    push: Owned<Input>,
    pull: Owned,
    writes: PendingWrites,
    /// A non-blocking call's span from its submission, and its flow on the timeline.
    span: Option<(CallSpan, u64)>,
}

impl HasDone for Queued {
    fn done(&self) -> &Done {
        &self.done
    }
}

impl Job for Queued {
    fn run(&self) {
        let mut work = self.work.lock();
        let Some(store) = work.store.take() else { return };
        let op = self.op;
        // The call's wait in the queue, then its run, on this thread.
        let span = work.span.take().map(|(mut span, flow)| {
            let now = crate::timeline::now();
            store.counters.add(Phase::Queued, now.saturating_sub(span.start()));
            crate::timeline::span_apart("queued", span.start(), now, flow, Vec::new());
            crate::timeline::flow_end(op, flow, now);
            span.restart(now);
            span
        });
        engine::run_as(self.background, || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let (copies, _reading) = start_reads(&work.push);
                store.push_pull(op, borrow_inputs(&work.push, &copies), borrow(&work.pull), true)
            }))
            .unwrap_or_else(|_| Err(Error::Internal(format!("{op} panicked"))));
            // The values are returned and the outs readable before the handle says the
            // call is done.
            let returned = std::panic::catch_unwind(AssertUnwindSafe(|| {
                empty_list(&mut work.push);
                work.writes.end();
                empty_list(&mut work.pull);
            }));
            drop(work);
            // The call's event is written before its handle says it is done.
            drop(span);
            self.done.finish(match returned {
                Ok(()) => r,
                Err(_) => Err(Error::Internal(format!("{op} panicked returning its arrays"))),
            });
            drop(store);
        });
    }
}

impl KVStore {
    /// Before a blocking call of many keys turns its keys into `Key`s and pairs them
    /// with `arrays` (its values, or its outs for a pull or a broadcast), which takes
    /// its thread tens of microseconds: a pool thread the call may share its work with
    /// is woken now, so that it is up, not asleep, when the work is ready (`Comm::wake`;
    /// only when nothing is queued, as a call is spread only then). Every blocking call
    /// that [`KVStore::call`] may spread wakes the pool here, once.
    pub(super) fn wake_for(&self, arrays: Values<'_>) {
        let (keys, first, per_key) = match arrays {
            Values::Many(vs) => (vs.len(), vs.first(), 1),
            Values::Nested(vss) => {
                let first = vss.first().map_or(&[][..], |vs| &vs[..]);
                (vss.len(), first.first(), first.len())
            }
            Values::One(_) | Values::Refused(_) => return,
        };
        if let Some(a) = first
            && keys > 1
            && self.engine.idle()
        {
            self.store.comm.wake(keys * a.size() * a.dtype().size() * (per_key + 1));
        }
    }

    /// The one path of push, pull and pushpull when blocking: at once on this thread
    /// when nothing earlier holds its keys or outs, else queued and waited for.
    pub(super) fn call<'a>(
        &self,
        op: &'static str,
        push: Vec<Run<'a>>,
        pull: Vec<Run<'a>>,
        priority: i32,
    ) -> Result<()> {
        locks::check_reentry(op, &self.store)?;
        if push.is_empty() && pull.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.on_tables(op, &push, &pull, priority) {
            return r;
        }
        let _span = self.store.counters.begin(op, &push, &pull);
        let _inputs = self.store.counters.inputs();
        // Nothing queued: a call of many small keys may be spread as given, its plan
        // built by the spread runner's first round, lookups and all (`run/pieces.rs`).
        // A call is offered to that runner once, and its keys are looked up once.
        // Calls that run at once run as the engine's (`engine::run_now`): a pending write
        // or a loan of its made after they took their arrays belongs to a later call.
        let engine = self.engine.id();
        let pushes = !push.is_empty();
        let refused = |e| if pushes { self.refused_everywhere(op, e) } else { e };
        let idle = self.engine.idle();
        let given = match idle {
            true => engine::run_now(&self.engine, 0, || self.store.spread_given(op, &push, &pull)),
            false => Given::NotOne,
        };
        let (push, pull) = match given {
            Given::Ran(r) => return r,
            Given::LookedUp { push, pull } => (push, pull),
            Given::NotOne => {
                let found = self.store.lookup(op, push).and_then(|push| Ok((push, self.store.lookup(op, pull)?)));
                found.map_err(refused)?
            }
        };
        // Offered to the spread runner once: here when the engine was idle, else by
        // `push_pull`.
        let spread = !idle;
        if let Some(before) = self.engine.may_run_now(vars_of(&push, &pull, false)) {
            prepare_for_call(&push, &pull)?;
            return engine::run_now(&self.engine, before, || self.store.push_pull(op, push, pull, spread));
        }
        // On an ordered engine, a call from a caller's own thread (not an updater's, nor
        // an engine's: theirs queue or fail as ever, whatever the timing) may run in the
        // worker's stead. Its arrays are made ready first: their waits may need the worker.
        if self.engine.is_ordered() && !locks::inside_updater() && engine::current_worker() == 0 {
            prepare_for_call(&push, &pull)?;
            if let Some(stand_in) = self.engine.stand_in() {
                // (The engine is idle while it stands in: no earlier call is left.)
                return stand_in
                    .run(|| engine::run_now(&self.engine, 0, || self.store.push_pull(op, push, pull, spread)));
            }
        }
        if locks::inside_updater() {
            return Err(locks::busy_store(op));
        }
        // From an engine's thread (an on_done callback), waiting for this engine must
        // not close a cycle of waits (its own engine's, at the least).
        let _waiting = waits::wait_for(engine, || format!("a blocking {op} that must queue"))?;
        let vars: Vars = vars_of(&push, &pull, true).collect();
        // The caller waits anyway: the values are shared, once other engines' writes
        // to them are done (as a lent value would be). The outs' loans to other
        // engines' calls are reclaimed when they are marked pending (`queue`).
        let push = try_own(push, |a| a.wait_for_writes_but(engine).map(|()| Input::Shared(a.clone())))?;
        let pull = own(pull, NDArray::clone);
        self.queue(op, vars, push, pull, priority, None).wait()
    }

    /// The one path of push, pull and pushpull when non-blocking: checked and copied
    /// now, queued, and reported to the handle.
    /// `pushing`: the values the call pushes, as given (a refusal takes the call's step
    /// unless they are none).
    pub(super) fn call_async<'a>(
        &self,
        op: &'static str,
        pushing: Values<'_>,
        pairs: impl FnOnce() -> Result<Pairs<'a>>,
        priority: i32,
    ) -> Pending {
        self.back_pressure();
        let mut given = None;
        let mut pairs = Some(pairs);
        if self.store.holds_rows.load(std::sync::atomic::Ordering::Acquire)
            && let Some(f) = pairs.take()
        {
            // A call naming a table on owners runs now (`on_tables`).
            let pairs = f();
            if let Ok((push, pull)) = &pairs
                && let Some(r) = self.on_tables(op, push, pull, priority)
            {
                return Pending::finished(r, Arc::clone(&self.store.unobserved));
            }
            given = Some(pairs);
        }
        let _inputs = self.store.counters.inputs();
        let prepared = (|| -> Result<_> {
            locks::check_reentry(op, &self.store)?;
            let (push, pull) = match (given, pairs) {
                (Some(given), _) => given?,
                (None, Some(f)) => f()?,
                (None, None) => return Err(Error::Internal(format!("{op}: a call of no arrays"))),
            };
            // Timed from here whether the timeline records or not: its wait in the
            // queue is its `queued` phase.
            let span = self.store.counters.begin(op, &push, &pull).timed();
            let (push, pull) = (self.store.lookup(op, push)?, self.store.lookup(op, pull)?);
            let vars: Vars = vars_of(&push, &pull, true).collect();
            let fuse = self.store.fusable(&self.engine, op, &push, &pull);
            // The values are lent, not copied: the caller may write them at once (a
            // write before the call read them copies them first). An array that
            // another store's queued call writes is lent (or marked as an out) once
            // that write is done: the calls take effect in the order they were made.
            // An out lent to another engine's call gives it a copy when it is marked
            // pending (`PendingWrites::new`).
            let engine = self.engine.id();
            let push = try_own(push, |a| a.lend(engine).map(Input::Lent))?;
            let pull = own(pull, NDArray::clone);
            Ok((vars, push, pull, fuse, span))
        })();
        match prepared {
            Ok((vars, push, pull, Some(fuse), span)) => {
                let made = (span.start(), crate::timeline::flow_start(op, span.start()));
                let pending = self.store.hold(&self.engine, op, vars, push, pull, fuse, made);
                span.submitted();
                pending
            }
            Ok((vars, push, pull, None, span)) if !(push.is_empty() && pull.is_empty()) => {
                let (made, flow) = (span.start(), crate::timeline::flow_start(op, span.start()));
                let pending = self.queue(op, vars, push, pull, priority, Some((span, flow)));
                CallSpan::submitted_at(op, made);
                pending
            }
            Ok(_) => Pending::finished(Ok(()), Arc::clone(&self.store.unobserved)),
            // (A broadcast's refusals before its step take it in `broadcast_init`.)
            Err(e) if op != "broadcast" => {
                Pending::finished(Err(self.refused_pushing(op, pushing, e)), Arc::clone(&self.store.unobserved))
            }
            Err(e) => Pending::finished(Err(e), Arc::clone(&self.store.unobserved)),
        }
    }

    /// A call naming a table whose rows live on their owners (`rows.rs`), run now: a
    /// dense push into such a table is refused (on every worker), and a pull of one
    /// gathers the table from its owners, in call order, after the call's pushes and
    /// other pulls ran as usual. `None` for a call that names none.
    fn on_tables(&self, op: &'static str, push: &[Run<'_>], pull: &[Run<'_>], priority: i32) -> Option<Result<()>> {
        if !self.store.holds_rows.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let table = |k: &Key| self.store.find(k).filter(|e| self.store.rows_of(e).is_some());
        if let Some((k, _)) = push.iter().find(|(k, _)| table(k).is_some()) {
            let e = Error::Unsupported {
                what: format!("{op} of a dense value into key \"{k}\""),
                hint: "its rows live on their owners (a row-sparse table of a dist_sync store with owners): push \
                       row-sparse values (push_row_sparse), or make the store with layout replicated"
                    .to_string(),
            };
            return Some(Err(self.refused_everywhere(op, e)));
        }
        let tables: Vec<(Arc<Entry>, Vec<NDArray>)> =
            pull.iter().filter_map(|(k, outs)| Some((table(k)?, outs.to_vec()))).collect();
        if tables.is_empty() {
            return None;
        }
        let rest: Vec<Run<'_>> = pull.iter().filter(|(k, _)| table(k).is_none()).cloned().collect();
        // The call's pushes (none into a table) and its other pulls first. (Their outcome
        // is this worker's part of the tables' step: a worker whose other keys failed
        // still takes it, and every worker fails the call.)
        let rest = match rest.is_empty() && push.is_empty() {
            true => Ok(()),
            false => self.call(op, push.to_vec(), rest, priority),
        };
        Some(self.in_order(op, move |store| store.pull_tables(op, &tables, rest)))
    }

    /// Under `dist_sync`, a push, pushpull, init or broadcast refused before it reached
    /// its step (its keys and arrays did not pair up, a key was never initialised, its
    /// caller refused its arguments: [`Values::Refused`]) still takes its step,
    /// in call order, as this worker's refusal: every worker fails that call (the
    /// others naming this worker and its reason), nothing changes, and the workers' next
    /// calls stay matched (a call missing on one worker would meet its next call on the
    /// others). Returns `e`.
    pub(super) fn refused_everywhere(&self, op: &'static str, e: Error) -> Error {
        if self.store.collective.is_some()
            && self.store.compare_calls
            && (op.starts_with("push") || op == "broadcast" || op == "init")
        {
            let refusal = e.clone();
            // (Its own error again, or the group's: `e` is what the caller gets.)
            let _ = self.in_order(op, move |store| store.check_step(op, &[], Err(refusal)));
        }
        e
    }

    /// [`KVStore::refused_everywhere`] for a push or pushpull whose values, as given, are
    /// `values`: a call of no values at all takes no step (a pushpull of none is a pull
    /// on every worker, a push of none does nothing), so its refusal takes none either.
    pub(super) fn refused_pushing(&self, op: &'static str, values: Values<'_>, e: Error) -> Error {
        match values.are_none() {
            true => e,
            false => self.refused_everywhere(op, e),
        }
    }

    /// Before a non-blocking call is made: waits while the store has too many calls
    /// queued, or the copies made for queued calls hold too many bytes
    /// ([`crate::KVStoreBuilder::max_queued_calls`], `max_copied_bytes`). Not on an
    /// engine's thread, nor inside an updater (which may not wait for a store).
    ///
    /// Under a bound of over a thousand calls it looks every 16th call only (so up to
    /// 15 more may be queued): the count of finished calls is on the engine threads'
    /// cache line, and a stream of submits should not take it from them at every call.
    fn back_pressure(&self) {
        let (calls, bytes) = (self.store.max_queued_calls, self.store.max_copied_bytes);
        let sampled = calls > 1024 && !self.engine.submitted().is_multiple_of(16);
        if (sampled && crate::ndarray::copied_bytes() < bytes)
            || crate::engine::current_worker() != 0
            || locks::inside_updater()
        {
            return;
        }
        self.engine.wait_while(|queued| queued >= calls || crate::ndarray::copied_bytes() >= bytes);
    }

    /// Queues a call; `background` when its caller does not wait for it (see
    /// [`crate::backend::in_background`]).
    fn queue(
        &self,
        op: &'static str,
        vars: Vars,
        push: Owned<Input>,
        pull: Owned,
        priority: i32,
        span: Option<(CallSpan, u64)>,
    ) -> Pending {
        // A call made with a span is one its caller does not wait for.
        let background = span.is_some();
        let outs = pull.iter().flat_map(|(_, outs)| outs.iter().cloned()).collect();
        let writes = match PendingWrites::new(self.engine.id(), outs) {
            Ok(writes) => writes,
            Err(e) => return Pending::finished(Err(e), Arc::clone(&self.store.unobserved)),
        };
        let call = Arc::new(Queued {
            done: Done::running(Arc::clone(&self.store.unobserved), self.engine.id()),
            op,
            background,
            work: Mutex::new(Work { store: Some(Arc::clone(&self.store)), push, pull, writes, span }),
        });
        self.engine.submit_job(vars, priority, Arc::clone(&call) as Arc<dyn Job>);
        Pending::new(call)
    }

    /// Runs `f` on the engine, after every call queued before it, and waits: how a
    /// `dist_sync` store's `init` and `barrier` keep their collectives in call order.
    /// Elsewhere `f` runs here at once.
    pub(super) fn in_order(
        &self,
        op: &'static str,
        f: impl FnOnce(&Store) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        if !self.engine.is_ordered() {
            return f(&self.store);
        }
        locks::check_reentry(op, &self.store)?;
        if locks::inside_updater() || self.engine.on_worker() {
            return Err(locks::busy_store(op));
        }
        // Checked before `f` is queued: a wait refused after it would leave `f` to run
        // later, behind an error its caller was given.
        let _waiting = waits::wait_for(self.engine.id(), || format!("a blocking {op} that must queue"))?;
        let done = Done::new(Arc::clone(&self.store.unobserved), self.engine.id());
        let (store, finished) = (Arc::clone(&self.store), Arc::clone(&done));
        self.engine.submit(Vars::new(), 0, move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(&store)))
                .unwrap_or_else(|_| Err(Error::Internal(format!("{op} panicked"))));
            finished.finish(r);
        });
        Pending::new(done).wait()
    }

    /// `init` of flat pairs, in call order under `dist_sync`.
    pub(super) fn init_flat(&self, op: &'static str, pairs: Vec<(Key, &NDArray)>) -> Result<()> {
        let owned: Vec<(Key, NDArray)> = pairs.into_iter().map(|(k, v)| (k, v.clone())).collect();
        self.in_order(op, move |store| store.init_pairs(op, owned.iter().map(|(k, v)| (k.clone(), v)).collect()))
    }

    /// Checks a broadcast's outs against its values as a pull checks them against the
    /// stored ones (shape, dtype, context, writable), before anything is stored: a
    /// broadcast refused for its outs initialises no key.
    fn check_broadcast(init: &[(Key, &NDArray)], pull: &[Run<'_>]) -> Result<()> {
        for (k, outs) in pull {
            let Some((_, v)) = init.iter().find(|(ik, _)| ik == k) else {
                return Err(Error::invalid_argument(format!(
                    "broadcast: out key \"{k}\" is not one of the keys being broadcast"
                )));
            };
            check_arrays("broadcast", "out", k, outs.iter(), Like::Array(v))?;
        }
        Ok(())
    }

    /// A broadcast's first half, done before it returns (blocking or not): its outs
    /// checked against its values, then the keys initialised; what is left is its pull.
    pub(super) fn broadcast_init<'a>(&self, init: Vec<Run<'_>>, pull: Vec<Run<'a>>) -> Result<Vec<Run<'a>>> {
        let init = pairs_of(init);
        Self::check_broadcast(&init, &pull).map_err(|e| self.refused_everywhere("broadcast", e))?;
        self.init_flat("broadcast", init)?;
        Ok(pull)
    }

    /// [`KVStore::push`], non-blocking: the values are lent to the call (see the type's
    /// docs: the caller may write them at once), and it runs on the
    /// store's engine. See the type's docs for the order of calls.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::zeros(&[2])?)?;
    /// let g = NDArray::ones(&[2])?;
    /// let pushed = kv.push_async("w", &g, 0);
    /// g.add_assign(1.0)?; // the push still sums the 1s that `g` held when it was made
    /// pushed.wait()?;
    /// assert_eq!(kv.pull_new("w", 0)?.to_vec::<f32>()?, vec![1.0; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// Errors are those of [`KVStore::push`], from [`Pending::wait`].
    pub fn push_async<'a>(&self, keys: impl Into<Keys>, values: impl Into<Values<'a>>, priority: i32) -> Pending {
        let (keys, values) = (keys.into(), values.into());
        self.call_async("push", values, || self.store.push_args(keys, values), priority)
    }

    /// [`KVStore::pull`], non-blocking: the outs are written later, and every access to
    /// them waits until then.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::full(&[2], 3.0)?)?;
    /// kv.push_async("w", &NDArray::full(&[2], 5.0)?, 0).wait()?;
    /// let out = NDArray::zeros(&[2])?;
    /// let pulled = kv.pull_async("w", &out, 0);
    /// assert_eq!(out.to_vec::<f32>()?, vec![5.0; 2]); // waits for the pull
    /// pulled.wait()?;
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// Errors are those of [`KVStore::pull`], from [`Pending::wait`].
    pub fn pull_async<'a>(&self, keys: impl Into<Keys>, outs: impl Into<Values<'a>>, priority: i32) -> Pending {
        let (keys, outs) = (keys.into(), outs.into());
        self.call_async("pull", Values::Many(&[]), || self.store.pull_args(keys, outs), priority)
    }

    /// [`KVStore::pushpull`], non-blocking.
    ///
    /// Errors are those of [`KVStore::pushpull`], from [`Pending::wait`].
    pub fn pushpull_async<'a, 'b>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Values<'a>>,
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Pending {
        let (keys, values, outs) = (keys.into(), values.into(), outs.into());
        self.call_async("pushpull", values, || self.store.pushpull_args(keys, values, outs), priority)
    }

    /// [`KVStore::pushpull_in_place`], non-blocking: the arrays are pushed as they are
    /// when the call is made and written with the result later (until then every access
    /// to them waits, as to any pull's outs).
    ///
    /// Errors are those of [`KVStore::pushpull`], from [`Pending::wait`].
    pub fn pushpull_in_place_async<'a>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Values<'a>>,
        priority: i32,
    ) -> Pending {
        let (keys, values) = (keys.into(), values.into());
        self.call_async("pushpull", values, || self.store.in_place_args(keys, values), priority)
    }

    /// [`KVStore::pushpull_pairs`], non-blocking.
    ///
    /// Errors are those of [`KVStore::pushpull`], from [`Pending::wait`].
    pub fn pushpull_pairs_async<'a, 'b>(
        &self,
        keys: &[Key],
        values: impl Into<Values<'a>>,
        out_keys: &[Key],
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Pending {
        let (values, outs) = (values.into(), outs.into());
        self.call_async("pushpull", values, || flat_runs("pushpull", keys, values, out_keys, outs), priority)
    }

    /// [`KVStore::broadcast`], non-blocking for its pull: the keys are initialised
    /// before it returns (under `dist_sync` that waits for the calls queued before),
    /// the outs are written later.
    ///
    /// Errors are those of [`KVStore::broadcast`], from [`Pending::wait`].
    pub fn broadcast_async<'a, 'b>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Values<'a>>,
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Pending {
        let (keys, values, outs) = (keys.into(), values.into(), outs.into());
        self.call_async(
            "broadcast",
            values,
            || {
                let (init, pull) =
                    broadcast_args(keys, values, outs).map_err(|e| self.refused_everywhere("broadcast", e))?;
                Ok((Vec::new(), self.broadcast_init(init, pull)?))
            },
            priority,
        )
    }

    /// [`KVStore::broadcast_pairs`], non-blocking as [`KVStore::broadcast_async`].
    ///
    /// Errors are those of [`KVStore::broadcast`], from [`Pending::wait`].
    pub fn broadcast_pairs_async<'a, 'b>(
        &self,
        keys: &[Key],
        values: impl Into<Values<'a>>,
        out_keys: &[Key],
        outs: impl Into<Values<'b>>,
        priority: i32,
    ) -> Pending {
        let (values, outs) = (values.into(), outs.into());
        self.call_async(
            "broadcast",
            values,
            || {
                let (init, pull) = flat_runs("broadcast", keys, values, out_keys, outs)
                    .map_err(|e| self.refused_everywhere("broadcast", e))?;
                Ok((Vec::new(), self.broadcast_init(init, pull)?))
            },
            priority,
        )
    }

    /// The number of engine threads that run the store's calls (1 for `dist_sync`).
    ///
    /// ```
    /// use kvstore_core::KVStore;
    /// assert_eq!(KVStore::builder("local").engine_threads(3).build()?.engine_threads(), 3);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn engine_threads(&self) -> usize {
        self.engine.threads()
    }

    /// Waits until every call made so far has finished (MXNet's `WaitAll`).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray};
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::zeros(&[2])?)?;
    /// let outs = [NDArray::zeros(&[2])?, NDArray::zeros(&[2])?];
    /// for _ in 0..3 {
    ///     drop(kv.push_async("w", &NDArray::ones(&[2])?, 0)); // handles not kept
    /// }
    /// drop(kv.pull_async("w", &outs, 0));
    /// drop(kv.pull_async("no such key", &outs, 0)); // fails
    /// assert!(kv.wait_all().is_err()); // ... and is reported here
    /// assert_eq!(outs[1].to_vec::<f32>()?, vec![1.0; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// The first error (in the order the calls failed) of a call whose handle was
    /// dropped before anyone saw its result, not yet reported: each `wait_all` reports
    /// one, the next reports the next. Calls whose handles are kept report to their handles only.
    pub fn wait_all(&self) -> Result<()> {
        self.settle()?;
        let mut unobserved = self.store.unobserved.lock();
        match unobserved.is_empty() {
            true => Ok(()),
            false => Err(unobserved.remove(0)),
        }
    }

    /// Waits for the queued calls before a call that must see all of them (a change of
    /// updater or optimizer, saving states); from inside an updater it does not wait
    /// (the locks taken next decide, as before).
    pub(super) fn settle(&self) -> Result<()> {
        if !locks::inside_updater() && !self.engine.on_worker() {
            // From another engine's thread: not if that could never end (`waits.rs`).
            let _waiting = waits::wait_for(self.engine.id(), || "a wait for a store's earlier calls".to_string())?;
            self.engine.wait_for_earlier();
        }
        Ok(())
    }

    /// The entry of `key`, for `op`.
    pub(super) fn entry(&self, op: &'static str, key: &Key) -> Result<Arc<Entry>> {
        self.store.found(op, key)
    }

    /// Runs `f` after the store's earlier calls on `entries`: at once when none is
    /// queued, else queued behind them (and waited for).
    pub(super) fn on_keys<T: Send + 'static>(
        &self,
        op: &'static str,
        entries: &[Arc<Entry>],
        f: impl FnOnce(&Store) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        locks::check_reentry(op, &self.store)?;
        let vars: Vars = entries.iter().map(|e| Var::Key(e.index)).collect();
        if self.engine.may_run_now(vars.iter().copied()).is_some() {
            return f(&self.store);
        }
        if locks::inside_updater() {
            return Err(locks::busy_store(op));
        }
        let _waiting = waits::wait_for(self.engine.id(), || format!("a blocking {op} that must queue"))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let store = Arc::clone(&self.store);
        self.engine.submit(vars, 0, move || {
            let _ = tx.send(f(&store));
        });
        rx.recv().map_err(|_| Error::Internal(format!("{op}: the queued call ended without a result")))?
    }
}

impl Store {
    fn init_pairs(&self, op: &'static str, pairs: Vec<(Key, &NDArray)>) -> Result<()> {
        // (An init's values are neither pushed nor pulled. A broadcast's first half is
        // counted with its second, the pull.)
        let _span = (op == "init").then(|| self.counters.span(op, pairs.len(), pairs.first().map(|(k, _)| k)));
        let _held = Held::new(op, self, &[])?;
        let checked = self.check_init(op, &pairs);
        if self.collective.is_some() {
            let keys: Vec<steps::StepKey<'_>> = pairs.iter().map(|(k, v)| (k, v.shape(), v.dtype())).collect();
            self.check_step(op, &keys, checked)?;
        } else {
            checked?;
        }
        // Copy outside the table lock: copies of big arrays take a while. Where a value
        // is kept is the comm's business (`local`: on the host, in page-locked memory).
        let copies: Vec<NDArray> = pairs.iter().map(|(_, v)| self.comm.init_value(v)).collect::<Result<_>>()?;
        // dist_sync: every worker takes rank 0's values (MXNet: only rank 0's init
        // reaches the servers), before any is visible in this store.
        if let Some(group) = &self.collective {
            group.broadcast(&copies.iter().collect::<Vec<_>>(), 0)?;
        }
        // dist_async: rank 0's values go to the keys' owners; every worker waits until
        // they are there, and hears whether they got there: every worker adds the keys,
        // or none does.
        if let Some(remote) = &self.remote {
            let sent = match remote.rank() {
                0 => pairs.iter().zip(&copies).try_for_each(|((k, _), v)| remote.init(k, v)),
                _ => Ok(()),
            };
            let said = remote.exchange("init", &[u8::from(sent.is_ok())]).map(super::agree::Said::of);
            sent?;
            let said = said?;
            if said.is_empty() || said.byte(0, 0) != 1 {
                return Err(Error::Backend {
                    backend: "dist_async",
                    message: format!(
                        "{op}: rank 0 could not send the values to the keys' owners (the error on rank 0 says why); \
                         no worker added the keys"
                    ),
                });
            }
        }
        let mut table = self.table.write();
        if let Some((k, _)) = pairs.iter().find(|(k, _)| table.contains_key(k)) {
            return Err(Self::already(op, k));
        }
        for ((key, _), value) in pairs.into_iter().zip(copies) {
            let order = table.take_order();
            self.add_entry(&mut table, key, Slot::new(value, order));
        }
        drop(table);
        self.collective.as_ref().map_or(Ok(()), |c| c.barrier())
    }

    pub(super) fn already(op: &'static str, k: &Key) -> Error {
        Error::AlreadyInitialized {
            op,
            key: k.clone(),
            detail: "it was initialized before; init and broadcast take each key once",
        }
    }

    /// The checks of `init` before anything is copied.
    pub(super) fn check_init(&self, op: &'static str, pairs: &[(Key, &NDArray)]) -> Result<()> {
        let mut seen = HashMap::new();
        for (k, v) in pairs {
            check_context(op, k, v)?;
            if seen.insert(k, ()).is_some() {
                return Err(Error::AlreadyInitialized {
                    op,
                    key: k.clone(),
                    detail: "the key appears twice in this call",
                });
            }
        }
        let table = self.table.read();
        match pairs.iter().find(|(k, _)| table.contains_key(k)) {
            Some((k, _)) => Err(Self::already(op, k)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{KVStore, NDArray};

    #[test]
    fn a_kept_handle_of_a_finished_call_holds_no_loan_and_no_pending_out() {
        let kv = KVStore::create("local").unwrap();
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let values: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(&[8]).unwrap()).collect();
        let outs: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(&[8]).unwrap()).collect();
        kv.init(keys.as_slice(), outs.as_slice()).unwrap();
        // One key (short lists, kept with the handle) and twenty (long ones, freed).
        let one = (kv.push_async("k0", &values[0], 0), kv.pull_async("k0", &outs[0], 0));
        let many =
            (kv.push_async(keys.as_slice(), values.as_slice(), 0), kv.pull_async(keys.as_slice(), outs.as_slice(), 0));
        kv.wait_all().unwrap();
        assert!(values.iter().all(|v| !v.is_lent()), "a finished call kept a loan");
        assert!(outs.iter().all(|o| !o.is_pending()), "a finished call kept an out pending");
        for p in [one.0, one.1, many.0, many.1] {
            assert!(p.is_done());
            p.wait().unwrap();
        }
        assert_eq!(outs[19].to_vec::<f32>().unwrap(), vec![1.0; 8]);
    }
}
