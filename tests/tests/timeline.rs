//! The timeline (`kvstore_core::timeline`, `KVStore::start_timeline`) and the stores'
//! counters (`KVStore::stats`): what a local store's calls write (calls, phases, flows,
//! threads, nested spans), the file's bound, and, with workers as threads, the counts a
//! `dist_sync` store keeps of each worker's arrivals (a slow worker is named). A binary
//! of its own: the timeline is the process's, and its tests take turns.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvstore_core::{KVStore, NDArray};
use kvstore_tests::run_workers;
use serde_json::Value;

/// The tests take turns: one timeline per process.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvstore-timeline-{}-{name}.json", std::process::id()))
}

fn events(path: &PathBuf) -> Vec<Value> {
    let doc: Value = serde_json::from_slice(&std::fs::read(path).expect("the trace")).expect("the trace is JSON");
    assert!(doc["otherData"]["clock_error_ns"].is_u64(), "otherData: {}", doc["otherData"]);
    doc["traceEvents"].as_array().expect("traceEvents").clone()
}

/// Checks that the complete events of each thread nest (to a nanosecond: a start plus
/// a duration, added as doubles, may round).
fn nested(events: &[Value]) {
    let mut spans: BTreeMap<u64, Vec<(f64, f64, String)>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let (ts, dur) = (e["ts"].as_f64().expect("ts"), e["dur"].as_f64().expect("dur"));
        let name = e["name"].as_str().expect("name").to_string();
        spans.entry(e["tid"].as_u64().expect("tid")).or_default().push((ts, ts + dur, name));
    }
    for (tid, mut s) in spans {
        s.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, String)> = Vec::new();
        for (start, end, name) in s {
            while open.last().is_some_and(|(e, _)| *e <= start + 1e-3) {
                open.pop();
            }
            if let Some((outer, around)) = open.last() {
                assert!(
                    end <= outer + 1e-3,
                    "thread {tid}: {name} [{start}, {end}] overlaps {around} ending at {outer}"
                );
            }
            open.push((end, name));
        }
    }
}

#[test]
fn a_local_store_writes_its_calls_phases_flows_and_threads() {
    let _turn = turn();
    let path = temp("local");
    let kv = KVStore::create("local").expect("a store");
    kv.start_timeline(&path).expect("start");
    let keys = ["a", "b"];
    let values: Vec<NDArray> = (0..2).map(|_| NDArray::ones(&[8])).collect::<Result<_, _>>().expect("values");
    kv.init(&keys[..], &values).expect("init");
    kv.push(&keys[..], &values, 0).expect("push");
    kv.pull(&keys[..], &values, 0).expect("pull");
    kv.push_async("a", &values[0], 0).wait().expect("a non-blocking push");
    assert_eq!(kv.stop_timeline().expect("stop"), Some(path.clone()));
    // Stopped: later calls are not written, and stopping again says it was off.
    kv.push("a", &values[0], 0).expect("push");
    assert_eq!(kv.stop_timeline().expect("stop"), None);
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let named = |n: &str, ph: &str| events.iter().filter(|e| e["name"] == n && e["ph"] == ph).count();
    assert_eq!(named("init", "X"), 1);
    assert_eq!(named("push", "X"), 2, "the blocking push and the non-blocking one, not the push after the stop");
    assert_eq!(named("pull", "X"), 1);
    assert!(named("sum", "X") >= 1 && named("copy", "X") >= 1 && named("queued", "b") == 1);
    assert_eq!(named("queued", "e"), 1, "the non-blocking push's wait: an async span");
    let push = events.iter().find(|e| e["name"] == "push" && e["args"]["keys"] == 2).expect("the list push");
    assert_eq!((push["args"]["bytes"].as_u64(), push["args"]["key"].as_str()), (Some(64), Some("a")));
    // The non-blocking push: a flow from the caller's thread to the engine's.
    let start = events.iter().find(|e| e["ph"] == "s").expect("a flow's start");
    let end = events.iter().find(|e| e["ph"] == "f").expect("a flow's end");
    assert_eq!(start["id"], end["id"]);
    assert_ne!(start["tid"], end["tid"], "submitted on the caller's thread, run on an engine's");
    // The flow starts inside its submission's slice (a viewer binds it to a slice).
    let submit = events
        .iter()
        .find(|e| e["name"] == "submit" && e["tid"] == start["tid"])
        .expect("the submission, on the caller's thread");
    assert_eq!(submit["args"]["call"], "push");
    let ts = |e: &Value| e["ts"].as_f64().expect("ts");
    assert!(ts(submit) <= ts(start) && ts(start) <= ts(submit) + submit["dur"].as_f64().expect("dur"));
    let threads: Vec<&Value> = events.iter().filter(|e| e["name"] == "thread_name").collect();
    for tid in [&start["tid"], &end["tid"]] {
        assert!(threads.iter().any(|t| t["tid"] == *tid), "thread {tid} is named");
    }
    assert!(events.iter().all(|e| e["pid"] == 0), "one process: rank 0");
    nested(&events);
}

