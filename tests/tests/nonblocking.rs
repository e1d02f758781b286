//! The non-blocking API: call order per key from several threads against a reference
//! model, bit-identical results with the blocking API, pending outs, errors reported
//! to their own handles, and the store's drop waiting for its queued calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvstore_core::{Context, DType, Error, ErrorKind, KVStore, Key, NDArray, Optimizer, Pending};
use kvstore_tests::{Gate, gated_assign, open, open_later, wait_at};
use proptest::prelude::*;

/// A custom updater that sleeps before assigning: keeps calls queued long enough for a
/// test to look at them while they are.
fn slow_assign(kv: &KVStore, ms: u64) {
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        std::thread::sleep(Duration::from_millis(ms));
        stored.copy_from(merged)
    })
    .unwrap();
}

#[test]
fn a_pull_after_a_push_sees_it_and_its_outs_wait_until_written() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[3]).unwrap()).unwrap();
    // Had the calls blocked, they would have waited out the gate's 10 s.
    let gate = gated_assign(&kv);
    let t0 = Instant::now();
    let pushed = kv.push_async("w", &NDArray::full(&[3], 4.0).unwrap(), 0);
    let out = NDArray::zeros(&[3]).unwrap();
    let pulled = kv.pull_async("w", &out, 0);
    assert!(t0.elapsed() < Duration::from_secs(5), "the calls did not return at once: {:?}", t0.elapsed());
    assert!(!pushed.is_done() && !pulled.is_done());
    assert!(out.is_pending());
    open(&gate);
    // Reading the out waits for the pull, which comes after the push.
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![4.0; 3]);
    assert!(!out.is_pending());
    pushed.wait().unwrap();
    pulled.wait().unwrap();
}

/// Blocking calls that run at once on the caller's thread, with copies big enough to be
/// shared out over the store's threads (256 keys of 64 KiB: the calling thread copies
/// the first while the pool's threads wake, and they take the rest): every array they
/// write or read is ready first, whichever thread copies it. A pull into values lent to queued
/// pushes leaves each push its value; a pull into outs of another store's queued pull
/// writes them after it.
#[test]
fn calls_run_at_once_over_the_pool_respect_loans_and_pending_writes() {
    const N: usize = 16 * 1024;
    const K: u32 = 256;
    let keys: Vec<String> = (0..K).map(|i| format!("k{i}")).collect();
    let stored: Vec<NDArray> = (0..K).map(|i| NDArray::full(&[N], 10.0 + f64::from(i)).unwrap()).collect();
    // Loans: each out is lent to a push queued behind one held at the gate; the
    // updater records what each push summed.
    let kv = KVStore::builder("local").engine_threads(2).build().unwrap();
    kv.init(keys.as_slice(), stored.as_slice()).unwrap();
    kv.init("w", &NDArray::zeros(&[N]).unwrap()).unwrap();
    let gate: Gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let summed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (g, seen) = (Arc::clone(&gate), Arc::clone(&summed));
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        wait_at(&g);
        seen.lock().unwrap().push(merged.to_vec::<f32>()?);
        stored.copy_from(merged)
    })
    .unwrap();
    let outs: Vec<NDArray> = (0..K).map(|i| NDArray::full(&[N], f64::from(i)).unwrap()).collect();
    let mut pushes = vec![kv.push_async("w", &NDArray::full(&[N], 100.0).unwrap(), 0)];
    pushes.extend(outs.iter().map(|o| kv.push_async("w", o, 0)));
    let opened = open_later(&gate, 100);
    kv.pull(keys.as_slice(), outs.as_slice(), 0).unwrap();
    pushes.into_iter().for_each(|p| p.wait().unwrap());
    opened.join().unwrap();
    let summed = summed.lock().unwrap();
    for (i, v) in summed.iter().enumerate() {
        let want = if i == 0 { 100.0 } else { (i - 1) as f32 };
        assert!(v.iter().all(|&x| x == want), "push {i} summed {}, not the {want} it was given", v[0]);
    }
    assert_eq!(summed.len(), K as usize + 1);
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.to_vec::<f32>().unwrap()[N - 1], 10.0 + i as f32);
    }
    // Pending writes: another store's pull into the outs is queued behind its gate.
    let other = KVStore::create("local").unwrap();
    other.init("v", &NDArray::full(&[N], -1.0).unwrap()).unwrap();
    let gate = gated_assign(&other);
    let held = other.push_async("v", &NDArray::full(&[N], -2.0).unwrap(), 0);
    let pulled: Vec<Pending> = outs.iter().map(|o| other.pull_async("v", o, 0)).collect();
    assert!(outs.iter().all(NDArray::is_pending));
    let opened = open_later(&gate, 100);
    // Made after the other store's pulls, so it writes after them.
    kv.pull(keys.as_slice(), outs.as_slice(), 0).unwrap();
    for p in pulled.into_iter().chain([held]) {
        p.wait().unwrap();
    }
    opened.join().unwrap();
    for (i, o) in outs.iter().enumerate() {
        assert!(o.to_vec::<f32>().unwrap().iter().all(|&x| x == 10.0 + i as f32), "out {i} was overwritten");
    }
}

