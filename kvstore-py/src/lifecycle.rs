//! The interpreter's exit as the store's threads see it: when a thread may enter
//! Python, and what a thread does that finds it may not.
//!
//! Once the interpreter finalizes, CPython ends every other thread that takes the GIL
//! (`pthread_exit` inside `take_gil`). On a thread with Rust frames that unwinding is a
//! crash: the GIL guard it passes releases a thread state that is not current ("Fatal
//! Python error: PyGILState_Release"), and a `catch_unwind` it reaches aborts on the
//! foreign unwind. So no thread of the store may hold the GIL, or be about to take it,
//! when finalization starts. Every entry into Python from this crate's Rust code goes
//! through a gate ([`attach`] for the store's threads, [`detach`] for a program thread
//! coming back from a store call) that counts the threads inside; the package's exit
//! hook (`_exiting`, after every store's calls are done) closes the gate and waits,
//! with the GIL released, until the threads inside have left. From then on:
//! - [`attach`] answers `None`: updaters fail, callbacks are dropped unrun;
//! - a program thread whose store call returns parks for good instead of taking the GIL
//!   (a daemon thread: the interpreter would end it there), except the thread that runs
//!   the exit itself, which finalization needs.
//!
//! A thread already inside the gate (an updater that makes a store call) passes again.
//!
//! After `fork()` only the forking thread lives on in the child: the stores' engine
//! threads, the reduction pool and the callback thread do not exist there, and a lock
//! another thread held stays held. So in a child of a process that made stores (the
//! package's `os.register_at_fork` hook calls `_forked`) every store call, `create`
//! included, fails at once with [`fork_error`] and touches nothing of the store; the
//! stores and handles the child inherited are never dropped, only forgotten.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::thread::ThreadId;

use parking_lot::Mutex;
use pyo3::prelude::*;

/// Set once the interpreter is exiting (the package's exit hook): the gate is closed.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Whether a store was ever made in this process (or in the one it was forked from).
static STORES_MADE: AtomicBool = AtomicBool::new(false);
/// Set in a child of `fork()` of a process that made stores: every store call fails.
static FORKED: AtomicBool = AtomicBool::new(false);
/// The threads inside the gate: in Python, or on their way in.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// The thread that closed the gate, running the interpreter's exit: never parked.
static EXIT_THREAD: Mutex<Option<ThreadId>> = Mutex::new(None);

