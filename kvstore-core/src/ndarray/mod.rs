//! `NDArray`: a shape, a dtype, a context and a shared, mutable buffer, as MXNet's
//! `NDArray` handle. Cloning an `NDArray` shares the buffer; [`crate::KVStore::pull`]
//! writes into the caller's arrays in place.
//!
//! Only the operations users of a KVStore need are here: constructors, `to_vec`,
//! element-wise `+ - * /` with a scalar or an array, `copy_to`, `as_type`. It is not a
//! tensor library.

use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::context::Context;
use crate::device;
use crate::dtype::{DType, Element, cast, with_dtype};
use crate::error::{Error, Result};

mod loan;
mod pending;
mod sparse;
mod storage;
mod twins;

pub(crate) use loan::{Lent, Reading, copied_bytes, values_read};
pub(crate) use pending::{PendingWrites, as_user_code, empty_list, mark_pool_thread, take_waited};

pub use sparse::RowSparse;
pub(crate) use sparse::row_len;
pub use storage::ForeignMemory;
pub(crate) use storage::{HostBuf, HostRead, HostWrite, Storage, copy_storage};

/// An array's shared state, laid out by use: its first cache line holds what every
/// access to the elements reads (the lock and the buffer, the pending writes, the
/// loans' count, the fault flag) and what the comm and sizing a call read (size,
/// dtype, whether it is on the host), and
/// its second what checking a call reads (shape and context). A call of many small
/// keys touches a few arrays per key, so each line it reads costs it a cache miss
/// per array. The handle's reference counts are on a line of their own before it.
#[repr(C, align(64))]
struct Inner {
    buf: RwLock<Storage>,
    size: usize,
    /// Writes a store's engine will make later (see `pending.rs`): one per queued
    /// call, so far fewer than `u32::MAX` (each takes memory).
    pending: std::sync::atomic::AtomicU32,
    /// The number of `loans` (as `pending`, one per queued call).
    lent: std::sync::atomic::AtomicU32,
    dtype: DType,
    /// Whether `fault` is set (read on every access; the message is read only then).
    faulted: std::sync::atomic::AtomicBool,
    /// Whether `ctx` is the host's: what the comm asks of every array it is given.
    on_host: bool,
    /// Whether `shape` has one dimension, so that `size` is the whole shape: two such
    /// arrays are checked alike reading this line only.
    flat: bool,
    /// Whether every write is refused (foreign memory lent read-only). On the first
    /// line, with the flags above: a call's checks of its outs read no other.
    read_only: bool,
    /// Whether the elements are another owner's memory (see [`overlapping_uses`]).
    foreign: bool,
    /// Inline up to 4 dimensions: checking a call's shapes reads no other memory.
    shape: smallvec::SmallVec<[usize; 4]>,
    ctx: Context,
    /// Set when writing a staged copy back to the device failed: the device buffer may
    /// hold anything, so every later access is this error. Set once.
    fault: OnceLock<String>,
    /// Queued calls that read this array later (and some that are done with it, until
    /// they are dropped from the list; see `loan.rs`).
    loans: parking_lot::Mutex<std::collections::VecDeque<Arc<loan::Loan>>>,
    /// The engine whose queued calls make the `pending` writes (set with `loans`
    /// locked; read only while writes are pending: see `pending.rs`).
    pending_owner: std::sync::atomic::AtomicUsize,
    /// The addresses of a host array's bytes (`start..end`; `0..0` for none or a device
    /// array), fixed for its life: what tells arrays over the same memory apart.
    span: (usize, usize),
    /// Whether the array is listed as the one over its foreign memory (`twins.rs`).
    registered: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.registered {
            twins::unlist(self);
        }
    }
}

/// Whether a call that reads `reads` and writes `writes` uses memory twice in a way
/// whose order matters, through *different* arrays over overlapping bytes, one of them
/// written: views of one buffer that a binding wrapped each on its own, or an array
/// over a store array's memory. Uses of one array (one buffer) are told apart by
/// [`used_twice`]; only arrays over foreign memory can overlap other arrays, so a
/// call with none is answered at once.
pub(crate) fn overlapping_uses<'a>(
    reads: impl Iterator<Item = &'a NDArray> + Clone,
    writes: impl Iterator<Item = &'a NDArray> + Clone,
) -> bool {
    if !reads.clone().chain(writes.clone()).any(|a| a.inner.foreign) {
        return false;
    }
    // (start, end, written, buffer), each buffer once (written if any use writes it).
    let mut spans: Vec<(usize, usize, bool, usize)> = reads
        .map(|a| (a, false))
        .chain(writes.map(|a| (a, true)))
        .filter(|(a, _)| a.inner.span.0 < a.inner.span.1)
        .map(|(a, w)| (a.inner.span.0, a.inner.span.1, w, a.buffer_id()))
        .collect();
    spans.sort_unstable_by_key(|&(start, _, written, id)| (start, id, !written));
    spans.dedup_by_key(|s| s.3);
    // Sweep in address order, keeping the spans that reach past the current start.
    let mut open: Vec<(usize, bool, usize)> = Vec::new();
    for &(start, end, written, id) in &spans {
        open.retain(|&(e, _, _)| e > start);
        if open.iter().any(|&(_, w, other)| other != id && (w || written)) {
            return true;
        }
        open.push((end, written, id));
    }
    false
}