#[test]
fn pushed_arrays_may_be_reused_at_once() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
    slow_assign(&kv, 20);
    let g = NDArray::full(&[2], 1.0).unwrap();
    let mut handles = Vec::new();
    for i in 0..5 {
        g.copy_from(&NDArray::full(&[2], f64::from(i)).unwrap()).unwrap();
        handles.push(kv.push_async("w", &g, 0));
    }
    g.copy_from(&NDArray::full(&[2], 100.0).unwrap()).unwrap();
    handles.into_iter().for_each(|h| h.wait().unwrap());
    // The last push pushed 4, whatever happened to `g` after it returned.
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![4.0; 2]);
}

#[test]
fn a_pushed_array_is_read_before_a_later_pull_writes_it() {
    let kv = KVStore::builder("local").engine_threads(2).build().unwrap();
    kv.init(&["w", "v"], &[NDArray::zeros(&[2]).unwrap(), NDArray::full(&[2], 9.0).unwrap()]).unwrap();
    let gate = gated_assign(&kv);
    let g = NDArray::full(&[2], 1.0).unwrap();
    // The first push is held at the gate, so the second has not read `g` yet when the
    // pull into `g` (of another key, free to run at once) is made: the pull must wait
    // until the push has read it.
    let first = kv.push_async("w", &NDArray::full(&[2], 5.0).unwrap(), 0);
    let pushed = kv.push_async("w", &g, 0);
    let pulled = kv.pull_async("v", &g, 0);
    let opened = open_later(&gate, 50);
    for h in [first, pushed, pulled] {
        h.wait().unwrap();
    }
    opened.join().unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 2]);
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![9.0; 2]);
    // A blocking pull into a value of a queued push runs at once, and leaves the push
    // a copy of the value it was given.
    *gate.0.lock().unwrap() = false;
    g.copy_from(&NDArray::full(&[2], 3.0).unwrap()).unwrap();
    let first = kv.push_async("w", &NDArray::full(&[2], 5.0).unwrap(), 0);
    let pushed = kv.push_async("w", &g, 0);
    let opened = open_later(&gate, 50);
    kv.pull("v", &g, 0).unwrap();
    for h in [first, pushed] {
        h.wait().unwrap();
    }
    opened.join().unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![3.0; 2]);
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![9.0; 2]);
}

#[test]
fn a_pull_of_another_store_into_a_pushed_array_leaves_the_push_its_value() {
    // Two stores, two engines: nothing orders the second store's pull after the first
    // store's push, so the pull reclaims the value the push has not read yet.
    let pushed_to = KVStore::create("local").unwrap();
    pushed_to.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
    let pulled_from = KVStore::create("local").unwrap();
    pulled_from.init("v", &NDArray::full(&[2], 9.0).unwrap()).unwrap();
    let gate = gated_assign(&pushed_to);
    let g = NDArray::full(&[2], 1.0).unwrap();
    let first = pushed_to.push_async("w", &NDArray::full(&[2], 5.0).unwrap(), 0);
    let pushed = pushed_to.push_async("w", &g, 0);
    pulled_from.pull_async("v", &g, 0).wait().unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![9.0; 2]);
    open(&gate);
    first.wait().unwrap();
    pushed.wait().unwrap();
    assert_eq!(pushed_to.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 2]);
}

