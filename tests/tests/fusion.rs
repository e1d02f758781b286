//! Fusion of non-blocking `dist_sync` calls across calls (`kvstore/run/fused.rs`): which
//! calls fuse (counted as the collective operations the workers make), what releases a
//! batch, and that fused calls keep their own results and errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvstore_core::backend::Collective;
use kvstore_core::{ErrorKind, KVStore, NDArray, Pending, Result};
use kvstore_tests::{TempDir, ThreadMember, run_members};

/// A worker that counts its allreduces (each comparison of the workers' calls is one too).
struct Counting {
    member: Arc<ThreadMember>,
    calls: AtomicUsize,
}

impl Collective for Counting {
    fn name(&self) -> &'static str {
        "counting threads"
    }
    fn rank(&self) -> usize {
        self.member.rank()
    }
    fn size(&self) -> usize {
        self.member.size()
    }
    fn barrier(&self) -> Result<()> {
        self.member.barrier()
    }
    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.member.allreduce_sum(pairs)
    }
    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()> {
        self.member.broadcast(arrays, root)
    }
}

/// Runs `worker(rank, store, counter)` on `size` workers whose store fuses at `fuse`
/// bytes (None: the default).
fn run<T: Send + 'static>(
    size: usize,
    fuse: Option<usize>,
    worker: impl Fn(usize, KVStore, &Counting) -> T + Send + Sync + 'static,
) -> Vec<T> {
    run_members(size, move |rank, member| {
        let counting = Arc::new(Counting { member, calls: AtomicUsize::new(0) });
        let group: Arc<dyn Collective> = Arc::clone(&counting) as _;
        let mut builder = KVStore::builder("dist_sync").num_threads(1).collective(group);
        if let Some(bytes) = fuse {
            builder = builder.fuse_calls(bytes);
        }
        worker(rank, builder.build().expect("dist_sync"), &counting)
    })
}

/// The collective operations `f` makes.
fn counted(c: &Counting, f: impl FnOnce()) -> usize {
    let before = c.calls.load(Ordering::SeqCst);
    f();
    c.calls.load(Ordering::SeqCst) - before
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

fn init(kv: &KVStore, n: usize, len: usize) {
    for k in keys(n) {
        kv.init(k.as_str(), &NDArray::zeros(&[len]).expect("zeros")).expect("init");
    }
}

#[test]
fn small_pushpulls_fuse_into_one_comparison_and_one_allreduce_with_the_same_results() {
    let results = run(2, None, |rank, kv, c| {
        init(&kv, 10, 8);
        let outs: Vec<NDArray> = (0..10).map(|_| NDArray::zeros(&[8]).expect("out")).collect();
        let value = |i: usize| NDArray::full(&[8], (i * 10 + rank) as f64).expect("value");
        let fused = counted(c, || {
            let pending: Vec<_> = keys(10)
                .iter()
                .zip(&outs)
                .enumerate()
                .map(|(i, (k, o))| kv.pushpull_async(k.as_str(), &value(i), o, 0))
                .collect();
            pending.into_iter().for_each(|p| p.wait().expect("pushpull_async"));
        });
        let fused_outs: Vec<Vec<f32>> = outs.iter().map(|o| o.to_vec().expect("out")).collect();
        let blocking = counted(c, || {
            for (i, (k, o)) in keys(10).iter().zip(&outs).enumerate() {
                kv.pushpull(k.as_str(), &value(i), o, 0).expect("pushpull");
            }
        });
        let blocking_outs: Vec<Vec<f32>> = outs.iter().map(|o| o.to_vec().expect("out")).collect();
        assert_eq!(fused_outs, blocking_outs);
        assert_eq!(fused_outs[3], vec![61.0; 8], "key 3: 30 + 31");
        (fused, blocking)
    });
    // One comparison and one allreduce for the ten fused calls; two each one by one.
    assert_eq!(results, vec![(2, 20); 2]);
}

#[test]
fn a_batch_is_released_at_its_size_and_a_key_pushed_twice_goes_in_the_next() {
    let results = run(2, Some(1024), |_, kv, c| {
        // 63 f32 = 252 bytes, under a quarter of 1 KiB: the fifth call fills a batch.
        init(&kv, 8, 63);
        let before = c.calls.load(Ordering::SeqCst);
        let mut pending: Vec<_> =
            keys(8)[..5].iter().map(|k| kv.push_async(k.as_str(), &NDArray::ones(&[63]).unwrap(), 0)).collect();
        // Released when full: it runs with no wait and no other call.
        let start = std::time::Instant::now();
        while c.calls.load(Ordering::SeqCst) - before < 2 && start.elapsed().as_secs() < 20 {
            std::thread::yield_now();
        }
        let full = c.calls.load(Ordering::SeqCst) - before;
        pending.extend(keys(8)[5..].iter().map(|k| kv.push_async(k.as_str(), &NDArray::ones(&[63]).unwrap(), 0)));
        let rest = counted(c, || kv.wait_all().expect("wait_all"));
        pending.into_iter().for_each(|p| p.wait().expect("push_async"));
        // A key pushed twice: the second push starts a new batch, and the sum is the
        // second push's (the default merger assigns), not both pushes' sum.
        let twice = counted(c, || {
            let a = kv.push_async("k0", &NDArray::full(&[63], 2.0).unwrap(), 0);
            let b = kv.push_async("k0", &NDArray::full(&[63], 5.0).unwrap(), 0);
            a.wait().and(b.wait()).expect("pushes");
        });
        (full, rest, twice, kv.pull_new("k0", 0).unwrap().to_vec::<f32>().unwrap()[0])
    });
    assert_eq!(results, vec![(2, 2, 4, 10.0); 2]);
}

#[test]
fn is_finished_leaves_a_held_call_held() {
    run(2, None, |rank, kv, c| {
        init(&kv, 1, 4);
        let before = c.calls.load(Ordering::SeqCst);
        let p = kv.push_async("k0", &NDArray::full(&[4], 1.0 + rank as f64).unwrap(), 0);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Unlike is_done, asking whether it finished does not release the batch.
        assert!(!p.is_finished());
        assert_eq!(c.calls.load(Ordering::SeqCst), before, "is_finished released the batch");
        p.wait().expect("push");
        assert_eq!(kv.pull_new("k0", 0).unwrap().to_vec::<f32>().unwrap(), vec![3.0; 4]);
    });
}

#[test]
fn waits_reads_blocking_calls_and_drops_release_a_batch() {
    run(2, None, |rank, kv, c| {
        init(&kv, 4, 4);
        let r = rank as f64;
        // wait on a held call
        let one = counted(c, || kv.push_async("k0", &NDArray::full(&[4], 1.0 + r).unwrap(), 0).wait().expect("wait"));
        assert_eq!(one, 2);
        // is_done on a held call releases it (it then finishes without another call)
        let p = kv.push_async("k1", &NDArray::full(&[4], 1.0).unwrap(), 0);
        while !p.is_done() {
            std::thread::yield_now();
        }
        p.wait().expect("is_done");
        // a read of a held pull's out
        let out = NDArray::zeros(&[4]).unwrap();
        let p = kv.pushpull_async("k2", &NDArray::full(&[4], 2.0 + r).unwrap(), &out, 0);
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![5.0; 4], "the read waits for the held pushpull");
        p.wait().expect("pushpull");
        // a blocking call after a held push sees it
        drop(kv.push_async("k3", &NDArray::full(&[4], 3.0 + r).unwrap(), 0));
        assert_eq!(kv.pull_new("k3", 0).unwrap().to_vec::<f32>().unwrap(), vec![7.0; 4]);
        // dropping the store runs what it holds
        let out = NDArray::zeros(&[4]).unwrap();
        drop(kv.pushpull_async("k0", &NDArray::full(&[4], 4.0 + r).unwrap(), &out, 0));
        drop(kv);
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![9.0; 4]);
    });
}

