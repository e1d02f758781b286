//! `kvstore-cuda`: GPU arrays for kvstore. It implements `kvstore-core`'s device
//! backend with CUDA through cudarc: device buffers for every dtype, host↔device and
//! device↔device (peer) copies, and a reduction kernel that sums any number of inputs
//! in one pass, in the host's order (f16/bf16 accumulate in f32; integers wrap), so the
//! bits are the host's. The kernels are CUDA C compiled at first use per device by
//! NVRTC, so the crate builds with no CUDA toolkit; the driver and NVRTC libraries are
//! loaded at run time.
//!
//! ```no_run
//! use kvstore_core::{Context, DType, KVStore, NDArray};
//! kvstore_cuda::register()?;                    // gpu(i) contexts are now CUDA devices
//! let kv = KVStore::create("device")?;
//! kv.init("w", &NDArray::zeros_with(&[1024], DType::F32, Context::gpu(0))?)?;
//! # Ok::<(), kvstore_core::Error>(())
//! ```
//!
//! Each GPU has one stream; calls queue their GPU work there and return, so work on a
//! key runs in call order, and reading results on the host waits for it
//! ([`synchronize`] waits for everything).
//!
//! Fused optimizer kernels run SGD (with and without momentum), NAG, Adam, AdaGrad and
//! RMSProp (plain and centered) where the weights live, with the host rule's bits.
//! Operations that have no device kernel (element-wise ops, the other optimizers) run
//! on copies staged through host memory and give the host's results, more slowly.
//!
//! With a `local` store, values pushed from GPUs are copied into page-locked host
//! buffers (kept per key) and summed on the host, as MXNet's `CommCPU` does; a `device`
//! store sums and updates each key on one of the GPUs its values come from, keys spread
//! over the GPUs by size (MXNet's `CommDevice`).
//!
//! # Errors
//! [`is_available`] never panics. With no driver library, no device, or a driver that
//! fails to start, [`register`] and every GPU call are `DeviceUnavailable` errors that
//! name the reason (cudarc panics when its library is missing; this crate probes first
//! and never reaches that panic).
//!
//! # Features
//! One CUDA version for cudarc's bindings: `cuda-13000` (default) or `cuda-12080`.

mod backend;

use std::sync::{Arc, OnceLock};

use kvstore_core::{Error, Result};

pub use backend::{CudaBackend, compile_kernels};

/// The environment variable that turns a skipped GPU test into a failure (`1`).
pub const REQUIRE_CUDA_VAR: &str = "KVSTORE_REQUIRE_CUDA";

/// The number of CUDA devices, or why there are none usable. Probed once per process:
/// the driver library first (without it cudarc panics), then the device count.
fn probe() -> &'static std::result::Result<usize, String> {
    static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to load the driver library (dlopen) and
        // reports whether that worked; it calls no CUDA function.
        let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
        if !matches!(present, Ok(true)) {
            return Err("no CUDA driver library (libcuda.so) on this machine".to_string());
        }
        match std::panic::catch_unwind(cudarc::driver::CudaContext::device_count) {
            Ok(Ok(n)) if n > 0 => Ok(n as usize),
            Ok(Ok(_)) => Err("the CUDA driver reports no device".to_string()),
            Ok(Err(e)) => Err(format!("the CUDA driver failed to start: {e}")),
            Err(_) => Err("the CUDA driver library could not be loaded".to_string()),
        }
    })
}

/// Whether this machine has a usable CUDA device. Never panics.
pub fn is_available() -> bool {
    probe().is_ok()
}

/// Why no CUDA device can be used, or `None` when one can.
pub fn unavailable_reason() -> Option<String> {
    probe().as_ref().err().cloned()
}

/// The number of CUDA devices (0 when unavailable).
pub fn device_count() -> usize {
    *probe().as_ref().unwrap_or(&0)
}

/// The backend [`register`] installs.
static BACKEND: OnceLock<Arc<CudaBackend>> = OnceLock::new();

/// Waits until the GPUs have finished every operation queued so far. Store calls return
/// once their GPU work is queued, in order on each device's stream; any read of the
/// results from the host (`to_vec`, a pull into host arrays) waits for that work by
/// itself, so this is needed only to time the GPU work or to hand the buffers to other
/// CUDA code. Does nothing before [`register`].
///
/// # Errors
/// [`Error::Backend`] with the driver's message when a device reports an error.
pub fn synchronize() -> Result<()> {
    BACKEND.get().map_or(Ok(()), |b| b.synchronize())
}

/// The stream the backend queues its work on, as DLPack's `__dlpack__(stream=...)`
/// names it: 1, CUDA's legacy default stream (every device's one stream here). A
/// producer given it orders its pending work on a tensor before the store's.
pub const DLPACK_STREAM: i64 = 1;

/// Another library's device memory as a buffer of the registered backend, for
/// `NDArray::from_device_buffer`: `len` bytes at `ptr` on `device`, kept alive by
/// `owner`, which is dropped with the buffer once the work queued on it is done. The
/// memory is never freed by the store.
///
/// # Safety
/// `ptr` must point to `len` bytes of device memory on `device`, allocated in its
/// primary context (CUDA's runtime API, PyTorch, CuPy and JAX allocate there), valid
/// while `owner` lives; the producer's pending writes to it must be ordered before the
/// legacy default stream ([`DLPACK_STREAM`]) and nothing may write it while the store
/// uses it.
///
/// # Errors
/// [`Error::DeviceUnavailable`] before [`register`] or for a device the machine lacks.
pub unsafe fn wrap_device_memory(
    device: usize,
    ptr: u64,
    len: usize,
    owner: Box<dyn std::any::Any + Send + Sync>,
) -> Result<Box<dyn kvstore_core::backend::DeviceBuffer>> {
    let backend = BACKEND.get().ok_or_else(|| Error::DeviceUnavailable {
        context: format!("gpu({device})"),
        reason: "the CUDA backend is not registered (kvstore_cuda::register)".to_string(),
    })?;
    // SAFETY: the caller's promise, passed on.
    unsafe { backend.wrap_device_memory(device, ptr, len, owner) }
}

/// Installs the CUDA backend, so that `gpu(i)` contexts are CUDA devices. Calling it
/// again does nothing.
///
/// # Errors
/// [`Error::DeviceUnavailable`] with the reason when no CUDA device can be used;
/// [`Error::Unsupported`] if another device backend is installed.
pub fn register() -> Result<()> {
    let count = probe().clone().map_err(|reason| Error::DeviceUnavailable { context: "gpu".to_string(), reason })?;
    let backend = BACKEND.get_or_init(|| Arc::new(CudaBackend::new(count)));
    kvstore_core::backend::register_backend(backend.clone())
}

/// For GPU tests: `true` when a CUDA device is there. Otherwise prints
/// `SKIP: no CUDA device (<reason>)` and returns `false`, or panics when
/// `KVSTORE_REQUIRE_CUDA=1` asks for a GPU run that cannot pass vacuously.
pub fn gpu_or_skip(test: &str) -> bool {
    match unavailable_reason() {
        None => true,
        Some(reason) => {
            if std::env::var(REQUIRE_CUDA_VAR).is_ok_and(|v| v == "1") {
                panic!("{test}: {REQUIRE_CUDA_VAR}=1 but there is no CUDA device ({reason})");
            }
            println!("SKIP: no CUDA device ({reason}): {test}");
            false
        }
    }
}
