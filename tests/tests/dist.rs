//! `dist_sync` semantics (reference §9 and case 23) with workers as threads of one
//! process (`kvstore_tests::ThreadGroup`): init takes rank 0's value, pushes are summed
//! across the workers, the updater or optimizer runs identically on every worker, and
//! every worker pulls the same values.

use kvstore_core::{Context, DType, ErrorKind, KVStore, Key, NDArray, Optimizer, Result};
use kvstore_tests::{full, pulled, run_workers};

const SHAPE: [usize; 2] = [2, 3];

#[test]
fn case_23_dist_sync_two_workers() {
    let results = run_workers(2, |rank, kv| {
        assert_eq!((kv.rank(), kv.num_workers(), kv.kind()), (rank, 2, "dist_sync"));
        // init: ranks give 10 and 11; everyone holds rank 0's 10.
        kv.init("w", &full(&SHAPE, 10.0 + rank as f64, Context::cpu(0))).expect("init");
        let after_init = pulled(&kv, "w", &SHAPE)[0];
        // pushes 1 and 2, no optimizer: the sum, 3.
        kv.push("w", &full(&SHAPE, 1.0 + rank as f64, Context::cpu(0)), 0).expect("push");
        let after_push = pulled(&kv, "w", &SHAPE)[0];
        // MXNet's `test` optimizer with rescale 2 (w += 2 * sum) from 0: 6, then 12.
        kv.init("t", &full(&SHAPE, 0.0, Context::cpu(0))).expect("init");
        kv.set_updater(|_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
            stored.add_assign(&merged.mul(2.0)?)
        });
        let mut after_test = Vec::new();
        for _ in 0..2 {
            kv.push("t", &full(&SHAPE, 1.0 + rank as f64, Context::cpu(0)), 0).expect("push");
            after_test.push(pulled(&kv, "t", &SHAPE)[0]);
        }
        (after_init, after_push, after_test)
    });
    for r in results {
        assert_eq!(r, (10.0, 3.0, vec![6.0, 12.0]));
    }
}

#[test]
fn each_round_every_worker_pushes_rank_plus_one() {
    // The nightly dist_sync_kvstore check: rate 2, W workers, after round i the value is
    // 1 + 2 * W(W+1)/2 * i, on every worker, for f32 and f16 keys and a big key.
    for workers in [2usize, 4] {
        let results = run_workers(workers, move |rank, kv| {
            let keys = ["a", "b", "big"];
            let shapes: [&[usize]; 3] = [&[2, 3], &[5], &[600, 700]];
            let dtypes = [DType::F32, DType::F16, DType::F32];
            for ((k, s), d) in keys.iter().zip(shapes).zip(dtypes) {
                kv.init(*k, &NDArray::full_with(s, 1.0, d, Context::cpu(0)).expect("v")).expect("init");
            }
            kv.set_updater(|_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
                stored.add_assign(&merged.mul(2.0)?)
            });
            let mut seen = Vec::new();
            for _round in 0..3 {
                let vals: Vec<NDArray> = shapes
                    .iter()
                    .zip(dtypes)
                    .map(|(s, d)| NDArray::full_with(s, (rank + 1) as f64, d, Context::cpu(0)).expect("v"))
                    .collect();
                kv.push(&keys, &vals, 0).expect("push");
                let outs: Vec<NDArray> = shapes
                    .iter()
                    .zip(dtypes)
                    .map(|(s, d)| NDArray::zeros_with(s, d, Context::cpu(0)).expect("o"))
                    .collect();
                kv.pull(&keys, &outs, 0).expect("pull");
                let firsts: Vec<f64> = outs.iter().map(|o| o.to_f64_vec().expect("r")[0]).collect();
                let lasts: Vec<f64> = outs.iter().map(|o| *o.to_f64_vec().expect("r").last().expect("last")).collect();
                assert_eq!(firsts, lasts, "every element of every key is equal");
                seen.push(firsts);
            }
            seen
        });
        let per_round = (workers * (workers + 1)) as f64; // 2 * W(W+1)/2
        for seen in results {
            for (i, round) in seen.iter().enumerate() {
                let expect = 1.0 + per_round * (i + 1) as f64;
                assert_eq!(round, &vec![expect; 3], "{workers} workers, round {i}");
            }
        }
    }
}

