//! The `dist_sync` cases (reference §9, case 23), written once as functions of one
//! worker's rank and store; they assert what that worker must see for the store's
//! number of workers W. The thread runner (`tests/tests/dist.rs`) and the MPI runner
//! (`kvstore-mpi/tests/mpi/`) call the same functions.

use kvstore_core::{Context, DType, KVStore, Key, Layout, LrScheduler, NDArray, Optimizer, Result};

use crate::{full, pulled};

const SHAPE: [usize; 2] = [2, 3];

fn triangle(w: usize) -> f64 {
    (w * (w + 1) / 2) as f64
}

fn twice_updater(kv: &KVStore) {
    kv.set_updater(|_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        stored.add_assign(&merged.mul(2.0)?)
    })
    .expect("install the updater");
}

/// Case 23: init takes rank 0's value (10); pushes of rank + 1 sum to W(W+1)/2; the
/// `test` optimizer with rescale 2 (w += 2 * sum) from 0 gives 2s, then 4s.
pub fn case_23_init_push_and_test_optimizer(rank: usize, kv: &KVStore) {
    let w = kv.num_workers();
    assert_eq!((kv.rank(), kv.kind()), (rank, "dist_sync"));
    kv.init("w", &full(&SHAPE, 10.0 + rank as f64, Context::cpu(0))).expect("init");
    assert_eq!(pulled(kv, "w", &SHAPE), vec![10.0; 6], "init takes rank 0's value");
    kv.push("w", &full(&SHAPE, 1.0 + rank as f64, Context::cpu(0)), 0).expect("push");
    assert_eq!(pulled(kv, "w", &SHAPE), vec![triangle(w); 6], "pushes are summed over the workers");
    kv.init("t", &full(&SHAPE, 0.0, Context::cpu(0))).expect("init");
    twice_updater(kv);
    for round in 1..=2 {
        kv.push("t", &full(&SHAPE, 1.0 + rank as f64, Context::cpu(0)), 0).expect("push");
        assert_eq!(pulled(kv, "t", &SHAPE), vec![2.0 * triangle(w) * f64::from(round); 6]);
    }
    kv.clear_updater().expect("install the updater");
}

/// The nightly check: each round every worker pushes rank + 1 to f32, f16 and big
/// keys in one list; with rate 2, after round i every element is 1 + W(W+1) i.
pub fn each_round_every_worker_pushes_rank_plus_one(rank: usize, kv: &KVStore) {
    let w = kv.num_workers();
    let keys = ["a", "b", "big"];
    let shapes: [&[usize]; 3] = [&[2, 3], &[5], &[600, 700]];
    let dtypes = [DType::F32, DType::F16, DType::F32];
    for ((k, s), d) in keys.iter().zip(shapes).zip(dtypes) {
        kv.init(*k, &NDArray::full_with(s, 1.0, d, Context::cpu(0)).expect("v")).expect("init");
    }
    twice_updater(kv);
    for round in 1..=3 {
        let vals: Vec<NDArray> = shapes
            .iter()
            .zip(dtypes)
            .map(|(s, d)| NDArray::full_with(s, (rank + 1) as f64, d, Context::cpu(0)).expect("v"))
            .collect();
        kv.push(&keys, &vals, 0).expect("push");
        let outs: Vec<NDArray> =
            shapes.iter().zip(dtypes).map(|(s, d)| NDArray::zeros_with(s, d, Context::cpu(0)).expect("o")).collect();
        kv.pull(&keys, &outs, 0).expect("pull");
        let expect = 1.0 + 2.0 * triangle(w) * f64::from(round);
        for o in &outs {
            assert!(o.to_f64_vec().expect("r").iter().all(|&x| x == expect), "round {round}: expected {expect}");
        }
    }
    kv.clear_updater().expect("install the updater");
}

/// One SGD step (lr 1) from 1 with pushes rank + 1 gives 1 - W(W+1)/2; then Adam
/// steps; returns the weight's bits, which must be equal on every worker.
pub fn an_optimizer_runs_identically_on_every_worker(rank: usize, kv: &KVStore) -> Vec<u32> {
    let w = kv.num_workers();
    kv.init("o", &full(&SHAPE, 1.0, Context::cpu(0))).expect("init");
    kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 1.0).build().expect("sgd")).expect("set");
    kv.push("o", &full(&SHAPE, (rank + 1) as f64, Context::cpu(0)), 0).expect("push");
    assert_eq!(pulled(kv, "o", &SHAPE), vec![1.0 - triangle(w); 6]);
    let adam = Optimizer::builder("adam").param("learning_rate", 0.01).param("wd", 0.001).build().expect("adam");
    kv.set_optimizer(adam).expect("set");
    for step in 0..5 {
        let g = NDArray::from_vec(&SHAPE, (0..6).map(|i| (i * (rank + 1) + step) as f32 * 0.37).collect()).expect("g");
        kv.push("o", &g, 0).expect("push");
    }
    let out = NDArray::zeros(&SHAPE).expect("out");
    kv.pull("o", &out, 0).expect("pull");
    kv.clear_updater().expect("install the updater");
    out.to_vec::<f32>().expect("r").iter().map(|x| x.to_bits()).collect()
}

/// Training with non-blocking pushpulls (one key per call, in backward order, waited
/// for at the end of each step) gives the bits of the same training with blocking
/// calls: Adam with a schedule, small and big keys (fused and alone across workers),
/// two local values per key. Returns the bits, which must also be equal on every
/// worker.
pub fn nonblocking_training_matches_blocking(rank: usize, kv: &KVStore) -> Vec<u8> {
    let sizes = [3usize, 1000, 5, 300_000];
    let mut runs = Vec::new();
    for mode in ["blocking", "nonblocking"] {
        // A fresh optimizer per run: the schedule counts the updates of every key.
        kv.set_optimizer(scheduled_adam()).expect("set");
        let keys: Vec<String> = (0..sizes.len()).map(|i| format!("{mode}{i}")).collect();
        for (k, &n) in keys.iter().zip(&sizes) {
            kv.init(k.as_str(), &crate::device_checks::values(n, 11, DType::F32, Context::cpu(0))).expect("init");
        }
        let outs: Vec<NDArray> = sizes.iter().map(|&n| NDArray::zeros(&[n]).expect("out")).collect();
        for step in 0..3u64 {
            let mut pending = Vec::new();
            for (i, (k, &n)) in keys.iter().zip(&sizes).enumerate().rev() {
                let grads: Vec<NDArray> = (0..2u64)
                    .map(|d| {
                        let seed = step * 101 + i as u64 * 13 + d * 7 + rank as u64 * 1009;
                        crate::device_checks::values(n, seed, DType::F32, Context::cpu(d as u32))
                    })
                    .collect();
                match mode {
                    "blocking" => kv.pushpull(k.as_str(), grads.as_slice(), &outs[i], 0).expect("pushpull"),
                    _ => pending.push(kv.pushpull_async(k.as_str(), grads.as_slice(), &outs[i], 0)),
                }
            }
            pending.into_iter().for_each(|p| p.wait().expect("pushpull_async"));
        }
        runs.push(outs.iter().flat_map(crate::device_checks::bits).collect::<Vec<u8>>());
    }
    kv.clear_updater().expect("install the updater");
    assert!(runs[0] == runs[1], "rank {rank}: non-blocking training differs from blocking");
    runs.swap_remove(0)
}

