//! Checks shared by every device backend (the simulated one and CUDA): the same
//! functions, so a GPU run checks exactly what the simulated run checks.

use kvstore_core::{Context, DType, KVStore, NDArray};

/// Deterministic values of `dtype` with mixed signs and magnitudes (so that the f32
/// accumulation order of f16/bf16 shows in the bits).
pub fn values(n: usize, seed: u64, dtype: DType, ctx: Context) -> NDArray {
    let data: Vec<f64> = (0..n)
        .map(|i| {
            let x = (i as u64).wrapping_mul(6364136223846793005).wrapping_add(seed.wrapping_mul(1442695040888963407));
            let v = ((x >> 33) % 2001) as f64 - 1000.0;
            if dtype.is_float() { v / 7.0 * (1 + i % 5) as f64 } else { v }
        })
        .collect();
    NDArray::from_vec(&[n], data).and_then(|a| a.as_type(dtype)).and_then(|a| a.copy_to(ctx)).expect("values")
}

pub fn bits(a: &NDArray) -> Vec<u8> {
    let host = a.copy_to(Context::cpu(0)).expect("download");
    let mut out = Vec::new();
    match host.dtype() {
        DType::F32 => host.with_data(|x: &[f32]| out.extend(x.iter().flat_map(|v| v.to_bits().to_le_bytes()))),
        _ => host.to_vec::<f64>().map(|x| out.extend(x.iter().flat_map(|v| v.to_bits().to_le_bytes()))),
    }
    .expect("bits");
    out
}

/// Optimizers and parameters for the fused-step checks: every rule with a fused
/// kernel in each of its forms (momentum or not, clipping or not, centered RMSProp,
/// weight clipping), and two that have none (their device path stages the host rule).
pub const OPTIMIZERS: &[(&str, &[(&str, f64)])] = &[
    ("sgd", &[("learning_rate", 0.1)]),
    ("sgd", &[("learning_rate", 0.1), ("momentum", 0.9), ("wd", 0.01)]),
    ("sgd", &[("momentum", 0.9), ("clip_gradient", 0.5), ("rescale_grad", 0.5)]),
    ("nag", &[("learning_rate", 0.1), ("wd", 0.01)]),
    ("nag", &[("learning_rate", 0.1), ("clip_gradient", 2.0)]),
    ("nag", &[("momentum", 0.9), ("wd", 0.01)]),
    ("nag", &[("momentum", 0.9), ("clip_gradient", 0.5)]),
    ("adam", &[("learning_rate", 0.01), ("wd", 0.01)]),
    ("adam", &[("clip_gradient", 0.3), ("rescale_grad", 0.25)]),
    ("adagrad", &[("learning_rate", 0.1), ("wd", 0.01)]),
    ("adagrad", &[("clip_gradient", 0.5)]),
    ("rmsprop", &[("learning_rate", 0.01), ("wd", 0.01)]),
    ("rmsprop", &[("clip_gradient", 0.5), ("clip_weights", 0.8)]),
    ("rmsprop", &[("centered", 1.0), ("wd", 0.01), ("clip_weights", 2.0)]),
    ("adadelta", &[("wd", 0.01)]),
    ("nadam", &[("learning_rate", 0.01)]),
    ("ftml", &[("learning_rate", 0.02), ("wd", 0.01), ("clip_gradient", 0.5)]),
    ("lbsgd", &[("momentum", 0.9), ("batch_scale", 2.0), ("warmup_strategy", 3.0), ("wd", 0.01)]),
];

/// The length of [`optimized`]'s weight: a size no other test uses, so that backends
/// counting by size count its steps alone.
pub const OPTIMIZED_LEN: usize = 1031;

