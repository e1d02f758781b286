//! A device backend whose "device memory" is host memory: it lets core's device paths
//! (device arrays, staging through the host, the reduction fast path, copies between
//! devices, faults) run and be checked on any machine. The CUDA backend implements the
//! same traits with real device memory.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kvstore_core::backend::{DeviceBackend, DeviceBuffer, FusedArrays, FusedRule, FusedStep, PinnedMemory};
use kvstore_core::{DType, Element, Error, Result, bf16, f16};

/// One simulated device buffer: `len` bytes in 8-byte words (aligned for every dtype).
pub struct SimBuffer {
    device: usize,
    len: usize,
    words: Vec<u64>,
    /// The backend's write-failure switch, shared by every buffer.
    fail_writes: &'static AtomicUsize,
    /// The backend's counts, shared by every buffer.
    sizes: &'static SizeCounts,
}

/// Counts of events by the byte size of the buffers involved: tests that run beside
/// others in one process count only the events of their own (distinctively sized)
/// arrays.
#[derive(Default)]
pub struct SizeCounts(std::sync::Mutex<std::collections::HashMap<(&'static str, usize), usize>>);

impl SizeCounts {
    fn add(&self, what: &'static str, bytes: usize, n: usize) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry((what, bytes)).or_insert(0) += n;
    }

    /// How many times `what` (`"alloc"`, `"pinned"`, `"fused step"`, `"download"`,
    /// `"foreign input"`) happened to buffers of `bytes` bytes.
    pub fn get(&self, what: &'static str, bytes: usize) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&(what, bytes)).copied().unwrap_or(0)
    }
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
        self.sizes.add("download", self.len, 1);
        Ok(())
    }

    fn write_from_host(&mut self, src: &[u8]) -> Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) == self.device + 1 {
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
    /// Whether `optimizer_step` runs (otherwise core stages the host rule).
    pub fused: AtomicBool,
    /// By buffer size: device buffers handed out (`"alloc"`), page-locked host buffers
    /// handed out (`"pinned"`), optimizer steps run by the fused path (`"fused step"`, by
    /// the weight's size), copies to host memory (`"download"`), and inputs of kernel
    /// reductions on another device than the out (`"foreign input"`: the CUDA backend
    /// copies such an input peer to peer into a buffer of its own first).
    pub sizes: &'static SizeCounts,
    /// Makes every `write_from_host` fail.
    /// `d + 1` makes every `write_from_host` to device `d` fail (0: none fail).
    pub fail_writes: &'static AtomicUsize,
}

impl SimDevice {
    /// A backend of `devices` devices, with its reduction kernel on.
    pub fn new(devices: usize) -> Self {
        SimDevice {
            devices,
            kernels: AtomicBool::new(true),
            reduces: AtomicUsize::new(0),
            copies: AtomicUsize::new(0),
            fused: AtomicBool::new(true),
            sizes: Box::leak(Box::default()),
            fail_writes: Box::leak(Box::new(AtomicUsize::new(0))),
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

/// "Page-locked" host memory of the simulated backend: 64-byte aligned host memory.
struct SimPinned {
    lines: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl PinnedMemory for SimPinned {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// The compute types of the fused optimizer steps.
trait Real: Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> {
    fn of(x: f64) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn sqrt(self) -> Self;
    fn neg(self) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            fn of(x: f64) -> Self {
                x as $t
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn neg(self) -> Self {
                -self
            }
        }
    };
}
real!(f32);
real!(f64);

/// `x` clipped to `[-b, b]` when `b` is set.
fn clip<R: Real>(x: R, b: Option<R>) -> R {
    match b {
        Some(b) if x > b => b,
        Some(b) if x < b.neg() => b.neg(),
        _ => x,
    }
}

/// One element of a fused step, written exactly as `FusedRule` documents it (the
/// reference for the CUDA kernels in kvstore-cuda/src/kernels.cu).
fn fused_element<R: Real>(step: &FusedStep, w: &mut R, g: R, s: &mut [R]) {
    let c = step.coefs.map(R::of);
    let (bound, wbound) = (step.clip.map(R::of), step.clip_weights.map(R::of));
    let (zero, one) = (R::of(0.0), R::of(1.0));
    match (step.rule, s) {
        (FusedRule::Sgd, _) => {
            let [lr, wd, r, mu, ..] = c;
            let step = match bound {
                Some(_) => lr.mul(clip(r.mul(g), bound)),
                None => lr.mul(r).mul(g),
            };
            *w = *w + ((mu.mul(zero) - lr.mul(wd).mul(*w)) - step);
        }
        (FusedRule::SgdMomentum, [m, ..]) => {
            let [lr, wd, r, mu, ..] = c;
            let step = match bound {
                Some(_) => lr.mul(clip(r.mul(g), bound)),
                None => lr.mul(r).mul(g),
            };
            *m = (mu.mul(*m) - lr.mul(wd).mul(*w)) - step;
            *w = *w + *m;
        }
        (FusedRule::Nag, _) => {
            let [lr, wd, r, ..] = c;
            *w = match bound {
                Some(_) => (one - lr.mul(wd)).mul(*w) - lr.mul(clip(r.mul(g), bound)),
                None => (one - lr.mul(wd)).mul(*w) - lr.mul(r).mul(g),
            };
        }
        (FusedRule::NagMomentum, [m, ..]) => {
            let [lr, wd, r, mu, ..] = c;
            let rg = clip(r.mul(g), bound);
            *m = mu.mul(*m);
            *w = (*w - *m) + (mu + one).mul(*m - lr.mul(rg + wd.mul(*w)));
            *m = *m - lr.mul(rg + wd.mul(*w));
        }
        (FusedRule::Adam, [m, v, ..]) => {
            let [lr, wd, r, b1, b2, eps] = c;
            let gr = clip(g.mul(r) + w.mul(wd), bound);
            *m = b1.mul(*m) + (one - b1).mul(gr);
            *v = b2.mul(*v) + (one - b2).mul(gr).mul(gr);
            *w = *w - lr.mul(*m).div(v.sqrt() + eps);
        }
        (FusedRule::AdaGrad, [h, ..]) => {
            let [neg_lr, wd, r, eps, ..] = c;
            let gr = clip(g.mul(r), bound);
            *h = *h + gr.mul(gr);
            *w = *w + (gr.div((*h + eps).sqrt()) + w.mul(wd)).mul(neg_lr);
        }
        (FusedRule::RmsProp, [n, ..]) => {
            let [lr, wd, r, g1, eps, _] = c;
            let gr = clip(r.mul(g) + wd.mul(*w), bound);
            *n = (one - g1).mul(gr.mul(gr)) + g1.mul(*n);
            *w = clip(*w - lr.mul(gr.div((*n + eps).sqrt())), wbound);
        }
        (FusedRule::RmsPropCentered, [n, gb, d, ..]) => {
            let [lr, wd, r, g1, g2, eps] = c;
            let gr = clip(r.mul(g) + wd.mul(*w), bound);
            *n = (one - g1).mul(gr).mul(gr) + g1.mul(*n);
            *gb = (one - g1).mul(gr) + g1.mul(*gb);
            *d = g2.mul(*d) - lr.mul(gr).div(((*n - gb.mul(*gb)) + eps).sqrt());
            *w = clip(*w + *d, wbound);
        }
        _ => {}
    }
}

/// A fused step over whole buffers: weights of `W`, computed in `R` (`to`/`from`
/// convert a weight element; f16/bf16 round to nearest even).
fn fused_run<W: Element, R: Real + Element>(
    step: &FusedStep,
    a: FusedArrays<'_>,
    to: impl Fn(W) -> R,
    from: impl Fn(R) -> W,
) -> Result<()> {
    let g: Vec<W> = sim(a.grad)?.typed::<W>().to_vec();
    let w = sim_mut(a.weight)?;
    let mut states: Vec<&mut SimBuffer> = a.states.into_iter().map(sim_mut).collect::<Result<_>>()?;
    let mut master = a.master.map(sim_mut).transpose()?;
    let mut s = vec![R::of(0.0); states.len()];
    for (i, &gi) in g.iter().enumerate() {
        for (x, b) in s.iter_mut().zip(&states) {
            *x = b.typed::<R>()[i];
        }
        let mut wi = match &master {
            Some(m) => m.typed::<R>()[i],
            None => to(w.typed::<W>()[i]),
        };
        fused_element(step, &mut wi, to(gi), &mut s);
        for (x, b) in s.iter().zip(states.iter_mut()) {
            b.typed_mut::<R>()[i] = *x;
        }
        if let Some(m) = &mut master {
            m.typed_mut::<R>()[i] = wi;
        }
        w.typed_mut::<W>()[i] = from(wi);
    }
    Ok(())
}

impl DeviceBackend for SimDevice {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn device_count(&self) -> usize {
        self.devices
    }

    fn alloc_zeroed(&self, device: usize, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        self.sizes.add("alloc", bytes, 1);
        Ok(Box::new(SimBuffer {
            device,
            len: bytes,
            words: vec![0; bytes.div_ceil(8)],
            fail_writes: self.fail_writes,
            sizes: self.sizes,
        }))
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
        let foreign = ins.iter().filter(|b| b.device != out.device).count();
        self.sizes.add("foreign input", out.len, foreign);
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

    fn optimizer_step(&self, step: &FusedStep, a: FusedArrays<'_>) -> Result<bool> {
        if !self.fused.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let bytes = sim(&*a.weight)?.len;
        match a.dtype {
            DType::F32 => fused_run::<f32, f32>(step, a, |x| x, |x| x)?,
            DType::F64 => fused_run::<f64, f64>(step, a, |x| x, |x| x)?,
            DType::F16 => fused_run::<f16, f32>(step, a, f16::to_f32, f16::from_f32)?,
            DType::BF16 => fused_run::<bf16, f32>(step, a, bf16::to_f32, bf16::from_f32)?,
            _ => return Ok(false),
        }
        self.sizes.add("fused step", bytes, 1);
        Ok(true)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<Option<Box<dyn PinnedMemory>>> {
        self.sizes.add("pinned", bytes, 1);
        Ok(Some(Box::new(SimPinned { lines: vec![Line([0; 64]); bytes.div_ceil(64)], len: bytes })))
    }
}
