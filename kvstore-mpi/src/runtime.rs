//! The MPI runtime of a process: `MPI_COMM_WORLD`, initialised once per process at
//! `MPI_THREAD_SERIALIZED`; every MPI call goes through one mutex, so threads of the
//! process never call MPI at once. For a non-blocking store call (running while its
//! caller computes) an allreduce is MPI's non-blocking one, tested with a yield between
//! tests instead of spinning inside MPI (see [`wait`]); barriers and broadcasts come only
//! from `init` and `barrier`, whose callers wait.
//!
//! Fail-stop: a process must end with [`finalize`]. One that exits without it, or
//! panics, aborts the whole job (`MPI_Abort`), so that its peers never wait forever in
//! a collective for a worker that is gone (finalising there would let the dead worker
//! leave cleanly and its peers hang).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use kvstore_core::backend::Collective;
use kvstore_core::{Error, Result};
use mpi::environment::{Threading, Universe};
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use parking_lot::Mutex;

use crate::clock::sync_clock;
use crate::fused::PACKED_BYTES;
use crate::group::MpiGroup;
use crate::hosts::Hosts;
use crate::settings::Settings;
use crate::shm::NodeWindow;
use crate::watchdog;

pub(crate) struct Mpi {
    pub(crate) world: SimpleCommunicator,
    /// A duplicate of the world for the records of desync detection: their messages
    /// never meet those of the collectives.
    pub(crate) steps: SimpleCommunicator,
    /// The shared window of fused sums: opened at the first fused bucket (every rank
    /// makes it), freed by [`finalize`].
    pub(crate) window: Window,
    /// The hosts big sums go through, found at the first big sum (every rank makes it).
    pub(crate) hosts: Placement,
    // Dropping the universe calls MPI_Finalize; it goes last.
    universe: Universe,
}

/// Whether the shared window is open.
pub(crate) enum Window {
    NotYet,
    /// Not open: some rank runs on another machine, or the path is turned off.
    No,
    Open(NodeWindow),
}

/// Whether big sums go host by host ([`Hosts`]).
pub(crate) enum Placement {
    NotYet,
    /// Flat: one host, or hosts where the sum host by host would have other bits.
    Flat,
    Hosts(Hosts),
}

impl Placement {
    /// The hosts, once found and where the sum goes host by host.
    pub(crate) fn found(&self) -> Option<&Hosts> {
        match self {
            Placement::Hosts(h) => Some(h),
            _ => None,
        }
    }
}

impl Mpi {
    /// The hosts to sum host by host over, found (collectively) at the first big sum:
    /// `None`, on every rank alike, where the sum is flat (see [`Hosts::find`]).
    pub(crate) fn hosts(&mut self, host_ranks: Option<usize>) -> Option<&Hosts> {
        if matches!(self.hosts, Placement::NotYet) {
            self.hosts = Hosts::find(&self.world, host_ranks).map_or(Placement::Flat, Placement::Hosts);
        }
        self.hosts.found()
    }

    /// The shared window with slots of `slot_bytes`, opened (collectively) at the first
    /// fused bucket: `None`, on every rank alike, where some rank does not run on this
    /// machine or did not want it then (`wanted`: a rank started with
    /// `KVSTORE_MPI_SHARED_MEMORY=0` turns it off for all).
    pub(crate) fn window(&mut self, slot_bytes: usize, wanted: bool) -> Option<&mut NodeWindow> {
        if matches!(self.window, Window::NotYet) {
            // Slots for the largest bucket, whatever its dtype.
            let opened = NodeWindow::open(&self.world, PACKED_BYTES.max(slot_bytes), wanted);
            self.window = opened.map_or(Window::No, Window::Open);
        }
        match &mut self.window {
            Window::Open(w) if w.slot_bytes() >= slot_bytes => Some(w),
            _ => None,
        }
    }
}

/// The process's MPI state.
pub(crate) struct Shared(pub(crate) Mutex<Option<Mpi>>);