/// Three pushes of two gradients of `dtype` from `ctxs` (the weight initialised from
/// `ctxs[0]`, [`OPTIMIZED_LEN`] elements) into a store of `kind` with the optimizer
/// `name`, then the weight's bits.
pub fn optimized(kind: &str, name: &str, params: &[(&str, f64)], dtype: DType, ctxs: &[Context]) -> Vec<u8> {
    let n = OPTIMIZED_LEN;
    let kv = KVStore::create(kind).expect("store");
    let mut b = kvstore_core::Optimizer::builder(name);
    for &(p, v) in params {
        b = b.param(p, v);
    }
    kv.set_optimizer(b.build().expect("optimizer")).expect("set");
    kv.init("w", &values(n, 5, dtype, ctxs[0]).mul(0.001).expect("w")).expect("init");
    for step in 0..3u64 {
        let g: Vec<NDArray> =
            (0..2u64).map(|i| values(n, step * 2 + i, dtype, ctxs[i as usize % ctxs.len()])).collect();
        kv.push("w", &g, 0).expect("push");
    }
    let out = NDArray::zeros_with(&[n], dtype, Context::cpu(0)).expect("out");
    kv.pull("w", &out, 0).expect("pull");
    bits(&out)
}

/// Every optimizer of [`OPTIMIZERS`] on every float dtype (f16 also with
/// `multi_precision`) gives the host's bits on a `device` store whose values are on
/// `devices`.
pub fn optimizers_match_the_host(devices: &[Context]) {
    for &(name, params) in OPTIMIZERS {
        for (dtype, mp) in
            [(DType::F32, 0.0), (DType::F64, 0.0), (DType::F16, 0.0), (DType::F16, 1.0), (DType::BF16, 0.0)]
        {
            let params: Vec<(&str, f64)> = params.iter().copied().chain([("multi_precision", mp)]).collect();
            let host = optimized("local", name, &params, dtype, &[Context::cpu(0), Context::cpu(1)]);
            let dev = optimized("device", name, &params, dtype, devices);
            assert_eq!(dev, host, "{name} {params:?} on {dtype}: the device update differs from the host's");
        }
    }
}

/// A `device` store gives each key, at its first push from devices, the device
/// (among those it is pushed from) with the fewest bytes of keys so far, biggest
/// keys first; later pushes do not move it. A `local` store keeps values on the host.
pub fn keys_spread_over_devices_by_size(count: u32) {
    let kv = KVStore::create("device").expect("store");
    let sizes = [100usize, 4000, 300, 2000, 1000, 50];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("k{i}")).collect();
    for (k, &n) in keys.iter().zip(&sizes) {
        kv.init(k.as_str(), &NDArray::zeros(&[n]).expect("value")).expect("init");
        assert_eq!(kv.context_of(k.as_str()).expect("context"), Context::cpu(0));
    }
    let devices: Vec<Context> = (0..count).map(Context::gpu).collect();
    let push = || {
        let (ks, vs): (Vec<&str>, Vec<NDArray>) = keys
            .iter()
            .zip(&sizes)
            .flat_map(|(k, &n)| {
                devices.iter().map(move |&d| (k.as_str(), NDArray::ones_with(&[n], DType::F32, d).expect("value")))
            })
            .unzip();
        kv.push(ks, &vs, 0).expect("push");
    };
    push();
    // The expected placement: biggest first, each to the least loaded device.
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    let mut load = vec![0usize; count as usize];
    let mut expected = vec![0u32; sizes.len()];
    for i in order {
        let d = (0..count as usize).min_by_key(|&d| (load[d], d)).expect("a device");
        load[d] += sizes[i] * 4;
        expected[i] = d as u32;
    }
    push();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(kv.context_of(k.as_str()).expect("context"), Context::gpu(expected[i]), "{k}");
        let out = NDArray::zeros(&[sizes[i]]).expect("out");
        kv.pull(k.as_str(), &out, 0).expect("pull");
        assert!(out.to_vec::<f32>().expect("read").iter().all(|&x| x == count as f32), "{k}");
    }
    let local = KVStore::create("local").expect("store");
    local.init("g", &NDArray::ones_with(&[8], DType::F32, Context::gpu(count - 1)).expect("g")).expect("init");
    assert_eq!(local.context_of("g").expect("context"), Context::cpu(0));
    assert_eq!(kv.context_of("nope").expect_err("no key").kind(), kvstore_core::ErrorKind::KeyNotInitialized);
}

