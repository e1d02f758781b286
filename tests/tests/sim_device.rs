//! Core's device paths on the simulated device backend (`kvstore_tests::sim_device`,
//! device memory that is host memory): every conformance case on `gpu(i)` contexts
//! with `local` and `device` stores, the property tests on `gpu(i)`, results bit-identical to the host for every dtype
//! through the reduction kernel and through host staging, mixed host and device
//! values, NDArray ops on device arrays, device-to-device copies, unknown devices, and
//! a device that fails a write. The CUDA backend runs the same cases on a real GPU.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, OnceLock};

use kvstore_core::{Context, DType, ErrorKind, KVStore, NDArray};
use kvstore_tests::device_checks::{self, bits, push_sum, values};
use kvstore_tests::sim_device::SimDevice;
use kvstore_tests::{Backend, Gpus};

const DEVICES: u32 = 4;
/// The device of the write-failure test.
const FAULTY: u32 = DEVICES;

// The shared conformance cases on `gpu(0)` to `gpu(3)`, with `local` stores and with
// `device` stores (`gpu_local_store::case_01_init_then_pull`, ...), and the property
// tests on the same devices (`gpus::random_call_sequences_agree_with_the_model`, ...).
kvstore_tests::backend_tests!(gpu_local_store = sim_gpus(false); cases);
kvstore_tests::backend_tests!(gpu_device_store = sim_gpus(true); cases);
kvstore_tests::backend_tests!(gpus = { sim(); Gpus { count: DEVICES, device_store: false } }; properties);

/// The simulated devices for a conformance case, holding the switches while it runs, so
/// that no test flips them or counts the backend's calls meanwhile.
struct SimGpus {
    gpus: Gpus,
    _switches: MutexGuard<'static, ()>,
}

fn sim_gpus(device_store: bool) -> SimGpus {
    let switches = switches();
    sim();
    SimGpus { gpus: Gpus { count: DEVICES, device_store }, _switches: switches }
}

impl Backend for SimGpus {
    fn name(&self) -> &str {
        self.gpus.name()
    }
    fn store(&self, kind: &str) -> KVStore {
        self.gpus.store(kind)
    }
    fn store_kind<'a>(&self, kind: &'a str) -> &'a str {
        self.gpus.store_kind(kind)
    }
    fn ctx(&self, i: u32) -> Context {
        self.gpus.ctx(i)
    }
}

/// The backend, installed once for this process.
fn sim() -> &'static Arc<SimDevice> {
    static SIM: OnceLock<Arc<SimDevice>> = OnceLock::new();
    SIM.get_or_init(|| {
        // One more device than the tests spread over: gpu(FAULTY) is the one whose writes
        // are made to fail, which no other test uses.
        let sim = Arc::new(SimDevice::new(DEVICES as usize + 1));
        kvstore_core::backend::register_backend(sim.clone()).expect("register the sim backend");
        sim
    })
}

/// Serialises the tests that switch the backend's kernel or fault switches.
fn switches() -> MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn sums_are_bit_identical_to_the_host_with_and_without_the_kernel() {
    let _s = switches();
    let sim = sim();
    let gpus: Vec<Context> = (0..DEVICES).map(Context::gpu).collect();
    for dtype in DType::ALL {
        let host = push_sum(dtype, Context::cpu(0), &[Context::cpu(0), Context::cpu(1)]);
        let before = sim.reduces.load(Ordering::SeqCst);
        let kernel = push_sum(dtype, Context::gpu(0), &gpus);
        assert!(sim.reduces.load(Ordering::SeqCst) > before, "{dtype}: the reduction kernel did not run");
        assert_eq!(kernel, host, "{dtype}: the device kernel's sum differs from the host's");
        sim.kernels.store(false, Ordering::SeqCst);
        let staged = push_sum(dtype, Context::gpu(1), &gpus);
        sim.kernels.store(true, Ordering::SeqCst);
        assert_eq!(staged, host, "{dtype}: the staged sum differs from the host's");
        let mixed = push_sum(dtype, Context::gpu(2), &[Context::cpu(0), Context::gpu(3), Context::cpu(2)]);
        assert_eq!(mixed, host, "{dtype}: the mixed host/device sum differs from the host's");
    }
}