/// Whether a call whose keys each read `values` and write `outs` uses one array (one
/// buffer) twice in a way whose order matters: written twice, or written for one key and
/// read for another (a key whose outs are its own values, one for one, writes them in
/// place: no second use). Told from the call's own lists of the buffers it reads and
/// writes, which no other call can change: arrays used by calls on other threads at the
/// same time hide nothing. The lists are sorted: arrays made one after another are
/// mostly in address order already, which the sort finds in about one pass.
pub(crate) fn used_twice<'a, V, O>(keys: impl Iterator<Item = (V, O)> + Clone) -> bool
where
    V: Iterator<Item = &'a NDArray> + Clone,
    O: Iterator<Item = &'a NDArray> + Clone,
{
    // (On the stack for the few outs of a comm's batch of jobs.)
    type Ids = smallvec::SmallVec<[usize; 32]>;
    let mut written: Ids = keys.clone().flat_map(|(_, outs)| outs.map(NDArray::buffer_id)).collect();
    if written.is_empty() {
        return false;
    }
    written.sort_unstable();
    if written.windows(2).any(|w| w[0] == w[1]) {
        return true;
    }
    let in_place = |values: &V, outs: &O| {
        values.clone().count() == outs.clone().count()
            && values.clone().zip(outs.clone()).all(|(v, o)| v.same_storage(o))
    };
    let mut read: Ids = keys
        .filter(|(values, outs)| !in_place(values, outs))
        .flat_map(|(values, _)| values.map(NDArray::buffer_id))
        .collect();
    read.sort_unstable();
    let (mut i, mut j) = (0, 0);
    while i < read.len() && j < written.len() {
        match read[i].cmp(&written[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// Whether an access to an array's storage first waits for its pending writes (and a
/// write for the calls it is lent to), or the caller did so already.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    First,
    Done,
}

/// An n-dimensional array whose buffer is shared by every clone of the handle.
///
/// ```
/// use kvstore_core::{Context, DType, NDArray};
/// let a = NDArray::ones(&[2, 3])?;
/// let b = a.mul(2.0)?;
/// assert_eq!(b.to_vec::<f32>()?, vec![2.0; 6]);
/// let c = NDArray::zeros_with(&[2], DType::I32, Context::cpu(1))?;
/// assert_eq!(c.to_string(), "[0 0]\n<NDArray 2 int32 @cpu(1)>");
/// # Ok::<(), kvstore_core::Error>(())
/// ```
#[derive(Clone)]
#[repr(C)]
pub struct NDArray {
    /// First: what a store's entry reads of its value's handle, next to its lock.
    inner: Arc<Inner>,
    /// What keeps the memory of a foreign array alive for this handle's holders, when
    /// its memory object does not (see [`NDArray::kept_alive_by`]).
    keep: Option<Arc<Keep>>,
}

#[cfg(test)]
impl NDArray {
    /// The bytes of a handle that a store's call reads: up to the end of its array's
    /// address (`inner`; `keep` after it is read only when the handle is cloned or
    /// dropped).
    pub(crate) const HOT_BYTES: usize = std::mem::offset_of!(NDArray, inner) + std::mem::size_of::<Arc<Inner>>();
}

/// Objects a handle keeps alive, in a list shared by its clones.
struct Keep {
    _this: Box<dyn std::any::Any + Send + Sync>,
    _next: Option<Arc<Keep>>,
}

/// The right-hand side of an element-wise operation: a scalar or an array of the
/// same shape and dtype.
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    /// A number, first converted to the array's dtype (as MXNet does).
    Scalar(f64),
    /// An array of the same shape and dtype.
    Array(&'a NDArray),
}

impl From<f64> for Operand<'_> {
    fn from(v: f64) -> Self {
        Operand::Scalar(v)
    }
}

impl From<f32> for Operand<'_> {
    fn from(v: f32) -> Self {
        Operand::Scalar(v as f64)
    }
}

impl From<i32> for Operand<'_> {
    fn from(v: i32) -> Self {
        Operand::Scalar(v as f64)
    }
}

impl<'a> From<&'a NDArray> for Operand<'a> {
    fn from(a: &'a NDArray) -> Self {
        Operand::Array(a)
    }
}

#[derive(Clone, Copy, Debug)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinOp {
    fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
        }
    }

    /// Floats compute in f64 and round once, which equals the native operation for
    /// f32/f16/bf16 (f64 has more than twice their precision); integers wrap.
    #[inline]
    fn apply<T: Element>(self, a: T, b: T) -> T {
        if T::DTYPE.is_float() {
            let (a, b) = (a.to_f64(), b.to_f64());
            T::from_f64(match self {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a * b,
                BinOp::Div => a / b,
            })
        } else {
            let (a, b) = (a.to_i64(), b.to_i64());
            T::from_i64(match self {
                BinOp::Add => a.wrapping_add(b),
                BinOp::Sub => a.wrapping_sub(b),
                BinOp::Mul => a.wrapping_mul(b),
                // Divisors were checked for zero before any element was written;
                // MIN / -1 wraps to MIN, as every other integer operation wraps.
                BinOp::Div => a.wrapping_div(b),
            })
        }
    }
}

/// The number of elements of `shape`, or an error if it overflows.
pub(crate) fn checked_size(shape: &[usize], dtype: DType) -> Result<usize> {
    // A zero in the shape makes an empty array, however large the other dimensions.
    if shape.contains(&0) {
        return Ok(0);
    }
    let size = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match size.and_then(|n| n.checked_mul(dtype.size()).map(|_| n)) {
        Some(n) if n.saturating_mul(dtype.size()) <= isize::MAX as usize => Ok(n),
        _ => Err(Error::invalid_argument(format!("shape {shape:?} of {dtype} is too large to allocate"))),
    }
}

impl NDArray {
    fn alloc(shape: &[usize], dtype: DType, ctx: Context) -> Result<Self> {
        Self::alloc_in(shape, dtype, ctx, false)
    }

    /// A host array of zeros on `cpu(0)` in the device backend's page-locked memory
    /// (ordinary memory when it has none): the buffers that stores stage device values
    /// through.
    pub(crate) fn pinned_zeros(shape: &[usize], dtype: DType) -> Result<Self> {
        Self::alloc_in(shape, dtype, Context::cpu(0), true)
    }

    fn alloc_in(shape: &[usize], dtype: DType, ctx: Context, pinned: bool) -> Result<Self> {
        let size = checked_size(shape, dtype)?;
        let bytes = size * dtype.size();
        let storage = if ctx.is_cpu() {
            Storage::Host(if pinned { HostBuf::pinned(bytes)? } else { HostBuf::zeroed(bytes)? })
        } else {
            let backend = device::backend_for(ctx)?;
            let buf = backend.alloc_zeroed(ctx.device_id() as usize, bytes)?;
            if buf.len_bytes() != bytes {
                return Err(Error::Internal(format!(
                    "the {} backend gave {} bytes for an array of {bytes}",
                    backend.name(),
                    buf.len_bytes()
                )));
            }
            Storage::Device(buf)
        };
        Ok(Self::over(storage, shape, size, dtype, ctx, false))
    }

    /// The array of `size` elements of `dtype` in `shape` on `ctx`, over `storage`.
    fn over(storage: Storage, shape: &[usize], size: usize, dtype: DType, ctx: Context, read_only: bool) -> Self {
        NDArray { inner: Arc::new(Self::inner_over(storage, shape, size, dtype, ctx, read_only)), keep: None }
    }

    /// The shared state of [`NDArray::over`]'s array.
    fn inner_over(
        storage: Storage,
        shape: &[usize],
        size: usize,
        dtype: DType,
        ctx: Context,
        read_only: bool,
    ) -> Inner {
        let (foreign, span) = match &storage {
            Storage::Host(b) => (b.is_foreign(), b.span().unwrap_or_default()),
            Storage::Device(_) => (false, (0, 0)),
        };
        Inner {
            buf: RwLock::new(storage),
            size,
            pending: Default::default(),
            lent: Default::default(),
            dtype,
            faulted: Default::default(),
            on_host: ctx.is_cpu(),
            flat: shape.len() == 1,
            shape: smallvec::SmallVec::from_slice(shape),
            ctx,
            fault: OnceLock::new(),
            loans: Default::default(),
            pending_owner: Default::default(),
            read_only,
            foreign,
            span,
            registered: false,
        }
    }

    /// The rows `ids` (each `row_len` elements; every id in bounds) of this array as a
    /// new host array of shape `shape`, gathered with no zero-filling first (see
    /// `HostBuf::gather_rows`, which says when it is `None`); over the current rayon
    /// pool when `piece_rows` is given.
    pub(crate) fn gathered_rows(
        &self,
        ids: &[i64],
        row_len: usize,
        shape: &[usize],
        piece_rows: Option<usize>,
    ) -> Result<Option<NDArray>> {
        let size = checked_size(shape, self.dtype())?;
        let Some(buf) = self.read()?.gather_rows(ids, row_len * self.dtype().size(), piece_rows) else {
            return Ok(None);
        };
        Ok(Some(Self::over(Storage::Host(buf), shape, size, self.dtype(), Context::cpu(0), false)))
    }

