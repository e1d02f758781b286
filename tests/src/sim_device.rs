//! A device backend whose "device memory" is host memory: it lets core's device paths
//! (device arrays, staging through the host, the reduction fast path, copies between
//! devices, faults) run and be checked on any machine. The CUDA backend implements the
//! same traits with real device memory.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kvstore_core::{DType, DeviceBackend, DeviceBuffer, Element, Error, Result, bf16, f16};

/// One simulated device buffer: `len` bytes in 8-byte words (aligned for every dtype).
pub struct SimBuffer {
    device: usize,
    len: usize,
    words: Vec<u64>,
    /// The backend's write-failure switch, shared by every buffer.
    fail_writes: &'static AtomicBool,
}

impl SimBuffer {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    fn typed<T: Element>(&self) -> &[T] {
        bytemuck::cast_slice(self.bytes())
    }

    fn typed_mut<T: Element>(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(self.bytes_mut())
    }

    /// The device this buffer is on.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl DeviceBuffer for SimBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }

    fn read_to_host(&self, dst: &mut [u8]) -> Result<()> {
        dst.copy_from_slice(self.bytes());
        Ok(())
    }

    fn write_from_host(&mut self, src: &[u8]) -> Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(Error::Backend { backend: "sim", message: "injected write failure".into() });
        }
        self.bytes_mut().copy_from_slice(src);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The simulated backend: `devices` devices; counts what it did, so that tests can tell
/// the fast path from the staged one.
pub struct SimDevice {
    devices: usize,
    /// Whether `reduce` runs (otherwise it answers "no kernel" and core stages).
    pub kernels: AtomicBool,
    /// Reductions run by the kernel.
    pub reduces: AtomicUsize,
    /// Device-to-device copies.
    pub copies: AtomicUsize,
    /// Makes every `write_from_host` fail.
    pub fail_writes: &'static AtomicBool,
}

impl SimDevice {
    /// A backend of `devices` devices, with its reduction kernel on.
    pub fn new(devices: usize) -> Self {
        SimDevice {
            devices,
            kernels: AtomicBool::new(true),
            reduces: AtomicUsize::new(0),
            copies: AtomicUsize::new(0),
            fail_writes: Box::leak(Box::new(AtomicBool::new(false))),
        }
    }
}

fn sim(b: &dyn DeviceBuffer) -> Result<&SimBuffer> {
    b.as_any().downcast_ref().ok_or_else(|| Error::Internal("not a sim buffer".into()))
}

fn sim_mut(b: &mut dyn DeviceBuffer) -> Result<&mut SimBuffer> {
    b.as_any_mut().downcast_mut().ok_or_else(|| Error::Internal("not a sim buffer".into()))
}

/// Left to right, accumulated in `T::Acc`: the host's order.
fn sum<T: Element>(inputs: &[&SimBuffer], out: &mut SimBuffer) {
    let srcs: Vec<&[T]> = inputs.iter().map(|b| b.typed::<T>()).collect();
    for (i, o) in out.typed_mut::<T>().iter_mut().enumerate() {
        let mut acc = srcs[0][i].to_acc();
        for s in &srcs[1..] {
            acc = T::acc_add(acc, s[i].to_acc());
        }
        *o = T::from_acc(acc);
    }
}

impl DeviceBackend for SimDevice {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn device_count(&self) -> usize {
        self.devices
    }

    fn alloc_zeroed(&self, device: usize, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        Ok(Box::new(SimBuffer { device, len: bytes, words: vec![0; bytes.div_ceil(8)], fail_writes: self.fail_writes }))
    }

    fn copy(&self, src: &dyn DeviceBuffer, dst: &mut dyn DeviceBuffer) -> Result<()> {
        let src = sim(src)?;
        sim_mut(dst)?.bytes_mut().copy_from_slice(src.bytes());
        self.copies.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn reduce(&self, dtype: DType, inputs: &[&dyn DeviceBuffer], out: &mut dyn DeviceBuffer) -> Result<bool> {
        if !self.kernels.load(Ordering::SeqCst) || inputs.is_empty() {
            return Ok(false);
        }
        let ins: Vec<&SimBuffer> = inputs.iter().map(|b| sim(*b)).collect::<Result<_>>()?;
        let out = sim_mut(out)?;
        match dtype {
            DType::F32 => sum::<f32>(&ins, out),
            DType::F64 => sum::<f64>(&ins, out),
            DType::F16 => sum::<f16>(&ins, out),
            DType::BF16 => sum::<bf16>(&ins, out),
            DType::I32 => sum::<i32>(&ins, out),
            DType::I64 => sum::<i64>(&ins, out),
            DType::I8 => sum::<i8>(&ins, out),
            DType::U8 => sum::<u8>(&ins, out),
        }
        self.reduces.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }
}
