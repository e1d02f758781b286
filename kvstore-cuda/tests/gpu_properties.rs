//! The property tests against the reference model (`tests/tests/properties.rs`, the
//! same module the CPU and simulated-device binaries run) with every array on the CUDA
//! GPUs. Without a CUDA device each prints `SKIP: no CUDA device` and passes;
//! `KVSTORE_REQUIRE_CUDA=1` makes that a failure.

#[path = "../../tests/tests/properties.rs"]
mod properties;

/// The GPUs to spread the arrays over, or `None` without any (the skip is printed once
/// per process, not once per generated case).
fn property_devices() -> Option<u32> {
    static DEVICES: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *DEVICES.get_or_init(|| {
        if !kvstore_cuda::gpu_or_skip("the property tests on GPUs") {
            return None;
        }
        kvstore_cuda::register().expect("register the CUDA backend");
        Some(kvstore_cuda::device_count() as u32)
    })
}
