//! The layout of a key's entry, and what it tells of a call's arrays.

use super::data::{Entry, Slot};

#[test]
fn what_a_call_reads_of_an_entry_is_in_its_first_cache_line() {
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!(align_of::<Entry>(), 64);
    assert_eq!(offset_of!(Slot, value), 0);
    // The index, shape, dtype and key, then the lock's word, then the slot's handle, whose
    // first word is what a call reads (the array's address; then what the handle
    // keeps alive, read only when it is cloned or dropped).
    let hot = [
        offset_of!(Entry, index),
        offset_of!(Entry, dims),
        offset_of!(Entry, ndim),
        offset_of!(Entry, dtype),
        offset_of!(Entry, key),
    ];
    assert!(hot.iter().all(|&at| at < offset_of!(Entry, value)));
    let value = offset_of!(Entry, value);
    assert!(value + size_of::<parking_lot::RawRwLock>() + crate::NDArray::HOT_BYTES <= 64);
}

#[test]
fn an_entry_tells_the_arrays_of_its_shape_and_dtype_from_its_first_line_or_its_long_shape() {
    use crate::{DType, Key, NDArray};
    let entry = |shape: &[usize]| {
        let value = NDArray::zeros(shape).expect("a value");
        Entry::new(Key::from("k"), 0, Slot::new(value, 0), super::layout::Owner::NONE)
    };
    let array = |shape: &[usize], dtype| NDArray::zeros_with(shape, dtype, crate::Context::cpu(0)).expect("an array");
    let big = 1 << 32;
    let cases: [(&[usize], &[&[usize]]); 7] = [
        (&[], &[&[1], &[1, 1]]),
        (&[16], &[&[15], &[16, 1], &[1, 16], &[4, 4], &[]]),
        (&[4, 4], &[&[16], &[4], &[4, 4, 1], &[1, 4, 4]]),
        (&[2, 3, 4], &[&[24], &[2, 12], &[2, 3, 4, 1], &[4, 3, 2]]),
        (&[1, 2, 3, 4], &[&[24], &[1, 2, 3], &[2, 3, 4], &[1, 2, 3, 4, 1]]),
        (&[0, big], &[&[0], &[0, 0], &[0, big, 1], &[big, 0]]),
        (&[big, 0, 0, 0], &[&[0, 0, 0, 0], &[big, 0, 0]]),
    ];
    for (shape, others) in cases {
        let e = entry(shape);
        let long = shape.len() > 3 || shape.iter().any(|&n| n >= big);
        assert_eq!(e.ndim == Entry::LONG, long, "{shape:?}");
        assert_eq!(e.like(), (shape, DType::F32));
        assert!(e.fits(&array(shape, DType::F32)), "{shape:?}");
        assert!(!e.fits(&array(shape, DType::F64)), "{shape:?} as f64");
        for other in others {
            assert!(!e.fits(&array(other, DType::F32)), "{shape:?} against {other:?}");
        }
    }
}
