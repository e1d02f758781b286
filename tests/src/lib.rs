//! Shared test code of the kvstore workspace: the conformance cases of the reference
//! (`mxnet-kvstore-semantics.md` §10) and the property tests against a reference model
//! ([`properties`]), written once as functions of a [`Backend`]; [`backend_tests!`]
//! makes one `#[test]` of each per backend, so that the CPU, simulated-device and CUDA
//! test binaries run the same tests from one list (as candle's `test_device!`). The
//! `dist_sync` cases ([`dist_cases`]) are functions of a worker, for the thread and MPI
//! runners.

use std::sync::{Arc, Mutex};

/// The README's Rust quickstart, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

use kvstore_core::{Context, DType, ErrorKind, KVStore, Key, NDArray, Result};

/// What a conformance case needs from a backend: stores and the contexts of devices.
pub trait Backend {
    /// A short name for messages.
    fn name(&self) -> &str;
    /// A store of `kind` ("local" or "device").
    fn store(&self, kind: &str) -> KVStore;
    /// The kind of the stores `store(kind)` makes: `kind`, unless the backend maps it.
    fn store_kind<'a>(&self, kind: &'a str) -> &'a str {
        kind
    }
    /// The context of device `i` (values pushed "from several devices").
    fn ctx(&self, i: u32) -> Context;
}

/// The host backend: `cpu(i)` contexts.
pub struct Cpu;

impl Backend for Cpu {
    fn name(&self) -> &str {
        "cpu"
    }
    fn store(&self, kind: &str) -> KVStore {
        KVStore::create(kind).expect("create a store")
    }
    fn ctx(&self, i: u32) -> Context {
        Context::cpu(i)
    }
}

/// Device contexts `gpu(i % count)` of the installed device backend; `store(kind)`
/// makes `device` stores instead of `local` ones when `device_store` is set.
pub struct Gpus {
    /// How many devices the backend has.
    pub count: u32,
    /// Whether "local" stores become "device" stores.
    pub device_store: bool,
}

impl Backend for Gpus {
    fn name(&self) -> &str {
        if self.device_store { "gpu (device store)" } else { "gpu (local store)" }
    }
    fn store(&self, kind: &str) -> KVStore {
        KVStore::create(self.store_kind(kind)).expect("create a store")
    }
    fn store_kind<'a>(&self, kind: &'a str) -> &'a str {
        if self.device_store && kind == "local" { "device" } else { kind }
    }
    fn ctx(&self, i: u32) -> Context {
        Context::gpu(i % self.count.max(1))
    }
}

pub mod properties;
pub mod sim_device;

