//! The CUDA device backend: one context and one stream per device, created on first
//! use. Every operation on a device's buffers is queued on that device's one stream,
//! so operations take effect in the order they were queued, and each call returns
//! without waiting for the GPU. The host waits for the stream only where it must:
//! - after a copy to the host (the caller reads the bytes next);
//! - after a copy from the host (its source may be page-locked memory, which the GPU
//!   reads after the call returns, and which the caller may change then);
//! - around any operation that involves two devices: the other device's stream is
//!   waited for before, and the operation's own after, so neither stream uses a buffer
//!   the other is still writing.
//!
//! Buffers are freed on their stream (`cuMemFreeAsync`), after the work queued before.
//! Because the order of the stream is the order of the calls, which the store's locks
//! already decide, no event tracking is needed. An error of a kernel that fails while
//! running (none is expected: every launch is checked) is reported by the next call
//! that waits for the stream.

use std::any::Any;
use std::mem::ManuallyDrop;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use kvstore_core::backend::{DeviceBackend, DeviceBuffer, FusedArrays, FusedRule, FusedStep, PinnedMemory};
use kvstore_core::{DType, Error, Result};

/// The kernels' CUDA C source.
const KERNELS: &str = include_str!("kernels.cu");

fn backend_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend { backend: "cuda", message: format!("{what}: {e}") }
}

/// One device: its context, its stream, and its kernels (compiled on first use).
struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: OnceLock<std::result::Result<Kernels, String>>,
}

/// The kernels of one device.
struct Kernels {
    /// The reduction of each dtype, in `DType::ALL` order.
    reduce: Vec<CudaFunction>,
    /// The fused optimizer step of each float dtype, in [`OPT_KERNELS`] order.
    opt: Vec<CudaFunction>,
}

/// The fused optimizer kernels, by weight dtype.
const OPT_KERNELS: [(DType, &str); 4] =
    [(DType::F32, "kv_opt_f32"), (DType::F64, "kv_opt_f64"), (DType::F16, "kv_opt_f16"), (DType::BF16, "kv_opt_bf16")];

/// A rule's number in the kernels' `switch`.
fn rule_code(rule: FusedRule) -> i32 {
    match rule {
        FusedRule::Sgd => 0,
        FusedRule::SgdMomentum => 1,
        FusedRule::Nag => 2,
        FusedRule::NagMomentum => 3,
        FusedRule::Adam => 4,
        FusedRule::AdaGrad => 5,
        FusedRule::RmsProp => 6,
        FusedRule::RmsPropCentered => 7,
    }
}

/// Input pointers the reduction takes by value (`KV_INLINE` in kernels.cu).
const INLINE: usize = 8;

/// `KvPtrs` of kernels.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct InlinePtrs([u64; INLINE]);
// SAFETY: plain data with the layout of the kernels' `KvPtrs` (8 pointers).
unsafe impl DeviceRepr for InlinePtrs {}

/// `KvCoefs<R>` of kernels.cu: the rule's scalars in the compute type `R`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Coefs<R> {
    c: [R; 6],
    clip: R,
    clipw: R,
    flags: i32,
}
// SAFETY: plain data laid out as the kernels' `KvCoefs<float>` / `KvCoefs<double>`
// (six scalars, two bounds, an int; C and Rust pad the same way).
unsafe impl DeviceRepr for Coefs<f32> {}
unsafe impl DeviceRepr for Coefs<f64> {}

impl<R: Copy + Default> Coefs<R> {
    fn new(step: &FusedStep, of: impl Fn(f64) -> R) -> Self {
        Coefs {
            c: step.coefs.map(&of),
            clip: step.clip.map(&of).unwrap_or_default(),
            clipw: step.clip_weights.map(&of).unwrap_or_default(),
            flags: i32::from(step.clip.is_some()) | (i32::from(step.clip_weights.is_some()) << 1),
        }
    }
}

/// The kernels' CUDA C compiled to PTX for the virtual architecture `arch`
/// (`"compute_90"`), with the options that keep the host's rounding: no fused
/// multiply-add, IEEE division and square root, no flush to zero. Needs only the NVRTC
/// library, no device.
///
/// # Errors
/// [`Error::DeviceUnavailable`] when the NVRTC library is missing; [`Error::Backend`]
/// with NVRTC's log when the source does not compile.
pub fn compile_kernels(arch: &'static str) -> Result<Ptx> {
    // SAFETY: only tries to load the NVRTC library (dlopen); calls nothing in it.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
    if !matches!(present, Ok(true)) {
        return Err(Error::DeviceUnavailable {
            context: "nvrtc".to_string(),
            reason: "no NVRTC library (libnvrtc.so) on the library path".to_string(),
        });
    }
    let opts = CompileOptions {
        arch: Some(arch),
        fmad: Some(false),
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ..Default::default()
    };
    compile_ptx_with_opts(KERNELS, opts).map_err(|e| backend_error("NVRTC", e))
}