/// The optimizers a checkpoint must resume exactly: SGD with momentum (f16 keys with
/// an f32 master copy), and Adam with a schedule.
pub fn checkpoint_optimizers() -> Vec<(&'static str, Optimizer)> {
    let sgd = Optimizer::builder("sgd")
        .param("learning_rate", 0.1)
        .param("momentum", 0.9)
        .param("multi_precision", 1.0)
        .lr_mult("sgd-b", 0.5)
        .build()
        .expect("sgd");
    vec![("sgd", sgd), ("adam", scheduled_adam())]
}

/// Adam with weight decay and a schedule that halves the rate every 2 updates.
pub fn scheduled_adam() -> Optimizer {
    Optimizer::builder("adam")
        .param("learning_rate", 0.01)
        .param("wd", 0.001)
        .lr_scheduler(kvstore_core::LrScheduler::factor(2, 0.5).expect("schedule"))
        .build()
        .expect("adam")
}

/// The keys of a checkpoint case: small and big (alone across workers), f32 and f16,
/// and one first pushed after the checkpoint (its first update must see the
/// schedule where the checkpoint left it).
pub fn checkpoint_keys(name: &str) -> Vec<(String, usize, DType)> {
    [("a", 3, DType::F32), ("b", 1000, DType::F16), ("c", 300_000, DType::F32), ("late", 4, DType::F32)]
        .iter()
        .map(|(k, n, d)| (format!("{name}-{k}"), *n, *d))
        .collect()
}

/// Steps `steps` of training: each key gets one pushpull of two local gradients per
/// worker per step (`grad(step, key, local)`), keys in backward order; a key named
/// `*-late` only from step 3 on. Returns the weights' bits.
pub fn train(
    kv: &KVStore,
    keys: &[(String, usize, DType)],
    steps: std::ops::Range<u64>,
    grad: &dyn Fn(u64, usize, u64) -> NDArray,
) -> Vec<u8> {
    let outs: Vec<NDArray> =
        keys.iter().map(|(_, n, d)| NDArray::zeros_with(&[*n], *d, Context::cpu(0)).expect("out")).collect();
    for step in steps {
        for (i, (k, _, _)) in keys.iter().enumerate().rev().filter(|(_, (k, _, _))| step >= 3 || !k.ends_with("-late"))
        {
            let grads: Vec<NDArray> = (0..2).map(|d| grad(step, i, d)).collect();
            kv.pushpull(k.as_str(), grads.as_slice(), &outs[i], 0).expect("pushpull");
        }
    }
    outs.iter().flat_map(crate::device_checks::bits).collect()
}

/// Resuming is exact: train 3 steps, save a checkpoint, train 2 more (W1); a fresh
/// store of the same job loads the checkpoint and trains the same 2 steps (W2); W1
/// and W2 are byte-identical. For each of [`checkpoint_optimizers`]; every worker
/// calls it with the same `dir`. Returns W1, which must be equal on every worker.
pub fn a_checkpoint_resumes_exactly(
    rank: usize,
    kv: &KVStore,
    fresh: &dyn Fn() -> KVStore,
    dir: &std::path::Path,
) -> Vec<u8> {
    let mut all = Vec::new();
    for (name, opt) in checkpoint_optimizers() {
        let keys = checkpoint_keys(name);
        for (k, n, d) in &keys {
            kv.init(k.as_str(), &crate::device_checks::values(*n, 3, *d, Context::cpu(0))).expect("init");
        }
        kv.set_optimizer(opt).expect("set");
        let grad = |step: u64, key: usize, local: u64| {
            let (_, n, d) = &keys[key];
            let seed = step * 101 + key as u64 * 13 + local * 7 + rank as u64 * 1009;
            crate::device_checks::values(*n, seed, *d, Context::cpu(local as u32)).mul(0.01).expect("grad")
        };
        train(kv, &keys, 0..3, &grad);
        let path = dir.join(format!("{name}.ckpt"));
        kv.save_checkpoint(&path).expect("save_checkpoint");
        let w1 = train(kv, &keys, 3..5, &grad);
        let resumed = fresh();
        if name == "adam" {
            // Keys the store has take the file's values and states; the others
            // are initialised by the load.
            for (k, n, d) in &keys {
                resumed.init(k.as_str(), &NDArray::zeros_with(&[*n], *d, Context::cpu(0)).expect("z")).expect("init");
            }
        }
        resumed.load_checkpoint(&path).expect("load_checkpoint");
        assert_eq!(resumed.optimizer_name(), Some(name));
        let w2 = train(&resumed, &keys, 3..5, &grad);
        assert!(w1 == w2, "rank {rank}: {name}: the resumed run differs from the one that went on");
        all.extend(w1);
    }
    kv.clear_updater().expect("clear");
    all
}

/// Desync detection: when the workers' calls differ (another key, another shape, a
/// skipped call), every worker fails that call with the same message naming each
/// worker's call, and no value changes. With one worker there is nothing to differ.
pub fn workers_whose_calls_differ_all_fail(rank: usize, kv: &KVStore) {
    let w = kv.num_workers();
    kv.init(&["d-a", "d-b"], &[full(&[2], 1.0, Context::cpu(0)), full(&[3], 1.0, Context::cpu(0))]).expect("init");
    let unchanged = |kv: &KVStore| {
        assert_eq!(pulled(kv, "d-a", &[2]), vec![1.0; 2], "rank {rank}: d-a changed");
        assert_eq!(pulled(kv, "d-b", &[3]), vec![1.0; 3], "rank {rank}: d-b changed");
    };
    // The last worker pushes another key.
    let last = rank + 1 == w && w > 1;
    let r = if last {
        kv.push("d-b", &full(&[3], 2.0, Context::cpu(0)), 0)
    } else {
        kv.push("d-a", &full(&[2], 2.0, Context::cpu(0)), 0)
    };
    if w == 1 {
        r.expect("one worker");
        kv.push("d-a", &full(&[2], 1.0, Context::cpu(0)), 0).expect("push");
    } else {
        let e = r.expect_err("the workers pushed different keys");
        assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument, "{e}");
        let m = e.to_string();
        let first = if w == 2 {
            "rank 0".to_string()
        } else {
            format!("ranks {}", (0..w - 1).map(|r| r.to_string()).collect::<Vec<_>>().join(", "))
        };
        let expected = format!(
            "the workers' calls differ: {first} pushed \"d-a\" [2] float32; rank {} pushed \"d-b\" [3] float32; every worker",
            w - 1
        );
        assert!(m.contains(&expected), "rank {rank}: {m}\nexpected: {expected}");
        assert!(m.starts_with("push #"), "{m}");
        unchanged(kv);
        // A value of another shape on one worker: that worker's own error, and the
        // others name it.
        let shape: &[usize] = if last { &[4] } else { &[2] };
        let e = kv.push("d-a", &full(shape, 2.0, Context::cpu(0)), 0).expect_err("another shape");
        if last {
            assert_eq!(e.kind(), kvstore_core::ErrorKind::ShapeMismatch, "{e}");
        } else {
            let m = e.to_string();
            assert!(m.contains(&format!("rank {} pushed \"d-a\" [4] float32, which it refused (", w - 1)), "{m}");
        }
        unchanged(kv);
        // A barrier on one worker against a push on the others.
        let r = if last { kv.barrier() } else { kv.push("d-a", &full(&[2], 2.0, Context::cpu(0)), 0) };
        let m = r.expect_err("a barrier against a push").to_string();
        assert!(m.contains(&format!("rank {} waited at a barrier", w - 1)), "{m}");
        unchanged(kv);
    }
    // The workers agree again: the next call works.
    kv.push("d-b", &full(&[3], 1.0, Context::cpu(0)), 0).expect("push");
    assert_eq!(pulled(kv, "d-b", &[3]), vec![w as f64; 3]);
}