/// The sizes of [`trained`]'s keys: small ones, and one over the size at which a
/// host sum is split over threads.
pub const TRAINED_SIZES: [usize; 4] = [3, 1000, 4099, 70_000];

/// A short training run on a store of `kind` with `engine_threads` engine threads,
/// every array on `ctxs`: each key's weights are pulled into two outs (on `ctxs[0]`
/// and `ctxs[1 % len]`) and pushed from two gradient arrays there. Adam (a fused
/// kernel where the weight is on a device). The keys are initialised by a broadcast
/// into the outs; then, per step, in backward order, each key's gradients are
/// written into the same two arrays as at every step, from the outs' current
/// values, and the key is pushed and pulled: by one pushpull for even keys, a push
/// then a pull for odd ones. Non-blocking, no handle is waited for before the end of
/// the run (`wait_all`): writing a gradient array reads the outs of the pull before
/// (which waits for it) and overwrites an array the push before may not have read
/// yet (which copies it for that push). Returns every key's weights' bits, after
/// checking that its two outs hold the same.
pub fn trained(kind: &str, engine_threads: usize, nonblocking: bool, ctxs: &[Context]) -> Vec<Vec<u8>> {
    let kv = KVStore::builder(kind).engine_threads(engine_threads).build().expect("store");
    let adam = kvstore_core::Optimizer::builder("adam").param("learning_rate", 0.01).param("wd", 0.01);
    kv.set_optimizer(adam.build().expect("adam")).expect("set");
    let on = |d: usize| ctxs[d % ctxs.len()];
    let keys: Vec<String> = (0..TRAINED_SIZES.len()).map(|i| format!("t{i}")).collect();
    let arrays = |n: usize| -> Vec<NDArray> {
        (0..2).map(|d| NDArray::zeros_with(&[n], DType::F32, on(d)).expect("array")).collect()
    };
    let outs: Vec<Vec<NDArray>> = TRAINED_SIZES.iter().map(|&n| arrays(n)).collect();
    let grads: Vec<Vec<NDArray>> = TRAINED_SIZES.iter().map(|&n| arrays(n)).collect();
    let mut pending = Vec::new();
    for (i, (k, &n)) in keys.iter().zip(&TRAINED_SIZES).enumerate() {
        let w = values(n, 50 + i as u64, DType::F32, on(0)).mul(0.01).expect("w");
        match nonblocking {
            true => pending.push(kv.broadcast_async(k.as_str(), &w, outs[i].as_slice(), 0)),
            false => kv.broadcast(k.as_str(), &w, outs[i].as_slice(), 0).expect("broadcast"),
        }
    }
    for step in 0..3u64 {
        for (i, (k, &n)) in keys.iter().zip(&TRAINED_SIZES).enumerate().rev() {
            for (d, g) in grads[i].iter().enumerate() {
                let seed = step * 101 + i as u64 * 13 + d as u64 * 7;
                let fresh = values(n, seed, DType::F32, on(d)).add(&outs[i][d].mul(0.5).expect("w/2")).expect("g");
                g.copy_from(&fresh).expect("write the gradient");
            }
            let (k, g, o) = (k.as_str(), grads[i].as_slice(), outs[i].as_slice());
            match (nonblocking, i % 2 == 0) {
                (true, true) => pending.push(kv.pushpull_async(k, g, o, 0)),
                (true, false) => pending.extend([kv.push_async(k, g, 0), kv.pull_async(k, o, 0)]),
                (false, true) => kv.pushpull(k, g, o, 0).expect("pushpull"),
                (false, false) => kv.push(k, g, 0).and_then(|()| kv.pull(k, o, 0)).expect("push, pull"),
            }
        }
    }
    kv.wait_all().expect("wait_all");
    for p in pending {
        p.wait().expect("a non-blocking call");
    }
    outs.iter()
        .zip(&keys)
        .map(|(o, k)| {
            let b = bits(&o[0]);
            assert!(bits(&o[1]) == b, "{kind}: the two outs of {k} differ");
            b
        })
        .collect()
}

