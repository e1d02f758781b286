//! A store's counters ([`KVStore::stats`]): calls and keys by kind, bytes pushed,
//! pulled and on the wire, time in each phase of a call, and, under `dist_sync`, how
//! long each worker held the others up at the collectives, at how many it arrived
//! last, and how late (the slowest worker: [`Stats::slowest`]). Counted per call, never per
//! key (a call's bytes are added up from the arrays it took anyway), with relaxed
//! atomics; each phase is also a complete event of the timeline when it is on
//! (`timeline.rs`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::collective::Collective;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;
use crate::timeline::{self, Arg, Slowest};

use super::forms::Run;

/// What a store did since it was made or its counters were last reset
/// ([`KVStore::stats`](crate::KVStore::stats), [`KVStore::reset_stats`](crate::KVStore::reset_stats)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Calls and keys by kind of call: `init`, `push`, `pull`, `pushpull`,
    /// `broadcast`, `push_row_sparse`, `pull_row_sparse` (each blocking or not).
    pub calls: BTreeMap<&'static str, CallCount>,
    /// Bytes of the values pushed (every value, before any sum).
    pub bytes_pushed: u64,
    /// Bytes of the outs pulled into.
    pub bytes_pulled: u64,
    /// Bytes this worker sent to the others and received from them (`dist_sync`): an
    /// allreduce of S bytes over n workers moves 2(n−1)/n·S each way, whatever path it
    /// takes; a compressed push, its codes.
    pub wire_bytes_sent: u64,
    /// See [`Stats::wire_bytes_sent`].
    pub wire_bytes_received: u64,
    /// Time in each phase of the calls, by name: `queued` (a non-blocking call waiting
    /// to run), `inputs` (a call waiting for other calls' writes to its arrays: a
    /// non-blocking pull's into the values it pushes, say), `sum` (values summed here), `wire` (the sum across the workers),
    /// `update` (the updater or optimizer), `copy` (values copied into outs), `ranks`
    /// (waiting at a collective for the other workers). Phases of calls that run at
    /// once on several threads add up.
    pub phases: BTreeMap<&'static str, Duration>,
    /// Under `dist_sync` with the workers' calls compared (the default): the
    /// collectives whose arrivals were compared.
    pub collectives: u64,
    /// Under `dist_sync`: each worker, in rank order (the same on every worker).
    pub ranks: Vec<RankStats>,
    /// The bytes the store holds on this worker now (not counters: [`KVStore::reset_stats`]
    /// leaves them).
    ///
    /// [`KVStore::reset_stats`]: crate::KVStore::reset_stats
    pub held: HeldBytes,
}

/// The bytes a store holds on this worker ([`Stats::held`]), by what they are for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldBytes {
    /// The keys' values, and the copies a custom updater works on.
    pub values: u64,
    /// The optimizer's state: its arrays and the f32 master copies of f16/bf16 weights
    /// (under `dist_sync` with owners, this worker's parts only; under `dist_async`,
    /// those of the parts this worker owns).
    pub state: u64,
    /// The buffers pushes are summed into (with owners, this worker's parts of the
    /// sums, and the whole local sum of a key pushed with several values at once), and
    /// gradient compression's residuals.
    pub buffers: u64,
}

/// How many calls of one kind a store made, and their keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCount {
    /// Calls.
    pub calls: u64,
    /// Keys, summed over the calls (a key given twice counts twice).
    pub keys: u64,
}

/// One worker's arrivals at the collectives of a `dist_sync` store.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankStats {
    /// The worker's rank.
    pub rank: usize,
    /// How long it held the others up, in seconds, in all: at each collective where it
    /// arrived last, its arrival minus the next-latest one (the time the others waited
    /// for it alone; nothing at a tie). What names the slowest worker
    /// ([`Stats::slowest`]).
    pub held_up_s: f64,
    /// At how many of [`Stats::collectives`] it arrived last, more than [`LATE_MARGIN`]
    /// after the median of the others (a worker within it is on time: the collectives'
    /// own work is uneven, worker 0's sum in shared memory takes tens of microseconds
    /// more than the others').
    pub last: u64,
    /// Its mean lateness, in seconds: its arrival minus the median of the others', on
    /// rank 0's clock (negative when it arrives early).
    pub mean_lateness_s: f64,
}