#[test]
fn a_pending_out_used_as_a_value_is_pushed_after_the_pull_wrote_it() {
    let kv = KVStore::create("local").unwrap();
    kv.init(&["a", "b"], &[NDArray::full(&[2], 7.0).unwrap(), NDArray::zeros(&[2]).unwrap()]).unwrap();
    slow_assign(&kv, 30);
    kv.push_async("a", &NDArray::full(&[2], 9.0).unwrap(), 0).wait().unwrap();
    let buf = NDArray::zeros(&[2]).unwrap();
    kv.push_async("a", &NDArray::full(&[2], 11.0).unwrap(), 0).wait_timeout(Duration::ZERO).ok();
    let pulled = kv.pull_async("a", &buf, 0);
    // Blocking and non-blocking pushes of the pending out both push what the pull wrote.
    kv.push("b", &buf, 0).unwrap();
    assert_eq!(kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap(), vec![11.0; 2]);
    kv.push_async("b", &buf.mul(2.0).unwrap(), 0).wait().unwrap();
    assert_eq!(kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap(), vec![22.0; 2]);
    pulled.wait().unwrap();
}

#[test]
fn a_failing_updater_reports_to_its_own_handle_and_the_key_keeps_its_value() {
    let kv = KVStore::create("local").unwrap();
    kv.init(&["ok", "bad"], &[NDArray::zeros(&[2]).unwrap(), NDArray::full(&[2], 5.0).unwrap()]).unwrap();
    kv.set_updater(|key: &Key, _, merged: &NDArray, stored: &NDArray| {
        if key.as_str() == "bad" {
            return Err(Error::invalid_argument("the updater refuses \"bad\""));
        }
        stored.add_assign(merged)
    })
    .unwrap();
    let before = kv.push_async("ok", &NDArray::ones(&[2]).unwrap(), 0);
    let failing = kv.push_async("bad", &NDArray::ones(&[2]).unwrap(), 0);
    let after = kv.push_async("ok", &NDArray::ones(&[2]).unwrap(), 0);
    assert!(before.wait().is_ok());
    let e = failing.wait().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("refuses"), "{e}");
    assert!(after.wait().is_ok());
    assert_eq!(kv.pull_new("bad", 0).unwrap().to_vec::<f32>().unwrap(), vec![5.0; 2]);
    assert_eq!(kv.pull_new("ok", 0).unwrap().to_vec::<f32>().unwrap(), vec![2.0; 2]);
    // Kept handles report to themselves only: nothing is left for wait_all.
    assert!(kv.wait_all().is_ok());
}

#[test]
fn errors_found_before_queueing_go_to_the_handle_and_change_nothing() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::full(&[2], 1.0).unwrap()).unwrap();
    let out = NDArray::full(&[2], -1.0).unwrap();
    let e = kv.pull_async(&["w", "nope"], &[out.clone(), out.clone()], 0).wait().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::KeyNotInitialized);
    assert!(!out.is_pending());
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![-1.0; 2]);
    let e = kv.push_async("w", &NDArray::zeros(&[3]).unwrap(), 0).wait().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
    let e = kv.push_async(&["w", "w"], &[NDArray::zeros(&[2]).unwrap()], 0).wait().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LengthMismatch);
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 2]);
}

#[test]
fn wait_all_reports_the_errors_of_dropped_handles_in_the_order_they_failed() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
    let gate = gated_assign(&kv);
    drop(kv.push_async("w", &NDArray::ones(&[2]).unwrap(), 0)); // held by the gate
    drop(kv.push_async("w", &NDArray::zeros(&[5]).unwrap(), 0)); // shape: fails when run
    drop(kv.pull_async("missing", &NDArray::zeros(&[2]).unwrap(), 0)); // fails at once
    open(&gate);
    // In the order the calls failed: the pull of a missing key at once, the push when run.
    let first = kv.wait_all().unwrap_err();
    assert_eq!(first.kind(), ErrorKind::KeyNotInitialized, "{first}");
    assert_eq!(kv.wait_all().unwrap_err().kind(), ErrorKind::ShapeMismatch);
    assert!(kv.wait_all().is_ok());
}

