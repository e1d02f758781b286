//! [`Pending`]: the handle of a non-blocking call, and where the errors of handles
//! dropped unobserved go.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::engine::Engine;
use crate::error::{Error, Result};

/// A function told a call's result when it finishes (bindings complete their futures
/// with it). It runs on the thread that finished the call; its box stays with the call
/// (see [`State::Taken`]).
type Callback = Box<dyn CallOnce>;

/// A boxed `FnOnce` that can be called through `&mut`: calling it takes the closure out
/// and leaves its box, so the box is freed with the call, not where it was called.
trait CallOnce: Send {
    fn call(&mut self, result: Result<()>);
}

impl<F: FnOnce(Result<()>) + Send> CallOnce for Option<F> {
    fn call(&mut self, result: Result<()>) {
        if let Some(f) = self.take() {
            f(result);
        }
    }
}

/// Errors of calls whose handles were dropped before anyone saw the result: what
/// [`crate::KVStore::wait_all`] reports, in the order the calls failed.
pub(crate) type Unobserved = Arc<Mutex<Vec<Error>>>;

enum State {
    /// Queued or running; `abandoned` once the handle is gone.
    Running { abandoned: bool, callback: Option<Callback> },
    /// Finished, its result not yet taken.
    Finished(Result<()>),
    /// Finished and the result taken (by `wait`, a callback, or `wait_all`); with the
    /// callback's emptied box, if one took it: the memory goes with the call's last
    /// holder (the thread that keeps the handle), not with the thread that finished it.
    Taken(Option<Callback>),
}

pub(crate) struct Done {
    state: Mutex<State>,
    finished: Condvar,
    unobserved: Unobserved,
    /// The engine that runs the call (0: none, a call finished when made): a wait for
    /// it from an engine's thread must not close a cycle of waits (`waits.rs`).
    engine: usize,
}

/// What a handle holds: a call's [`Done`], alone or within the call itself (a queued
/// call and its handle are one allocation: see [`crate::engine::Job`]).
pub(crate) trait HasDone: Send + Sync {
    fn done(&self) -> &Done;
}

impl HasDone for Done {
    fn done(&self) -> &Done {
        self
    }
}

impl Done {
    /// The state of a call that `engine` runs ([`Done::running`]), shared.
    pub(crate) fn new(unobserved: Unobserved, engine: usize) -> Arc<Self> {
        Arc::new(Done::running(unobserved, engine))
    }

    /// The state of a call not finished yet, that `engine` runs (0: none).
    pub(crate) fn running(unobserved: Unobserved, engine: usize) -> Self {
        Done {
            state: Mutex::new(State::Running { abandoned: false, callback: None }),
            finished: Condvar::new(),
            unobserved,
            engine,
        }
    }

    /// Before a wait for the call: from an engine's thread, a wait that could never
    /// end is an error instead (see `waits.rs`); the wait is registered until dropped.
    fn may_wait(&self) -> Result<crate::waits::Waiting> {
        crate::waits::wait_for(self.engine, || "a wait for a non-blocking call's result".to_string())
    }

    /// Records the call's result: to its handle, its callback, or (handle dropped, call
    /// failed) the store's unobserved errors.
    pub(crate) fn finish(&self, result: Result<()>) {
        let mut st = self.state.lock();
        let State::Running { abandoned, callback } = std::mem::replace(&mut *st, State::Taken(None)) else {
            return;
        };
        match (callback, abandoned) {
            (Some(mut cb), _) => {
                drop(st);
                // A callback that panics must not leave the calls finished after it
                // (a batch's) unfinished, nor the engine's thread: it is ended here.
                let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    crate::ndarray::as_user_code(|| cb.call(result))
                }));
                if called.is_err() {
                    self.unobserved.lock().push(Error::Internal("an on_done callback panicked".into()));
                }
                if let State::Taken(spent @ None) = &mut *self.state.lock() {
                    *spent = Some(cb);
                }
                return;
            }
            (None, true) => {
                if let Err(e) = result {
                    self.unobserved.lock().push(e);
                }
            }
            (None, false) => *st = State::Finished(result),
        }
        drop(st);
        self.finished.notify_all();
    }
}

/// The handle of a non-blocking call (`push_async`, `pull_async`, ...): [`Pending::wait`]
/// for its result. Dropping the handle does not cancel the call; if it then fails, the
/// error is reported by the next [`crate::KVStore::wait_all`] instead.
#[must_use = "a dropped handle's error is only reported by wait_all"]
pub struct Pending {
    call: Arc<dyn HasDone>,
    /// For a call fused with the calls after it (`kvstore/run/fused.rs`): waiting for it
    /// releases its batch first.
    held: Option<Release>,
}

/// Releases the batch of fused calls that holds a non-blocking call back, if one still
/// does (see [`crate::KVStoreBuilder::fuse_calls`]): what [`Pending::wait`] and
/// [`Pending::is_done`] do first. For bindings whose handles wait without calling them
/// (Java's futures). Once the batch was released it does nothing.
#[derive(Clone, Debug)]
pub struct Release {
    engine: Weak<Engine>,
    batch: u64,
}