/// How much later than the median of the others a worker must arrive at a collective
/// to count as its last ([`RankStats::last`]): 1 ms. Also how much longer than the
/// median of the others' a worker must have held the others up, in all, to stand out
/// as the slowest ([`Slowest::stands_out`](crate::timeline::Slowest::stands_out)).
pub const LATE_MARGIN: Duration = Duration::from_millis(1);

impl Stats {
    /// The kinds of call counted, in this order ([`Stats::calls`]' keys).
    pub const KINDS: [&'static str; 7] =
        ["init", "push", "pull", "pushpull", "broadcast", "push_row_sparse", "pull_row_sparse"];

    /// The phases timed, in this order ([`Stats::phases`]' keys).
    pub const PHASES: [&'static str; 7] = ["queued", "inputs", "sum", "wire", "update", "copy", "ranks"];

    /// Under `dist_sync`: the worker that held the others up longest at the collectives
    /// ([`RankStats::held_up_s`]), and whether it stands out ([`Slowest::stands_out`]);
    /// `None` before any collective.
    pub fn slowest(&self) -> Option<Slowest> {
        Slowest::of(&self.ranks, self.collectives)
    }
}

const OPS: [&str; 7] = Stats::KINDS;

/// A phase of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Queued,
    Inputs,
    Sum,
    Wire,
    Update,
    Copy,
    Ranks,
}

const PHASES: [&str; 7] = Stats::PHASES;

impl Phase {
    fn name(self) -> &'static str {
        PHASES[self as usize]
    }
}

/// A store's counters.
#[derive(Default)]
pub(super) struct Counters {
    calls: [AtomicU64; OPS.len()],
    keys: [AtomicU64; OPS.len()],
    pushed: AtomicU64,
    pulled: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    phases: [AtomicU64; PHASES.len()],
    ranks: Mutex<Arrivals>,
}

/// Each worker's arrivals so far: how long it held the others up (ns), at how many
/// collectives it came last, and the sum of its lateness (ns).
#[derive(Default)]
struct Arrivals {
    collectives: u64,
    held_ns: Vec<u64>,
    last: Vec<u64>,
    late_ns: Vec<i128>,
}

impl Arrivals {
    /// Counts one collective: `late[r]`, worker r's lateness; `last`, the worker that
    /// arrived last, if any did; `held`, the worker that arrived last and how long it
    /// held the others up (see [`lateness`]).
    fn add(&mut self, late: &[i64], last: Option<usize>, held: Option<(usize, u64)>) {
        let n = late.len();
        if self.last.len() != n {
            self.held_ns = vec![0; n];
            self.last = vec![0; n];
            self.late_ns = vec![0; n];
        }
        self.collectives += 1;
        if let Some(last) = last {
            self.last[last] += 1;
        }
        if let Some((r, ns)) = held {
            self.held_ns[r] += ns;
        }
        for (r, l) in late.iter().enumerate() {
            self.late_ns[r] += i128::from(*l);
        }
    }

    /// Each worker's figures.
    fn ranks(&self) -> Vec<RankStats> {
        (0..self.last.len())
            .map(|r| RankStats {
                rank: r,
                held_up_s: self.held_ns[r] as f64 / 1e9,
                last: self.last[r],
                mean_lateness_s: match self.collectives {
                    0 => 0.0,
                    n => self.late_ns[r] as f64 / n as f64 / 1e9,
                },
            })
            .collect()
    }
}

/// The bytes of `arrays`.
pub(super) fn bytes_of<'x>(arrays: impl IntoIterator<Item = &'x NDArray>) -> u64 {
    arrays.into_iter().map(|a| (a.size() * a.dtype().size()) as u64).sum()
}

impl Counters {
    /// Counts a call of `op` on `keys` keys.
    pub(super) fn call(&self, op: &str, keys: usize) {
        if let Some(i) = OPS.iter().position(|o| *o == op) {
            self.calls[i].fetch_add(1, Ordering::Relaxed);
            self.keys[i].fetch_add(keys as u64, Ordering::Relaxed);
        }
    }

