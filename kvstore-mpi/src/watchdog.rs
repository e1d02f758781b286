//! The stall watchdog. Desync detection's exchange waits with its own deadline and knows
//! who arrived (`MpiGroup::exchange`); every other MPI call (the collectives that move
//! data) is watched by a thread, which ends the job when one has not returned within
//! the timeout: a worker stopped inside it (once every worker has arrived at a call, only
//! a worker stopped or stuck inside it keeps it from completing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::group::MpiGroup;
use crate::settings::TIMEOUT_VAR;

/// The exit status of a job the watchdog ended.
pub(crate) const WATCHDOG_EXIT: i32 = 86;

/// When the MPI call in progress started, in ms since [`epoch`] (0: none).
static BUSY_SINCE: AtomicU64 = AtomicU64::new(0);
/// Whether the call in progress is an exchange (which keeps its own deadline).
static EXCHANGING: AtomicBool = AtomicBool::new(false);
/// The last step the workers compared: the call the data belongs to.
static STEP: Mutex<String> = Mutex::new(String::new());
/// When this rank entered [`crate::finalize`], in ms since [`epoch`] (0: not yet).
static FINALIZING_SINCE: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) fn set_step(step: &str) {
    let mut s = STEP.lock();
    s.clear();
    s.push_str(step);
}

/// Marks the start of `MPI_Finalize` (after every rank arrived at finalize): a
/// rank stuck inside it could hold the others, or the launcher, for ever.
pub(crate) fn finalizing() {
    FINALIZING_SINCE.store(now_ms(), Ordering::SeqCst);
}

/// Marks an MPI call in progress while alive.
pub(crate) struct Watched(());

impl Watched {
    pub(crate) fn start() -> Self {
        BUSY_SINCE.store(now_ms(), Ordering::SeqCst);
        Watched(())
    }

    /// Starts the clock of the call in progress again: one MPI call of several
    /// made under one `Watched` has finished, and the next begins.
    pub(crate) fn restart() {
        BUSY_SINCE.store(now_ms(), Ordering::SeqCst);
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        BUSY_SINCE.store(0, Ordering::SeqCst);
    }
}

/// Marks an exchange in progress while alive.
pub(crate) struct Exchanging(());

impl Exchanging {
    pub(crate) fn start() -> Self {
        EXCHANGING.store(true, Ordering::SeqCst);
        Exchanging(())
    }
}

impl Drop for Exchanging {
    fn drop(&mut self) {
        EXCHANGING.store(false, Ordering::SeqCst);
    }
}

/// Prints `msg` and a newline on standard error in one write, so that the lines of
/// ranks printing at the same moment do not interleave in the launcher's output.
fn say(msg: String) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 { format!("{s:.0}") } else { format!("{s}") }
}

fn ranks(list: &[usize]) -> String {
    let names: Vec<String> = list.iter().map(usize::to_string).collect();
    format!("{} {}", if list.len() == 1 { "rank" } else { "ranks" }, names.join(", "))
}

/// Ends the job after a peer or more never arrived at `step`: says so, leaves the
/// other waiting workers a moment to say it too, and aborts.
pub(crate) fn never_arrived(rank: usize, size: usize, step: &str, timeout: Duration, missing: &[usize]) -> ! {
    let arrived: Vec<usize> = (0..size).filter(|r| !missing.contains(r)).collect();
    say(format!(
        "kvstore-mpi: rank {rank}: {step} has waited {} s for {}, which never arrived at it ({} did); a worker \
         that is alive but stuck (or stopped) holds up the job: aborting it ({}={}){}{}",
        seconds(timeout),
        ranks(missing),
        ranks(&arrived),
        TIMEOUT_VAR,
        seconds(timeout),
        crate::remote::serving_hint(),
        kvstore_core::timeline::flight_note(true)
    ));
    abort_soon()
}

fn abort_soon() -> ! {
    // The other workers that can still speak time out at about the same moment.
    std::thread::sleep(Duration::from_secs(2));
    crate::runtime::abort_job(WATCHDOG_EXIT);
    std::process::exit(WATCHDOG_EXIT)
}

/// Starts the thread that watches the MPI calls (once per process).
pub(crate) fn start(group: Arc<MpiGroup>) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::SeqCst) {
        return;
    }
    epoch();
    let spawned = std::thread::Builder::new().name("kvstore-mpi-watchdog".into()).spawn(move || {
        loop {
            let timeout = group.timeout();
            std::thread::sleep((timeout / 8).clamp(Duration::from_millis(50), Duration::from_secs(1)));
            let finalizing = FINALIZING_SINCE.load(Ordering::SeqCst);
            if finalizing != 0 {
                let waited = Duration::from_millis(now_ms().saturating_sub(finalizing));
                if waited >= timeout {
                    say(format!(
                        "kvstore-mpi: rank {}: MPI_Finalize has not returned after {} s: every worker arrived \
                         at finalize, so one stopped or is stuck inside it; this rank exits with status \
                         {WATCHDOG_EXIT}, which ends the job ({}={}){}",
                        group.rank,
                        seconds(waited),
                        TIMEOUT_VAR,
                        seconds(timeout),
                        kvstore_core::timeline::flight_note(true)
                    ));
                    std::thread::sleep(Duration::from_secs(2));
                    // MPI_Abort is not allowed once MPI_Finalize has begun; a rank that
                    // exits with a failure ends the job all the same (the launcher's
                    // fail-stop). `_exit`: no exit handlers, which could wait on MPI.
                    // SAFETY: `_exit` ends the process at once; it has no preconditions.
                    unsafe { libc::_exit(WATCHDOG_EXIT) };
                }
                continue;
            }
            let since = BUSY_SINCE.load(Ordering::SeqCst);
            if since == 0 || EXCHANGING.load(Ordering::SeqCst) || crate::runtime::FINALIZED.load(Ordering::SeqCst) {
                continue;
            }
            let waited = Duration::from_millis(now_ms().saturating_sub(since));
            if waited >= timeout {
                let step = STEP.lock().clone();
                let step = if step.is_empty() { "a collective operation".to_string() } else { step };
                say(format!(
                    "kvstore-mpi: rank {}: the data of {step} has not moved after {} s: every worker arrived at \
                     the call, so one stopped or is stuck inside it; aborting the job ({}={}){}{}",
                    group.rank,
                    seconds(waited),
                    TIMEOUT_VAR,
                    seconds(timeout),
                    crate::remote::serving_hint(),
                    kvstore_core::timeline::flight_note(true)
                ));
                abort_soon();
            }
        }
    });
    if let Err(e) = spawned {
        kvstore_core::say!(
            "kvstore-mpi: the stall watchdog could not start ({e}): a stuck worker would hold up the job"
        );
    }
}