#[test]
fn stats_count_calls_keys_bytes_and_phases_until_reset() {
    let _turn = turn();
    let kv = KVStore::create("local").expect("a store");
    let values: Vec<NDArray> = (0..3).map(|_| NDArray::ones(&[4])).collect::<Result<_, _>>().expect("values");
    kv.init(&["a", "b", "c"][..], &values).expect("init");
    kv.push(&["a", "b", "a"][..], &values, 0).expect("push");
    kv.pushpull("c", &values[2], &values[2], 0).expect("pushpull");
    kv.pull(&["a", "b"][..], &values[..2], 0).expect("pull");
    kv.push_async("a", &values[0], 0).wait().expect("push_async");
    let s = kv.stats();
    let count = |op: &str| s.calls.get(op).map(|c| (c.calls, c.keys));
    assert_eq!(count("init"), Some((1, 3)));
    assert_eq!(count("push"), Some((2, 4)), "a key given twice counts twice");
    assert_eq!((count("pushpull"), count("pull"), count("broadcast")), (Some((1, 1)), Some((1, 2)), None));
    // 16 bytes a value: 3 + 1 + 1 pushed, 1 + 2 pulled; nothing on a wire.
    assert_eq!((s.bytes_pushed, s.bytes_pulled, s.wire_bytes_sent), (5 * 16, 3 * 16, 0));
    assert!(s.phases["sum"] > Duration::ZERO && s.phases["queued"] > Duration::ZERO, "{:?}", s.phases);
    assert_eq!((s.collectives, s.ranks.len()), (0, 0));
    kv.reset_stats();
    let zero = kv.stats();
    assert!(zero.calls.is_empty() && zero.bytes_pushed == 0 && zero.phases.values().all(|d| d.is_zero()));
}

