//! How arrays travel: the element type each dtype is summed as on the wire (f16 and
//! bf16 as f32, rounded once on the way back), and the copies between an array and a
//! buffer of wire elements.

use kvstore_core::{DType, Element, Error, NDArray, Result, bf16, f16};

/// The element type arrays of `dtype` travel as: f16/bf16 as f32 (sums accumulate in
/// f32, as on the host), the others as themselves.
macro_rules! with_wire {
    ($dtype:expr, $w:ident => $body:expr) => {
        match $dtype {
            DType::F32 | DType::F16 | DType::BF16 => {
                type $w = f32;
                $body
            }
            DType::F64 => {
                type $w = f64;
                $body
            }
            DType::I32 => {
                type $w = i32;
                $body
            }
            DType::I64 => {
                type $w = i64;
                $body
            }
            DType::I8 => {
                type $w = i8;
                $body
            }
            DType::U8 => {
                type $w = u8;
                $body
            }
        }
    };
}
pub(crate) use with_wire;

/// An array's elements as `W`, and a way back.
pub(crate) fn read_wire<W: Element>(a: &NDArray) -> Result<Vec<W>> {
    if a.dtype() == W::DTYPE { a.with_data(|s: &[W]| s.to_vec()) } else { a.to_vec::<W>() }
}

/// Writes `len` summed elements (on the wire), which `fill` writes, into `dst` from
/// element `off` on: straight into its memory, or, for f16/bf16, into a buffer first,
/// each value then rounded as `NDArray::as_type` does.
pub(crate) fn store_piece<W: Element>(
    dst: &NDArray,
    off: usize,
    len: usize,
    fill: impl FnOnce(&mut [W]),
) -> Result<()> {
    fn narrow<W: Element, T: Element>(
        dst: &NDArray,
        off: usize,
        len: usize,
        fill: impl FnOnce(&mut [W]),
    ) -> Result<()> {
        let mut part = vec![W::default(); len];
        fill(&mut part);
        dst.with_data_mut(|d: &mut [T]| {
            for (o, x) in d[off..off + len].iter_mut().zip(part) {
                *o = T::from_f64(x.to_f64());
            }
        })
    }
    match dst.dtype() {
        d if d == W::DTYPE => dst.with_data_mut(|d: &mut [W]| fill(&mut d[off..off + len])),
        // f16/bf16 travel as f32: only the summed piece is converted back.
        DType::F16 => narrow::<W, f16>(dst, off, len, fill),
        DType::BF16 => narrow::<W, bf16>(dst, off, len, fill),
        d => Err(Error::Internal(format!("mpi: {d} does not travel as {}", W::DTYPE))),
    }
}

pub(crate) fn write_wire<W: Element>(a: &NDArray, data: &[W]) -> Result<()> {
    if a.dtype() == W::DTYPE {
        a.with_data_mut(|s: &mut [W]| s.copy_from_slice(data))
    } else {
        a.copy_from(&NDArray::from_slice_in(a.shape(), data, a.context())?)
    }
}
