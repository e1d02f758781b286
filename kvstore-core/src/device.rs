//! Device contexts other than the host. Core names no GPU API: a GPU backend
//! (`kvstore-cuda`) implements [`DeviceBackend`] and [`DeviceBuffer`] and plugs itself
//! in with [`register_backend`]. Until one does, every array or store operation on a
//! `gpu(i)` context is a typed [`Error::DeviceUnavailable`] that names the context and
//! the reason, never a panic.
//!
//! What a backend must provide is small: zeroed buffers, copies to and from the host,
//! and copies between its buffers. Everything else core does on device arrays works
//! through those (the array is staged through host memory, computed with the host
//! code, and written back), so every operation is correct on every backend, with
//! results bit-identical to the host's. The optional methods are the fast paths: a
//! backend that implements them (a reduction kernel) keeps the data on the device, and
//! must give the same bits as the host code.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The memory of one device array, owned by its backend.
pub trait DeviceBuffer: Send + Sync {
    /// The size in bytes.
    fn len_bytes(&self) -> usize;

    /// Copies the whole buffer into `dst` (of [`DeviceBuffer::len_bytes`] bytes).
    ///
    /// # Errors
    /// A backend error ([`Error::Backend`]).
    fn read_to_host(&self, dst: &mut [u8]) -> Result<()>;

    /// Overwrites the whole buffer with `src` (of [`DeviceBuffer::len_bytes`] bytes).
    ///
    /// # Errors
    /// A backend error ([`Error::Backend`]).
    fn write_from_host(&mut self, src: &[u8]) -> Result<()>;

    /// The buffer as `Any`, so that its backend can reach its own type.
    fn as_any(&self) -> &dyn Any;

    /// The buffer as mutable `Any`.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A GPU (or other device) backend: the device memory and, optionally, kernels.
pub trait DeviceBackend: Send + Sync {
    /// The backend's name, for messages (`"cuda"`).
    fn name(&self) -> &'static str;

    /// The number of devices: `gpu(0)` to `gpu(n - 1)` exist.
    fn device_count(&self) -> usize;

    /// A zero-filled buffer of `bytes` bytes on device `device`.
    ///
    /// # Errors
    /// [`Error::DeviceUnavailable`] for a device that is not there,
    /// [`Error::Backend`] when the device is out of memory.
    fn alloc_zeroed(&self, device: usize, bytes: usize) -> Result<Box<dyn DeviceBuffer>>;

    /// Copies `src` into `dst` (same length; possibly on different devices).
    ///
    /// # Errors
    /// A backend error.
    fn copy(&self, src: &dyn DeviceBuffer, dst: &mut dyn DeviceBuffer) -> Result<()>;

    /// Fast path: `out = inputs[0] + inputs[1] + ...` element-wise for `dtype`, added
    /// left to right, f16/bf16 accumulated in f32 and rounded once, integers wrapping
    /// (the host's order, so the bits are the host's). `out` is not among the inputs.
    /// Returns `Ok(false)` when the backend has no such kernel (core then stages the
    /// arrays through the host).
    ///
    /// # Errors
    /// A backend error.
    fn reduce(&self, dtype: DType, inputs: &[&dyn DeviceBuffer], out: &mut dyn DeviceBuffer) -> Result<bool> {
        let _ = (dtype, inputs, out);
        Ok(false)
    }
}

static BACKEND: OnceLock<Arc<dyn DeviceBackend>> = OnceLock::new();

/// Installs the process's device backend (`kvstore-cuda` calls this); from then on
/// `gpu(i)` contexts are its devices.
///
/// # Errors
/// [`Error::Unsupported`] if another backend is already installed.
pub fn register_backend(backend: Arc<dyn DeviceBackend>) -> Result<()> {
    let name = backend.name();
    let mut installed = false;
    let current = BACKEND.get_or_init(|| {
        installed = true;
        backend
    });
    if installed || current.name() == name {
        Ok(())
    } else {
        Err(Error::Unsupported {
            what: format!("device backend \"{name}\""),
            hint: format!("the backend \"{}\" is already installed in this process", current.name()),
        })
    }
}

/// The installed device backend, if any.
pub fn backend() -> Option<&'static Arc<dyn DeviceBackend>> {
    BACKEND.get()
}

/// Checks that `ctx` is the host or a device of the installed backend.
pub(crate) fn check_context(ctx: Context) -> Result<()> {
    if ctx.is_cpu() { Ok(()) } else { backend_for(ctx).map(|_| ()) }
}

/// The backend serving `ctx`, a device context.
pub(crate) fn backend_for(ctx: Context) -> Result<&'static Arc<dyn DeviceBackend>> {
    let backend = backend().ok_or_else(|| unavailable(ctx))?;
    let count = backend.device_count();
    if (ctx.device_id() as usize) < count {
        Ok(backend)
    } else {
        Err(Error::DeviceUnavailable {
            context: ctx.to_string(),
            reason: format!(
                "the {} backend has {count} device{} (gpu(0) to gpu({}))",
                backend.name(),
                if count == 1 { "" } else { "s" },
                count.saturating_sub(1)
            ),
        })
    }
}

/// The error for a context that no registered backend serves.
pub(crate) fn unavailable(ctx: Context) -> Error {
    Error::DeviceUnavailable {
        context: ctx.to_string(),
        reason: "no GPU backend is registered in this process (GPU arrays come with \
                 kvstore-cuda: kvstore_cuda::register()); use cpu(i) contexts"
            .to_string(),
    }
}
