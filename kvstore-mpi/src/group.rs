//! The MPI job as a [`Collective`]: `MPI_COMM_WORLD`, initialised once per process at
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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kvstore_core::backend::{Collective, MappedFile, in_background};
use kvstore_core::{DType, Element, Error, NDArray, Result, bf16, f16};
use mpi::datatype::Equivalence;
use mpi::environment::{Threading, Universe};
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use parking_lot::Mutex;

use crate::hosts::{self, Hosts};
use crate::shm::{self as shm, NodeWindow};

struct Mpi {
    world: SimpleCommunicator,
    /// A duplicate of the world for the records of desync detection: their messages
    /// never meet those of the collectives.
    steps: SimpleCommunicator,
    /// The shared window of fused sums: opened at the first fused bucket (every rank
    /// makes it), freed by [`finalize`].
    window: Window,
    /// The hosts big sums go through, found at the first big sum (every rank makes it).
    hosts: Placement,
    // Dropping the universe calls MPI_Finalize; it goes last.
    universe: Universe,
}

/// Whether the shared window is open.
enum Window {
    NotYet,
    /// Not open: some rank runs on another machine, or the path is turned off.
    No,
    Open(NodeWindow),
}

/// Whether big sums go host by host ([`Hosts`]).
enum Placement {
    NotYet,
    /// Flat: one host, or hosts where the sum host by host would have other bits.
    Flat,
    Hosts(Hosts),
}

impl Placement {
    /// The hosts, once found and where the sum goes host by host.
    fn found(&self) -> Option<&Hosts> {
        match self {
            Placement::Hosts(h) => Some(h),
            _ => None,
        }
    }
}

impl Mpi {
    /// The hosts to sum host by host over, found (collectively) at the first big sum:
    /// `None`, on every rank alike, where the sum is flat (see [`Hosts::find`]).
    fn hosts(&mut self, host_ranks: Option<usize>) -> Option<&Hosts> {
        if matches!(self.hosts, Placement::NotYet) {
            self.hosts = Hosts::find(&self.world, host_ranks).map_or(Placement::Flat, Placement::Hosts);
        }
        self.hosts.found()
    }

    /// The shared window with slots of `slot_bytes`, opened (collectively) at the first
    /// fused bucket: `None`, on every rank alike, where some rank does not run on this
    /// machine or did not want it then (`wanted`: a rank started with
    /// `KVSTORE_MPI_SHARED_MEMORY=0` turns it off for all).
    fn window(&mut self, slot_bytes: usize, wanted: bool) -> Option<&mut NodeWindow> {
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
struct Shared(Mutex<Option<Mpi>>);

// SAFETY: MPI was initialised at MPI_THREAD_SERIALIZED and every use of its handles
// goes through the mutex, so no two threads call MPI at the same time.
unsafe impl Send for Shared {}
// SAFETY: as above: shared access is serialised by the mutex.
unsafe impl Sync for Shared {}

static MPI: OnceLock<Shared> = OnceLock::new();
static GROUP: OnceLock<Arc<MpiGroup>> = OnceLock::new();
static FINALIZED: AtomicBool = AtomicBool::new(false);

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

/// The default bucket size of the fused allreduce.
const DEFAULT_BUCKET_BYTES: usize = 4 << 20;
/// The most bytes of small arrays packed into one fused allreduce, whatever the bucket
/// size: packing copies every array into the send buffer, and the sums are read from
/// the send and receive buffers, and with both buffers in a core's cache (1 MiB of L2
/// here) those copies cost far less. A list push of 1,000 keys of 4 KiB over shared memory (2 ranks, `make
/// bench`'s MPI rows, 31-run medians in two rounds, each size in turn): packed in
/// 4 MiB, 2.3 and 3.1 ms (1.18 and 1.26 times the same push unfused); in 512 KiB,
/// 1.96 and 1.76 ms (0.93 and 0.87 times it); 256 KiB and 1 MiB alike. The same on
/// every rank, so every rank makes the same allreduces.
const PACKED_BYTES: usize = 512 << 10;
/// The smallest bucket (one f64 at least, whatever is asked for).
const MIN_BUCKET_BYTES: usize = 64;
/// The environment variable that sets the bucket size at start-up, in bytes.
pub const BUCKET_BYTES_VAR: &str = "KVSTORE_MPI_BUCKET_BYTES";

/// The default stall timeout: a collective that has waited this long ends the job.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The environment variable that sets the stall timeout at start-up, in seconds.
pub const TIMEOUT_VAR: &str = "KVSTORE_TIMEOUT";

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The timeout `KVSTORE_TIMEOUT` asks for (unset or empty: the default).
fn timeout_from_env() -> Result<Duration> {
    match std::env::var(TIMEOUT_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{TIMEOUT_VAR}={v:?}: expected a number of seconds above 0 (default {})",
                    DEFAULT_TIMEOUT.as_secs()
                ))
            }),
        _ => Ok(DEFAULT_TIMEOUT),
    }
}

/// This process's view of the MPI job.
pub struct MpiGroup {
    rank: usize,
    size: usize,
    bucket_bytes: AtomicUsize,
    timeout_ms: AtomicU64,
    /// Whether fused sums may go through shared memory (see [`shm`]).
    shared_memory: AtomicBool,
    /// Whether the last fused bucket went through shared memory.
    used_shared_memory: AtomicBool,
    /// Ranks per host where `KVSTORE_MPI_HOST_RANKS` sets them (see [`hosts`]).
    host_ranks: Option<usize>,
    /// The most bytes of a chunk of a sum host by host (`KVSTORE_MPI_HOST_CHUNK_BYTES`).
    host_chunk_bytes: usize,
    /// Whether the last big sum went host by host.
    used_hosts: AtomicBool,
}

/// The job's group, initialising MPI on first use (once per process).
///
/// # Errors
/// [`Error::Backend`] if MPI cannot be initialised (another library initialised it, or
/// the MPI library lacks serialized threading).
pub fn group() -> Result<Arc<MpiGroup>> {
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
    let bucket_bytes = bucket_bytes_from_env()?;
    let timeout = timeout_from_env()?;
    let shared_memory = shm::wanted_from_env()?;
    let host_ranks = hosts::host_ranks_from_env()?;
    let host_chunk_bytes = hosts::host_chunk_bytes_from_env()?;
    let backend = |message: String| Error::Backend { backend: "mpi", message };
    let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
        .ok_or_else(|| backend("MPI was already initialised by another library".into()))?;
    if threading < Threading::Serialized {
        return Err(backend(format!("the MPI library offers {threading:?} threading; kvstore needs Serialized")));
    }
    let world = universe.world();
    settings_agree(&world, bucket_bytes.max(MIN_BUCKET_BYTES), host_chunk_bytes)?;
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
    let group = Arc::new(MpiGroup {
        rank,
        size,
        bucket_bytes: AtomicUsize::new(bucket_bytes.max(MIN_BUCKET_BYTES)),
        timeout_ms: AtomicU64::new(millis(timeout)),
        shared_memory: AtomicBool::new(shared_memory),
        used_shared_memory: AtomicBool::new(false),
        host_ranks,
        host_chunk_bytes,
        used_hosts: AtomicBool::new(false),
    });
    let group = Arc::clone(GROUP.get_or_init(|| group));
    watchdog::start(Arc::clone(&group));
    Ok(group)
}

