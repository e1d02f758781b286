//! kvstore-cuda against a real GPU: the same device checks as the simulated backend
//! (`kvstore_tests::device_checks`): every conformance case on `gpu(i)` contexts, with
//! `local` and `device` stores, and the property tests against the reference model
//! (both from `kvstore_tests::backend_tests!`, as in the CPU and simulated-device
//! binaries), sums bit-identical to the host for every dtype, mixed host and GPU values,
//! peer copies.
//! Without a CUDA device each test prints `SKIP: no CUDA device` and passes;
//! `KVSTORE_REQUIRE_CUDA=1` makes that a failure (checked, each test alone, by
//! `without_a_device_every_gpu_test_fails_when_cuda_is_required`). The first test runs
//! everywhere: no CUDA is a clear error, never a panic.

use kvstore_core::{Context, DType, ErrorKind, KVStore, NDArray};
use kvstore_tests::Gpus;
use kvstore_tests::device_checks::{self, bits, push_sum, push_sum_of, values};

fn gpus() -> Option<u32> {
    kvstore_cuda::register().ok()?;
    Some(kvstore_cuda::device_count() as u32)
}

// The shared conformance cases on every GPU, with `local` stores and with `device`
// stores (`gpu_local_store::case_01_init_then_pull`, ...), and the property tests with
// every array on the GPUs (`gpus::random_call_sequences_agree_with_the_model`, ...).
kvstore_tests::backend_tests!(gpu_local_store = available cuda_gpus(module_path!(), false); cases);
kvstore_tests::backend_tests!(gpu_device_store = available cuda_gpus(module_path!(), true); cases);
kvstore_tests::backend_tests!(gpus = available cuda_gpus(module_path!(), false); properties);

/// The GPUs, for the tests of `module`; `None` after printing `SKIP: no CUDA device`
/// where there is none (a failure under `KVSTORE_REQUIRE_CUDA=1`).
fn cuda_gpus(module: &str, device_store: bool) -> Option<Gpus> {
    if !kvstore_cuda::gpu_or_skip(module) {
        return None;
    }
    Some(Gpus { count: gpus().expect("register"), device_store })
}

#[test]
fn without_cuda_every_gpu_call_is_a_clear_error() {
    if kvstore_cuda::is_available() {
        return; // the GPU tests below cover this machine
    }
    let reason = kvstore_cuda::unavailable_reason().expect("a reason");
    assert!(!reason.is_empty());
    assert_eq!(kvstore_cuda::device_count(), 0);
    let e = kvstore_cuda::register().expect_err("no CUDA");
    assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
    assert!(e.to_string().contains(&reason), "{e}");
    let e = NDArray::zeros_with(&[2], DType::F32, Context::gpu(0)).expect_err("no GPU");
    assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
    let kv = KVStore::create("device").expect("store");
    assert_eq!(kv.init("w", &NDArray::zeros(&[2]).expect("w")).map(|()| kv.keys().len()).expect("init"), 1);
}

/// Without a device, every other test of this program skips through `gpu_or_skip`: run
/// alone with `KVSTORE_REQUIRE_CUDA=1`, each fails, so none passes without a GPU having
/// checked nothing (a GPU run, which sets it, cannot pass vacuously either).
#[test]
fn without_a_device_every_gpu_test_fails_when_cuda_is_required() {
    use std::process::Command;
    if kvstore_cuda::is_available() {
        return; // every test runs here
    }
    let me = std::env::current_exe().expect("this test's program");
    let list = |args: &[&str]| {
        let listed = Command::new(&me).args(args).output().expect("listing the tests");
        String::from_utf8(listed.stdout).expect("the list")
    };
    let listed = list(&["--list", "--format", "terse"]);
    // Ignored tests are the jobs their parent tests run (each parent is checked here).
    let ignored = list(&["--list", "--ignored", "--format", "terse"]);
    let mut others = vec![
        "without_cuda_every_gpu_call_is_a_clear_error",
        "without_a_device_every_gpu_test_fails_when_cuda_is_required",
    ];
    others.extend(ignored.lines().filter_map(|l| l.strip_suffix(": test")));
    let gpu_tests: Vec<&str> =
        listed.lines().filter_map(|l| l.strip_suffix(": test")).filter(|name| !others.contains(name)).collect();
    assert!(gpu_tests.len() >= 40, "only {} GPU tests listed:\n{listed}", gpu_tests.len());
    for name in gpu_tests {
        let run = Command::new(&me)
            .env("KVSTORE_REQUIRE_CUDA", "1")
            .args(["--exact", name, "--test-threads=1"])
            .output()
            .expect("running a GPU test");
        assert!(!run.status.success(), "{name} passed without a CUDA device under KVSTORE_REQUIRE_CUDA=1");
    }
}