/// A call that one worker's binding refuses before making it (a Java array closed
/// before the call) is made there all the same, with the refusal in its arrays' place
/// (`Values::Refused`, `RowSparsePushes::Refused`): every form of call then fails
/// on every worker as that call (there with the binding's reason, on the others naming
/// that worker's refusal), changes nothing, and the workers' next calls stay matched.
/// Refused in the binding alone, the call would be missing on that worker, whose next
/// call would meet the others' this one.
pub fn a_call_a_binding_refuses_fails_on_every_worker(rank: usize, kv: &KVStore) {
    use kvstore_core::{Error, ErrorKind, RowSparse, RowSparsePushes, Values};
    let w = kv.num_workers();
    let last = rank + 1 == w;
    let disposed = Error::Disposed { what: "NDArray" };
    // The arrays of a call, or on the last worker the binding's refusal of them.
    fn arrays<'x>(refused: Option<&'x Error>, a: &'x NDArray) -> Values<'x> {
        refused.map_or(Values::One(a), Values::Refused)
    }
    let refusal = last.then_some(&disposed);
    let refused = |what: &str, r: Result<()>| {
        let e = r.expect_err(what);
        if last {
            assert_eq!(e.kind(), ErrorKind::Disposed, "rank {rank}: {what}: {e}");
        } else {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "rank {rank}: {what}: {e}");
            let m = e.to_string();
            assert!(m.contains(&format!("rank {} refused", w - 1)), "rank {rank}: {what}: {m}");
            assert!(m.contains("NDArray was used after it was disposed"), "rank {rank}: {what}: {m}");
        }
    };
    let ok = |what: &str, r: Result<()>| r.unwrap_or_else(|e| panic!("rank {rank}: {what} after a refusal: {e}"));
    let one = || full(&[2], 1.0, Context::cpu(0));
    kv.init(&["r-w", "r-e"], &[full(&[2], 0.0, Context::cpu(0)), full(&[3, 2], 0.0, Context::cpu(0))]).expect("init");
    if w > 1 {
        refused("push", kv.push("r-w", arrays(refusal, &one()), 0));
        ok("push", kv.push("r-w", &one(), 0));
        let out = || full(&[2], 0.0, Context::cpu(0));
        refused("pushpull", kv.pushpull("r-w", arrays(refusal, &one()), &out(), 0));
        ok("pushpull", kv.pushpull("r-w", &one(), &out(), 0));
        // (Its outs refused, not its values.)
        refused("pushpull", kv.pushpull("r-w", &one(), arrays(refusal, &out()), 0));
        refused("pushpull_in_place", kv.pushpull_in_place("r-w", arrays(refusal, &one()), 0));
        refused("init", kv.init("r-x", arrays(refusal, &one())));
        refused("broadcast", kv.broadcast("r-y", arrays(refusal, &one()), &out(), 0));
        refused("push_async", kv.push_async("r-w", arrays(refusal, &one()), 0).wait());
        ok("push_async", kv.push_async("r-w", &one(), 0).wait());
        refused("broadcast_async", kv.broadcast_async("r-z", &one(), arrays(refusal, &out()), 0).wait());
        // A pushpull of no values is a pull on every worker, which takes no step: its outs
        // refused on one worker fail it there alone, and the next calls stay matched.
        let none: [NDArray; 0] = [];
        let pulled_only = |what: &str, r: Result<()>| match last {
            true => assert_eq!(r.expect_err(what).kind(), ErrorKind::Disposed, "rank {rank}: {what}"),
            false => ok(what, r),
        };
        pulled_only("pushpull of no values", kv.pushpull("r-w", &none[..], arrays(refusal, &out()), 0));
        pulled_only(
            "pushpull_async of no values",
            kv.pushpull_async("r-w", &none[..], arrays(refusal, &out()), 0).wait(),
        );
        ok("push", kv.push("r-w", &one(), 0));
        let rows = || RowSparse::new(full(&[1, 2], 1.0, Context::cpu(0)), vec![1], &[3, 2]).expect("row-sparse value");
        let pushes = [("r-e".into(), vec![rows()])];
        let sparse = match last {
            true => RowSparsePushes::Refused(&disposed),
            false => RowSparsePushes::Given(&pushes),
        };
        refused("push_row_sparse", kv.push_row_sparse_many(sparse, 0));
        ok("barrier", kv.barrier());
        assert!(!kv.keys().iter().any(|k| ["r-x", "r-y", "r-z"].contains(&k.as_str())), "a refused init");
        assert_eq!(pulled(kv, "r-e", &[3, 2]), vec![0.0; 6], "rank {rank}: a refused row-sparse push");
    }
    // Every push that went through summed one array per worker.
    ok("push", kv.push("r-w", &one(), 0));
    assert_eq!(pulled(kv, "r-w", &[2]), vec![w as f64; 2], "rank {rank}");
}

/// A key's sum across the workers has the same bits whether it travels alone or
/// fused behind other keys (at another place in the buffer, in a buffer large enough
/// that an allreduce may pick another algorithm): the values span many orders of
/// magnitude, so any other order of summing the workers' values changes some bits.
/// Returns the bits, which must also be equal on every worker.
pub fn a_key_sums_alike_alone_and_fused(rank: usize, kv: &KVStore) -> Vec<u8> {
    const N: usize = 1000;
    let value = |n: usize, salt: usize| -> NDArray {
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let mantissa = ((i * 31 + rank * 17 + salt) % 13) as f32 + 0.1;
                let sign = if (i + rank).is_multiple_of(3) { -1.0 } else { 1.0 };
                sign * mantissa * 10f32.powi(((i + 2 * rank) % 5) as i32 * 3 - 6)
            })
            .collect();
        NDArray::from_vec(&[n], v).expect("value")
    };
    let keys = ["alike-alone", "alike-pad", "alike-fused"];
    let sizes = [N, 20_000, N];
    for (k, &n) in keys.iter().zip(&sizes) {
        kv.init(*k, &NDArray::zeros(&[n]).expect("zeros")).expect("init");
    }
    kv.push("alike-alone", &value(N, 0), 0).expect("push alone");
    kv.push(&keys[1..], &[value(sizes[1], 5), value(N, 0)], 0).expect("push fused");
    let alone = kv.pull_new("alike-alone", 0).expect("pull");
    let fused = kv.pull_new("alike-fused", 0).expect("pull");
    let bits = crate::device_checks::bits(&alone);
    assert!(bits == crate::device_checks::bits(&fused), "rank {rank}: a key fused with others got other bits");
    bits
}