/// Checks that every rank read the same settings that shape the ranks' messages (the
/// buckets' bytes, the chunks' bytes): where one differs, the ranks would post messages
/// that do not match. The same error on every rank, naming the setting and its least
/// and greatest values. (Hosts' ranks that differ make the sums flat, `Hosts::find`.)
fn settings_agree(world: &SimpleCommunicator, bucket_bytes: usize, host_chunk_bytes: usize) -> Result<()> {
    let mine = [bucket_bytes as u64, host_chunk_bytes as u64];
    let (mut least, mut most) = ([0u64; 2], [0u64; 2]);
    world.all_reduce_into(&mine[..], &mut least[..], mpi::collective::SystemOperation::min());
    world.all_reduce_into(&mine[..], &mut most[..], mpi::collective::SystemOperation::max());
    let names = [BUCKET_BYTES_VAR, hosts::HOST_CHUNK_BYTES_VAR];
    match (0..2).find(|&i| least[i] != most[i]) {
        Some(i) => Err(Error::invalid_argument(format!(
            "{} differs between the ranks ({} on some, {} on others): set it alike on every rank (mpirun -x {})",
            names[i], least[i], most[i], names[i]
        ))),
        None => Ok(()),
    }
}

/// The bucket size `KVSTORE_MPI_BUCKET_BYTES` asks for (unset or empty: the default).
fn bucket_bytes_from_env() -> Result<usize> {
    match std::env::var(BUCKET_BYTES_VAR) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<usize>().map_err(|_| {
            Error::invalid_argument(format!("{BUCKET_BYTES_VAR}={v:?}: expected a whole number of bytes"))
        }),
        _ => Ok(DEFAULT_BUCKET_BYTES),
    }
}

impl MpiGroup {
    /// The size, in bytes, of one fused allreduce.
    pub fn bucket_bytes(&self) -> usize {
        self.bucket_bytes.load(Ordering::Relaxed)
    }

    /// Sets the size, in bytes, of one fused allreduce (default 4 MiB, or
    /// `KVSTORE_MPI_BUCKET_BYTES` at start-up; at least 64): small keys share a bucket
    /// (of at most 512 KiB, where the packing copies stay in a core's cache), big keys
    /// (of a bucket or more) go straight through MPI in pieces of a bucket. Every rank
    /// must use the same size.
    pub fn set_bucket_bytes(&self, bytes: usize) {
        self.bucket_bytes.store(bytes.max(MIN_BUCKET_BYTES), Ordering::Relaxed);
    }

    /// Whether fused sums go through memory shared by the ranks where every rank of the
    /// job runs on one machine (default: yes, unless `KVSTORE_MPI_SHARED_MEMORY=0` or
    /// Open MPI's `btl` list leaves its shared-memory transport out, as `mpirun --mca btl
    /// self,tcp` does). The results are the same bits either way.
    pub fn shared_memory(&self) -> bool {
        self.shared_memory.load(Ordering::Relaxed)
    }

    /// Sets whether fused sums may go through shared memory (see
    /// [`MpiGroup::shared_memory`]); every rank must set the same, at the same point of
    /// its calls. The ranks decide at the job's first fused sum whether the shared
    /// memory exists at all: where some rank had it off then, it stays unused.
    pub fn set_shared_memory(&self, on: bool) {
        self.shared_memory.store(on, Ordering::Relaxed);
    }

    /// Whether the last fused sum went through shared memory: it did where that is on
    /// ([`MpiGroup::shared_memory`]) and every rank runs on this machine (with 2 ranks
    /// or more).
    pub fn used_shared_memory(&self) -> bool {
        self.used_shared_memory.load(Ordering::Relaxed)
    }

    /// Whether the last big sum (an array of a bucket or more) went host by host: the
    /// job runs on 2 machines or more, each with the same power of two (2 or more) of
    /// consecutive ranks (see `kvstore_mpi`'s docs on hosts). The results are the same
    /// bits either way.
    pub fn used_hosts(&self) -> bool {
        self.used_hosts.load(Ordering::Relaxed)
    }

    /// The most bytes that any thread's buffer for big sums (kept from one sum to the
    /// next) has held in this process: a group's worth of an array at most, 64 chunks
    /// of `KVSTORE_MPI_HOST_CHUNK_BYTES` (256 MiB by default; 16 chunks host by host),
    /// whatever the arrays' sizes.
    pub fn largest_scratch_bytes(&self) -> usize {
        LARGEST_SCRATCH.load(Ordering::Relaxed)
    }

    /// The stall timeout: a collective that has waited this long ends the job, with a
    /// message naming the call (and, when the workers compare their calls, the workers
    /// that never arrived). Default 10 minutes, or `KVSTORE_TIMEOUT` (seconds) at
    /// start-up.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets the stall timeout (see [`MpiGroup::timeout`]) for every store of the job on
    /// this worker; every worker should set the same.
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms.store(millis(timeout), Ordering::Relaxed);
    }

    fn with_world<T>(&self, f: impl FnOnce(&SimpleCommunicator) -> T) -> Result<T> {
        self.with_mpi(|mpi| f(&mpi.world))
    }

    /// Runs `f` with MPI, under the watchdog: a call that has not returned within the
    /// timeout ends the job (see [`watchdog`]).
    fn with_mpi<T>(&self, f: impl FnOnce(&mut Mpi) -> T) -> Result<T> {
        SYNC_CALLS.store(true, Ordering::Relaxed);
        let shared = MPI.get().ok_or_else(|| Error::Internal("MPI is not initialised".into()))?;
        let mut guard = shared.0.lock();
        let mpi =
            guard.as_mut().ok_or_else(|| Error::Backend { backend: "mpi", message: "MPI was finalised".into() })?;
        let _watched = watchdog::Watched::start();
        Ok(f(mpi))
    }
}

/// The element type arrays of `dtype` travel as: f16/bf16 as f32 (sums accumulate in
/// f32, as on the host), the others as themselves.
macro_rules! with_wire {
    ($dtype:expr, $w:ident => $body:expr) => {
        match $dtype {
            DType::F32 | DType::F16 | DType::BF16 => {
                type $w = f32;
                $body
            }
            DType::F64 => {
                type $w = f64;
                $body
            }
            DType::I32 => {
                type $w = i32;
                $body
            }
            DType::I64 => {
                type $w = i64;
                $body
            }
            DType::I8 => {
                type $w = i8;
                $body
            }
            DType::U8 => {
                type $w = u8;
                $body
            }
        }
    };
}

/// An array's elements as `W`, and a way back.
fn read_wire<W: Element>(a: &NDArray) -> Result<Vec<W>> {
    if a.dtype() == W::DTYPE { a.with_data(|s: &[W]| s.to_vec()) } else { a.to_vec::<W>() }
}

