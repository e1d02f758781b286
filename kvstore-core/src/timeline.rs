//! The timeline: what every call of this process's stores did and when, written as
//! Chrome Trace Event Format JSON (the format `chrome://tracing` and Perfetto open).
//!
//! Turn it on with `KVSTORE_TIMELINE=PATH` in the environment (read when a store is
//! made: no code change) or [`start`] (`KVStore::start_timeline`), and off with [`stop`].
//! It records, as complete events (`"ph":"X"`): each call (`push`, `pull`, ...: its
//! keys, bytes and first key in `args`; a non-blocking call's `submit` on the caller's
//! thread, and a batch of fused calls as one, `fused`, with each of its keys' bytes in
//! `key_bytes`), and its phases: `inputs` (a call
//! waiting for other calls' writes to its arrays), `sum` (the values summed on this worker), `wire` (the
//! sum across the workers; a transport adds one event per fused bucket), `update` (the
//! updater or optimizer), `copy` (the value copied into the outs) and `ranks` (a
//! `dist_sync` worker waiting for the others at a collective); a call spread over the
//! reduction pool's threads, one `spread` event per thread (its sums and copies
//! alternate every few keys: their times in `args`). A non-blocking call's wait behind
//! earlier calls, `queued`, is an async span (`"ph":"b"`/`"e"`): it overlaps the calls
//! that run meanwhile. Also: a flow from a
//! non-blocking call's submission to where it ran (`"ph":"s"`/`"f"`), an instant event
//! per worker for its arrival at each collective (`arrive`, with its lateness: its
//! arrival minus the median of the others'), and a counter of the bytes on the wire.
//!
//! One process per rank (`pid` = rank, named by metadata events), one thread row per
//! caller thread and per engine thread. Under `mpirun` each rank writes its own file
//! beside PATH (`trace.json` → `trace.rank1.json`), and `kvstore_mpi::finalize` (or
//! `stop_timeline` on a `dist_sync` store, on every rank) merges them into PATH on rank
//! 0, every rank's clock aligned to rank 0's by the transport when the job starts
//! ([`set_clock`]; the estimated error is in the file's `otherData`).
//!
//! Bounded: the file is written as events come (nothing is kept in memory but a
//! buffer), and stops growing at `KVSTORE_TIMELINE_MAX_BYTES` (default 1 GiB) with a
//! last instant event, `truncated`. The flight recorder, a ring of the last
//! [`FLIGHT_EVENTS`] events, records too when the timeline is off, for `dist_sync` stores
//! ([`flight_on`]): a stalled or desynced job writes it ([`write_flight`]). A trace cut
//! at the bound has no span left open: an async span's begin and end are written both
//! or neither.
//!
//! Under `dist_sync`, the slowest rank is the one that held the others up longest at
//! the collectives, named when it stands out from the noise ([`Slowest`],
//! [`slowest_rank`], `Stats::slowest`).

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::RankStats;
use crate::error::{Error, Result};
pub use crate::kvstore::{LATE_MARGIN, Lateness, slowest_rank};

pub use crate::settings::{
    DEFAULT_TIMELINE_MAX_BYTES as DEFAULT_MAX_BYTES, TIMELINE_MAX_BYTES_VAR as MAX_BYTES_VAR, TIMELINE_VAR,
};

/// How many events the flight recorder keeps (the newest).
pub const FLIGHT_EVENTS: usize = 4096;

/// Whether events are written to a file.
static ON: AtomicBool = AtomicBool::new(false);
/// Whether events go to the flight recorder's ring.
static FLIGHT: AtomicBool = AtomicBool::new(false);
/// This process's rank and the number of ranks, the clock's offset to rank 0's (ns, to
/// subtract) and its estimated error (ns).
static RANK: AtomicU64 = AtomicU64::new(0);
static RANKS: AtomicU64 = AtomicU64::new(1);
static OFFSET: AtomicU64 = AtomicU64::new(0);
static CLOCK_ERROR: AtomicU64 = AtomicU64::new(0);
static ORIGIN: AtomicU64 = AtomicU64::new(0);
/// The flows' ids (a non-blocking call's submission to its run).
static NEXT_FLOW: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
/// When the file being written was started ([`now`]'s reading): a phase that began
/// before is written from then on.
static STARTED: AtomicU64 = AtomicU64::new(0);
/// The stores of this process alive now ([`Hold`]).
static STORES: AtomicUsize = AtomicUsize::new(0);
/// Whether `KVSTORE_TIMELINE` was read (by the first store made).
static ENV_READ: AtomicBool = AtomicBool::new(false);
/// A file of `KVSTORE_TIMELINE` that the last store closed: the next store made writes
/// on where its events ended ([`start_from_env`]).
static RESUME: Mutex<Option<Resume>> = Mutex::new(None);