#[test]
fn pulls_and_broadcasts_reach_host_and_device_outputs() {
    sim();
    let kv = KVStore::create("local").expect("store");
    kv.init("w", &NDArray::full_with(&[3, 2], 2.5, DType::F32, Context::gpu(1)).expect("w")).expect("init");
    let outs: Vec<NDArray> = [Context::cpu(0), Context::gpu(0), Context::gpu(1), Context::gpu(3)]
        .iter()
        .map(|&c| NDArray::zeros_with(&[3, 2], DType::F32, c).expect("out"))
        .collect();
    kv.pull("w", &outs, 0).expect("pull");
    for o in &outs {
        assert_eq!(o.to_vec::<f32>().expect("read"), vec![2.5; 6], "{}", o.context());
    }
    let b_outs: Vec<NDArray> =
        (0..2).map(|i| NDArray::zeros_with(&[2], DType::I64, Context::gpu(i)).expect("out")).collect();
    let src = NDArray::from_vec(&[2], vec![7i64, -7]).expect("src");
    kv.broadcast("b", &src, &b_outs, 0).expect("broadcast");
    for o in &b_outs {
        assert_eq!(o.to_vec::<i64>().expect("read"), vec![7, -7]);
    }
}

#[test]
fn ndarray_ops_work_on_device_arrays_and_copies_stay_on_devices() {
    let _s = switches();
    let sim = sim();
    let a = NDArray::from_vec(&[4], vec![1.0f32, 2.0, 3.0, 4.0]).and_then(|a| a.copy_to(Context::gpu(0))).expect("a");
    assert_eq!(a.context(), Context::gpu(0));
    let b = a.mul(2.0).and_then(|b| b.add(&a)).expect("ops");
    assert_eq!(b.context(), Context::gpu(0));
    assert_eq!(b.to_vec::<f32>().expect("read"), vec![3.0, 6.0, 9.0, 12.0]);
    b.div_assign(3.0).expect("div");
    assert_eq!(b.to_vec::<f32>().expect("read"), vec![1.0, 2.0, 3.0, 4.0]);
    let before = sim.copies.load(Ordering::SeqCst);
    let c = b.copy_to(Context::gpu(2)).expect("peer copy");
    assert!(sim.copies.load(Ordering::SeqCst) > before, "gpu(0) -> gpu(2) must be a device copy");
    assert_eq!(c.as_type(DType::I32).and_then(|i| i.to_vec::<i32>()).expect("cast"), vec![1, 2, 3, 4]);
    assert_eq!(c.to_string(), "[1.0 2.0 3.0 4.0]\n<NDArray 4 float32 @gpu(2)>");
    let shared = c.clone();
    c.with_data_mut(|x: &mut [f32]| x[0] = 10.0).expect("write");
    assert_eq!(shared.to_vec::<f32>().expect("read")[0], 10.0, "clones share device storage");
}

#[test]
fn an_optimizer_updates_device_weights_as_on_the_host() {
    sim();
    let run = |ctx: Context| {
        let kv = KVStore::create("local").expect("store");
        let opt = kvstore_core::Optimizer::builder("adam").param("learning_rate", 0.01).build().expect("adam");
        kv.set_optimizer(opt).expect("set");
        kv.init("w", &values(257, 5, DType::F32, ctx)).expect("init");
        for step in 0..3 {
            kv.push("w", &[values(257, step, DType::F32, ctx), values(257, step + 7, DType::F32, ctx)], 0)
                .expect("push");
        }
        let out = NDArray::zeros(&[257]).expect("out");
        kv.pull("w", &out, 0).expect("pull");
        bits(&out)
    };
    assert_eq!(run(Context::gpu(1)), run(Context::cpu(0)));
}

#[test]
fn devices_the_backend_lacks_are_unavailable() {
    sim();
    let e = NDArray::zeros_with(&[2], DType::F32, Context::gpu(DEVICES + 1)).expect_err("gpu(5)");
    assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
    assert!(e.to_string().contains("gpu(5)") && e.to_string().contains("5 devices"), "{e}");
    let kv = KVStore::create("local").expect("store");
    kv.init("a", &NDArray::zeros(&[2]).expect("a")).expect("init");
    let e = kv
        .pull("a", &NDArray::zeros(&[2]).expect("a"), 0)
        .and_then(|()| NDArray::zeros_with(&[2], DType::F32, Context::gpu(9)).and_then(|o| kv.pull("a", &o, 0)));
    assert_eq!(e.expect_err("gpu(9)").kind(), ErrorKind::DeviceUnavailable);
}