/// Makes the shared tests of the lists named after `;` (`cases`: the conformance cases,
/// `properties`: the property tests of [`properties`]) into tests of one backend: one
/// `#[test]` per shared function, by its name, in a module `$module`. Each list is
/// written once, here, and every backend's binary runs it.
///
/// `$backend` is evaluated in each test, inside `$module` (so it sees the items of the
/// module around it), and gives the [`Backend`]: `cpu = Cpu` makes the tests
/// `cpu::case_01_init_then_pull` and so on. After `available` it gives an `Option` of
/// one instead: `None` skips the test, for machines without the device (the expression
/// prints why, as kvstore-cuda's GPU tests print `SKIP: no CUDA device`).
///
/// ```
/// use kvstore_tests::Gpus;
///
/// kvstore_tests::backend_tests!(cpu = kvstore_tests::Cpu; cases, properties);
/// kvstore_tests::backend_tests!(gpu_device_store = available gpus(true); cases);
///
/// /// The devices, or `None` (after printing why) where there are none.
/// fn gpus(device_store: bool) -> Option<Gpus> {
///     Some(Gpus { count: 4, device_store })
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($module:ident = available $backend:expr; $($list:ident),+ $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            /// The backend of this module's tests, or `None` where the machine lacks it.
            fn backend() -> ::core::option::Option<impl $crate::Backend> {
                $backend
            }

            $($crate::backend_tests! { @$list tests })+
        }
    };
    ($module:ident = $backend:expr; $($list:ident),+ $(,)?) => {
        $crate::backend_tests!($module = available ::core::option::Option::Some($backend); $($list),+);
    };

    // The lists. `tests` makes the tests; `names` their names, for the check that every
    // shared case is listed.
    (@cases $then:ident) => {
        $crate::backend_tests! { @$then $crate;
            case_01_init_then_pull,
            case_02_push_assigns,
            case_03_push_from_devices_sums_and_pull_broadcasts,
            case_04_updater_merges_later_pushes,
            case_05_list_push_with_updater,
            case_06_clojure_tutorial_string_keys,
            case_07_aggregate_four_devices,
            case_08_repeated_keys_group_and_sum,
            case_09_updater_call_log,
            case_10_updater_index_is_first_init_order,
            case_11_errors,
            case_14_pushpull_in_place,
            case_15_broadcast,
            case_16_f16_sums_accumulate_in_f32,
            case_17_f32_sums_run_left_to_right,
            case_18_push_copies,
            case_22_metadata,
        }
    };
    (@properties $then:ident) => {
        $crate::backend_tests! { @$then $crate::properties;
            random_call_sequences_agree_with_the_model,
            an_init_list_with_one_bad_key_inits_nothing,
            a_push_list_with_one_bad_entry_pushes_nothing,
            big_pushes_give_the_naive_sum_bit_for_bit_for_any_thread_count,
        }
    };

    (@tests $shared:path; $($test:ident),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                use $shared as shared;
                if let ::core::option::Option::Some(backend) = backend() {
                    shared::$test(&backend);
                }
            }
        )+
    };
    (@names $shared:path; $($test:ident),+ $(,)?) => {
        &[$(::core::stringify!($test)),+]
    };
}

/// A folder of one test in the system's temp dir, removed (with what the test left in
/// it) when dropped, so that no run leaves files behind.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// A fresh, empty folder for the test `name` of this process.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kvstore-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    /// The folder.
    pub fn dir(&self) -> &std::path::Path {
        &self.0
    }

    /// The path of `file` in the folder.
    pub fn path(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks shared by every device backend (the simulated one and CUDA): the same
/// functions, so a GPU run checks exactly what the simulated run checks.
pub mod device_checks {
    use kvstore_core::{Context, DType, KVStore, NDArray};

    /// Deterministic values of `dtype` with mixed signs and magnitudes (so that the f32
    /// accumulation order of f16/bf16 shows in the bits).
    pub fn values(n: usize, seed: u64, dtype: DType, ctx: Context) -> NDArray {
        let data: Vec<f64> = (0..n)
            .map(|i| {
                let x =
                    (i as u64).wrapping_mul(6364136223846793005).wrapping_add(seed.wrapping_mul(1442695040888963407));
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
            for (p, what) in [(pulled, "pull"), (pushed, "push of a pending out"), (pushed_g, "push"), (read, "reads")]
            {
                p.wait().unwrap_or_else(|e| panic!("{kind}: {what}: {e}"));
            }
            kv.wait_all().expect("the failures went to their handles");
            assert!(bits(&ab[0]) == bits(&values(n, 2, DType::F32, Context::cpu(0))), "{kind}: a is not the lent push");
            assert!(
                bits(&ab[1]) == bits(&values(n, 1, DType::F32, Context::cpu(0))),
                "{kind}: b is not a's first value"
            );
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
}

/// `value` everywhere, f32, shape `shape`, on `ctx`.
pub fn full(shape: &[usize], value: f64, ctx: Context) -> NDArray {
    NDArray::full_with(shape, value, DType::F32, ctx).expect("allocate")
}

/// Pulls `key` into a fresh f32 array of `shape` and returns its elements.
pub fn pulled(kv: &KVStore, key: impl Into<Key>, shape: &[usize]) -> Vec<f64> {
    let out = NDArray::zeros(shape).expect("allocate");
    kv.pull(key.into(), &out, 0).expect("pull");
    out.to_f64_vec().expect("read")
}

/// Asserts every element of `a` is `v`.
pub fn assert_all(a: &NDArray, v: f64) {
    let got = a.to_f64_vec().expect("read");
    assert!(got.iter().all(|&x| x == v), "expected all {v}, got {got:?}");
}

/// A log of updater calls: (key, index, first element of the merged value).
pub type CallLog = Arc<Mutex<Vec<(String, usize, f64)>>>;

/// Installs an updater that logs each call's key, index and the first element of the
/// merged value, then merges with `merge(merged, stored)`.
fn install_logging(kv: &KVStore, merge: fn(&NDArray, &NDArray) -> Result<()>) -> CallLog {
    let log: CallLog = Arc::default();
    let l = Arc::clone(&log);
    kv.set_updater(move |key: &Key, index: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        let first = merged.to_f64_vec()?.first().copied().unwrap_or(0.0);
        l.lock().expect("log").push((key.to_string(), index, first));
        merge(merged, stored)
    })
    .expect("install the updater");
    log
}

/// A gate that calls can be held at until a test opens it.
pub type Gate = Arc<(Mutex<bool>, std::sync::Condvar)>;

/// Waits (at most 10 s) until `gate` is opened.
pub fn wait_at(gate: &Gate) {
    let open = gate.0.lock().expect("gate");
    drop(gate.1.wait_timeout_while(open, std::time::Duration::from_secs(10), |open| !*open).expect("gate"));
}

/// Opens `gate`.
pub fn open(gate: &Gate) {
    *gate.0.lock().expect("gate") = true;
    gate.1.notify_all();
}

/// Opens `gate` from another thread after `ms` milliseconds.
pub fn open_later(gate: &Gate, ms: u64) -> std::thread::JoinHandle<()> {
    let gate = Arc::clone(gate);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        open(&gate);
    })
}

/// Installs an assigning updater that waits (at most 10 s) until the returned gate is
/// opened ([`open`]): keeps calls queued for as long as a test needs.
pub fn gated_assign(kv: &KVStore) -> Gate {
    let gate: Gate = Arc::default();
    let g = Arc::clone(&gate);
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        wait_at(&g);
        stored.copy_from(merged)
    })
    .expect("install the updater");
    gate
}