    /// Counts the bytes a call that passed its checks pushes and pulls (and, while the
    /// timeline records, gives them to the call's event: [`CALL_BYTES`]).
    pub(super) fn bytes(&self, (pushed, pulled): (u64, u64)) {
        if timeline::recording() {
            CALL_BYTES.with(|b| b.set(b.get() + pushed + pulled));
        }
        if pushed > 0 {
            self.pushed.fetch_add(pushed, Ordering::Relaxed);
        }
        if pulled > 0 {
            self.pulled.fetch_add(pulled, Ordering::Relaxed);
        }
    }

    /// Counts `sent` and `received` bytes on the wire, and records the counter.
    pub(super) fn wire(&self, sent: u64, received: u64) {
        let sent = self.sent.fetch_add(sent, Ordering::Relaxed) + sent;
        let received = self.received.fetch_add(received, Ordering::Relaxed) + received;
        if timeline::recording() {
            timeline::counter(
                "wire bytes",
                timeline::now(),
                vec![("sent", Arg::U(sent)), ("received", Arg::U(received))],
            );
        }
    }

    /// Times `phase` until the returned guard is dropped (and records it).
    pub(super) fn phase(&self, phase: Phase) -> Timed<'_> {
        Timed { counters: self, phase, start: timeline::now(), args: Vec::new() }
    }

    /// Until the returned guard is dropped: the time this thread waits for other calls'
    /// writes to the arrays of the call it makes, counted as the `inputs` phase when
    /// dropped (timed where it waits, `ndarray/pending.rs`).
    pub(super) fn inputs(&self) -> Inputs<'_> {
        crate::ndarray::take_waited();
        Inputs(self)
    }

    /// Adds `ns` to `phase` (measured elsewhere: from a submission to a run).
    pub(super) fn add(&self, phase: Phase, ns: u64) {
        self.phases[phase as usize].fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts one collective's arrivals (`at[r]`: worker r's, on rank 0's clock).
    /// Counts one collective's arrivals (`at[r]`: worker r's, on rank 0's clock):
    /// returns each worker's lateness and the worker that arrived last, if any did.
    pub(super) fn arrivals(&self, at: &[u64]) -> Lateness {
        let l = Lateness::of(at);
        self.ranks.lock().add(&l.late_ns, l.last, l.held);
        JOB.lock().add(&l.late_ns, l.last, l.held);
        l
    }

    pub(super) fn snapshot(&self) -> Stats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let calls = OPS
            .iter()
            .enumerate()
            .filter(|(i, _)| load(&self.calls[*i]) > 0)
            .map(|(i, op)| (*op, CallCount { calls: load(&self.calls[i]), keys: load(&self.keys[i]) }))
            .collect();
        let phases = PHASES.iter().zip(&self.phases).map(|(p, ns)| (*p, Duration::from_nanos(load(ns)))).collect();
        let a = self.ranks.lock();
        let ranks = a.ranks();
        Stats {
            calls,
            bytes_pushed: load(&self.pushed),
            bytes_pulled: load(&self.pulled),
            wire_bytes_sent: load(&self.sent),
            wire_bytes_received: load(&self.received),
            phases,
            collectives: a.collectives,
            ranks,
            held: HeldBytes::default(),
        }
    }

    pub(super) fn reset(&self) {
        for a in self.calls.iter().chain(&self.keys).chain(&self.phases) {
            a.store(0, Ordering::Relaxed);
        }
        for a in [&self.pushed, &self.pulled, &self.sent, &self.received] {
            a.store(0, Ordering::Relaxed);
        }
        *self.ranks.lock() = Arrivals::default();
    }
}

