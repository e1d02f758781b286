//! Arrays that two stores use, or that a store's own threads touch (updaters, on_done
//! callbacks): the pending writes and the loans belong to the array, so every access
//! waits for a pending out and every write to a lent value copies it first, whatever
//! store or thread makes it; and a wait that could never end is an error, not a hang.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use kvstore_core::{KVStore, Key, NDArray, Pending};
use kvstore_tests::{Gate, gated_assign, open, open_later};

/// Store A, whose key "k" will hold 5 once its gate opens, with a pull of "k" into an
/// array queued behind that push: the array (1s until then) is pending. The gate opens
/// after `ms` milliseconds, from another thread.
struct PendingOut {
    _a: KVStore,
    pushed: Pending,
    pulled: Pending,
    opener: std::thread::JoinHandle<()>,
}

impl PendingOut {
    fn new(x: &NDArray, ms: u64) -> Self {
        let a = KVStore::create("local").unwrap();
        a.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
        let gate = gated_assign(&a);
        let pushed = a.push_async("k", &NDArray::full(&[4], 5.0).unwrap(), 0);
        let pulled = a.pull_async("k", x, 0);
        assert!(x.is_pending());
        PendingOut { _a: a, pushed, pulled, opener: open_later(&gate, ms) }
    }

    /// Waits for store A's calls and the thread that opened its gate.
    fn finish(self) {
        self.pushed.wait().unwrap();
        self.pulled.wait().unwrap();
        self.opener.join().unwrap();
    }
}

/// Store B: a local store whose key "k" holds `value`s.
fn store_b(value: f64) -> KVStore {
    let b = KVStore::create("local").unwrap();
    b.init("k", &NDArray::full(&[4], value).unwrap()).unwrap();
    b
}

fn values(a: &NDArray) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

#[test]
fn another_stores_push_of_a_pending_out_sums_it_after_it_is_written() {
    // Non-blocking push, and pushpull.
    for pushpull in [false, true] {
        let x = NDArray::ones(&[4]).unwrap();
        let a = PendingOut::new(&x, 50);
        let b = store_b(0.0);
        let y = NDArray::zeros(&[4]).unwrap();
        let call = match pushpull {
            false => b.push_async("k", &x, 0),
            true => b.pushpull_async("k", &x, &y, 0),
        };
        call.wait().unwrap();
        assert_eq!(values(&b.pull_new("k", 0).unwrap()), vec![5.0; 4], "pushpull: {pushpull}");
        if pushpull {
            assert_eq!(values(&y), vec![5.0; 4]);
        }
        a.finish();
    }
}

#[test]
fn a_blocking_push_queued_on_a_busy_store_sums_another_stores_pending_out_after_it_is_written() {
    let x = NDArray::ones(&[4]).unwrap();
    let a = PendingOut::new(&x, 150);
    // B's engine is busy with "k" (until before A's pull is done): the blocking push is
    // queued and runs on B's thread.
    let b = store_b(0.0);
    let b_gate = gated_assign(&b);
    let first = b.push_async("k", &NDArray::full(&[4], 2.0).unwrap(), 0);
    let b_opener = open_later(&b_gate, 50);
    b.push("k", &x, 0).unwrap();
    first.wait().unwrap();
    assert_eq!(values(&b.pull_new("k", 0).unwrap()), vec![5.0; 4]);
    a.finish();
    b_opener.join().unwrap();
}

#[test]
fn pulls_of_two_stores_into_one_array_write_it_in_the_order_they_were_made() {
    let x = NDArray::ones(&[4]).unwrap();
    let a = PendingOut::new(&x, 50);
    let b = store_b(7.0);
    // Made after A's pull: its write comes last.
    let b_pulled = b.pull_async("k", &x, 0);
    b_pulled.wait().unwrap();
    a.finish();
    assert_eq!(values(&x), vec![7.0; 4]);
}

