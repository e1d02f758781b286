//! The GPU rows of `make bench` and of the GPU bundle (`cargo bench -p kvstore-cuda --bench gpu`, or its binary with `OUT.json`), each
//! against a limit measured in the same run:
//! * the 4-input reduction of 64 Mi f32 on one GPU, as bandwidth against the GPU's own
//!   device-to-device copy bandwidth (target: ratio >= 0.85);
//! * a `device` store push of the same four arrays (the reduction plus the store's
//!   checks) against the bare reduction;
//! * push+pull of 1000 keys of 1 Ki f32 from the GPU, per key, against the least any
//!   store must queue for it: two device-to-device copies per key (in, out) through
//!   cudarc directly, with one wait at the end (the same calls on host arrays in a
//!   `local` store are reported beside it);
//! * the fused Adam step of a 64 Mi f32 weight against the copy bandwidth (it reads the
//!   weight, the gradient and two states and writes three arrays).
//!
//! Medians of 21 runs after 3 warm-ups; each run ends with
//! `kvstore_cuda::synchronize()` (store calls return once their GPU work is queued), so
//! wall-clock time includes all the GPU work. Without a CUDA device it prints
//! `SKIP: no CUDA device (...)` and writes nothing (fails under `KVSTORE_REQUIRE_CUDA=1`).
//! `bench/torch_tensors.py` adds PyTorch's `a + b + c + d` on the same sizes.

use kvstore_core::backend::{BroadcastJob, Comm, CommCpu, ReduceJob};
use kvstore_core::{Context, DType, KVStore, NDArray, Optimizer};

const RUNS: usize = 21;

/// The median time of `f` and a wait for the GPUs.
fn median(mut f: impl FnMut()) -> f64 {
    kvstore_tests::bench::median(
        3,
        RUNS,
        || {},
        || {
            f();
            kvstore_cuda::synchronize().expect("synchronize");
        },
    )
}

fn gpu_array(n: usize, v: f64) -> kvstore_core::Result<NDArray> {
    NDArray::full_with(&[n], v, DType::F32, Context::gpu(0))
}