#[test]
fn an_updater_may_not_call_its_own_store_even_without_waiting() {
    let kv = Arc::new(KVStore::create("local").unwrap());
    kv.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let (inner, s) = (Arc::downgrade(&kv), Arc::clone(&seen));
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        if let Some(kv) = inner.upgrade() {
            *s.lock().unwrap() = Some(kv.push_async("w", merged, 0).wait().map_err(|e| e.kind()));
        }
        stored.copy_from(merged)
    })
    .unwrap();
    kv.push_async("w", &NDArray::ones(&[2]).unwrap(), 0).wait().unwrap();
    assert_eq!(*seen.lock().unwrap(), Some(Err(ErrorKind::InvalidArgument)));
}

#[test]
fn dropping_the_store_runs_its_queued_calls_first() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        std::thread::sleep(Duration::from_millis(5));
        c.fetch_add(1, Ordering::SeqCst);
        stored.add_assign(merged)
    })
    .unwrap();
    let out = NDArray::zeros(&[2]).unwrap();
    let handles: Vec<Pending> = (0..10).map(|_| kv.push_async("w", &NDArray::ones(&[2]).unwrap(), 0)).collect();
    let pulled = kv.pull_async("w", &out, 0);
    drop(kv);
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![10.0; 2]);
    handles.into_iter().chain([pulled]).for_each(|h| assert!(h.is_done() && h.wait().is_ok()));
}

#[test]
fn priority_never_changes_results() {
    let kv = KVStore::builder("local").engine_threads(2).build().unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let zeros: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(&[4]).unwrap()).collect();
    kv.init(keys.as_slice(), zeros.as_slice()).unwrap();
    slow_assign(&kv, 1);
    for round in 0..5 {
        for (i, k) in keys.iter().enumerate() {
            let v = NDArray::full(&[4], (round * 10 + i) as f64).unwrap();
            drop(kv.push_async(k.as_str(), &v, (i as i32 * 7 + round as i32) % 5 - 2));
        }
    }
    kv.wait_all().unwrap();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap(), vec![(40 + i) as f32; 4]);
    }
}

/// Weights after a short training run with `optimizer` on keys of different sizes,
/// pushed from two devices, pulled after every step: blocking or not.
fn train(optimizer: &str, engine_threads: usize, nonblocking: bool) -> Vec<Vec<u8>> {
    let kv = KVStore::builder("local").engine_threads(engine_threads).build().unwrap();
    let sizes = [1usize, 17, 1024, 70_000, 300_000];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("w{i}")).collect();
    for (k, &n) in keys.iter().zip(&sizes) {
        kv.init(k.as_str(), &kvstore_tests::device_checks::values(n, 7, DType::F32, Context::cpu(0))).unwrap();
    }
    let opt = match optimizer {
        "adam" => Optimizer::builder("adam").param("learning_rate", 0.01).build(),
        _ => Optimizer::builder("sgd").param("learning_rate", 0.1).param("momentum", 0.9).build(),
    };
    kv.set_optimizer(opt.unwrap()).unwrap();
    let outs: Vec<NDArray> = sizes.iter().map(|&n| NDArray::zeros(&[n]).unwrap()).collect();
    for step in 0..4u64 {
        let mut handles = Vec::new();
        // Backward order, one key per call, as a backward pass hands them over.
        for (i, (k, &n)) in keys.iter().zip(&sizes).enumerate().rev() {
            let grads: Vec<NDArray> = (0..2u32)
                .map(|d| {
                    kvstore_tests::device_checks::values(
                        n,
                        step * 31 + i as u64 * 7 + u64::from(d),
                        DType::F32,
                        Context::cpu(d),
                    )
                })
                .collect();
            match nonblocking {
                true => handles.push(kv.pushpull_async(k.as_str(), grads.as_slice(), &outs[i], 0)),
                false => kv.pushpull(k.as_str(), grads.as_slice(), &outs[i], 0).unwrap(),
            }
        }
        handles.into_iter().for_each(|h| h.wait().unwrap());
    }
    outs.iter().map(kvstore_tests::device_checks::bits).collect()
}

