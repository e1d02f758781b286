//! The timeline and the slow rank, on a 3-rank `dist_sync` job (`fixture_slow_rank`)
//! run with `KVSTORE_TIMELINE`: rank 0 merges every rank's file at finalize and names
//! the slowest rank; the merged trace is valid Chrome Trace Event Format (every event
//! with the fields its phase needs, one process per rank, spans nested per thread) and
//! its byte counters add up to what was pushed.
//!
//! Run by `scripts/test-mpi.sh` under cargo-nextest, one job at a time (the `mpi-jobs`
//! test group of `.config/nextest.toml`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

#[path = "support/jobs.rs"]
mod jobs;

const RANKS: usize = 3;
/// The fixture's pushes, and its sleep before each on the slow rank.
const PUSHES: u64 = 30;
const SLEEP_MS: f64 = 40.0;
/// The bytes of one of its pushes: 4 keys of 1024 f32.
const PUSH_BYTES: u64 = 4 * 1024 * 4;

/// What a job left: rank 0's `slowest rank` line, every rank's stats, the merged trace.
struct Ran {
    slowest: (usize, f64, u64, u64, f64),
    stats: Vec<Value>,
    trace: Value,
}

/// Runs the fixture with rank `slow` (or none) sleeping before its pushes, each push
/// made as non-blocking pushes fused into one when `fused`.
fn run(slow: Option<usize>, fused: bool) -> Ran {
    let name = slow.map_or("none".to_string(), |r| r.to_string());
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("timeline-{}-{name}.json", std::process::id()));
    let path_text = path.to_string_lossy().into_owned();
    let mut cmd = jobs::mpirun(RANKS, &[("KVSTORE_TIMELINE", &path_text)]);
    cmd.arg(env!("CARGO_BIN_EXE_fixture_slow_rank")).arg(&name);
    if fused {
        cmd.arg("fused");
    }
    let job = jobs::run(cmd, Duration::from_secs(100));
    assert_eq!(job.code, Some(0), "the job failed: {}", job.shown());
    let line = job.output.lines().find_map(|l| l.split_once("slowest rank: ").map(|(_, rest)| rest.to_string()));
    let line = line.unwrap_or_else(|| panic!("no `slowest rank` line: {}", job.shown()));
    // "R (held the others up H ms, the others O ms (median); last at N of M collectives,
    // X ms late on average)"
    let words: Vec<&str> = line.split([' ', '(', ',', ';']).filter(|w| !w.is_empty()).collect();
    let number = |i: usize| words.get(i).unwrap_or_else(|| panic!("the line {line:?}"));
    let slowest = (
        number(0).parse().expect("a rank"),
        number(5).parse().expect("H"),
        number(14).parse().expect("N"),
        number(16).parse().expect("M"),
        number(18).parse().expect("X"),
    );
    let others: f64 = number(9).parse().expect("O");
    assert_eq!(
        line,
        format!(
            "{} (held the others up {:.1} ms, the others {others:.1} ms (median); \
             last at {} of {} collectives, {:.1} ms late on average)",
            slowest.0, slowest.1, slowest.2, slowest.3, slowest.4
        )
    );
    let mut stats: Vec<Value> = job
        .output
        .lines()
        .filter_map(|l| l.find("stats {").map(|at| serde_json::from_str(&l[at + 6..]).expect("a stats line")))
        .collect();
    stats.sort_by_key(|s| s["rank"].as_u64());
    assert_eq!(stats.len(), RANKS, "every rank's stats: {}", job.shown());
    let trace = serde_json::from_slice(&std::fs::read(&path).expect("the merged trace")).expect("JSON");
    for r in 0..RANKS {
        let own = path.with_file_name(format!("timeline-{}-{name}.rank{r}.json", std::process::id()));
        assert!(own.exists(), "rank {r}'s own file {own:?}");
        let _ = std::fs::remove_file(own);
    }
    let _ = std::fs::remove_file(&path);
    Ran { slowest, stats, trace }
}