/// Installs the tutorial's updater `stored += 2 * input`, logging each call.
pub fn install_add_twice(kv: &KVStore) -> CallLog {
    install_logging(kv, |merged, stored| stored.add_assign(&merged.mul(2.0)?))
}

/// Installs an updater that logs each call and assigns (MXNet's default behaviour).
pub fn install_logging_assign(kv: &KVStore) -> CallLog {
    install_logging(kv, |merged, stored| stored.copy_from(merged))
}

const SHAPE: [usize; 2] = [2, 3];

fn devices(b: &dyn Backend, n: u32, value: f64) -> Vec<NDArray> {
    (0..n).map(|i| full(&SHAPE, value, b.ctx(i))).collect()
}

/// Cases 1–4 build on one another, as in the Python tutorial: this runs 1–3 and
/// returns the store holding 4.
fn tutorial_store(b: &dyn Backend) -> KVStore {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    kv.push(3, &full(&SHAPE, 8.0, b.ctx(0)), 0).expect("push");
    kv.push(3, &devices(b, 4, 1.0), 0).expect("push from 4 devices");
    kv
}

/// Case 1: `init(3, ones*2)`, then `pull(3)` gives all 2.
pub fn case_01_init_then_pull(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    let a = NDArray::zeros_with(&SHAPE, DType::F32, b.ctx(0)).expect("alloc");
    kv.pull(3, &a, 0).expect("pull");
    assert_all(&a, 2.0);
}

/// Case 2: a push replaces the value (ASSIGN).
pub fn case_02_push_assigns(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    kv.push(3, &full(&SHAPE, 8.0, b.ctx(0)), 0).expect("push");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![8.0; 6]);
}

/// Case 3: values from four devices are summed; a pull broadcasts to four outs.
pub fn case_03_push_from_devices_sums_and_pull_broadcasts(b: &dyn Backend) {
    let kv = tutorial_store(b);
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![4.0; 6]);
    let outs = devices(b, 4, 0.0);
    kv.pull(3, &outs, 0).expect("pull into 4");
    outs.iter().for_each(|o| assert_all(o, 4.0));
}