#[test]
fn a_refused_call_fails_alone_on_every_worker_and_the_others_of_its_batch_go_on() {
    let results = run(2, None, |rank, kv, c| {
        init(&kv, 3, 4);
        let bad_shape = if rank == 1 { 5 } else { 4 };
        let made = counted(c, || {
            let a = kv.push_async("k0", &NDArray::full(&[4], 1.0).unwrap(), 0);
            let b = kv.push_async("k1", &NDArray::full(&[bad_shape], 1.0).unwrap(), 0);
            let c = kv.push_async("k2", &NDArray::full(&[4], 3.0).unwrap(), 0);
            let (a, b, c) = (a.wait(), b.wait(), c.wait());
            a.expect("k0 goes on");
            c.expect("k2 goes on");
            let e = b.expect_err("k1 fails");
            if rank == 1 {
                assert_eq!(e.kind(), ErrorKind::ShapeMismatch, "{e}");
            } else {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                assert!(e.to_string().contains("rank 1 refused call 2 of 3 fused calls"), "{e}");
            }
        });
        let values: Vec<f32> =
            keys(3).iter().map(|k| kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap()[0]).collect();
        (made, values)
    });
    assert_eq!(results, vec![(2, vec![2.0, 0.0, 6.0]); 2]);
}

/// Pushes keys "k0" and `k` without blocking, then waits for both.
fn two(kv: &KVStore, k: &str) {
    let p = [kv.push_async("k0", &NDArray::ones(&[4]).unwrap(), 0), kv.push_async(k, &NDArray::ones(&[4]).unwrap(), 0)];
    p.into_iter().for_each(|p| p.wait().expect("push"));
}

