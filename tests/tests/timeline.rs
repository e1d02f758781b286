//! The timeline (`kvstore_core::timeline`, `KVStore::start_timeline`) and the stores'
//! counters (`KVStore::stats`): what a local store's calls write (calls, phases, flows,
//! threads, nested spans), the file's bound (no span left open where it cuts), and, with
//! workers as threads, the counts a `dist_sync` store keeps of each worker's arrivals
//! (the worker that held the others up is named). A binary
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
fn a_trace_cut_at_its_bound_ends_every_span_it_began() {
    use kvstore_core::timeline;
    let _turn = turn();
    let path = temp("cut-spans");
    // Bounds 5 bytes apart, from a cut before the first span to none: some fall between
    // a span's begin and its end, where a begin whose end did not fit stayed open.
    let mut kept = std::collections::BTreeSet::new();
    for max in (300..4000).step_by(5) {
        // SAFETY: the tests of this binary that read the environment take turns (`TURN`).
        unsafe { std::env::set_var(timeline::MAX_BYTES_VAR, max.to_string()) };
        timeline::start(&path).expect("start");
        unsafe { std::env::remove_var(timeline::MAX_BYTES_VAR) };
        for id in 1..=8 {
            let at = timeline::now();
            timeline::complete("push", "call", at, at + 1_000, Vec::new());
            timeline::span_apart("queued", at, at + 2_000, id, vec![("fused", timeline::Arg::U(2))]);
        }
        timeline::stop().expect("stop");
        let events = events(&path);
        let cut = events.iter().filter(|e| e["name"] == "truncated").count();
        let ids = |ph: &str| -> Vec<u64> {
            events
                .iter()
                .filter(|e| e["name"] == "queued" && e["ph"] == ph)
                .map(|e| e["id"].as_u64().expect("id"))
                .collect()
        };
        assert_eq!(ids("b"), ids("e"), "cut at {max} bytes: every span begun is ended");
        kept.insert(ids("b").len());
        if cut == 0 {
            break; // (the whole trace fits)
        }
    }
    let _ = std::fs::remove_file(&path);
    assert!(kept.len() >= 3, "the bounds cut among the spans: {kept:?} spans kept");
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
    // It held the others up 20 ms at each push, and stands out.
    assert!((slow.held_up_s - 0.240).abs() < 0.060, "held the others up {} s", slow.held_up_s);
    let named = stats[0].slowest().expect("collectives");
    assert_eq!((named.rank.rank, named.stands_out), (1, true), "{named}");
    assert!(named.to_string().starts_with("slowest rank: 1 (held the others up "), "{named}");
}

#[test]
fn a_fused_call_gives_each_of_its_keys_bytes() {
    let _turn = turn();
    let path = temp("fused");
    kvstore_core::timeline::start(&path).expect("start");
    run_workers(2, |_, kv| {
        let (a, b) = (NDArray::ones(&[4]).expect("a"), NDArray::ones(&[8]).expect("b"));
        kv.init(&["a", "b"][..], &[a.clone(), b.clone()]).expect("init");
        // Two non-blocking pushes held back and run as one call.
        let pushed = [kv.push_async("a", &a, 0), kv.push_async("b", &b, 0)];
        pushed.into_iter().try_for_each(|p| p.wait()).expect("the pushes");
    });
    kvstore_core::timeline::stop().expect("stop");
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let fused: Vec<&Value> = events.iter().filter(|e| e["name"] == "fused" && e["ph"] == "X").collect();
    assert!(!fused.is_empty(), "the pushes ran fused");
    for e in fused {
        assert_eq!(e["args"]["key_bytes"], serde_json::json!({"a": 16, "b": 32}), "{e}");
    }
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

#[test]
fn a_file_of_kvstore_timeline_is_whole_after_the_program_drops_its_stores() {
    let path = temp("env");
    let ran = std::process::Command::new(env!("CARGO_BIN_EXE_fixture_timeline_env"))
        .env("KVSTORE_TIMELINE", &path)
        .output()
        .expect("the fixture runs");
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    // Both stores' calls: the second store wrote on in the file the first one closed.
    let keys = |name: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["name"] == name && e["ph"] == "X")
            .map(|e| e["args"]["key"].as_str().expect("a key").to_string())
            .collect()
    };
    assert_eq!(keys("init"), ["first0", "second0"]);
    assert_eq!(keys("push"), ["first0", "second0"]);
    nested(&events);
}