/// A big key (4 MB and more: it travels alone, in pieces, each summed by one worker)
/// sums every element as the same values do in small keys fused into buckets: the
/// workers' values span many orders of magnitude, so another order of summing them (a
/// ring's, whose order depends on where an element sits) changes some bits. Returns the
/// bits, which must also be equal on every worker.
pub fn a_big_key_sums_alike_as_small_fused_keys(rank: usize, kv: &KVStore) -> Vec<u8> {
    const N: usize = (1 << 20) + 7;
    const PIECES: usize = 64;
    let values: Vec<f32> = (0..N)
        .map(|i| {
            let mantissa = ((i * 31 + rank * 17) % 13) as f32 + 0.1;
            let sign = if (i + rank).is_multiple_of(3) { -1.0 } else { 1.0 };
            sign * mantissa * 10f32.powi(((i + 2 * rank) % 5) as i32 * 3 - 6)
        })
        .collect();
    let bounds: Vec<usize> = (0..=PIECES).map(|p| N * p / PIECES).collect();
    let small: Vec<String> = (0..PIECES).map(|p| format!("alike-small-{p}")).collect();
    kv.init("alike-big", &NDArray::zeros(&[N]).expect("zeros")).expect("init");
    for (p, k) in small.iter().enumerate() {
        kv.init(k.as_str(), &NDArray::zeros(&[bounds[p + 1] - bounds[p]]).expect("zeros")).expect("init");
    }
    kv.push("alike-big", &NDArray::from_vec(&[N], values.clone()).expect("big"), 0).expect("push big");
    let pieces: Vec<NDArray> = (0..PIECES)
        .map(|p| NDArray::from_vec(&[bounds[p + 1] - bounds[p]], values[bounds[p]..bounds[p + 1]].to_vec()))
        .collect::<kvstore_core::Result<_>>()
        .expect("pieces");
    kv.push(small.as_slice(), pieces.as_slice(), 0).expect("push small");
    let big = kv.pull_new("alike-big", 0).expect("pull").to_vec::<f32>().expect("big");
    let mut fused = Vec::with_capacity(N);
    for k in &small {
        fused.extend(kv.pull_new(k.as_str(), 0).expect("pull").to_vec::<f32>().expect("small"));
    }
    let differ = big.iter().zip(&fused).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differ, 0, "rank {rank}: {differ} elements of the big key got other bits than the same fused");
    big.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

/// A bf16 sum across the workers is made in f32 and rounded to bf16 once, to nearest
/// even: 1 + 2^-8 + 2^-23 (ranks 0, 1 and 2; a sum just above a tie) is 1 + 2^-7, where
/// a rounding through f64 that dropped its low bits gave 1; on 2 workers the tie
/// 1 + 2^-8 is 1. Both signs, with the value pushed in the other order too.
pub fn bf16_sums_across_workers_round_once(rank: usize, kv: &KVStore) {
    let w = kv.num_workers();
    let parts = [1.0f32, 2f32.powi(-8), 2f32.powi(-23)];
    let mine = |k: usize| parts.get(k).copied().unwrap_or(0.0);
    let values = [mine(rank), -mine(rank), mine(w - 1 - rank), 3.0 * mine(rank)];
    let sums: Vec<f32> = (0..values.len())
        .map(|i| (0..w).map(|r| [mine(r), -mine(r), mine(w - 1 - r), 3.0 * mine(r)][i]).fold(0.0f32, |a, x| a + x))
        .collect();
    // The f32 sums rounded to bf16 by hand: to nearest, ties to the even pattern.
    let rounded = |x: f32| {
        let b = x.to_bits();
        f32::from_bits(((b + 0x7fff + ((b >> 16) & 1)) >> 16) << 16)
    };
    let want: Vec<f32> = sums.iter().map(|&x| rounded(x)).collect();
    let pushed = NDArray::from_vec(&[values.len()], values.to_vec()).expect("f32").as_type(DType::BF16).expect("bf16");
    kv.init("bf16-sum", &NDArray::zeros_with(&[values.len()], DType::BF16, Context::cpu(0)).expect("z")).expect("init");
    kv.push("bf16-sum", &pushed, 0).expect("push");
    let got = kv.pull_new("bf16-sum", 0).expect("pull").to_vec::<f32>().expect("f32");
    assert_eq!(got, want, "rank {rank} of {w}: the bf16 sums of {sums:?}");
    if w >= 3 {
        assert_eq!(got[0], 1.0 + 2f32.powi(-7), "just above a tie rounds up");
    }
}

/// Every dtype, string keys, a repeated key with two local values per worker: the
/// local sums (rank + 1 each) are summed across the workers: W(W+1)/2.
pub fn every_dtype_sums_local_then_across_workers(rank: usize, kv: &KVStore) {
    let w = kv.num_workers();
    for (i, d) in DType::ALL.iter().enumerate() {
        let key = format!("key-{d}");
        kv.init(key.as_str(), &NDArray::zeros_with(&[4], *d, Context::cpu(0)).expect("z")).expect("init");
        let v = |x: f64| NDArray::full_with(&[4], x, *d, Context::cpu(i as u32 % 4)).expect("v");
        kv.push(&[key.as_str(), key.as_str()], &[v(rank as f64), v(1.0)], 0).expect("push");
        let o = NDArray::zeros_with(&[4], *d, Context::cpu(0)).expect("o");
        kv.pull(key.as_str(), &o, 0).expect("pull");
        assert_eq!(o.to_f64_vec().expect("r"), vec![triangle(w); 4], "{d}");
    }
}

/// 2-bit gradient compression under dist_sync: each worker pushes two values per key
/// (summed locally first), its sum is quantised with its own residual, and the stored
/// value is the sum over the workers, in rank order, of their quantised sums; keys of
/// lengths that are not multiples of 16, several steps (residuals carried), a list push
/// and a non-blocking one (fused with others). Checked against a model of every
/// worker's residuals; returns the bits every worker must share.
pub fn compressed_pushes_sum_every_workers_quantised_values(rank: usize, kv: &KVStore) -> Vec<u8> {
    const T: f32 = 0.4;
    let workers = kv.num_workers();
    let keys = ["c-a", "c-b", "c-c"];
    let lens = [37usize, 16, 3];
    // Worker w's i-th value of key k at step s.
    let value = |w: usize, s: usize, k: usize, i: usize| -> Vec<f32> {
        (0..lens[k]).map(|j| (((w * 5 + s * 3 + k * 7 + i * 11 + j * 13) % 17) as f32 - 8.0) * 0.07).collect()
    };
    kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.4")]).expect("set_gradient_compression");
    for (k, n) in keys.iter().zip(lens) {
        kv.init(*k, &NDArray::zeros(&[n]).expect("zeros")).expect("init");
    }
    // The model: every worker's residuals, by key.
    let mut residuals: Vec<Vec<Vec<f32>>> =
        (0..workers).map(|_| lens.iter().map(|&n| vec![0.0; n]).collect()).collect();
    let mut bits = Vec::new();
    for s in 0..4 {
        let mine: Vec<Vec<NDArray>> = (0..keys.len())
            .map(|k| (0..2).map(|i| NDArray::from_vec(&[lens[k]], value(rank, s, k, i)).expect("value")).collect())
            .collect();
        if s % 2 == 0 {
            kv.push(&keys[..], &mine, 0).expect("list push");
        } else {
            let pending: Vec<_> = keys.iter().zip(&mine).map(|(k, v)| kv.push_async(*k, &v[..], 0)).collect();
            for p in pending {
                p.wait().expect("non-blocking push");
            }
        }
        for (k, key) in keys.iter().enumerate() {
            let mut want = vec![0.0f32; lens[k]];
            for (w, r) in residuals.iter_mut().enumerate() {
                let local: Vec<f32> = value(w, s, k, 0).iter().zip(value(w, s, k, 1)).map(|(a, b)| a + b).collect();
                for ((x, r), o) in local.iter().zip(r[k].iter_mut()).zip(want.iter_mut()) {
                    *r += x;
                    if *r >= T {
                        *r -= T;
                        *o += T;
                    } else if *r <= -T {
                        *r += T;
                        *o -= T;
                    }
                }
            }
            let got = kv.pull_new(*key, 0).expect("pull");
            assert_eq!(got.to_vec::<f32>().expect("f32"), want, "rank {rank}, step {s}, key {key}");
            bits.extend(crate::device_checks::bits(&got));
        }
    }
    bits
}