#[test]
fn a_failed_device_write_is_an_error_and_marks_the_array() {
    let _s = switches();
    let sim = sim();
    let a = NDArray::full_with(&[3], 1.0, DType::F32, Context::gpu(FAULTY)).expect("a");
    sim.fail_writes.store(FAULTY as usize + 1, Ordering::SeqCst);
    let e = a.add_assign(1.0);
    sim.fail_writes.store(0, Ordering::SeqCst);
    assert_eq!(e.expect_err("injected failure").kind(), ErrorKind::Backend);
    let later = a.to_vec::<f32>().expect_err("the array is faulty");
    assert_eq!(later.kind(), ErrorKind::Backend);
    assert!(later.to_string().contains("writing the array back"), "{later}");
    // Other arrays are unaffected.
    let b = NDArray::full_with(&[3], 1.0, DType::F32, Context::gpu(FAULTY)).expect("b");
    assert_eq!(b.add(1.0).and_then(|c| c.to_vec::<f32>()).expect("b + 1"), vec![2.0; 3]);
}

#[test]
fn a_second_backend_is_refused() {
    sim();
    let e = kvstore_core::backend::register_backend(Arc::new(Other)).expect_err("second backend");
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains("sim"), "{e}");
}

struct Other;

impl kvstore_core::backend::DeviceBackend for Other {
    fn name(&self) -> &'static str {
        "other"
    }
    fn device_count(&self) -> usize {
        0
    }
    fn alloc_zeroed(&self, _: usize, _: usize) -> kvstore_core::Result<Box<dyn kvstore_core::backend::DeviceBuffer>> {
        Err(kvstore_core::Error::Internal("unused".into()))
    }
    fn copy(
        &self,
        _: &dyn kvstore_core::backend::DeviceBuffer,
        _: &mut dyn kvstore_core::backend::DeviceBuffer,
    ) -> kvstore_core::Result<()> {
        Err(kvstore_core::Error::Internal("unused".into()))
    }
}

#[test]
fn fused_optimizer_steps_give_the_host_bits() {
    let _s = switches();
    let sim = sim();
    let gpus: Vec<Context> = (0..DEVICES).map(Context::gpu).collect();
    let f32_steps = || sim.sizes.get("fused step", device_checks::OPTIMIZED_LEN * 4);
    let before = f32_steps();
    device_checks::optimizers_match_the_host(&gpus);
    assert!(f32_steps() > before, "no update ran as a fused step");
    // Without the backend's fused step, the same updates run staged through the host.
    sim.fused.store(false, Ordering::SeqCst);
    let staged = std::panic::catch_unwind(|| device_checks::optimizers_match_the_host(&gpus[1..3]));
    sim.fused.store(true, Ordering::SeqCst);
    assert!(staged.is_ok(), "the staged updates differ from the host's");
}

#[test]
fn every_fused_rule_runs_fused() {
    let _s = switches();
    let sim = sim();
    let gpus = [Context::gpu(2), Context::gpu(2)];
    for &(name, params) in device_checks::OPTIMIZERS {
        let f32_steps = || sim.sizes.get("fused step", device_checks::OPTIMIZED_LEN * 4);
        let before = f32_steps();
        device_checks::optimized("device", name, params, DType::F32, &gpus);
        let fused = f32_steps() - before;
        // Rules with no device kernel run staged through the host.
        let expected = if matches!(name, "adadelta" | "nadam" | "ftml" | "lbsgd") { 0 } else { 3 };
        assert_eq!(fused, expected, "{name} {params:?}: fused steps");
    }
}

#[test]
fn nonblocking_training_on_devices_gives_the_host_bits() {
    sim();
    let gpus: Vec<Context> = (0..DEVICES).map(Context::gpu).collect();
    device_checks::nonblocking_training_matches_the_host(&gpus);
    // Host and device arrays mixed in one run.
    device_checks::nonblocking_training_matches_the_host(&[Context::gpu(1), Context::cpu(0)]);
}

#[test]
fn nonblocking_calls_on_devices_keep_call_order_and_report_their_own_errors() {
    sim();
    device_checks::nonblocking_calls_on_devices(&(0..DEVICES).map(Context::gpu).collect::<Vec<_>>());
}

#[test]
fn keys_are_spread_over_devices_by_size() {
    sim();
    device_checks::keys_spread_over_devices_by_size(DEVICES);
}

