//! Host memory that another runtime owns (a Java direct `ByteBuffer`, a numpy array's
//! buffer) as a store array, read and written in place: the one foreign-memory type
//! of the bindings, with the one contract that makes it sound.

use std::any::Any;

use kvstore_core::{Context, DType, Error, ForeignMemory, NDArray, Result};

/// Bytes at a fixed address that the store reads and writes in place, owned by another
/// runtime. Made only through [`HostMemory::wrap`], whose safety contract is the whole
/// of what makes reading and writing them sound.
pub struct HostMemory {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    /// What keeps the memory allocated, when the wrapper itself is to keep it (a Java
    /// buffer's global reference); `None` when the array's users do (see
    /// [`HostMemory::wrap`]).
    _owner: Option<Box<dyn Any + Send + Sync>>,
}

// SAFETY: `HostMemory::wrap`'s caller guarantees that `ptr` points to `len` initialised
// bytes that stay allocated and unmoved while any store array over them is used, by any
// thread; the bytes are plain data, read and written by the store under its array locks.
unsafe impl Send for HostMemory {}
// SAFETY: as above; `&HostMemory` only reads.
unsafe impl Sync for HostMemory {}

impl ForeignMemory for HostMemory {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is non-null and points to `len` initialised bytes that live while
        // the array is used (`wrap`'s contract), or `len` is 0 and `ptr` is dangling but
        // non-null and aligned (an empty read-only wrap), which a slice of no bytes allows.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if !self.writable {
            // Never reached: core refuses every write to a read-only array first.
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the memory may be written (`wrap`'s contract);
        // `&mut self` is core's exclusive (write-locked) access to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl HostMemory {
    /// A store array of `shape` and `dtype` over the `len` bytes at `ptr`, read-only
    /// unless `writable`; `owner`, if any, is kept for as long as the array lives.
    /// An empty array (`len` 0) shares no memory: it is a new empty array, and `ptr`
    /// is not looked at. Otherwise it is [`NDArray::from_foreign`] of this memory
    /// (which returns the live array already over exactly these bytes, so calls through
    /// any wrapper of one memory are ordered as calls on one array).
    ///
    /// ```
    /// use kvstore::{DType, HostMemory};
    /// let mut data = vec![1.0f32, 2.0];
    /// // SAFETY: `data` outlives `a` and is not touched while `a` is used.
    /// let a = unsafe { HostMemory::wrap(&[2], DType::F32, data.as_mut_ptr().cast(), 8, true, None) }?;
    /// a.add_assign(1.0)?;
    /// drop(a);
    /// assert_eq!(data, [2.0, 3.0]);
    /// # Ok::<(), kvstore::Error>(())
    /// ```
    ///
    /// # Safety
    /// Unless `len` is 0, `ptr` points to `len` initialised bytes, aligned for `dtype`,
    /// that stay allocated and unmoved while the returned array, or any handle to it or
    /// any call given it, is used, from any thread: kept so by `owner`, or by whoever
    /// holds the array's handles and calls (the caller's obligation, e.g. through
    /// [`NDArray::kept_alive_by`]). No code outside the store writes them while a call
    /// uses the array, nor (unless `writable` is false) reads them while a call writes
    /// them. If `writable`, the memory may be written (it is not a read-only mapping).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` is not exactly the bytes of `shape` in
    /// `dtype`, or the shape's size overflows.
    pub unsafe fn wrap(
        shape: &[usize],
        dtype: DType,
        ptr: *mut u8,
        len: usize,
        writable: bool,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<NDArray> {
        if len == 0 {
            // No memory to share: an empty array of the same shape (core reads an empty
            // array's elements through a byte slice that need not be aligned for them).
            let empty = NDArray::zeros_with(shape, dtype, Context::cpu(0))?;
            if empty.size() != 0 {
                return Err(Error::invalid_argument(format!(
                    "no bytes given for shape {shape:?} of {dtype}, which takes {}",
                    empty.size() * dtype.size()
                )));
            }
            if writable {
                return Ok(empty);
            }
            // Read-only as asked (a call that would write it is refused, as for any other
            // read-only memory): no bytes, at an address aligned for every dtype.
            let ptr = std::ptr::NonNull::<u128>::dangling().as_ptr().cast::<u8>();
            let mem = HostMemory { ptr, len: 0, writable, _owner: owner };
            return NDArray::from_foreign(shape, dtype, Box::new(mem), false);
        }
        if ptr.is_null() {
            return Err(Error::invalid_argument("the memory's address is null"));
        }
        let mem = HostMemory { ptr, len, writable, _owner: owner };
        NDArray::from_foreign(shape, dtype, Box::new(mem), writable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_array_reads_and_writes_the_memory_in_place_and_drops_its_owner_with_it() {
        let mut data = vec![1i32, 2, 3];
        let dropped = Arc::new(AtomicBool::new(false));
        // SAFETY: `data` outlives the array, untouched while it is used.
        let a = unsafe {
            HostMemory::wrap(
                &[3],
                DType::I32,
                data.as_mut_ptr().cast(),
                12,
                true,
                Some(Box::new(Flag(dropped.clone()))),
            )
        }
        .unwrap();
        assert_eq!(a.to_vec::<i32>().unwrap(), [1, 2, 3]);
        a.add_assign(10.0).unwrap();
        assert!(!dropped.load(Ordering::SeqCst));
        drop(a);
        assert!(dropped.load(Ordering::SeqCst), "the owner lives as long as the array");
        assert_eq!(data, [11, 12, 13]);
    }

    #[test]
    fn a_read_only_wrap_refuses_writes_and_a_length_other_than_the_shapes_is_refused() {
        let mut data = [1u8, 2];
        // SAFETY: `data` outlives the arrays.
        let a = unsafe { HostMemory::wrap(&[2], DType::U8, data.as_mut_ptr(), 2, false, None) }.unwrap();
        assert_eq!(a.add_assign(1.0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        drop(a);
        assert_eq!(data, [1, 2]);
        // SAFETY: as above (refused before the memory is read).
        let e = unsafe { HostMemory::wrap(&[3], DType::U8, data.as_mut_ptr(), 2, true, None) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }

    #[test]
    fn empty_memory_is_a_new_empty_array_and_no_bytes_for_elements_is_refused() {
        // SAFETY: `len` is 0: `ptr` is not read.
        let a = unsafe { HostMemory::wrap(&[0, 4], DType::F64, std::ptr::null_mut(), 0, true, None) }.unwrap();
        assert_eq!((a.shape(), a.size(), a.is_read_only()), (&[0, 4][..], 0, false));
        // SAFETY: as above.
        let a = unsafe { HostMemory::wrap(&[2, 0], DType::F32, std::ptr::null_mut(), 0, false, None) }.unwrap();
        assert_eq!((a.shape(), a.is_read_only()), (&[2, 0][..], true), "read-only as asked");
        let kv = kvstore_core::KVStore::create("local").unwrap();
        kv.init("e", &NDArray::zeros(&[2, 0]).unwrap()).unwrap();
        assert_eq!(kv.pull("e", &a, 0).unwrap_err().kind(), ErrorKind::InvalidArgument, "a read-only out");
        // SAFETY: as above.
        let e = unsafe { HostMemory::wrap(&[2], DType::F64, std::ptr::null_mut(), 0, true, None) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }

    use kvstore_core::ErrorKind;
}