/// fp16 and bf16 wire compression under dist_sync: each worker's sum of its two values
/// is rounded once to the 16-bit type, and the stored value is the f32 sum of those, in
/// rank order; checked against that model, the bits returned for comparing workers.
pub fn half_compressed_pushes_round_each_workers_sum_once(rank: usize, kv: &KVStore, kind: &str) -> Vec<u8> {
    let workers = kv.num_workers();
    let round = |x: f32| -> f32 {
        match kind {
            "fp16" => kvstore_core::f16::from_f32(x).to_f32(),
            _ => kvstore_core::bf16::from_f32(x).to_f32(),
        }
    };
    let value = |w: usize, s: usize, i: usize| -> Vec<f32> {
        (0..19)
            .map(|j| (((w * 5 + s * 3 + i * 11 + j * 13) % 17) as f32 - 8.3) * 1.000_123_4f32.powi(j as i32))
            .collect()
    };
    kv.set_gradient_compression(&[("type", kind)]).expect("set_gradient_compression");
    kv.init("h", &NDArray::zeros(&[19]).expect("zeros")).expect("init");
    let mut bits = Vec::new();
    for s in 0..3 {
        let mine: Vec<NDArray> = (0..2).map(|i| NDArray::from_vec(&[19], value(rank, s, i)).expect("value")).collect();
        kv.push("h", &mine[..], 0).expect("push");
        let mut want = vec![0.0f32; 19];
        for w in 0..workers {
            let local: Vec<f32> = value(w, s, 0).iter().zip(value(w, s, 1)).map(|(a, b)| a + b).collect();
            for (o, x) in want.iter_mut().zip(local) {
                *o = if w == 0 { round(x) } else { *o + round(x) };
            }
        }
        let got = kv.pull_new("h", 0).expect("pull");
        assert_eq!(got.to_vec::<f32>().expect("f32"), want, "rank {rank}, step {s}, {kind}");
        bits.extend(crate::device_checks::bits(&got));
    }
    bits
}

/// fp16 and bf16 wire compression of sums beyond the 16-bit type's range: each
/// worker's sum rounds as IEEE rounding does, so a finite sum past the largest finite
/// value (65,504 in fp16) becomes an infinity of its sign (from 65,520 on in fp16; a
/// dynamic loss scaler sees the overflow), inf stays inf and NaN stays NaN, and a key's
/// value, the f32 sum of the workers' rounded sums, may exceed the 16-bit range. The
/// same on every worker: returns the pulled bits, for comparing workers.
pub fn half_compressed_sums_beyond_the_range_become_inf(rank: usize, kv: &KVStore, kind: &str) -> Vec<u8> {
    let workers = kv.num_workers();
    let w = workers as f32;
    // Per column: worker r's two values (their f32 sum crosses the wire), and what the
    // key holds after one push of every worker: a number, or an infinity or NaN.
    type Column = fn(usize) -> (f32, f32);
    let (columns, want): (Vec<Column>, Vec<f32>) = match kind {
        "fp16" => (
            vec![
                |_| (65_504.0, 0.0),                         // the largest finite fp16
                |_| (65_519.0, 0.0),                         // rounds down to it
                |_| (65_520.0, 0.0),                         // rounds up, past it: inf
                |_| (40_000.0, 40_000.0),                    // each finite, their sum not
                |_| (-1.0e6, 0.0),                           // -inf
                |_| (f32::INFINITY, 0.0),                    // inf stays inf
                |_| (f32::NAN, 0.0),                         // NaN stays NaN
                |r| (if r == 0 { 1.0e5 } else { 1.0 }, 0.0), // one worker's overflow
                |_| (60_000.0, 0.0),                         // the workers' f32 sum exceeds 65,504
            ],
            vec![
                w * 65_504.0,
                w * 65_504.0,
                f32::INFINITY,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::INFINITY,
                f32::NAN,
                f32::INFINITY,
                w * 60_000.0,
            ],
        ),
        _ => (
            vec![
                |_| (2f32.powi(123), 0.0), // about 1e37: sums of a few are exact
                |_| (f32::MAX, 0.0),       // rounds up, past bf16's largest finite: inf
                |_| (3.0e38, 3.0e38),      // their f32 sum is already inf
                |_| (-f32::MAX, 0.0),
                |_| (f32::INFINITY, 0.0),
                |_| (f32::NAN, 0.0),
                |r| (if r == 0 { f32::MAX } else { 1.0 }, 0.0),
                |_| (70_000.0, 0.0),
            ],
            vec![
                w * 2f32.powi(123),
                f32::INFINITY,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::INFINITY,
                f32::NAN,
                f32::INFINITY,
                w * 70_144.0,
            ],
        ),
    };
    kv.set_gradient_compression(&[("type", kind)]).expect("set_gradient_compression");
    kv.init("range", &NDArray::zeros(&[columns.len()]).expect("zeros")).expect("init");
    let (a, b): (Vec<f32>, Vec<f32>) = columns.iter().map(|c| c(rank)).unzip();
    let mine = [NDArray::from_vec(&[a.len()], a).expect("a"), NDArray::from_vec(&[b.len()], b).expect("b")];
    kv.push("range", &mine[..], 0).expect("push");
    let got = kv.pull_new("range", 0).expect("pull");
    let values = got.to_vec::<f32>().expect("f32");
    for (j, (g, x)) in values.iter().zip(&want).enumerate() {
        let same = (g.is_nan() && x.is_nan()) || g == x;
        assert!(same, "rank {rank}, {kind}, column {j}: {g}, want {x} ({values:?})");
    }
    crate::device_checks::bits(&got)
}

