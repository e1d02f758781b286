//! The handle of a non-blocking call (`kvstore._kvstore.Pending`), under the package's
//! `kvstore.Future`: waited for with the GIL released, from any number of threads,
//! and with callbacks run once the call is done.
//!
//! Callbacks run on the package's callback thread (`kvstore-py-callbacks`), in the
//! order their calls finished, never on the store's threads: a callback may wait for
//! any call (a later one of its own store) or make blocking calls, which on the
//! thread of the store's engine that finished the call would wait for that engine's
//! own calls. (Java's futures are completed off the store's threads too.)

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvstore::{Error, Pending as Handle};
use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::to_py;

enum State {
    /// Not done, as far as anyone looked; nobody is waiting with the handle.
    Running(Handle),
    /// A thread is waiting with the handle, or a callback hook owns it.
    Busy,
    /// Done, with the call's result.
    Done(Result<(), Error>),
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    /// Callbacks to run once the call is done.
    callbacks: Mutex<Vec<Py<PyAny>>>,
}

impl Inner {
    /// Puts back the handle a waiter took, once it stopped waiting: or hands it to
    /// a hook when callbacks were added meanwhile (they run when the call is done).
    fn give_back(self: &Arc<Self>, h: Handle) {
        let mut st = self.state.lock();
        if self.callbacks.lock().is_empty() {
            *st = State::Running(h);
            drop(st);
            self.changed.notify_all();
            return;
        }
        drop(st);
        self.hook(h);
    }

    /// Makes `h`'s result come to [`Inner::finish`] (state `Busy` until then).
    fn hook(self: &Arc<Self>, h: Handle) {
        let inner = Arc::clone(self);
        h.on_done(move |r| inner.finish(r));
        // A call held for fusion goes now: nobody may ever wait for it.
        if let Some(r) = h.releaser() {
            r.release();
        }
    }

    /// Records the result, wakes the waiters and hands the callbacks to the callback
    /// thread.
    fn finish(&self, result: Result<(), Error>) {
        *self.state.lock() = State::Done(result);
        self.changed.notify_all();
        let callbacks = std::mem::take(&mut *self.callbacks.lock());
        if !callbacks.is_empty() {
            call_later(callbacks);
        }
    }
}

/// The callbacks of finished calls not run yet, for the callback thread.
struct Callbacks {
    lists: VecDeque<Vec<Py<PyAny>>>,
    /// Lists queued so far, and lists run (or dropped at exit) so far.
    queued: u64,
    ran: u64,
    started: bool,
}

static CALLBACKS: Mutex<Callbacks> =
    Mutex::new(Callbacks { lists: VecDeque::new(), queued: 0, ran: 0, started: false });
/// Signalled when lists are queued (for the callback thread) and when they ran.
static QUEUED: Condvar = Condvar::new();
static RAN: Condvar = Condvar::new();

/// Runs `callbacks` on the callback thread (started by the first call), or here if
/// it cannot start.
fn call_later(callbacks: Vec<Py<PyAny>>) {
    let mut q = CALLBACKS.lock();
    if !q.started {
        let started = std::thread::Builder::new().name("kvstore-py-callbacks".to_string()).spawn(callback_thread);
        if started.is_err() {
            drop(q);
            let _ = crate::attach(|py| run_callbacks(py, callbacks));
            return;
        }
        q.started = true;
    }
    q.lists.push_back(callbacks);
    q.queued += 1;
    drop(q);
    QUEUED.notify_one();
}

/// The callback thread: runs the queued lists, in order, with the GIL.
fn callback_thread() {
    loop {
        let mut q = CALLBACKS.lock();
        while q.lists.is_empty() {
            QUEUED.wait(&mut q);
        }
        let lists: Vec<_> = q.lists.drain(..).collect();
        drop(q);
        let n = lists.len() as u64;
        // Not when the interpreter is exiting: the callbacks are dropped unrun.
        let _ = crate::attach(|py| lists.into_iter().for_each(|cbs| run_callbacks(py, cbs)));
        CALLBACKS.lock().ran += n;
        RAN.notify_all();
    }
}

/// Waits until the callbacks queued so far have run: what the exit waits for before
/// the store's threads stay out of Python. Called with the GIL released.
pub(crate) fn wait_for_callbacks() {
    // (In a child of fork() the callback thread is gone, and its queue with it.)
    if crate::lifecycle::forked() {
        return;
    }
    let mut q = CALLBACKS.lock();
    let queued = q.queued;
    while q.ran < queued {
        RAN.wait(&mut q);
    }
}

/// Calls each callback; an exception in one is reported as unraisable (as
/// `concurrent.futures` logs it) and the others still run.
fn run_callbacks(py: Python<'_>, callbacks: Vec<Py<PyAny>>) {
    for cb in callbacks {
        if let Err(e) = cb.call0(py) {
            e.write_unraisable(py, Some(cb.bind(py)));
        }
    }
}