#[test]
fn calls_with_a_custom_updater_big_keys_or_fusion_off_go_alone() {
    run(2, None, |_, kv, c| {
        init(&kv, 2, 4);
        kv.init("big", &NDArray::zeros(&[65_536]).unwrap()).unwrap();
        // 256 KiB: a quarter of the default 1 MiB goes alone.
        let big = counted(c, || {
            let p = [
                kv.push_async("k0", &NDArray::ones(&[4]).unwrap(), 0),
                kv.push_async("big", &NDArray::ones(&[65_536]).unwrap(), 0),
            ];
            p.into_iter().for_each(|p| p.wait().expect("push"));
        });
        assert_eq!(big, 4);
        kv.set_updater(|_: &kvstore_core::Key, _, g: &NDArray, w: &NDArray| w.copy_from(g)).unwrap();
        // Alone, each call compares, sums (on the key's owner), agrees on the updater's
        // outcome and gets the new value from the owner: four operations of the group
        // each.
        assert_eq!(counted(c, || two(&kv, "k1")), 8, "a custom updater's calls go alone");
        kv.clear_updater().unwrap();
        assert_eq!(counted(c, || two(&kv, "k1")), 2);
    });
    run(2, Some(0), |_, kv, c| {
        init(&kv, 2, 4);
        // Counted from before the calls are made: unfused, the first may run at once.
        assert_eq!(counted(c, || two(&kv, "k1")), 4, "fusion off");
    });
}

#[test]
fn an_optimizer_refusing_one_fused_call_fails_it_alone_and_the_others_go_on() {
    use kvstore_core::{Context, DType, Optimizer};
    let results = run(2, None, |_, kv, c| {
        init(&kv, 3, 4);
        kv.init("int", &NDArray::zeros_with(&[4], DType::I32, Context::cpu(0)).unwrap()).unwrap();
        kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 0.5).build().unwrap()).unwrap();
        let made = counted(c, || {
            let a = kv.push_async("k0", &NDArray::ones(&[4]).unwrap(), 0);
            let b = kv.push_async("int", &NDArray::zeros_with(&[4], DType::I32, Context::cpu(0)).unwrap(), 0);
            let d = kv.push_async("k2", &NDArray::full(&[4], 3.0).unwrap(), 0);
            let (a, b, d) = (a.wait(), b.wait(), d.wait());
            a.expect("k0 goes on");
            d.expect("k2 goes on");
            // The error the same push gets when made blocking.
            assert_eq!(b.expect_err("an int32 key with SGD").kind(), ErrorKind::DTypeMismatch);
        });
        let blocking = kv.push("int", &NDArray::zeros_with(&[4], DType::I32, Context::cpu(0)).unwrap(), 0);
        assert_eq!(blocking.expect_err("blocking").kind(), ErrorKind::DTypeMismatch);
        let values: Vec<f32> =
            ["k0", "k2"].iter().map(|k| kv.pull_new(*k, 0).unwrap().to_vec::<f32>().unwrap()[0]).collect();
        (made, values)
    });
    // One comparison, the sums to the keys' owners and the new values from them; SGD:
    // w = 0 - 0.5 * (sum over 2 workers).
    assert_eq!(results, vec![(3, vec![-1.0, -3.0]); 2]);
}

#[test]
fn a_merger_changed_while_small_pushes_are_made_never_fails_them_internally() {
    // A custom updater (which refuses key k3) swapped in and out while small pushes are
    // made: a batch fused under the default merger may run under the updater; each
    // call then gets its own outcome, as made alone.
    run(1, None, |_, kv, _| {
        init(&kv, 64, 4);
        let (kv, done) = (&kv, &std::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    kv.set_updater(|k: &kvstore_core::Key, _, g: &NDArray, w: &NDArray| match k.as_str() {
                        "k3" => Err(kvstore_core::Error::invalid_argument("k3 refused")),
                        _ => w.copy_from(g),
                    })
                    .unwrap();
                    kv.clear_updater().unwrap();
                }
            });
            let (mut failed, keys) = (Vec::new(), keys(64));
            for round in 0..300 {
                let calls: Vec<_> =
                    keys.iter().map(|k| (k, kv.push_async(k.as_str(), &NDArray::ones(&[4]).unwrap(), 0))).collect();
                failed.extend(calls.into_iter().filter_map(|(k, p)| Some((round, k, p.wait().err()?.to_string()))));
            }
            done.store(true, Ordering::SeqCst);
            let wrong: Vec<_> = failed.iter().filter(|(_, k, e)| *k != "k3" || !e.contains("k3 refused")).collect();
            assert!(
                wrong.is_empty(),
                "{} pushes failed otherwise than refused, first: {:?}",
                wrong.len(),
                wrong.first()
            );
        });
    });
}

#[test]
fn a_call_made_blocking_on_one_worker_and_not_on_another_fails_on_both_at_once() {
    let results = run(2, None, |rank, kv, _| {
        init(&kv, 1, 4);
        kv.init("big", &NDArray::zeros(&[65_536]).unwrap()).unwrap();
        // Over MPI, a non-blocking collective never matches a blocking one: both ranks
        // would wait for ever.
        let big = NDArray::ones(&[65_536]).unwrap();
        let mixed = if rank == 0 { kv.push_async("big", &big, 0).wait() } else { kv.push("big", &big, 0) };
        let e = mixed.expect_err("mixed forms");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // A fused pushpull is named as one, against a fused push of the same key.
        let out = NDArray::zeros(&[4]).unwrap();
        let one = NDArray::ones(&[4]).unwrap();
        let fused = if rank == 0 { kv.pushpull_async("k0", &one, &out, 0) } else { kv.push_async("k0", &one, 0) };
        let f = fused.wait().expect_err("a pushpull against a push");
        // The same calls on both go on.
        kv.pushpull_async("k0", &one, &out, 0).wait().expect("the same calls");
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0; 4]);
        assert_eq!(kv.pull_new("big", 0).unwrap().to_vec::<f32>().unwrap()[0], 0.0, "the failed push changed the key");
        (e.to_string(), f.to_string())
    });
    assert_eq!(results[0], results[1], "the workers' messages differ");
    let (mixed, fused) = &results[0];
    assert!(mixed.contains("rank 0 pushed \"big\" [65536] float32 (non-blocking)"), "{mixed}");
    assert!(mixed.contains("rank 1 pushed \"big\" [65536] float32 (blocking)"), "{mixed}");
    assert!(fused.contains("rank 0 pushpulled \"k0\"") && fused.contains("rank 1 pushed \"k0\""), "{fused}");
}

