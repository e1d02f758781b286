//! Java direct `ByteBuffer`s as store arrays, in place (`NDArray.wrap`): the array's
//! elements are the buffer's bytes from its position to its limit, read and written
//! where they are ([`NDArray::from_foreign`]), with no copy at the boundary.
//!
//! The Java side (`NDArray.wrap`) refuses a heap buffer and, for dtypes wider than a
//! byte, a buffer whose byte order is not the platform's, and passes the position, the
//! remaining bytes and whether the buffer is writable; this module checks the rest
//! against the buffer's address and capacity, so that no argument can make the store
//! touch memory outside the buffer.

use jni::Env;
use jni::objects::JByteBuffer;
use kvstore::{DType, Error, HostMemory, NDArray};

use crate::error::JResult;

/// Where the array's bytes lie in a buffer at `address` of `capacity` bytes: from
/// `position`, `remaining` bytes, which must be exactly the bytes of `shape` in
/// `dtype`, aligned for it (unless there are none). Returns the offset from `address` and the length.
///
/// # Errors
/// [`Error::InvalidArgument`] for a span outside the buffer (a negative position or
/// length, or one past the capacity: a buffer changed by another thread during the
/// call), a shape whose size overflows, a length that is not the shape's bytes, or a
/// start not aligned for `dtype`.
fn span(
    shape: &[usize],
    dtype: DType,
    address: usize,
    capacity: usize,
    position: i32,
    remaining: i32,
) -> Result<(usize, usize), Error> {
    let (Ok(offset), Ok(len)) = (usize::try_from(position), usize::try_from(remaining)) else {
        return Err(Error::invalid_argument(format!(
            "NDArray.wrap: position {position} with {remaining} bytes remaining: neither may be negative \
             (was the buffer changed by another thread?)"
        )));
    };
    if offset.checked_add(len).is_none_or(|end| end > capacity) {
        return Err(Error::invalid_argument(format!(
            "NDArray.wrap: position {offset} with {len} bytes remaining does not fit a buffer of {capacity} bytes \
             (was the buffer changed by another thread?)"
        )));
    }
    let bytes = shape.iter().try_fold(dtype.size(), |n, &d| n.checked_mul(d)).ok_or_else(|| {
        Error::invalid_argument(format!("NDArray.wrap: shape {shape:?} has more elements than memory can hold"))
    })?;
    if len != bytes {
        return Err(Error::invalid_argument(format!(
            "NDArray.wrap: the buffer has {len} bytes remaining (position {offset}, limit {}), but shape {shape:?} \
             of {dtype} takes {bytes}: set the buffer's position and limit around exactly the array's bytes",
            offset + len
        )));
    }
    // An empty array's memory is never read: it may sit anywhere.
    let start = address.wrapping_add(offset);
    if len > 0 && !start.is_multiple_of(dtype.size()) {
        return Err(Error::invalid_argument(format!(
            "NDArray.wrap: the buffer's bytes from position {offset} (address {start:#x}) are not aligned for {dtype} \
             elements of {} bytes: start at an aligned position, e.g. with buffer.alignedSlice({})",
            dtype.size(),
            dtype.size()
        )));
    }
    Ok((offset, len))
}

