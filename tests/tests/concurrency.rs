//! Concurrency: a store shared by threads that push, pull and pushpull at once gives
//! exact totals and never a torn or stale-then-newer-then-older value, and multi-key
//! calls (and `a += b` against `b += a` on arrays) in opposite orders do not deadlock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use kvstore_core::{Context, DType, Error, KVStore, Key, NDArray};

/// `KVStore` (and what crosses threads with it) is `Send + Sync`; this fails to compile
/// otherwise.
const fn assert_send_sync<T: Send + Sync>() {}
const _: () = {
    assert_send_sync::<KVStore>();
    assert_send_sync::<NDArray>();
    assert_send_sync::<Key>();
    assert_send_sync::<Error>();
};

/// The updater that makes pushes accumulate: `stored += merged`.
fn accumulate(_key: &Key, _index: usize, merged: &NDArray, stored: &NDArray) -> kvstore_core::Result<()> {
    stored.add_assign(merged)
}

/// A store with the accumulating updater and `keys` initialised to zeros of `len` f32.
fn accumulating_store(keys: &[String], len: usize) -> kvstore_core::Result<KVStore> {
    let kv = KVStore::create("local")?;
    kv.set_updater(accumulate).expect("install the updater");
    for k in keys {
        kv.init(k.as_str(), &NDArray::zeros(&[len])?)?;
    }
    Ok(kv)
}

/// The one value every element of `a` holds; fails on a torn array (elements that
/// differ) or a value that is not an integer.
fn uniform_integer(a: &NDArray, what: &str) -> f32 {
    let v = a.to_vec::<f32>().expect("host arrays convert");
    let first = v.first().copied().unwrap_or_default();
    assert!(v.iter().all(|&x| x.to_bits() == first.to_bits()), "{what}: torn array: {first} and {:?}", {
        v.iter().find(|&&x| x.to_bits() != first.to_bits())
    });
    assert_eq!(first.fract(), 0.0, "{what}: {first} is not an integer");
    first
}