/// One collective's arrivals as the store reads them: what each worker's figures
/// ([`RankStats`]) add up, and what `python -m kvstore.timeline` reads a trace's
/// arrivals with, so that a job's log and the summary of its trace name the slowest
/// worker by one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lateness {
    /// Each worker's lateness (ns): its arrival minus the median of the others' (the
    /// mean of the middle two, for an even number of others).
    pub late_ns: Vec<i64>,
    /// The worker that arrived last (the lower rank of a tie), when it did so by more
    /// than [`LATE_MARGIN`] after the median of the others.
    pub last: Option<usize>,
    /// The worker that arrived last (the higher rank of a tie, which held the others up
    /// for nothing) and how long it held the others up (ns): its arrival minus the
    /// next-latest one. `None` for a single worker.
    pub held: Option<(usize, u64)>,
}

impl Lateness {
    /// Of the arrivals `at` (`at[r]`: worker r's, in ns, on one clock).
    pub fn of(at: &[u64]) -> Lateness {
        let (late_ns, last) = lateness(at);
        Lateness { late_ns, last, held: held_up(at) }
    }
}

/// Each worker's lateness at one collective (ns): its arrival minus the median of the
/// others' (the mean of the middle two, for an even number of others).
/// And the worker that arrived last (the lower rank of a tie), when it did so by more
/// than [`LATE_MARGIN`]. One sort of the arrivals, whatever the number of workers.
fn lateness(at: &[u64]) -> (Vec<i64>, Option<usize>) {
    let n = at.len();
    // The workers in order of arrival (ties by rank); `place[r]`, worker r's place there.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&r| (at[r], r));
    let mut place = vec![0; n];
    for (p, &r) in order.iter().enumerate() {
        place[r] = p;
    }
    // The others' `k`th arrival, for worker r: the order without r's place.
    let other = |r: usize, k: usize| i128::from(at[order[if k < place[r] { k } else { k + 1 }]]);
    let m = n.saturating_sub(1);
    let late: Vec<i64> = (0..n)
        .map(|r| {
            let median = match m {
                0 => return 0,
                m if m % 2 == 1 => other(r, m / 2),
                m => (other(r, m / 2 - 1) + other(r, m / 2)) / 2,
            };
            (i128::from(at[r]) - median) as i64
        })
        .collect();
    let last =
        (0..n).max_by_key(|&r| (at[r], std::cmp::Reverse(r))).filter(|&r| late[r] > LATE_MARGIN.as_nanos() as i64);
    (late, last)
}

/// The worker that arrived last at one collective (the higher rank of a tie, which
/// held the others up for nothing) and how long it held the others up (ns): its
/// arrival minus the next-latest one. `None` for a single worker.
fn held_up(at: &[u64]) -> Option<(usize, u64)> {
    let mut latest: Option<usize> = None;
    let mut next = 0;
    for (r, &t) in at.iter().enumerate() {
        match latest {
            Some(l) if t < at[l] => next = next.max(t),
            Some(l) => {
                next = at[l];
                latest = Some(r);
            }
            None => latest = Some(r),
        }
    }
    let latest = latest.filter(|_| at.len() > 1)?;
    Some((latest, at[latest] - next))
}

thread_local! {
    /// The bytes of the call this thread runs, as its runner counted them from its keys'
    /// entries ([`Counters::bytes`]): its event's `bytes`, while the timeline records.
    static CALL_BYTES: Cell<u64> = const { Cell::new(0) };
}

/// A call being timed: counted when made, recorded on the timeline when dropped.
pub(super) struct CallSpan {
    op: &'static str,
    start: u64,
    keys: usize,
    key: Option<Key>,
    /// A batch's keys and their bytes (its event's `key_bytes`).
    sizes: Vec<(String, u64)>,
}

impl Counters {
    /// Counts a call of `op` that pushes the runs `push` and pulls into `pull`, and
    /// times it until the returned span is dropped (its bytes are counted by the runner
    /// that runs it, from its keys' entries: [`Counters::bytes`]).
    pub(super) fn begin(&self, op: &'static str, push: &[Run<'_>], pull: &[Run<'_>]) -> CallSpan {
        let key = push.first().or(pull.first()).map(|(k, _)| k);
        self.span(op, push.len().max(pull.len()), key)
    }