/// The kernel name of each dtype's reduction, in `DType::ALL` order.
fn reduce_kernel_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "kv_reduce_f32",
        DType::F64 => "kv_reduce_f64",
        DType::F16 => "kv_reduce_f16",
        DType::BF16 => "kv_reduce_bf16",
        DType::I32 => "kv_reduce_i32",
        DType::I64 => "kv_reduce_i64",
        DType::I8 => "kv_reduce_i8",
        DType::U8 => "kv_reduce_u8",
    }
}

/// The virtual architecture NVRTC compiles for (`compute_XY`): a `'static` string
/// per capability, as cudarc's options want.
fn arch(major: i32, minor: i32) -> &'static str {
    static NAMES: OnceLock<parking_lot::Mutex<Vec<(i32, &'static str)>>> = OnceLock::new();
    let code = major * 10 + minor;
    let mut names = NAMES.get_or_init(Default::default).lock();
    if let Some(&(_, n)) = names.iter().find(|(c, _)| *c == code) {
        return n;
    }
    let name: &'static str = Box::leak(format!("compute_{code}").into_boxed_str());
    names.push((code, name));
    name
}

impl Device {
    fn open(ordinal: usize) -> std::result::Result<Device, String> {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("the CUDA context could not be created: {e}"))?;
        // Every operation is queued on the one stream of its context, so cudarc's
        // per-buffer events are not needed.
        // SAFETY: no buffer of this context is used on two streams at once: there is
        // one stream per context, and an operation that involves another device's
        // buffer waits for that device's stream before and for its own stream after.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        Ok(Device { ctx, stream, kernels: OnceLock::new() })
    }

    fn kernels(&self) -> Result<&Kernels> {
        let compiled = self.kernels.get_or_init(|| {
            let (major, minor) = self.ctx.compute_capability().map_err(|e| e.to_string())?;
            let ptx = compile_kernels(arch(major, minor)).map_err(|e| e.to_string())?;
            let module = self.ctx.load_module(ptx).map_err(|e| format!("loading the kernels: {e}"))?;
            let load = |name: &str| module.load_function(name).map_err(|e| format!("kernel {name}: {e}"));
            let reduce =
                DType::ALL.iter().map(|&d| load(reduce_kernel_name(d))).collect::<std::result::Result<_, _>>()?;
            let opt = OPT_KERNELS.iter().map(|&(_, name)| load(name)).collect::<std::result::Result<_, _>>()?;
            Ok(Kernels { reduce, opt })
        });
        compiled.as_ref().map_err(|e| backend_error("compiling the kernels", e))
    }

    /// The kernels, or `None` when they cannot be compiled or loaded here (no NVRTC
    /// library, a driver older than the NVRTC): the caller then answers "no kernel" and
    /// core stages the work through the host, with the same results. Said once on
    /// standard error, since it costs speed.
    fn kernels_or_staging(&self) -> Option<&Kernels> {
        match self.kernels() {
            Ok(k) => Some(k),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    kvstore_core::say!("kvstore-cuda: no GPU kernels ({e}); sums and updates stage through host memory")
                });
                None
            }
        }
    }

    fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| backend_error("synchronising the stream", e))
    }
}

/// The CUDA backend (installed by [`crate::register`]).
pub struct CudaBackend {
    /// Each device, opened on first use, or why it could not be.
    devices: Vec<OnceLock<std::result::Result<Arc<Device>, String>>>,
}

impl CudaBackend {
    pub(crate) fn new(count: usize) -> Self {
        CudaBackend { devices: (0..count).map(|_| OnceLock::new()).collect() }
    }

    /// Waits until every operation queued on any device so far has finished, and
    /// reports the first error a device reports.
    pub fn synchronize(&self) -> Result<()> {
        self.devices.iter().filter_map(|d| d.get()).filter_map(|d| d.as_ref().ok()).try_for_each(|d| d.sync())
    }

    fn device(&self, ordinal: usize) -> Result<&Arc<Device>> {
        let slot = self.devices.get(ordinal).ok_or_else(|| Error::DeviceUnavailable {
            context: format!("gpu({ordinal})"),
            reason: format!("this machine has {} CUDA devices", self.devices.len()),
        })?;
        slot.get_or_init(|| Device::open(ordinal).map(Arc::new).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|reason| Error::DeviceUnavailable { context: format!("gpu({ordinal})"), reason: reason.clone() })
    }
}