/// A worker may cut its batches where the others do not: it waits for a held call, its
/// calls use one array twice, or it refuses a call before looking it up (its caller
/// refused the arguments, or the key is not one of the store's). The workers' steps are
/// then cut alike: each call goes on or fails as it would unfused, on every worker, and
/// the next calls stay matched (before, the workers made different numbers of steps,
/// and the last to finish waited for ever).
#[test]
fn a_batch_cut_on_one_worker_is_cut_on_every_worker() {
    for case in ["waits", "shares an array", "refuses its arguments", "names an unknown key"] {
        let results = run(3, None, move |rank, kv, _| {
            init(&kv, 3, 4);
            let g = |v: f64| NDArray::full(&[4], v).unwrap();
            let (one, two, three) = (g(1.0), g(2.0), g(3.0));
            let odd = rank == 2;
            let refusal = kvstore_core::Error::invalid_argument("its caller refused the arguments");
            let first = kv.push_async("k0", &one, 0);
            let (first, waited) = match case {
                "waits" if odd => (None, Some(first.wait())),
                _ => (Some(first), None),
            };
            let second = match case {
                "shares an array" if odd => kv.push_async("k1", &one, 0),
                "shares an array" => kv.push_async("k1", &g(1.0), 0),
                "refuses its arguments" if odd => kv.push_async("k1", kvstore_core::Values::Refused(&refusal), 0),
                "names an unknown key" if odd => kv.push_async("zz", &two, 0),
                _ => kv.push_async("k1", &two, 0),
            };
            let third = kv.push_async("k2", &three, 0);
            let first = waited.unwrap_or_else(|| first.expect("not waited for").wait());
            let outcomes = vec![first, second.wait(), third.wait()];
            // The next calls are matched.
            kv.push("k2", &three, 0).expect("the next push");
            kv.barrier().expect("the barrier");
            let values: Vec<f32> =
                keys(3).iter().map(|k| kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap()[0]).collect();
            (outcomes.into_iter().map(|r| r.map_err(|e| e.to_string())).collect::<Vec<_>>(), values)
        });
        for (rank, (outcomes, values)) in results.iter().enumerate() {
            assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{case}: rank {rank}: {outcomes:?}");
            match case {
                "waits" | "shares an array" => {
                    assert!(outcomes[1].is_ok(), "{case}: rank {rank}: {outcomes:?}");
                    assert_eq!(*values, vec![3.0, if case == "waits" { 6.0 } else { 3.0 }, 9.0], "{case}");
                }
                _ => {
                    let e = outcomes[1].as_ref().expect_err("the refused call fails on every worker");
                    let want = match (rank, case) {
                        (2, "refuses its arguments") => "its caller refused the arguments",
                        (2, _) => "zz",
                        _ => "rank 2 refused the call",
                    };
                    assert!(e.contains(want), "{case}: rank {rank}: {e}");
                    assert_eq!(*values, vec![3.0, 0.0, 9.0], "{case}: the refused push changed a key");
                }
            }
        }
    }
}

/// A call of a batch cut into several steps is done once its own step has run, not the
/// batch's last: workers that wait for a call where the others do not may meet outside
/// the store (here at a barrier of their own) before their next calls. Before, the
/// worker whose batch held the next call waited for it, and neither reached the
/// barrier.
#[test]
fn a_call_of_a_cut_batch_is_done_once_its_own_step_has_run() {
    let outside = Arc::new(std::sync::Barrier::new(2));
    let results = run(2, None, move |rank, kv, _| {
        init(&kv, 2, 4);
        let (one, two) = (NDArray::ones(&[4]).unwrap(), NDArray::full(&[4], 2.0).unwrap());
        let first = kv.push_async("k0", &one, 0);
        if rank == 0 {
            first.wait().expect("k0, alone in its batch");
            outside.wait();
            kv.push_async("k1", &two, 0).wait().expect("k1");
        } else {
            let second = kv.push_async("k1", &two, 0);
            first.wait().expect("k0, cut from its batch");
            outside.wait();
            second.wait().expect("k1");
        }
        keys(2).iter().map(|k| kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap()[0]).collect::<Vec<_>>()
    });
    assert_eq!(results, vec![vec![2.0, 4.0]; 2]);
}