    /// Counts a call of `op` on `keys` keys (the first `key`), and times it until the
    /// returned span is dropped.
    pub(super) fn span(&self, op: &'static str, keys: usize, key: Option<&Key>) -> CallSpan {
        self.call(op, keys);
        let recording = timeline::recording();
        let key = key.filter(|_| recording).cloned();
        let start = match recording {
            true => {
                CALL_BYTES.with(|b| b.set(0));
                timeline::now()
            }
            false => 0,
        };
        CallSpan { op, start, keys, key, sizes: Vec::new() }
    }
}

impl CallSpan {
    /// Times a batch of held calls run as one (`run/fused.rs`) from `at` (where its
    /// calls' flows end: inside its event), on `keys` keys in all, whose bytes `sizes`
    /// gives (read only while the timeline records): its calls were counted when made.
    pub(super) fn batch(keys: usize, at: u64, sizes: impl FnOnce() -> Vec<(String, u64)>) -> CallSpan {
        let (start, sizes) = match timeline::recording() {
            true => {
                CALL_BYTES.with(|b| b.set(0));
                (at, sizes())
            }
            false => (0, Vec::new()),
        };
        CallSpan { op: "fused", start, keys, key: None, sizes }
    }

    /// The call's event's args: its keys, its bytes (as its runner counted them) and
    /// its first key; a batch's, each of its keys' bytes instead (what the timeline's
    /// summary shares its time among its keys by).
    fn args(&mut self) -> Vec<(&'static str, Arg)> {
        let bytes = CALL_BYTES.with(Cell::get);
        let mut args = vec![("keys", Arg::U(self.keys as u64)), ("bytes", Arg::U(bytes))];
        if let Some(k) = self.key.take() {
            args.push(("key", Arg::S(k.as_str().to_string().into())));
        }
        if !self.sizes.is_empty() {
            args.push(("key_bytes", Arg::Sizes(std::mem::take(&mut self.sizes))));
        }
        args
    }

    /// When the call was made: read only while the timeline records, unless
    /// [`CallSpan::timed`].
    pub(super) fn start(&self) -> u64 {
        self.start
    }

    /// The span with its start read from the clock even when the timeline is off (a
    /// non-blocking call: its wait in the queue is counted).
    pub(super) fn timed(mut self) -> Self {
        if self.start == 0 {
            self.start = timeline::now();
        }
        self
    }

    /// Ends a non-blocking call's span where it was submitted (a call that runs in a
    /// batch: the batch's event is its run), as [`CallSpan::submitted_at`].
    pub(super) fn submitted(mut self) {
        Self::submitted_at(self.op, self.start);
        // (Its own event is the submission's.)
        self.key = None;
        self.start = u64::MAX;
    }

    /// Records the submission of a non-blocking call of `op` made at `made` (on the
    /// caller's thread, until now): the slice its flow starts in.
    pub(super) fn submitted_at(op: &'static str, made: u64) {
        if timeline::recording() {
            timeline::complete("submit", "submit", made, timeline::now(), vec![("call", Arg::S(op.into()))]);
        }
    }

    /// Times the call from `at` on (where it runs, after its wait in a queue, on this
    /// thread).
    pub(super) fn restart(&mut self, at: u64) {
        self.start = at;
        CALL_BYTES.with(|b| b.set(0));
    }
}

impl Drop for CallSpan {
    fn drop(&mut self) {
        // (Not a call made before the timeline recorded: its start was not read.)
        if timeline::recording() && self.start != 0 && self.start != u64::MAX {
            let args = self.args();
            timeline::complete(self.op, "call", self.start, timeline::now(), args);
        }
    }
}

/// A call's waits for its arrays ([`Counters::inputs`]).
pub(super) struct Inputs<'c>(&'c Counters);

impl Drop for Inputs<'_> {
    fn drop(&mut self) {
        let ns = crate::ndarray::take_waited();
        if ns > 0 {
            self.0.add(Phase::Inputs, ns);
        }
    }
}

/// A phase being timed: counted, and recorded on the timeline, when dropped.
pub(super) struct Timed<'c> {
    counters: &'c Counters,
    phase: Phase,
    start: u64,
    args: Vec<(&'static str, Arg)>,
}