#[test]
fn another_stores_updater_reads_a_pending_out_after_it_is_written() {
    let x = NDArray::ones(&[4]).unwrap();
    let a = PendingOut::new(&x, 50);
    let b = store_b(0.0);
    let (seen_tx, seen) = mpsc::channel();
    let read = x.clone();
    b.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        seen_tx.send(read.to_vec::<f32>()?).unwrap();
        stored.copy_from(merged)
    })
    .unwrap();
    b.push_async("k", &NDArray::ones(&[4]).unwrap(), 0).wait().unwrap();
    assert_eq!(seen.recv().unwrap(), vec![5.0; 4]);
    a.finish();
}

#[test]
fn an_updater_that_writes_an_array_lent_to_a_later_push_copies_it_first() {
    // One engine thread: the push of "b" runs after the push of "a" and its updater.
    let kv = KVStore::builder("local").engine_threads(1).build().unwrap();
    kv.init(["a", "b"].as_slice(), [NDArray::zeros(&[4]).unwrap(), NDArray::zeros(&[4]).unwrap()].as_slice()).unwrap();
    let x = NDArray::ones(&[4]).unwrap();
    let gate: Gate = Arc::default();
    let (g, written) = (Arc::clone(&gate), x.clone());
    kv.set_updater(move |key: &Key, _, merged: &NDArray, stored: &NDArray| {
        if key.as_str() == "a" {
            kvstore_tests::wait_at(&g);
            written.copy_from(&NDArray::full(&[4], 100.0)?)?;
        }
        stored.copy_from(merged)
    })
    .unwrap();
    let first = kv.push_async("a", &NDArray::ones(&[4]).unwrap(), 0);
    // Lent while the updater waits at the gate: the push sums the 1s it holds now.
    let second = kv.push_async("b", &x, 0);
    open(&gate);
    first.wait().unwrap();
    second.wait().unwrap();
    assert_eq!(values(&kv.pull_new("b", 0).unwrap()), vec![1.0; 4]);
    assert_eq!(values(&x), vec![100.0; 4]);
}

#[test]
fn an_updater_that_writes_the_value_its_own_push_reads_does_not_wait_for_itself() {
    let kv = KVStore::create("local").unwrap();
    kv.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let x = NDArray::ones(&[4]).unwrap();
    let written = x.clone();
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        written.add_assign(1.0)?;
        stored.copy_from(merged)
    })
    .unwrap();
    match kv.push_async("k", &x, 0).wait_timeout(Duration::from_secs(20)) {
        Ok(r) => r.unwrap(),
        Err(_) => panic!("the push waited for its own updater's write"),
    }
    assert_eq!(values(&kv.pull_new("k", 0).unwrap()), vec![1.0; 4]);
    assert_eq!(values(&x), vec![2.0; 4]);
}

#[test]
fn an_updater_that_would_wait_for_its_own_stores_later_call_gets_an_error_not_a_hang() {
    // A's updater pushes `x` to B while a later call of A (queued behind the one that
    // runs the updater, on the same key) will write `x`: waiting for it would never end.
    let a = KVStore::builder("local").engine_threads(1).build().unwrap();
    a.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let b = Arc::new(KVStore::create("local").unwrap());
    b.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let x = NDArray::ones(&[4]).unwrap();
    let gate: Gate = Arc::default();
    let (g, b2, x2) = (Arc::clone(&gate), Arc::clone(&b), x.clone());
    let (result_tx, result) = mpsc::channel();
    a.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        kvstore_tests::wait_at(&g);
        result_tx.send(b2.push_async("k", &x2, 0).wait()).unwrap();
        stored.copy_from(merged)
    })
    .unwrap();
    let pushed = a.push_async("k", &NDArray::ones(&[4]).unwrap(), 0);
    let pulled = a.pull_async("k", &x, 0);
    open(&gate);
    let Ok(r) = result.recv_timeout(Duration::from_secs(20)) else {
        // Dropping the stores would wait for the hung call.
        std::mem::forget((a, b, pushed, pulled));
        panic!("the updater hung");
    };
    let err = r.unwrap_err();
    assert!(err.to_string().contains("would wait for ever"), "{err}");
    pushed.wait().unwrap();
    pulled.wait().unwrap();
    assert_eq!(values(&b.pull_new("k", 0).unwrap()), vec![0.0; 4], "the failed push changed B");
}