impl Release {
    /// Queues the held batch, so that the call runs behind the calls made before it.
    pub fn release(&self) {
        if let Some(engine) = self.engine.upgrade() {
            engine.release_held(Some(self.batch));
        }
    }
}

impl Pending {
    pub(crate) fn new(call: Arc<dyn HasDone>) -> Self {
        Pending { call, held: None }
    }

    /// The handle of a call that `engine` holds in batch `id`.
    pub(crate) fn held(call: Arc<dyn HasDone>, engine: &Arc<Engine>, id: u64) -> Self {
        Pending { call, held: Some(Release { engine: Arc::downgrade(engine), batch: id }) }
    }

    fn done(&self) -> &Done {
        self.call.done()
    }

    /// Releases the batch that holds the call, if one still does: whoever asks for the
    /// call's result wants it to run.
    fn release(&self) {
        if let Some(r) = &self.held {
            r.release();
        }
    }

    /// What releases the call's batch, for a handle kept elsewhere (see [`Release`]);
    /// `None` for a call that no batch held when it was made.
    pub fn releaser(&self) -> Option<Release> {
        self.held.clone()
    }

    /// A handle finished before anything was queued: a call that failed its checks (a
    /// key not initialised, a length mismatch; nothing changed) or had nothing to do.
    pub(crate) fn finished(result: Result<()>, unobserved: Unobserved) -> Self {
        let done = Done::new(unobserved, 0);
        done.finish(result);
        Pending::new(done)
    }

    /// Whether the call has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.release();
        self.is_finished()
    }

    /// Whether the call has finished, without releasing the batch that may hold it (as
    /// [`Pending::is_done`] does): for a binding that keeps handles only to free them.
    pub fn is_finished(&self) -> bool {
        !matches!(*self.done().state.lock(), State::Running { .. })
    }

    /// Waits for the call to finish and returns its result: what the blocking call
    /// would have returned.
    ///
    /// # Errors
    /// The call's error; the store then holds what it held before the call.
    pub fn wait(self) -> Result<()> {
        self.release();
        let mut st = self.done().state.lock();
        if matches!(*st, State::Running { .. }) {
            drop(st);
            let _waiting = self.done().may_wait()?;
            st = self.done().state.lock();
            while matches!(*st, State::Running { .. }) {
                self.done().finished.wait(&mut st);
            }
        }
        match std::mem::replace(&mut *st, State::Taken(None)) {
            State::Finished(r) => r,
            _ => Err(Error::Internal("a handle's result was taken twice".into())),
        }
    }

    /// Waits at most `timeout`: `Err(self)` (the handle back) if the call is still
    /// running then, else its result.
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<Result<()>, Pending> {
        self.release();
        {
            let mut st = self.done().state.lock();
            if matches!(*st, State::Running { .. }) {
                drop(st);
                let _waiting = match self.done().may_wait() {
                    Ok(w) => w,
                    Err(e) => return Ok(Err(e)),
                };
                st = self.done().state.lock();
                if matches!(*st, State::Running { .. }) {
                    let _ = self.done().finished.wait_for(&mut st, timeout);
                }
            }
            if matches!(*st, State::Running { .. }) {
                drop(st);
                return Err(self);
            }
        }
        Ok(self.wait())
    }

    /// Calls `f` with the result once the call finishes: at once, on this thread, if it
    /// already has; otherwise on the thread that finishes it (a store's engine thread),
    /// where `f` must not wait for the store's calls (a blocking call there that must
    /// queue behind them is an error, not a hang: see `waits.rs`). The result then belongs to `f`:
    /// [`Pending::wait`] returns an error, and a second `on_done` is called with one.
    ///
    /// The handle may be dropped at once (the call goes on), or kept until the call is
    /// done and dropped on this thread: the call's memory, `f`'s box included, is freed
    /// by whichever holds it last, and allocators are fastest when memory is freed by
    /// the thread that allocated it.
    pub fn on_done(&self, f: impl FnOnce(Result<()>) + Send + 'static) {
        let mut st = self.done().state.lock();
        match &mut *st {
            State::Running { callback: callback @ None, .. } => *callback = Some(Box::new(Some(f))),
            State::Finished(_) => {
                let State::Finished(r) = std::mem::replace(&mut *st, State::Taken(None)) else { unreachable!() };
                drop(st);
                f(r);
            }
            State::Running { callback: Some(_), .. } | State::Taken(_) => {
                drop(st);
                f(Err(Error::Internal("a handle's result was taken twice".into())));
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut st = self.done().state.lock();
        match &mut *st {
            State::Running { abandoned, callback: None } => *abandoned = true,
            State::Finished(_) => {
                if let State::Finished(Err(e)) = std::mem::replace(&mut *st, State::Taken(None)) {
                    self.done().unobserved.lock().push(e);
                }
            }
            _ => {}
        }
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending").field("done", &self.is_done()).finish()
    }
}