#[test]
fn local_stores_stage_device_values_through_reused_pinned_buffers() {
    let _s = switches();
    let sim = sim();
    // 293 f32: a size no other test uses, so that the counts are this test's alone.
    const N: usize = 293;
    let bytes = N * 4;
    let kv = KVStore::create("local").expect("store");
    let before = sim.sizes.get("pinned", bytes);
    kv.init("w", &values(N, 1, DType::F32, Context::gpu(0))).expect("init");
    assert_eq!(sim.sizes.get("pinned", bytes) - before, 1, "the value lives in pinned memory");
    assert_eq!(kv.context_of("w").expect("context"), Context::cpu(0));
    let vals = [
        values(N, 2, DType::F32, Context::gpu(1)),
        values(N, 3, DType::F32, Context::cpu(0)),
        values(N, 4, DType::F32, Context::gpu(3)),
    ];
    let host: Vec<NDArray> = vals.iter().map(|v| v.copy_to(Context::cpu(0)).expect("host copy")).collect();
    let reference = KVStore::create("local").expect("store");
    reference.init("w", &values(N, 1, DType::F32, Context::cpu(0))).expect("init");
    let before = sim.sizes.get("pinned", bytes);
    for _ in 0..3 {
        kv.push("w", &vals, 0).expect("push");
        reference.push("w", &host, 0).expect("push");
    }
    assert_eq!(sim.sizes.get("pinned", bytes) - before, 2, "one staging buffer per device value, kept");
    let out = NDArray::zeros_with(&[N], DType::F32, Context::gpu(2)).expect("out");
    kv.pull("w", &out, 0).expect("pull");
    let expected = NDArray::zeros(&[N]).expect("out");
    reference.pull("w", &expected, 0).expect("pull");
    assert_eq!(bits(&out), bits(&expected));
}

#[test]
fn device_stores_keep_peer_copies_per_key_and_never_download_an_out_they_overwrite() {
    let _s = switches();
    let sim = sim();
    // 337 f32: a size no other test uses, so that the counts are this test's alone.
    const N: usize = 337;
    let bytes = N * 4;
    let kv = KVStore::create("device").expect("store");
    kv.init("w", &values(N, 1, DType::F32, Context::gpu(0))).expect("init");
    // Values from two devices: the key goes to one of them; the other's value is copied
    // there at every push, into a buffer made once.
    let vals = [values(N, 2, DType::F32, Context::gpu(0)), values(N, 3, DType::F32, Context::gpu(1))];
    kv.push("w", &vals, 0).expect("first push");
    let home = kv.context_of("w").expect("context");
    assert!(!home.is_cpu(), "the key lives on a GPU");
    let (allocs, foreign) = (sim.sizes.get("alloc", bytes), sim.sizes.get("foreign input", bytes));
    for _ in 0..3 {
        kv.push("w", &vals, 0).expect("push");
    }
    assert_eq!(sim.sizes.get("alloc", bytes), allocs, "later pushes allocate no device buffer");
    assert_eq!(sim.sizes.get("foreign input", bytes), foreign, "the kernel sums inputs on the key's device");
    // A push with a host value sums on the host: the device values are read, the key's
    // value (the sum's out, overwritten whole) is not downloaded first.
    let mixed = [values(N, 2, DType::F32, home), values(N, 4, DType::F32, Context::cpu(0))];
    let before = sim.sizes.get("download", bytes);
    kv.push("w", &mixed, 0).expect("mixed push");
    assert_eq!(sim.sizes.get("download", bytes) - before, 1, "only the device input is downloaded");
    let out = NDArray::zeros(&[N]).expect("out");
    kv.pull("w", &out, 0).expect("pull");
    let reference = KVStore::create("local").expect("store");
    reference.init("w", &values(N, 1, DType::F32, Context::cpu(0))).expect("init");
    let host: Vec<NDArray> = mixed.iter().map(|v| v.copy_to(Context::cpu(0)).expect("host copy")).collect();
    reference.push("w", &host, 0).expect("push");
    let expected = NDArray::zeros(&[N]).expect("out");
    reference.pull("w", &expected, 0).expect("pull");
    assert_eq!(bits(&out), bits(&expected));
}