#[test]
fn an_optimizer_runs_identically_on_every_worker() {
    // One SGD step (lr 1) from 1 with pushes rank + 1: 1 - W(W+1)/2 everywhere; then
    // momentum steps keep every replica bit-identical.
    let results = run_workers(4, |rank, kv| {
        kv.init("w", &full(&SHAPE, 1.0, Context::cpu(0))).expect("init");
        kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 1.0).build().expect("sgd")).expect("set");
        kv.push("w", &full(&SHAPE, (rank + 1) as f64, Context::cpu(0)), 0).expect("push");
        let one_step = pulled(&kv, "w", &SHAPE);
        kv.set_optimizer(
            Optimizer::builder("adam").param("learning_rate", 0.01).param("wd", 0.001).build().expect("adam"),
        )
        .expect("set");
        for step in 0..5 {
            let g =
                NDArray::from_vec(&SHAPE, (0..6).map(|i| (i * (rank + 1) + step) as f32 * 0.37).collect()).expect("g");
            kv.push("w", &g, 0).expect("push");
        }
        let out = NDArray::zeros(&SHAPE).expect("out");
        kv.pull("w", &out, 0).expect("pull");
        (one_step, out.to_vec::<f32>().expect("r").iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    });
    for (one_step, _) in &results {
        assert_eq!(one_step, &vec![1.0 - 10.0; 6]);
    }
    assert!(results.windows(2).all(|w| w[0].1 == w[1].1), "replicas differ after Adam steps");
}

#[test]
fn string_keys_lists_with_repeats_and_every_dtype_sum_across_workers() {
    let results = run_workers(3, |rank, kv| {
        let mut out = Vec::new();
        for (i, d) in DType::ALL.iter().enumerate() {
            let key = format!("key-{d}");
            kv.init(key.as_str(), &NDArray::zeros_with(&[4], *d, Context::cpu(0)).expect("z")).expect("init");
            // Two local values per worker under a repeated key: local sum, then across.
            let v = |x: f64| NDArray::full_with(&[4], x, *d, Context::cpu(i as u32 % 4)).expect("v");
            kv.push(&[key.as_str(), key.as_str()], &[v(rank as f64), v(1.0)], 0).expect("push");
            let o = NDArray::zeros_with(&[4], *d, Context::cpu(0)).expect("o");
            kv.pull(key.as_str(), &o, 0).expect("pull");
            out.push(o.to_f64_vec().expect("r")[0]);
        }
        out
    });
    // (0 + 1) + (1 + 1) + (2 + 1) = 6 for every dtype, on every worker.
    for r in results {
        assert_eq!(r, vec![6.0; 8]);
    }
}

#[test]
fn barrier_and_rank_come_from_the_group() {
    let ranks = run_workers(4, |rank, kv| {
        kv.barrier().expect("barrier");
        assert_eq!(kv.num_workers(), 4);
        (rank, kv.rank())
    });
    assert!(ranks.iter().all(|(r, k)| r == k));
}

#[test]
fn dist_kinds_without_a_group_or_async_are_unsupported() {
    for kind in ["dist_sync", "dist", "dist_device_sync"] {
        let e = KVStore::create(kind).expect_err("no group");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{kind}");
        assert!(e.to_string().contains("kvstore-mpi"), "{e}");
    }
    for kind in ["dist_async", "dist_async_device"] {
        let e = KVStore::create(kind).expect_err("async");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().contains("local, device, dist_sync"), "{e}");
    }
    let group = kvstore_tests::ThreadGroup::new(1);
    let e = KVStore::builder("local").collective(group.member(0)).build().expect_err("local with a group");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}
