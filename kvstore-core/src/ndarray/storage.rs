//! The storage layer under `NDArray`: host buffers (64-byte aligned, or page-locked
//! memory of the device backend), device buffers of the backend, copies between any
//! two, and host views of either ([`HostRead`], [`HostWrite`]: the buffer itself, or a
//! staged copy of a device buffer that is written back on finish). `comm` and
//! `optimizer` reach arrays through these types and the accessors of [`Storage`].

use std::ops::{Deref, DerefMut};

use bytemuck::{Pod, Zeroable};
use parking_lot::{MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLockReadGuard, RwLockWriteGuard};

use crate::device::{self, DeviceBuffer, PinnedMemory};
use crate::dtype::Element;
use crate::error::{Error, Result};

/// One 64-byte, 64-byte-aligned block: the unit host buffers are made of, so that
/// every host array starts on a cache line.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Block([u8; 64]);

/// The host memory of an array: ordinary memory in 64-byte blocks, or page-locked
/// memory from the device backend (for buffers that device values are staged through).
pub(crate) struct HostBuf {
    mem: HostMem,
    len: usize,
}

enum HostMem {
    Blocks(Box<[Block]>),
    /// 64-byte aligned (checked when it is made), at least `len` bytes.
    Pinned(Box<dyn PinnedMemory>),
    /// Another owner's memory, aligned to its dtype's size (checked when it is made),
    /// `len` bytes.
    Foreign(Box<dyn ForeignMemory>),
}

/// Host memory that an array uses in place but does not own: a Python object's buffer,
/// a Java direct `ByteBuffer`. The implementation (in a binding crate) keeps the owner
/// alive as long as it lives, and the memory neither moves nor shrinks meanwhile; or,
/// for a binding that keeps wrappers of memory between calls without keeping the
/// memory's owners, every handle through which the array is used keeps the owner alive
/// instead ([`crate::NDArray::kept_alive_by`]), or the caller for the handle's use.
///
/// Arrays over such memory are made by [`crate::NDArray::from_foreign`]; their
/// elements are read and written where they are, by the store's threads too, so the
/// owner's other users must leave them alone while a call uses them.
pub trait ForeignMemory: Send + Sync {
    /// The memory: as many bytes as the array's elements take.
    fn bytes(&self) -> &[u8];

    /// The memory, writable. Called only for an array made writable
    /// ([`crate::NDArray::from_foreign`]'s `writable`); a read-only array is never
    /// written (every write is an error first).
    fn bytes_mut(&mut self) -> &mut [u8];

    /// Whether other wrappers of the same bytes may name this memory, so that
    /// [`crate::NDArray::from_foreign`] looks for a live array over it (the default);
    /// `false` for memory no other wrapper can name (a vector taken over), which saves
    /// the lookup.
    fn shared(&self) -> bool {
        true
    }
}

/// A vector taken over as an array's buffer, with no copy: its elements' alignment
/// must be at least the array's dtype's (all an array read as its dtype needs).
struct VecMemory<U>(Vec<U>);

impl<U: Pod + Send + Sync> ForeignMemory for VecMemory<U> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.0)
    }

    fn shared(&self) -> bool {
        false
    }
}

impl HostBuf {
    /// The rows `ids` of this buffer (each `row_bytes` long; every id in bounds) in a
    /// new buffer that is never zero-filled first: each row is moved once, straight
    /// into memory from the ordinary allocator (which hands a freed buffer of the same
    /// size back, where a fresh one costs a page fault every 4 KiB), on this thread or
    /// over the current rayon pool in pieces of at least `piece_rows` rows. `None`
    /// where a row is not 64, 128, ... or 4096 bytes: the caller copies into a zeroed
    /// buffer then.
    pub(crate) fn gather_rows(&self, ids: &[i64], row_bytes: usize, piece_rows: Option<usize>) -> Option<HostBuf> {
        match row_bytes {
            64 => self.gather::<8>(ids, piece_rows),
            128 => self.gather::<16>(ids, piece_rows),
            256 => self.gather::<32>(ids, piece_rows),
            512 => self.gather::<64>(ids, piece_rows),
            1024 => self.gather::<128>(ids, piece_rows),
            2048 => self.gather::<256>(ids, piece_rows),
            4096 => self.gather::<512>(ids, piece_rows),
            _ => None,
        }
    }