/// One device buffer: `len` bytes on one device (`data` holds at least one byte:
/// cudarc cannot allocate zero). `data` is freed with the buffer, unless the memory is
/// another library's (`owner`): then it is only given back, once the work queued on it
/// is done.
pub struct CudaBuffer {
    device: Arc<Device>,
    ordinal: usize,
    len: usize,
    data: ManuallyDrop<CudaSlice<u8>>,
    /// What keeps another library's memory alive (a Python tensor), or `None` for
    /// memory this backend allocated.
    owner: Option<Box<dyn Any + Send + Sync>>,
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // SAFETY: `data` is taken once, here, and never used after.
        let data = unsafe { ManuallyDrop::take(&mut self.data) };
        if self.owner.is_none() {
            // Freed on the stream, after the work queued before. cudarc frees without
            // making the context current: on a thread that never used this device (a
            // worker's or a pool's thread), the free would fail, leak the memory and
            // leave CUDA_ERROR_INVALID_CONTEXT for the context's next call to report.
            bind("freeing device memory", &self.device.ctx);
            drop(data);
            return;
        }
        // Another library's memory: not ours to free. Its owner may free it as soon as
        // it is dropped, so the work queued on it must be done first.
        let _ = data.leak();
        if let Err(e) = self.device.sync() {
            kvstore_core::say!("kvstore-cuda: giving back a tensor's memory: {e}");
        }
        drop(self.owner.take());
    }
}

impl CudaBackend {
    /// `len` bytes of device memory at `ptr` on `device`, allocated by another library
    /// in the device's primary context (as CUDA's runtime API and PyTorch do), as a
    /// buffer of this backend; `owner` keeps that memory alive and is dropped when the
    /// buffer is, after the work queued on it.
    ///
    /// # Safety
    /// `ptr` must point to `len` bytes of device memory on `device` that stay valid
    /// while `owner` lives, and that nothing else writes while the buffer is in use
    /// (its producer's pending work must be ordered before this device's stream, the
    /// legacy default stream: see [`crate::DLPACK_STREAM`]).
    pub unsafe fn wrap_device_memory(
        &self,
        device: usize,
        ptr: u64,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Box<dyn DeviceBuffer>> {
        if len == 0 {
            // Nothing to share: an ordinary empty buffer.
            return self.alloc_zeroed(device, 0);
        }
        let dev = self.device(device)?;
        // SAFETY: the caller's promise: `ptr` is `len` valid bytes on this device, in
        // its primary context (the one `dev` holds), alive while `owner` is; the
        // buffer's `Drop` leaks the slice instead of freeing it, so cudarc never frees
        // memory it did not allocate.
        let data = unsafe { dev.stream.upgrade_device_ptr::<u8>(ptr, len) };
        Ok(Box::new(CudaBuffer {
            device: dev.clone(),
            ordinal: device,
            len,
            data: ManuallyDrop::new(data),
            owner: Some(owner),
        }))
    }
}

fn cuda(b: &dyn DeviceBuffer) -> Result<&CudaBuffer> {
    b.as_any().downcast_ref().ok_or_else(|| Error::Internal("not a CUDA buffer".into()))
}

fn cuda_mut(b: &mut dyn DeviceBuffer) -> Result<&mut CudaBuffer> {
    b.as_any_mut().downcast_mut().ok_or_else(|| Error::Internal("not a CUDA buffer".into()))
}

fn check_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::Internal(format!("{what}: {got} bytes for a buffer of {expected}")))
    }
}