/// [`trained`] on `ctxs` gives the host's bits with `local` and `device` stores,
/// blocking and non-blocking, on one and two engine threads.
pub fn nonblocking_training_matches_the_host(ctxs: &[Context]) {
    let host = trained("local", 1, false, &[Context::cpu(0), Context::cpu(1)]);
    for kind in ["local", "device"] {
        for (threads, nonblocking) in [(1, false), (1, true), (2, true)] {
            let got = trained(kind, threads, nonblocking, ctxs);
            assert!(
                got == host,
                "{kind} store on {ctxs:?}, {threads} engine threads, non-blocking {nonblocking}: not the host's bits"
            );
        }
    }
}

/// Non-blocking calls on arrays on `ctxs`, with `local` and `device` stores: a
/// pending out pushed as a value is pushed as the pull wrote it; a pushed array
/// overwritten before its push ran is pushed as it was; calls that fail (a wrong
/// shape, a missing key) report to their own handles and change nothing. The store
/// has one engine thread, held by an updater (an assignment) that waits at a gate
/// until every call is made, so every call runs after the writes that follow it.
pub fn nonblocking_calls_on_devices(ctxs: &[Context]) {
    let n = 4099;
    let last = ctxs[ctxs.len() - 1];
    for kind in ["local", "device"] {
        let kv = KVStore::builder(kind).engine_threads(1).build().expect("store");
        let gate = crate::gated_assign(&kv);
        kv.init("a", &values(n, 1, DType::F32, ctxs[0])).expect("init a");
        kv.init("b", &NDArray::zeros_with(&[n], DType::F32, last).expect("b")).expect("init b");
        let out = NDArray::zeros_with(&[n], DType::F32, last).expect("out");
        let pulled = kv.pull_async("a", &out, 0);
        let pushed = kv.push_async("b", &out, 0); // pushes what the pull writes
        let g = values(n, 2, DType::F32, ctxs[0]);
        let pushed_g = kv.push_async("a", &g, 0);
        g.copy_from(&values(n, 3, DType::F32, ctxs[0])).expect("overwrite"); // the push keeps seed 2
        let wrong = NDArray::zeros_with(&[n + 1], DType::F32, ctxs[0]).expect("wrong");
        let bad_push = kv.push_async("a", &wrong, 0);
        let bad_out = NDArray::full_with(&[n], 7.0, DType::F32, last).expect("bad out");
        let bad_pull = kv.pull_async("nope", &bad_out, 0);
        let ab = [last, ctxs[0]].map(|c| NDArray::zeros_with(&[n], DType::F32, c).expect("out"));
        let read = kv.pull_async(&["a", "b"], &ab, 0);
        crate::open(&gate);
        assert_eq!(bad_push.wait().expect_err("wrong shape").kind(), kvstore_core::ErrorKind::ShapeMismatch);
        assert_eq!(bad_pull.wait().expect_err("no key").kind(), kvstore_core::ErrorKind::KeyNotInitialized);
        for (p, what) in [(pulled, "pull"), (pushed, "push of a pending out"), (pushed_g, "push"), (read, "reads")] {
            p.wait().unwrap_or_else(|e| panic!("{kind}: {what}: {e}"));
        }
        kv.wait_all().expect("the failures went to their handles");
        assert!(bits(&ab[0]) == bits(&values(n, 2, DType::F32, Context::cpu(0))), "{kind}: a is not the lent push");
        assert!(bits(&ab[1]) == bits(&values(n, 1, DType::F32, Context::cpu(0))), "{kind}: b is not a's first value");
        assert!(bits(&bad_out) == bits(&NDArray::full(&[n], 7.0).expect("7")), "{kind}: a failed pull wrote");
    }
}

/// Pushes 5 values of `dtype` from `ctxs` and pulls the sum to the host.
pub fn push_sum(dtype: DType, init_ctx: Context, ctxs: &[Context]) -> Vec<u8> {
    push_sum_of(5, dtype, init_ctx, ctxs)
}