impl Timed<'_> {
    /// Adds `args` to the phase's event.
    pub(super) fn with(mut self, args: impl FnOnce() -> Vec<(&'static str, Arg)>) -> Self {
        if timeline::recording() {
            self.args = args();
        }
        self
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        let end = timeline::now();
        self.counters.add(self.phase, end.saturating_sub(self.start));
        if timeline::recording() {
            timeline::complete(self.phase.name(), "phase", self.start, end, std::mem::take(&mut self.args));
        }
    }
}

/// Stops the timeline on every worker of `group` (each calls it) and merges every
/// worker's file into the timeline's path on worker 0, which also logs the slowest
/// worker when `log` (see [`slowest_rank`]). Returns the file written here: the merged
/// one on worker 0, each worker's own elsewhere; `None` where the timeline was off on
/// every worker.
///
/// # Errors
/// [`Error::Io`] when a file cannot be read or written; the group's errors.
pub(crate) fn finish_timeline(group: &dyn Collective, log: bool) -> Result<Option<PathBuf>> {
    let base = timeline::path();
    let file = timeline::stop()?;
    let len = match &file {
        Some(f) => std::fs::metadata(f).map_err(|e| read_error(f, e))?.len(),
        None => 0,
    };
    let sizes = super::agree::Said::exchange(group, "the timelines' sizes", &len.to_le_bytes())?;
    let lens: Vec<u64> = (0..sizes.len()).map(|r| sizes.word(r, 0)).collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    if longest == 0 || group.size() < 2 {
        return Ok(file);
    }
    // Rank 0 receives the others' files into parts beside the merged one, in pieces
    // of at most `PIECE` bytes a rank: what a rank holds at once is one round's pieces,
    // whatever the size of the files.
    // Where rank 0 writes each other rank's file (none for a rank that wrote none: it
    // had no KVSTORE_TIMELINE, say), and the files it merges.
    let me = group.rank();
    let parts: Vec<Option<PathBuf>> = match (&base, me) {
        (Some(base), 0) => {
            (0..group.size()).map(|r| (r > 0 && lens[r] > 0).then(|| base.with_extension(format!("part{r}")))).collect()
        }
        _ => Vec::new(),
    };
    let moved = move_files(group, file.as_deref(), &lens, &parts);
    let merged = moved.and_then(|()| match (&base, me) {
        (Some(base), 0) => {
            let files: Vec<PathBuf> = file.iter().cloned().chain(parts.iter().flatten().cloned()).collect();
            timeline::merge(base, &files).map(|()| Some(base.clone()))
        }
        _ => Ok(None),
    });
    for part in parts.iter().flatten() {
        let _ = std::fs::remove_file(part);
    }
    let Some(merged) = merged? else { return Ok(file) };
    if let Some(line) = slowest_rank().filter(|_| log) {
        crate::say!("kvstore: {line}");
    }
    Ok(Some(merged))
}

/// The most bytes of its timeline a rank sends in one round of [`move_files`]: 1 MiB.
const PIECE: usize = 1 << 20;

fn read_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io { context: format!("the timeline's file {}", path.display()), source: e }
}