/// Row-sparse keys under dist_sync: every worker pushes two row-sparse values to each
/// of two keys per step (its own rows, overlapping the others', now and then none),
/// first with no updater (the sum of every worker's rows replaces the value), then
/// with lazy SGD (only the rows some worker pushed change). Values are multiples of
/// 1/4, so every order of summing gives the same numbers: the model is the plain sum.
/// Also: `row_sparse_pull` on every worker, a refused push on one worker failing on
/// all, and the returned bits, which must be equal on every worker.
pub fn row_sparse_pushes_sum_every_workers_rows(rank: usize, kv: &KVStore) -> Vec<u8> {
    use kvstore_core::RowSparse;
    let workers = kv.num_workers();
    let (rows, dim) = (12usize, 3usize);
    let shape = [rows, dim];
    // Worker w's i-th value of key k at step s: some rows (none for one of them now
    // and then), each element a multiple of 1/4.
    let rows_of = |w: usize, s: usize, k: usize, i: usize| -> Vec<i64> {
        if (w + s + k + i) % 5 == 4 {
            return Vec::new();
        }
        (0..rows as i64).filter(|r| (*r as usize * 7 + w * 3 + s + k * 5 + i).is_multiple_of(4)).collect()
    };
    let value = |w: usize, s: usize, k: usize, i: usize| -> RowSparse {
        let ids = rows_of(w, s, k, i);
        let data: Vec<f32> =
            (0..ids.len() * dim).map(|j| (((w * 11 + s * 7 + k * 5 + i * 3 + j) % 9) as f32 - 4.0) * 0.25).collect();
        RowSparse::new(NDArray::from_vec(&[ids.len(), dim], data).expect("data"), ids, &shape).expect("value")
    };
    let keys = ["rsp-a", "rsp-b"];
    let init = RowSparse::from_dense(&full(&shape, 1.0, Context::cpu(0))).expect("init");
    kv.init_row_sparse_many(&[keys[0].into(), keys[1].into()], &[init.clone(), init]).expect("init_row_sparse");
    // The model: every key's value, dense.
    let mut model = vec![vec![1.0f32; rows * dim]; keys.len()];
    let mut bits = Vec::new();
    for s in 0..6 {
        let lazy = s >= 3;
        if s == 3 {
            kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 0.5).build().expect("sgd"))
                .expect("set_optimizer");
        }
        let pushes: Vec<(Key, Vec<RowSparse>)> = keys
            .iter()
            .enumerate()
            .map(|(k, key)| ((*key).into(), (0..2).map(|i| value(rank, s, k, i)).collect()))
            .collect();
        kv.push_row_sparse_many(&pushes, 0).expect("push_row_sparse");
        for (k, key) in keys.iter().enumerate() {
            let mut sum = vec![0.0f32; rows * dim];
            let mut touched = vec![false; rows];
            for w in 0..workers {
                for i in 0..2 {
                    let v = value(w, s, k, i);
                    let d = v.data().to_vec::<f32>().expect("data");
                    for (n, &r) in v.indices().iter().enumerate() {
                        touched[r as usize] = true;
                        for c in 0..dim {
                            sum[r as usize * dim + c] += d[n * dim + c];
                        }
                    }
                }
            }
            for r in 0..rows {
                for c in 0..dim {
                    let x = &mut model[k][r * dim + c];
                    match (lazy, touched[r]) {
                        (false, _) => *x = sum[r * dim + c],
                        (true, true) => *x -= 0.5 * sum[r * dim + c],
                        (true, false) => {}
                    }
                }
            }
            let got = kv.pull_new(*key, 0).expect("pull");
            assert_eq!(got.to_vec::<f32>().expect("f32"), model[k], "rank {rank}, step {s}, key {key}");
            bits.extend(crate::device_checks::bits(&got));
            let pulled = kv.row_sparse_pull(*key, &[11, 0, 5, 0], 0).expect("row_sparse_pull");
            assert_eq!(pulled.indices(), &[0, 5, 11]);
            let want: Vec<f32> =
                [0usize, 5, 11].iter().flat_map(|&r| model[k][r * dim..(r + 1) * dim].to_vec()).collect();
            assert_eq!(pulled.data().to_vec::<f32>().expect("rows"), want, "rank {rank}, step {s}");
        }
    }
    assert_eq!(kv.stype(keys[0]).expect("stype"), kvstore_core::StorageType::RowSparse);
    // A value of another shape on the last worker: refused there, and on every other
    // worker (naming it); no key changes.
    if workers > 1 {
        let last = rank + 1 == workers;
        let bad: &[usize] = if last { &[rows + 1, dim] } else { &shape };
        let v = RowSparse::zeros(bad, DType::F32).expect("zeros");
        let e = kv.push_row_sparse(keys[0], &[v], 0).expect_err("a refused push");
        let m = e.to_string();
        if last {
            assert_eq!(e.kind(), kvstore_core::ErrorKind::ShapeMismatch, "{e}");
        } else {
            let expected = format!(
                "rank {} pushed rows of \"{}\" [{}, {dim}] float32, which it refused",
                workers - 1,
                keys[0],
                rows + 1
            );
            assert!(m.contains(&expected), "rank {rank}: {m}\nexpected: {expected}");
        }
        assert_eq!(kv.pull_new(keys[0], 0).expect("pull").to_vec::<f32>().expect("f32"), model[0], "unchanged");
    }
    bits
}

/// An updater that fails on one worker only (the last, at its third call; and for key
/// "f2" when the sum is 99 per worker) fails that push on every worker, naming the
/// worker, and no worker changes anything for it: the replicas stay the same, bit for
/// bit (residuals too, under `compression`). Returns the values' bits for comparing
/// workers. Before, the worker whose updater failed kept its values and the others
/// committed theirs, and the replicas parted for the rest of the job.
pub fn an_updater_failing_on_one_worker_fails_the_push_everywhere(
    rank: usize,
    kv: &KVStore,
    compression: bool,
) -> Vec<u8> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let workers = kv.num_workers();
    let last = workers - 1;
    if compression {
        kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.5")]).expect("compression");
    }
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&calls);
    kv.set_updater(move |key: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        let first = merged.to_vec::<f32>()?[0];
        let sentinel = key.as_str() == "f2" && first == 99.0 * workers as f32;
        if rank == last && ((key.as_str() == "u" && n == 3) || sentinel) {
            return Err(kvstore_core::Error::invalid_argument("a deliberate failure of this worker's updater"));
        }
        stored.add_assign(merged)
    })
    .expect("install the updater");
    kv.init("u", &NDArray::zeros(&[8]).expect("zeros")).expect("init");
    for s in 0..5 {
        let r = kv.push("u", &NDArray::full(&[8], (s + 1) as f64 * 0.75).expect("value"), 0);
        if s != 2 {
            r.unwrap_or_else(|e| panic!("rank {rank}, step {s}: {e}"));
            continue;
        }
        let e = r.expect_err("the push whose updater failed on one worker");
        let text = e.to_string();
        match rank == last {
            true => assert!(text.contains("deliberate"), "rank {rank}: {text}"),
            false => assert!(text.contains(&format!("failed on rank {last}")) && text.contains("deliberate"), "{text}"),
        }
    }
    if !compression {
        // Steps 0, 1, 3 and 4 counted: 0.75 * (1 + 2 + 4 + 5) per worker.
        assert_eq!(pulled(kv, "u", &[8]), vec![9.0 * workers as f64; 8], "rank {rank}");
        // Non-blocking pushes (fused into one call where the store fuses): "f2" fails on
        // every worker, "f1" goes on.
        kv.init(&["f1", "f2"][..], &[NDArray::zeros(&[4]).expect("z"), NDArray::zeros(&[4]).expect("z")][..])
            .expect("init");
        let (one, ninety_nine) = (NDArray::full(&[4], 1.0).expect("v"), NDArray::full(&[4], 99.0).expect("v"));
        let (a, b) = (kv.push_async("f1", &one, 0), kv.push_async("f2", &ninety_nine, 0));
        a.wait().unwrap_or_else(|e| panic!("rank {rank}: f1: {e}"));
        let e = b.wait().expect_err("f2's updater failed on one worker");
        assert!(rank == last || e.to_string().contains(&format!("failed on rank {last}")), "rank {rank}: {e}");
        assert_eq!(pulled(kv, "f1", &[4]), vec![workers as f64; 4], "rank {rank}");
        assert_eq!(pulled(kv, "f2", &[4]), vec![0.0; 4], "rank {rank}");
    }
    // Later pushes go on alike everywhere.
    kv.push("u", &NDArray::full(&[8], 0.75).expect("value"), 0).expect("a push after the failure");
    let mut bits = crate::device_checks::bits(&kv.pull_new("u", 0).expect("pull"));
    if !compression {
        bits.extend(crate::device_checks::bits(&kv.pull_new("f2", 0).expect("pull")));
    }
    bits
}