    /// A host array on `cpu(0)` over memory it does not own (see [`ForeignMemory`]): a
    /// binding's way to read and write its language's arrays in place, with no copy.
    /// A read-only one (`writable` false) refuses every write with an
    /// [`Error::InvalidArgument`]; it may still be pushed, as its elements are only
    /// read then.
    ///
    /// While an array made here over some memory lives, another `from_foreign` over
    /// exactly the same bytes, with the same shape, dtype and writability, returns that
    /// array (a handle to it, [`NDArray::same_storage`], which keeps `mem` alive as
    /// [`NDArray::kept_alive_by`] does): calls made through either are then ordered as
    /// calls on one array are, in call order (a binding wraps its array anew for each
    /// call). Unless `mem` says no other wrapper names it ([`ForeignMemory::shared`]).
    ///
    /// ```
    /// use kvstore_core::{DType, ForeignMemory, NDArray};
    /// struct Owned(Vec<u8>);
    /// impl ForeignMemory for Owned {
    ///     fn bytes(&self) -> &[u8] { &self.0 }
    ///     fn bytes_mut(&mut self) -> &mut [u8] { &mut self.0 }
    /// }
    /// let a = NDArray::from_foreign(&[2], DType::U8, Box::new(Owned(vec![1, 2])), true)?;
    /// a.add_assign(1.0)?;
    /// assert_eq!(a.to_vec::<u8>()?, vec![2, 3]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the shape is too large, or `mem` does not hold
    /// exactly the elements of `shape`, or is not aligned for `dtype`.
    pub fn from_foreign(shape: &[usize], dtype: DType, mem: Box<dyn ForeignMemory>, writable: bool) -> Result<Self> {
        let size = checked_size(shape, dtype)?;
        let shared = mem.shared();
        let buf = HostBuf::foreign(mem, size * dtype.size(), dtype.size())?;
        // (No span: no bytes, and an ordinary empty buffer.)
        match buf.span() {
            Some(span) if shared => Ok(twins::one_for(buf, span, shape, size, dtype, !writable)),
            _ => Ok(Self::over(Storage::Host(buf), shape, size, dtype, Context::cpu(0), !writable)),
        }
    }

    /// This handle, whose clones keep `keeper` alive as long as one of them lives: for
    /// an array over foreign memory that its memory object does not keep alive (see
    /// [`ForeignMemory`]), the memory's owner, so that a call given the handle (which
    /// holds a clone until it is done with the array, a non-blocking one too) keeps
    /// the memory alive.
    #[must_use]
    pub fn kept_alive_by(self, keeper: Box<dyn std::any::Any + Send + Sync>) -> NDArray {
        NDArray { inner: self.inner, keep: Some(Arc::new(Keep { _this: keeper, _next: self.keep })) }
    }
    /// An array on the device `ctx` over a buffer the caller made with that device's
    /// backend (`kvstore_core::backend::DeviceBuffer`): a binding's way to use another
    /// library's device memory in place (a CUDA tensor through DLPack), the backend's
    /// buffer keeping that memory's owner alive. A read-only one (`writable` false)
    /// refuses every write, as [`NDArray::from_foreign`] says.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `ctx` is a host context, the shape is too large or
    /// `buf` does not hold exactly the elements of `shape`;
    /// [`Error::DeviceUnavailable`] if no backend has the device.
    pub fn from_device_buffer(
        shape: &[usize],
        dtype: DType,
        ctx: Context,
        buf: Box<dyn device::DeviceBuffer>,
        writable: bool,
    ) -> Result<Self> {
        if ctx.is_cpu() {
            return Err(Error::invalid_argument(format!(
                "a device buffer on {ctx}: host memory is lent with NDArray::from_foreign"
            )));
        }
        device::backend_for(ctx)?;
        let size = checked_size(shape, dtype)?;
        let bytes = size * dtype.size();
        if buf.len_bytes() != bytes {
            return Err(Error::invalid_argument(format!(
                "a device buffer of {} bytes for an array of {bytes} bytes",
                buf.len_bytes()
            )));
        }
        Ok(Self::over(Storage::Device(buf), shape, size, dtype, ctx, !writable))
    }

    /// Whether the array refuses writes (see [`NDArray::from_foreign`]).
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// An f32 array of zeros on `cpu(0)`.
    ///
    /// ```
    /// use kvstore_core::{DType, NDArray};
    /// let a = NDArray::zeros(&[2, 3])?;
    /// assert_eq!((a.shape(), a.dtype()), (&[2, 3][..], DType::F32));
    /// assert_eq!(a.to_vec::<f32>()?, vec![0.0; 6]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the shape is too large to allocate.
    pub fn zeros(shape: &[usize]) -> Result<Self> {
        Self::zeros_with(shape, DType::F32, Context::default())
    }

    /// An array of zeros of the given dtype on the given context.
    ///
    /// ```
    /// use kvstore_core::{Context, DType, ErrorKind, NDArray};
    /// let a = NDArray::zeros_with(&[2], DType::I64, Context::cpu(1))?;
    /// assert_eq!((a.to_vec::<i64>()?, a.context()), (vec![0, 0], Context::cpu(1)));
    /// // gpu(i) needs a device backend (kvstore-cuda); without one it is an error.
    /// let e = NDArray::zeros_with(&[2], DType::F32, Context::gpu(0)).err();
    /// assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::DeviceUnavailable));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the shape is too large to allocate;
    /// [`Error::DeviceUnavailable`] for a device no backend serves.
    pub fn zeros_with(shape: &[usize], dtype: DType, ctx: Context) -> Result<Self> {
        Self::alloc(shape, dtype, ctx)
    }

    /// An f32 array of ones on `cpu(0)`.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// assert_eq!(NDArray::ones(&[3])?.to_vec::<f32>()?, vec![1.0; 3]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::zeros`].
    pub fn ones(shape: &[usize]) -> Result<Self> {
        Self::full_with(shape, 1.0, DType::F32, Context::default())
    }

    /// An array of ones of the given dtype on the given context.
    ///
    /// ```
    /// use kvstore_core::{Context, DType, NDArray};
    /// let a = NDArray::ones_with(&[2, 2], DType::U8, Context::default())?;
    /// assert_eq!(a.to_vec::<u8>()?, vec![1; 4]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::zeros_with`].
    pub fn ones_with(shape: &[usize], dtype: DType, ctx: Context) -> Result<Self> {
        Self::full_with(shape, 1.0, dtype, ctx)
    }

    /// An f32 array filled with `value` on `cpu(0)`.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// assert_eq!(NDArray::full(&[2], 0.25)?.to_vec::<f32>()?, vec![0.25; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::zeros`].
    pub fn full(shape: &[usize], value: f64) -> Result<Self> {
        Self::full_with(shape, value, DType::F32, Context::default())
    }