#[test]
fn gpu_sums_are_bit_identical_to_the_host() {
    if !kvstore_cuda::gpu_or_skip("gpu_sums_are_bit_identical_to_the_host") {
        return;
    }
    let n = gpus().expect("register");
    let devices: Vec<Context> = (0..n).map(Context::gpu).collect();
    for dtype in DType::ALL {
        let host = push_sum(dtype, Context::cpu(0), &[Context::cpu(0), Context::cpu(1)]);
        assert_eq!(push_sum(dtype, Context::gpu(0), &devices), host, "{dtype}: the GPU sum differs from the host's");
        let mixed = push_sum(dtype, Context::gpu(n - 1), &[Context::cpu(0), Context::gpu(0), Context::cpu(1)]);
        assert_eq!(mixed, host, "{dtype}: the mixed host/GPU sum differs from the host's");
    }
}

#[test]
fn gpu_arrays_round_trip_and_copy_between_devices() {
    if !kvstore_cuda::gpu_or_skip("gpu_arrays_round_trip_and_copy_between_devices") {
        return;
    }
    let n = gpus().expect("register");
    for dtype in DType::ALL {
        let a = values(1 << 20, 3, dtype, Context::gpu(0));
        let b = a.copy_to(Context::gpu(n - 1)).expect("device copy");
        assert_eq!(bits(&b), bits(&a.copy_to(Context::cpu(0)).expect("download")), "{dtype}");
        let empty = NDArray::zeros_with(&[0, 3], dtype, Context::gpu(0)).expect("empty");
        assert_eq!(empty.copy_to(Context::cpu(0)).expect("download").size(), 0);
    }
    let e = NDArray::zeros_with(&[2], DType::F32, Context::gpu(n)).expect_err("no such GPU");
    assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
}

#[test]
fn gpu_optimizer_steps_give_the_host_bits() {
    if !kvstore_cuda::gpu_or_skip("gpu_optimizer_steps_give_the_host_bits") {
        return;
    }
    let n = gpus().expect("register");
    let devices: Vec<Context> = (0..n).map(Context::gpu).collect();
    device_checks::optimizers_match_the_host(&devices);
}

/// Non-blocking calls with every array on the GPUs (the engine's threads queue the GPU
/// work): training gives the host's bits, blocking or not, on one or two engine
/// threads; pending outs, lent values and failed calls behave as on the host.
#[test]
fn nonblocking_calls_on_gpus_give_the_host_bits() {
    if !kvstore_cuda::gpu_or_skip("nonblocking_calls_on_gpus_give_the_host_bits") {
        return;
    }
    let devices: Vec<Context> = (0..gpus().expect("register")).map(Context::gpu).collect();
    device_checks::nonblocking_training_matches_the_host(&devices);
    device_checks::nonblocking_training_matches_the_host(&[devices[0], Context::cpu(0)]);
    device_checks::nonblocking_calls_on_devices(&devices);
}

#[test]
fn keys_are_spread_over_gpus_by_size() {
    if !kvstore_cuda::gpu_or_skip("keys_are_spread_over_gpus_by_size") {
        return;
    }
    device_checks::keys_spread_over_devices_by_size(gpus().expect("register"));
}

/// Store calls return once their GPU work is queued: calls on a key still take effect
/// in call order, temporaries can be dropped at once, and reads wait for the work.
/// More than 8 values (the kernel's pointer table in device memory) sum as the host.
#[test]
fn queued_gpu_work_takes_effect_in_call_order() {
    if !kvstore_cuda::gpu_or_skip("queued_gpu_work_takes_effect_in_call_order") {
        return;
    }
    gpus().expect("register");
    // 4 Mi f32: each sum is still running when the next call is queued.
    let n = 1 << 22;
    let kv = KVStore::create("device").expect("store");
    kv.init("w", &NDArray::zeros_with(&[n], DType::F32, Context::gpu(0)).expect("w")).expect("init");
    let out = NDArray::zeros_with(&[n], DType::F32, Context::gpu(0)).expect("out");
    for round in 0..8u32 {
        let vals: Vec<NDArray> = (0..10)
            .map(|j| NDArray::full_with(&[n], f64::from(round * 10 + j), DType::F32, Context::gpu(0)).expect("v"))
            .collect();
        kv.push("w", &vals, 0).expect("push");
        drop(vals);
        kv.pull("w", &out, 0).expect("pull");
        // The pulled array is pushed again at once: its sum must see this pull.
        kv.push("w", &[out.clone(), out.clone()], 0).expect("push the pulled value");
        kv.pull("w", &out, 0).expect("pull");
        let want = 2.0 * (0..10).map(|j| (round * 10 + j) as f32).sum::<f32>();
        let got = out.to_vec::<f32>().expect("read");
        assert!(got.iter().all(|&x| x == want), "round {round}: {} where {want} was due", got[0]);
    }
    kvstore_cuda::synchronize().expect("synchronize");
    for dtype in DType::ALL {
        let sum = |ctx: Context| push_sum_of(10, dtype, ctx, &[ctx]);
        assert_eq!(sum(Context::gpu(0)), sum(Context::cpu(0)), "{dtype}: 10 values on the GPU sum differently");
    }
}