    /// [`HostBuf::gather_rows`] for rows of `N` 8-byte words: the new memory is aligned
    /// for them, so for every dtype, whatever the allocator.
    fn gather<const N: usize>(&self, ids: &[i64], piece_rows: Option<usize>) -> Option<HostBuf>
    where
        [u64; N]: Pod,
    {
        use rayon::prelude::*;
        let rows: &[[u64; N]] = bytemuck::try_cast_slice(self.bytes()).ok()?;
        let row = |&r: &i64| rows[r as usize];
        let out: Vec<[u64; N]> = match piece_rows {
            None => ids.iter().map(row).collect(),
            Some(piece) => {
                let mut out = Vec::new();
                ids.par_iter().with_min_len(piece.max(1)).map(row).collect_into_vec(&mut out);
                out
            }
        };
        if out.is_empty() {
            return Self::zeroed(0).ok();
        }
        Some(HostBuf { len: out.len() * N * 8, mem: HostMem::Foreign(Box::new(VecMemory(out))) })
    }

    /// A zero-filled buffer of `len` bytes; an allocation failure is an error, not an
    /// abort. The memory comes zeroed from the allocator (calloc), so fresh pages are
    /// not written twice before their first use.
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let blocks = bytemuck::allocation::try_zeroed_slice_box::<Block>(len.div_ceil(64)).map_err(|()| {
            Error::ResourceExhausted {
                what: format!("allocating {len} bytes for an array"),
                detail: "the system refused the memory".to_string(),
            }
        })?;
        Ok(HostBuf { mem: HostMem::Blocks(blocks), len })
    }

    /// A zero-filled buffer of `len` bytes in the backend's page-locked memory, or in
    /// ordinary memory when there is no backend or it has none to give.
    /// `mem`, as the buffer of an array of `len` bytes whose elements are `align` bytes
    /// each; an error unless `mem` has exactly `len` bytes, aligned for them. An empty
    /// array shares nothing: it gets an ordinary empty buffer (an owner's empty memory
    /// may sit at any address, where no slice of its dtype could start).
    pub(crate) fn foreign(mem: Box<dyn ForeignMemory>, len: usize, align: usize) -> Result<Self> {
        let bytes = mem.bytes();
        if bytes.len() != len {
            return Err(Error::invalid_argument(format!(
                "foreign memory of {} bytes for an array of {len} bytes",
                bytes.len()
            )));
        }
        if len == 0 {
            return Self::zeroed(0);
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(align) {
            return Err(Error::invalid_argument(format!(
                "foreign memory at {:p} is not aligned for elements of {align} bytes",
                bytes.as_ptr()
            )));
        }
        Ok(HostBuf { mem: HostMem::Foreign(mem), len })
    }

    pub(crate) fn pinned(len: usize) -> Result<Self> {
        if len > 0
            && let Some(backend) = device::backend()
            && let Some(mem) = backend.alloc_pinned(len)?
        {
            let fits = mem.bytes().len() >= len && (mem.bytes().as_ptr() as usize).is_multiple_of(64);
            if fits {
                return Ok(HostBuf { mem: HostMem::Pinned(mem), len });
            }
        }
        Self::zeroed(len)
    }

    fn all_bytes(&self) -> &[u8] {
        match &self.mem {
            HostMem::Blocks(b) => bytemuck::cast_slice::<Block, u8>(b),
            HostMem::Pinned(p) => p.bytes(),
            // An empty array's memory may sit anywhere: none of it is read.
            HostMem::Foreign(_) if self.len == 0 => &[],
            HostMem::Foreign(f) => f.bytes(),
        }
    }

    fn all_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            HostMem::Blocks(b) => bytemuck::cast_slice_mut::<Block, u8>(b),
            HostMem::Pinned(p) => p.bytes_mut(),
            HostMem::Foreign(_) if self.len == 0 => &mut [],
            HostMem::Foreign(f) => f.bytes_mut(),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.all_bytes()[..self.len]
    }

    /// The addresses of the bytes (`start..end`), `None` when there are none. They do
    /// not change while the buffer lives (foreign memory neither moves nor shrinks).
    pub(crate) fn span(&self) -> Option<(usize, usize)> {
        let start = self.bytes().as_ptr() as usize;
        (self.len > 0).then_some((start, start + self.len))
    }

    /// Whether the memory is another owner's (so another array may be over the same
    /// bytes: a binding may wrap one buffer, or overlapping views of it, several times).
    pub(crate) fn is_foreign(&self) -> bool {
        matches!(self.mem, HostMem::Foreign(_))
    }

    /// The foreign memory object of the buffer, if it is over one.
    pub(crate) fn into_foreign(self) -> Option<Box<dyn ForeignMemory>> {
        match self.mem {
            HostMem::Foreign(f) => Some(f),
            _ => None,
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.all_bytes_mut()[..len]
    }

    // Blocks and pinned memory start on a 64-byte boundary, and foreign memory is
    // aligned for its array's dtype (the only `T` its array is read as), so the casts
    // cannot fail.
    pub(crate) fn typed<T: Element>(&self) -> &[T] {
        bytemuck::cast_slice::<u8, T>(&self.all_bytes()[..self.len - self.len % std::mem::size_of::<T>()])
    }

    pub(crate) fn typed_mut<T: Element>(&mut self) -> &mut [T] {
        let len = self.len - self.len % std::mem::size_of::<T>();
        bytemuck::cast_slice_mut::<u8, T>(&mut self.all_bytes_mut()[..len])
    }
}