/// Every rank's timeline file (`mine`, of `lens[rank]` bytes) to rank 0, which writes
/// rank r's to `parts[r]` (where it has one), in rounds of [`PIECE`] bytes a rank. Every rank
/// takes part in every round whatever fails: a rank whose file cannot be read sends
/// zeros (the merge then finds its part is not a whole file), and rank 0 stops writing
/// at its first error, which it returns at the end.
fn move_files(group: &dyn Collective, mine: Option<&Path>, lens: &[u64], parts: &[Option<PathBuf>]) -> Result<()> {
    use std::io::{Read, Write};
    let longest = lens.iter().copied().max().unwrap_or(0);
    let piece = (longest as usize).min(PIECE);
    let mut reader = mine.and_then(|p| std::fs::File::open(p).ok()).map(std::io::BufReader::new);
    let mut writers = parts
        .iter()
        .enumerate()
        .filter_map(|(r, p)| Some((r, p.as_ref()?)))
        .map(|(r, p)| Ok((r, crate::files::create_own(p).map(std::io::BufWriter::new).map_err(|e| read_error(p, e))?)))
        .collect::<Result<Vec<_>>>();
    let mut buf = vec![0u8; piece];
    let mut sent = 0u64;
    while sent < longest {
        let n = (longest - sent).min(piece as u64) as usize;
        buf.iter_mut().for_each(|b| *b = 0);
        if let Some(r) = reader.as_mut()
            && r.read_exact(&mut buf[..n.min(lens[group.rank()].saturating_sub(sent) as usize)]).is_err()
        {
            reader = None;
        }
        let all = group.all_gather("the timelines", &buf[..n])?;
        if let Ok(ws) = writers.as_mut() {
            let wrote = ws.iter_mut().try_for_each(|(r, w)| {
                let r = *r;
                let have = lens[r].saturating_sub(sent).min(n as u64) as usize;
                let part = parts[r].as_deref().unwrap_or(Path::new("?"));
                w.write_all(&all[r * n..r * n + have]).map_err(|e| read_error(part, e))
            });
            if let Err(e) = wrote {
                writers = Err(e);
            }
        }
        sent += n as u64;
    }
    for (r, w) in writers? {
        w.into_inner().map_err(|e| read_error(parts[r].as_deref().unwrap_or(Path::new("?")), e.into_error()))?;
    }
    Ok(())
}

/// The job's arrivals at the collectives of all of this process's stores.
static JOB: Mutex<Arrivals> =
    parking_lot::const_mutex(Arrivals { collectives: 0, held_ns: Vec::new(), last: Vec::new(), late_ns: Vec::new() });