/// A call that one worker's store refuses before the call reaches its step (a key never
/// initialised, keys and values that do not pair up, a broadcast's out of another shape)
/// fails on every worker, and the next calls stay matched: before, the call was missing
/// on that worker only, and the others' call met its next one.
pub fn a_call_refused_before_its_step_fails_on_every_worker(rank: usize, kv: &KVStore) {
    let w = kv.num_workers();
    let last = rank + 1 == w;
    let one = || full(&[2], 1.0, Context::cpu(0));
    let failed = |what: &str, r: Result<()>| {
        let e = r.expect_err(what);
        assert!(last || e.to_string().contains(&format!("rank {}", w - 1)), "rank {rank}: {what}: {e}");
    };
    let ok = |what: &str, r: Result<()>| r.unwrap_or_else(|e| panic!("rank {rank}: {what} after a refusal: {e}"));
    kv.init("b-w", &full(&[2], 0.0, Context::cpu(0))).expect("init");
    failed("push of a key never initialised", kv.push(if last { "b-never" } else { "b-w" }, &one(), 0));
    ok("push", kv.push("b-w", &one(), 0));
    let (two, values) = (["b-w", "b-w"], [one()]);
    failed(
        "push of keys and values that do not pair up",
        match last {
            true => kv.push(&two[..], &values[..], 0),
            false => kv.push("b-w", &one(), 0),
        },
    );
    ok("pushpull", kv.pushpull("b-w", &one(), &full(&[2], 0.0, Context::cpu(0)), 0));
    failed(
        "push_async of a key never initialised",
        kv.push_async(if last { "b-never" } else { "b-w" }, &one(), 0).wait(),
    );
    ok("push_async", kv.push_async("b-w", &full(&[2], (rank + 1) as f64, Context::cpu(0)), 0).wait());
    let out = full(&[if last { 3 } else { 2 }], 0.0, Context::cpu(0));
    failed("broadcast into an out of another shape", kv.broadcast("b-b", &one(), &out, 0));
    assert!(!kv.keys().iter().any(|k| k.as_str() == "b-b"), "rank {rank}: the refused broadcast initialised its key");
    ok("broadcast", kv.broadcast("b-b", &one(), &full(&[2], 0.0, Context::cpu(0)), 0));
    // The last push (assigned, no updater) summed every worker's rank + 1.
    assert_eq!(pulled(kv, "b-w", &[2]), vec![triangle(w); 2], "rank {rank}");
}

/// Memory of f32s, for a read-only array.
struct Floats(Vec<f32>);

impl kvstore_core::ForeignMemory for Floats {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
}

/// A pull under `dist_sync` checks its outs as any store does (a pull has no step the
/// workers compare: each worker refuses its own bad outs), before it writes any: an out
/// of another shape but the same size, of another dtype, or read-only is refused with
/// the key's error, and no out of the call is written.
pub fn a_pull_refuses_bad_outs_before_writing_any(rank: usize, kv: &KVStore) {
    kv.init(&["p-a", "p-b"], &[full(&[2, 3], 1.0, Context::cpu(0)), full(&[4], 2.0, Context::cpu(0))]).expect("init");
    let untouched = |what: &str, out: &NDArray| {
        assert!(
            out.to_vec::<f32>().expect("read").iter().all(|&x| x == 0.0),
            "rank {rank}: {what}: an out was written"
        );
    };
    let refused = |what: &str, r: Result<()>, says: &str| {
        let e = r.expect_err(what).to_string();
        assert!(e.contains(says), "rank {rank}: {what}: {e}");
    };
    let other_shape = full(&[3, 2], 0.0, Context::cpu(0));
    refused("a pull into an out of another shape", kv.pull("p-a", &other_shape, 0), "shape mismatch");
    untouched("an out of another shape", &other_shape);
    refused(
        "a pull_async into an out of another shape",
        kv.pull_async("p-a", &other_shape, 0).wait(),
        "shape mismatch",
    );
    untouched("an out of another shape (pull_async)", &other_shape);
    let (good, f64_out) =
        (full(&[2, 3], 0.0, Context::cpu(0)), NDArray::zeros_with(&[4], DType::F64, Context::cpu(0)).expect("f64"));
    refused(
        "a pull with a second out of another dtype",
        kv.pull(&["p-a", "p-b"], &[good.clone(), f64_out], 0),
        "pull of key \"p-b\" (out): dtype mismatch",
    );
    untouched("the first out of a refused pull", &good);
    let read_only = NDArray::from_foreign(&[4], DType::F32, Box::new(Floats(vec![0.0; 4])), false).expect("read-only");
    refused("a pull into a read-only out", kv.pull(&["p-a", "p-b"], &[good.clone(), read_only], 0), "read-only");
    untouched("the first out of a pull refused for a read-only out", &good);
    kv.pull(&["p-a", "p-b"], &[good.clone(), full(&[4], 0.0, Context::cpu(0))], 0).expect("a good pull");
    assert_eq!(good.to_vec::<f32>().expect("read"), vec![1.0; 6], "rank {rank}");
}

/// An updater that panics on one worker fails that push on every worker (the others
/// naming the worker) instead of leaving them waiting for it, blocking or not; later
/// pushes go on alike.
pub fn an_updater_panicking_on_one_worker_fails_the_push_everywhere(rank: usize, kv: &KVStore) -> Vec<u8> {
    let last = kv.num_workers() - 1;
    kv.set_updater(move |_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        if rank == last && merged.to_vec::<f32>()?[0] < 0.0 {
            panic!("a deliberate panic of this worker's updater");
        }
        stored.add_assign(merged)
    })
    .expect("install the updater");
    kv.init("p", &full(&[4], 0.0, Context::cpu(0))).expect("init");
    let minus = || full(&[4], -1.0, Context::cpu(0));
    for (what, r) in [("blocking", kv.push("p", &minus(), 0)), ("non-blocking", kv.push_async("p", &minus(), 0).wait())]
    {
        let e = r.expect_err(what);
        assert!(e.to_string().contains("panicked"), "rank {rank}: {what}: {e}");
    }
    kv.push("p", &full(&[4], 1.0, Context::cpu(0)), 0).expect("a push after the panics");
    crate::device_checks::bits(&kv.pull_new("p", 0).expect("pull"))
}

/// Workers that merge a push differently (another optimizer, other hyper-parameters,
/// an optimizer on one and none on another) fail it on every worker instead of parting
/// silently; once they install the same optimizer, their pushes go on alike.
pub fn workers_with_other_optimizers_fail_their_pushes(rank: usize, kv: &KVStore) -> Vec<u8> {
    let sgd = |lr: f64| Optimizer::builder("sgd").param("learning_rate", lr).build().expect("sgd");
    kv.init("o", &full(&[4], 1.0, Context::cpu(0))).expect("init");
    let g = || full(&[4], 1.0, Context::cpu(0));
    let setups: [Option<Optimizer>; 3] = match rank {
        0 => [Some(sgd(0.1)), Some(sgd(0.1)), Some(sgd(0.1))],
        _ => [Some(sgd(0.2)), None, Some(Optimizer::builder("adam").build().expect("adam"))],
    };
    for (i, opt) in setups.into_iter().enumerate() {
        match opt {
            Some(o) => kv.set_optimizer(o).expect("set_optimizer"),
            None => kv.clear_updater().expect("clear"),
        }
        let e = kv.push("o", &g(), 0).expect_err("workers merge differently");
        assert!(e.to_string().contains("differ"), "rank {rank}, setup {i}: {e}");
        assert_eq!(pulled(kv, "o", &[4]), vec![1.0; 4], "rank {rank}, setup {i}: a refused push changed the value");
    }
    kv.set_optimizer(sgd(0.1)).expect("set_optimizer");
    kv.push("o", &g(), 0).expect("the same optimizer everywhere");
    crate::device_checks::bits(&kv.pull_new("o", 0).expect("pull"))
}