/// An array of `shape` and `dtype` over the bytes of the direct buffer `buffer` from
/// `position`, `remaining` of them, holding a global reference to the buffer; read-only
/// unless `writable`, which must be false for a read-only buffer.
///
/// # Errors
/// [`Error::InvalidArgument`] for a buffer that is not direct, and for a span outside
/// the buffer (changed by another thread during the call), a shape whose size overflows,
/// a length that is not the shape's bytes, or a start not aligned for `dtype`.
pub fn wrap(
    env: &Env<'_>,
    buffer: &JByteBuffer<'_>,
    position: i32,
    remaining: i32,
    writable: bool,
    shape: &[usize],
    dtype: DType,
) -> JResult<NDArray> {
    let not_direct = |_| {
        Error::invalid_argument(
            "NDArray.wrap: the buffer is not a direct ByteBuffer (a heap buffer has no fixed address): \
             allocate it with ByteBuffer.allocateDirect",
        )
    };
    let address = env.get_direct_buffer_address(buffer).map_err(not_direct)?;
    let capacity = env.get_direct_buffer_capacity(buffer).map_err(not_direct)?;
    let (offset, len) = span(shape, dtype, address as usize, capacity, position, remaining)?;
    // In bounds: `offset + len` is at most the capacity.
    let ptr = address.wrapping_add(offset);
    let owner = env.new_global_ref(buffer)?;
    // SAFETY: `ptr` points to `len` bytes of the memory of `buffer`, a direct buffer
    // whose global reference the array keeps (a slice or duplicate holds the buffer it
    // was made from, so the whole allocation stays reachable through it): the JVM never
    // moves a direct buffer's memory, and frees memory it allocated (`allocateDirect`, a
    // mapped file) only once no buffer over it is reachable. Memory an owner frees
    // explicitly while the buffer is still reachable (an `Arena` closed under a
    // `MemorySegment.asByteBuffer()`, `Unsafe.invokeCleaner`, another library's
    // `NewDirectByteBuffer` over memory it frees) must outlive the array, and Java code
    // must not touch the bytes while a call uses them: `NDArray.wrap` documents both as
    // the caller's obligations, as for numpy arrays. `span` checked the alignment, and
    // the Java side passes `writable` false for a read-only buffer.
    Ok(unsafe { HostMemory::wrap(shape, dtype, ptr, len, writable, Some(Box::new(owner))) }?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvstore::ErrorKind;

    fn message(r: Result<(usize, usize), Error>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        e.to_string()
    }

    #[test]
    fn the_span_is_the_remaining_bytes_when_they_are_exactly_the_shapes() {
        assert_eq!(span(&[2, 3], DType::F32, 0x1000, 64, 8, 24).unwrap(), (8, 24));
        assert_eq!(span(&[], DType::F64, 0x1000, 8, 0, 8).unwrap(), (0, 8));
        assert_eq!(span(&[0, 4], DType::F32, 0x1000, 16, 16, 0).unwrap(), (16, 0), "empty, at the end");
        // One-byte elements are aligned anywhere.
        assert_eq!(span(&[3], DType::U8, 0x1001, 8, 3, 3).unwrap(), (3, 3));
    }

    #[test]
    fn a_length_other_than_the_shapes_bytes_is_refused_with_both_numbers() {
        let m = message(span(&[4], DType::F32, 0x1000, 64, 0, 12));
        assert!(m.contains("12 bytes remaining") && m.contains("takes 16"), "{m}");
        let m = message(span(&[usize::MAX, 2], DType::F32, 0x1000, 64, 0, 8));
        assert!(m.contains("more elements than memory can hold"), "{m}");
    }

    #[test]
    fn a_start_not_aligned_for_the_dtype_is_refused() {
        let m = message(span(&[2], DType::F32, 0x1000, 64, 2, 8));
        assert!(m.contains("not aligned for float32"), "{m}");
        assert!(span(&[2], DType::F16, 0x1000, 64, 2, 4).is_ok());
        message(span(&[1], DType::I64, 0x1004, 64, 0, 8));
        assert!(span(&[0], DType::I64, 0x1004, 64, 1, 0).is_ok(), "an empty array has nothing to align");
    }

    #[test]
    fn a_span_outside_the_buffer_is_refused_before_anything_is_read() {
        message(span(&[4], DType::U8, 0x1000, 8, 6, 4));
        message(span(&[4], DType::U8, 0x1000, 8, -1, 4));
        message(span(&[0], DType::U8, 0x1000, 8, 0, -1));
        message(span(&[1], DType::U8, 0x1000, 8, i32::MAX, 1));
    }
}