    /// An array filled with `value` (converted to `dtype`).
    ///
    /// ```
    /// use kvstore_core::{Context, DType, NDArray, f16};
    /// let a = NDArray::full_with(&[2], 2.5, DType::F16, Context::cpu(0))?;
    /// assert_eq!(a.to_vec::<f16>()?, vec![f16::from_f32(2.5); 2]);
    /// assert_eq!(NDArray::full_with(&[1], 2.5, DType::I32, Context::cpu(0))?.to_vec::<i32>()?, vec![2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::zeros_with`].
    pub fn full_with(shape: &[usize], value: f64, dtype: DType, ctx: Context) -> Result<Self> {
        let a = Self::alloc(shape, dtype, ctx)?;
        if value != 0.0 {
            let mut w = a.write()?;
            with_dtype!(dtype, T => w.typed_mut::<T>().fill(T::from_f64(value)));
            w.finish()?;
        }
        Ok(a)
    }

    /// An array on `cpu(0)` holding `data` (row-major) with the given shape.
    ///
    /// ```
    /// use kvstore_core::{DType, ErrorKind, NDArray};
    /// let a = NDArray::from_vec(&[2, 2], vec![1i32, 2, 3, 4])?;
    /// assert_eq!((a.dtype(), a.to_vec::<f64>()?), (DType::I32, vec![1.0, 2.0, 3.0, 4.0]));
    /// let e = NDArray::from_vec(&[3], vec![1.0f32]).err();
    /// assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::ShapeMismatch));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `data.len()` is not the number of elements of `shape`.
    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Result<Self> {
        Self::from_slice_in(shape, &data, Context::default())
    }

    /// An array on `ctx` holding a copy of `data` (row-major) with the given shape.
    ///
    /// ```
    /// use kvstore_core::{Context, DType, NDArray};
    /// let a = NDArray::from_slice_in(&[3], &[1.0f64, 2.0, 3.0], Context::cpu(2))?;
    /// assert_eq!((a.dtype(), a.context()), (DType::F64, Context::cpu(2)));
    /// assert_eq!(a.to_vec::<f64>()?, vec![1.0, 2.0, 3.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::from_vec`], and [`Error::DeviceUnavailable`] for a device no
    /// backend serves.
    pub fn from_slice_in<T: Element>(shape: &[usize], data: &[T], ctx: Context) -> Result<Self> {
        let size = checked_size(shape, T::DTYPE)?;
        if size != data.len() {
            return Err(Error::ShapeMismatch {
                context: format!("from_vec: {} elements for shape {shape:?}", data.len()),
                key: None,
                expected: shape.to_vec(),
                got: vec![data.len()],
            });
        }
        let a = Self::alloc(shape, T::DTYPE, ctx)?;
        let mut w = a.write()?;
        w.typed_mut::<T>().copy_from_slice(data);
        w.finish()?;
        Ok(a)
    }

    /// The shape.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// assert_eq!(NDArray::zeros(&[2, 3])?.shape(), &[2, 3]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// The element type.
    ///
    /// ```
    /// use kvstore_core::{DType, NDArray};
    /// assert_eq!(NDArray::from_vec(&[1], vec![1u8])?.dtype(), DType::U8);
    /// assert_eq!(NDArray::zeros(&[1])?.dtype(), DType::F32);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The context the array lives on.
    ///
    /// ```
    /// use kvstore_core::{Context, DType, NDArray};
    /// assert_eq!(NDArray::zeros(&[1])?.context(), Context::cpu(0));
    /// let a = NDArray::ones_with(&[1], DType::F32, Context::cpu(3))?;
    /// assert_eq!(a.context().to_string(), "cpu(3)");
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn context(&self) -> Context {
        self.inner.ctx
    }

    /// The number of elements.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// assert_eq!(NDArray::zeros(&[2, 3, 4])?.size(), 24);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Whether `self` and `other` are handles to the same buffer.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::zeros(&[2])?;
    /// let (b, c) = (a.clone(), a.deep_copy()?);
    /// assert!(a.same_storage(&b)); // a clone is another handle to the same buffer
    /// assert!(!a.same_storage(&c));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn same_storage(&self, other: &NDArray) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether this array and `other` use some of the same bytes: handles to one buffer,
    /// or arrays over overlapping memory (a binding's views of one buffer, each wrapped
    /// on its own). Device arrays overlap only as handles to one buffer.
    pub fn shares_memory(&self, other: &NDArray) -> bool {
        let ((a, b), (c, d)) = (self.inner.span, other.inner.span);
        self.same_storage(other) || (a < b && c < d && a < d && c < b)
    }

    fn check_fault(&self) -> Result<()> {
        if !self.inner.faulted.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let message = self.inner.fault.get().map_or("the array is faulty", String::as_str);
        Err(Error::Backend { backend: "device", message: message.to_string() })
    }

    /// Marks the array faulty: a device operation on it failed half way, so every later
    /// access is a [`Error::Backend`] error with `message`.
    pub(crate) fn mark_faulty(&self, message: String) {
        let _ = self.inner.fault.set(message);
        self.inner.faulted.store(true, std::sync::atomic::Ordering::Release);
    }