/// Where an array's elements live: host memory, or a device buffer of the registered
/// backend.
pub(crate) enum Storage {
    Host(HostBuf),
    Device(Box<dyn DeviceBuffer>),
}

impl Storage {
    /// The device buffer, for a device array.
    pub(crate) fn device(&self) -> Option<&dyn DeviceBuffer> {
        match self {
            Storage::Device(d) => Some(&**d),
            Storage::Host(_) => None,
        }
    }

    /// The device buffer, for a device array, to write.
    pub(crate) fn device_mut(&mut self) -> Option<&mut dyn DeviceBuffer> {
        match self {
            Storage::Device(d) => Some(&mut **d),
            Storage::Host(_) => None,
        }
    }

    /// The host buffer, for a host array.
    pub(crate) fn host(&self) -> Option<&HostBuf> {
        match self {
            Storage::Host(h) => Some(h),
            Storage::Device(_) => None,
        }
    }

    /// The host buffer, for a host array, to write.
    pub(crate) fn host_mut(&mut self) -> Option<&mut HostBuf> {
        match self {
            Storage::Host(h) => Some(h),
            Storage::Device(_) => None,
        }
    }
}

/// Copies `src` into `dst` (same length) whatever each side is: a host copy, an upload,
/// a download, or a device-to-device copy through the backend.
pub(crate) fn copy_storage(src: &Storage, dst: &mut Storage) -> Result<()> {
    match (src, dst) {
        (Storage::Host(s), Storage::Host(d)) => {
            d.bytes_mut().copy_from_slice(s.bytes());
            Ok(())
        }
        (Storage::Host(s), Storage::Device(d)) => d.write_from_host(s.bytes()),
        (Storage::Device(s), Storage::Host(d)) => s.read_to_host(d.bytes_mut()),
        (Storage::Device(s), Storage::Device(d)) => {
            let backend = device::backend().ok_or_else(|| Error::Internal("device array without a backend".into()))?;
            backend.copy(&**s, &mut **d)
        }
    }
}

/// Read access to an array's elements as host memory: the buffer itself for a host
/// array, a staged copy (downloaded under the read lock) for a device array.
pub(crate) enum HostRead<'a> {
    Host(MappedRwLockReadGuard<'a, HostBuf>),
    /// The read lock, held while the staged copy is in use, and the copy.
    Staged {
        _lock: RwLockReadGuard<'a, Storage>,
        buf: HostBuf,
    },
}

impl Deref for HostRead<'_> {
    type Target = HostBuf;
    fn deref(&self) -> &HostBuf {
        match self {
            HostRead::Host(g) => g,
            HostRead::Staged { buf, .. } => buf,
        }
    }
}

/// Write access to an array's elements as host memory. For a device array it is a
/// staged copy, written back to the device when the guard drops (under the write lock);
/// a failed write-back marks the array faulty (see `Inner::fault`).
pub(crate) enum HostWrite<'a> {
    Host(MappedRwLockWriteGuard<'a, HostBuf>),
    Staged { lock: RwLockWriteGuard<'a, Storage>, buf: HostBuf, array: &'a super::NDArray, done: bool },
}

impl HostWrite<'_> {
    /// Writes a staged copy back to the device now, so that a failure is this call's
    /// error (it also marks the array faulty); does nothing for a host array.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.write_back()
    }

    fn write_back(&mut self) -> Result<()> {
        if let HostWrite::Staged { lock, buf, array, done } = self
            && !*done
        {
            *done = true;
            if let Storage::Device(d) = &mut **lock
                && let Err(e) = d.write_from_host(buf.bytes())
            {
                array.mark_faulty(format!("writing the array back to its device failed: {e}"));
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Deref for HostWrite<'_> {
    type Target = HostBuf;
    fn deref(&self) -> &HostBuf {
        match self {
            HostWrite::Host(g) => g,
            HostWrite::Staged { buf, .. } => buf,
        }
    }
}

impl DerefMut for HostWrite<'_> {
    fn deref_mut(&mut self) -> &mut HostBuf {
        match self {
            HostWrite::Host(g) => g,
            HostWrite::Staged { buf, .. } => buf,
        }
    }
}

impl Drop for HostWrite<'_> {
    /// A guard dropped without [`HostWrite::finish`] writes back here; a failure can
    /// only be recorded (the array turns faulty).
    fn drop(&mut self) {
        let _ = self.write_back();
    }
}
