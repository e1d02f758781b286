//! Element types (MXNet's `dtype`) and the [`Element`] trait that ties each one to a
//! Rust type, its accumulator, and the casts between types.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::{Error, Result};

/// The element type of an array. The default is [`DType::F32`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DType {
    /// 32-bit float (`float32`).
    #[default]
    F32,
    /// 64-bit float (`float64`).
    F64,
    /// IEEE half precision (`float16`); sums accumulate in f32.
    F16,
    /// bfloat16 (`bfloat16`); sums accumulate in f32.
    BF16,
    /// 32-bit signed integer (`int32`); sums wrap.
    I32,
    /// 64-bit signed integer (`int64`); sums wrap.
    I64,
    /// 8-bit signed integer (`int8`); sums wrap.
    I8,
    /// 8-bit unsigned integer (`uint8`); sums wrap.
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::I8, DType::U8];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// MXNet's (numpy's) name: `"float32"`, `"bfloat16"`, `"uint8"`...
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::I8 => "int8",
            DType::U8 => "uint8",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Parses MXNet's names (`float32`) and Rust's (`f32`), case-insensitively.
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        let dtype = match lower.as_str() {
            "float32" | "f32" | "float" => DType::F32,
            "float64" | "f64" | "double" => DType::F64,
            "float16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int32" | "i32" | "int" => DType::I32,
            "int64" | "i64" | "long" => DType::I64,
            "int8" | "i8" => DType::I8,
            "uint8" | "u8" => DType::U8,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "unknown dtype \"{}\": expected one of float32, float64, float16, \
                     bfloat16, int32, int64, int8, uint8",
                    crate::key::shorten(s)
                )));
            }
        };
        Ok(dtype)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element of one [`DType`]. Implemented for `f32`, `f64`,
/// [`half::f16`], [`half::bf16`], `i32`, `i64`, `i8` and `u8`; sealed.
pub trait Element:
    bytemuck::Pod + Copy + Default + PartialEq + fmt::Debug + Send + Sync + sealed::Sealed + 'static
{
    /// The dtype of this element type.
    const DTYPE: DType;
    /// The type sums are accumulated in: f32 for f16/bf16, the type itself otherwise.
    type Acc: Copy + Default + Send + Sync;
    /// Widens to the accumulator.
    fn to_acc(self) -> Self::Acc;
    /// Adds in the accumulator (wrapping for integers).
    fn acc_add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Rounds the accumulator back, once.
    fn from_acc(acc: Self::Acc) -> Self;
    /// The value as f64 (exact for every float type).
    fn to_f64(self) -> f64;
    /// Rounds an f64 to this type; for integers truncates toward zero and saturates.
    fn from_f64(v: f64) -> Self;
    /// The value as i64 (floats truncate toward zero and saturate).
    fn to_i64(self) -> i64;
    /// Converts an i64, wrapping for narrower integers.
    fn from_i64(v: i64) -> Self;
}