/// Checks the trace's events: the fields of each phase, the processes, the nesting
/// of complete events per thread, and that each rank's last wire counter is its stats'.
fn valid(ran: &Ran) {
    let events = ran.trace["traceEvents"].as_array().expect("traceEvents");
    assert!(ran.trace["otherData"]["clock_error_ns"].is_u64(), "the clock's error in otherData");
    let mut pids = BTreeSet::new();
    let mut named = BTreeSet::new();
    let mut spans: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    let mut arrivals: BTreeMap<u64, u64> = BTreeMap::new();
    // Flows and async spans by id: their starts and ends pair up.
    let mut ids: BTreeMap<(u64, &str), i64> = BTreeMap::new();
    let mut flows: Vec<(u64, u64, f64)> = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["name"].is_string(), "no name: {e}");
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {e}"));
        let tid = e["tid"].as_u64().unwrap_or_else(|| panic!("no tid: {e}"));
        pids.insert(pid);
        let ts = || e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
        match ph {
            "M" => {
                if e["name"] == "process_name" {
                    named.insert(pid);
                }
                assert!(e["args"].is_object(), "metadata without args: {e}");
            }
            "X" => {
                let dur = e["dur"].as_f64().unwrap_or_else(|| panic!("no dur: {e}"));
                assert!(dur >= 0.0);
                spans.entry((pid, tid)).or_default().push((ts(), ts() + dur));
            }
            "i" => {
                ts();
                if e["name"] == "arrive" {
                    *arrivals.entry(pid).or_default() += 1;
                    assert!(e["args"]["late_ms"].is_number() && e["args"]["step"].is_u64(), "an arrival's args: {e}");
                }
            }
            "C" => {
                ts();
                if e["name"] == "wire bytes" {
                    sent.insert(pid, e["args"]["sent"].as_u64().expect("sent"));
                }
            }
            "s" | "f" | "b" | "e" => {
                ts();
                let id = e["id"].as_u64().unwrap_or_else(|| panic!("no id: {e}"));
                let kind = if matches!(ph, "s" | "f") { "flow" } else { "async" };
                if kind == "flow" {
                    flows.push((pid, tid, ts()));
                }
                *ids.entry((pid * (1 << 40) + id, kind)).or_default() += if matches!(ph, "s" | "b") { 1 } else { -1 };
            }
            other => panic!("an event of phase {other}: {e}"),
        }
    }
    assert!(ids.values().all(|&n| n == 0), "every flow and async span begins and ends once");
    // A viewer takes ids as the trace's, not a process's: no id of two ranks.
    let mut owners: BTreeMap<(u64, &str), u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e["id"].is_u64()) {
        let kind = if matches!(e["ph"].as_str(), Some("s" | "f")) { "flow" } else { "async" };
        let (id, pid) = (e["id"].as_u64().expect("id"), e["pid"].as_u64().expect("pid"));
        assert_eq!(*owners.entry((id, kind)).or_insert(pid), pid, "{kind} id {id} of two ranks");
    }
    // A viewer binds a flow's ends to the slices they lie in: each lies in one.
    for (pid, tid, ts) in flows {
        let inside = spans.get(&(pid, tid)).is_some_and(|s| s.iter().any(|&(a, b)| a <= ts && ts <= b));
        assert!(inside, "pid {pid} tid {tid}: a flow's end at {ts} lies in no slice");
    }
    let all: BTreeSet<u64> = (0..RANKS as u64).collect();
    assert_eq!((&pids, &named), (&all, &all), "one named process per rank");
    // Per thread, complete events nest: each starts after and ends before the one it
    // starts in, or starts after it ended (to a nanosecond: a start plus a duration,
    // added as doubles, may round).
    for ((pid, tid), mut s) in spans {
        s.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (start, end) in s {
            while open.last().is_some_and(|&e| e <= start + 1e-3) {
                open.pop();
            }
            if let Some(&outer) = open.last() {
                assert!(
                    end <= outer + 1e-3,
                    "pid {pid} tid {tid}: a span [{start}, {end}] overlaps one ending at {outer}"
                );
            }
            open.push(end);
        }
    }
    // The init and every push are collectives, each with an arrival per rank.
    for r in 0..RANKS as u64 {
        assert_eq!(arrivals.get(&r), Some(&(PUSHES + 1)), "rank {r}'s arrivals");
        let stats = &ran.stats[r as usize];
        let n = RANKS as u64;
        let wire = PUSHES * (2 * (n - 1) * PUSH_BYTES / n);
        assert_eq!(stats["wire_sent"].as_u64(), Some(wire), "rank {r}: 2(n-1)/n of the bytes of each push");
        assert_eq!(stats["wire_received"].as_u64(), Some(wire));
        assert_eq!(stats["bytes_pushed"].as_u64(), Some(PUSHES * PUSH_BYTES));
        assert_eq!(sent.get(&r), Some(&wire), "rank {r}'s last wire counter is its stats'");
    }
}