/// Where a closed file's events ended, to write on there.
struct Resume {
    base: PathBuf,
    path: PathBuf,
    at: u64,
    max: u64,
    truncated: bool,
}

/// This thread's row in the trace (0: none yet); its name is forgotten when the thread
/// ends (a process that makes many threads keeps no list of the dead ones).
struct Row(Cell<u64>);

impl Drop for Row {
    fn drop(&mut self) {
        let id = self.0.get();
        if id != 0 {
            sink().threads.retain(|(t, _)| *t != id);
        }
    }
}

thread_local! {
    static THREAD: Row = const { Row(Cell::new(0)) };
}

/// The open file, and the threads named so far (written at the start of a file).
struct Sink {
    out: Option<Output>,
    threads: Vec<(u64, String)>,
    flight: VecDeque<Event>,
}

/// A file being written.
struct Output {
    /// The path the timeline was started with, and this rank's file of it.
    base: PathBuf,
    path: PathBuf,
    writer: BufWriter<File>,
    written: u64,
    max: u64,
    truncated: bool,
    /// Whether `KVSTORE_TIMELINE` started it (the last store's drop closes it to be
    /// resumed: [`Hold`]).
    from_env: bool,
}

static SINK: Mutex<Sink> = Mutex::new(Sink { out: None, threads: Vec::new(), flight: VecDeque::new() });

fn sink() -> std::sync::MutexGuard<'static, Sink> {
    SINK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The trace clock now: nanoseconds since the Unix epoch as this process's clock read
/// them when it first asked, advanced by a monotonic clock since (so that processes on
/// one machine agree, and an adjusted wall clock does not run a trace backwards).
pub fn now() -> u64 {
    let (at, unix) = anchor();
    unix + at.elapsed().as_nanos() as u64
}

/// When this process's trace clock started: an instant, and the Unix time then (ns).
fn anchor() -> &'static (Instant, u64) {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        (Instant::now(), unix)
    })
}

/// The origin of the trace's timestamps (on rank 0's clock, ns since the Unix epoch):
/// when rank 0's trace clock started ([`set_clock`]), else when this process's did. A
/// trace's `ts` are microseconds since then (small numbers, exact as doubles to the
/// nanosecond for days; its `otherData` has the origin).
pub fn origin() -> u64 {
    match ORIGIN.load(Ordering::Relaxed) {
        0 => anchor().1,
        o => o,
    }
}

/// The origin rank 0 gives the others ([`origin`]): when its trace clock started.
pub fn local_origin() -> u64 {
    anchor().1
}

/// `at`, a reading of [`now`], on rank 0's clock: less this clock's offset
/// ([`set_clock`]).
pub fn align(at: u64) -> u64 {
    at.wrapping_sub(OFFSET.load(Ordering::Relaxed))
}

/// For transports: this process's `rank` of `ranks`, its clock's offset to rank 0's
/// (`offset_ns`: this clock's [`now`] less rank 0's at the same instant) with the
/// estimate's error, and rank 0's [`local_origin`] (the job's [`origin`]). Set once the
/// job's ranks are known, before any store is made.
pub fn set_clock(rank: usize, ranks: usize, offset_ns: i64, error_ns: u64, origin_ns: u64) {
    ORIGIN.store(origin_ns, Ordering::Relaxed);
    RANK.store(rank as u64, Ordering::Relaxed);
    RANKS.store(ranks.max(1) as u64, Ordering::Relaxed);
    OFFSET.store(offset_ns as u64, Ordering::Relaxed);
    CLOCK_ERROR.store(error_ns, Ordering::Relaxed);
}

/// This process's rank, as the transport set it (0 without one).
pub fn rank() -> usize {
    RANK.load(Ordering::Relaxed) as usize
}

/// The number of ranks of the job, as the transport set it (1 without one).
pub fn ranks() -> usize {
    RANKS.load(Ordering::Relaxed) as usize
}