/// Where the workers' batches are cut in different places and a step's calls then
/// differ, that step's calls fail on every worker, saying what each called, and the
/// calls after it go on.
#[test]
fn calls_that_differ_in_a_cut_step_fail_alone_on_every_worker() {
    let results = run(2, None, |rank, kv, _| {
        init(&kv, 3, 4);
        // (Arrays of their own: calls that share one are not fused.)
        let (one, other) = (NDArray::ones(&[4]).unwrap(), NDArray::ones(&[4]).unwrap());
        let first = kv.push_async("k0", &one, 0);
        let (first, waited) = if rank == 0 { (None, Some(first.wait())) } else { (Some(first), None) };
        let second = kv.push_async(if rank == 0 { "k1" } else { "k2" }, &other, 0);
        let first = waited.unwrap_or_else(|| first.expect("not waited for").wait());
        let second = second.wait();
        kv.push("k0", &one, 0).expect("the next push");
        let values: Vec<f32> =
            keys(3).iter().map(|k| kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap()[0]).collect();
        (first.is_ok(), second.map_err(|e| e.to_string()), values)
    });
    assert_eq!(results[0].1, results[1].1, "the workers' messages differ");
    let (first, second, values) = &results[0];
    assert!(first, "the first call, the same on both, failed");
    let e = second.as_ref().expect_err("calls of other keys");
    assert!(e.contains("the workers' calls differ") && e.contains("rank 0 pushed \"k1\""), "{e}");
    assert_eq!(*values, vec![2.0, 0.0, 0.0], "the differing calls changed a key");
    assert_eq!(results[1].2, *values);
}

/// A worker whose allreduces of big arrays take 300 ms: keeps a big call running while
/// a test makes the next calls.
struct SlowBig(Arc<ThreadMember>);

impl Collective for SlowBig {
    fn name(&self) -> &'static str {
        "slow threads"
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn barrier(&self) -> Result<()> {
        self.0.barrier()
    }
    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()> {
        if pairs.iter().any(|(a, _)| a.size() >= 65_536) {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        self.0.allreduce_sum(pairs)
    }
    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()> {
        self.0.broadcast(arrays, root)
    }
}

/// Back-pressure only delays calls: a worker that waits for its bound of copied bytes
/// makes the same batches as one that does not (releasing a held batch there would
/// depend on timing, and the workers' batches would differ).
#[test]
fn back_pressure_never_changes_which_calls_fuse() {
    let results = run_members(2, |rank, member| {
        let group: Arc<dyn Collective> = Arc::new(SlowBig(member));
        let mut builder = KVStore::builder("dist_sync").num_threads(1).collective(group);
        if rank == 0 {
            builder = builder.max_copied_bytes(64 << 10);
        }
        let kv = builder.build().expect("dist_sync");
        init(&kv, 2, 4);
        for k in ["big", "big2"] {
            kv.init(k, &NDArray::zeros(&[65_536]).unwrap()).unwrap();
        }
        // A big push runs (300 ms), a second waits behind it with its value lent; a
        // small push is held for fusion; then the second's value is written (a 256 KiB
        // copy): on rank 0 the next small push waits for the copies to be freed.
        let big = kv.push_async("big", &NDArray::ones(&[65_536]).unwrap(), 0);
        let x = NDArray::ones(&[65_536]).unwrap();
        let big2 = kv.push_async("big2", &x, 0);
        let k0 = kv.push_async("k0", &NDArray::ones(&[4]).unwrap(), 0);
        x.add_assign(1.0).unwrap();
        let k1 = kv.push_async("k1", &NDArray::ones(&[4]).unwrap(), 0);
        big.wait().expect("big");
        big2.wait().expect("big2");
        [k0, k1].into_iter().map(|p| p.wait().map_err(|e| e.to_string())).collect::<Vec<_>>()
    });
    assert_eq!(results, vec![vec![Ok(()), Ok(())]; 2]);
}

/// A call that uses an array a held call uses starts a new batch: in a batch every sum
/// comes before any copy, so a value another call of it writes would be summed before
/// that write, and two writes of one out could lose their order.
#[test]
fn fused_calls_that_share_an_array_give_the_unfused_results() {
    let run_with = |fuse: usize| {
        run(2, Some(fuse), |rank, kv, _| {
            init(&kv, 3, 4);
            let a = NDArray::zeros(&[4]).unwrap();
            let g = |v: f64| NDArray::full(&[4], v + rank as f64).unwrap();
            // "k1" pushes what the pushpull of "k0" writes into `a`; "k2" and then "k0"
            // again write `a` (the later write last).
            let calls = [
                kv.pushpull_async("k0", &g(1.0), &a, 0),
                kv.push_async("k1", &a, 0),
                kv.pushpull_async("k2", &g(10.0), &a, 0),
            ];
            calls.into_iter().try_for_each(Pending::wait).unwrap();
            let values: Vec<f32> =
                keys(3).iter().map(|k| kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap()[0]).collect();
            (values, a.to_vec::<f32>().unwrap()[0])
        })
    };
    let (fused, unfused) = (run_with(1 << 20), run_with(0));
    assert_eq!(fused, unfused);
    // k0 = 1 + 2; k1 = its pulled value summed over both workers; a = k2's value last.
    assert_eq!(fused[0], (vec![3.0, 6.0, 21.0], 21.0));
}

/// The fused calls of a batch update their keys call after call, as they would one by
/// one: with NAdam (whose momentum schedule is one product over every update) the bits
/// are those of the calls unfused.
#[test]
fn fused_calls_update_in_the_order_of_the_calls() {
    use kvstore_core::Optimizer;
    let run_with = |fuse: usize| {
        run(2, Some(fuse), |rank, kv, _| {
            init(&kv, 3, 4);
            kv.set_optimizer(Optimizer::builder("nadam").build().unwrap()).unwrap();
            for step in 0..3 {
                // The calls in the other order than the keys' (k2, k1, k0).
                let calls: Vec<Pending> = (0..3)
                    .rev()
                    .map(|k| {
                        let g = NDArray::full(&[4], 0.1 * (1 + k + step + rank) as f64).unwrap();
                        kv.push_async(format!("k{k}").as_str(), &g, 0)
                    })
                    .collect();
                calls.into_iter().try_for_each(Pending::wait).unwrap();
            }
            keys(3)
                .iter()
                .map(|k| kv.pull_new(k.as_str(), 0).unwrap().to_vec::<f32>().unwrap()[0].to_bits())
                .collect::<Vec<u32>>()
        })
    };
    assert_eq!(run_with(1 << 20), run_with(0));
}

/// A callback that panics is ended where it ran: the other calls of its batch finish,
/// and the engine's thread goes on as before (its next calls are described alike on
/// every worker).
#[test]
fn a_panicking_callback_leaves_its_batch_and_the_engine_whole() {
    let results = run(2, None, |rank, kv, _| {
        init(&kv, 3, 4);
        let calls: Vec<Pending> =
            keys(3).iter().map(|k| kv.push_async(k.as_str(), &NDArray::ones(&[4]).unwrap(), 0)).collect();
        if rank == 0 {
            calls[0].on_done(|_| panic!("a callback that panics (expected by the test)"));
        }
        let rest: Vec<Result<()>> = calls.into_iter().skip(1).map(Pending::wait).collect();
        // A blocking call and a barrier after it: the same form on both workers.
        kv.push("k0", &NDArray::ones(&[4]).unwrap(), 0).unwrap();
        kv.barrier().unwrap();
        let reported = kv.wait_all().err().map(|e| e.to_string());
        (rest.iter().all(Result::is_ok), rank == 0 && reported.is_some_and(|e| e.contains("panicked")))
    });
    assert_eq!(results, vec![(true, true), (true, false)]);
}

/// From the engine's own thread (an on_done callback of a dist_sync store, whose group
/// has one engine thread), waiting for another call's result could never end: an error.
#[test]
fn waiting_for_a_call_on_the_engines_own_thread_is_an_error_not_a_hang() {
    run(1, None, |_, kv, _| {
        init(&kv, 2, 4);
        let kv = Arc::new(kv);
        let (tx, rx) = std::sync::mpsc::channel();
        let kv2 = Arc::clone(&kv);
        let first = kv.push_async("k0", &NDArray::ones(&[4]).unwrap(), 0);
        first.on_done(move |_| {
            let r = kv2.push_async("k1", &NDArray::ones(&[4]).unwrap(), 0).wait();
            tx.send(r.map_err(|e| e.to_string())).unwrap();
        });
        // Released from its batch (is_done asks for it), then let go of.
        let _ = first.is_done();
        drop(first);
        let Ok(r) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
            std::mem::forget(kv);
            panic!("the callback hung");
        };
        assert!(r.expect_err("a wait on the engine's own thread").contains("would wait for ever"));
        kv.wait_all().unwrap();
    });
}