impl DeviceBuffer for CudaBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }

    fn read_to_host(&self, dst: &mut [u8]) -> Result<()> {
        check_len("device to host copy", self.len, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.device.stream.memcpy_dtoh(&*self.data, dst).map_err(|e| backend_error("device to host copy", e))?;
        self.device.sync()
    }

    fn write_from_host(&mut self, src: &[u8]) -> Result<()> {
        check_len("host to device copy", self.len, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.device.stream.memcpy_htod(src, &mut *self.data).map_err(|e| backend_error("host to device copy", e))?;
        self.device.sync()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Threads per block of the kernels.
const BLOCK: u32 = 256;

/// A grid of `BLOCK`-thread blocks for `work` items (the kernels loop with a stride
/// over whatever the grid does not cover).
fn launch_config(work: u64) -> LaunchConfig {
    let blocks = work.div_ceil(u64::from(BLOCK)).clamp(1, 65_535 * 32) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// Makes `ctx` current on this thread, for a free that cudarc makes without it; a
/// failure (only of a broken context) is reported on stderr, as drops cannot return it.
fn bind(what: &str, ctx: &CudaContext) {
    if let Err(e) = ctx.bind_to_thread() {
        kvstore_core::say!("kvstore-cuda: {what}: {e}");
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context).
struct Pinned {
    /// The context it was allocated in, made current to free it.
    ctx: Arc<CudaContext>,
    /// Owns the memory; `ptr` points into it.
    _slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is plain host memory owned by `_slice` (itself Send + Sync);
// `&self`/`&mut self` give shared/exclusive access to it.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Before `_slice` is dropped (and freed, by cudarc, without binding a context).
        bind("freeing page-locked memory", &self.ctx);
    }
}

impl PinnedMemory for Pinned {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes that live as long as `_slice`, and every
        // copy into them has finished (copies to and from the host wait for their
        // stream before they return).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl DeviceBackend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn alloc_zeroed(&self, device: usize, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        let dev = self.device(device)?;
        // cudarc cannot allocate zero bytes; an empty array gets one unused byte.
        // Allocated and zeroed on the stream, before any later use of the buffer.
        let data = dev.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| backend_error("allocating", e))?;
        Ok(Box::new(CudaBuffer {
            device: dev.clone(),
            ordinal: device,
            len: bytes,
            data: ManuallyDrop::new(data),
            owner: None,
        }))
    }

    fn copy(&self, src: &dyn DeviceBuffer, dst: &mut dyn DeviceBuffer) -> Result<()> {
        let src = cuda(src)?;
        let dst = cuda_mut(dst)?;
        check_len("device to device copy", dst.len, src.len)?;
        if src.len == 0 {
            return Ok(());
        }
        // Across devices cudarc makes this a peer copy; the source's stream is waited
        // for before, and the copy's after.
        let peer = src.ordinal != dst.ordinal;
        if peer {
            src.device.sync()?;
        }
        dst.device.stream.memcpy_dtod(&*src.data, &mut *dst.data).map_err(|e| backend_error("device copy", e))?;
        if peer { dst.device.sync() } else { Ok(()) }
    }

    fn reduce(&self, dtype: DType, inputs: &[&dyn DeviceBuffer], out: &mut dyn DeviceBuffer) -> Result<bool> {
        let out = cuda_mut(out)?;
        let ins: Vec<&CudaBuffer> = inputs.iter().map(|b| cuda(*b)).collect::<Result<_>>()?;
        if ins.is_empty() {
            return Ok(false);
        }
        for b in &ins {
            check_len("reduce input", out.len, b.len)?;
        }
        let n = out.len / dtype.size();
        if n == 0 {
            return Ok(true);
        }
        let dev = out.device.clone();
        let Some(kernels) = dev.kernels_or_staging() else { return Ok(false) };
        let kernel = &kernels.reduce[DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0)];
        // Inputs on other devices are first copied to the output's device (their
        // streams waited for first); the copies are freed on the stream after the
        // kernel, and the stream is waited for at the end, before the inputs' devices
        // can write them again.
        let mut staged: Vec<CudaSlice<u8>> = Vec::new();
        let mut pointers: Vec<u64> = Vec::with_capacity(ins.len().max(INLINE));
        for b in &ins {
            let ptr = if b.ordinal == out.ordinal {
                b.data.device_ptr(&dev.stream).0
            } else {
                b.device.sync()?;
                let mut copy = dev
                    .stream
                    .alloc_zeros::<u8>(b.data.len())
                    .map_err(|e| backend_error("allocating a staging copy", e))?;
                dev.stream.memcpy_dtod(&*b.data, &mut copy).map_err(|e| backend_error("peer copy", e))?;
                let ptr = copy.device_ptr(&dev.stream).0;
                staged.push(copy);
                ptr
            };
            pointers.push(ptr);
        }
        let k = i32::try_from(ins.len()).map_err(|_| Error::invalid_argument("too many values to reduce"))?;
        // Up to INLINE pointers go by value; more go in a table on the device (the
        // upload copies `pointers`, pageable memory, before it returns).
        let table = if ins.len() > INLINE {
            Some(dev.stream.clone_htod(&pointers).map_err(|e| backend_error("uploading the input table", e))?)
        } else {
            None
        };
        let table_ptr = table.as_ref().map_or(0, |t| t.device_ptr(&dev.stream).0);
        pointers.resize(INLINE.max(pointers.len()), 0);
        let mut inline = InlinePtrs([0; INLINE]);
        inline.0.copy_from_slice(&pointers[..INLINE]);
        // One thread per 16 bytes of output.
        let vectors = (out.len as u64).div_ceil(16).max(1);
        let cfg = launch_config(vectors);
        let count = n as u64;
        let mut launch = dev.stream.launch_builder(kernel);
        launch.arg(&mut *out.data).arg(&inline).arg(&table_ptr).arg(&k).arg(&count);
        // SAFETY: the kernel's parameters are (T* out, KvPtrs inl, const void* const*
        // table, int k, u64 n): `out` holds n elements of the dtype; the k input
        // pointers (in `inline` when k <= INLINE, else in `table`) point to buffers of n
        // elements on this device (inputs, or their staged copies and the table, freed
        // on this stream after the kernel), each a whole allocation and so aligned for
        // the vector loads; the grid covers n with a stride loop.
        unsafe { launch.launch(cfg) }.map_err(|e| backend_error("launching the reduction", e))?;
        let peer = !staged.is_empty();
        drop((staged, table));
        if peer {
            dev.sync()?
        }
        Ok(true)
    }

    fn optimizer_step(&self, step: &FusedStep, a: FusedArrays<'_>) -> Result<bool> {
        let Some(kernel_at) = OPT_KERNELS.iter().position(|&(d, _)| d == a.dtype) else { return Ok(false) };
        let compute = if a.dtype == DType::F64 { 8 } else { 4 };
        let w = cuda_mut(a.weight)?;
        let g = cuda(a.grad)?;
        let states: Vec<&CudaBuffer> = a.states.into_iter().map(|b| cuda_mut(b).map(|b| &*b)).collect::<Result<_>>()?;
        let master = a.master.map(|m| cuda_mut(m).map(|m| &*m)).transpose()?;
        let n = w.len / a.dtype.size();
        if states.len() != step.rule.states() || states.len() > 3 {
            return Err(Error::Internal(format!("{:?}: {} state arrays", step.rule, states.len())));
        }
        check_len("optimizer gradient", w.len, g.len)?;
        for s in states.iter().chain(&master) {
            check_len("optimizer state", n * compute, s.len)?;
        }
        // The kernel runs on the weight's device: every array must be there.
        if std::iter::once(g).chain(states.iter().copied()).chain(master).any(|b| b.ordinal != w.ordinal) {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        let dev = w.device.clone();
        let Some(kernels) = dev.kernels_or_staging() else { return Ok(false) };
        let kernel = &kernels.opt[kernel_at];
        let ptr = |b: &CudaBuffer| b.data.device_ptr(&dev.stream).0;
        let [s0, s1, s2] = [0, 1, 2].map(|i| states.get(i).map_or(0, |b| ptr(b)));
        let m = master.map_or(0, ptr);
        let (rule, count) = (rule_code(step.rule), n as u64);
        let grad = ptr(g);
        let (c32, c64) = (Coefs::new(step, |x| x as f32), Coefs::new(step, |x| x));
        let mut launch = dev.stream.launch_builder(kernel);
        launch.arg(&rule);
        if a.dtype == DType::F64 {
            launch.arg(&c64);
        } else {
            launch.arg(&c32);
        }
        launch.arg(&mut *w.data).arg(&grad).arg(&s0).arg(&s1).arg(&s2).arg(&m).arg(&count);
        // SAFETY: the kernel's parameters are (int rule, KvCoefs<R> k, W* w, const W* g,
        // R* s0, R* s1, R* s2, R* master, u64 n) with R = double for f64 weights and
        // float otherwise (the Coefs passed match): w and g hold n elements of the
        // weight's dtype, each state and the master copy n elements of R (checked above)
        // or are null when the rule has fewer, all on this device, where a buffer is
        // freed only on this stream, after the kernel; the grid covers n with a stride
        // loop.
        unsafe { launch.launch(launch_config(count)) }.map_err(|e| backend_error("launching the optimizer step", e))?;
        Ok(true)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<Option<Box<dyn PinnedMemory>>> {
        let dev = self.device(0)?;
        // Portable: usable from every device's context. Not write-combined: the host
        // reads these buffers (it sums them).
        // SAFETY: the memory is uninitialised until the write_bytes below, and nothing
        // reads it before.
        let mut slice = unsafe {
            dev.ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .map_err(|e| backend_error("allocating page-locked memory", e))?;
        let ptr = slice.as_mut_ptr().map_err(|e| backend_error("page-locked memory", e))?;
        // SAFETY: `ptr` points to `bytes.max(1)` writable bytes owned by `slice`.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes.max(1)) };
        Ok(Some(Box::new(Pinned { ctx: dev.ctx.clone(), _slice: slice, ptr, len: bytes })))
    }
}
