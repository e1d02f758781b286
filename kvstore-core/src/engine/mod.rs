//! The store's engine: runs a store's calls on its own threads, each key's calls in the
//! order they were made, calls on different keys in parallel (MXNet's threaded engine,
//! reduced to what a store needs).
//!
//! Every call names the [`Var`]s it touches: its keys, and the arrays it writes (a
//! pull's outs). Each var keeps the queue of the calls on it in submission order; a call
//! is ready when it is at the head of every queue it is in. Submission order is one
//! total order, and every queue follows it, so no two calls can wait for each other.
//! Ready calls run highest `priority` first, then oldest first.
//!
//! A submit does not touch that bookkeeping: it puts the call in the engine's inbox (a
//! lock-free queue) and counts it. The workers move the inbox's calls, oldest first, onto
//! their vars' queues under the state lock, so the queues and the ready heap stay in the
//! workers' caches, and a submit costs the caller one queue slot and one counter. The
//! inbox's order is the submission order: one thread at a time drains it, and anything
//! that looks at the queues from another thread (a blocking call's [`Engine::may_run_now`])
//! drains it first.
//!
//! An ordered engine (shared by the `dist_sync` stores of a worker group) has one thread and
//! ignores priority: its calls run one at a time in submission order, so every worker of
//! a job issues the same collectives in the same order, however the calls were timed. A
//! blocking call made while it is idle may run on its caller's thread in the worker's
//! stead, holding the engine's `running` lock ([`Engine::stand_in`]): still one at a time.
//!
//! A blocking call first asks [`Engine::may_run_now`]: when none of its vars is busy it
//! runs at once on the caller's thread (no hand-over to a worker); otherwise it is
//! queued and the caller waits for it.

use std::cell::Cell;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::thread::JoinHandle;

use crossbeam_deque::{Injector, Steal};
use crossbeam_utils::CachePadded;
use foldhash::HashMap;
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;

mod held;

use held::HeldBatches;
pub(crate) use held::{HeldBatch, HeldCalls, release_writers_of};

use crate::backoff::Backoff;
use crate::error::{Error, Result};

/// What a call touches: a key of the store (by index) or an array it writes (by the
/// address of its shared buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Var {
    Key(usize),
    Array(usize),
}

/// The vars of one call.
pub(crate) type Vars = SmallVec<[Var; 4]>;

/// A call's work, as the engine holds it until a worker has run it.
///
/// A job is shared, not owned, by the engine: a store's queued call is one allocation
/// that its handle ([`crate::Pending`]) holds too, so that its memory is freed by
/// whoever lets go of it last — the thread that made the call when it keeps the handle
/// until the call is done. The engine lets go of a job before the call counts as
/// finished (see [`Engine::wait_idle`]). Memory that one thread allocates and another
/// frees passes the allocator's lists between their cores at every call (with the C
/// library's allocator, most of what a submit cost when the two cores are far apart).
pub(crate) trait Job: Send + Sync {
    /// Runs the call; the engine calls it once.
    fn run(&self);
}

/// A closure as a [`Job`] (see [`job`]).
struct Once<F>(Mutex<Option<F>>);

impl<F: FnOnce() + Send> Job for Once<F> {
    fn run(&self) {
        let f = self.0.lock().take();
        if let Some(f) = f {
            f();
        }
    }
}

/// `f` as a [`Job`] of its own.
pub(crate) fn job(f: impl FnOnce() + Send + 'static) -> Arc<dyn Job> {
    Arc::new(Once(Mutex::new(Some(f))))
}

/// A submitted call, in the inbox until a drain registers it on its vars.
struct Submitted {
    priority: i32,
    vars: Vars,
    run: Arc<dyn Job>,
}

/// A registered call: a submitted one with its place in submission order.
struct Op {
    seq: u64,
    call: Submitted,
}