/// A blocking call on an idle `dist_sync` engine runs on its caller's thread in the
/// worker's stead (no hand-over); one made while an earlier call is still queued goes
/// behind it, on the engine's thread, as ever.
#[test]
fn a_blocking_call_runs_on_its_callers_thread_unless_an_earlier_call_is_queued() {
    run(1, None, |_, kv, _| {
        init(&kv, 2, 4);
        let log: Arc<std::sync::Mutex<Vec<(String, std::thread::ThreadId)>>> = Arc::default();
        let seen = Arc::clone(&log);
        kv.set_updater(move |key: &kvstore_core::Key, _, merged: &NDArray, stored: &NDArray| {
            if key.to_string() == "k1" {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            seen.lock().unwrap().push((key.to_string(), std::thread::current().id()));
            stored.add_assign(merged)
        })
        .unwrap();
        let me = std::thread::current().id();
        kv.push("k0", &NDArray::ones(&[4]).unwrap(), 0).unwrap();
        assert_eq!(log.lock().unwrap().as_slice(), [("k0".to_string(), me)], "ran on the caller's thread");
        let slow = kv.push_async("k1", &NDArray::ones(&[4]).unwrap(), 0);
        let _ = slow.is_done(); // released from its batch: queued
        kv.push("k0", &NDArray::ones(&[4]).unwrap(), 0).unwrap();
        slow.wait().unwrap();
        let log = log.lock().unwrap();
        let order: Vec<&str> = log.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(order, ["k0", "k1", "k0"], "the blocking call went behind the queued one");
        assert!(log[1].1 != me && log[2].1 == log[1].1, "both ran on the engine's thread: {log:?}");
        assert_eq!(kv.pull_new("k0", 0).unwrap().to_vec::<f32>().unwrap(), vec![2.0; 4]);
    });
}

/// An updater of a blocking call that runs on its caller's thread counts as the
/// engine's: waiting there for a later call of the same engine (another `dist_sync`
/// store of the group, which shares it) is an error, not a hang.
#[test]
fn an_updater_on_the_callers_thread_that_waits_for_its_engine_gets_an_error() {
    run_members(1, |_, member| {
        let build = || KVStore::builder("dist_sync").collective(Arc::clone(&member) as _).build().unwrap();
        let (kv, other) = (Arc::new(build()), Arc::new(build()));
        init(&kv, 1, 4);
        init(&other, 1, 4);
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let o = Arc::clone(&other);
        kv.set_updater(move |_: &kvstore_core::Key, _, merged: &NDArray, stored: &NDArray| {
            let r = o.push_async("k0", &NDArray::ones(&[4]).unwrap(), 0).wait();
            tx.lock().unwrap().send(r.map_err(|e| e.to_string())).unwrap();
            stored.add_assign(merged)
        })
        .unwrap();
        let caller = {
            let kv = Arc::clone(&kv);
            std::thread::spawn(move || kv.push("k0", &NDArray::ones(&[4]).unwrap(), 0))
        };
        let Ok(r) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
            std::mem::forget((kv, other));
            panic!("the updater hung");
        };
        let e = r.expect_err("a wait for the engine from its call");
        assert!(e.contains("would wait for ever"), "{e}");
        caller.join().unwrap().unwrap();
        other.wait_all().unwrap();
        // The updater's non-blocking push ran after the blocking one.
        assert_eq!(other.pull_new("k0", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4]);
    });
}