/// Writes `len` summed elements (on the wire), which `fill` writes, into `dst` from
/// element `off` on: straight into its memory, or, for f16/bf16, into a buffer first,
/// each value then rounded as `NDArray::as_type` does.
fn store_piece<W: Element>(dst: &NDArray, off: usize, len: usize, fill: impl FnOnce(&mut [W])) -> Result<()> {
    fn narrow<W: Element, T: Element>(
        dst: &NDArray,
        off: usize,
        len: usize,
        fill: impl FnOnce(&mut [W]),
    ) -> Result<()> {
        let mut part = vec![W::default(); len];
        fill(&mut part);
        dst.with_data_mut(|d: &mut [T]| {
            for (o, x) in d[off..off + len].iter_mut().zip(part) {
                *o = T::from_f64(x.to_f64());
            }
        })
    }
    match dst.dtype() {
        d if d == W::DTYPE => dst.with_data_mut(|d: &mut [W]| fill(&mut d[off..off + len])),
        // f16/bf16 travel as f32: only the summed piece is converted back.
        DType::F16 => narrow::<W, f16>(dst, off, len, fill),
        DType::BF16 => narrow::<W, bf16>(dst, off, len, fill),
        d => Err(Error::Internal(format!("mpi: {d} does not travel as {}", W::DTYPE))),
    }
}

fn write_wire<W: Element>(a: &NDArray, data: &[W]) -> Result<()> {
    if a.dtype() == W::DTYPE {
        a.with_data_mut(|s: &mut [W]| s.copy_from_slice(data))
    } else {
        a.copy_from(&NDArray::from_slice_in(a.shape(), data, a.context())?)
    }
}