#[test]
fn a_failed_call_is_counted_and_changes_nothing() {
    let _turn = turn();
    let kv = KVStore::create("local").expect("a store");
    kv.init("a", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    assert!(kv.push("a", &NDArray::ones(&[5]).expect("ones"), 0).is_err());
    let out = NDArray::ones(&[4]).expect("ones");
    kv.pull("a", &out, 0).expect("pull");
    assert_eq!(out.to_vec::<f32>().expect("values"), vec![0.0; 4]);
    assert_eq!(kv.stats().calls["push"].calls, 1, "a call is counted when it is made");
}

#[test]
fn the_file_stops_growing_at_its_bound_and_stays_valid() {
    let _turn = turn();
    let path = temp("bounded");
    // SAFETY: the tests of this binary that read the environment take turns (`TURN`).
    unsafe { std::env::set_var(kvstore_core::timeline::MAX_BYTES_VAR, "4096") };
    let kv = KVStore::create("local").expect("a store");
    kv.start_timeline(&path).expect("start");
    unsafe { std::env::remove_var(kvstore_core::timeline::MAX_BYTES_VAR) };
    kv.init("a", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    for _ in 0..200 {
        kv.push("a", &NDArray::ones(&[4]).expect("ones"), 0).expect("push");
    }
    kv.stop_timeline().expect("stop");
    let size = std::fs::metadata(&path).expect("the trace").len();
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    assert!(size < 4096 + 1024, "{size} bytes");
    assert_eq!(events.iter().filter(|e| e["name"] == "truncated").count(), 1);
    assert!(events.iter().filter(|e| e["name"] == "push").count() < 200);
}

#[test]
fn a_slow_worker_is_last_at_the_collectives_and_late_by_its_delay() {
    let _turn = turn();
    let stats = run_workers(3, |rank, kv| {
        let values: Vec<NDArray> = (0..2).map(|_| NDArray::ones(&[64])).collect::<Result<_, _>>().expect("values");
        kv.init(&["a", "b"][..], &values).expect("init");
        for _ in 0..12 {
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            kv.push(&["a", "b"][..], &values, 0).expect("push");
        }
        kv.stats()
    });
    for s in &stats {
        assert_eq!(s.ranks, stats[0].ranks, "every worker counts the same arrivals");
        assert_eq!(s.collectives, 13, "the init and the pushes");
        // 2(n-1)/n of 512 bytes a push, each way.
        assert_eq!((s.wire_bytes_sent, s.wire_bytes_received), (12 * 682, 12 * 682));
    }
    let slow = stats[0].ranks[1];
    assert!(slow.last >= 11, "the slow worker was last at {} of 13", slow.last);
    assert!((slow.mean_lateness_s - 0.020 * 12.0 / 13.0).abs() < 0.005, "{} s late", slow.mean_lateness_s);
    assert!(stats[0].ranks.iter().filter(|r| r.rank != 1).all(|r| r.last <= 1 && r.mean_lateness_s < 0.002));
}

#[test]
fn queued_time_is_counted_with_the_timeline_off() {
    let _turn = turn();
    let kv = KVStore::create("local").expect("a store");
    kv.init("a", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    let one = NDArray::ones(&[4]).expect("ones");
    let began = Instant::now();
    for _ in 0..20 {
        kv.push_async("a", &one, 0).wait().expect("push_async");
    }
    let (queued, took) = (kv.stats().phases["queued"], began.elapsed());
    assert!(queued > Duration::ZERO && queued <= took, "queued {queued:?} in {took:?}");
}

#[test]
fn a_call_waiting_for_another_stores_write_counts_its_inputs_phase() {
    let _turn = turn();
    let path = temp("inputs");
    let (a, b) = (KVStore::create("local").expect("a store"), KVStore::create("local").expect("a store"));
    let zeros = NDArray::zeros(&[4]).expect("zeros");
    a.init("w", &zeros).expect("init");
    b.init("w", &zeros).expect("init");
    // Store a's engine is busy for 60 ms, then writes x (a pull into it).
    a.set_updater(|_: &kvstore_core::Key, _, merged: &NDArray, stored: &NDArray| {
        std::thread::sleep(Duration::from_millis(60));
        stored.add_assign(merged)
    })
    .expect("updater");
    let x = NDArray::ones(&[4]).expect("ones");
    b.start_timeline(&path).expect("start");
    let pushed = a.push_async("w", &zeros, 0);
    let pulled = a.pull_async("w", &x, 0);
    // Store b's push reads x: it waits for a's write first.
    b.push("w", &x, 0).expect("push");
    b.stop_timeline().expect("stop");
    pushed.wait().and(pulled.wait()).expect("a's calls");
    let inputs = b.stats().phases["inputs"];
    assert!(inputs >= Duration::from_millis(40), "inputs {inputs:?}");
    assert_eq!(a.stats().phases["inputs"], Duration::ZERO, "a's calls waited for nothing");
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let wait = events.iter().find(|e| e["name"] == "inputs" && e["ph"] == "X").expect("the inputs phase");
    assert!(wait["dur"].as_f64().expect("dur") >= 40_000.0, "{wait}");
    nested(&events);
}

#[test]
fn a_call_spread_over_the_pool_counts_its_sums_and_copies() {
    let _turn = turn();
    let path = temp("spread");
    let kv = KVStore::builder("local").num_threads(2).build().expect("a store");
    let keys: Vec<String> = (0..256).map(|k| format!("k{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let arrays = || keys.iter().map(|_| NDArray::ones(&[512])).collect::<Result<Vec<_>, _>>().expect("arrays");
    let (values, outs) = (arrays(), arrays());
    kv.init(&keys[..], &values).expect("init");
    kv.start_timeline(&path).expect("start");
    for _ in 0..20 {
        kv.pushpull(&keys[..], &values, &outs, 0).expect("pushpull");
    }
    kv.stop_timeline().expect("stop");
    let s = kv.stats();
    assert!(s.phases["sum"] > Duration::ZERO && s.phases["copy"] > Duration::ZERO, "{:?}", s.phases);
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let spread: Vec<&Value> = events.iter().filter(|e| e["name"] == "spread").collect();
    assert!(!spread.is_empty(), "the calls ran spread");
    let ran: u64 = spread.iter().map(|e| e["args"]["keys"].as_u64().expect("keys")).sum();
    assert_eq!(ran % 256, 0, "every key of a spread call, once");
    for e in &spread {
        let (sum, copy) = (e["args"]["sum_us"].as_f64().expect("sum"), e["args"]["copy_us"].as_f64().expect("copy"));
        assert!(sum > 0.0 && sum + copy <= e["dur"].as_f64().expect("dur") + 1e-3, "{e}");
    }
    nested(&events);
    // A push only sums, a pull only copies.
    kv.reset_stats();
    kv.push(&keys[..], &values, 0).expect("push");
    let pushed = kv.stats().phases;
    assert!(pushed["sum"] > Duration::ZERO && pushed["copy"] == Duration::ZERO, "{pushed:?}");
    kv.reset_stats();
    kv.pull(&keys[..], &outs, 0).expect("pull");
    let pulled = kv.stats().phases;
    assert!(pulled["sum"] == Duration::ZERO && pulled["copy"] > Duration::ZERO, "{pulled:?}");
}