macro_rules! float_element {
    ($t:ty, $dtype:expr, $acc:ty, $to_acc:expr, $from_acc:expr, $to_f64:expr, $from_f64:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;
            type Acc = $acc;
            #[inline(always)]
            fn to_acc(self) -> $acc {
                $to_acc(self)
            }
            #[inline(always)]
            fn acc_add(a: $acc, b: $acc) -> $acc {
                a + b
            }
            #[inline(always)]
            fn from_acc(acc: $acc) -> Self {
                $from_acc(acc)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $to_f64(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from_f64(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                Self::from_f64(v as f64)
            }
        }
    };
}

float_element!(f32, DType::F32, f32, |x| x, |a| a, |x: f32| x as f64, |v| v as f32);
float_element!(f64, DType::F64, f64, |x| x, |a| a, |x| x, |v| v);
float_element!(f16, DType::F16, f32, f16::to_f32, f16::from_f32, f16::to_f64, |v| f16::from_f32(to_f32_odd(v)));
float_element!(bf16, DType::BF16, f32, bf16::to_f32, bf16::from_f32, bf16::to_f64, |v| bf16::from_f32(to_f32_odd(v)));

/// `v` rounded to f32 to odd: toward zero, then the last bit set when that was inexact.
/// f16 and bf16 have at most 11 bits to f32's 24, so rounding this once more to nearest
/// (even) gives `v` rounded to nearest once, as `half`'s conversions from f64 do not:
/// they drop the low 32 bits of `v` first (and f16's uses `v as f32` where F16C is), so
/// a value just above a tie (an f32 sum whose last bits are set) went down.
#[inline(always)]
fn to_f32_odd(v: f64) -> f32 {
    let nearest = v as f32;
    if v.is_nan() || nearest as f64 == v {
        return nearest;
    }
    // Inexact (an overflow to infinity too): the neighbour toward zero, made odd.
    let mut bits = nearest.to_bits();
    if (nearest as f64).abs() > v.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

macro_rules! int_element {
    ($t:ty, $dtype:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;
            type Acc = $t;
            #[inline(always)]
            fn to_acc(self) -> $t {
                self
            }
            #[inline(always)]
            fn acc_add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn from_acc(acc: $t) -> Self {
                acc
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}

int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(i8, DType::I8);
int_element!(u8, DType::U8);

/// Runs `$body` with `$t` bound to the element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $t = half::f16;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::dtype::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::dtype::DType::I8 => {
                type $t = i8;
                $body
            }
            $crate::dtype::DType::U8 => {
                type $t = u8;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// Converts one element between types: integer to integer through i64 (wrapping),
/// anything else through f64 (floats to integers truncate toward zero and saturate,
/// as numpy's `astype` does for in-range values).
#[inline]
pub(crate) fn cast<S: Element, D: Element>(s: S) -> D {
    if S::DTYPE.is_float() || D::DTYPE.is_float() { D::from_f64(s.to_f64()) } else { D::from_i64(s.to_i64()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_parses_from_its_name_and_knows_its_size() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            with_dtype!(d, T => assert_eq!(std::mem::size_of::<T>(), d.size()));
            with_dtype!(d, T => assert_eq!(T::DTYPE, d));
        }
        assert_eq!("FLOAT16".parse::<DType>().unwrap(), DType::F16);
        assert!("int16".parse::<DType>().is_err());
    }

    #[test]
    fn casts_truncate_toward_zero_and_wrap_integers() {
        assert_eq!(cast::<f32, i32>(1.7), 1);
        assert_eq!(cast::<f32, i32>(-1.7), -1);
        assert_eq!(cast::<i32, u8>(300), 44);
        assert_eq!(cast::<f32, f16>(1.7).to_f32(), 1.7001953);
        assert_eq!(cast::<i64, i64>(i64::MAX), i64::MAX);
    }

    /// `v` rounded to nearest, ties to even, among a half type's non-negative finite
    /// values `finite` (ascending, one per bit pattern) and infinity.
    fn reference(v: f64, finite: &[f64]) -> f64 {
        let (a, n) = (v.abs(), finite.len());
        let top_ulp = finite[n - 1] - finite[n - 2];
        if a >= finite[n - 1] + top_ulp / 2.0 {
            return f64::INFINITY.copysign(v);
        }
        let hi = finite.partition_point(|&x| x < a).min(n - 1);
        if finite[hi] == a || hi == 0 {
            return finite[hi].copysign(v);
        }
        let (lo, up) = (finite[hi - 1], finite[hi]);
        let nearer = match (a - lo).partial_cmp(&(up - a)).expect("finite") {
            std::cmp::Ordering::Less => lo,
            std::cmp::Ordering::Greater => up,
            // A tie goes to the even bit pattern.
            std::cmp::Ordering::Equal if (hi - 1) % 2 == 0 => lo,
            std::cmp::Ordering::Equal => up,
        };
        nearer.copysign(v)
    }

    /// Checks every conversion to the half type `T` (bits `b` are the value `value(b)`,
    /// `exp_bits` exponent bits) against [`reference`].
    fn check_half<T: Element<Acc = f32>>(value: fn(u16) -> f64, exp_bits: u32) {
        let infinity = ((1u16 << exp_bits) - 1) << (15 - exp_bits);
        let finite: Vec<f64> = (0..infinity).map(value).collect();
        let top_ulp = finite[finite.len() - 1] - finite[finite.len() - 2];
        // Each value and each tie between neighbours, then the overflow's edge.
        let mut points: Vec<f64> = finite.windows(2).flat_map(|w| [w[0], (w[0] + w[1]) / 2.0]).collect();
        points.extend([finite[finite.len() - 1], finite[finite.len() - 1] + top_ulp / 2.0]);
        let mut checked = 0usize;
        for v in points.iter().flat_map(|&p| [p, -p]) {
            // Just below and above by an f32 unit in the last place, and by an f64 one.
            let f = v as f32;
            let f32_near = [f.to_bits(), f.to_bits().wrapping_add(1), f.to_bits().wrapping_sub(1)].map(f32::from_bits);
            for x in f32_near.into_iter().filter(|x| x.is_finite() && (x.is_sign_negative() == f.is_sign_negative())) {
                let want = reference(x as f64, &finite);
                for (how, got) in
                    [("from_acc", T::from_acc(x)), ("from_f64", T::from_f64(x as f64)), ("cast", cast::<f32, T>(x))]
                {
                    assert_eq!(got.to_f64(), want, "{how}({x:e}) to {}", T::DTYPE);
                    checked += 1;
                }
            }
            let f64_near = [v.to_bits(), v.to_bits().wrapping_add(1), v.to_bits().wrapping_sub(1)].map(f64::from_bits);
            for x in f64_near.into_iter().filter(|x| x.is_finite() && (x.is_sign_negative() == v.is_sign_negative())) {
                let want = reference(x, &finite);
                assert_eq!(T::from_f64(x).to_f64(), want, "from_f64({x:e}) to {}", T::DTYPE);
                assert_eq!(cast::<f64, T>(x).to_f64(), want, "cast({x:e}) to {}", T::DTYPE);
                checked += 2;
            }
        }
        assert!(T::from_f64(f64::NAN).to_f64().is_nan() && T::from_acc(f32::NAN).to_f64().is_nan());
        assert!(checked > 500_000, "{checked}");
    }

    /// Every conversion to f16 and bf16 (from the f32 accumulator, from f64, `cast`)
    /// rounds once to nearest, ties to even, at every point that matters: each value,
    /// each tie between neighbours, just below and above each (by an f32 and by an f64
    /// unit in the last place), subnormals, the largest finite value and the overflow to
    /// infinity, both signs.
    #[test]
    fn conversions_to_half_types_round_once_at_every_tie_subnormal_and_overflow() {
        check_half::<f16>(|b| f16::from_bits(b).to_f64(), 5);
        check_half::<bf16>(|b| bf16::from_bits(b).to_f64(), 8);
        // The f32 sum of three bf16 values just above a tie (1 + 2^-8 + 2^-23) rounds up,
        // as a dist_sync sum of them on three ranks narrows it.
        let sum = [1.0f32, 2f32.powi(-8), 2f32.powi(-23)].iter().fold(0.0f32, |a, &x| a + x);
        assert_eq!(<bf16 as Element>::from_f64(sum as f64).to_f32(), 1.0 + 2f32.powi(-7));
    }

    #[test]
    fn half_types_accumulate_in_f32_and_round_once() {
        // 2048 + 1 + 1 in f16 steps would round to 2048 twice; in f32 it is 2050.
        let acc = [1.0f32, 1.0].iter().fold(f16::from_f32(2048.0).to_acc(), |a, &x| f16::acc_add(a, x));
        assert_eq!(f16::from_acc(acc).to_f32(), 2050.0);
        assert_eq!(i8::acc_add(127, 1), -128);
    }
}