#[test]
fn starting_again_on_the_same_path_writes_a_whole_new_file() {
    let _turn = turn();
    let path = temp("again");
    let kv = KVStore::create("local").expect("a store");
    kv.init("a", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    kv.start_timeline(&path).expect("start");
    for _ in 0..50 {
        kv.push("a", &NDArray::ones(&[4]).expect("ones"), 0).expect("push");
    }
    kv.start_timeline(&path).expect("start again");
    kv.pull("a", &NDArray::ones(&[4]).expect("ones"), 0).expect("pull");
    kv.stop_timeline().expect("stop");
    let bytes = std::fs::read(&path).expect("the trace");
    assert!(!bytes.contains(&0), "no hole of zeros in the file");
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let count = |n: &str| events.iter().filter(|e| e["name"] == n && e["ph"] == "X").count();
    assert_eq!((count("push"), count("pull")), (0, 1), "the second file only");
}

#[test]
fn a_call_made_before_the_timeline_started_is_not_written() {
    let _turn = turn();
    let path = temp("before");
    let kv = std::sync::Arc::new(KVStore::create("local").expect("a store"));
    kv.init("a", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    // The push's updater waits until the timeline is on.
    let (on_tx, on_rx) = std::sync::mpsc::channel::<()>();
    let on_rx = std::sync::Mutex::new(on_rx);
    kv.set_updater(move |_: &kvstore_core::Key, _, merged: &NDArray, stored: &NDArray| {
        let _ = on_rx.lock().expect("the channel").recv_timeout(Duration::from_secs(5));
        stored.add_assign(merged)
    })
    .expect("updater");
    let pusher = {
        let kv = std::sync::Arc::clone(&kv);
        std::thread::spawn(move || kv.push("a", &NDArray::ones(&[4]).expect("ones"), 0))
    };
    std::thread::sleep(Duration::from_millis(50));
    let began = Instant::now();
    kv.start_timeline(&path).expect("start");
    on_tx.send(()).expect("the updater waits");
    pusher.join().expect("the pushing thread").expect("push");
    kv.stop_timeline().expect("stop");
    let took = began.elapsed().as_secs_f64() * 1e6;
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["dur"].as_f64().expect("dur") <= took, "an event longer than the timeline was on: {e}");
    }
    assert!(!events.iter().any(|e| e["name"] == "push" && e["ph"] == "X"), "the push began before");
}

#[test]
fn a_broadcast_is_one_call_and_row_sparse_calls_are_counted() {
    let _turn = turn();
    let kv = KVStore::create("local").expect("a store");
    let out = NDArray::zeros(&[4]).expect("zeros");
    kv.broadcast("b", &NDArray::ones(&[4]).expect("ones"), &out, 0).expect("broadcast");
    let rows = kvstore_core::RowSparse::from_dense(&NDArray::ones(&[8, 2]).expect("ones")).expect("rows");
    kv.init_row_sparse("emb", &rows).expect("init");
    let grad = kvstore_core::RowSparse::from_dense(&NDArray::ones(&[8, 2]).expect("ones")).expect("rows");
    kv.push_row_sparse("emb", &[grad], 0).expect("push_row_sparse");
    let got = kv.row_sparse_pull("emb", &[1, 3], 0).expect("row_sparse_pull");
    assert_eq!(got.indices(), &[1, 3]);
    let s = kv.stats();
    let count = |op: &str| s.calls.get(op).map(|c| (c.calls, c.keys));
    assert_eq!(count("broadcast"), Some((1, 1)));
    assert_eq!((count("push_row_sparse"), count("pull_row_sparse")), (Some((1, 1)), Some((1, 1))));
    // Pushed: 8 rows of 2 f32; pulled: the broadcast's out (16) and 2 rows of 2 f32.
    assert_eq!((s.bytes_pushed, s.bytes_pulled), (64, 16 + 16));
}