/// The line naming the worker that held the others up longest at the collectives of
/// this process's `dist_sync` stores, or saying that none stands out (see [`Slowest`]'s
/// `Display`); `None` before any collective.
pub fn slowest_rank() -> Option<String> {
    let a = JOB.lock();
    Slowest::of(&a.ranks(), a.collectives).map(|s| s.to_string())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Barrier};

    use parking_lot::Mutex;

    use super::{Arrivals, PIECE, held_up, lateness, move_files};
    use crate::collective::Collective;
    use crate::timeline::Slowest;
    use crate::{Error, NDArray, Result};

    /// Workers as threads that only gather bytes.
    struct Gathering {
        rank: usize,
        size: usize,
        slots: Arc<Mutex<Vec<Vec<u8>>>>,
        turns: Arc<Barrier>,
    }

    impl Collective for Gathering {
        fn name(&self) -> &'static str {
            "gathering threads"
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn barrier(&self) -> Result<()> {
            self.turns.wait();
            Ok(())
        }
        fn allreduce_sum(&self, _: &[(&NDArray, &NDArray)]) -> Result<()> {
            Err(Error::Internal("not a sum".into()))
        }
        fn broadcast(&self, _: &[&NDArray], _: usize) -> Result<()> {
            Err(Error::Internal("not a broadcast".into()))
        }
        fn all_gather(&self, _: &str, mine: &[u8]) -> Result<Vec<u8>> {
            self.slots.lock()[self.rank] = mine.to_vec();
            self.turns.wait();
            let all = self.slots.lock().concat();
            self.turns.wait();
            Ok(all)
        }
    }

    #[test]
    fn rank_0_receives_every_ranks_file_in_pieces() {
        let folder = std::env::temp_dir().join(format!("kvstore-move-files-{}", std::process::id()));
        std::fs::create_dir_all(&folder).expect("a folder");
        // Two and a half pieces, a third of one, nothing: three rounds.
        let lens = [PIECE * 5 / 2, PIECE / 3, 0];
        let files: Vec<PathBuf> = (0..3).map(|r| folder.join(format!("rank{r}"))).collect();
        let bytes: Vec<Vec<u8>> =
            lens.iter().enumerate().map(|(r, &n)| (0..n).map(|i| (i * 7 + r) as u8).collect()).collect();
        for (f, b) in files.iter().zip(&bytes) {
            std::fs::write(f, b).expect("a file");
        }
        // Rank 0's own file is not moved: no part for it.
        let parts: Vec<Option<PathBuf>> = (0..3).map(|r| (r > 0).then(|| folder.join(format!("part{r}")))).collect();
        let (slots, turns) = (Arc::new(Mutex::new(vec![Vec::new(); 3])), Arc::new(Barrier::new(3)));
        let lens64: Vec<u64> = lens.iter().map(|&n| n as u64).collect();
        std::thread::scope(|s| {
            for (rank, file) in files.iter().enumerate() {
                let group = Gathering { rank, size: 3, slots: Arc::clone(&slots), turns: Arc::clone(&turns) };
                let (lens, parts) = (&lens64, &parts);
                s.spawn(move || {
                    let parts = if rank == 0 { &parts[..] } else { &[][..] };
                    move_files(&group, Some(file), lens, parts).expect("moved");
                });
            }
        });
        for (r, (part, sent)) in parts.iter().zip(&bytes).enumerate().skip(1) {
            let part = part.as_ref().expect("a part");
            assert!(std::fs::read(part).expect("a part") == *sent, "rank {r}'s file, whole");
        }
        let _ = std::fs::remove_dir_all(&folder);
    }

    #[test]
    fn lateness_is_the_arrival_less_the_median_of_the_others() {
        assert_eq!(lateness(&[100]).0, vec![0]);
        assert_eq!(lateness(&[100, 140]).0, vec![-40, 40]);
        assert_eq!(lateness(&[100, 102, 140]).0, vec![-21, -18, 39]);
        assert_eq!(lateness(&[10, 10, 10, 50]).0, vec![0, 0, 0, 40]);
        assert_eq!(lateness(&[140, 100, 102]).0, vec![39, -21, -18]);
    }

    /// Counts collectives of arrivals `at` (ns, the `k`th collective's from `at(k)`):
    /// each worker's figures, and the slowest.
    fn counted(n: u64, at: impl Fn(u64) -> Vec<u64>) -> (Vec<super::RankStats>, Slowest) {
        let mut a = Arrivals::default();
        for at in (0..n).map(at) {
            let (late, last) = lateness(&at);
            a.add(&late, last, held_up(&at));
        }
        (a.ranks(), Slowest::of(&a.ranks(), a.collectives).expect("collectives"))
    }

    #[test]
    fn the_slowest_worker_is_the_one_that_held_the_others_up_longest() {
        // Worker 2 comes last at 9 collectives of 10, 2 ms after the others; worker 1
        // once, 500 ms after them: it held them up longest.
        let ms = 1_000_000;
        let (ranks, s) = counted(10, |k| {
            let t = k * 1000 * ms;
            if k == 0 { vec![t, t + 500 * ms, t] } else { vec![t, t, t + 2 * ms] }
        });
        assert_eq!(ranks.iter().map(|r| r.last).collect::<Vec<_>>(), [0, 1, 9]);
        assert_eq!((s.rank.rank, s.stands_out), (1, true));
        assert!((s.rank.held_up_s - 0.5).abs() < 1e-9 && (s.others_s - 0.009).abs() < 1e-9, "{s:?}");
        assert_eq!(
            s.to_string(),
            "slowest rank: 1 (held the others up 500.0 ms, the others 9.0 ms (median); \
             last at 1 of 10 collectives, 49.1 ms late on average)"
        );
    }

    #[test]
    fn no_worker_stands_out_of_a_balanced_job() {
        // Each worker comes last in turn, 0.3 ms after the others (and worker 0 once
        // more): within the noise.
        let us = 1_000;
        let (_, s) = counted(31, |k| {
            let t = k * 10_000 * us;
            (0..3).map(|r| if k % 3 == r { t + 300 * us } else { t }).collect()
        });
        assert_eq!((s.rank.rank, s.stands_out), (0, false), "{s:?}");
        assert!(s.to_string().starts_with("slowest rank: none stands out (rank 0 held the others up 3.3 ms"), "{s}");
        // A tie holds no one up; one worker, nobody.
        assert_eq!(held_up(&[5, 9, 9]), Some((2, 0)));
        assert_eq!(held_up(&[5, 9, 7]), Some((1, 2)));
        assert_eq!(held_up(&[5]), None);
        assert!(Slowest::of(&[], 0).is_none());
    }
}