/// `dist_sync` owners against the replicated layout: `make(layout)` makes a store of this
/// worker with that layout, splitting keys from 1000 elements; six optimizers (a
/// schedule, shared values, whole-key norms, noise, multi-precision) train keys whole
/// on one owner and split in parts for 30 steps, blocking, non-blocking and pushpull;
/// both layouts pull the same bits after every step. Returns the last step's bits, for
/// the caller to compare across workers.
pub fn owners_train_as_the_replicated_layout(rank: usize, make: &dyn Fn(Layout) -> KVStore) -> Vec<u32> {
    let keys: [(&str, &[usize], DType); 4] = [
        ("o small", &[7], DType::F32),
        ("o big", &[2001], DType::F32),
        ("o half", &[1500], DType::F16),
        ("o mid", &[300], DType::F32),
    ];
    let names = ["sgd", "adam", "nadam", "lamb", "sgld", "adagrad"];
    let value = |n: usize, seed: u64, dtype: DType| {
        let data: Vec<f32> =
            (0..n).map(|i| (((i as u64 * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) / 1000.0).collect();
        NDArray::from_vec(&[n], data).and_then(|a| a.as_type(dtype)).expect("a value")
    };
    let mut last = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let kvs = [make(Layout::Replicated), make(Layout::Owners)];
        let opt = || {
            let mut b =
                Optimizer::builder(name).param("learning_rate", 0.02).param("wd", 0.001).param("multi_precision", 1.0);
            if *name == "sgd" {
                b = b.param("momentum", 0.9).lr_scheduler(LrScheduler::factor(5, 0.8).expect("a schedule"));
            }
            b.build().expect("an optimizer")
        };
        let ks: Vec<String> = keys.iter().map(|(k, ..)| format!("{k} {i}")).collect();
        for kv in &kvs {
            for (k, (_, shape, dtype)) in ks.iter().zip(keys) {
                kv.init(k.as_str(), &value(shape[0], 1, dtype)).expect("init");
            }
            kv.set_optimizer(opt()).expect("set_optimizer");
        }
        let outs: Vec<Vec<NDArray>> = (0..2)
            .map(|_| keys.iter().map(|(_, s, d)| NDArray::zeros_with(s, *d, Context::cpu(0)).expect("out")).collect())
            .collect();
        let names: Vec<&str> = ks.iter().map(String::as_str).collect();
        for step in 0..30u64 {
            let grads: Vec<NDArray> = keys
                .iter()
                .enumerate()
                .map(|(j, (_, s, d))| value(s[0], step * 31 + rank as u64 * 7 + j as u64, *d))
                .collect();
            for (kv, outs) in kvs.iter().zip(&outs) {
                match step % 3 {
                    0 => kv.pushpull(&names[..], &grads[..], &outs[..], 0).expect("pushpull"),
                    1 => {
                        let pending: Vec<_> = names.iter().zip(&grads).map(|(k, g)| kv.push_async(*k, g, 0)).collect();
                        for p in pending {
                            p.wait().expect("push");
                        }
                        kv.pull(&names[..], &outs[..], 0).expect("pull");
                    }
                    _ => {
                        kv.push(&names[..], &grads[..], 0).expect("push");
                        kv.pull(&names[..], &outs[..], 0).expect("pull");
                    }
                }
            }
            let bits = |outs: &[NDArray]| -> Vec<u32> {
                outs.iter()
                    .flat_map(|o| o.as_type(DType::F32).and_then(|o| o.to_vec::<f32>()).expect("read"))
                    .map(f32::to_bits)
                    .collect()
            };
            let (replicated, owned) = (bits(&outs[0]), bits(&outs[1]));
            let at = replicated.iter().zip(&owned).position(|(a, b)| a != b);
            assert_eq!(at, None, "{name}: step {step} on rank {rank}: owners differ from replicated at element");
            last = owned;
        }
    }
    last
}

/// Row-sparse tables whose rows live on their owners (`make(Layout::Owners)`) against
/// the replicated layout and a `local` store pushed every worker's rows in
/// rank order, at `size` workers: a table split across the owners at rows (300 x 8 at
/// a bound of 1000) and one owned whole (20 x 4), with SGD, Adam and AdaGrad, 30 steps;
/// each worker pulls rows of its own by `row_sparse_pull` after every step, and the
/// tables dense every 10. Returns the tables' final bits, which every rank must share.
pub fn tables_on_owners_train_as_the_replicated_layout(
    rank: usize,
    size: usize,
    make: &dyn Fn(Layout) -> KVStore,
) -> Vec<u32> {
    use kvstore_core::RowSparse;
    let tables: [(&str, [usize; 2]); 2] = [("t split", [300, 8]), ("t whole", [20, 4])];
    let rows_of = |t: usize, step: u64, r: usize| -> RowSparse {
        let shape = tables[t].1;
        let mut ids: Vec<i64> = (0..(step % 5) * 3)
            .map(|i| ((i * 37 + step * 11 + r as u64 * 5 + t as u64) % shape[0] as u64) as i64)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let data: Vec<f32> = (0..ids.len() * shape[1])
            .map(|i| (((i as u64 * 7919 + step * 104_729 + r as u64 * 31) % 2001) as f32 - 1000.0) / 1000.0)
            .collect();
        let data = NDArray::from_vec(&[ids.len(), shape[1]], data).expect("rows");
        RowSparse::new(data, ids, &shape).expect("a row-sparse gradient")
    };
    let bits = |a: &NDArray| a.to_vec::<f32>().expect("read").iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut last = Vec::new();
    for (i, name) in ["sgd", "adam", "adagrad"].iter().enumerate() {
        let kvs = [make(Layout::Owners), make(Layout::Replicated), KVStore::create("local").expect("local")];
        let ks: Vec<String> = tables.iter().map(|(k, _)| format!("{k} {i}")).collect();
        for kv in &kvs {
            for (k, (_, shape)) in ks.iter().zip(tables) {
                let init = NDArray::from_vec(&shape, (0..shape[0] * shape[1]).map(|x| (x % 13) as f32 * 0.1).collect())
                    .expect("init");
                kv.init_row_sparse(k.as_str(), &RowSparse::from_dense(&init).expect("rows")).expect("init");
            }
            let opt = Optimizer::builder(name).param("learning_rate", 0.05).param("wd", 0.01);
            kv.set_optimizer(opt.build().expect("an optimizer")).expect("set_optimizer");
        }
        for step in 0..30u64 {
            for (t, k) in ks.iter().enumerate() {
                kvs[0].push_row_sparse(k.as_str(), &[rows_of(t, step, rank)], 0).expect("push on owners");
                kvs[1].push_row_sparse(k.as_str(), &[rows_of(t, step, rank)], 0).expect("push replicated");
                let all: Vec<RowSparse> = (0..size).map(|r| rows_of(t, step, r)).collect();
                kvs[2].push_row_sparse(k.as_str(), &all, 0).expect("push local");
                let n = tables[t].1[0] as u64;
                let ids: Vec<i64> = (0..9).map(|j| ((j * 41 + step * 3 + rank as u64 * 17) % n) as i64).collect();
                let got: Vec<(Vec<i64>, Vec<u32>)> = kvs
                    .iter()
                    .map(|kv| {
                        let r = kv.row_sparse_pull(k.as_str(), &ids, 0).expect("row_sparse_pull");
                        (r.indices().to_vec(), bits(r.data()))
                    })
                    .collect();
                assert!(
                    got[0] == got[1] && got[0] == got[2],
                    "{name}: {k} after step {step}: rows differ on rank {rank}"
                );
                if step % 10 == 9 {
                    let dense: Vec<Vec<u32>> =
                        kvs.iter().map(|kv| bits(&kv.pull_new(k.as_str(), 0).expect("pull"))).collect();
                    assert!(
                        dense[0] == dense[1] && dense[0] == dense[2],
                        "{name}: {k} after step {step}: pulls differ"
                    );
                    if step == 29 {
                        last.extend(dense[0].iter().copied());
                    }
                }
            }
        }
    }
    last
}