    /// A shared read lock on the storage itself (recursive, so one thread may hold
    /// several read locks of one array, as when the same array is pushed twice).
    pub(crate) fn storage(&self) -> Result<RwLockReadGuard<'_, Storage>> {
        self.storage_as(Wait::First)
    }

    /// [`NDArray::storage`]; with [`Wait::Done`], for a caller that waited already
    /// ([`NDArray::ready_pair`]), taken without waiting again.
    fn storage_as(&self, wait: Wait) -> Result<RwLockReadGuard<'_, Storage>> {
        if wait == Wait::First {
            self.settle()?;
        }
        self.check_fault()?;
        Ok(self.inner.buf.read_recursive())
    }

    /// An exclusive lock on the storage itself (once queued calls that read the array
    /// have a copy of it or are done with it: see `loan.rs`).
    pub(crate) fn storage_mut(&self) -> Result<RwLockWriteGuard<'_, Storage>> {
        self.storage_mut_as(Wait::First)
    }

    /// [`NDArray::storage_mut`], or with [`Wait::Done`] as [`NDArray::storage_as`].
    fn storage_mut_as(&self, wait: Wait) -> Result<RwLockWriteGuard<'_, Storage>> {
        self.check_writable()?;
        if wait == Wait::First {
            self.settle()?;
            self.reclaim()?;
        }
        self.check_fault()?;
        Ok(self.inner.buf.write())
    }

    /// An error if the array is read-only.
    fn check_writable(&self) -> Result<()> {
        match self.inner.read_only {
            true => Err(Error::invalid_argument(format!(
                "the array (shape {:?}, {}) is read-only: it may be pushed, not written",
                self.shape(),
                self.dtype()
            ))),
            false => Ok(()),
        }
    }

    /// Before `self` is written with `other` read: waits for both arrays' pending
    /// writes and for the queued calls `self` is lent to, with no lock held, so that the
    /// two locks are then taken without waiting (a thread that held one while it waited
    /// for an engine could block that engine's access to it: a deadlock).
    fn ready_pair(&self, other: &NDArray) -> Result<()> {
        self.check_writable()?;
        self.settle()?;
        other.settle()?;
        self.reclaim()
    }

    /// Whether `other` has this array's shape (reading only the first cache line of
    /// each when both have one dimension).
    pub(crate) fn same_shape(&self, other: &NDArray) -> bool {
        match self.inner.flat && other.inner.flat {
            true => self.inner.size == other.inner.size,
            false => self.shape() == other.shape(),
        }
    }

    /// Whether this array has `shape` (reading only its first cache line when it has
    /// one dimension).
    pub(crate) fn has_shape(&self, shape: &[usize]) -> bool {
        match self.inner.flat {
            true => matches!(shape, [n] if *n == self.inner.size),
            false => self.shape() == shape,
        }
    }

    /// Whether this array has the shape `dims` (reading only its first cache line when
    /// it has one dimension).
    pub(crate) fn has_dims(&self, dims: &[u32]) -> bool {
        match self.inner.flat {
            true => matches!(dims, [n] if *n as usize == self.inner.size),
            false => self.shape().iter().copied().eq(dims.iter().map(|&n| n as usize)),
        }
    }

    /// Whether the elements live on a device.
    pub(crate) fn on_device(&self) -> bool {
        !self.inner.on_host
    }

    /// A host copy of this array's storage `st`.
    fn download(&self, st: &Storage) -> Result<HostBuf> {
        let mut staged = Storage::Host(HostBuf::zeroed(self.size() * self.dtype().size())?);
        copy_storage(st, &mut staged)?;
        match staged {
            Storage::Host(b) => Ok(b),
            Storage::Device(_) => Err(Error::Internal("a host copy turned into a device buffer".into())),
        }
    }

    /// The elements as host memory, read-locked (staged from the device for a device
    /// array).
    pub(crate) fn read(&self) -> Result<HostRead<'_>> {
        self.read_as(Wait::First)
    }

    /// [`NDArray::read`], waiting first or not (see [`NDArray::storage_as`]).
    fn read_as(&self, wait: Wait) -> Result<HostRead<'_>> {
        let guard = self.storage_as(wait)?;
        match RwLockReadGuard::try_map(guard, |st| st.host()) {
            Ok(host) => Ok(HostRead::Host(host)),
            Err(guard) => {
                let staged = self.download(&guard)?;
                Ok(HostRead::Staged { _lock: guard, buf: staged })
            }
        }
    }

    /// The elements as host memory, write-locked (for a device array, a staged copy
    /// written back when the guard drops).
    pub(crate) fn write(&self) -> Result<HostWrite<'_>> {
        self.host_write(true, Wait::First)
    }

    /// The elements as host memory, write-locked, for a caller that overwrites every
    /// element: a device array's staged copy starts zeroed instead of downloaded (the
    /// download would be thrown away), and is written back on finish.
    pub(crate) fn overwrite(&self) -> Result<HostWrite<'_>> {
        self.host_write(false, Wait::First)
    }

    /// [`NDArray::write`] (`download`: the staged copy starts as the device's data) or
    /// [`NDArray::overwrite`] (it starts zeroed).
    fn host_write(&self, download: bool, wait: Wait) -> Result<HostWrite<'_>> {
        let guard = self.storage_mut_as(wait)?;
        match RwLockWriteGuard::try_map(guard, |st| st.host_mut()) {
            Ok(host) => Ok(HostWrite::Host(host)),
            Err(guard) => {
                let staged = match download {
                    true => self.download(&guard)?,
                    false => HostBuf::zeroed(self.size() * self.dtype().size())?,
                };
                Ok(HostWrite::Staged { lock: guard, buf: staged, array: self, done: false })
            }
        }
    }

    /// Locks `self` for writing and `other` (a different buffer) for reading, in
    /// address order, so that two threads doing `a op= b` and `b op= a` cannot deadlock.
    fn lock_pair<'a>(&'a self, other: &'a NDArray) -> Result<(HostWrite<'a>, HostRead<'a>)> {
        self.ready_pair(other)?;
        if Arc::as_ptr(&self.inner) < Arc::as_ptr(&other.inner) {
            let w = self.host_write(true, Wait::Done)?;
            Ok((w, other.read_as(Wait::Done)?))
        } else {
            let r = other.read_as(Wait::Done)?;
            Ok((self.host_write(true, Wait::Done)?, r))
        }
    }

    /// The storages of `self` (write) and `other` (read, a different buffer), locked
    /// in address order as [`NDArray::lock_pair`].
    fn lock_storage_pair<'a>(
        &'a self,
        other: &'a NDArray,
    ) -> Result<(RwLockWriteGuard<'a, Storage>, RwLockReadGuard<'a, Storage>)> {
        self.ready_pair(other)?;
        if Arc::as_ptr(&self.inner) < Arc::as_ptr(&other.inner) {
            let w = self.storage_mut_as(Wait::Done)?;
            Ok((w, other.storage_as(Wait::Done)?))
        } else {
            let r = other.storage_as(Wait::Done)?;
            Ok((self.storage_mut_as(Wait::Done)?, r))
        }
    }

    /// The elements, row-major, converted to `T` (see [`NDArray::as_type`] for the
    /// conversion rules).
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::from_vec(&[3], vec![1.5f32, -2.5, 3.0])?;
    /// assert_eq!(a.to_vec::<f32>()?, vec![1.5, -2.5, 3.0]);
    /// assert_eq!(a.to_vec::<i32>()?, vec![1, -2, 3]); // truncated toward zero
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// None for host arrays; a backend error for a device array.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let buf = self.read()?;
        Ok(with_dtype!(self.dtype(), S => buf.typed::<S>().iter().map(|&s| cast::<S, T>(s)).collect()))
    }

    /// Runs `f` on the elements, row-major, without copying them (the array is read-locked
    /// meanwhile). For bindings that copy straight out of the array. A device array's
    /// elements are staged through host memory first.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, NDArray};
    /// let a = NDArray::from_vec(&[3], vec![1.0f32, 2.0, 3.0])?;
    /// assert_eq!(a.with_data(|x: &[f32]| x.iter().sum::<f32>())?, 6.0);
    /// let e = a.with_data(|x: &[f64]| x.len()).err(); // not an f64 array
    /// assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::DTypeMismatch));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] if `T` is not the array's element type; a backend error
    /// for a device array.
    pub fn with_data<T: Element, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.check_element::<T>("with_data")?;
        Ok(f(self.read()?.typed::<T>()))
    }

    /// Runs `f` on the elements, mutably, without copying them (the array is
    /// write-locked meanwhile). For bindings that copy straight into the array. A device
    /// array's elements are staged through host memory and written back afterwards.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::zeros(&[3])?;
    /// a.with_data_mut(|x: &mut [f32]| x.copy_from_slice(&[1.0, 2.0, 3.0]))?;
    /// assert_eq!(a.to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::with_data`].
    pub fn with_data_mut<T: Element, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.check_element::<T>("with_data_mut")?;
        let mut w = self.write()?;
        let r = f(w.typed_mut::<T>());
        w.finish()?;
        Ok(r)
    }

    fn check_element<T: Element>(&self, op: &str) -> Result<()> {
        if T::DTYPE == self.dtype() {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                context: format!("ndarray {op}"),
                key: None,
                expected: self.dtype(),
                got: T::DTYPE,
            })
        }
    }

    /// The elements as f64, row-major (exact for every dtype but large i64 values).
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::from_vec(&[2], vec![7i64, -1])?;
    /// assert_eq!(a.to_f64_vec()?, vec![7.0, -1.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::to_vec`].
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        self.to_vec::<f64>()
    }

    /// A copy of this array on `ctx`.
    ///
    /// ```
    /// use kvstore_core::{Context, NDArray};
    /// let a = NDArray::ones(&[2])?;
    /// let b = a.copy_to(Context::cpu(1))?;
    /// assert_eq!((b.context(), b.to_vec::<f32>()?), (Context::cpu(1), vec![1.0; 2]));
    /// assert!(!a.same_storage(&b));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::DeviceUnavailable`] for a device no backend serves.
    pub fn copy_to(&self, ctx: Context) -> Result<NDArray> {
        let out = Self::alloc(self.shape(), self.dtype(), ctx)?;
        copy_storage(&*self.storage()?, &mut *out.storage_mut()?)?;
        Ok(out)
    }

    /// A copy of this array converted to `dtype`: floats to integers truncate toward
    /// zero (saturating), integers to narrower integers wrap, floats round to nearest.
    ///
    /// ```
    /// use kvstore_core::{DType, NDArray};
    /// let a = NDArray::from_vec(&[3], vec![1.7f32, -1.7, 300.0])?;
    /// let b = a.as_type(DType::I8)?;
    /// assert_eq!((b.dtype(), b.to_vec::<i8>()?), (DType::I8, vec![1, -1, 127])); // truncated, saturated
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::copy_to`].
    pub fn as_type(&self, dtype: DType) -> Result<NDArray> {
        let out = Self::alloc(self.shape(), dtype, self.context())?;
        out.copy_from(self)?;
        Ok(out)
    }

    /// Overwrites this array with `src` (same shape; the dtype is converted as in
    /// [`NDArray::as_type`]).
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, NDArray};
    /// let a = NDArray::zeros(&[2])?;
    /// a.copy_from(&NDArray::from_vec(&[2], vec![1i32, 2])?)?; // converted to f32
    /// assert_eq!(a.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// let e = a.copy_from(&NDArray::zeros(&[3])?).err();
    /// assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::ShapeMismatch));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if the shapes differ.
    pub fn copy_from(&self, src: &NDArray) -> Result<()> {
        self.check_shape(src, "copy_from")?;
        if self.same_storage(src) {
            return Ok(());
        }
        if self.dtype() == src.dtype() {
            let (mut dst, s) = self.lock_storage_pair(src)?;
            copy_storage(&s, &mut dst)?;
        } else {
            let (mut dst, s) = self.lock_pair(src)?;
            with_dtype!(src.dtype(), S => with_dtype!(self.dtype(), D => {
                for (d, &x) in dst.typed_mut::<D>().iter_mut().zip(s.typed::<S>()) {
                    *d = cast::<S, D>(x);
                }
            }));
            drop(s);
            dst.finish()?;
        }
        Ok(())
    }

    fn check_shape(&self, other: &NDArray, op: &str) -> Result<()> {
        if self.shape() != other.shape() {
            return Err(Error::ShapeMismatch {
                context: format!("ndarray {op}"),
                key: None,
                expected: self.shape().to_vec(),
                got: other.shape().to_vec(),
            });
        }
        Ok(())
    }

    fn assign_op(&self, rhs: Operand<'_>, op: BinOp) -> Result<()> {
        match rhs {
            Operand::Scalar(v) => with_dtype!(self.dtype(), T => {
                let s = T::from_f64(v);
                if matches!(op, BinOp::Div) && !T::DTYPE.is_float() && s == T::default() {
                    return Err(Error::invalid_argument(if v == 0.0 {
                        "ndarray div: integer division by zero".to_string()
                    } else {
                        format!(
                            "ndarray div: the divisor {v} is 0 as {} (a scalar takes the array's dtype, and \
                             integers are not divided by 0): convert the array with as_type first",
                            T::DTYPE
                        )
                    }));
                }
                let mut w = self.write()?;
                for x in w.typed_mut::<T>() {
                    *x = op.apply(*x, s);
                }
                w.finish()?;
            }),
            Operand::Array(b) => {
                self.check_shape(b, op.name())?;
                if self.dtype() != b.dtype() {
                    return Err(Error::DTypeMismatch {
                        context: format!("ndarray {}", op.name()),
                        key: None,
                        expected: self.dtype(),
                        got: b.dtype(),
                    });
                }
                if self.same_storage(b) {
                    with_dtype!(self.dtype(), T => {
                        let mut g = self.write()?;
                        let xs = g.typed_mut::<T>();
                        if matches!(op, BinOp::Div) && !T::DTYPE.is_float() && xs.contains(&T::default()) {
                            return Err(Error::invalid_argument("ndarray div: integer division by zero"));
                        }
                        for x in xs {
                            *x = op.apply(*x, *x);
                        }
                        g.finish()?;
                    });
                } else {
                    let (mut dst, src) = self.lock_pair(b)?;
                    with_dtype!(self.dtype(), T => {
                        let ys = src.typed::<T>();
                        if matches!(op, BinOp::Div) && !T::DTYPE.is_float() && ys.contains(&T::default()) {
                            return Err(Error::invalid_argument("ndarray div: integer division by zero"));
                        }
                        for (x, &y) in dst.typed_mut::<T>().iter_mut().zip(ys) {
                            *x = op.apply(*x, y);
                        }
                        drop(src);
                        dst.finish()?;
                    });
                }
            }
        }
        Ok(())
    }

    fn binary(&self, rhs: Operand<'_>, op: BinOp) -> Result<NDArray> {
        let out = self.copy_to(self.context())?;
        out.assign_op(rhs, op)?;
        Ok(out)
    }

    /// `self + rhs` as a new array.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::from_vec(&[2], vec![1.0f32, 2.0])?;
    /// assert_eq!(a.add(1.0)?.to_vec::<f32>()?, vec![2.0, 3.0]);
    /// assert_eq!(a.add(&a)?.to_vec::<f32>()?, vec![2.0, 4.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`] for an array operand that
    /// differs in shape or dtype (there is no broadcasting).
    pub fn add<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<NDArray> {
        self.binary(rhs.into(), BinOp::Add)
    }

    /// `self - rhs` as a new array.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::from_vec(&[2], vec![1.0f32, 2.0])?;
    /// assert_eq!(a.sub(1.0)?.to_vec::<f32>()?, vec![0.0, 1.0]);
    /// assert_eq!(a.sub(&a.mul(3.0)?)?.to_vec::<f32>()?, vec![-2.0, -4.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn sub<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<NDArray> {
        self.binary(rhs.into(), BinOp::Sub)
    }

    /// `self * rhs` as a new array.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::from_vec(&[2], vec![1.5f32, 2.0])?;
    /// assert_eq!(a.mul(2.0)?.to_vec::<f32>()?, vec![3.0, 4.0]);
    /// assert_eq!(a.mul(&a)?.to_vec::<f32>()?, vec![2.25, 4.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn mul<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<NDArray> {
        self.binary(rhs.into(), BinOp::Mul)
    }

    /// `self / rhs` as a new array.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, NDArray};
    /// let a = NDArray::from_vec(&[2], vec![3.0f32, 1.0])?;
    /// assert_eq!(a.div(2.0)?.to_vec::<f32>()?, vec![1.5, 0.5]);
    /// let i = NDArray::from_vec(&[2], vec![7i32, -7])?;
    /// assert_eq!(i.div(2)?.to_vec::<i32>()?, vec![3, -3]);
    /// assert_eq!(i.div(0).err().map(|e| e.kind()), Some(ErrorKind::InvalidArgument));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::add`], and [`Error::InvalidArgument`] for an integer division by zero.
    pub fn div<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<NDArray> {
        self.binary(rhs.into(), BinOp::Div)
    }

    /// `self += rhs`, in place (visible through every clone of the handle).
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::ones(&[2])?;
    /// let b = a.clone();
    /// a.add_assign(2.0)?;
    /// assert_eq!(b.to_vec::<f32>()?, vec![3.0; 2]); // seen through the clone
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn add_assign<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<()> {
        self.assign_op(rhs.into(), BinOp::Add)
    }

    /// `self -= rhs`, in place.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::full(&[2], 5.0)?;
    /// a.sub_assign(&NDArray::ones(&[2])?)?;
    /// assert_eq!(a.to_vec::<f32>()?, vec![4.0; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn sub_assign<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<()> {
        self.assign_op(rhs.into(), BinOp::Sub)
    }

    /// `self *= rhs`, in place.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::full(&[2], 5.0)?;
    /// a.mul_assign(0.5)?;
    /// assert_eq!(a.to_vec::<f32>()?, vec![2.5; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn mul_assign<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<()> {
        self.assign_op(rhs.into(), BinOp::Mul)
    }

    /// `self /= rhs`, in place.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::full(&[2], 5.0)?;
    /// a.div_assign(&NDArray::full(&[2], 2.0)?)?;
    /// assert_eq!(a.to_vec::<f32>()?, vec![2.5; 2]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::div`].
    pub fn div_assign<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<()> {
        self.assign_op(rhs.into(), BinOp::Div)
    }

    /// A deep copy on the same context, sharing nothing with `self`.
    ///
    /// ```
    /// use kvstore_core::NDArray;
    /// let a = NDArray::ones(&[2])?;
    /// let b = a.deep_copy()?;
    /// a.add_assign(1.0)?;
    /// assert_eq!(b.to_vec::<f32>()?, vec![1.0; 2]); // the copy shares nothing
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`NDArray::copy_to`].
    pub fn deep_copy(&self) -> Result<NDArray> {
        self.copy_to(self.context())
    }

    /// A copy of the elements `part` of the array (flat, row-major) as a 1-D host
    /// array of the same dtype.
    pub(crate) fn flat_part(&self, part: std::ops::Range<usize>) -> Result<NDArray> {
        if part.start > part.end || part.end > self.size() {
            return Err(Error::Internal(format!("elements {part:?} of an array of {}", self.size())));
        }
        let each = self.dtype().size();
        let copy = NDArray::zeros_with(&[part.len()], self.dtype(), Context::default())?;
        copy.write()?.bytes_mut().copy_from_slice(&self.read()?.bytes()[part.start * each..part.end * each]);
        Ok(copy)
    }
}