/// Case 4: an updater installed later changes only later pushes, and sees key "3".
pub fn case_04_updater_merges_later_pushes(b: &dyn Backend) {
    let kv = tutorial_store(b);
    let log = install_add_twice(&kv);
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![4.0; 6]);
    kv.push(3, &full(&SHAPE, 1.0, b.ctx(0)), 0).expect("push");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![6.0; 6]);
    assert_eq!(*log.lock().expect("log"), vec![("3".to_string(), 0, 1.0)]);
}

/// Case 5: list push with the updater: one call per key in key order; then a nested
/// push from four devices per key.
pub fn case_05_list_push_with_updater(b: &dyn Backend) {
    let kv = tutorial_store(b);
    let log = install_add_twice(&kv);
    let keys = [5, 7, 9];
    kv.init(&keys, &devices(b, 3, 1.0)).expect("init list");
    kv.push(&keys, &devices(b, 3, 1.0), 0).expect("list push");
    for k in keys {
        assert_eq!(pulled(&kv, k, &SHAPE), vec![3.0; 6]);
    }
    let order: Vec<String> = log.lock().expect("log").iter().map(|c| c.0.clone()).collect();
    assert_eq!(order, ["5", "7", "9"]);
    let nested: Vec<Vec<NDArray>> = keys.iter().map(|_| devices(b, 4, 1.0)).collect();
    kv.push(&keys, &nested, 0).expect("nested push");
    let outs: Vec<Vec<NDArray>> = keys.iter().map(|_| devices(b, 4, 0.0)).collect();
    kv.pull(&keys, &outs, 0).expect("nested pull");
    outs.iter().flatten().for_each(|o| assert_all(o, 11.0));
    assert_eq!(log.lock().expect("log").len(), 6);
}

/// Case 6: the Clojure tutorial, string keys.
pub fn case_06_clojure_tutorial_string_keys(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&["3"], &[full(&SHAPE, 2.0, b.ctx(0))]).expect("init");
    assert_eq!(pulled(&kv, "3", &SHAPE), vec![2.0; 6]);
    kv.push(&["3"], &[full(&SHAPE, 8.0, b.ctx(0))], 0).expect("push");
    assert_eq!(pulled(&kv, "3", &SHAPE), vec![8.0; 6]);
    kv.push(&["3", "3", "3"], &devices(b, 3, 1.0), 0).expect("push repeated key");
    assert_eq!(pulled(&kv, "3", &SHAPE), vec![3.0; 6]);
    let outs = devices(b, 2, 1.0);
    kv.pull(&["3", "3"], &outs, 0).expect("pull into two");
    outs.iter().for_each(|o| assert_all(o, 3.0));
    let ks = ["5", "7", "9"];
    kv.init(&ks, &devices(b, 3, 1.0)).expect("init list");
    kv.push(&ks, &devices(b, 3, 1.0), 0).expect("push list");
    let outs = devices(b, 3, 0.0);
    kv.pull(&ks, &outs, 0).expect("pull list");
    outs.iter().for_each(|o| assert_all(o, 1.0));
}

/// Case 7: clojure-mxnet's `test-aggregate`, shape (4, 4).
pub fn case_07_aggregate_four_devices(b: &dyn Backend) {
    let shape = [4, 4];
    let kv = b.store("local");
    kv.init("a", &full(&shape, 0.0, b.ctx(0))).expect("init");
    let ones: Vec<NDArray> = (0..4).map(|i| full(&shape, 1.0, b.ctx(i))).collect();
    kv.push("a", &ones, 0).expect("push");
    assert_eq!(pulled(&kv, "a", &shape), vec![4.0; 16]);
    let ks = ["b", "c", "d"];
    kv.init(&ks, &[full(&shape, 0.0, b.ctx(0)), full(&shape, 0.0, b.ctx(0)), full(&shape, 0.0, b.ctx(0))])
        .expect("init list");
    let twos: Vec<Vec<NDArray>> = ks.iter().map(|_| (0..4).map(|i| full(&shape, 2.0, b.ctx(i))).collect()).collect();
    kv.push(&ks, &twos, 0).expect("push");
    for k in ks {
        assert_eq!(pulled(&kv, k, &shape), vec![8.0; 16]);
    }
}