/// Row-sparse keys with values and outs on the GPUs (and on a GPU and the host) give
/// the host's bits, with the default updater and lazy SGD and Adam.
#[test]
fn row_sparse_keys_on_gpus_give_the_host_bits() {
    if !kvstore_cuda::gpu_or_skip("row_sparse_keys_on_gpus_give_the_host_bits") {
        return;
    }
    let devices: Vec<Context> = (0..gpus().expect("register")).map(Context::gpu).collect();
    device_checks::row_sparse_matches_the_host(&devices);
    device_checks::row_sparse_matches_the_host(&[devices[0], Context::cpu(0)]);
}

/// `dist_sync_device` and `dist_async_device` (two workers as threads of this
/// process) sum each worker's GPU values on its GPUs and give the host kinds' bits.
#[test]
fn dist_device_stores_give_the_host_bits() {
    if !kvstore_cuda::gpu_or_skip("dist_device_stores_give_the_host_bits") {
        return;
    }
    let n = gpus().expect("register");
    device_checks::dist_device_stores_match_the_host(&(0..n).map(Context::gpu).collect::<Vec<_>>());
}

/// Device arrays and a store's page-locked buffers dropped on threads that never used
/// CUDA are freed there: no error is left behind for the device's next call (which a
/// free without the context made current left as CUDA_ERROR_INVALID_CONTEXT).
#[test]
fn memory_dropped_on_a_thread_without_cuda_is_freed_cleanly() {
    if !kvstore_cuda::gpu_or_skip("memory_dropped_on_a_thread_without_cuda_is_freed_cleanly") {
        return;
    }
    gpus().expect("register");
    let check = |what: &str| {
        let a = values(4099, 5, DType::F32, Context::gpu(0));
        let host = a.copy_to(Context::cpu(0));
        assert!(host.is_ok(), "the copy after {what}: {:?}", host.err());
        assert!(kvstore_cuda::synchronize().is_ok(), "after {what}");
    };
    let arrays: Vec<NDArray> = (0..4).map(|i| values(1 << 16, i, DType::F32, Context::gpu(0))).collect();
    std::thread::spawn(move || drop(arrays)).join().expect("dropping thread");
    check("device arrays dropped on another thread");
    // A local store stages device values through page-locked buffers of its own.
    let kv = KVStore::create("local").expect("store");
    kv.init("k", &values(1 << 16, 1, DType::F32, Context::gpu(0))).expect("init");
    let vals: Vec<NDArray> = (0..2).map(|i| values(1 << 16, i, DType::F32, Context::gpu(0))).collect();
    kv.push("k", &vals, 0).expect("push");
    kv.pull("k", &vals[0], 0).expect("pull");
    drop(vals);
    std::thread::spawn(move || drop(kv)).join().expect("dropping thread");
    check("a store dropped on another thread");
}

/// Commits of a `device` store whose values, pushes, 2-bit residuals and Adam state live
/// on the GPUs restore the same bits, those of the host too
/// (`device_checks::commits_restore_the_same_bits`; its jobs run as `commit_job_child`).
#[test]
fn commits_of_gpu_values_restore_the_same_bits() {
    if !kvstore_cuda::gpu_or_skip("commits_of_gpu_values_restore_the_same_bits") {
        return;
    }
    device_checks::commits_restore_the_same_bits("commit_job_child");
}

#[test]
#[ignore = "a job of commits_of_gpu_values_restore_the_same_bits, run by it"]
fn commit_job_child() {
    let n = gpus().expect("register");
    device_checks::commit_job(&(0..n).map(Context::gpu).collect::<Vec<_>>());
}