/// Elements shown per axis at each end when an array is too large to print whole.
const EDGE: usize = 3;
/// Arrays up to this many elements print whole.
const PRINT_WHOLE: usize = 1000;

fn fmt_elem<T: Element>(x: T, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if T::DTYPE.is_float() { write!(f, "{:?}", x.to_f64() as f32) } else { write!(f, "{}", x.to_i64()) }
}

fn fmt_axis<T: Element>(
    data: &[T],
    shape: &[usize],
    depth: usize,
    summarize: bool,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let Some((&n, rest)) = shape.split_first() else {
        return data.first().map_or(Ok(()), |&x| fmt_elem(x, f));
    };
    let stride: usize = rest.iter().product();
    f.write_str("[")?;
    let shown: Vec<Option<usize>> = if summarize && n > 2 * EDGE {
        (0..EDGE).map(Some).chain([None]).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (j, item) in shown.iter().enumerate() {
        if j > 0 {
            if rest.is_empty() {
                f.write_str(" ")?;
            } else {
                write!(f, "\n{:width$}", "", width = depth + 1)?;
            }
        }
        match item {
            Some(i) => {
                let sub = data.get(i * stride..(i + 1) * stride).unwrap_or(&[]);
                fmt_axis(sub, rest, depth + 1, summarize, f)?;
            }
            None => f.write_str("...")?,
        }
    }
    f.write_str("]")
}

impl fmt::Display for NDArray {
    /// Prints the values (summarised beyond 1000 elements) and a line naming the
    /// shape, dtype and context, as MXNet's `NDArray.__repr__`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let buf = self.read().map_err(|_| fmt::Error)?;
        let summarize = self.size() > PRINT_WHOLE;
        with_dtype!(self.dtype(), T => fmt_axis(buf.typed::<T>(), self.shape(), 0, summarize, f))?;
        let dims: Vec<String> = self.shape().iter().map(usize::to_string).collect();
        write!(f, "\n<NDArray {} {} @{}>", dims.join("x"), self.dtype(), self.context())
    }
}