/// Case 8: repeated keys in a list push are grouped and summed; a list pull with
/// repeats copies each key's value.
pub fn case_08_repeated_keys_group_and_sum(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&[5, 7], &devices(b, 2, 0.0)).expect("init");
    let vals = [full(&SHAPE, 1.0, b.ctx(0)), full(&SHAPE, 2.0, b.ctx(1)), full(&SHAPE, 10.0, b.ctx(2))];
    kv.push(&[5, 5, 7], &vals, 0).expect("push");
    let outs = devices(b, 3, 0.0);
    kv.pull(&[5, 7, 5], &outs, 0).expect("pull");
    let got: Vec<f64> = outs.iter().map(|o| o.to_f64_vec().expect("read")[0]).collect();
    assert_eq!(got, [3.0, 10.0, 3.0]);
}

/// Case 9: the updater runs once per distinct key with the sum, in key order.
pub fn case_09_updater_call_log(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&[1, 2], &devices(b, 2, 0.0)).expect("init");
    let log = install_logging_assign(&kv);
    let vals: Vec<NDArray> = (1..=5).map(|v| full(&SHAPE, v as f64, b.ctx(0))).collect();
    kv.push(&[2, 1, 2, 1, 1], &vals, 0).expect("push");
    assert_eq!(*log.lock().expect("log"), vec![("1".to_string(), 0, 11.0), ("2".to_string(), 1, 4.0)]);

    let kv = b.store("local");
    kv.init(&["b", "a"], &devices(b, 2, 0.0)).expect("init");
    let log = install_logging_assign(&kv);
    let vals: Vec<NDArray> = (1..=3).map(|v| full(&SHAPE, v as f64, b.ctx(0))).collect();
    kv.push(&["a", "b", "a"], &vals, 0).expect("push");
    assert_eq!(*log.lock().expect("log"), vec![("b".to_string(), 0, 2.0), ("a".to_string(), 1, 4.0)]);
}

/// Case 10: the index an updater receives is the key's number in first-init order
/// (what MXNet's Scala/Clojure int-only updater got for string keys).
pub fn case_10_updater_index_is_first_init_order(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&["3", "5", "7"], &devices(b, 3, 0.0)).expect("init");
    kv.init("1", &full(&SHAPE, 0.0, b.ctx(0))).expect("init");
    let log = install_logging_assign(&kv);
    kv.push(&["7", "3", "1"], &devices(b, 3, 1.0), 0).expect("push");
    let indices: Vec<usize> = log.lock().expect("log").iter().map(|c| c.1).collect();
    assert_eq!(indices, [0, 2, 3]);
    assert_eq!(kv.key_index("7"), Some(2));
}

/// Case 11: the error classes of the reference, with the store unchanged after each.
pub fn case_11_errors(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    let kind = |r: Result<()>| r.expect_err("must fail").kind();
    assert_eq!(kind(kv.init(3, &full(&SHAPE, 1.0, b.ctx(0)))), ErrorKind::AlreadyInitialized);
    assert_eq!(kind(kv.init("3", &full(&SHAPE, 1.0, b.ctx(0)))), ErrorKind::AlreadyInitialized);
    let out = NDArray::zeros(&SHAPE).expect("alloc");
    assert_eq!(kind(kv.pull(100, &out, 0)), ErrorKind::KeyNotInitialized);
    assert_eq!(kind(kv.push(100, &out, 0)), ErrorKind::KeyNotInitialized);
    assert_eq!(kind(kv.pull("zz", &out, 0)), ErrorKind::KeyNotInitialized);
    let wrong = NDArray::zeros(&[4, 4]).expect("alloc");
    assert_eq!(kind(kv.pull(3, &wrong, 0)), ErrorKind::ShapeMismatch);
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![2.0; 6]);
}