/// [`push_sum`] with `count` pushed values.
pub fn push_sum_of(count: u64, dtype: DType, init_ctx: Context, ctxs: &[Context]) -> Vec<u8> {
    let n = 4099;
    let kv = KVStore::create("device").expect("store");
    kv.init("k", &values(n, 99, dtype, init_ctx)).expect("init");
    let vals: Vec<NDArray> = (0..count).map(|i| values(n, i, dtype, ctxs[i as usize % ctxs.len()])).collect();
    kv.push("k", &vals, 0).expect("push");
    let out = NDArray::zeros_with(&[n], dtype, Context::cpu(0)).expect("out");
    kv.pull("k", &out, 0).expect("pull");
    bits(&out)
}

/// The `[rows, cols]` f32 array of [`values`]`(rows * cols, seed)` on `ctx`.
fn matrix(rows: usize, cols: usize, seed: u64, ctx: Context) -> NDArray {
    let v = values(rows * cols, seed, DType::F32, Context::cpu(0)).to_vec::<f32>().expect("values");
    NDArray::from_vec(&[rows, cols], v).and_then(|a| a.copy_to(ctx)).expect("matrix")
}

/// Row-sparse keys with every array on `ctxs` (values, outs) give the host's bits, on
/// `local` and `device` stores: a row-sparse init, pushes of row-sparse values from two
/// contexts (overlapping rows, summed), with the default updater, lazy SGD with
/// momentum and lazy Adam; dense pulls into outs on `ctxs`, and `row_sparse_pull`s of
/// repeated, unsorted and empty row ids.
pub fn row_sparse_matches_the_host(ctxs: &[Context]) {
    let host = [Context::cpu(0), Context::cpu(0)];
    for opt in [None, Some("sgd"), Some("adam")] {
        let want = row_sparse_run("local", opt, &host);
        for kind in ["local", "device"] {
            assert!(
                row_sparse_run(kind, opt, ctxs) == want,
                "{kind} store, {opt:?}: row-sparse results differ from the host's"
            );
        }
    }
}

fn row_sparse_run(kind: &str, opt: Option<&str>, ctxs: &[Context]) -> Vec<Vec<u8>> {
    use kvstore_core::{Optimizer, RowSparse, StorageType};
    let (rows, cols) = (300, 7);
    let shape = [rows, cols];
    let rsp = |ids: &[i64], seed: u64, ctx: Context| {
        RowSparse::new(matrix(ids.len(), cols, seed, ctx), ids.to_vec(), &shape).expect("row-sparse value")
    };
    let kv = KVStore::create(kind).expect("store");
    kv.init_row_sparse("emb", &rsp(&[0, 5, 17, 299], 1, ctxs[0])).expect("init");
    assert_eq!(kv.stype("emb").expect("stype"), StorageType::RowSparse);
    if let Some(name) = opt {
        let b = Optimizer::builder(name).param("learning_rate", 0.05).param("lazy_update", 1.0);
        let b = if name == "sgd" { b.param("momentum", 0.9) } else { b };
        kv.set_optimizer(b.build().expect("optimizer")).expect("set_optimizer");
    }
    let mut got = Vec::new();
    let out = NDArray::zeros_with(&shape, DType::F32, ctxs[0]).expect("out");
    for step in 0..3u64 {
        let a = rsp(&[1, 5, 17 + step as i64], 10 + step, ctxs[0]);
        let b = rsp(&[5, 200, 299], 20 + step, ctxs[1 % ctxs.len()]);
        kv.push_row_sparse("emb", &[a, b], 0).expect("push_row_sparse");
        kv.pull("emb", &out, 0).expect("pull");
        got.push(bits(&out));
        for ids in [&[299, 5, 5, 1][..], &[], &[17, 18, 19, 0]] {
            let part = kv.row_sparse_pull("emb", ids, 0).expect("row_sparse_pull");
            got.push(bits(part.data()));
            got.push(part.indices().iter().flat_map(|i| i.to_le_bytes()).collect());
        }
    }
    got
}