/// Whether events are being recorded (to a file or the flight recorder): what a caller
/// asks before building an event.
#[inline]
pub fn recording() -> bool {
    ON.load(Ordering::Relaxed) || FLIGHT.load(Ordering::Relaxed)
}

/// Whether the timeline writes a file.
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns the flight recorder on (a `dist_sync` store does, when it is made).
pub fn flight_on() {
    FLIGHT.store(true, Ordering::Relaxed);
}

/// The file rank `rank` of a job of `ranks` writes for the timeline at `path`: `path`
/// itself for a job of one, else `path` with `.rankR` before its extension.
pub fn rank_path(path: &Path, rank: usize, ranks: usize) -> PathBuf {
    if ranks <= 1 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

/// Starts writing the timeline to `path` (this rank's file of it: [`rank_path`]),
/// replacing a timeline being written (which is closed first).
///
/// # Errors
/// [`Error::InvalidArgument`] when the file is something other than a regular file (a
/// FIFO, a device, a folder) or `KVSTORE_TIMELINE_MAX_BYTES` is not a number of bytes;
/// [`Error::Io`] when the file cannot be made, or the one being written closed.
pub fn start(path: impl AsRef<Path>) -> Result<()> {
    start_as(path.as_ref(), false)
}

fn start_as(path: &Path, from_env: bool) -> Result<()> {
    let ranks = RANKS.load(Ordering::Relaxed) as usize;
    let file = rank_path(path, rank(), ranks);
    let max = crate::settings::timeline_max_bytes()?;
    if std::fs::metadata(&file).is_ok_and(|m| !m.is_file()) {
        return Err(Error::invalid_argument(format!("the timeline's file {} is not a regular file", file.display())));
    }
    // The file being written is closed first (its last lines would land in a new file
    // of the same path), and the new one made outside the lock: making a file may
    // take a while, and every recording thread takes the lock.
    ON.store(false, Ordering::Relaxed);
    let old = sink().out.take();
    old.map(|o| close(o, "")).transpose()?;
    *resume() = None;
    let threads = sink().threads.clone();
    let opened = crate::files::create_own(&file);
    let opened =
        opened.map_err(|e| Error::Io { context: format!("the timeline's file {}", file.display()), source: e })?;
    let mut out = Output::open(path.to_path_buf(), file, opened, max, &threads)?;
    out.from_env = from_env;
    install(out, &threads)
}

/// Makes `out` the file events go to; names the threads that `named` (the threads
/// known when it was made) lacks.
fn install(mut out: Output, named: &[(u64, String)]) -> Result<()> {
    let mut sink = sink();
    for (id, name) in sink.threads.iter().filter(|t| !named.contains(t)) {
        let mut meta = String::new();
        json_meta(&mut meta, rank(), *id, "thread_name", name);
        out.event(&meta)?;
    }
    let old = sink.out.replace(out);
    STARTED.store(now(), Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
    drop(sink);
    old.map(|o| close(o, "")).transpose()?;
    Ok(())
}

fn resume() -> std::sync::MutexGuard<'static, Option<Resume>> {
    RESUME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The path the timeline being written was started with (`None` when it is off).
pub fn path() -> Option<PathBuf> {
    sink().out.as_ref().map(|o| o.base.clone())
}

/// Starts the timeline when `KVSTORE_TIMELINE` names a file (a store does when it is
/// made): the first store made reads it; when the last store was dropped, which closed
/// the file, the next store made writes on in it.
///
/// # Errors
/// As [`start`].
pub fn start_from_env() -> Result<()> {
    if !ENV_READ.swap(true, Ordering::Relaxed) {
        return match crate::settings::timeline_path() {
            Some(path) if !is_on() => start_as(Path::new(&path), true),
            _ => Ok(()),
        };
    }
    let Some(r) = resume().take() else { return Ok(()) };
    if is_on() {
        return Ok(());
    }
    let io = |e| Error::Io { context: format!("the timeline's file {}", r.path.display()), source: e };
    let file = crate::files::open_own(&r.path).map_err(io)?;
    file.set_len(r.at).map_err(io)?;
    let mut writer = BufWriter::new(file);
    std::io::Seek::seek(&mut writer, std::io::SeekFrom::End(0)).map_err(io)?;
    let out = Output {
        base: r.base,
        path: r.path,
        writer,
        written: r.at,
        max: r.max,
        truncated: r.truncated,
        from_env: true,
    };
    // (Every thread known was named in the file already, or when it was made since.)
    let named = sink().threads.clone();
    install(out, &named)
}

/// Stops the timeline and closes its file; returns the file's path (`None` when it
/// was off).
///
/// # Errors
/// [`Error::Io`] when the file cannot be written.
pub fn stop() -> Result<Option<PathBuf>> {
    ON.store(false, Ordering::Relaxed);
    *resume() = None;
    let out = sink().out.take();
    match out {
        Some(out) => {
            let path = out.path.clone();
            close(out, "")?;
            Ok(Some(path))
        }
        None => Ok(None),
    }
}

/// Closes the timeline's file at the end of a program of one process (the bindings'
/// exit hooks call it; a `dist_sync` job's files are closed and merged by its
/// transport's finalize). Returns the file's path, if one was written.
///
/// # Errors
/// As [`stop`].
pub fn close_at_exit() -> Result<Option<PathBuf>> {
    if ranks() > 1 {
        return Ok(None);
    }
    stop()
}

/// A store's hold on the timeline: when a program of one process drops its last store,
/// the file is closed, whole; a file of `KVSTORE_TIMELINE` is written on in by the next
/// store made ([`start_from_env`]).
pub struct Hold(());

impl Hold {
    /// A new store's hold.
    pub fn new() -> Hold {
        STORES.fetch_add(1, Ordering::Relaxed);
        Hold(())
    }
}

impl Default for Hold {
    fn default() -> Self {
        Hold::new()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if STORES.fetch_sub(1, Ordering::AcqRel) != 1 || ranks() > 1 {
            return;
        }
        let mut sink = sink();
        let Some(mut out) = sink.out.take() else { return };
        ON.store(false, Ordering::Relaxed);
        drop(sink);
        let _ = out.writer.flush();
        let resumed = out.from_env.then(|| Resume {
            base: out.base.clone(),
            path: out.path.clone(),
            at: out.written,
            max: out.max,
            truncated: out.truncated,
        });
        if close(out, "").is_ok() {
            *resume() = resumed;
        }
    }
}

/// Ends a file: the last line, then the metadata (`extra`: more of its fields, each
/// after a comma).
fn close(mut out: Output, extra: &str) -> Result<()> {
    let other = format!(
        "],\"otherData\":{{\"rank\":{},\"ranks\":{},\"clock\":\"aligned to rank 0's\",\"ts_origin_unix_ns\":{},\
         \"clock_error_ns\":{}{extra}}}}}",
        rank(),
        RANKS.load(Ordering::Relaxed),
        origin(),
        CLOCK_ERROR.load(Ordering::Relaxed)
    );
    // The last event has no comma after it: the process's sort index.
    let mut last = String::new();
    let _ = write!(
        last,
        "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"tid\":0,\"args\":{{\"sort_index\":{}}}}}",
        rank(),
        rank()
    );
    let io = |e| Error::Io { context: format!("the timeline's file {}", out.path.display()), source: e };
    out.writer.write_all(last.as_bytes()).map_err(io)?;
    out.writer.write_all(b"\n").map_err(io)?;
    out.writer.write_all(other.as_bytes()).map_err(io)?;
    out.writer.write_all(b"\n").map_err(io)?;
    out.writer.flush().map_err(io)
}

impl Output {
    /// A new file of this rank, `opened` at `path` (of the timeline started at `base`),
    /// its first lines written: the process's name and the names of `threads`.
    fn open(base: PathBuf, path: PathBuf, opened: File, max: u64, threads: &[(u64, String)]) -> Result<Self> {
        let mut out =
            Output { base, path, writer: BufWriter::new(opened), written: 0, max, truncated: false, from_env: false };
        out.line("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        let pid = rank();
        let mut meta = String::new();
        json_meta(&mut meta, pid, 0, "process_name", &format!("rank {pid}"));
        out.event(&meta)?;
        for (tid, name) in threads {
            meta.clear();
            json_meta(&mut meta, pid, *tid, "thread_name", name);
            out.event(&meta)?;
        }
        Ok(out)
    }

    fn line(&mut self, s: &str) -> Result<()> {
        self.written += s.len() as u64 + 1;
        let path = &self.path;
        let io = |e| Error::Io { context: format!("the timeline's file {}", path.display()), source: e };
        self.writer.write_all(s.as_bytes()).map_err(io)?;
        self.writer.write_all(b"\n").map_err(io)
    }

    /// One event's line (each ends in a comma: the file's last is the closing one).
    fn event(&mut self, json: &str) -> Result<()> {
        self.events(&[json])
    }

    /// Events that go together, each on its line: all of them, or, where they would not
    /// all fit under the bound, none (an async span's begin is never left without its
    /// end: a viewer would show it open to the end of the trace).
    fn events(&mut self, lines: &[&str]) -> Result<()> {
        if self.truncated {
            return Ok(());
        }
        let len: u64 = lines.iter().map(|l| l.len() as u64 + 2).sum();
        if self.written + len > self.max {
            self.truncated = true;
            let mut s = String::new();
            let _ = write!(
                s,
                "{{\"ph\":\"i\",\"name\":\"truncated\",\"s\":\"p\",\"pid\":{},\"tid\":0,\"ts\":{},\"args\":{{\"max_bytes\":{}}}}},",
                rank(),
                micros(align(now()).saturating_sub(origin())),
                self.max
            );
            return self.line(&s);
        }
        let mut s = String::new();
        for json in lines {
            s.clear();
            s.push_str(json);
            s.push(',');
            self.line(&s)?;
        }
        Ok(())
    }
}

/// This thread's row in the trace (named the first time it records).
fn thread_id() -> u64 {
    THREAD.with(|Row(t)| {
        if t.get() == 0 {
            let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            t.set(id);
            let name = std::thread::current().name().map_or_else(|| format!("thread {id}"), str::to_string);
            let mut sink = sink();
            if let Some(out) = sink.out.as_mut() {
                let mut meta = String::new();
                json_meta(&mut meta, rank(), id, "thread_name", &name);
                let _ = out.event(&meta);
            }
            sink.threads.push((id, name));
        }
        t.get()
    })
}

/// A value of an event's `args`.
#[derive(Clone, Debug)]
pub enum Arg {
    /// A whole number.
    U(u64),
    /// A signed number.
    I(i64),
    /// A number.
    F(f64),
    /// Text.
    S(Cow<'static, str>),
    /// Sizes by name, written as a JSON object (a fused call's `key_bytes`: each of its
    /// keys and its bytes).
    Sizes(Vec<(String, u64)>),
}

/// An event's kind (the trace format's `ph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Complete,
    Instant,
    FlowStart,
    FlowEnd,
    AsyncBegin,
    AsyncEnd,
    Counter,
}

/// One event, as recorded.
#[derive(Clone, Debug)]
struct Event {
    kind: Kind,
    name: Cow<'static, str>,
    cat: &'static str,
    /// On rank 0's clock, ns.
    ts: u64,
    dur: u64,
    tid: u64,
    id: u64,
    args: Vec<(&'static str, Arg)>,
}

fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

fn json_meta(out: &mut String, pid: usize, tid: u64, what: &str, name: &str) {
    let _ = write!(out, "{{\"ph\":\"M\",\"name\":\"{what}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":");
    json_str(out, name);
    out.push_str("}}");
}

impl Event {
    fn json(&self, pid: usize) -> String {
        let mut s = String::with_capacity(160);
        let ph = match self.kind {
            Kind::Complete => "X",
            Kind::Instant => "i",
            Kind::FlowStart => "s",
            Kind::FlowEnd => "f",
            Kind::AsyncBegin => "b",
            Kind::AsyncEnd => "e",
            Kind::Counter => "C",
        };
        let _ = write!(s, "{{\"ph\":\"{ph}\",\"name\":");
        json_str(&mut s, &self.name);
        let ts = micros(self.ts.saturating_sub(origin()));
        let _ = write!(s, ",\"cat\":\"{}\",\"pid\":{pid},\"tid\":{},\"ts\":{ts}", self.cat, self.tid);
        match self.kind {
            Kind::Complete => {
                let _ = write!(s, ",\"dur\":{}", micros(self.dur));
            }
            Kind::Instant => s.push_str(",\"s\":\"t\""),
            Kind::FlowStart | Kind::AsyncBegin | Kind::AsyncEnd => {
                let _ = write!(s, ",\"id\":{}", self.id);
            }
            // Bound to the enclosing slice: the call that ran.
            Kind::FlowEnd => {
                let _ = write!(s, ",\"id\":{},\"bp\":\"e\"", self.id);
            }
            Kind::Counter => {}
        }
        if !self.args.is_empty() {
            s.push_str(",\"args\":{");
            for (i, (k, v)) in self.args.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let _ = write!(s, "\"{k}\":");
                match v {
                    Arg::U(n) => {
                        let _ = write!(s, "{n}");
                    }
                    Arg::I(n) => {
                        let _ = write!(s, "{n}");
                    }
                    Arg::F(x) if x.is_finite() => {
                        let _ = write!(s, "{x}");
                    }
                    Arg::F(_) => s.push_str("null"),
                    Arg::S(t) => json_str(&mut s, t),
                    Arg::Sizes(sizes) => {
                        s.push('{');
                        for (i, (name, n)) in sizes.iter().enumerate() {
                            if i > 0 {
                                s.push(',');
                            }
                            json_str(&mut s, name);
                            let _ = write!(s, ":{n}");
                        }
                        s.push('}');
                    }
                }
            }
            s.push('}');
        }
        s.push('}');
        s
    }
}

/// Records events that go together (an async span's begin and end: both or neither).
fn record<const N: usize>(events: [Event; N]) {
    // Written out before the lock is taken: threads take turns only to append them.
    let lines = events.each_ref().map(|ev| is_on().then(|| ev.json(rank())));
    let mut sink = sink();
    if let Some(out) = sink.out.as_mut() {
        let lines: Vec<&str> = lines.iter().flatten().map(String::as_str).collect();
        let _ = out.events(&lines);
    }
    if FLIGHT.load(Ordering::Relaxed) {
        for ev in events {
            if sink.flight.len() == FLIGHT_EVENTS {
                sink.flight.pop_front();
            }
            sink.flight.push_back(ev);
        }
    }
}

/// Records an event of `kind` at `at` (a reading of [`now`]) on this thread.
fn add(
    kind: Kind,
    name: Cow<'static, str>,
    cat: &'static str,
    at: u64,
    dur: u64,
    id: u64,
    args: Vec<(&'static str, Arg)>,
) {
    let tid = thread_id();
    record([Event { kind, name, cat, ts: align(at), dur, tid, id, args }]);
}

/// Records a complete event `name` (category `cat`) from `start` to `end` ([`now`]'s
/// readings) on this thread, with `args`. Nothing when not [`recording`].
pub fn complete(
    name: impl Into<Cow<'static, str>>,
    cat: &'static str,
    start: u64,
    end: u64,
    args: Vec<(&'static str, Arg)>,
) {
    if recording() {
        // (A phase that began before the file was started: from then on.)
        let start = if is_on() { start.max(STARTED.load(Ordering::Relaxed)) } else { start };
        add(Kind::Complete, name.into(), cat, start, end.saturating_sub(start), 0, args);
    }
}

/// Records an instant event `name` at `at` ([`now`]'s reading) on this thread.
pub fn instant(name: impl Into<Cow<'static, str>>, cat: &'static str, at: u64, args: Vec<(&'static str, Arg)>) {
    if recording() {
        add(Kind::Instant, name.into(), cat, at, 0, 0, args);
    }
}

/// Records counter `name`'s `values` at `at`.
pub fn counter(name: &'static str, at: u64, values: Vec<(&'static str, Arg)>) {
    if recording() {
        add(Kind::Counter, name.into(), "wire", at, 0, 0, values);
    }
}

/// Starts a flow here (a non-blocking call submitted): its id, for [`flow_end`]
/// (0 when not recording).
pub fn flow_start(name: &'static str, at: u64) -> u64 {
    if !recording() {
        return 0;
    }
    // Unique across the ranks of a merged trace, whose ids a viewer takes as global.
    let id = (rank() as u64) << 40 | NEXT_FLOW.fetch_add(1, Ordering::Relaxed);
    add(Kind::FlowStart, name.into(), "flow", at, 0, id, Vec::new());
    id
}

/// Ends flow `id` here (where the call runs).
pub fn flow_end(name: &'static str, id: u64, at: u64) {
    if id != 0 && recording() {
        add(Kind::FlowEnd, name.into(), "flow", at, 0, id, Vec::new());
    }
}

/// Records `name` from `start` to `end` as an async span of its own (`"ph":"b"`/`"e"`,
/// matched by `id`: nonzero), not a slice of this thread: a call's wait in a queue, which
/// overlaps the calls that run on this thread meanwhile.
pub fn span_apart(name: &'static str, start: u64, end: u64, id: u64, args: Vec<(&'static str, Arg)>) {
    if id != 0 && recording() {
        let tid = thread_id();
        let event = |kind, at, args| Event { kind, name: name.into(), cat: name, ts: align(at), dur: 0, tid, id, args };
        record([event(Kind::AsyncBegin, start, args), event(Kind::AsyncEnd, end, Vec::new())]);
    }
}

/// Writes this rank's last events where a user finds them after a stall or a desync:
/// with the timeline on, its file (which holds every event, the last ones too) is
/// closed when the job `ends`, else written out as far as it goes and kept on (a
/// desynced call fails, and the job may go on); with it off, the flight recorder's
/// events (the last [`FLIGHT_EVENTS`]) are written as a trace of their own, to this
/// rank's file of `KVSTORE_TIMELINE`'s path when it is set, else to
/// `kvstore-flight-RANK.json` in the working directory. Returns the path.
///
/// # Errors
/// [`Error::Io`] when the file cannot be written.
pub fn write_flight(ends: bool) -> Result<PathBuf> {
    if ends {
        if let Some(path) = stop()? {
            return Ok(path);
        }
    } else if let Some(out) = sink().out.as_mut() {
        let io = |e| Error::Io { context: format!("the timeline's file {}", out.path.display()), source: e };
        out.writer.flush().map_err(io)?;
        return Ok(out.path.clone());
    }
    let ranks = RANKS.load(Ordering::Relaxed) as usize;
    let path = match crate::settings::timeline_path() {
        Some(p) => rank_path(Path::new(&p), rank(), ranks),
        _ => PathBuf::from(format!("kvstore-flight-{}.json", rank())),
    };
    let (events, threads) = {
        let sink = sink();
        (sink.flight.iter().cloned().collect::<Vec<_>>(), sink.threads.clone())
    };
    // Written whole to a file of its own made afresh, then renamed to `path` (a name
    // others can guess: a link there is replaced, never written through, and a file or
    // link of another user's is left as it is, the record refused).
    let temp = crate::files::temp_beside(&path);
    let io = |e| Error::Io { context: format!("the flight record {}", path.display()), source: e };
    let written = crate::files::create_new(&temp).map_err(io).and_then(|file| {
        let mut out = Output::open(path.clone(), temp.clone(), file, u64::MAX, &threads)?;
        for ev in &events {
            out.event(&ev.json(rank()))?;
        }
        close(out, &format!(",\"flight_recorder\":true,\"events\":{}", events.len()))?;
        crate::files::rename_over_own(&temp, &path).map_err(io)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map(|()| path)
}

/// For an error that ends the job (a stall: `ends`) or a call (a desync):
/// [`write_flight`], said as the end of the error's message (`; this rank's last
/// events: PATH`).
pub fn flight_note(ends: bool) -> String {
    match write_flight(ends) {
        Ok(path) => format!("; this rank's last events: {}", std::path::absolute(&path).unwrap_or(path).display()),
        Err(e) => format!("; this rank's last events could not be written: {e}"),
    }
}

/// Merges the files of every rank (`parts`, in rank order, each one rank's whole file)
/// into one trace at `path` (rank 0 does, at the end of a job), reading them line by
/// line: a merge holds no file in memory.
///
/// # Errors
/// [`Error::Io`] when a part cannot be read or `path` written;
/// [`Error::InvalidArgument`] when a part is not such a file.
pub fn merge(path: &Path, parts: &[PathBuf]) -> Result<()> {
    // Written beside `path` and renamed over it once whole: a merge that fails leaves
    // no half-written trace.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.{}.merging", std::process::id()));
    let merged = merge_into(&temp, parts).and_then(|()| {
        std::fs::rename(&temp, path)
            .map_err(|e| Error::Io { context: format!("the merged timeline {}", path.display()), source: e })
    });
    if merged.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    merged
}

fn merge_into(path: &Path, parts: &[PathBuf]) -> Result<()> {
    let io = |e| Error::Io { context: format!("the merged timeline {}", path.display()), source: e };
    let mut w = BufWriter::new(crate::files::create_new(path).map_err(io)?);
    w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n").map_err(io)?;
    let mut error = 0u64;
    let mut first = true;
    for (rank, part) in parts.iter().enumerate() {
        let read = |e| Error::Io { context: format!("rank {rank}'s timeline {}", part.display()), source: e };
        // Line by line: nothing of a part is held but its current line.
        let mut doc_error = None;
        for line in std::io::BufReader::new(File::open(part).map_err(read)?).split(b'\n') {
            let line = line.map_err(read)?;
            if !line.starts_with(b"{\"ph\"") {
                doc_error = doc_error.or_else(|| clock_error(&line));
                continue;
            }
            let line = line.strip_suffix(b",").unwrap_or(&line);
            if !first {
                w.write_all(b",\n").map_err(io)?;
            }
            first = false;
            w.write_all(line).map_err(io)?;
        }
        let Some(e) = doc_error else {
            return Err(Error::invalid_argument(format!("rank {rank}'s timeline is not a whole timeline file")));
        };
        error = error.max(e);
    }
    let other = format!(
        "\n],\"otherData\":{{\"ranks\":{},\"clock\":\"every rank's aligned to rank 0's\",\"ts_origin_unix_ns\":{},\
         \"clock_error_ns\":{error}}}}}\n",
        parts.len(),
        origin()
    );
    w.write_all(other.as_bytes()).map_err(io)?;
    w.flush().map_err(io)
}

/// The `clock_error_ns` of a file's last line (its `otherData`), if `line` is that.
fn clock_error(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?;
    let (_, rest) = text.split_once("\"clock_error_ns\":")?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// How many times the median of the other workers' [`RankStats::held_up_s`] a worker
/// must have held the others up to stand out as the slowest ([`Slowest::stands_out`]).
pub const STANDS_OUT: f64 = 2.0;

/// The worker that held the others up longest at the collectives
/// ([`Stats::slowest`](crate::Stats::slowest)), with its figures both ways: the time it held them up, and how often it came last
/// and how late it was on average.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slowest {
    /// Its arrivals (the lower rank of a tie).
    pub rank: RankStats,
    /// The median of the other workers' [`RankStats::held_up_s`].
    pub others_s: f64,
    /// The collectives counted.
    pub collectives: u64,
    /// Whether it stands out from the noise: it held the others up more than
    /// [`STANDS_OUT`] times [`Slowest::others_s`], and more than [`LATE_MARGIN`] longer.
    /// In a balanced job the worker that comes last changes from one collective to the
    /// next, each by little, and none stands out.
    pub stands_out: bool,
}

impl Slowest {
    /// The worker that held the others up longest among `ranks`, over `collectives`;
    /// `None` before any collective.
    pub fn of(ranks: &[RankStats], collectives: u64) -> Option<Slowest> {
        if collectives == 0 {
            return None;
        }
        let top = ranks.iter().copied().reduce(|a, b| if b.held_up_s > a.held_up_s { b } else { a })?;
        let mut others: Vec<f64> = ranks.iter().filter(|r| r.rank != top.rank).map(|r| r.held_up_s).collect();
        others.sort_by(f64::total_cmp);
        let n = others.len();
        let others_s = match n {
            0 => 0.0,
            n if n % 2 == 1 => others[n / 2],
            n => (others[n / 2 - 1] + others[n / 2]) / 2.0,
        };
        let stands_out = top.held_up_s > STANDS_OUT * others_s && top.held_up_s - others_s > LATE_MARGIN.as_secs_f64();
        Some(Slowest { rank: top, others_s, collectives, stands_out })
    }
}

/// `slowest rank: R (held the others up X ms, the others Y ms (median); last at N of M
/// collectives, Z ms late on average)`, or, when it does not stand out, `slowest rank:
/// none stands out (rank R held the others up X ms, ...)`: the line rank 0 logs and
/// `python -m kvstore.timeline` prints.
impl fmt::Display for Slowest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.rank;
        let figures = format!(
            "held the others up {:.1} ms, the others {:.1} ms (median); last at {} of {} collectives, {:.1} ms late on average",
            r.held_up_s * 1e3,
            self.others_s * 1e3,
            r.last,
            self.collectives,
            r.mean_lateness_s * 1e3
        );
        match self.stands_out {
            true => write!(f, "slowest rank: {} ({figures})", r.rank),
            false => write!(f, "slowest rank: none stands out (rank {} {figures})", r.rank),
        }
    }
}