/// Case 14: `pushpull` with no outs writes the result into the pushed arrays.
pub fn case_14_pushpull_in_place(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init("w", &full(&SHAPE, 0.0, b.ctx(0))).expect("init");
    let w = full(&SHAPE, 3.0, b.ctx(0));
    kv.pushpull_in_place("w", &w, 0).expect("pushpull");
    assert_all(&w, 3.0);
    let kv = b.store("local");
    kv.init(&[1, 2], &devices(b, 2, 0.0)).expect("init");
    let vals = vec![vec![full(&SHAPE, 1.0, b.ctx(0)), full(&SHAPE, 2.0, b.ctx(1))], vec![full(&SHAPE, 3.0, b.ctx(0))]];
    kv.pushpull_in_place(&[1, 2], &vals, 0).expect("pushpull nested");
    vals.iter().flatten().for_each(|v| assert_all(v, 3.0));
    let outs = devices(b, 2, 0.0);
    kv.pushpull(1, &devices(b, 2, 2.5), &outs, 0).expect("pushpull with outs");
    outs.iter().for_each(|o| assert_all(o, 5.0));
}

/// Case 15: `broadcast` is init then pull; a second broadcast of a key is an error.
pub fn case_15_broadcast(b: &dyn Backend) {
    let kv = b.store("local");
    let a = NDArray::zeros(&SHAPE).expect("alloc");
    kv.broadcast("b", &full(&SHAPE, 2.0, b.ctx(0)), &a, 0).expect("broadcast");
    assert_all(&a, 2.0);
    let e = kv.broadcast("b", &full(&SHAPE, 3.0, b.ctx(0)), &a, 0).expect_err("second broadcast");
    assert_eq!(e.kind(), ErrorKind::AlreadyInitialized);
    assert!(e.to_string().contains("duplicate init of key \"b\""), "{e}");
    assert_all(&a, 2.0);
    let xy = devices(b, 2, 0.0);
    kv.broadcast("c", &full(&SHAPE, 5.0, b.ctx(0)), &xy, 0).expect("broadcast to two");
    xy.iter().for_each(|o| assert_all(o, 5.0));
}

fn push_f16(b: &dyn Backend, kind: &str, values: &[f32]) -> f32 {
    let kv = b.store(kind);
    let z = NDArray::zeros_with(&[1], DType::F16, b.ctx(0)).expect("alloc");
    kv.init(0, &z).expect("init");
    let vals: Vec<NDArray> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| NDArray::full_with(&[1], v as f64, DType::F16, b.ctx(i as u32)).expect("alloc"))
        .collect();
    kv.push(0, &vals, 0).expect("push");
    kv.pull(0, &z, 0).expect("pull");
    z.to_vec::<f32>().expect("read")[0]
}

/// Case 16, with the deliberate difference: f16 sums accumulate in f32 and round
/// once, so every order of [1, 2048, 1] gives 2050 on every store kind (MXNet's
/// `local` gave 2048 for [1, 2048, 1] and [1, 1, 2048]). Overflow still gives inf.
pub fn case_16_f16_sums_accumulate_in_f32(b: &dyn Backend) {
    for kind in ["local", "device"] {
        assert_eq!(push_f16(b, kind, &[1.0, 2048.0, 1.0]), 2050.0);
        assert_eq!(push_f16(b, kind, &[2048.0, 1.0, 1.0]), 2050.0);
        assert_eq!(push_f16(b, kind, &[1.0, 1.0, 2048.0]), 2050.0);
        assert_eq!(push_f16(b, kind, &[60000.0, 60000.0]), f32::INFINITY);
    }
}

/// Case 17, with the deliberate difference: f32 sums run left to right on every
/// kind, so [4, 4, 1e8] gives 100000008 (MXNet's `device` result; `local` gave 1e8).
pub fn case_17_f32_sums_run_left_to_right(b: &dyn Backend) {
    for kind in ["local", "device"] {
        let kv = b.store(kind);
        kv.init(0, &full(&[1], 0.0, b.ctx(0))).expect("init");
        let vals = [full(&[1], 4.0, b.ctx(0)), full(&[1], 4.0, b.ctx(1)), full(&[1], 1e8, b.ctx(2))];
        kv.push(0, &vals, 0).expect("push");
        assert_eq!(pulled(&kv, 0, &[1]), vec![100000008.0]);
    }
}