#[test]
fn training_gives_the_same_bits_blocking_or_not_on_one_or_two_engine_threads() {
    for optimizer in ["sgd", "adam"] {
        let reference = train(optimizer, 1, false);
        for threads in [1, 2] {
            assert!(train(optimizer, threads, true) == reference, "{optimizer}, {threads} engine threads");
        }
    }
}

/// One call of a random sequence: on key `k` of the thread's own keys.
#[derive(Clone, Debug)]
enum Call {
    Push { k: usize, values: Vec<f32> },
    Pull { k: usize },
    PushPull { k: usize, values: Vec<f32> },
    Wait,
}

fn call() -> impl Strategy<Value = Call> {
    let values = prop::collection::vec(-100i32..100, 1..4).prop_map(|v| v.into_iter().map(|x| x as f32).collect());
    prop_oneof![
        (0..3usize, values.clone()).prop_map(|(k, values)| Call::Push { k, values }),
        (0..3usize).prop_map(|k| Call::Pull { k }),
        (0..3usize, values).prop_map(|(k, values)| Call::PushPull { k, values }),
        Just(Call::Wait),
    ]
}

/// Runs one thread's calls non-blocking on `kv` (keys `t{thread}k{k}`) and checks every
/// pull against the model: the key's value after the calls made before it on the key.
fn run_thread(kv: &KVStore, thread: usize, calls: &[Call]) -> std::result::Result<(), String> {
    let mut model = [0f32; 3];
    let mut pending: Vec<(Pending, NDArray, f32)> = Vec::new();
    let mut unchecked: Vec<Pending> = Vec::new();
    let key = |k: usize| format!("t{thread}k{k}");
    for c in calls {
        match c {
            Call::Push { k, values } | Call::PushPull { k, values } => {
                let arrays: Vec<NDArray> = values.iter().map(|&v| NDArray::full(&[2], f64::from(v)).unwrap()).collect();
                model[*k] = values.iter().sum();
                if let Call::PushPull { .. } = c {
                    let out = NDArray::zeros(&[2]).unwrap();
                    pending.push((kv.pushpull_async(key(*k), arrays.as_slice(), &out, 0), out, model[*k]));
                } else {
                    unchecked.push(kv.push_async(key(*k), arrays.as_slice(), 0));
                }
            }
            Call::Pull { k } => {
                let out = NDArray::zeros(&[2]).unwrap();
                pending.push((kv.pull_async(key(*k), &out, 0), out, model[*k]));
            }
            Call::Wait => {
                for (h, out, want) in pending.drain(..) {
                    h.wait().map_err(|e| e.to_string())?;
                    let got = out.to_vec::<f32>().unwrap();
                    if got != vec![want; 2] {
                        return Err(format!("thread {thread}: pulled {got:?}, the model says {want}"));
                    }
                }
            }
        }
    }
    for (h, out, want) in pending {
        // Read before waiting: the read itself must wait for the pull.
        let got = out.to_vec::<f32>().unwrap();
        h.wait().map_err(|e| e.to_string())?;
        if got != vec![want; 2] {
            return Err(format!("thread {thread}: pulled {got:?}, the model says {want}"));
        }
    }
    unchecked.into_iter().try_for_each(|h| h.wait().map_err(|e| e.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("KVSTORE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random interleavings of non-blocking calls and waits from three threads on one
    /// store agree with the reference model applied in call order per key.
    #[test]
    fn random_nonblocking_calls_from_several_threads_agree_with_the_model(
        threads in prop::collection::vec(prop::collection::vec(call(), 1..30), 3),
        engine_threads in 1usize..4,
        slow in any::<bool>(),
    ) {
        let kv = KVStore::builder("local").engine_threads(engine_threads).build().unwrap();
        for t in 0..threads.len() {
            let keys: Vec<String> = (0..3).map(|k| format!("t{t}k{k}")).collect();
            let zeros: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(&[2]).unwrap()).collect();
            kv.init(keys.as_slice(), zeros.as_slice()).unwrap();
        }
        if slow {
            // Calls stay queued longer, so more of them overlap.
            kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| {
                std::thread::yield_now();
                stored.copy_from(merged)
            }).unwrap();
        }
        let results: Vec<std::result::Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = threads.iter().enumerate().map(|(t, calls)| {
                let kv = &kv;
                s.spawn(move || run_thread(kv, t, calls))
            }).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        }
        prop_assert!(kv.wait_all().is_ok());
    }
}