/// A blocking `dist_sync` call from inside another store's updater fails as it always
/// did (the updater may not wait for that store), whether or not the `dist_sync`
/// engine is idle: it never runs in the worker's stead there, so the workers of a job
/// cannot see it succeed on one and fail on another.
#[test]
fn a_blocking_call_from_another_stores_updater_fails_even_on_an_idle_engine() {
    run(1, None, |_, kv, _| {
        init(&kv, 1, 4);
        let kv = Arc::new(kv);
        let local = KVStore::create("local").unwrap();
        local.init("x", &NDArray::zeros(&[4]).unwrap()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let dist = Arc::clone(&kv);
        local
            .set_updater(move |_: &kvstore_core::Key, _, merged: &NDArray, stored: &NDArray| {
                let r = dist.push("k0", &NDArray::ones(&[4]).unwrap(), 0);
                tx.lock().unwrap().send(r.map_err(|e| e.to_string())).unwrap();
                stored.add_assign(merged)
            })
            .unwrap();
        for _ in 0..3 {
            kv.wait_all().unwrap(); // the dist_sync engine is idle
            local.push("x", &NDArray::ones(&[4]).unwrap(), 0).unwrap();
            let e = rx.recv().unwrap().expect_err("a blocking call from another store's updater");
            assert!(e.contains("from inside an updater of another store"), "{e}");
        }
        assert_eq!(kv.pull_new("k0", 0).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 4], "no push ran");
    });
}

/// What a worker does at one call of a script besides making it.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Act {
    Plain,
    /// Waits for its previous call first (cuts its batch).
    WaitsFirst,
    /// Pushes the previous call's value array, refilled (shares an array: a new batch).
    SharesAnArray,
    /// Reads the previous call's out first (a pushpull's; cuts its batch).
    ReadsAnOut,
    /// Pushes a value of another shape (refused by the batch's checks).
    WrongShape,
    /// Refuses the arguments (`Values::Refused`: a step of its own).
    Refuses,
    /// Names a key never initialised (a step of its own).
    UnknownKey,
}

/// One script of non-blocking calls, the same on every worker but for each worker's
/// acts: the keys of the calls, pushpull or push, and the merger.
#[derive(Clone, Debug)]
struct Script {
    keys: usize,
    calls: Vec<usize>,
    pushpull: bool,
    /// 0: the default merger, 1: SGD with momentum, 2: 2-bit compression.
    merger: u8,
    /// What ends it while calls are held: 0 nothing, 1 a barrier, 2 a checkpoint.
    tail: u8,
}

/// Each worker's outcomes, its keys' values and its outs after `script`, with `acts`.
type Ran = Vec<(Vec<std::result::Result<(), String>>, Vec<f32>, Vec<f32>)>;