#[test]
fn an_on_done_callback_that_makes_a_blocking_call_its_store_must_queue_gets_an_error() {
    let kv = Arc::new(KVStore::create("local").unwrap());
    kv.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let gate = gated_assign(&kv);
    let pushed = kv.push_async("k", &NDArray::ones(&[4]).unwrap(), 0);
    let (result_tx, result) = mpsc::channel();
    let kv2 = Arc::clone(&kv);
    pushed.on_done(move |r| {
        r.unwrap();
        // The key is still busy with the call that runs this callback.
        result_tx.send(kv2.push("k", &NDArray::full(&[4], 3.0).unwrap(), 0)).unwrap();
    });
    open(&gate);
    let Ok(r) = result.recv_timeout(Duration::from_secs(20)) else {
        // Dropping the store would wait for the hung call.
        std::mem::forget((kv, pushed));
        panic!("the callback hung");
    };
    let err = r.unwrap_err();
    assert!(err.to_string().contains("would wait for ever"), "{err}");
    drop(pushed);
    kv.wait_all().unwrap();
    assert_eq!(values(&kv.pull_new("k", 0).unwrap()), vec![1.0; 4]);
}

#[test]
fn a_dist_sync_init_that_would_wait_for_ever_is_refused_before_it_is_queued() {
    // B (one engine thread) is held in a gated push. A (`dist_sync`, whose `init`
    // queues behind its earlier calls and waits) runs a push whose updater waits for a
    // push of B: A's thread waits for B's. When B's gated push is done, its `on_done`
    // callback, on B's thread, calls A's `init`: waiting for it would never end (A waits
    // for B). The `init` must fail before it is queued, so that it never happens later
    // behind the caller's back (and a Python caller's arrays, whose references the
    // error releases, are never read afterwards).
    let group = kvstore_tests::ThreadGroup::new(1);
    let a = Arc::new(kvstore_tests::dist_store(&group.member(0)));
    a.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let b = Arc::new(KVStore::builder("local").engine_threads(1).build().unwrap());
    b.init("k", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let gate = gated_assign(&b);
    let b_pushed = b.push_async("k", &NDArray::full(&[4], 5.0).unwrap(), 0);
    let b2 = Arc::clone(&b);
    a.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        b2.push_async("k", &NDArray::full(&[4], 6.0)?, 0).wait()?;
        stored.copy_from(merged)
    })
    .unwrap();
    let a_pushed = a.push_async("k", &NDArray::ones(&[4]).unwrap(), 0);
    let (result_tx, result) = mpsc::channel();
    let a2 = Arc::clone(&a);
    b_pushed.on_done(move |r| {
        r.unwrap();
        result_tx.send(a2.init("new", &NDArray::full(&[4], 7.0).unwrap())).unwrap();
    });
    // A's thread waits for B's second push well before the gate opens.
    std::thread::sleep(Duration::from_millis(200));
    open(&gate);
    let Ok(r) = result.recv_timeout(Duration::from_secs(20)) else {
        std::mem::forget((a, b, a_pushed));
        panic!("the callback hung");
    };
    a_pushed.wait().unwrap();
    a.wait_all().unwrap();
    b.wait_all().unwrap();
    let e = r.unwrap_err();
    assert!(e.to_string().contains("would wait for ever"), "{e}");
    assert!(!a.keys().iter().any(|k| k.as_str() == "new"), "the refused init happened anyway");
}