/// Case 18, with the deliberate difference: push copies, so changing the pushed
/// array afterwards does not change the store (MXNet aliased a single pushed value).
pub fn case_18_push_copies(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 0.0, b.ctx(0))).expect("init");
    let g = full(&SHAPE, 1.0, b.ctx(0));
    kv.push(3, &g, 0).expect("push");
    g.copy_from(&full(&SHAPE, 42.0, b.ctx(0))).expect("overwrite");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![1.0; 6]);
}

/// Case 22: metadata; unknown kinds are errors (MXNet made them local stores).
pub fn case_22_metadata(b: &dyn Backend) {
    let kv = b.store("local");
    assert_eq!((kv.kind(), kv.rank(), kv.num_workers()), (b.store_kind("local"), 0, 1));
    assert_eq!(b.store("LOCAL").kind(), "local");
    assert_eq!(b.store("device").kind(), "device");
    assert!(kv.barrier().is_ok());
    assert_eq!(kv.num_dead_node(4), 0);
    kv.set_barrier_before_exit(false);
    assert!(kv.send_command_to_servers(0, "").is_ok());
    assert!(kv.is_capable("OPTIMIZER").expect("known capability"));
    assert_eq!(kv.is_capable("teleport").expect_err("unknown capability").kind(), ErrorKind::InvalidArgument);
    assert_eq!(KVStore::create("horovod").expect_err("unknown").kind(), ErrorKind::UnknownStoreKind);
    assert_eq!(KVStore::create("dist_sync").expect_err("no mpi").kind(), ErrorKind::Unsupported);
    assert_eq!(KVStore::create("nccl").expect_err("no nccl").kind(), ErrorKind::Unsupported);
}

/// A worker group of threads in one process: each thread is a worker with its own
/// store, and the collective operations meet at barriers. It runs the `dist_sync`
/// semantics without MPI (kvstore-mpi runs the same cases across processes).
pub struct ThreadGroup {
    size: usize,
    barrier: std::sync::Barrier,
    deposits: Mutex<Vec<Vec<NDArray>>>,
}

/// One worker's view of a [`ThreadGroup`].
pub struct ThreadMember {
    group: Arc<ThreadGroup>,
    rank: usize,
}

impl ThreadGroup {
    /// A group of `size` workers; hand `member(r)` to the thread of rank `r`.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(ThreadGroup {
            size,
            barrier: std::sync::Barrier::new(size),
            deposits: Mutex::new(vec![Vec::new(); size]),
        })
    }

    /// The worker of rank `rank`.
    pub fn member(self: &Arc<Self>, rank: usize) -> Arc<ThreadMember> {
        Arc::new(ThreadMember { group: Arc::clone(self), rank })
    }
}

impl ThreadMember {
    /// Deposits copies of `arrays`, waits for every worker, runs `read` over every
    /// worker's deposits (in rank order), then waits again so deposits stay until all
    /// have read them.
    fn exchange(&self, arrays: &[&NDArray], read: impl FnOnce(&[Vec<NDArray>]) -> Result<()>) -> Result<()> {
        let copies = arrays.iter().map(|a| a.deep_copy()).collect::<Result<Vec<_>>>()?;
        self.group.deposits.lock().expect("deposits")[self.rank] = copies;
        self.group.barrier.wait();
        let all = self.group.deposits.lock().expect("deposits").clone();
        let r = read(&all);
        self.group.barrier.wait();
        r
    }
}

impl kvstore_core::backend::Collective for ThreadMember {
    fn name(&self) -> &'static str {
        "threads"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.size
    }
    fn barrier(&self) -> Result<()> {
        self.group.barrier.wait();
        Ok(())
    }
    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()> {
        let sources: Vec<&NDArray> = pairs.iter().map(|p| p.0).collect();
        self.exchange(&sources, |all| {
            for (j, (_, out)) in pairs.iter().enumerate() {
                // Rank order on every worker: bit-identical results everywhere.
                let sum = all[0][j].deep_copy()?;
                for worker in &all[1..] {
                    sum.add_assign(&worker[j])?;
                }
                out.copy_from(&sum)?;
            }
            Ok(())
        })
    }
    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()> {
        self.exchange(arrays, |all| {
            for (j, out) in arrays.iter().enumerate() {
                out.copy_from(&all[root][j])?;
            }
            Ok(())
        })
    }
}