fn main() -> kvstore_core::Result<()> {
    let out =
        std::env::args().skip(1).find(|a| !a.starts_with("--")).unwrap_or_else(|| "target/bench/gpu.json".to_string());
    if !kvstore_cuda::gpu_or_skip("bench_gpu") {
        return Ok(());
    }
    kvstore_cuda::register()?;
    let gpu = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", "-i", "0"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "gpu(0)".to_string());
    let mut rows: Vec<(String, f64, Option<f64>)> = Vec::new();
    let comm = CommCpu::new(1)?;

    // 64 Mi f32 = 256 MiB per array.
    let n = 64 << 20;
    let ins: Vec<NDArray> = (0..4).map(|i| gpu_array(n, 1.0 + i as f64)).collect::<kvstore_core::Result<_>>()?;
    let sum = gpu_array(n, 0.0)?;
    let copy_s = median(|| comm.broadcast(&[BroadcastJob { src: &ins[0], outs: &[&sum] }]).expect("copy"));
    let inputs: Vec<&NDArray> = ins.iter().collect();
    let reduce_s = median(|| comm.reduce(&[ReduceJob { inputs: &inputs, out: &sum }]).expect("reduce"));
    let got = sum.to_vec::<f32>()?;
    assert!(got.iter().all(|&x| x == 10.0), "the reduction is wrong");
    // At the copy's bandwidth, the reduction (4 reads + 1 write against 1 + 1) would take:
    let at_copy_bw = copy_s * 5.0 / 2.0;
    let bytes = (n * 4) as f64;
    rows.push((
        format!("{gpu}: device-to-device copy of 64 Mi f32 ({:.0} GB/s)", 2.0 * bytes / copy_s / 1e9),
        copy_s,
        None,
    ));
    rows.push((
        format!("{gpu}: 4-input reduce of 64 Mi f32 ({:.0} GB/s)", 5.0 * bytes / reduce_s / 1e9),
        reduce_s,
        Some(at_copy_bw),
    ));

    let kv = KVStore::create("device")?;
    kv.init("w", &sum)?;
    let push_s = median(|| kv.push("w", &ins, 0).expect("push"));
    rows.push((format!("{gpu}: device store push 4 x 64 Mi f32"), push_s, Some(reduce_s)));

    // Adam, fused: reads w, g, m, v and writes w, m, v (7 arrays' worth of traffic).
    let adam = KVStore::create("device")?;
    adam.set_optimizer(Optimizer::builder("adam").param("learning_rate", 1e-3).build()?)?;
    adam.init("w", &sum)?;
    let adam_s = median(|| adam.push("w", &ins[0], 0).expect("push"));
    rows.push((
        format!("{gpu}: fused adam step of 64 Mi f32 ({:.0} GB/s)", 7.0 * bytes / adam_s / 1e9),
        adam_s,
        Some(copy_s * 7.0 / 2.0),
    ));

    // 1000 small keys, one list call each way.
    let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
    let small = |ctx: Context| -> kvstore_core::Result<Vec<NDArray>> {
        (0..1000).map(|_| NDArray::full_with(&[1024], 1.0, DType::F32, ctx)).collect()
    };
    let (gvals, gouts) = (small(Context::gpu(0))?, small(Context::gpu(0))?);
    let (hvals, houts) = (small(Context::cpu(0))?, small(Context::cpu(0))?);
    let gkv = KVStore::create("device")?;
    gkv.init(keys.as_slice(), &gvals)?;
    let hkv = KVStore::create("local")?;
    hkv.init(keys.as_slice(), &hvals)?;
    let gpu_small = median(|| {
        gkv.push(keys.as_slice(), &gvals, 0).expect("push");
        gkv.pull(keys.as_slice(), &gouts, 0).expect("pull");
    });
    let host_small = median(|| {
        hkv.push(keys.as_slice(), &hvals, 0).expect("push");
        hkv.pull(keys.as_slice(), &houts, 0).expect("pull");
    });
    let bare_small = bare_copies(1000, 1024)?;
    rows.push((
        format!("{gpu}: bare cudarc, 2 device copies per key of 1 Ki f32, per key ({:.1} us)", bare_small * 1e6),
        bare_small,
        None,
    ));
    rows.push((
        format!("{gpu}: push+pull of 1000 keys x 1 Ki f32, per key ({:.1} us)", gpu_small / 1000.0 * 1e6),
        gpu_small / 1000.0,
        Some(bare_small),
    ));
    rows.push((
        format!(
            "local store, host arrays: push+pull of 1000 keys x 1 Ki f32, per key ({:.2} us)",
            host_small / 1e3 * 1e6
        ),
        host_small / 1000.0,
        None,
    ));

    println!("\n{:<80} {:>12} {:>12} {:>7}", "row", "median", "limit", "ratio");
    let fmt = |s: f64| if s < 1e-3 { format!("{:.2} us", s * 1e6) } else { format!("{:.3} ms", s * 1e3) };
    for (name, m, limit) in &rows {
        let ratio = limit.map(|l| format!("{:.2}", l / m)).unwrap_or_default();
        println!("{name:<80} {:>12} {:>12} {ratio:>7}", fmt(*m), limit.map(fmt).unwrap_or_default());
    }
    kvstore_tests::bench::write_rows(&out, &rows)
}

/// Per key: `keys` keys of `n` f32, each copied into a buffer and back out (what a push
/// and a pull must move at least), as asynchronous device-to-device copies on one
/// stream, with one wait at the end.
fn bare_copies(keys: usize, n: usize) -> kvstore_core::Result<f64> {
    let fail =
        |e: cudarc::driver::DriverError| kvstore_core::Error::Backend { backend: "cuda", message: e.to_string() };
    let ctx = cudarc::driver::CudaContext::new(0).map_err(fail)?;
    // As the backend does: one stream, no per-buffer events.
    // SAFETY: every buffer below is used on this one stream only.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    let alloc = || -> kvstore_core::Result<Vec<cudarc::driver::CudaSlice<f32>>> {
        (0..keys).map(|_| stream.alloc_zeros::<f32>(n).map_err(fail)).collect()
    };
    let (vals, mut stored, mut outs) = (alloc()?, alloc()?, alloc()?);
    let total = kvstore_tests::bench::median(
        3,
        RUNS,
        || {},
        || {
            for i in 0..keys {
                stream.memcpy_dtod(&vals[i], &mut stored[i]).expect("copy in");
                stream.memcpy_dtod(&stored[i], &mut outs[i]).expect("copy out");
            }
            stream.synchronize().expect("synchronize");
        },
    );
    Ok(total / keys as f64)
}