/// A device buffer made with the backend (as a binding wraps another library's device
/// memory) is an array on that device, pushed from and pulled into in place; a
/// read-only one is only read; a buffer of the wrong size or a host context is refused.
#[test]
fn arrays_over_device_buffers_made_elsewhere_are_used_in_place() {
    let sim = sim();
    let _lock = sim_gpus(false);
    let backend: &dyn kvstore_core::backend::DeviceBackend = &**sim;
    let ctx = Context::gpu(1);
    let buffer_of = |values: &[f32]| {
        let mut buf = backend.alloc_zeroed(1, values.len() * 4).unwrap();
        buf.write_from_host(bytemuck::cast_slice(values)).unwrap();
        buf
    };
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[3]).unwrap()).unwrap();
    let g = NDArray::from_device_buffer(&[3], DType::F32, ctx, buffer_of(&[1.0, 2.0, 3.0]), false).unwrap();
    assert!(g.is_read_only() && g.context() == ctx);
    kv.push("w", &[g.clone(), g.clone()][..], 0).unwrap();
    let out = NDArray::from_device_buffer(&[3], DType::F32, ctx, buffer_of(&[0.0; 3]), true).unwrap();
    kv.pull("w", &out, 0).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    let e = kv.pull("w", &g, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0], "the read-only buffer kept its values");
    let e = NDArray::from_device_buffer(&[4], DType::F32, ctx, buffer_of(&[0.0; 3]), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = NDArray::from_device_buffer(&[3], DType::F32, Context::cpu(0), buffer_of(&[0.0; 3]), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = NDArray::from_device_buffer(&[3], DType::F32, Context::gpu(99), buffer_of(&[0.0; 3]), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DeviceUnavailable, "{e}");
}

/// `dist_sync_device` (and MXNet's `dist_device_sync`): each worker sums its values on
/// their devices with the reduction kernel, then across the workers, giving the bits a
/// `dist_sync` store gives for the same values (which it sums on the host); the key
/// lives on a device.
#[test]
fn dist_sync_device_sums_each_workers_values_on_its_devices_first() {
    let _s = switches();
    let sim = sim();
    let n = 4099;
    let run = |kind: &'static str| {
        kvstore_tests::run_members(2, move |rank, member| {
            let group: Arc<dyn kvstore_core::backend::Collective> = member;
            let kv = KVStore::builder(kind).collective(group).build().expect("store");
            kv.init("k", &values(n, 99, DType::F32, Context::cpu(0))).expect("init");
            let mut pulled = Vec::new();
            for step in 0..3u64 {
                let vals: Vec<NDArray> = (0..3)
                    .map(|i| values(n, step * 10 + i + 100 * rank as u64, DType::F32, Context::gpu(i as u32 % 2)))
                    .collect();
                kv.push("k", &vals, 0).expect("push");
                pulled.push(bits(&kv.pull_new("k", 0).expect("pull")));
            }
            pulled
        })
    };
    let before = sim.reduces.load(Ordering::SeqCst);
    let host = run("dist_sync");
    assert_eq!(sim.reduces.load(Ordering::SeqCst), before, "dist_sync sums on the host");
    for kind in ["dist_sync_device", "dist_device_sync"] {
        let before = sim.reduces.load(Ordering::SeqCst);
        let device = run(kind);
        // 2 workers x 3 pushes, each a reduction of 3 values on a device.
        assert!(sim.reduces.load(Ordering::SeqCst) >= before + 6, "{kind}: the kernel summed each worker's values");
        assert_eq!(device, host, "{kind}: the bits of dist_sync");
        assert_eq!(device[0], device[1], "{kind}: the same bits on both workers");
    }
    device_checks::dist_device_stores_match_the_host(&[Context::gpu(0), Context::gpu(1)]);
}

/// Row-sparse keys with values and outs on devices give the host's bits.
#[test]
fn row_sparse_keys_on_devices_give_the_host_bits() {
    let _s = switches();
    sim();
    device_checks::row_sparse_matches_the_host(&[Context::gpu(0), Context::gpu(1)]);
    device_checks::row_sparse_matches_the_host(&[Context::gpu(2), Context::cpu(0)]);
}

/// Commits of a `device` store with every value on the devices restore the same bits
/// (`device_checks::commits_restore_the_same_bits`; its jobs run as `commit_job_child`).
#[test]
fn commits_of_device_values_restore_the_same_bits() {
    device_checks::commits_restore_the_same_bits("commit_job_child");
}

#[test]
#[ignore = "a job of commits_of_device_values_restore_the_same_bits, run by it"]
fn commit_job_child() {
    sim();
    device_checks::commit_job(&(0..DEVICES).map(Context::gpu).collect::<Vec<_>>());
}