/// Checks that `ran` names `slow`, having held the others up 30 × 40 ms within 25 %,
/// last at 90 % of the collectives or more, late by 40 ms within 25 %, and that every
/// rank's stats say the same.
fn names(ran: &Ran, slow: usize) {
    let (rank, held_ms, last, of, late_ms) = ran.slowest;
    assert_eq!(rank, slow, "the slowest rank");
    let held = PUSHES as f64 * SLEEP_MS;
    assert!((held_ms - held).abs() <= 0.25 * held, "held the others up {held_ms} ms");
    assert_eq!(of, PUSHES + 1, "the collectives: the init and the pushes");
    assert!(last as f64 >= 0.9 * of as f64, "last at {last} of {of}");
    assert!((late_ms - SLEEP_MS).abs() <= 0.25 * SLEEP_MS, "{late_ms} ms late");
    for s in &ran.stats {
        assert_eq!(s["ranks"], ran.stats[0]["ranks"], "every rank counts the same arrivals");
        assert_eq!(s["ranks"][slow]["last"].as_u64(), Some(last));
    }
}

#[test]
fn a_slow_rank_2_is_named_with_its_lateness_and_the_trace_is_valid() {
    let ran = run(Some(2), false);
    names(&ran, 2);
    valid(&ran);
}

#[test]
fn a_slow_rank_1_is_named_when_its_pushes_are_fused_non_blocking_calls() {
    let ran = run(Some(1), true);
    names(&ran, 1);
    valid(&ran);
    // Each rank's batches: their run, and each call's submission, wait and flow.
    let events = ran.trace["traceEvents"].as_array().expect("traceEvents");
    for r in 0..RANKS as u64 {
        let count = |name: &str, ph: &str| {
            events.iter().filter(|e| e["pid"] == r && e["name"] == name && e["ph"] == ph).count()
        };
        assert_eq!(count("fused", "X") as u64, PUSHES, "rank {r}: a batch a step");
        assert_eq!(count("submit", "X") as u64, 4 * PUSHES, "rank {r}: a submission a call");
        assert_eq!(count("queued", "b") as u64, 4 * PUSHES, "rank {r}: a wait a call");
        assert_eq!(events.iter().filter(|e| e["pid"] == r && e["ph"] == "f").count() as u64, 4 * PUSHES);
    }
}

#[test]
fn with_no_slow_rank_no_rank_is_last_at_most_collectives() {
    let ran = run(None, false);
    valid(&ran);
    let ranks = ran.stats[0]["ranks"].as_array().expect("ranks");
    for r in ranks {
        let last = r["last"].as_u64().expect("last");
        assert!(last as f64 <= 0.7 * (PUSHES + 1) as f64, "rank {} last at {last} of {}", r["rank"], PUSHES + 1);
    }
}

#[test]
fn a_dist_async_job_records_its_serving_threads_work() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("timeline-{}-async.json", std::process::id()));
    let path_text = path.to_string_lossy().into_owned();
    let mut cmd = jobs::mpirun(2, &[("KVSTORE_TIMELINE", &path_text)]);
    cmd.arg(env!("CARGO_BIN_EXE_fixture_async_early_finish"));
    let job = jobs::run(cmd, Duration::from_secs(100));
    assert_eq!(job.code, Some(0), "the job failed: {}", job.shown());
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).expect("the merged trace")).expect("JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let served: BTreeSet<u64> =
        events.iter().filter(|e| e["name"] == "serve" && e["ph"] == "X").filter_map(|e| e["pid"].as_u64()).collect();
    assert!(!served.is_empty(), "no rank's serving thread recorded a request");
    assert!(events.iter().any(|e| e["name"] == "push" && e["ph"] == "X"), "the calls are recorded too");
    for r in 0..2 {
        let _ =
            std::fs::remove_file(path.with_file_name(format!("timeline-{}-async.rank{r}.json", std::process::id())));
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_rank_without_the_timeline_is_left_out_of_the_merge() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("timeline-{}-partial.json", std::process::id()));
    let set = format!("KVSTORE_TIMELINE={}", path.display());
    let exe = env!("CARGO_BIN_EXE_fixture_slow_rank");
    // Ranks 0 and 2 have KVSTORE_TIMELINE, rank 1 not.
    let mut cmd = jobs::mpirun(1, &[]);
    cmd.args(["env", &set, exe, "none", ":", "-np", "1", exe, "none", ":", "-np", "1", "env", &set, exe, "none"]);
    let job = jobs::run(cmd, Duration::from_secs(100));
    assert_eq!(job.code, Some(0), "the job ends as it would have: {}", job.shown());
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).expect("the merged trace")).expect("JSON");
    let pids: BTreeSet<u64> =
        trace["traceEvents"].as_array().expect("events").iter().filter_map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids, BTreeSet::from([0, 2]), "the ranks that wrote a file");
    let name = |r: &str| path.with_file_name(format!("timeline-{}-partial.{r}", std::process::id()));
    assert!(!name("rank1.json").exists() && !name("part1").exists() && !name("part2").exists(), "no part left");
    for r in [0, 2] {
        let _ = std::fs::remove_file(name(&format!("rank{r}.json")));
    }
    let _ = std::fs::remove_file(&path);
}