/// Counts its drops: tells whether what holds it let go.
struct Flag(Arc<AtomicUsize>);

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_finished_calls_handle_does_not_keep_its_store_alive() {
    // A handle shares its call's memory with the engine; once the call ran, what the
    // call worked on (the store among it) is let go even while the handle is kept.
    let dropped = Arc::new(AtomicUsize::new(0));
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let flag = Flag(Arc::clone(&dropped));
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        let _ = &flag;
        stored.copy_from(merged)
    })
    .unwrap();
    let out = NDArray::zeros(&[4]).unwrap();
    let pushed = kv.push_async("w", &NDArray::ones(&[4]).unwrap(), 0);
    let pulled = kv.pull_async("w", &out, 0);
    kv.wait_all().unwrap();
    drop(kv);
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "a finished call's handle kept its store (and updater)");
    assert!(pushed.is_done() && pulled.is_done());
    pushed.wait().unwrap();
    pulled.wait().unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![1.0; 4]);
}

#[test]
fn on_done_leaves_the_handle_to_its_caller_and_takes_the_result_once() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let gate: Gate = Arc::default();
    let held = Arc::clone(&gate);
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        wait_at(&held);
        stored.copy_from(merged)
    })
    .unwrap();
    let pushed = kv.push_async("w", &NDArray::ones(&[4]).unwrap(), 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let dropped = Arc::new(AtomicUsize::new(0));
    let flag = Flag(Arc::clone(&dropped));
    pushed.on_done(move |r| {
        // Dropped before the result is sent: the test then sees the drop.
        drop(flag);
        tx.send(r).unwrap();
    });
    // A second callback gets an error at once; the first keeps the result.
    let (tx2, rx2) = std::sync::mpsc::channel();
    pushed.on_done(move |r| tx2.send(r).unwrap());
    assert_eq!(rx2.recv().unwrap().unwrap_err().kind(), ErrorKind::Internal);
    assert!(!pushed.is_finished());
    open(&gate);
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the callback's closure did not run once");
    assert!(pushed.is_finished() && pushed.is_done());
    // The result went to the callback.
    assert_eq!(pushed.wait().unwrap_err().kind(), ErrorKind::Internal);
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4]);
    // A callback on a finished call runs at once, on this thread.
    let done = kv.push_async("w", &NDArray::full(&[4], 2.0).unwrap(), 0);
    kv.wait_all().unwrap();
    let here = std::thread::current().id();
    let (tx, rx) = std::sync::mpsc::channel();
    done.on_done(move |r| tx.send((r, std::thread::current().id())).unwrap());
    let (r, on) = rx.try_recv().expect("the callback of a finished call did not run at once");
    assert!(r.is_ok() && on == here);
    drop(done);
    kv.wait_all().unwrap();
}

/// A write to a pushed value waits only while the push reads it: once the push made its
/// sums it is done with its values, and its updater (held here at a gate) does not
/// hold them.
#[test]
fn a_write_to_a_pushed_value_waits_for_the_read_not_for_the_updater() {
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let gate: Gate = Arc::default();
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let g = Arc::clone(&gate);
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        entered_tx.send(()).unwrap();
        wait_at(&g);
        stored.copy_from(merged)
    })
    .unwrap();
    let x = NDArray::ones(&[4]).unwrap();
    let pushed = kv.push_async("w", &x, 0);
    entered.recv_timeout(Duration::from_secs(20)).expect("the updater ran");
    let writer = {
        let x = x.clone();
        std::thread::spawn(move || x.add_assign(1.0).unwrap())
    };
    let t0 = Instant::now();
    while !writer.is_finished() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let finished = writer.is_finished();
    open(&gate);
    writer.join().unwrap();
    pushed.wait().unwrap();
    assert!(finished, "the write waited for the push's updater");
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4], "the push summed the write");
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0; 4]);
}