thread_local! {
    /// Send and receive buffers reused across calls (u64 words, so that every element
    /// type is aligned): fresh multi-megabyte buffers would page-fault on every push.
    static BUFFERS: std::cell::RefCell<(Vec<u64>, Vec<u64>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on send and receive buffers of `n` elements of `W`.
fn with_buffers<W: Element, T>(n: usize, f: impl FnOnce(&mut [W], &mut [W]) -> T) -> T {
    BUFFERS.with(|b| {
        let (send, recv) = &mut *b.borrow_mut();
        let words = (n * std::mem::size_of::<W>()).div_ceil(8);
        if send.len() < words {
            send.resize(words, 0);
            recv.resize(words, 0);
        }
        let send = &mut bytemuck::cast_slice_mut::<u64, W>(&mut send[..words])[..n];
        let recv = &mut bytemuck::cast_slice_mut::<u64, W>(&mut recv[..words])[..n];
        f(send, recv)
    })
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

/// The tag of [`sync_clock`]'s messages.
const CLOCK_TAG: i32 = 9;
/// How many round trips [`sync_clock`] times per rank.
const CLOCK_ROUNDS: usize = 8;

/// This rank's clock's offset to rank 0's (the timeline's clock, ns: this clock less
/// rank 0's) and the estimate's error: each rank asks rank 0 for its time
/// [`CLOCK_ROUNDS`] times, and keeps the answer of the shortest round trip, taken as
/// read at its middle (error: half that round trip). Rank 0 answers the ranks in turn,
/// then tells each when its clock started: the origin of the job's timeline.
fn sync_clock(w: &SimpleCommunicator, rank: usize, size: usize) -> (i64, u64, u64) {
    use kvstore_core::timeline::{local_origin, now};
    if size < 2 {
        return (0, 0, local_origin());
    }
    if rank == 0 {
        for r in 1..size {
            let p = w.process_at_rank(r as i32);
            for _ in 0..CLOCK_ROUNDS {
                let (_asked, _) = p.receive_with_tag::<u64>(CLOCK_TAG);
                p.send_with_tag(&now(), CLOCK_TAG);
            }
            p.send_with_tag(&local_origin(), CLOCK_TAG);
        }
        return (0, 0, local_origin());
    }
    let root = w.process_at_rank(0);
    let mut best = (u64::MAX, 0i64);
    for _ in 0..CLOCK_ROUNDS {
        let sent = now();
        root.send_with_tag(&sent, CLOCK_TAG);
        let (theirs, _) = root.receive_with_tag::<u64>(CLOCK_TAG);
        let back = now();
        let trip = back.saturating_sub(sent);
        if trip < best.0 {
            let middle = sent + trip / 2;
            best = (trip, middle as i64 - theirs as i64);
        }
    }
    let (origin, _) = root.receive_with_tag::<u64>(CLOCK_TAG);
    (best.1, best.0 / 2, origin)
}

/// The tag of [`tree_sum`]'s messages.
const TREE_TAG: i32 = 7;
/// The tag of [`swap`]'s messages (the world carries no other point-to-point ones).
const SWAP_TAG: i32 = 8;

/// Sends `send` to `peer` and receives the peer's buffer of the same length into
/// `recv`: blocking for a blocking store call, waited for as [`wait`] does for a
/// non-blocking one.
fn swap<W: Equivalence>(w: &SimpleCommunicator, peer: i32, send: &[W], recv: &mut [W]) {
    let p = w.process_at_rank(peer);
    if in_background() {
        mpi::request::scope(|scope| {
            let received = p.immediate_receive_into_with_tag(scope, recv, SWAP_TAG);
            let sent = p.immediate_send_with_tag(scope, send, SWAP_TAG);
            wait(received);
            wait(sent);
        });
    } else {
        mpi::point_to_point::send_receive_into_with_tags(send, &p, SWAP_TAG, recv, &p, SWAP_TAG);
    }
}

/// `recv = sum(send)` across the ranks with every element summed alike, wherever it sits
/// in the buffer: pairs of partial sums up a fixed binary tree, the lower ranks' on the
/// left (((a0 + a1) + (a2 + a3)) on 4 ranks), then rank 0's result to every rank. MPI's
/// own allreduce picks its algorithm by message size, and some (a ring) sum each part
/// of the buffer in a different order: on 3 or more ranks, a key fused with other
/// keys (a list call, or non-blocking calls fused across calls) could then get other
/// bits than the same key summed alone. On 2 ranks every algorithm makes the one sum
/// a0 + a1: fused buckets use [`swap`] there. Big arrays use [`scatter_sum`], which sums
/// in this order too.
fn tree_sum<W: Element + Equivalence>(w: &SimpleCommunicator, send: &[W], recv: &mut [W]) {
    let (rank, size) = (w.rank(), w.size());
    recv.copy_from_slice(send);
    let mut theirs: Vec<W> = Vec::new();
    let mut step = 1;
    while step < size {
        if rank % (2 * step) == step {
            let to = w.process_at_rank(rank - step);
            if in_background() {
                mpi::request::scope(|scope| wait(to.immediate_send_with_tag(scope, &recv[..], TREE_TAG)));
            } else {
                to.send_with_tag(&recv[..], TREE_TAG);
            }
            break;
        }
        if rank + step < size {
            theirs.resize(recv.len(), W::default());
            let from = w.process_at_rank(rank + step);
            if in_background() {
                mpi::request::scope(|scope| {
                    wait(from.immediate_receive_into_with_tag(scope, &mut theirs[..], TREE_TAG))
                });
            } else {
                from.receive_into_with_tag(&mut theirs[..], TREE_TAG);
            }
            add_to(recv, &theirs);
        }
        step *= 2;
    }
    let root = w.process_at_rank(0);
    if in_background() {
        mpi::request::scope(|scope| wait(root.immediate_broadcast_into(scope, recv)));
    } else {
        root.broadcast_into(recv);
    }
}

/// The tags of [`scatter_sum`]'s messages: a rank's pieces of another rank's segment,
/// and a segment's sums.
const SCATTER_TAG: i32 = 10;
pub(crate) const GATHER_TAG: i32 = 11;
/// The bytes of a piece of [`scatter_sum`]: every piece is in flight at once, and each
/// is summed as soon as it has arrived from every rank, while the others travel.
const PIECE_BYTES: usize = 1 << 20;

/// A buffer of this thread's, reused across calls (u64 words: every element type is
/// aligned): fresh multi-megabyte buffers would page-fault on every call.
pub(crate) type Scratch = std::thread::LocalKey<std::cell::RefCell<Vec<u64>>>;

thread_local! {
    /// [`scatter_sum`]'s receive buffer.
    static SCATTERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The copy of an array summed in place ([`MpiGroup::allreduce_big`]).
    static COPY: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most bytes any thread's [`Scratch`] buffer has held in this process
/// ([`MpiGroup::largest_scratch_bytes`]).
static LARGEST_SCRATCH: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on `n` elements of `W` of the buffer `scratch`.
pub(crate) fn with_scratch<W: bytemuck::Pod, T>(
    scratch: &'static Scratch,
    n: usize,
    f: impl FnOnce(&mut [W]) -> T,
) -> T {
    scratch.with(|b| {
        let mut words = b.borrow_mut();
        let need = (n * std::mem::size_of::<W>()).div_ceil(8);
        if words.len() < need {
            words.resize(need, 0);
            LARGEST_SCRATCH.fetch_max(need * 8, Ordering::Relaxed);
        }
        f(&mut bytemuck::cast_slice_mut::<u64, W>(&mut words[..need])[..n])
    })
}

/// Rank `r`'s segment of `len` elements on `size` ranks.
pub(crate) fn segment(len: usize, size: usize, r: usize) -> std::ops::Range<usize> {
    len * r / size..len * (r + 1) / size
}

/// `recv = sum(send)` across the ranks, every element in [`tree_sum`]'s order, at the
/// bound of the bytes a rank must move: rank r owns segment r of the array (1/n of
/// it). Every rank sends each other rank its pieces of that rank's segment, all at once;
/// the owner sums each piece over the ranks, in the tree's order ([`tree_into`]), as
/// soon as every rank's has arrived (while the others travel), and sends the sum to
/// every other rank, which receives it in place. Each rank sends and receives
/// 2(n - 1)/n of the array, as a ring does; but a ring sums each part of the array in
/// another order, where here every element gets the same sum whatever its place in the
/// array, the array's size or the ranks' hosts. `send` and `recv` do not overlap.
pub(crate) fn scatter_sum<W: Element + Equivalence + bytemuck::Pod>(
    w: &SimpleCommunicator,
    send: &[W],
    recv: &mut [W],
) {
    sum_segments(w, send, recv, true);
}

/// [`scatter_sum`] (`whole`: `out` is the whole array, and every segment's sums travel
/// back to every rank) or its first half (`out` is this rank's segment only: the sums of
/// its segment, which no other rank receives).
fn sum_segments<W: Element + Equivalence + bytemuck::Pod>(
    w: &SimpleCommunicator,
    send: &[W],
    out: &mut [W],
    whole: bool,
) {
    let (me, n) = (w.rank() as usize, w.size() as usize);
    let theirs = segment(send.len(), n, me).len() * (n - 1);
    with_scratch(&SCATTERED, theirs, |theirs: &mut [W]| {
        mpi::request::scope(|scope| {
            Summing::post(scope, w, send, out, theirs, whole).finish();
        });
    });
}

/// Messages of elements `W` under way in a request scope.
type Requests<'a, W, S> = Vec<Request<'a, [W], S>>;

/// A sum of segments under way ([`sum_segments`]: the whole array's, or this rank's
/// segment's only), in a request
/// scope: every message posted by [`Summing::post`]; [`Summing::poll`] sums this rank's
/// next pieces whose parts have all arrived (and sends the sums on, for the whole
/// array); [`Summing::finish`] sums the rest and waits for every message. Several can be
/// under way at once, each summed as its pieces arrive: the steps of a sum host by host
/// ([`crate::hosts`]) overlap that way.
pub(crate) struct Summing<'a, W: Equivalence, S: Scope<'a>> {
    w: &'a SimpleCommunicator,
    scope: S,
    send: &'a [W],
    /// This rank's segment of the array.
    mine: std::ops::Range<usize>,
    piece: usize,
    /// Every other rank's pieces of this rank's segment, in rank order, piece by piece.
    arriving: Vec<std::collections::VecDeque<Request<'a, [W], S>>>,
    /// The parts of the next piece that have arrived (by other rank).
    got: Vec<Option<&'a [W]>>,
    /// The next piece to sum.
    next: usize,
    /// This rank's segment's sums: its pieces not yet summed (`whole`), or all of it.
    own: &'a mut [W],
    /// Its summed pieces (`whole`: each sent to every other rank as it is summed).
    summed: Vec<&'a [W]>,
    /// The other ranks' segments' sums on their way here, by rank (`whole`).
    sums: Vec<(usize, Requests<'a, W, S>)>,
    /// Sends, waited for at the end.
    sends: Requests<'a, W, S>,
    whole: bool,
}

impl<'a, W: Element + Equivalence + bytemuck::Pod, S: Scope<'a> + Copy> Summing<'a, W, S> {
    /// Posts every message of [`sum_segments`] over `w`: this rank's pieces of the other
    /// ranks' segments of `send`, the receives of theirs of this rank's segment into
    /// `theirs` ((n - 1) times this rank's segment), and, for the `whole` array, the
    /// receives of the other segments' sums into `out` (the array; else `out` is this
    /// rank's segment).
    pub(crate) fn post(
        scope: S,
        w: &'a SimpleCommunicator,
        send: &'a [W],
        out: &'a mut [W],
        theirs: &'a mut [W],
        whole: bool,
    ) -> Self {
        let (me, n) = (w.rank() as usize, w.size() as usize);
        let len = send.len();
        let piece = (PIECE_BYTES / std::mem::size_of::<W>()).max(1);
        let mine = segment(len, n, me);
        let others: Vec<usize> = (0..n).filter(|&r| r != me).collect();
        // out: the other ranks' segments (their sums arrive there) and this rank's.
        let (mut lower, own, mut upper) = if whole {
            let (before, rest) = out.split_at_mut(mine.start);
            let (own, after) = rest.split_at_mut(mine.len());
            (before, own, after)
        } else {
            (&mut [][..], out, &mut [][..])
        };
        let mut sends = Vec::new();
        let mut sums = Vec::new();
        for &r in &others {
            let seg = segment(len, n, r);
            let p = w.process_at_rank(r as i32);
            for part in send[seg.clone()].chunks(piece) {
                sends.push(p.immediate_send_with_tag(scope, part, SCATTER_TAG));
            }
            if whole {
                let into = next_segment(&mut lower, &mut upper, r < me, seg.len()).chunks_mut(piece);
                sums.push((r, into.map(|part| p.immediate_receive_into_with_tag(scope, part, GATHER_TAG)).collect()));
            }
        }
        let theirs = &mut theirs[..mine.len() * others.len()];
        let arriving = theirs
            .chunks_mut(mine.len().max(1))
            .zip(&others)
            .map(|(chunk, &r)| {
                let p = w.process_at_rank(r as i32);
                chunk
                    .chunks_mut(piece)
                    .map(|part| p.immediate_receive_into_with_tag(scope, part, SCATTER_TAG))
                    .collect()
            })
            .collect();
        Summing {
            w,
            scope,
            send,
            mine,
            piece,
            arriving,
            got: vec![None; others.len()],
            next: 0,
            own,
            summed: Vec::new(),
            sums,
            sends,
            whole,
        }
    }

    /// Sums every next piece whose parts have all arrived, without waiting: whether
    /// every piece is summed.
    pub(crate) fn poll(&mut self) -> bool {
        let (me, n) = (self.w.rank() as usize, self.w.size() as usize);
        let pieces = self.mine.len().div_ceil(self.piece);
        while self.next < pieces {
            // (Every rank sends as many pieces of this segment as this rank receives.)
            for (from, got) in self.arriving.iter_mut().zip(self.got.iter_mut()) {
                if got.is_none() {
                    match from.pop_front().expect("a rank's piece").test_with_data() {
                        Ok((_, data)) => *got = Some(data),
                        Err(pending) => from.push_front(pending),
                    }
                }
            }
            if self.got.iter().any(Option::is_none) {
                return false;
            }
            let at = self.next * self.piece;
            let len = self.piece.min(self.mine.len() - at);
            let mut got = self.got.iter_mut().map(|g| g.take().expect("arrived"));
            let from = self.mine.start + at;
            let parts: Vec<&[W]> = (0..n)
                .map(|r| if r == me { &self.send[from..from + len] } else { got.next().expect("a part") })
                .collect();
            if self.whole {
                let (out, rest) = std::mem::take(&mut self.own).split_at_mut(len);
                self.own = rest;
                tree_into(&parts, out);
                let out: &'a [W] = out;
                for r in (0..n).filter(|&r| r != me) {
                    let p = self.w.process_at_rank(r as i32);
                    self.sends.push(p.immediate_send_with_tag(self.scope, out, GATHER_TAG));
                }
                self.summed.push(out);
            } else {
                tree_into(&parts, &mut self.own[at..at + len]);
            }
            self.next += 1;
        }
        true
    }

    /// Sums the rest (yielding the core while pieces travel) and waits for every
    /// message. The sums, in pieces in the array's order: for the whole array, every
    /// segment's in the pieces it travelled in ([`sum_pieces`]); else this rank's
    /// segment whole.
    pub(crate) fn finish(mut self) -> Vec<&'a [W]> {
        while !self.poll() {
            std::thread::yield_now();
        }
        for r in self.sends {
            wait(r);
        }
        if !self.whole {
            return vec![self.own];
        }
        let me = self.w.rank() as usize;
        let mut pieces = Vec::new();
        let mut sums = self.sums.into_iter().peekable();
        while sums.peek().is_some_and(|(r, _)| *r < me) {
            pieces.extend(sums.next().expect("a lower rank's").1.into_iter().map(wait_data));
        }
        pieces.extend(self.summed);
        pieces.extend(sums.flat_map(|(_, s)| s).map(wait_data));
        pieces
    }
}

/// The lengths of the pieces a segment of `len` elements travels in once summed by
/// [`scatter_sum`] over `n` ranks: each rank's part of it, in rank order, in pieces of
/// [`PIECE_BYTES`].
pub(crate) fn sum_pieces<W>(len: usize, n: usize) -> impl Iterator<Item = usize> {
    let piece = (PIECE_BYTES / std::mem::size_of::<W>()).max(1);
    (0..n).flat_map(move |r| {
        let part = segment(len, n, r).len();
        (0..part.div_ceil(piece)).map(move |i| piece.min(part - i * piece))
    })
}

/// The next other rank's segment of an array split around this rank's: the first `len`
/// elements of what is left `lower` (a lower rank's) or `upper` (a higher rank's).
pub(crate) fn next_segment<'a, W>(
    lower: &mut &'a mut [W],
    upper: &mut &'a mut [W],
    below: bool,
    len: usize,
) -> &'a mut [W] {
    let side = if below { lower } else { upper };
    let (x, rest) = std::mem::take(side).split_at_mut(len);
    *side = rest;
    x
}

/// The data of a receive, once it arrived (waited for as [`wait`] does).
fn wait_data<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>) -> &'a D {
    loop {
        match request.test_with_data() {
            Ok((_, data)) => return data,
            Err(pending) => {
                request = pending;
                if in_background() {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Writes the sums of `parts` (by rank) into `out`, in [`tree_sum`]'s order: the
/// largest power of two of ranks below their number on the left, the rest on the right,
/// each summed alike ((a0 + a1) + a2 on 3 ranks, ((a0 + a1) + (a2 + a3)) + a4 on 5).
/// [`TREE_CHUNK`] elements at a time, each level's right-hand sums in a buffer on the
/// stack (no allocation, and the partial sums stay in the cache).
pub(crate) fn tree_into<W: Element>(parts: &[&[W]], out: &mut [W]) {
    for (i, chunk) in out.chunks_mut(TREE_CHUNK).enumerate() {
        tree_chunk(parts, i * TREE_CHUNK, chunk);
    }
}

/// The elements [`tree_into`] sums at a time.
const TREE_CHUNK: usize = 1024;

/// [`tree_into`] of the elements `at..at + out.len()` of `parts` (at most
/// [`TREE_CHUNK`]).
fn tree_chunk<W: Element>(parts: &[&[W]], at: usize, out: &mut [W]) {
    let range = at..at + out.len();
    match parts {
        [one] => out.copy_from_slice(&one[range]),
        [a, b] => add_into(&a[range.clone()], &b[range], out),
        _ => {
            let left = parts.len().next_power_of_two() / 2;
            tree_chunk(&parts[..left], at, out);
            let mut right = [W::default(); TREE_CHUNK];
            let right = &mut right[..out.len()];
            tree_chunk(&parts[left..], at, right);
            add_to(out, right);
        }
    }
}

/// `out += b`, element by element, rounded once.
fn add_to<W: Element>(out: &mut [W], b: &[W]) {
    for (o, &y) in out.iter_mut().zip(b) {
        *o = W::from_acc(W::acc_add(o.to_acc(), y.to_acc()));
    }
}

/// `out = a + b`, element by element, rounded once.
fn add_into<W: Element>(a: &[W], b: &[W], out: &mut [W]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = W::from_acc(W::acc_add(x.to_acc(), y.to_acc()));
    }
}

/// A piece of a fused bucket: (pair, first element, elements).
type Piece = (usize, usize, usize);

/// The pieces of `pairs`' sources in buckets of at most `bucket` elements, in order: an
/// array that does not fit in what is left of a bucket continues in the next.
fn plan(pairs: &[(&NDArray, &NDArray)], bucket: usize) -> Vec<Vec<Piece>> {
    let mut buckets = vec![Vec::new()];
    let mut filled = 0;
    for (p, (src, _)) in pairs.iter().enumerate() {
        let len = src.size();
        let mut off = 0;
        while off < len {
            if filled == bucket {
                buckets.push(Vec::new());
                filled = 0;
            }
            let take = (len - off).min(bucket - filled);
            buckets.last_mut().expect("a bucket").push((p, off, take));
            off += take;
            filled += take;
        }
    }
    buckets.retain(|b| !b.is_empty());
    buckets
}

/// Copies `pieces` of the sources into `slot`, one after another, as `W`. A source of
/// another dtype (f16, bf16) is converted whole once (`converted` keeps the last one,
/// for its pieces in the next bucket).
fn pack<W: Element>(
    pairs: &[(&NDArray, &NDArray)],
    pieces: &[Piece],
    slot: &mut [W],
    converted: &mut Option<(usize, Vec<W>)>,
) -> Result<()> {
    let mut at = 0;
    for &(p, off, len) in pieces {
        let src = pairs[p].0;
        let to = &mut slot[at..at + len];
        if src.dtype() == W::DTYPE {
            src.with_data(|s: &[W]| to.copy_from_slice(&s[off..off + len]))?;
        } else {
            if converted.as_ref().is_none_or(|(q, _)| *q != p) {
                *converted = Some((p, read_wire::<W>(src)?));
            }
            let (_, data) = converted.as_ref().expect("converted above");
            to.copy_from_slice(&data[off..off + len]);
        }
        at += len;
    }
    Ok(())
}

/// Writes each piece's sum over the ranks' `slots` (by rank) into its destination:
/// summed as [`tree_sum`] sums, so a key gets the same bits whichever path it took.
fn store_sums<W: Element>(pairs: &[(&NDArray, &NDArray)], pieces: &[Piece], slots: &[&[W]]) -> Result<()> {
    let mut at = 0;
    let mut parts = Vec::with_capacity(slots.len());
    for &(p, off, len) in pieces {
        parts.clear();
        parts.extend(slots.iter().map(|s| &s[at..at + len]));
        store_piece::<W>(pairs[p].1, off, len, |out| tree_into(&parts, out))?;
        at += len;
    }
    Ok(())
}

/// The chunks of a sum host by host ([`hosts::GROUP_CHUNKS`]'s 4 groups) in a group of
/// a big array's flat sum ([`MpiGroup::group_bytes`]): each group's messages are all in
/// flight at once, and the next group's start after the last sums of this one arrived.
/// On the 2-core machine of `make bench`, 2 ranks: a 256 MiB push in groups of 64 MiB
/// took 101 and 111 ms against 88 and 90 ms in one; a 512 MiB push in groups of 256
/// MiB, 201 and 232 ms against 196 and 204 ms in one.
const SUM_GROUP_CHUNKS: usize = 4 * hosts::GROUP_CHUNKS;

/// Elements per MPI call, within MPI's `int` counts.
const MAX_COUNT: usize = i32::MAX as usize;

impl MpiGroup {
    /// A big array whose dtype MPI sums natively: `dst = sum(src)` by [`scatter_sum`]
    /// (or host by host, [`Hosts::sum`]), straight from the source's memory into the
    /// destination's (no copy), or, in place, from a copy of the source. It goes in
    /// groups, one after the other: host by host, the sum's own ([`hosts::groups`], 64
    /// MiB by default); flat, of at most [`MpiGroup::group_bytes`] (256 MiB by default).
    /// So the buffers the sum keeps (this thread's, reused: the flat sum's receive
    /// buffer, the copy, the hosts' parts) hold a group's worth of the array, however big
    /// it is. The groups are the same on every rank, whether it sums in place or not
    /// (which another rank may do otherwise), and the bits are the same whatever the
    /// groups (each element's sum is the same tree over the ranks wherever it is).
    fn allreduce_big<W: Element + Equivalence + bytemuck::Pod>(&self, src: &NDArray, dst: &NDArray) -> Result<()> {
        let in_place = src.same_storage(dst);
        let sum = |s: Option<&[W]>, d: &mut [W]| {
            self.with_mpi(|mpi| {
                // (Found at the first big sum; then the world and the hosts are both read.)
                let by_hosts = mpi.hosts(self.host_ranks).is_some();
                let (world, hosts) = (&mpi.world, mpi.hosts.found());
                // Each group's range, with its chunks host by host.
                let groups = match hosts {
                    Some(_) => hosts::groups(d.len(), std::mem::size_of::<W>(), self.host_chunk_bytes),
                    None => {
                        let n = std::mem::size_of_val(d).div_ceil(self.group_bytes()).max(1);
                        (0..n).map(|g| (segment(d.len(), n, g), 0)).collect()
                    }
                };
                for (part, chunks) in groups {
                    let d = &mut d[part.clone()];
                    let sum_part = |s: &[W], d: &mut [W]| match hosts {
                        Some(hosts) => hosts.sum(s, d, chunks),
                        None => scatter_sum(world, s, d),
                    };
                    match s {
                        Some(s) => sum_part(&s[part], d),
                        None => with_scratch::<W, _>(&COPY, d.len(), |send| {
                            send.copy_from_slice(d);
                            sum_part(&send[..], d)
                        }),
                    }
                }
                self.used_hosts.store(by_hosts, Ordering::Relaxed);
            })
        };
        if in_place {
            dst.with_data_mut(|d: &mut [W]| sum(None, d))??;
        } else {
            src.with_data(|s: &[W]| dst.with_data_mut(|d: &mut [W]| sum(Some(s), d)))???;
        }
        Ok(())
    }

    /// The most bytes of a big array the flat sum sums at once
    /// ([`MpiGroup::allreduce_big`]): [`SUM_GROUP_CHUNKS`] chunks of
    /// `KVSTORE_MPI_HOST_CHUNK_BYTES` (256 MiB by default).
    fn group_bytes(&self) -> usize {
        self.host_chunk_bytes.saturating_mul(SUM_GROUP_CHUNKS)
    }

    /// Small arrays of one wire type `W`, fused into buckets of `bucket` elements:
    /// through the machine's shared window where it is open ([`NodeWindow`]), else
    /// staged in the reused send buffer.
    fn allreduce_fused<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        bucket: usize,
    ) -> Result<()> {
        let total: usize = pairs.iter().map(|(s, _)| s.size()).sum();
        let bucket = bucket.min(total.max(1));
        let buckets = plan(pairs, bucket);
        let background = in_background();
        let through_window = self.with_mpi(|mpi| -> Result<bool> {
            // Opened at the first fused bucket, every rank agreeing; then used while this
            // rank wants it (every rank must say the same: `set_shared_memory`).
            let wanted = self.shared_memory.load(Ordering::Relaxed);
            let window = match mpi.window(bucket * size_of::<W>(), wanted) {
                Some(w) if wanted => w,
                _ => {
                    self.used_shared_memory.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
            };
            self.used_shared_memory.store(true, Ordering::Relaxed);
            let mut converted = None;
            for pieces in &buckets {
                // Each bucket is one wait for the other ranks, timed on its own.
                watchdog::Watched::restart();
                let len = pieces.iter().map(|p| p.2).sum();
                pack::<W>(pairs, pieces, window.my_slot::<W>(len), &mut converted)?;
                window.publish::<W, _>(len, background, |slots| store_sums(pairs, pieces, slots))?;
            }
            Ok(true)
        })??;
        if through_window {
            return Ok(());
        }
        with_buffers::<W, _>(bucket, |send, recv| -> Result<()> {
            let mut converted = None;
            for pieces in &buckets {
                let len = pieces.iter().map(|p| p.2).sum();
                pack::<W>(pairs, pieces, &mut send[..len], &mut converted)?;
                self.flush_bucket(pairs, &send[..len], &mut recv[..len], pieces)?;
            }
            Ok(())
        })
    }

    /// Sums one staged bucket across the ranks and writes each summed piece into its
    /// destination. On 2 ranks the ranks swap their buckets and each sums
    /// `rank 0's + rank 1's` straight into the destinations: one round of messages and
    /// no copy out of a receive buffer, where MPI's allreduce takes two rounds (reduce-
    /// scatter, allgather) and copies the send buffer first. The sum is the one MPI's
    /// makes on 2 ranks, a0 + a1, so a key gets the same bits fused as alone or big.
    fn flush_bucket<W: Element + Equivalence>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        send: &[W],
        recv: &mut [W],
        pending: &[Piece],
    ) -> Result<()> {
        if self.size == 2 {
            let peer = 1 - self.rank as i32;
            self.with_world(|w| swap(w, peer, send, &mut *recv))?;
            let (lo, hi) = if self.rank == 0 { (send, &*recv) } else { (&*recv, send) };
            let mut at = 0;
            for &(p, off, len) in pending {
                let (a, b) = (&lo[at..at + len], &hi[at..at + len]);
                store_piece::<W>(pairs[p].1, off, len, |out| add_into(a, b, out))?;
                at += len;
            }
            return Ok(());
        }
        self.with_world(|w| tree_sum(w, send, &mut *recv))?;
        let mut at = 0;
        for &(p, off, len) in pending {
            store_piece::<W>(pairs[p].1, off, len, |out| out.copy_from_slice(&recv[at..at + len]))?;
            at += len;
        }
        Ok(())
    }
}

impl Collective for MpiGroup {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<()> {
        self.with_world(|w| w.barrier())
    }

    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()> {
        if self.size == 1 {
            for (src, dst) in pairs {
                dst.copy_from(src)?;
            }
            return Ok(());
        }
        let bytes = self.bucket_bytes.load(Ordering::Relaxed);
        let wire = |d: DType| with_wire!(d, W => W::DTYPE);
        // Whether a pair goes straight through MPI (an array of at least a bucket whose
        // dtype MPI sums natively) depends only on shapes and dtypes, so every rank
        // makes the same MPI calls, whatever its local values were.
        let big = |a: &NDArray| a.size() * a.dtype().size() >= bytes && wire(a.dtype()) == a.dtype();
        let mut start = 0;
        // Each bucket (or big array) is an event of the timeline when it records.
        let record_bucket = |at: u64, pairs: &[(&NDArray, &NDArray)], n: u64| {
            use kvstore_core::timeline::{self, Arg};
            let bytes = pairs.iter().map(|(_, d)| (d.size() * d.dtype().size()) as u64).sum();
            let args = vec![("bucket", Arg::U(n)), ("keys", Arg::U(pairs.len() as u64)), ("bytes", Arg::U(bytes))];
            timeline::complete("bucket", "wire", at, timeline::now(), args);
        };
        let recording = kvstore_core::timeline::recording();
        let mut n = 0;
        while start < pairs.len() {
            let (src, dst) = pairs[start];
            let at = if recording { kvstore_core::timeline::now() } else { 0 };
            if big(dst) {
                with_wire!(dst.dtype(), W => self.allreduce_big::<W>(src, dst)?);
                if recording {
                    record_bucket(at, &pairs[start..=start], n);
                }
                (start, n) = (start + 1, n + 1);
                continue;
            }
            // A run of small arrays of one wire type shares buckets.
            let t = wire(dst.dtype());
            let end =
                (start..pairs.len()).find(|&i| big(pairs[i].1) || wire(pairs[i].1.dtype()) != t).unwrap_or(pairs.len());
            with_wire!(dst.dtype(), W => {
                let bucket = (bytes.min(PACKED_BYTES) / std::mem::size_of::<W>()).max(1);
                self.allreduce_fused::<W>(&pairs[start..end], bucket)?
            });
            if recording {
                record_bucket(at, &pairs[start..end], n);
            }
            (start, n) = (end, n + 1);
        }
        Ok(())
    }

    /// The records travel as messages, one to every other worker, on a communicator of
    /// their own; the wait tests them (yielding under a non-blocking store call), so it
    /// knows which workers have arrived. After the timeout it prints which ranks never
    /// arrived at `step` and ends the job.
    fn exchange(&self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = mine.len();
        if self.size == 1 || n == 0 {
            return Ok(vec![mine.to_vec(); self.size]);
        }
        watchdog::set_step(step);
        let mut all = vec![0u8; n * self.size];
        all[self.rank * n..(self.rank + 1) * n].copy_from_slice(mine);
        // Records of one length share a tag: a worker a round ahead cannot be taken for
        // one of this round.
        let tag = (n % 30_000) as i32 + 1;
        let timeout = self.timeout();
        let background = in_background();
        self.with_mpi(|mpi| {
            let _own_deadline = watchdog::Exchanging::start();
            let start = std::time::Instant::now();
            mpi::request::scope(|scope| {
                let mut receives: Vec<(usize, Request<'_, [u8], _>)> = all
                    .chunks_mut(n)
                    .enumerate()
                    .filter(|(r, _)| *r != self.rank)
                    .map(|(r, buf)| {
                        (r, mpi.steps.process_at_rank(r as i32).immediate_receive_into_with_tag(scope, buf, tag))
                    })
                    .collect();
                let mut sends: Vec<Request<'_, [u8], _>> = (0..self.size)
                    .filter(|&r| r != self.rank)
                    .map(|r| mpi.steps.process_at_rank(r as i32).immediate_send_with_tag(scope, mine, tag))
                    .collect();
                while !(receives.is_empty() && sends.is_empty()) {
                    receives = receives.into_iter().filter_map(|(r, q)| q.test().err().map(|q| (r, q))).collect();
                    sends = sends.into_iter().filter_map(|q| q.test().err()).collect();
                    if start.elapsed() >= timeout && !receives.is_empty() {
                        let missing: Vec<usize> = receives.iter().map(|(r, _)| *r).collect();
                        watchdog::never_arrived(self.rank, self.size, step, timeout, &missing);
                    }
                    if background {
                        std::thread::yield_now();
                    }
                }
            });
        })?;
        Ok(all.chunks(n).map(<[u8]>::to_vec).collect())
    }

    /// MPI's allgather (non-blocking and waited for as `wait` does under a
    /// non-blocking store call), under the watchdog.
    fn all_gather(&self, step: &str, mine: &[u8]) -> Result<Vec<u8>> {
        let n = mine.len();
        if self.size == 1 || n == 0 {
            return Ok(mine.to_vec());
        }
        if n > MAX_COUNT {
            return Err(Error::invalid_argument(format!(
                "{step}: {n} bytes per worker in one allgather; MPI counts up to {MAX_COUNT}"
            )));
        }
        watchdog::set_step(step);
        let mut all = vec![0u8; n * self.size];
        self.with_world(|w| {
            if in_background() {
                mpi::request::scope(|scope| wait(w.immediate_all_gather_into(scope, mine, &mut all[..])));
            } else {
                w.all_gather_into(mine, &mut all[..]);
            }
        })?;
        Ok(all)
    }

    fn set_timeout(&self, timeout: Duration) {
        MpiGroup::set_timeout(self, timeout);
    }

    fn map_file(&self, file: &std::fs::File, offset: u64, len: usize) -> Option<std::io::Result<MappedFile>> {
        Some(crate::mapped::map_for_writing(file, offset, len))
    }

    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let root = i32::try_from(root).map_err(|_| Error::invalid_argument(format!("broadcast root {root}")))?;
        for a in arrays {
            with_wire!(a.dtype(), W => {
                let mut data = read_wire::<W>(a)?;
                self.with_world(|w| w.process_at_rank(root).broadcast_into(&mut data[..]))?;
                write_wire(a, &data)?;
            });
        }
        Ok(())
    }
}

/// The stall watchdog. Desync detection's exchange waits with its own deadline and knows
/// who arrived ([`MpiGroup::exchange`]); every other MPI call (the collectives that move
/// data) is watched by a thread, which ends the job when one has not returned within
/// the timeout: a worker stopped inside it (once every worker has arrived at a call, only
/// a worker stopped or stuck inside it keeps it from completing).
pub(crate) mod watchdog {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use parking_lot::Mutex;

    use super::MpiGroup;

    /// The exit status of a job the watchdog ended.
    pub(crate) const WATCHDOG_EXIT: i32 = 86;

    /// When the MPI call in progress started, in ms since [`epoch`] (0: none).
    static BUSY_SINCE: AtomicU64 = AtomicU64::new(0);
    /// Whether the call in progress is an exchange (which keeps its own deadline).
    static EXCHANGING: AtomicBool = AtomicBool::new(false);
    /// The last step the workers compared: the call the data belongs to.
    static STEP: Mutex<String> = Mutex::new(String::new());
    /// When this rank entered [`super::finalize`], in ms since [`epoch`] (0: not yet).
    static FINALIZING_SINCE: AtomicU64 = AtomicU64::new(0);

    fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    fn now_ms() -> u64 {
        u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }

    pub(super) fn set_step(step: &str) {
        let mut s = STEP.lock();
        s.clear();
        s.push_str(step);
    }

    /// Marks the start of `MPI_Finalize` (after every rank arrived at finalize): a
    /// rank stuck inside it could hold the others, or the launcher, for ever.
    pub(super) fn finalizing() {
        FINALIZING_SINCE.store(now_ms(), Ordering::SeqCst);
    }

    /// Marks an MPI call in progress while alive.
    pub(super) struct Watched(());

    impl Watched {
        pub(super) fn start() -> Self {
            BUSY_SINCE.store(now_ms(), Ordering::SeqCst);
            Watched(())
        }

        /// Starts the clock of the call in progress again: one MPI call of several
        /// made under one `Watched` has finished, and the next begins.
        pub(super) fn restart() {
            BUSY_SINCE.store(now_ms(), Ordering::SeqCst);
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            BUSY_SINCE.store(0, Ordering::SeqCst);
        }
    }

    /// Marks an exchange in progress while alive.
    pub(super) struct Exchanging(());

    impl Exchanging {
        pub(super) fn start() -> Self {
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
    pub(super) fn never_arrived(rank: usize, size: usize, step: &str, timeout: Duration, missing: &[usize]) -> ! {
        let arrived: Vec<usize> = (0..size).filter(|r| !missing.contains(r)).collect();
        say(format!(
            "kvstore-mpi: rank {rank}: {step} has waited {} s for {}, which never arrived at it ({} did); a worker \
             that is alive but stuck (or stopped) holds up the job: aborting it ({}={}){}{}",
            seconds(timeout),
            ranks(missing),
            ranks(&arrived),
            super::TIMEOUT_VAR,
            seconds(timeout),
            crate::remote::serving_hint(),
            kvstore_core::timeline::flight_note(true)
        ));
        abort_soon()
    }

    fn abort_soon() -> ! {
        // The other workers that can still speak time out at about the same moment.
        std::thread::sleep(Duration::from_secs(2));
        super::abort_job(WATCHDOG_EXIT);
        std::process::exit(WATCHDOG_EXIT)
    }

    /// Starts the thread that watches the MPI calls (once per process).
    pub(super) fn start(group: Arc<MpiGroup>) {
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
                            super::TIMEOUT_VAR,
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
                if since == 0 || EXCHANGING.load(Ordering::SeqCst) || super::FINALIZED.load(Ordering::SeqCst) {
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
                        super::TIMEOUT_VAR,
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
}

#[cfg(test)]
mod tests {
    use super::{TREE_CHUNK, tree_into};

    /// The tree's definition, one level at a time, each level's sums in a vector of
    /// their own (what `tree_into` computes without allocating).
    fn tree_by_levels(parts: &[Vec<f32>]) -> Vec<f32> {
        if let [one] = parts {
            return one.clone();
        }
        let left = parts.len().next_power_of_two() / 2;
        let (l, r) = (tree_by_levels(&parts[..left]), tree_by_levels(&parts[left..]));
        l.iter().zip(&r).map(|(x, y)| x + y).collect()
    }

    #[test]
    fn a_tree_sum_of_any_number_of_ranks_and_length_has_the_bits_of_its_tree() {
        // Values of mixed magnitudes, so that another order of the sum has other bits.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut value = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let m = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 10f32.powi(((seed >> 20) % 9) as i32 - 4)
        };
        let mut differs_from_left_to_right = false;
        for ranks in 1..=9 {
            for len in [0, 1, 7, TREE_CHUNK - 1, TREE_CHUNK, 2 * TREE_CHUNK + 3] {
                let parts: Vec<Vec<f32>> = (0..ranks).map(|_| (0..len).map(|_| value()).collect()).collect();
                let slices: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
                let mut out = vec![f32::NAN; len];
                tree_into(&slices, &mut out);
                let want = tree_by_levels(&parts);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "{ranks} ranks, {len} elements");
                let in_order: Vec<f32> = (0..len).map(|i| parts.iter().map(|p| p[i]).fold(0.0, |a, b| a + b)).collect();
                differs_from_left_to_right |= bits(&in_order) != bits(&want);
            }
        }
        assert!(differs_from_left_to_right, "the values should make the order of the sum matter");
    }
}