/// Sends on drop, so that a thread that panics still reports that it ended.
struct Ended(mpsc::Sender<()>);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Runs each body on its own thread; fails the test if they have not all ended within
/// `limit` (a deadlock fails instead of hanging), and re-raises any thread's panic.
fn run_within(limit: Duration, what: &str, bodies: Vec<Box<dyn FnOnce() + Send>>) {
    let (tx, rx) = mpsc::channel();
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let ended = Ended(tx.clone());
            thread::spawn(move || {
                let _ended = ended;
                body();
            })
        })
        .collect();
    drop(tx);
    let deadline = Instant::now() + limit;
    for ended in 0..handles.len() {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => {}
            Err(RecvTimeoutError::Timeout) => {
                panic!("{what}: only {ended} of {} threads ended within {limit:?}: deadlock", handles.len())
            }
            Err(RecvTimeoutError::Disconnected) => unreachable!("every thread reports before its sender drops"),
        }
    }
    for h in handles {
        if let Err(panic) = h.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_store_shared_by_reference_sums_pushes_from_every_thread() {
    let kv = accumulating_store(&["w".to_owned()], 16).expect("store");
    thread::scope(|s| {
        for i in 0..4 {
            let kv = &kv;
            s.spawn(move || {
                let one = NDArray::ones_with(&[16], DType::F32, Context::cpu(i)).expect("array");
                for _ in 0..25 {
                    kv.push("w", &one, 0).expect("push");
                }
            });
        }
    });
    let out = NDArray::zeros(&[16]).expect("array");
    kv.pull("w", &out, 0).expect("pull");
    assert_eq!(uniform_integer(&out, "w"), 100.0);
}

#[test]
fn concurrent_pushes_and_pulls_give_exact_totals_and_no_torn_or_older_reads() {
    const PUSHERS: usize = 8;
    const PUSHES: usize = 100;
    // Big enough that a copy without the key's lock would be seen half-done.
    const LEN: usize = 64 * 1024;
    let private: Vec<String> = (0..PUSHERS).map(|i| format!("private{i}")).collect();
    let keys: Vec<String> = std::iter::once("shared".to_owned()).chain(private.iter().cloned()).collect();
    let kv = accumulating_store(&keys, LEN).expect("store");
    let pushers_done = AtomicUsize::new(0);
    let pulls = AtomicUsize::new(0);
    thread::scope(|s| {
        for (i, mine) in private.iter().enumerate() {
            let (kv, pushers_done) = (&kv, &pushers_done);
            s.spawn(move || {
                let ctx = Context::cpu(i as u32 % 4);
                let one = NDArray::ones_with(&[LEN], DType::F32, ctx).expect("array");
                let half = NDArray::full_with(&[LEN], 0.5, DType::F32, ctx).expect("array");
                let halves = [half.clone(), half];
                let outs = [NDArray::zeros(&[LEN]).expect("array"), NDArray::zeros(&[LEN]).expect("array")];
                for j in 0..PUSHES {
                    match j % 3 {
                        0 => {
                            kv.push("shared", &one, 0).expect("push shared");
                            kv.push(mine.as_str(), &one, 0).expect("push private");
                        }
                        // Two values of 0.5 sum to exactly 1.
                        1 => {
                            kv.push("shared", &halves, 0).expect("push shared halves");
                            kv.push(mine.as_str(), &halves, 0).expect("push private halves");
                        }
                        // A list push that also pulls: the private key is this thread's
                        // alone, so the out holds exactly the pushes so far.
                        _ => {
                            let pair = ["shared", mine.as_str()];
                            kv.pushpull(&pair, &[one.clone(), one.clone()], &outs, 0).expect("pushpull");
                            let shared = uniform_integer(&outs[0], "pushpull out of shared");
                            assert!(shared >= (j + 1) as f32 && shared <= (PUSHERS * PUSHES) as f32, "shared {shared}");
                            assert_eq!(uniform_integer(&outs[1], mine), (j + 1) as f32);
                        }
                    }
                }
                pushers_done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for p in 0..2 {
            let (kv, pushers_done, pulls, private) = (&kv, &pushers_done, &pulls, &private);
            s.spawn(move || {
                let out = NDArray::zeros(&[LEN]).expect("array");
                let pair = [NDArray::zeros(&[LEN]).expect("array"), NDArray::zeros(&[LEN]).expect("array")];
                let mut last_shared = 0.0f32;
                let mut last_private = [0.0f32; PUSHERS];
                let mut turn = p;
                while pushers_done.load(Ordering::SeqCst) < PUSHERS {
                    turn += 1;
                    let k = turn % PUSHERS;
                    kv.pull("shared", &out, 0).expect("pull shared");
                    let shared = uniform_integer(&out, "shared");
                    assert!(shared >= last_shared, "shared went back from {last_shared} to {shared}");
                    assert!(shared <= (PUSHERS * PUSHES) as f32, "shared {shared} is over the total");
                    last_shared = shared;
                    kv.pull(&["shared", private[k].as_str()], &pair, 0).expect("list pull");
                    let shared = uniform_integer(&pair[0], "shared (list pull)");
                    let mine = uniform_integer(&pair[1], &private[k]);
                    assert!(shared >= last_shared, "shared went back from {last_shared} to {shared}");
                    assert!(mine >= last_private[k], "{} went back from {} to {mine}", private[k], last_private[k]);
                    assert!(mine <= PUSHES as f32 && mine <= shared, "{}: {mine} with shared {shared}", private[k]);
                    last_shared = shared;
                    last_private[k] = mine;
                    pulls.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert!(pulls.load(Ordering::SeqCst) > 0, "the pullers never ran while pushes were going on");
    let out = NDArray::zeros(&[LEN]).expect("array");
    kv.pull("shared", &out, 0).expect("pull");
    assert_eq!(uniform_integer(&out, "shared"), (PUSHERS * PUSHES) as f32);
    for k in &private {
        kv.pull(k.as_str(), &out, 0).expect("pull");
        assert_eq!(uniform_integer(&out, k), PUSHES as f32);
    }
}

#[test]
fn assigning_pushes_from_many_threads_are_never_seen_half_written() {
    const PUSHERS: usize = 4;
    const PUSHES: usize = 40;
    // Over 1 MiB: the store writes the sum in chunks across its threads.
    const LEN: usize = 300_000;
    // No updater: each push overwrites the stored value in place with its sum.
    let kv = KVStore::create("local").expect("store");
    kv.init("w", &NDArray::zeros(&[LEN]).expect("array")).expect("init");
    let pushers_done = AtomicUsize::new(0);
    let pulls = AtomicUsize::new(0);
    thread::scope(|s| {
        for i in 0..PUSHERS {
            let (kv, pushers_done) = (&kv, &pushers_done);
            s.spawn(move || {
                // Thread i pushes i + 1, as one array or as two halves.
                let whole = NDArray::full(&[LEN], (i + 1) as f64).expect("array");
                let halves = [whole.div(2.0).expect("div"), whole.div(2.0).expect("div")];
                for j in 0..PUSHES {
                    if j % 2 == 0 {
                        kv.push("w", &whole, 0).expect("push");
                    } else {
                        kv.push("w", &halves, 0).expect("push halves");
                    }
                }
                pushers_done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for _ in 0..2 {
            let (kv, pushers_done, pulls) = (&kv, &pushers_done, &pulls);
            s.spawn(move || {
                let out = NDArray::zeros(&[LEN]).expect("array");
                while pushers_done.load(Ordering::SeqCst) < PUSHERS {
                    kv.pull("w", &out, 0).expect("pull");
                    let v = uniform_integer(&out, "w");
                    assert!((0.0..=PUSHERS as f32).contains(&v), "w holds {v}, which nobody pushed");
                    pulls.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert!(pulls.load(Ordering::SeqCst) > 0, "the pullers never ran while pushes were going on");
    let out = NDArray::zeros(&[LEN]).expect("array");
    kv.pull("w", &out, 0).expect("pull");
    let last = uniform_integer(&out, "w");
    assert!((1.0..=PUSHERS as f32).contains(&last), "w ends at {last}, which nobody pushed");
}

#[test]
fn multi_key_calls_in_opposite_key_orders_do_not_deadlock() {
    const ROUNDS: usize = 1500;
    const LEN: usize = 256;
    let kv = Arc::new(accumulating_store(&["x".to_owned(), "y".to_owned()], LEN).expect("store"));
    let start = Arc::new(Barrier::new(6));
    let one = || NDArray::ones(&[LEN]).expect("array");
    let outs = || [NDArray::zeros(&[LEN]).expect("array"), NDArray::zeros(&[LEN]).expect("array")];
    // Each body adds 1 to both keys per round, except the puller and the initialiser.
    let bodies: Vec<Box<dyn FnOnce() + Send>> = vec![
        Box::new({
            let (kv, start, v) = (Arc::clone(&kv), Arc::clone(&start), [one(), one()]);
            move || {
                start.wait();
                for _ in 0..ROUNDS {
                    kv.push(&["x", "y"], &v, 0).expect("push x, y");
                }
            }
        }),
        Box::new({
            let (kv, start, v) = (Arc::clone(&kv), Arc::clone(&start), [one(), one()]);
            move || {
                start.wait();
                for _ in 0..ROUNDS {
                    kv.push(&["y", "x"], &v, 0).expect("push y, x");
                }
            }
        }),
        Box::new({
            let (kv, start, v, o) = (Arc::clone(&kv), Arc::clone(&start), [one(), one()], outs());
            move || {
                start.wait();
                for _ in 0..ROUNDS {
                    kv.pushpull(&["y", "x"], &v, &o, 0).expect("pushpull y, x");
                }
            }
        }),
        Box::new({
            let (kv, start) = (Arc::clone(&kv), Arc::clone(&start));
            move || {
                start.wait();
                for _ in 0..ROUNDS {
                    let v = [one(), one()];
                    kv.pushpull_in_place(&["x", "y"], &v, 0).expect("pushpull_in_place x, y");
                }
            }
        }),
        Box::new({
            let (kv, start, o) = (Arc::clone(&kv), Arc::clone(&start), outs());
            move || {
                start.wait();
                for _ in 0..ROUNDS {
                    kv.pull(&["y", "x"], &o, 0).expect("pull y, x");
                }
            }
        }),
        // Takes the table's write lock and the updater's while the others hold keys.
        Box::new({
            let (kv, start) = (Arc::clone(&kv), Arc::clone(&start));
            move || {
                start.wait();
                for i in 0..ROUNDS / 10 {
                    kv.init(format!("new{i}"), &one()).expect("init a new key");
                    kv.set_updater(accumulate).expect("install the updater");
                }
            }
        }),
    ];
    run_within(LIMIT, "opposite-order multi-key calls", bodies);
    let [x, y] = outs();
    kv.pull(&["x", "y"], &[x.clone(), y.clone()], 0).expect("pull");
    assert_eq!(uniform_integer(&x, "x"), (4 * ROUNDS) as f32);
    assert_eq!(uniform_integer(&y, "y"), (4 * ROUNDS) as f32);
    assert_eq!(kv.keys().len(), 2 + ROUNDS / 10);
}

#[test]
fn add_assign_in_both_directions_at_once_does_not_deadlock() {
    const ROUNDS: usize = 3000;
    const LEN: usize = 4096;
    let full = |v: f64| NDArray::full_with(&[LEN], v, DType::I64, Context::cpu(0)).expect("array");
    let (a, b) = (full(1.0), full(1.0));
    let (c, d) = (full(2.0), full(3.0));
    let start = Arc::new(Barrier::new(4));
    // Opposite directions on one pair each: `a += b` against `b += a` (i64 wraps, so the
    // values may grow without bound), and `c := d` against `d := c`.
    let pairs = [
        (a.clone(), b.clone(), true),
        (b.clone(), a.clone(), true),
        (c.clone(), d.clone(), false),
        (d.clone(), c.clone(), false),
    ];
    let bodies: Vec<Box<dyn FnOnce() + Send>> = pairs
        .into_iter()
        .map(|(dst, src, add)| -> Box<dyn FnOnce() + Send> {
            let start = Arc::clone(&start);
            Box::new(move || {
                start.wait();
                for _ in 0..ROUNDS {
                    if add {
                        dst.add_assign(&src).expect("add_assign");
                    } else {
                        dst.copy_from(&src).expect("copy_from");
                    }
                }
            })
        })
        .collect();
    run_within(LIMIT, "a += b against b += a", bodies);
    // Each operation saw a whole operand: every array is still uniform.
    for (name, x) in [("a", &a), ("b", &b), ("c", &c), ("d", &d)] {
        let v = x.to_vec::<i64>().expect("host arrays convert");
        assert!(v.iter().all(|&e| e == v[0]), "{name} is torn: {} and {:?}", v[0], v.iter().find(|&&e| e != v[0]));
    }
    let (a0, b0) = (a.to_vec::<i64>().expect("convert")[0], b.to_vec::<i64>().expect("convert")[0]);
    assert!(a0 != 1 && b0 != 1, "the additions did not run: a {a0}, b {b0}");
    let (c0, d0) = (c.to_vec::<i64>().expect("convert")[0], d.to_vec::<i64>().expect("convert")[0]);
    assert!([2, 3].contains(&c0) && [2, 3].contains(&d0), "copies invented a value: c {c0}, d {d0}");
}

/// The call forms the pair test mixes: every blocking and non-blocking store call on
/// one key and one shared array, and a plain array copy between two shared arrays.
#[derive(Clone, Copy, Debug)]
enum Form {
    Push,
    Pull,
    PushPull,
    PushAsync,
    PullAsync,
    PushPullAsync,
    CopyFrom,
}

const FORMS: [Form; 7] =
    [Form::Push, Form::Pull, Form::PushPull, Form::PushAsync, Form::PullAsync, Form::PushPullAsync, Form::CopyFrom];

/// A small deterministic generator (xorshift), one per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Six threads on one store (4 keys of 64 f32) and 16 arrays they share, each making
/// random calls of the two forms `pair` for `length`; fails if they have not all ended
/// within the limit (a deadlock), and checks every key and array is whole afterwards.
fn mix_two_forms(pair: (Form, Form), updater: bool, length: Duration) {
    const KEYS: usize = 4;
    const ARRAYS: usize = 16;
    const LEN: usize = 64;
    let kv = KVStore::create("local").expect("store");
    if updater {
        kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| stored.copy_from(merged)).expect("updater");
    }
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    for k in &keys {
        kv.init(k.as_str(), &NDArray::full(&[LEN], 1.0).expect("array")).expect("init");
    }
    let arrays: Arc<Vec<NDArray>> = Arc::new((0..ARRAYS).map(|_| NDArray::full(&[LEN], 1.0).expect("array")).collect());
    let (kv, keys) = (Arc::new(kv), Arc::new(keys));
    let start = Arc::new(Barrier::new(6));
    let bodies: Vec<Box<dyn FnOnce() + Send>> = (0..6u64)
        .map(|t| -> Box<dyn FnOnce() + Send> {
            let (kv, keys, arrays, start) =
                (Arc::clone(&kv), Arc::clone(&keys), Arc::clone(&arrays), Arc::clone(&start));
            Box::new(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x1234_5678));
                let mut pending = std::collections::VecDeque::new();
                start.wait();
                let end = Instant::now() + length;
                while Instant::now() < end {
                    let form = if rng.below(2) == 0 { pair.0 } else { pair.1 };
                    let key = keys[rng.below(KEYS)].as_str();
                    let (x, y) = (&arrays[rng.below(ARRAYS)], &arrays[rng.below(ARRAYS)]);
                    match form {
                        Form::Push => kv.push(key, x, 0).expect("push"),
                        Form::Pull => kv.pull(key, x, 0).expect("pull"),
                        Form::PushPull => kv.pushpull(key, x, y, 0).expect("pushpull"),
                        Form::PushAsync => pending.push_back(kv.push_async(key, x, 0)),
                        Form::PullAsync => pending.push_back(kv.pull_async(key, x, 0)),
                        Form::PushPullAsync => pending.push_back(kv.pushpull_async(key, x, y, 0)),
                        Form::CopyFrom => x.copy_from(y).expect("copy_from"),
                    }
                    while pending.len() > 8 {
                        pending.pop_front().expect("a handle").wait().expect("a non-blocking call");
                    }
                }
                for p in pending {
                    p.wait().expect("a non-blocking call");
                }
            })
        })
        .collect();
    run_within(Duration::from_secs(30), &format!("{pair:?} (updater: {updater})"), bodies);
    kv.wait_all().expect("wait_all");
    // Every value in play is 1.0 (pushes of one array assign it): nothing torn or invented.
    for (i, a) in arrays.iter().enumerate() {
        assert_eq!(uniform_integer(a, &format!("array {i}")), 1.0, "{pair:?}: array {i}");
    }
    for k in keys.iter() {
        assert_eq!(uniform_integer(&kv.pull_new(k.as_str(), 0).expect("pull"), k), 1.0, "{pair:?}: key {k}");
    }
}

/// Every pair of call forms (blocking and non-blocking push, pull and pushpull, and an
/// array copy) from six threads on shared arrays: no pair deadlocks. A blocking call that
/// ran at once held its keys' locks while it waited for a pull queued after it, which
/// needed those locks.
#[test]
fn every_pair_of_call_forms_on_shared_arrays_runs_without_deadlock() {
    for updater in [false, true] {
        for (i, &a) in FORMS.iter().enumerate() {
            for &b in &FORMS[i..] {
                mix_two_forms((a, b), updater, Duration::from_millis(150));
            }
        }
    }
}

/// A blocking call that runs at once, whose updater reads an array this thread's earlier
/// non-blocking pull writes, reads what the pull wrote: the pull was made first. (A
/// call running at once skipped its engine's pending writes, those made before it too.)
#[test]
fn an_updater_of_a_call_run_at_once_reads_what_an_earlier_pull_wrote() {
    const N: usize = 1 << 18;
    for round in 0..30 {
        let kv = KVStore::create("local").expect("store");
        let x = NDArray::zeros(&[N]).expect("x");
        let read = x.clone();
        kv.set_updater(move |k: &Key, _, merged: &NDArray, stored: &NDArray| match k.as_str() {
            "b" => stored.copy_from(&read),
            _ => stored.copy_from(merged),
        })
        .expect("updater");
        kv.init("a", &NDArray::full(&[N], 7.0).expect("a")).expect("init");
        kv.init("b", &NDArray::zeros(&[N]).expect("b")).expect("init");
        let busy = kv.push_async("a", &NDArray::ones(&[N]).expect("ones"), 0);
        let pulled = kv.pull_async("a", &x, 0);
        kv.push("b", &NDArray::zeros(&[N]).expect("zeros"), 0).expect("push");
        busy.wait().expect("push_async");
        pulled.wait().expect("pull_async");
        assert_eq!(kv.pull_new("b", 0).expect("pull").to_vec::<f32>().expect("f32")[N - 1], 1.0, "round {round}");
    }
}

/// A blocking call that runs at once, whose updater writes an array this thread's earlier
/// non-blocking push reads, leaves the push what the array held when it was made.
#[test]
fn an_updater_of_a_call_run_at_once_leaves_an_earlier_push_its_value() {
    const N: usize = 1 << 21;
    for round in 0..30 {
        let kv = KVStore::create("local").expect("store");
        let a = NDArray::ones(&[N]).expect("a");
        let written = a.clone();
        kv.set_updater(move |k: &Key, _, merged: &NDArray, stored: &NDArray| {
            if k.as_str() == "k2" {
                written.copy_from(&NDArray::full(&[N], 2.0)?)?;
            }
            stored.copy_from(merged)
        })
        .expect("updater");
        kv.init("k1", &NDArray::zeros(&[N]).expect("z")).expect("init");
        kv.init("k2", &NDArray::zeros(&[4]).expect("z")).expect("init");
        let pushed = kv.push_async(&["k1", "k1"][..], &[a.clone(), a.clone()][..], 0);
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_micros(100 * (round % 20) as u64) {}
        kv.push("k2", &NDArray::zeros(&[4]).expect("z"), 0).expect("push");
        pushed.wait().expect("push_async");
        assert_eq!(kv.pull_new("k1", 0).expect("pull").to_vec::<f32>().expect("f32")[0], 2.0, "round {round}");
    }
}