/// `dist_sync_device` and `dist_async_device` (workers as threads) with every pushed
/// value on `ctxs` give the bits of `dist_sync` and `dist_async` with the same values on
/// the host, on both workers.
pub fn dist_device_stores_match_the_host(ctxs: &[Context]) {
    let sync = |kind: &'static str, ctxs: &[Context]| {
        let ctxs = ctxs.to_vec();
        crate::run_members(2, move |rank, member| {
            let group: std::sync::Arc<dyn kvstore_core::backend::Collective> = member;
            let kv = KVStore::builder(kind).collective(group).build().expect("store");
            dist_train(&kv, rank, &ctxs, false)
        })
    };
    let host = sync("dist_sync", &[Context::cpu(0)]);
    assert_eq!(host[0], host[1], "dist_sync: the same bits on both workers");
    for kind in ["dist_sync_device", "dist_device_sync"] {
        assert!(sync(kind, ctxs) == host, "{kind}: not the bits of dist_sync");
    }
    let asynchronous = |kind: &'static str, ctxs: &[Context]| {
        let ctxs = ctxs.to_vec();
        crate::run_async_kind_workers(kind, 2, move |rank, kv| dist_train(&kv, rank, &ctxs, true))
    };
    let host = asynchronous("dist_async", &[Context::cpu(0)]);
    assert_eq!(host[0], host[1], "dist_async: the same bits on both workers after a barrier");
    for kind in ["dist_async_device", "dist_device_async"] {
        assert!(asynchronous(kind, ctxs) == host, "{kind}: not the bits of dist_async");
    }
}

/// Three steps of SGD with momentum on one key, each worker pushing three values on
/// `ctxs`; then the value's bits after a barrier. With `turns` the workers push one at
/// a time (a barrier between): a `dist_async` owner applies pushes in arrival order,
/// and the bits depend on that order.
fn dist_train(kv: &KVStore, rank: usize, ctxs: &[Context], turns: bool) -> Vec<u8> {
    let n = 4099;
    kv.init("k", &values(n, 99, DType::F32, Context::cpu(0))).expect("init");
    let opt = kvstore_core::Optimizer::builder("sgd").param("learning_rate", 0.1).param("momentum", 0.9);
    kv.set_optimizer(opt.build().expect("sgd")).expect("set_optimizer");
    for step in 0..3u64 {
        let vals: Vec<NDArray> = (0..3)
            .map(|i| values(n, step * 10 + i as u64 + 100 * rank as u64, DType::F32, ctxs[i % ctxs.len()]))
            .collect();
        if !turns {
            kv.push("k", &vals, 0).expect("push");
            continue;
        }
        for turn in 0..kv.num_workers() {
            if turn == rank {
                kv.push("k", &vals, 0).expect("push");
            }
            kv.barrier().expect("barrier");
        }
    }
    kv.barrier().expect("barrier");
    bits(&kv.pull_new("k", 0).expect("pull"))
}

/// The variable that tells [`commit_job`] what to run: `gpu STEPS [DIE]` (the test
/// binary's devices) or `host STEPS` (every value on the host).
pub const COMMIT_JOB: &str = "KVSTORE_TEST_COMMIT_JOB";