#[test]
fn a_dead_threads_name_is_not_kept() {
    let _turn = turn();
    let path = temp("threads");
    let kv = std::sync::Arc::new(KVStore::create("local").expect("a store"));
    kv.init("a", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    kv.start_timeline(&path).expect("start");
    for t in 0..50 {
        let kv = std::sync::Arc::clone(&kv);
        std::thread::Builder::new()
            .name(format!("short-lived {t}"))
            .spawn(move || kv.push("a", &NDArray::ones(&[4]).expect("ones"), 0).expect("push"))
            .expect("a thread")
            .join()
            .expect("the thread");
    }
    // A new file names the threads alive, not the 50 that ended.
    kv.start_timeline(&path).expect("start again");
    kv.stop_timeline().expect("stop");
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let names: Vec<&Value> = events.iter().filter(|e| e["name"] == "thread_name").collect();
    assert!(
        !names.iter().any(|e| e["args"]["name"].as_str().is_some_and(|n| n.starts_with("short-lived"))),
        "{names:?}"
    );
}

#[test]
fn a_special_file_or_a_bad_bound_is_refused_at_once() {
    let _turn = turn();
    let kv = KVStore::create("local").expect("a store");
    let fifo = temp("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // (Opening a FIFO to write would block until a reader came.)
    let e = kv.start_timeline(&fifo).expect_err("a FIFO");
    let _ = std::fs::remove_file(&fifo);
    assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let e = kv.start_timeline(std::env::temp_dir()).expect_err("a folder");
    assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument, "{e}");
    // SAFETY: the tests of this binary that read the environment take turns (`TURN`).
    unsafe { std::env::set_var(kvstore_core::timeline::MAX_BYTES_VAR, "1k") };
    let e = kv.start_timeline(temp("bound")).expect_err("a bound that is no number");
    unsafe { std::env::remove_var(kvstore_core::timeline::MAX_BYTES_VAR) };
    assert!(e.to_string().contains("KVSTORE_TIMELINE_MAX_BYTES"), "{e}");
    assert!(!kvstore_core::timeline::is_on());
}

/// The timeline's file and the flight record are made 0600 and never written through a
/// link: a timeline started on a link is refused, the target kept; a flight record whose
/// name holds a link (or a file) replaces it, the target kept; with no timeline, the
/// record goes to `kvstore-flight-RANK.json` in the working directory.
#[test]
fn files_are_made_0600_and_never_written_through_a_link() {
    use std::os::unix::fs::PermissionsExt;
    let _turn = turn();
    let kv = KVStore::create("local").expect("a store");
    let mode = |p: &PathBuf| std::fs::metadata(p).expect("the file").permissions().mode() & 0o777;
    let target = temp("kept");
    std::fs::write(&target, b"kept").expect("a file");
    let link = temp("link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&target, &link).expect("a link");
    let e = kv.start_timeline(&link).expect_err("a link");
    assert_eq!(e.kind(), kvstore_core::ErrorKind::Io, "{e}");
    assert_eq!(std::fs::read(&target).expect("kept"), b"kept");
    let trace = temp("mode");
    kv.start_timeline(&trace).expect("a timeline");
    kv.init("w", &NDArray::zeros(&[2]).expect("w")).expect("init");
    kvstore_core::timeline::stop().expect("stop");
    assert_eq!(mode(&trace), 0o600);
    // The flight record, in a folder of the test's own as the working directory.
    let dir = std::env::temp_dir().join(format!("kvstore-flight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    let planted = dir.join("kvstore-flight-0.json");
    let _ = std::fs::remove_file(&planted);
    std::os::unix::fs::symlink(&target, &planted).expect("a link");
    let cwd = std::env::current_dir().expect("cwd");
    std::env::set_current_dir(&dir).expect("cd");
    let written = kvstore_core::timeline::write_flight(false);
    std::env::set_current_dir(cwd).expect("cd back");
    let written = dir.join(written.expect("the flight record"));
    assert_eq!(written, planted);
    assert!(!std::fs::symlink_metadata(&planted).expect("the record").file_type().is_symlink());
    assert_eq!(mode(&planted), 0o600);
    assert_eq!(std::fs::read(&target).expect("kept"), b"kept");
    let doc: Value = serde_json::from_slice(&std::fs::read(&planted).expect("the record")).expect("JSON");
    assert_eq!(doc["otherData"]["flight_recorder"], true, "{}", doc["otherData"]);
    for p in [target, link, trace] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A row-sparse table on owners under `dist_sync`: a push writes `rows to owners` and a
/// `row_sparse_pull` `rows from owners`, each with the rows and bytes its worker sent
/// the others and the bytes it received (a table of 1000 x 8 f32, whole on rank 0),
/// which its stats count too.
#[test]
fn rows_to_and_from_their_owners_are_events_with_their_bytes() {
    let _turn = turn();
    let path = temp("rows");
    kvstore_core::timeline::start(&path).expect("start");
    let wire = run_workers(2, |rank, kv| {
        let zeros = kvstore_core::RowSparse::zeros(&[1000, 8], kvstore_core::DType::F32).expect("zeros");
        kv.init_row_sparse("emb", &zeros).expect("init");
        let rows = if rank == 1 { vec![5, 6] } else { vec![] };
        let data = NDArray::ones(&[rows.len(), 8]).expect("data");
        let g = kvstore_core::RowSparse::new(data, rows, &[1000, 8]).expect("rows");
        kv.push_row_sparse("emb", &[g], 0).expect("push");
        let ids: &[i64] = if rank == 1 { &[5, 999] } else { &[1] };
        kv.row_sparse_pull("emb", ids, 0).expect("pull");
        let s = kv.stats();
        (s.wire_bytes_sent, s.wire_bytes_received)
    });
    // The same bytes in each worker's stats.
    assert_eq!(wire, vec![(8 + 64, 88 + 16), (88 + 16, 8 + 64)]);
    kvstore_core::timeline::stop().expect("stop");
    let events = events(&path);
    let _ = std::fs::remove_file(&path);
    let args = |name: &str| -> Vec<(u64, u64, u64)> {
        let mut got: Vec<(u64, u64, u64)> = events
            .iter()
            .filter(|e| e["name"] == name && e["ph"] == "X")
            .map(|e| {
                let a = &e["args"];
                (
                    a["rows"].as_u64().expect("rows"),
                    a["bytes"].as_u64().expect("bytes"),
                    a["received_bytes"].as_u64().expect("received"),
                )
            })
            .collect();
        got.sort_unstable();
        got
    };
    // Rank 0 sends rank 1 a count of no rows (8 bytes); rank 1 sends rank 0 its count,
    // 2 ids and 2 rows of 32 bytes (88).
    assert_eq!(args("rows to owners"), vec![(0, 8, 88), (2, 88, 8)]);
    // Rank 1 asks rank 0 for 2 rows (16 bytes of ids) and gets 64 bytes back.
    assert_eq!(args("rows from owners"), vec![(0, 16, 64), (2, 64, 16)]);
}
