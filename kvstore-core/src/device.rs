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
//! must give the same bits as the host code (NaN results excepted: a NaN stays a NaN,
//! but its sign and payload may be the device's canonical ones): a reduction kernel, fused optimizer
//! steps, and page-locked ("pinned") host memory for the buffers that `local` stores
//! stage device values through.

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

/// Page-locked host memory from a backend: copies between it and a device run at the
/// bus's full speed (DMA, no bounce through a driver buffer). Core uses it as host
/// memory, for the buffers that stores stage device values through.
pub trait PinnedMemory: Send + Sync {
    /// The memory: [`DeviceBackend::alloc_pinned`]'s byte count, starting on a 64-byte
    /// boundary.
    fn bytes(&self) -> &[u8];

    /// The memory, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// An optimizer update that a backend may run as one fused kernel over the weight, the
/// gradient and the state arrays: the rules of the host optimizers
/// (`optimizer/rules.rs`) written element-wise, with their per-step scalars computed on
/// the host. `c` is [`FusedStep::coefs`]; `g` the pushed gradient, `w` the weight, all
/// in the compute type (f32, or f64 for f64 weights); operations are evaluated exactly
/// as written, left to right, with no fused multiply-add; `clip(x)` is
/// `x > b ? b : (x < -b ? -b : x)` with `b` = [`FusedStep::clip`], and no clipping when
/// it is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedRule {
    /// SGD without momentum (`c = [lr, wd, rescale, mu]`, `mu` = 0), no state:
    /// `w = w + ((mu * 0 - (lr * wd) * w) - s)`, where the gradient's term `s` is
    /// `lr * clip(rescale * g)` with a clip bound and `(lr * rescale) * g` without one.
    Sgd,
    /// SGD with momentum (`c = [lr, wd, rescale, mu]`), state `m`:
    /// `m = (mu * m - (lr * wd) * w) - s; w = w + m`, with `s` as for [`FusedRule::Sgd`].
    SgdMomentum,
    /// NAG without momentum (`c = [lr, wd, rescale]`), no state: with a clip bound
    /// `w = (1 - lr * wd) * w - lr * clip(rescale * g)`, without one
    /// `w = (1 - lr * wd) * w - (lr * rescale) * g`.
    Nag,
    /// NAG with momentum (`c = [lr, wd, rescale, mu]`), state `m`: `r = clip(rescale *
    /// g); m = mu * m; w = (w - m) + (mu + 1) * (m - lr * (r + wd * w));
    /// m = m - lr * (r + wd * w)` (the last line reads the new `w`).
    NagMomentum,
    /// Adam (`c = [lr, wd, rescale, beta1, beta2, epsilon]`, `lr` bias-corrected),
    /// states `m`, `v`: `r = clip(g * rescale + w * wd); m = beta1 * m + (1 - beta1) * r;
    /// v = beta2 * v + ((1 - beta2) * r) * r; w = w - (lr * m) / (sqrt(v) + epsilon)`.
    Adam,
    /// AdaGrad (`c = [-lr, wd, rescale, eps]`), state `h`: `r = clip(g * rescale);
    /// h = h + r * r; w = w + (r / sqrt(h + eps) + w * wd) * -lr`.
    AdaGrad,
    /// RMSProp (`c = [lr, wd, rescale, gamma1, epsilon]`), state `n`:
    /// `r = clip(rescale * g + wd * w); n = (1 - gamma1) * (r * r) + gamma1 * n;
    /// w = clipw(w - lr * (r / sqrt(n + epsilon)))`, `clipw` clipping to
    /// [`FusedStep::clip_weights`] when it is set.
    RmsProp,
    /// Centered RMSProp (`c = [lr, wd, rescale, gamma1, gamma2, epsilon]`), states `n`,
    /// `gb`, `d`: `r = clip(rescale * g + wd * w); n = ((1 - gamma1) * r) * r + gamma1 * n;
    /// gb = (1 - gamma1) * r + gamma1 * gb; d = gamma2 * d - (lr * r) / sqrt((n - gb * gb)
    /// + epsilon); w = clipw(w + d)`.
    RmsPropCentered,
}

impl FusedRule {
    /// The number of state arrays the rule updates.
    pub fn states(self) -> usize {
        match self {
            FusedRule::Sgd | FusedRule::Nag => 0,
            FusedRule::SgdMomentum | FusedRule::NagMomentum | FusedRule::AdaGrad | FusedRule::RmsProp => 1,
            FusedRule::Adam => 2,
            FusedRule::RmsPropCentered => 3,
        }
    }
}

/// One fused optimizer step: the rule and its scalars, each already rounded to the
/// compute type (f32 values for f32, f16 and bf16 weights).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedStep {
    /// The update.
    pub rule: FusedRule,
    /// The rule's scalars, in the order its [`FusedRule`] documents (unused ones 0).
    pub coefs: [f64; 6],
    /// The gradient clip bound, if any.
    pub clip: Option<f64>,
    /// RMSProp's weight clip bound, if any.
    pub clip_weights: Option<f64>,
}

/// The arrays of one fused optimizer step, all of the same length in elements and on
/// one device.
pub struct FusedArrays<'a> {
    /// The weight's dtype: f32 and f64 weights are updated in their own type; f16 and
    /// bf16 weights in f32 (read from `master` when there is one, else from the
    /// weight), then rounded to nearest even into the weight.
    pub dtype: DType,
    /// The weight.
    pub weight: &'a mut dyn DeviceBuffer,
    /// The gradient, in the weight's dtype.
    pub grad: &'a dyn DeviceBuffer,
    /// The rule's states ([`FusedRule::states`] of them), in the compute type.
    pub states: Vec<&'a mut dyn DeviceBuffer>,
    /// The f32 master copy of an f16/bf16 weight (`multi_precision`), updated too.
    pub master: Option<&'a mut dyn DeviceBuffer>,
}

/// A GPU (or other device) backend: the device memory and, optionally, kernels.
///
/// An operation may return before the device has done it (kvstore-cuda queues each on
/// its device's stream), provided that the operations touching a buffer take effect in
/// the order they were called, from any thread, and that
/// [`DeviceBuffer::read_to_host`] and [`DeviceBuffer::write_from_host`] return only
/// once the host memory they were given has been read or written: core calls in the
/// order its locks decide and reads results only through those two.
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

    /// Fast path: one optimizer step as a fused kernel (see [`FusedRule`] for what it
    /// computes; the results must be the host rule's bits). Returns `Ok(false)` when the
    /// backend has no kernel for it or the arrays are not all on one of its devices
    /// (core then runs the host rule on staged copies).
    ///
    /// # Errors
    /// A backend error.
    fn optimizer_step(&self, step: &FusedStep, arrays: FusedArrays<'_>) -> Result<bool> {
        let _ = (step, arrays);
        Ok(false)
    }

    /// Page-locked host memory of `bytes` bytes, zeroed, for staging buffers; `None`
    /// when the backend has none (core then uses ordinary memory).
    ///
    /// # Errors
    /// A backend error.
    fn alloc_pinned(&self, bytes: usize) -> Result<Option<Box<dyn PinnedMemory>>> {
        let _ = bytes;
        Ok(None)
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