/// Commits of a `device` store whose values, pushes, 2-bit residuals and Adam state live
/// on devices restore the same bits: the job of [`commit_job`] on the devices, killed
/// right after committing step 2 and run again, ends with the bits of the same job that
/// never died, and of that job on the host. `child` is the test binary's ignored test
/// that runs [`commit_job`] on its devices (a restart is a new process).
pub fn commits_restore_the_same_bits(child: &str) {
    let dir = crate::TempDir::new(&format!("commits-{child}"));
    let run = |job: &str, spec: &str| {
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new(exe)
            .args(["--exact", child, "--ignored", "--nocapture", "--test-threads", "1"])
            .env(COMMIT_JOB, spec)
            .env("KVSTORE_JOB", job)
            .env("KVSTORE_COMMIT_DIR", dir.dir())
            .env_remove("OMPI_COMM_WORLD_RANK")
            .output()
            .expect("the job runs");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), said)
    };
    // The job's lines (the first may follow the harness's `test NAME ... `).
    let lines = |said: &str, prefix: &str| -> Vec<String> {
        said.lines().filter_map(|l| l.find(prefix).map(|i| l[i..].to_string())).collect()
    };
    let (code, host) = run("on-the-host", "host 6");
    assert_eq!(code, Some(0), "{host}");
    let (code, whole) = run("never-died", "gpu 6");
    assert_eq!(code, Some(0), "{whole}");
    assert_eq!(lines(&whole, "job bits ").len(), 2, "{whole}");
    assert_eq!(lines(&whole, "job bits "), lines(&host, "job bits "), "the devices' bits are not the host's");
    let (code, died) = run("died", "gpu 6 2");
    assert_eq!(code, Some(3), "{died}");
    assert!(lines(&died, "job bits ").is_empty(), "{died}");
    let (code, resumed) = run("died", "gpu 6");
    assert_eq!(code, Some(0), "{resumed}");
    assert_eq!(lines(&resumed, "job restored "), ["job restored 2 at 2"], "{resumed}");
    assert_eq!(
        lines(&resumed, "job bits "),
        lines(&whole, "job bits "),
        "a resumed job's bits are not those of one that never died"
    );
}

/// A job of `STEPS` steps on a `device` store with 2-bit compression and Adam, two keys
/// (their values on the first and the last of `ctxs`), three pushed values per key and
/// step spread over `ctxs`, a commit per step; with `DIE`, it exits with status 3 right
/// after committing that step. It prints `job restored S EXTRA` when it resumed, and at the
/// end `job bits KEY HASH` of each key's value pulled onto the last of `ctxs`. What it runs
/// comes from [`COMMIT_JOB`], set by [`commits_restore_the_same_bits`].
pub fn commit_job(ctxs: &[Context]) {
    let spec = std::env::var(COMMIT_JOB).expect("run by its parent test");
    let words: Vec<&str> = spec.split(' ').collect();
    let ctxs = if words[0] == "host" { vec![Context::cpu(0)] } else { ctxs.to_vec() };
    let steps: u64 = words[1].parse().expect("steps");
    let die: Option<u64> = words.get(2).map(|w| w.parse().expect("a step"));
    let keys = [("k", 4099, ctxs[0]), ("j", 300, ctxs[ctxs.len() - 1])];
    // (Its store commits: the commits installed first.)
    kvstore_commit::install();
    let kv = KVStore::create("device").expect("store");
    kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.5")]).expect("set_gradient_compression");
    let start = match kv.restored() {
        Some(r) => {
            println!("job restored {} {}", r.step, String::from_utf8_lossy(&r.extra));
            r.step + 1
        }
        None => {
            for (i, (key, n, ctx)) in keys.iter().enumerate() {
                kv.init(*key, &values(*n, 90 + i as u64, DType::F32, *ctx)).expect("init");
            }
            let adam = kvstore_core::Optimizer::builder("adam").param("learning_rate", 0.01).build().expect("adam");
            kv.set_optimizer(adam).expect("set_optimizer");
            0
        }
    };
    for step in start..steps {
        for (key, n, _) in keys {
            let vals: Vec<NDArray> =
                (0..3).map(|i| values(n, step * 10 + i as u64, DType::F32, ctxs[i % ctxs.len()])).collect();
            kv.push(key, &vals, 0).expect("push");
        }
        kv.commit(step, format!("at {step}").as_bytes()).expect("commit");
        if die == Some(step) {
            std::process::exit(3);
        }
    }
    for (key, n, _) in keys {
        let out = NDArray::zeros_with(&[n], DType::F32, ctxs[ctxs.len() - 1]).expect("out");
        kv.pull(key, &out, 0).expect("pull");
        // FNV-1a of the bits: equal lines are equal values.
        let hash = bits(&out).iter().fold(0xcbf29ce484222325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100000001b3));
        println!("job bits {key} {hash:016x}");
    }
}