/// `wait_all` (and what waits as it does: a change of optimizer, a checkpoint) waits for
/// the calls made before it, not for those another thread keeps making meanwhile.
#[test]
fn wait_all_waits_for_the_calls_before_it_not_for_a_stream_of_later_ones() {
    let kv = KVStore::builder("local").engine_threads(1).build().unwrap();
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    slow_assign(&kv, 3);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let made = AtomicUsize::new(0);
    std::thread::scope(|s| {
        // Faster than the store runs them: the engine is never idle while this goes on.
        let submitter = s.spawn(|| {
            let t0 = Instant::now();
            while !stop.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
                drop(kv.push_async("w", &NDArray::ones(&[4]).unwrap(), 0));
                made.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        while made.load(Ordering::SeqCst) < 20 {
            std::thread::sleep(Duration::from_millis(1));
        }
        kv.wait_all().unwrap();
        let still_submitting = !submitter.is_finished();
        let optimizer = Optimizer::builder("sgd").build().unwrap();
        kv.set_optimizer(optimizer).unwrap();
        let still_after_set = !submitter.is_finished();
        stop.store(true, Ordering::SeqCst);
        submitter.join().unwrap();
        assert!(still_submitting, "wait_all waited for the stream of calls made after it");
        assert!(still_after_set, "set_optimizer waited for the stream of calls made after it");
    });
    kv.wait_all().unwrap();
}

/// Back-pressure: a non-blocking call waits, when made, while the store has its bound
/// of calls queued, and while copies made for queued calls hold more than their bound;
/// calls made on the store's own threads never wait for it.
#[test]
fn non_blocking_calls_wait_while_too_many_calls_or_copied_bytes_are_queued() {
    const MIB: usize = 1 << 18; // f32s
    // Calls: 8 queued behind a gate, the 9th waits until the gate opens.
    let kv = KVStore::builder("local").engine_threads(1).max_queued_calls(8).build().unwrap();
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let gate = gated_assign(&kv);
    let first: Vec<Pending> = (0..8).map(|_| kv.push_async("w", &NDArray::ones(&[4]).unwrap(), 0)).collect();
    std::thread::scope(|s| {
        let ninth = s.spawn(|| kv.push_async("w", &NDArray::full(&[4], 9.0).unwrap(), 0).wait());
        std::thread::sleep(Duration::from_millis(100));
        assert!(!ninth.is_finished(), "a 9th call was queued beyond the bound of 8");
        open(&gate);
        ninth.join().unwrap().unwrap();
    });
    first.into_iter().try_for_each(Pending::wait).unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![9.0; 4]);

    // Copied bytes: the engine's one thread held by a first push at the gate, each push
    // of "w" behind it has its value written at once (a 1 MiB copy for the push); at
    // 4 MiB the next push waits for the queued ones to run and free theirs.
    let kv = KVStore::builder("local").engine_threads(1).max_copied_bytes(4 << 20).build().unwrap();
    kv.init(["w", "first"].as_slice(), [NDArray::zeros(&[MIB]).unwrap(), NDArray::zeros(&[1]).unwrap()].as_slice())
        .unwrap();
    let gate = gated_assign(&kv);
    let x = NDArray::ones(&[MIB]).unwrap();
    let mut pushed = vec![kv.push_async("first", &NDArray::ones(&[1]).unwrap(), 0)];
    for _ in 0..4 {
        pushed.push(kv.push_async("w", &x, 0));
        x.add_assign(1.0).unwrap(); // copies the value for the push
    }
    std::thread::scope(|s| {
        let fifth = s.spawn(|| kv.push_async("w", &x, 0));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!fifth.is_finished(), "a push was made with 4 MiB of copies queued");
        open(&gate);
        pushed.push(fifth.join().unwrap());
    });
    pushed.into_iter().try_for_each(Pending::wait).unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap()[0], 5.0);

    // From an on_done callback (the store's own thread) a call never waits for the bound.
    let kv = Arc::new(KVStore::builder("local").engine_threads(1).max_queued_calls(1).build().unwrap());
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let kv2 = Arc::clone(&kv);
    let p = kv.push_async("w", &NDArray::ones(&[4]).unwrap(), 0);
    p.on_done(move |_| {
        let more: Vec<Pending> = (0..3).map(|_| kv2.push_async("w", &NDArray::ones(&[4]).unwrap(), 0)).collect();
        tx.send(more.len()).unwrap();
        drop(more);
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)).expect("the callback waited for its own store"), 3);
    drop(p);
    kv.wait_all().unwrap();
}