// SAFETY: MPI was initialised at MPI_THREAD_SERIALIZED and every use of its handles
// goes through the mutex, so no two threads call MPI at the same time.
unsafe impl Send for Shared {}
// SAFETY: as above: shared access is serialised by the mutex.
unsafe impl Sync for Shared {}

pub(crate) static MPI: OnceLock<Shared> = OnceLock::new();
pub(crate) static GROUP: OnceLock<Arc<MpiGroup>> = OnceLock::new();
pub(crate) static FINALIZED: AtomicBool = AtomicBool::new(false);

/// Ends the whole MPI job at once (every rank), with `code`.
pub(crate) fn abort_job(code: i32) {
    // SAFETY: MPI_Abort takes the world communicator, a constant handle valid from
    // MPI_Init on; it is called only once MPI is initialised (and not finalised), and
    // it does not return in practice. Calling it while another thread is inside MPI is
    // allowed for a process that is being torn down.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
}

unsafe extern "C" {
    /// glibc's `on_exit`: `handler(status, arg)` runs at `exit(status)`, as `atexit`'s
    /// handlers do, and is told the status the process exits with.
    fn on_exit(
        handler: extern "C" fn(std::ffi::c_int, *mut std::ffi::c_void),
        arg: *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
}

/// At `exit(status)` without [`finalize`]: aborts the job with the rank's own status
/// (`mpirun` ends with it), 1 for a rank that exits with 0.
extern "C" fn abort_unless_finalized(status: std::ffi::c_int, _: *mut std::ffi::c_void) {
    if MPI.get().is_some() && !FINALIZED.load(Ordering::SeqCst) {
        let code = if status == 0 { 1 } else { status };
        kvstore_core::say!(
            "kvstore-mpi: this rank exits (status {status}) without kvstore_mpi::finalize(): aborting the MPI job \
             with status {code}"
        );
        abort_job(code);
    }
}

/// Whether this process made a `dist_sync` call (one of [`MpiGroup`]'s MPI calls).
pub(crate) static SYNC_CALLS: AtomicBool = AtomicBool::new(false);

/// Runs `f` holding the process's MPI lock, MPI being initialised and not finalised:
/// how `dist_async`'s short non-blocking MPI calls keep to MPI_THREAD_SERIALIZED.
///
/// # Errors
/// [`Error::Backend`] once MPI is finalised.
pub(crate) fn locked<T>(f: impl FnOnce() -> T) -> Result<T> {
    let shared = MPI.get().ok_or_else(|| Error::Internal("MPI is not initialised".into()))?;
    let guard = shared.0.lock();
    if guard.is_none() {
        return Err(Error::Backend { backend: "mpi", message: "MPI was finalised".into() });
    }
    let r = f();
    drop(guard);
    Ok(r)
}

/// Finalises MPI: call it once at the end of a `dist_sync` program, on every rank,
/// after its last store call. A rank that exits without it aborts the whole job.
///
/// It first runs every call of the `dist_sync` stores that is still queued or held
/// back for fusion (non-blocking calls whose handles were not waited for), and waits
/// until they are done: each call's result then goes to its handle (and the errors of
/// dropped handles to the next `wait_all`). A store call made after it fails.
///
/// # Errors
/// [`Error::Backend`] if MPI was not initialised or is already finalised.
pub fn finalize() -> Result<()> {
    let shared = MPI.get().ok_or(Error::Backend { backend: "mpi", message: "MPI was not initialised".into() })?;
    let finalised = || Error::Backend { backend: "mpi", message: "MPI is already finalised".into() };
    if shared.0.lock().is_none() {
        return Err(finalised());
    }
    // dist_async: this rank goes on answering the others until every rank is here.
    crate::remote::finish()?;
    if let Some(group) = GROUP.get() {
        kvstore_core::backend::finish_group_calls(&**group);
    }
    // Every rank arrives here before any finalises (one small message to every other
    // rank, under the watchdog's deadline): a rank that never comes (stuck, stopped, or
    // still making store calls) is named by the others, which end the job. Without
    // this, ranks that finished left it alone, and a rank stopped in its finalize held
    // up the launcher for ever.
    if let Some(group) = GROUP.get() {
        group.exchange("finalize", &[0])?;
        // Then the timeline's files, merged on rank 0 (where it was on). A trace that
        // could not be merged is said, and the job still ends as it would have.
        if let Err(e) = kvstore_core::backend::finish_timeline(&**group) {
            kvstore_core::say!("kvstore: rank {}: the timeline was not merged: {e}", group.rank());
        }
    }
    let mut mpi = shared.0.lock().take().ok_or_else(finalised)?;
    if let Window::Open(window) = std::mem::replace(&mut mpi.window, Window::No) {
        window.free();
    }
    watchdog::finalizing();
    FINALIZED.store(true, Ordering::SeqCst);
    drop(mpi.hosts);
    drop(mpi.steps);
    drop(mpi.world);
    drop(mpi.universe);
    Ok(())
}

/// The job's group, initialising MPI on first use (once per process).
///
/// # Errors
/// [`Error::Backend`] if MPI cannot be initialised (another library initialised it, or
/// the MPI library lacks serialized threading).
pub fn group() -> Result<Arc<MpiGroup>> {
    // A store built on the group commits, with a job name.
    kvstore_commit::install();
    if let Some(g) = GROUP.get() {
        return Ok(Arc::clone(g));
    }
    // One thread initialises MPI; the others wait here and then find the group.
    static INIT: Mutex<()> = Mutex::new(());
    let _init = INIT.lock();
    if let Some(g) = GROUP.get() {
        return Ok(Arc::clone(g));
    }
    // Read before MPI starts: a bad value leaves MPI untouched.
    let settings = Settings::from_env()?;
    let backend = |message: String| Error::Backend { backend: "mpi", message };
    let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
        .ok_or_else(|| backend("MPI was already initialised by another library".into()))?;
    if threading < Threading::Serialized {
        return Err(backend(format!("the MPI library offers {threading:?} threading; kvstore needs Serialized")));
    }
    let world = universe.world();
    crate::settings::launched_as(world.size()).map_err(backend)?;
    settings.agree(&world)?;
    let steps = world.duplicate();
    // dist_async's messages travel apart from everything else.
    let _ = crate::remote::COMM.set(crate::remote::Comm(world.duplicate(), world.duplicate()));
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let (offset, error, origin) = sync_clock(&world, rank, size);
    kvstore_core::timeline::set_clock(rank, size, offset, error, origin);
    let _ = MPI.set(Shared(Mutex::new(Some(Mpi {
        world,
        steps,
        window: Window::NotYet,
        hosts: Placement::NotYet,
        universe,
    }))));
    // SAFETY: `abort_unless_finalized` is an `extern "C" fn(int, void*)` that reads two
    // statics and may call MPI_Abort, and ignores its null argument; registering it has
    // no other effect.
    unsafe {
        on_exit(abort_unless_finalized, std::ptr::null_mut());
    }
    // A panic anywhere in a rank ends the job too (after the usual message): the other
    // ranks would otherwise wait in a collective that this rank never reaches.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if !FINALIZED.load(Ordering::SeqCst) {
            kvstore_core::say!("kvstore-mpi: a panic on this rank aborts the MPI job");
            abort_job(101);
        }
    }));
    let group = Arc::new(MpiGroup::new(rank, size, &settings));
    let group = Arc::clone(GROUP.get_or_init(|| group));
    watchdog::start(Arc::clone(&group));
    Ok(group)
}

/// Waits for a non-blocking MPI operation by testing it, yielding the core between
/// tests. A blocking MPI call spins inside the library until the slowest rank arrives:
/// the lowest latency for a caller that waits anyway, but under a non-blocking store call
/// (running in the background) it would take a core from the caller's own work.
pub(crate) fn wait<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>) {
    loop {
        match request.test() {
            Ok(_) => return,
            Err(pending) => {
                request = pending;
                std::thread::yield_now();
            }
        }
    }
}