impl PartialEq for Op {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Op {}

impl PartialOrd for Op {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Op {
    /// The heap's greatest runs first: higher priority, then the older call.
    fn cmp(&self, other: &Self) -> Ordering {
        self.call.priority.cmp(&other.call.priority).then_with(|| other.seq.cmp(&self.seq))
    }
}

#[derive(Default)]
struct State {
    /// Each var's calls, oldest first; the head holds the var. Empty queues of arrays are
    /// removed, those of keys kept.
    queues: HashMap<Var, VecDeque<u64>>,
    /// Calls not yet at the head of all their queues, with how many heads they wait for.
    waiting: HashMap<u64, (usize, Op)>,
    ready: BinaryHeap<Op>,
    next_seq: u64,
    /// Every call numbered below this has finished.
    done_below: u64,
    /// Whether each call from `done_below` on has finished (what moves `done_below`).
    done: VecDeque<bool>,
    stop: bool,
    /// Threads in [`Engine::wait_idle`] or [`Engine::wait_for_earlier`].
    idle_waiters: usize,
}

struct Shared {
    state: Mutex<State>,
    /// Calls submitted and not yet registered, oldest first.
    inbox: Injector<Submitted>,
    /// Workers wait here for ready calls.
    work: Condvar,
    /// [`Engine::wait_idle`] waits here until every call submitted has finished.
    idle: Condvar,
    ordered: bool,
    /// Calls submitted so far (those in the inbox included), raised by a submit without
    /// the lock. The calls not yet finished are `submitted - finished`: two counts, each
    /// raised by one side on a cache line of its own, so that a stream of submits and
    /// the workers that finish them do not take one line from each other at every call
    /// (on a machine whose cores are far apart, each such move costs a fraction of a
    /// microsecond).
    submitted: CachePadded<AtomicUsize>,
    /// Calls finished so far, raised under the lock.
    finished: AtomicUsize,
    /// An ordered engine's one runner at a time: its worker holds it while it runs a
    /// call, and a blocking call that runs on its caller's thread in the worker's stead
    /// ([`Engine::stand_in`]) while it runs.
    running: Mutex<()>,
    /// `State::ready.len()`, readable without the lock (for idle workers' spin).
    ready: AtomicUsize,
    /// Workers asleep on `work`, or about to be (counted under the lock before their last
    /// look at the inbox): what a submit reads first to decide whether to wake one, on a
    /// line of its own that changes only when a worker falls asleep or wakes (in a
    /// stream of calls that keeps every worker busy or spinning, not at all).
    sleepers: CachePadded<AtomicUsize>,
    /// Whether an idle worker is spinning: only one does, so that idle workers never
    /// take more than one core from the threads that submit calls. It changes whenever
    /// a worker that keeps up with the submits runs out of work; a submit reads it only
    /// when a worker sleeps.
    spinning: CachePadded<AtomicBool>,
}

/// How long an idle worker keeps looking for work before it sleeps: calls handed over
/// in a stream (a backward pass's gradients) then find it awake, and their submits
/// skip waking a thread (a system call each). One idle worker at a time spins; the
/// others sleep at once.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

thread_local! {
    /// The engine whose worker this thread is (its address), 0 for other threads.
    static WORKER_OF: Cell<usize> = const { Cell::new(0) };
}

/// The engine whose worker the current thread is ([`Engine::id`]), 0 for other threads.
pub(crate) fn current_worker() -> usize {
    WORKER_OF.with(Cell::get)
}

/// Makes the current thread count as a worker of engine `id` (0: of none), for tests.
#[cfg(test)]
pub(crate) fn set_current_worker(id: usize) {
    WORKER_OF.with(|w| w.set(id));
}

/// A blocking call running at once on its caller's thread ([`run_now`]): its engine's
/// id, and the engine with the number of calls made before this one when any may still
/// run (none when the engine was idle: the common case takes no reference).
struct NowCall {
    id: usize,
    earlier: Option<(Arc<Shared>, u64)>,
}

thread_local! {
    /// The blocking call this thread runs at once, in its engine's stead (see [`run_now`]).
    static RUNNING_NOW: std::cell::RefCell<Option<NowCall>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f`, a blocking call of `engine` running at once on its caller's thread, with its
/// arrays made ready (their pending writes done: `prepare_for_call`). Meanwhile, a
/// pending write or a read in progress of that engine that this thread meets is waited
/// for only as long as calls made before this one are not done
/// ([`wait_for_calls_before_now`]): what is left belongs to calls made after this one took
/// its arrays (by other threads: concurrent with it), which may wait for the key locks
/// this call holds.
///
/// `before`: the calls of the engine made before this one, as [`Engine::may_run_now`]
/// numbers them (0 when the engine was idle: none is left to wait for).
pub(crate) fn run_now<T>(engine: &Engine, before: u64, f: impl FnOnce() -> T) -> T {
    /// Puts the mark back however `f` ends (a panic included).
    struct Restore(Option<NowCall>);
    impl Drop for Restore {
        fn drop(&mut self) {
            RUNNING_NOW.with(|r| *r.borrow_mut() = self.0.take());
        }
    }
    let now = NowCall { id: engine.shared.id(), earlier: (before > 0).then(|| (Arc::clone(&engine.shared), before)) };
    let _restore = Restore(RUNNING_NOW.with(|r| r.borrow_mut().replace(now)));
    f()
}

/// The engine whose blocking call runs at once on this thread ([`run_now`]), 0 for none.
pub(crate) fn running_now() -> usize {
    RUNNING_NOW.with(|r| r.borrow().as_ref().map_or(0, |n| n.id))
}

/// For a blocking call running at once on this thread ([`run_now`]): waits until every
/// call its engine was given before it has finished. None of those holds or waits for
/// this call's keys (it ran at once because none was queued on them).
pub(crate) fn wait_for_calls_before_now() {
    let earlier = RUNNING_NOW.with(|r| r.borrow().as_ref().and_then(|n| n.earlier.clone()));
    if let Some((shared, before)) = earlier {
        shared.wait_until(|st| st.done_below >= before);
    }
}

thread_local! {
    /// Whether the call this thread runs goes on while its caller does other work.
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread runs a store call in the background: a non-blocking call,
/// whose caller goes on with other work. A backend that waits a long time there (for the
/// other workers of a collective) should wait without spinning, to leave the core to
/// the caller; a blocking call's caller waits anyway.
pub fn in_background() -> bool {
    BACKGROUND.with(Cell::get)
}

/// Runs `f` with [`in_background`] saying `background`.
pub(crate) fn run_as(background: bool, f: impl FnOnce()) {
    /// Puts the flag back however `f` ends (a panic included).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BACKGROUND.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BACKGROUND.with(|b| b.replace(background)));
    f();
}

impl Shared {
    /// Waits, counted among the idle waiters, until `done` says so: looked at now and
    /// whenever a call finishes.
    fn wait_until(&self, mut done: impl FnMut(&State) -> bool) {
        let mut st = self.state.lock();
        st.idle_waiters += 1;
        while !done(&st) {
            self.idle.wait(&mut st);
        }
        st.idle_waiters -= 1;
    }

    fn id(&self) -> usize {
        self as *const Shared as usize
    }

    /// Registers a call on its vars; returns its sequence number and whether it holds
    /// them all now.
    fn register(st: &mut State, vars: &Vars) -> (u64, usize) {
        let seq = st.next_seq;
        st.next_seq += 1;
        st.done.push_back(false);
        let mut deps = 0;
        for v in vars {
            let q = st.queues.entry(*v).or_default();
            if !q.is_empty() {
                deps += 1;
            }
            q.push_back(seq);
        }
        (seq, deps)
    }

    /// Registers the inbox's calls, oldest first, on their vars (under the state lock: one
    /// thread at a time, so that the inbox's order is the registration order); returns
    /// how many went onto the ready heap.
    fn drain(&self, st: &mut State) -> usize {
        let mut readied = 0;
        loop {
            let call = match self.inbox.steal() {
                Steal::Success(call) => call,
                Steal::Empty => break,
                Steal::Retry => {
                    std::hint::spin_loop();
                    continue;
                }
            };
            let (seq, deps) = Self::register(st, &call.vars);
            let op = Op { seq, call };
            if deps == 0 {
                st.ready.push(op);
                readied += 1;
            } else {
                st.waiting.insert(seq, (deps, op));
            }
        }
        if readied > 0 {
            self.ready.store(st.ready.len(), AtomicOrdering::Release);
        }
        readied
    }

    /// Whether every call submitted has finished (the finished count is read first: it
    /// never passes the submitted one, so equal counts were equal when the second was
    /// read).
    fn is_idle(&self) -> bool {
        let finished = self.finished.load(AtomicOrdering::Acquire);
        self.submitted.load(AtomicOrdering::Acquire) == finished
    }

    /// Wakes a sleeping worker for a call just put in the inbox, unless an idle worker
    /// spins (it will find the call). The sequentially consistent accesses pair with a
    /// sleeper's: either this sees its count, or the sleeper's last look sees the call.
    fn wake(&self) {
        if self.sleepers.load(AtomicOrdering::SeqCst) == 0 || self.spinning.load(AtomicOrdering::SeqCst) {
            return;
        }
        // A worker between its last look at the inbox and its wait holds the lock: taking
        // it once keeps the notification from falling between the two.
        drop(self.state.lock());
        self.work.notify_one();
    }

    /// Releases the vars of finished call `seq`; the calls this readies are queued.
    fn finish(&self, seq: u64, vars: &Vars) {
        let mut st = self.state.lock();
        let mut readied = 0;
        for v in vars {
            let Some(q) = st.queues.get_mut(v) else { continue };
            debug_assert_eq!(q.front(), Some(&seq));
            q.pop_front();
            match q.front().copied() {
                // A key's empty queue is kept for its next call (one allocation less
                // per call); an array's goes, arrays come and go.
                None => {
                    if let Var::Array(_) = v {
                        st.queues.remove(v);
                    }
                }
                Some(next) => {
                    if let Some((deps, _)) = st.waiting.get_mut(&next) {
                        *deps -= 1;
                        if *deps == 0
                            && let Some((_, op)) = st.waiting.remove(&next)
                        {
                            st.ready.push(op);
                            self.ready.store(st.ready.len(), AtomicOrdering::Release);
                            readied += 1;
                        }
                    }
                }
            }
        }
        let at = (seq - st.done_below) as usize;
        if let Some(done) = st.done.get_mut(at) {
            *done = true;
        }
        while st.done.front() == Some(&true) {
            st.done.pop_front();
            st.done_below += 1;
        }
        self.finished.fetch_add(1, AtomicOrdering::AcqRel);
        // Threads that wait for calls look again, each at the calls it waits for. The
        // submits' line is read only when the engine stops.
        if st.idle_waiters > 0 {
            self.idle.notify_all();
        }
        if st.stop && self.is_idle() {
            self.idle.notify_all();
            // Workers asleep on a stopped engine's last call may exit now.
            self.work.notify_all();
        }
        drop(st);
        for _ in 0..readied {
            self.work.notify_one();
        }
    }

    fn worker(self: Arc<Self>) {
        WORKER_OF.with(|w| w.set(self.id()));
        loop {
            let (op, more) = {
                let mut st = self.state.lock();
                let mut spun = false;
                loop {
                    self.drain(&mut st);
                    if let Some(op) = st.ready.pop() {
                        self.ready.store(st.ready.len(), AtomicOrdering::Release);
                        break (op, !st.ready.is_empty());
                    }
                    if st.stop && self.is_idle() {
                        return;
                    }
                    if !spun && !self.spinning.swap(true, AtomicOrdering::SeqCst) {
                        // Look for work a little longer, without the lock, yielding the
                        // core to the threads that submit it.
                        spun = true;
                        drop(st);
                        let (t0, mut backoff) = (std::time::Instant::now(), Backoff::yielding());
                        while self.ready.load(AtomicOrdering::Acquire) == 0
                            && self.inbox.is_empty()
                            && t0.elapsed() < SPIN
                        {
                            backoff.snooze();
                        }
                        // Submits that saw the flag did not wake anyone: the drain at the
                        // top of the loop, after this store, registers their calls.
                        self.spinning.store(false, AtomicOrdering::SeqCst);
                        st = self.state.lock();
                        continue;
                    }
                    self.sleepers.fetch_add(1, AtomicOrdering::SeqCst);
                    if self.inbox.is_empty() {
                        self.work.wait(&mut st);
                    }
                    self.sleepers.fetch_sub(1, AtomicOrdering::SeqCst);
                    spun = false;
                }
            };
            if more {
                // Ready calls are left: another worker may take one.
                self.work.notify_one();
            }
            let Op { seq, call: Submitted { vars, run, .. } } = op;
            // A call reports its own result; a panic must not take the worker (and the
            // vars the call holds) with it.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let _running = self.ordered.then(|| self.running.lock());
                run.run();
                drop(run);
            }));
            self.finish(seq, &vars);
        }
    }
}

/// How many times [`Engine::stand_in`] looks for an idle worker, a yield apart, while
/// one call (the caller's last, most often) is still counted as queued.
const STAND_IN_TRIES: usize = 64;
/// And for how long at most.
const STAND_IN_WAIT: std::time::Duration = std::time::Duration::from_micros(500);

/// A blocking call's right to run on its caller's thread in an ordered engine's
/// worker's stead ([`Engine::stand_in`]).
pub(crate) struct StandIn<'e> {
    id: usize,
    _running: parking_lot::MutexGuard<'e, ()>,
}

impl StandIn<'_> {
    /// Runs `f` as the worker would: the thread counts as the engine's worker meanwhile
    /// (a wait for the engine's own calls from an updater fails instead of hanging, as
    /// on the worker; the store's own writes need no copies of loans, which the caller
    /// made before).
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        /// Puts the thread back however `f` ends (a panic included).
        struct Restore(usize);
        impl Drop for Restore {
            fn drop(&mut self) {
                WORKER_OF.with(|w| w.set(self.0));
            }
        }
        let _restore = Restore(WORKER_OF.with(|w| w.replace(self.id)));
        f()
    }
}

/// A store's engine and its worker threads.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    held: Mutex<HeldBatches>,
}

/// Every ordered engine, by its worker group's address.
static ORDERED: Mutex<Vec<(usize, std::sync::Weak<Engine>)>> = Mutex::new(Vec::new());

/// Runs every call that the stores of the worker group whose `Collective` is at
/// address `group` have queued or hold back for fusion, and waits until they are done,
/// with the calls made meanwhile (`backend::finish_group_calls`, which says why).
pub(crate) fn finish_calls_of_group(group: usize) {
    let engine = ORDERED.lock().iter().find(|(g, _)| *g == group).and_then(|(_, e)| e.upgrade());
    if let Some(engine) = engine {
        engine.wait_idle();
    }
}

impl Engine {
    /// Starts `threads` workers (at least one); an ordered engine has exactly one.
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] when the operating system refuses a thread.
    pub(crate) fn new(threads: usize, ordered: bool) -> Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            inbox: Injector::new(),
            work: Condvar::new(),
            idle: Condvar::new(),
            ordered,
            submitted: CachePadded::new(AtomicUsize::new(0)),
            finished: AtomicUsize::new(0),
            running: Mutex::new(()),
            ready: AtomicUsize::new(0),
            sleepers: CachePadded::new(AtomicUsize::new(0)),
            spinning: CachePadded::new(AtomicBool::new(false)),
        });
        let threads = if ordered { 1 } else { threads.max(1) };
        let mut engine =
            Engine { shared, workers: Vec::with_capacity(threads), held: Mutex::new(HeldBatches::default()) };
        for i in 0..threads {
            let shared = Arc::clone(&engine.shared);
            let handle = std::thread::Builder::new()
                .name(format!("kvstore-engine-{i}"))
                .spawn(move || shared.worker())
                .map_err(|e| Error::ResourceExhausted {
                    what: format!("starting engine thread {i} of {threads}"),
                    detail: format!("{e}; build the store with fewer engine threads"),
                })?;
            engine.workers.push(handle);
        }
        Ok(engine)
    }

    /// The ordered engine of the `dist_sync` stores over one worker group (`group`: the
    /// address of its `Collective`), started by the first: one thread runs the calls of
    /// all of them, so their collectives follow one order, the order of the calls, in
    /// every process of the job. It stops when the last of those stores is dropped.
    ///
    /// # Errors
    /// As [`Engine::new`].
    pub(crate) fn ordered_for(group: usize) -> Result<Arc<Engine>> {
        let mut engines = ORDERED.lock();
        engines.retain(|(_, e)| e.strong_count() > 0);
        if let Some(engine) = engines.iter().find(|(g, _)| *g == group).and_then(|(_, e)| e.upgrade()) {
            return Ok(engine);
        }
        let engine = Arc::new(Engine::new(1, true)?);
        engines.push((group, Arc::downgrade(&engine)));
        Ok(engine)
    }

    /// The engine's identity: the same for every handle of one engine.
    pub(crate) fn id(&self) -> usize {
        self.shared.id()
    }

    /// The number of worker threads.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Whether calls run strictly in submission order on one thread.
    pub(crate) fn is_ordered(&self) -> bool {
        self.shared.ordered
    }

    /// Whether the current thread is one of this engine's workers.
    pub(crate) fn on_worker(&self) -> bool {
        WORKER_OF.with(|w| w.get()) == self.shared.id()
    }

    /// Queues `f` on `vars` (see [`Engine::submit_job`]).
    pub(crate) fn submit(&self, vars: Vars, priority: i32, f: impl FnOnce() + Send + 'static) {
        self.submit_job(vars, priority, job(f));
    }

    /// Queues `run` on `vars` (deduplicated here). It runs on a worker once every call
    /// submitted before it on any of its vars has finished. Calls the engine holds are
    /// released first: they were made before.
    pub(crate) fn submit_job(&self, vars: Vars, priority: i32, run: Arc<dyn Job>) {
        // Held while the call is queued, so that no batch starts between the two.
        let _held = self.shared.ordered.then(|| {
            let mut held = self.held();
            held.release();
            held
        });
        self.enqueue(vars, priority, run);
    }

    fn enqueue(&self, mut vars: Vars, priority: i32, run: Arc<dyn Job>) {
        vars.sort_unstable();
        vars.dedup();
        let priority = if self.shared.ordered { 0 } else { priority };
        // Counted before it is visible, so that the counts never say idle while it is
        // not finished.
        self.shared.submitted.fetch_add(1, AtomicOrdering::SeqCst);
        self.shared.inbox.push(Submitted { priority, vars, run });
        self.shared.wake();
    }

    /// Whether a call on `vars` may run now on the caller's thread: no queued or running
    /// call of the engine holds or wants any of them (always false for an ordered
    /// engine, whose calls run one at a time: see [`Engine::stand_in`]).
    ///
    /// Such a call is not registered: the caller waits for it, so no later call of that
    /// thread can overtake it, and calls of other threads made meanwhile are concurrent
    /// with it (the store's key locks keep each call whole). When the engine has no
    /// queued call at all, this reads two atomics.
    ///
    /// When it may, returns how many calls it numbered before this one (every call it
    /// looked at: those on other vars may still run; 0 when none is left), for
    /// [`run_now`]; a call made later is numbered after them.
    pub(crate) fn may_run_now(&self, vars: impl IntoIterator<Item = Var>) -> Option<u64> {
        if self.shared.ordered {
            return None;
        }
        if self.idle() {
            return Some(0);
        }
        let mut st = self.shared.state.lock();
        let readied = self.shared.drain(&mut st);
        let free = !vars.into_iter().any(|v| st.queues.get(&v).is_some_and(|q| !q.is_empty()));
        let before = st.next_seq;
        drop(st);
        for _ in 0..readied {
            self.shared.work.notify_one();
        }
        free.then_some(before)
    }

    /// For an ordered engine with nothing queued or held: the right to run a blocking
    /// call on the caller's thread in the worker's stead, so that the call is not handed
    /// to the worker and back (a wake-up and a wait, and its arrays made over to the
    /// queue). While the [`StandIn`] lives the worker runs nothing (a call submitted
    /// meanwhile, by another thread, runs after it: it was made after this one was
    /// allowed), so calls still run one at a time in the order they were allowed, and
    /// every worker of a group issues its collectives in that order. `None` when the
    /// worker runs or something is queued or held (the call then queues, as ever), and
    /// for engines that are not ordered (see [`Engine::may_run_now`]).
    pub(crate) fn stand_in(&self) -> Option<StandIn<'_>> {
        if !self.shared.ordered {
            return None;
        }
        // A caller woken by the end of its last call may find the worker still
        // finishing it (releasing its vars and counting it): a few pauses let it. The
        // pauses are bounded in time too: on a loaded machine a yield may give the core
        // away for milliseconds, and a call still running then (another of the engine's)
        // must keep the caller's call behind it, on the worker, not see it end and
        // let the caller stand in.
        let mut backoff = Backoff::yielding();
        let start = std::time::Instant::now();
        for _ in 0..STAND_IN_TRIES {
            if self.queued() > 1 || start.elapsed() > STAND_IN_WAIT {
                return None;
            }
            if let Some(running) = self.shared.running.try_lock() {
                // Earlier calls of this thread are done: none queued (the counts), none held.
                if self.shared.is_idle() {
                    return if self.held().open().is_some() {
                        None
                    } else {
                        Some(StandIn { id: self.shared.id(), _running: running })
                    };
                }
            }
            backoff.snooze();
        }
        None
    }

    /// Whether a blocking call may run at once whatever its vars: the engine is not
    /// ordered, and no call is queued on it (two atomic reads).
    pub(crate) fn idle(&self) -> bool {
        !self.shared.ordered && self.shared.is_idle()
    }

    /// Waits until every call submitted so far (and any submitted meanwhile) has
    /// finished. From one of this engine's own workers it returns at once: the call
    /// running there could never finish otherwise.
    pub(crate) fn wait_idle(&self) {
        if self.on_worker() {
            return;
        }
        self.release_held(None);
        self.wait_until(|_| self.shared.is_idle());
        // And a blocking call running on its caller's thread in the worker's stead.
        if self.shared.ordered {
            drop(self.shared.running.lock());
        }
    }

    /// Waits until `done` says so (see [`Shared::wait_until`]).
    fn wait_until(&self, done: impl FnMut(&State) -> bool) {
        self.shared.wait_until(done);
    }

    /// The calls submitted so far (a count on the submitting threads' own cache line).
    pub(crate) fn submitted(&self) -> usize {
        self.shared.submitted.load(AtomicOrdering::Relaxed)
    }

    /// The calls submitted and not finished (held calls of a fused batch not counted).
    pub(crate) fn queued(&self) -> usize {
        let finished = self.shared.finished.load(AtomicOrdering::Acquire);
        self.shared.submitted.load(AtomicOrdering::Acquire).saturating_sub(finished)
    }

    /// Waits while `wait()` says so and calls are queued, looking again whenever one
    /// finishes. Back-pressure for a thread that makes calls faster than the engine
    /// runs them; never from one of the engine's own workers (it could wait for itself).
    /// Held calls are not counted and not released: when a batch is released must
    /// depend on the sequence of calls only, never on timing (`kvstore/run/fused.rs`).
    pub(crate) fn wait_while(&self, mut wait: impl FnMut(usize) -> bool) {
        if self.on_worker() || !wait(self.queued()) {
            return;
        }
        self.wait_until(|_| {
            let queued = self.queued();
            queued == 0 || !wait(queued)
        });
    }

    /// Waits until every call submitted before this one was made has finished, not
    /// those made meanwhile (another thread that submits faster than the calls run
    /// would keep [`Engine::wait_idle`] waiting). Calls are numbered in the order they
    /// reach the inbox, and a call whose submit returned was counted before it did, so
    /// every such call's number is below the count read here. From one of this
    /// engine's own workers it returns at once, as `wait_idle`.
    pub(crate) fn wait_for_earlier(&self) {
        if self.on_worker() {
            return;
        }
        self.release_held(None);
        let before = self.shared.submitted.load(AtomicOrdering::SeqCst) as u64;
        self.wait_until(|st| st.done_below >= before);
    }
}

impl Drop for Engine {
    /// Runs every queued call, then stops the workers. Dropped on one of its own workers
    /// (an updater that dropped its store), the workers finish the queue and exit on
    /// their own.
    fn drop(&mut self) {
        let on_worker = self.on_worker();
        self.wait_idle();
        self.shared.state.lock().stop = true;
        self.shared.work.notify_all();
        if !on_worker {
            for w in self.workers.drain(..) {
                let _ = w.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn vars(v: &[Var]) -> Vars {
        v.iter().copied().collect()
    }

    /// A gate: calls that wait at it run until it opens.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, Condvar)>);

    impl Gate {
        fn wait(&self) {
            let mut open = self.0.0.lock();
            while !*open {
                self.0.1.wait(&mut open);
            }
        }

        fn open(&self) {
            *self.0.0.lock() = true;
            self.0.1.notify_all();
        }

        /// Submits a call on `var` that holds it until the gate opens.
        fn hold(&self, engine: &Engine, var: Var) {
            let gate = self.clone();
            engine.submit(vars(&[var]), 0, move || gate.wait());
        }
    }

    /// Per key, the calls that ran, in order, as (submitter, its call number).
    type Logs = Arc<Vec<Mutex<Vec<(usize, usize)>>>>;

    #[test]
    fn calls_on_one_var_run_in_submission_order_across_threads() {
        let engine = Engine::new(4, false).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..200 {
            let log = Arc::clone(&log);
            // Alternating priorities must not reorder calls on the same var.
            engine.submit(vars(&[Var::Key(7)]), i % 3, move || log.lock().push(i));
        }
        engine.wait_idle();
        assert_eq!(*log.lock(), (0..200).collect::<Vec<_>>());
    }

    #[test]
    fn every_call_runs_while_submitters_pause_and_workers_fall_asleep_in_call_order_per_key() {
        const SUBMITTERS: usize = 3;
        const CALLS: usize = 2000;
        for threads in [1, 2, 3] {
            let engine = Arc::new(Engine::new(threads, false).unwrap());
            let logs: Logs = Arc::new((0..5).map(|_| Mutex::new(Vec::new())).collect());
            let ran = Arc::new(AtomicUsize::new(0));
            let submitters: Vec<_> = (0..SUBMITTERS)
                .map(|t| {
                    let (engine, logs, ran) = (Arc::clone(&engine), Arc::clone(&logs), Arc::clone(&ran));
                    std::thread::spawn(move || {
                        for i in 0..CALLS {
                            let key = (t * 7 + i * 3) % 5;
                            let (logs, ran) = (Arc::clone(&logs), Arc::clone(&ran));
                            engine.submit(vars(&[Var::Key(key)]), (i % 3) as i32, move || {
                                logs[key].lock().push((t, i));
                                ran.fetch_add(1, AtomicOrdering::SeqCst);
                            });
                            if i % 64 == 0 {
                                // Longer than the workers' spin: they go to sleep, and
                                // the next submits must wake one.
                                std::thread::sleep(Duration::from_micros(150));
                            }
                        }
                    })
                })
                .collect();
            for s in submitters {
                s.join().unwrap();
            }
            // No further submit comes to wake a worker: every call must run anyway.
            let t0 = std::time::Instant::now();
            while ran.load(AtomicOrdering::SeqCst) < SUBMITTERS * CALLS {
                if t0.elapsed() > Duration::from_secs(20) {
                    let n = ran.load(AtomicOrdering::SeqCst);
                    // Dropped, the engine would wait for the calls that never run.
                    std::mem::forget(engine);
                    panic!("{threads} workers: {n} of {} calls ran: a wake-up was lost", SUBMITTERS * CALLS);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            engine.wait_idle();
            for (key, log) in logs.iter().enumerate() {
                let log = log.lock();
                for t in 0..SUBMITTERS {
                    let mine: Vec<usize> = log.iter().filter(|(s, _)| *s == t).map(|&(_, i)| i).collect();
                    assert!(mine.is_sorted(), "{threads} workers, key {key}: submitter {t}'s calls ran out of order");
                }
            }
        }
    }

    #[test]
    fn a_call_made_after_another_threads_call_returned_runs_after_it() {
        let engine = Arc::new(Engine::new(2, false).unwrap());
        let gate = Gate::default();
        // Holds the key, so that the next two calls queue behind it.
        gate.hold(&engine, Var::Key(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        for round in 0..50 {
            let (l1, l2) = (Arc::clone(&log), Arc::clone(&log));
            let e = Arc::clone(&engine);
            std::thread::spawn(move || e.submit(vars(&[Var::Key(0)]), 0, move || l1.lock().push((round, 1))))
                .join()
                .unwrap();
            // The other thread's submit has returned; this one, at a higher priority,
            // still comes after it.
            engine.submit(vars(&[Var::Key(0)]), 9, move || l2.lock().push((round, 2)));
        }
        gate.open();
        engine.wait_idle();
        let expected: Vec<(i32, i32)> = (0..50).flat_map(|r| [(r, 1), (r, 2)]).collect();
        assert_eq!(*log.lock(), expected);
    }

    #[test]
    fn calls_on_different_vars_run_in_parallel() {
        let engine = Engine::new(2, false).unwrap();
        let (gate, started) = (Gate::default(), Arc::new(AtomicUsize::new(0)));
        for k in 0..2 {
            let (gate, started) = (gate.clone(), Arc::clone(&started));
            engine.submit(vars(&[Var::Key(k)]), 0, move || {
                started.fetch_add(1, AtomicOrdering::SeqCst);
                gate.wait();
            });
        }
        // Both start although neither finishes until the gate opens.
        let (t0, mut backoff) = (std::time::Instant::now(), Backoff::yielding());
        while started.load(AtomicOrdering::SeqCst) < 2 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the second key waited for the first");
            backoff.snooze();
        }
        gate.open();
        engine.wait_idle();
    }

    #[test]
    fn a_call_on_two_vars_waits_for_both_and_no_call_runs_now_on_a_wanted_var() {
        let engine = Engine::new(2, false).unwrap();
        let gate = Gate::default();
        gate.hold(&engine, Var::Key(1));
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        engine.submit(vars(&[Var::Key(2), Var::Key(1)]), 0, move || {
            r.fetch_add(1, AtomicOrdering::SeqCst);
        });
        // Key 2 is wanted by a queued call: a call on it must not overtake that call.
        assert!(engine.may_run_now(vars(&[Var::Key(2)])).is_none());
        assert!(engine.may_run_now(vars(&[Var::Key(3)])).is_some());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(ran.load(AtomicOrdering::SeqCst), 0);
        gate.open();
        engine.wait_idle();
        assert_eq!(ran.load(AtomicOrdering::SeqCst), 1);
        assert!(engine.may_run_now(vars(&[Var::Key(2)])).is_some());
    }

    #[test]
    fn higher_priority_runs_first_among_ready_calls_and_an_ordered_engine_ignores_it() {
        for ordered in [false, true] {
            let engine = Engine::new(1, ordered).unwrap();
            let gate = Gate::default();
            // Occupy the only worker so the next calls are all ready at once.
            gate.hold(&engine, Var::Key(0));
            let log = Arc::new(Mutex::new(Vec::new()));
            for (k, p) in [(1, 0), (2, 5), (3, -1), (4, 5)] {
                let log = Arc::clone(&log);
                engine.submit(vars(&[Var::Key(k)]), p, move || log.lock().push(k));
            }
            gate.open();
            engine.wait_idle();
            let expected = if ordered { vec![1, 2, 3, 4] } else { vec![2, 4, 1, 3] };
            assert_eq!(*log.lock(), expected, "ordered: {ordered}");
        }
    }

    #[test]
    fn the_engine_lets_go_of_a_job_before_its_call_counts_as_finished() {
        struct Probe(AtomicUsize);
        impl Job for Probe {
            fn run(&self) {
                self.0.fetch_add(1, AtomicOrdering::SeqCst);
            }
        }
        let engine = Engine::new(2, false).unwrap();
        let job = Arc::new(Probe(AtomicUsize::new(0)));
        for k in 0..100 {
            engine.submit_job(vars(&[Var::Key(k % 3)]), 0, Arc::clone(&job) as Arc<dyn Job>);
        }
        engine.wait_idle();
        assert_eq!(job.0.load(AtomicOrdering::SeqCst), 100);
        // The handle's holder frees a call's memory: the engine holds no reference now.
        assert_eq!(Arc::strong_count(&job), 1);
    }

    #[test]
    fn a_panicking_call_releases_its_vars_and_dropping_runs_the_queue() {
        let engine = Engine::new(1, false).unwrap();
        engine.submit(vars(&[Var::Key(0)]), 0, || panic!("a call panicked"));
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..10 {
            let r = Arc::clone(&ran);
            engine.submit(vars(&[Var::Key(0)]), 0, move || {
                std::thread::sleep(Duration::from_millis(1));
                r.fetch_add(1, AtomicOrdering::SeqCst);
            });
        }
        drop(engine);
        assert_eq!(ran.load(AtomicOrdering::SeqCst), 10);
    }
}