fn run_script(script: &Script, acts: Vec<Vec<Act>>, dir: Arc<std::path::PathBuf>) -> Ran {
    let (script, acts) = (Arc::new(script.clone()), Arc::new(acts));
    run(acts.len(), None, move |rank, kv, _| {
        init(&kv, script.keys, 4);
        match script.merger {
            1 => kv
                .set_optimizer(
                    kvstore_core::Optimizer::builder("sgd")
                        .param("learning_rate", 0.5)
                        .param("momentum", 0.9)
                        .build()
                        .unwrap(),
                )
                .unwrap(),
            2 => kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "2")]).unwrap(),
            _ => {}
        }
        let (acts, n) = (&acts[rank], script.calls.len());
        let refusal = kvstore_core::Error::invalid_argument("its caller refused the arguments");
        let outs: Vec<NDArray> = (0..n).map(|_| NDArray::zeros(&[4]).unwrap()).collect();
        let mut pending: Vec<Option<Pending>> = Vec::new();
        let mut outcomes: Vec<Option<Result<()>>> = Vec::new();
        let mut previous: Option<NDArray> = None;
        for (i, &k) in script.calls.iter().enumerate() {
            let fill: Vec<f32> = (0..4).map(|j| ((i + 1) * (rank + 1) + j) as f32 * 0.75).collect();
            match acts[i] {
                Act::WaitsFirst if i > 0 => outcomes[i - 1] = pending[i - 1].take().map(Pending::wait),
                Act::ReadsAnOut if i > 0 && script.pushpull => drop(outs[i - 1].to_vec::<f32>().unwrap()),
                _ => {}
            }
            let value = match (acts[i], previous.take()) {
                (Act::SharesAnArray, Some(p)) if p.shape() == [4] => {
                    p.copy_from(&NDArray::from_vec(&[4], fill).unwrap()).unwrap();
                    p
                }
                (Act::WrongShape, _) => NDArray::full(&[5], 1.0).unwrap(),
                _ => NDArray::from_vec(&[4], fill).unwrap(),
            };
            let key = if acts[i] == Act::UnknownKey { "zz".to_string() } else { format!("k{k}") };
            let values: kvstore_core::Values<'_> = match acts[i] {
                Act::Refuses => kvstore_core::Values::Refused(&refusal),
                _ => (&value).into(),
            };
            pending.push(Some(match script.pushpull {
                true => kv.pushpull_async(key.as_str(), values, &outs[i], 0),
                false => kv.push_async(key.as_str(), values, 0),
            }));
            outcomes.push(None);
            previous = Some(value);
        }
        match script.tail {
            1 => kv.barrier().unwrap(),
            2 => kv.save_checkpoint(dir.join("held.ckpt")).unwrap(),
            _ => {}
        }
        for (i, p) in pending.into_iter().enumerate() {
            if let Some(p) = p {
                outcomes[i] = Some(p.wait());
            }
        }
        kv.barrier().expect("the workers stay matched");
        let values =
            (0..script.keys).flat_map(|k| kv.pull_new(format!("k{k}").as_str(), 0).unwrap().to_vec::<f32>().unwrap());
        let outs = outs.iter().flat_map(|o| o.to_vec::<f32>().unwrap());
        (
            outcomes.into_iter().map(|o| o.unwrap().map_err(|e| e.to_string())).collect(),
            values.collect(),
            outs.collect(),
        )
    })
}

/// Random scripts (2 to 4 workers, keys pushed again, pushpull or push, the default
/// merger, an optimizer or compression, a barrier or checkpoint while calls are held),
/// each run twice: with some calls refused on some workers, and then with the same
/// refusals and every worker cutting its batches in random places besides. Which
/// calls fail, the keys' values (with the optimizer's state and the residuals in them)
/// and the outs are the same, bit for bit, on every worker.
#[test]
fn batches_cut_anywhere_give_the_results_of_uncut_ones() {
    let mut seed: u64 = 987;
    let mut next = |below: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) % below) as usize
    };
    let dir = TempDir::new("fusion-cut-anywhere");
    let dir = Arc::new(dir.dir().to_path_buf());
    for round in 0..60 {
        let (workers, n, keys) = (2 + next(3), 3 + next(24), 2 + next(6));
        let calls = (0..n).map(|_| next(keys as u64)).collect();
        let script = Script { keys, calls, pushpull: next(2) == 0, merger: next(3) as u8, tail: next(3) as u8 };
        let mut refused = vec![vec![Act::Plain; n]; workers];
        for _ in 0..next(3) {
            let (r, i) = (next(workers as u64), next(n as u64));
            refused[r][i] = [Act::WrongShape, Act::Refuses, Act::UnknownKey][next(3)];
        }
        let mut cut = refused.clone();
        for act in cut.iter_mut().flat_map(|acts| acts.iter_mut().skip(1)).filter(|a| **a == Act::Plain) {
            *act = match next(12) {
                0 | 1 => Act::WaitsFirst,
                2 => Act::SharesAnArray,
                3 => Act::ReadsAnOut,
                _ => Act::Plain,
            };
        }
        let want = run_script(&script, refused, Arc::clone(&dir));
        let got = run_script(&script, cut.clone(), Arc::clone(&dir));
        for (r, (got, want)) in got.iter().zip(&want).enumerate() {
            let failed =
                |ran: &Vec<std::result::Result<(), String>>| ran.iter().map(|o| o.is_err()).collect::<Vec<_>>();
            let at = format!("round {round}, rank {r}, {script:?}, acts {cut:?}");
            assert_eq!(failed(&got.0), failed(&want.0), "{at}: outcomes {:?} against {:?}", got.0, want.0);
            assert_eq!(got.1, want.1, "{at}: values");
            assert_eq!(got.2, want.2, "{at}: outs");
        }
    }
}
