//! The CUDA device backend: one context and one stream per device, created on first
//! use. Every operation is synchronous (it waits for its stream before returning), so
//! no buffer is ever in use by two operations at once and no event tracking is needed.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use kvstore_core::{DType, DeviceBackend, DeviceBuffer, Error, Result};

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

/// The reduction kernel of each dtype, in `DType::ALL` order.
struct Kernels {
    reduce: Vec<CudaFunction>,
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
        // Every operation waits for its stream, so cudarc's per-buffer events are not
        // needed.
        // SAFETY: no buffer of this context is used on two streams at once: there is
        // one stream per context, and every operation synchronises it before returning.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        Ok(Device { ctx, stream, kernels: OnceLock::new() })
    }

    fn kernels(&self) -> Result<&Kernels> {
        let compiled = self.kernels.get_or_init(|| {
            let (major, minor) = self.ctx.compute_capability().map_err(|e| e.to_string())?;
            let opts = CompileOptions {
                arch: Some(arch(major, minor)),
                fmad: Some(false),
                ftz: Some(false),
                prec_div: Some(true),
                prec_sqrt: Some(true),
                ..Default::default()
            };
            let ptx = compile_ptx_with_opts(KERNELS, opts).map_err(|e| format!("NVRTC: {e}"))?;
            let module = self.ctx.load_module(ptx).map_err(|e| format!("loading the kernels: {e}"))?;
            let reduce = DType::ALL
                .iter()
                .map(|&d| module.load_function(reduce_kernel_name(d)).map_err(|e| e.to_string()))
                .collect::<std::result::Result<_, _>>()?;
            Ok(Kernels { reduce })
        });
        compiled.as_ref().map_err(|e| backend_error("compiling the kernels", e))
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
/// cudarc cannot allocate zero).
pub struct CudaBuffer {
    device: Arc<Device>,
    ordinal: usize,
    len: usize,
    data: CudaSlice<u8>,
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
        self.device.stream.memcpy_dtoh(&self.data, dst).map_err(|e| backend_error("device to host copy", e))?;
        self.device.sync()
    }

    fn write_from_host(&mut self, src: &[u8]) -> Result<()> {
        check_len("host to device copy", self.len, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.device.stream.memcpy_htod(src, &mut self.data).map_err(|e| backend_error("host to device copy", e))?;
        self.device.sync()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Threads per block of the reduction kernel.
const BLOCK: u32 = 256;

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
        let data = dev.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| backend_error("allocating", e))?;
        dev.sync()?;
        Ok(Box::new(CudaBuffer { device: dev.clone(), ordinal: device, len: bytes, data }))
    }

    fn copy(&self, src: &dyn DeviceBuffer, dst: &mut dyn DeviceBuffer) -> Result<()> {
        let src = cuda(src)?;
        let dst = cuda_mut(dst)?;
        check_len("device to device copy", dst.len, src.len)?;
        if src.len == 0 {
            return Ok(());
        }
        // Across devices cudarc makes this a peer copy.
        dst.device.stream.memcpy_dtod(&src.data, &mut dst.data).map_err(|e| backend_error("device copy", e))?;
        dst.device.sync()
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
        let kernel = &dev.kernels()?.reduce[DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0)];
        // Inputs on other devices are first copied to the output's device; the copies
        // live until the synchronisation below.
        let mut staged: Vec<CudaSlice<u8>> = Vec::new();
        let mut pointers: Vec<u64> = Vec::with_capacity(ins.len());
        for b in &ins {
            let ptr = if b.ordinal == out.ordinal {
                b.data.device_ptr(&dev.stream).0
            } else {
                let mut copy = dev
                    .stream
                    .alloc_zeros::<u8>(b.data.len())
                    .map_err(|e| backend_error("allocating a staging copy", e))?;
                dev.stream.memcpy_dtod(&b.data, &mut copy).map_err(|e| backend_error("peer copy", e))?;
                let ptr = copy.device_ptr(&dev.stream).0;
                staged.push(copy);
                ptr
            };
            pointers.push(ptr);
        }
        let table = dev.stream.clone_htod(&pointers).map_err(|e| backend_error("uploading the input table", e))?;
        let k = i32::try_from(ins.len()).map_err(|_| Error::invalid_argument("too many values to reduce"))?;
        let blocks = (n as u64).div_ceil(u64::from(BLOCK)).min(65_535 * 32) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let count = n as u64;
        let mut launch = dev.stream.launch_builder(kernel);
        launch.arg(&mut out.data).arg(&table).arg(&k).arg(&count);
        // SAFETY: the kernel's parameters are (T* out, const T* const* ins, int k, u64 n):
        // `out` holds n elements of the dtype, `table` holds k device pointers to
        // buffers of n elements on this device (inputs or their staged copies, alive
        // until the synchronisation below), and the grid covers n with a stride loop.
        unsafe { launch.launch(cfg) }.map_err(|e| backend_error("launching the reduction", e))?;
        dev.sync()?;
        drop(staged);
        Ok(true)
    }
}