/// A `dist_sync` store of the worker `member` (several stores of one worker share its
/// group, as the stores of one MPI process do).
pub fn dist_store(member: &Arc<ThreadMember>) -> KVStore {
    let group: Arc<dyn kvstore_core::backend::Collective> = Arc::clone(member) as _;
    KVStore::builder("dist_sync").num_threads(1).collective(group).build().expect("dist_sync")
}

/// Runs `worker(rank, member)` on `size` threads, each a worker of one [`ThreadGroup`],
/// and returns their results in rank order.
pub fn run_members<T: Send + 'static>(
    size: usize,
    worker: impl Fn(usize, Arc<ThreadMember>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let group = ThreadGroup::new(size);
    let worker = Arc::new(worker);
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (member, worker) = (group.member(rank), Arc::clone(&worker));
            std::thread::spawn(move || worker(rank, member))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("worker panicked")).collect()
}

/// Runs `worker(rank, store)` on `size` threads, each with a `dist_sync` store of one
/// [`ThreadGroup`], and returns their results in rank order.
pub fn run_workers<T: Send + 'static>(
    size: usize,
    worker: impl Fn(usize, KVStore) -> T + Send + Sync + 'static,
) -> Vec<T> {
    run_members(size, move |rank, member| worker(rank, dist_store(&member)))
}

/// The `dist_sync` cases (reference §9, case 23), written once as functions of one
/// worker's rank and store; they assert what that worker must see for the store's
/// number of workers W. The thread runner (`tests/tests/dist.rs`) and the MPI runner
/// (`kvstore-mpi/tests/mpi.rs`) call the same functions.
pub mod dist_cases {
    use kvstore_core::{Context, DType, KVStore, Key, NDArray, Optimizer, Result};

    use super::{full, pulled};

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
            let outs: Vec<NDArray> = shapes
                .iter()
                .zip(dtypes)
                .map(|(s, d)| NDArray::zeros_with(s, d, Context::cpu(0)).expect("o"))
                .collect();
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
            let g =
                NDArray::from_vec(&SHAPE, (0..6).map(|i| (i * (rank + 1) + step) as f32 * 0.37).collect()).expect("g");
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
            for (i, (k, _, _)) in
                keys.iter().enumerate().rev().filter(|(_, (k, _, _))| step >= 3 || !k.ends_with("-late"))
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
                    resumed
                        .init(k.as_str(), &NDArray::zeros_with(&[*n], *d, Context::cpu(0)).expect("z"))
                        .expect("init");
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
}

/// The bench helpers, for the bench binaries outside criterion (the MPI and GPU benches).
#[path = "../../kvstore-core/benches/common/mod.rs"]
pub mod bench;

#[cfg(test)]
mod tests {
    /// The names of the `pub fn`s of `source` that start with `prefix`, sorted.
    fn shared(source: &str, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = source
            .lines()
            .filter_map(|l| l.strip_prefix("pub fn "))
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.split('(').next().unwrap_or(l).to_string())
            .collect();
        names.sort_unstable();
        names
    }

    fn sorted(names: &[&str]) -> Vec<String> {
        let mut names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        names.sort_unstable();
        names
    }

    /// A case or property written but missing from `backend_tests!`'s lists would run
    /// on no backend.
    #[test]
    fn every_shared_case_and_property_is_in_the_backend_tests_lists() {
        let cases: &[&str] = crate::backend_tests!(@cases names);
        assert_eq!(sorted(cases), shared(include_str!("lib.rs"), "case_"));
        let properties: &[&str] = crate::backend_tests!(@properties names);
        assert_eq!(sorted(properties), shared(include_str!("properties.rs"), ""));
    }
}