impl fmt::Debug for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn clones_share_the_buffer_and_deep_copies_do_not() {
        let a = NDArray::zeros(&[2, 2]).unwrap();
        let b = a.clone();
        let c = a.deep_copy().unwrap();
        a.add_assign(3.0).unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![3.0; 4]);
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.0; 4]);
        assert!(a.same_storage(&b) && !a.same_storage(&c));
    }

    #[test]
    fn what_an_access_reads_is_on_one_cache_line_and_the_checks_on_the_next() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<Inner>(), 64);
        let first = [
            offset_of!(Inner, buf) + size_of::<RwLock<Storage>>(),
            offset_of!(Inner, size) + size_of::<usize>(),
            offset_of!(Inner, pending) + 4,
            offset_of!(Inner, lent) + 4,
            offset_of!(Inner, dtype) + size_of::<DType>(),
            offset_of!(Inner, faulted) + 1,
            offset_of!(Inner, on_host) + 1,
            offset_of!(Inner, flat) + 1,
        ];
        assert!(first.iter().all(|&end| end <= 64), "{first:?}");
        assert_eq!(offset_of!(Inner, shape), 64);
        assert!(offset_of!(Inner, ctx) + size_of::<Context>() <= 128);
        // The reference counts of the `Arc` are on the line before.
        let a = NDArray::zeros(&[3]).unwrap();
        assert!((Arc::as_ptr(&a.inner) as usize).is_multiple_of(64));
    }

    #[test]
    fn a_call_finds_the_arrays_it_writes_twice_or_reads_and_writes() {
        let (a, b, c) = (NDArray::zeros(&[2]).unwrap(), NDArray::zeros(&[2]).unwrap(), NDArray::zeros(&[2]).unwrap());
        let twice = |keys: &[(Vec<&NDArray>, Vec<&NDArray>)]| {
            used_twice(keys.iter().map(|(v, o)| (v.iter().copied(), o.iter().copied())))
        };
        assert!(!twice(&[(vec![&a, &a], vec![&b]), (vec![&a], vec![&c])]), "read twice is fine");
        assert!(twice(&[(vec![&a], vec![&b]), (vec![&c], vec![&b])]), "written twice");
        assert!(twice(&[(vec![&a], vec![&b]), (vec![&b], vec![&c])]), "written, then read");
        assert!(twice(&[(vec![&b], vec![&c]), (vec![&a], vec![&b])]), "read, then written");
        assert!(!twice(&[(vec![&a], vec![&a]), (vec![&b, &c], vec![&b, &c])]), "in place");
        assert!(twice(&[(vec![&a], vec![&a]), (vec![&a], vec![&b])]), "in place, and read by another key");
        assert!(twice(&[(vec![&a], vec![&b, &b])]), "one key's out given twice");
        assert!(!twice(&[(vec![&a], vec![]), (vec![&a, &b], vec![])]), "no out");
    }
    #[test]
    fn shapes_compare_alike_whether_flat_or_not() {
        let a = |shape: &[usize]| NDArray::zeros(shape).unwrap();
        let same = [(a(&[6]), a(&[6])), (a(&[2, 3]), a(&[2, 3])), (a(&[]), a(&[])), (a(&[0]), a(&[0]))];
        assert!(same.iter().all(|(x, y)| x.same_shape(y) && x.has_shape(y.shape())));
        let differ = [(a(&[6]), a(&[7])), (a(&[2, 3]), a(&[3, 2])), (a(&[6]), a(&[1, 6])), (a(&[1]), a(&[]))];
        assert!(differ.iter().all(|(x, y)| !x.same_shape(y) && !x.has_shape(y.shape())));
    }

    #[test]
    fn a_faulty_array_reports_its_message_on_every_access() {
        let a = NDArray::zeros(&[2]).unwrap();
        a.mark_faulty("the device is gone".to_string());
        for e in [a.to_vec::<f32>().unwrap_err(), a.add_assign(1.0).unwrap_err()] {
            assert!(e.to_string().contains("the device is gone"), "{e}");
        }
    }

    #[test]
    fn host_buffers_are_64_byte_aligned() {
        for n in [1, 3, 17, 1000] {
            let a = NDArray::zeros_with(&[n], DType::U8, Context::cpu(0)).unwrap();
            assert_eq!(a.read().unwrap().bytes().as_ptr() as usize % 64, 0);
        }
    }

    #[test]
    fn scalar_and_array_ops_follow_the_dtype() {
        let a = NDArray::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap();
        assert_eq!(a.mul(2).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
        assert_eq!(a.sub(&a).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 3]);
        assert_eq!(a.div(&a.add(1.0).unwrap()).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 2.0 / 3.0, 0.75]);
        let i = NDArray::from_vec(&[2], vec![7i32, -7]).unwrap();
        assert_eq!(i.div(2).unwrap().to_vec::<i32>().unwrap(), vec![3, -3]);
        assert_eq!(i.div(0).unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(i.mul(2.9).unwrap().to_vec::<i32>().unwrap(), vec![14, -14]);
        let u = NDArray::from_vec(&[1], vec![250u8]).unwrap();
        assert_eq!(u.add(10).unwrap().to_vec::<u8>().unwrap(), vec![4]);
    }

    #[test]
    fn an_op_on_itself_does_not_deadlock() {
        let a = NDArray::full(&[4], 3.0).unwrap();
        a.add_assign(&a).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![6.0; 4]);
        a.copy_from(&a.clone()).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![6.0; 4]);
    }

    #[test]
    fn mismatched_operands_are_errors_that_change_nothing() {
        let a = NDArray::ones(&[2, 3]).unwrap();
        let b = NDArray::ones(&[3, 2]).unwrap();
        assert_eq!(a.add_assign(&b).unwrap_err().kind(), crate::ErrorKind::ShapeMismatch);
        let c = NDArray::ones_with(&[2, 3], DType::F64, Context::cpu(0)).unwrap();
        assert_eq!(a.add_assign(&c).unwrap_err().kind(), crate::ErrorKind::DTypeMismatch);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; 6]);
    }

    #[test]
    fn as_type_and_copy_to_convert_and_move() {
        let a = NDArray::from_vec(&[2], vec![1.7f32, -1.7]).unwrap();
        assert_eq!(a.as_type(DType::I32).unwrap().to_vec::<i32>().unwrap(), vec![1, -1]);
        assert_eq!(a.as_type(DType::F16).unwrap().to_vec::<f16>().unwrap()[0].to_f32(), 1.7001953);
        let b = a.copy_to(Context::cpu(3)).unwrap();
        assert_eq!(b.context(), Context::cpu(3));
        assert_eq!(b.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
    }

    #[test]
    fn element_access_is_in_place_and_checks_the_dtype() {
        let a = NDArray::zeros(&[3]).unwrap();
        a.with_data_mut(|x: &mut [f32]| x.copy_from_slice(&[1.0, 2.0, 3.0])).unwrap();
        assert_eq!(a.with_data(|x: &[f32]| x.iter().sum::<f32>()).unwrap(), 6.0);
        let e = a.with_data(|x: &[f64]| x.len()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::DTypeMismatch);
    }

    #[test]
    fn bad_shapes_and_devices_are_errors() {
        assert_eq!(NDArray::zeros(&[usize::MAX, 2]).unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(NDArray::zeros(&[1 << 62]).unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(NDArray::from_vec(&[2, 2], vec![1.0f32; 3]).unwrap_err().kind(), crate::ErrorKind::ShapeMismatch);
        let e = NDArray::zeros_with(&[2], DType::F32, Context::gpu(0)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::DeviceUnavailable);
        assert!(e.to_string().contains("gpu(0)"), "{e}");
    }

    #[test]
    fn empty_and_scalar_shapes_work() {
        let e = NDArray::zeros(&[0, 3]).unwrap();
        assert_eq!(e.size(), 0);
        assert!(e.to_vec::<f32>().unwrap().is_empty());
        let s = NDArray::full(&[], 5.0).unwrap();
        assert_eq!(s.size(), 1);
        assert_eq!(s.to_string(), "5.0\n<NDArray  float32 @cpu(0)>");
    }

    #[test]
    fn arrays_print_readably_and_summarise_large_ones() {
        let a = NDArray::full(&[2, 3], 2.0).unwrap();
        assert_eq!(a.to_string(), "[[2.0 2.0 2.0]\n [2.0 2.0 2.0]]\n<NDArray 2x3 float32 @cpu(0)>");
        let big = NDArray::zeros_with(&[2000], DType::I8, Context::cpu(0)).unwrap();
        assert_eq!(big.to_string(), "[0 0 0 ... 0 0 0]\n<NDArray 2000 int8 @cpu(0)>");
    }
}