/// The handle of a non-blocking call.
#[pyclass(frozen, module = "kvstore._kvstore")]
pub(crate) struct Pending {
    inner: Arc<Inner>,
}

impl Drop for Pending {
    /// In a child of fork() the call's handle is never dropped (its locks and engine
    /// are the parent's): forgotten.
    fn drop(&mut self) {
        if crate::lifecycle::forked() {
            std::mem::forget(Arc::clone(&self.inner));
        }
    }
}

impl Pending {
    /// In a child of fork(): the call's result if it was done before the fork (and
    /// nobody held its state then), else `None`: it never will be.
    fn done_in_child(&self) -> Option<PyResult<()>> {
        match &*self.inner.state.try_lock()? {
            State::Done(Ok(())) => Some(Ok(())),
            State::Done(Err(e)) => Some(Err(to_py(e.clone()))),
            _ => None,
        }
    }

    pub(crate) fn new(handle: Handle) -> Self {
        Pending {
            inner: Arc::new(Inner {
                state: Mutex::new(State::Running(handle)),
                changed: Condvar::new(),
                callbacks: Mutex::new(Vec::new()),
            }),
        }
    }
}

#[pymethods]
impl Pending {
    /// Whether the call is done.
    fn done(&self) -> bool {
        if crate::lifecycle::forked() {
            return self.done_in_child().is_some();
        }
        match &*self.inner.state.lock() {
            State::Done(_) => true,
            State::Busy => false,
            State::Running(h) => h.is_done(),
        }
    }

    /// Waits until the call is done, at most `timeout` seconds (``None``: as long as
    /// it takes); returns whether it is done. The GIL is released meanwhile.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        if crate::lifecycle::forked() {
            return self.done_in_child().map(|_| true).ok_or_else(|| to_py(crate::lifecycle::fork_error()));
        }
        let deadline = match timeout {
            Some(t) if !(t >= 0.0 && t.is_finite()) => {
                return Err(PyValueError::new_err(format!("timeout must be a number of seconds >= 0, not {t}")));
            }
            Some(t) => Some(Instant::now() + Duration::from_secs_f64(t)),
            None => None,
        };
        let inner = &self.inner;
        Ok(crate::detach(py, || {
            loop {
                let mut st = inner.state.lock();
                match std::mem::replace(&mut *st, State::Busy) {
                    State::Done(r) => {
                        *st = State::Done(r);
                        return true;
                    }
                    State::Busy => {
                        let timed_out = match deadline {
                            Some(d) => inner.changed.wait_until(&mut st, d).timed_out(),
                            None => {
                                inner.changed.wait(&mut st);
                                false
                            }
                        };
                        if timed_out && !matches!(*st, State::Done(_)) {
                            return false;
                        }
                    }
                    State::Running(h) => {
                        drop(st);
                        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                        let outcome = match left {
                            None => Ok(h.wait()),
                            Some(left) => h.wait_timeout(left),
                        };
                        match outcome {
                            Ok(r) => {
                                inner.finish(r);
                                return true;
                            }
                            Err(h) => {
                                inner.give_back(h);
                                return false;
                            }
                        }
                    }
                }
            }
        }))
    }

    /// The call's result once it is done: ``None``, or its error raised. Call it after
    /// ``wait`` returned ``True``.
    fn result(&self) -> PyResult<()> {
        if crate::lifecycle::forked() {
            return self.done_in_child().ok_or_else(|| to_py(crate::lifecycle::fork_error()))?;
        }
        match &*self.inner.state.lock() {
            State::Done(Ok(())) => Ok(()),
            State::Done(Err(e)) => Err(to_py(e.clone())),
            _ => Err(PyValueError::new_err("the call is not done: wait for it first")),
        }
    }

    /// Calls `callback()` once the call is done: at once if it is, else on the
    /// callback thread.
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        if crate::lifecycle::forked() {
            if self.done_in_child().is_none() {
                return Err(to_py(crate::lifecycle::fork_error()));
            }
            run_callbacks(py, vec![callback]);
            return Ok(());
        }
        let mut st = self.inner.state.lock();
        match std::mem::replace(&mut *st, State::Busy) {
            State::Done(r) => {
                *st = State::Done(r);
                drop(st);
                run_callbacks(py, vec![callback]);
            }
            State::Busy => {
                self.inner.callbacks.lock().push(callback);
            }
            State::Running(h) => {
                self.inner.callbacks.lock().push(callback);
                drop(st);
                // The hook owns the result from now on; waiters wait for `finish`.
                crate::detach(py, || self.inner.hook(h));
            }
        }
        Ok(())
    }
}