thread_local! {
    /// How deep this thread is inside the gate (counted once in `INSIDE`).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Passes the gate: `false` (not counted) once it is closed, unless this thread is
/// inside already. The count is raised before the flag is read and the exit hook sets
/// the flag before it reads the count (both sequentially consistent): either the hook
/// waits for this thread, or this thread sees the gate closed.
fn enter() -> bool {
    let depth = DEPTH.get();
    if depth > 0 {
        DEPTH.set(depth + 1);
        return true;
    }
    INSIDE.fetch_add(1, Ordering::SeqCst);
    if EXITING.load(Ordering::SeqCst) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    DEPTH.set(1);
    true
}

/// Leaves the gate (after a successful [`enter`]).
fn leave() {
    let depth = DEPTH.get();
    DEPTH.set(depth - 1);
    if depth == 1 {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Leaves the gate when dropped, on a panic too.
struct Inside;

impl Drop for Inside {
    fn drop(&mut self) {
        leave();
    }
}

/// Runs `f` attached to the interpreter from one of the store's threads (an updater, a
/// callback, giving back a tensor), or returns `None` when the interpreter is exiting
/// or gone: entering Python then would crash it.
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    if !enter() {
        return None;
    }
    let _inside = Inside;
    Python::try_attach(f)
}

/// `py.detach(f)` for a call made from Python: runs `f` with the GIL released, then
/// takes the GIL back through the gate, or, when the interpreter is exiting, never:
/// the thread parks for good (see the module docs).
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    let entered = AtomicBool::new(false);
    let r = py.detach(|| {
        let r = f();
        if enter() {
            entered.store(true, Ordering::Relaxed);
        } else if *EXIT_THREAD.lock() != Some(std::thread::current().id()) {
            park_for_good();
        }
        r
    });
    if entered.into_inner() {
        leave();
    }
    r
}

/// Parks this thread until the process ends. Whatever it holds stays held: only what
/// is done with the store's calls (no lock of the store) reaches here.
fn park_for_good() -> ! {
    loop {
        std::thread::park();
    }
}

/// Called by the package's exit hook once every store's calls are done: waits for
/// their callbacks, closes the gate, then waits (the GIL released) until no thread
/// is inside it. The store's
/// threads stay out of Python from now on.
#[pyfunction]
pub(crate) fn _exiting(py: Python<'_>) {
    *EXIT_THREAD.lock() = Some(std::thread::current().id());
    // The callbacks of the calls done so far run first; then the threads inside finish
    // what they run in Python (an updater, a callback). The GIL is theirs meanwhile.
    py.detach(|| {
        crate::pending::wait_for_callbacks();
        EXITING.store(true, Ordering::SeqCst);
        while INSIDE.load(Ordering::SeqCst) != 0 {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        // A program of one process closes its timeline's file whole (a dist_sync
        // job's is closed and merged by its finalize).
        if let Err(e) = kvstore::timeline::close_at_exit() {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("kvstore: the timeline's file was not closed: {e}\n"),
            );
        }
    });
}

/// Set once MPI was finalized from Python (`kvstore.finalize()`, or a `dist_async`
/// program's exit hook): the exit handler has nothing left to do.
static FINALIZED: AtomicBool = AtomicBool::new(false);
/// The process that registered [`finalize_if_clean`] (0: none did); a forked child
/// inherits the handler, not the job.
static FINALIZING_PID: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" {
    /// glibc's `on_exit`: `handler(status, arg)` runs at `exit(status)`, after the
    /// interpreter's finalization, and is told the status the process exits with.
    fn on_exit(handler: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
}

/// Notes that MPI was finalized from Python.
pub(crate) fn finalized() {
    FINALIZED.store(true, Ordering::SeqCst);
}

/// The end of a `dist_*` program, decided by its exit status, which CPython passes to
/// `exit()` only after its `atexit` hooks ran (`sys.exit(1)`, `raise SystemExit(3)` and
/// a normal end look alike there). Status 0: finalizes MPI, every rank meeting the
/// others (the store's calls were waited for by the package's exit hook). Any other:
/// leaves MPI as it is, and kvstore-mpi's own handler (registered before this one,
/// so it runs after) aborts the job with that status at once; finalizing would hold
/// this rank at finalize's meeting while the others wait for it in a collective,
/// until `KVSTORE_TIMEOUT`.
extern "C" fn finalize_if_clean(status: c_int, _: *mut c_void) {
    if status != 0 || FINALIZED.load(Ordering::SeqCst) || forked() {
        return;
    }
    if FINALIZING_PID.load(Ordering::SeqCst) != std::process::id() {
        return;
    }
    if let Err(e) = kvstore::finalize() {
        let _ =
            std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("kvstore: finalize at exit failed: {e}\n"));
    }
}

/// Registers [`finalize_if_clean`], once per process: called once the first `dist_*`
/// store is made (MPI is initialized by then, so kvstore-mpi's handler runs after).
#[pyfunction]
pub(crate) fn _finalize_at_exit() {
    let pid = std::process::id();
    if FINALIZING_PID.swap(pid, Ordering::SeqCst) == pid {
        return;
    }
    // SAFETY: `finalize_if_clean` is an `extern "C" fn(int, void*)` that ignores its
    // null argument and calls no Python; registering it has no other effect.
    unsafe {
        on_exit(finalize_if_clean, std::ptr::null_mut());
    }
}

/// Notes that this process made a store: a child of a later `fork()` cannot use stores.
pub(crate) fn store_made() {
    STORES_MADE.store(true, Ordering::SeqCst);
}

/// Whether this process is a child of `fork()` of a process that made stores.
pub(crate) fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// What every store call in a child of `fork()` fails with.
pub(crate) fn fork_error() -> kvstore::Error {
    kvstore::Error::Unsupported {
        what: "using kvstore in a child of fork() (os.fork, multiprocessing's \"fork\" start method) of a \
               process that made stores"
            .to_string(),
        hint: "the stores' threads do not exist in the child; make stores in a child started with \
               multiprocessing's \"spawn\" or \"forkserver\" method, or fork before the first store is made"
            .to_string(),
    }
}

/// Fails with [`fork_error`] in a child of `fork()` of a process that made stores: the
/// first thing every store call does.
pub(crate) fn not_forked() -> PyResult<()> {
    match forked() {
        true => Err(crate::errors::to_py(fork_error())),
        false => Ok(()),
    }
}

/// The package's `os.register_at_fork(after_in_child=...)` hook, in the child: the
/// threads that were inside the gate are gone; stores made before cannot work here.
#[pyfunction]
pub(crate) fn _forked() {
    INSIDE.store(usize::from(DEPTH.get() > 0), Ordering::SeqCst);
    if STORES_MADE.load(Ordering::SeqCst) {
        FORKED.store(true, Ordering::SeqCst);
    }
}
