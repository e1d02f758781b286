//! Natives of `io.github.kvstore.NDArray`: thin shims over [`kvstore::NDArray`].

use jni::objects::{
    JByteBuffer, JClass, JDoubleArray, JFloatArray, JIntArray, JLongArray, JPrimitiveArray, JString, TypeArray,
};
use jni::sys::{jboolean, jdouble, jint, jlong};
use jni::{Env, EnvUnowned};
use kvstore::{DType, Element, Error, NDArray, Operand};

use crate::convert::{context, device_code, dtype, dtype_code, shape};
use crate::error::{JResult, ThrowKvStore};
use crate::handles::ARRAYS;

/// A new array of `shape` filled with `fill`.
fn new_array(shape: &[usize], dtype: DType, ctx: kvstore::Context, fill: f64) -> kvstore::Result<i64> {
    Ok(ARRAYS.insert(NDArray::full_with(shape, fill, dtype, ctx)?))
}

/// An array holding a Java primitive array's elements: copied once, straight into the
/// array, when the dtype is the Java element type's; converted otherwise.
///
/// The data length is checked against the shape before anything is allocated (a
/// `float[1]` with a shape of 10 GB is a `SHAPE_MISMATCH`, not a 10 GB allocation);
/// every other error (a device no backend serves, a size too large to allocate) is the
/// store's own.
fn from_java<T: Element + TypeArray>(
    env: &Env<'_>,
    data: &JPrimitiveArray<'_, T>,
    shape: &[usize],
    dtype: DType,
    ctx: kvstore::Context,
) -> JResult<i64> {
    let len = data.len(env)?;
    check_len(shape, len)?;
    if dtype == T::DTYPE {
        let a = NDArray::zeros_with(shape, dtype, ctx)?;
        a.with_data_mut(|buf: &mut [T]| data.get_region(env, 0, buf))??;
        return Ok(ARRAYS.insert(a));
    }
    let mut buf = vec![T::default(); len];
    data.get_region(env, 0, &mut buf)?;
    let a = NDArray::from_slice_in(shape, &buf, ctx)?;
    Ok(ARRAYS.insert(a.as_type(dtype)?))
}

/// Checks that `len` elements fill `shape`, without allocating.
///
/// # Errors
/// [`Error::InvalidArgument`] if the shape's size overflows; [`Error::ShapeMismatch`] if
/// it is not `len`.
fn check_len(shape: &[usize], len: usize) -> kvstore::Result<()> {
    let size = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| {
        Error::invalid_argument(format!("NDArray.array: shape {shape:?} has more elements than memory can hold"))
    })?;
    if size == len { Ok(()) } else { Err(size_mismatch(shape, len)) }
}

fn size_mismatch(shape: &[usize], len: usize) -> Error {
    Error::ShapeMismatch {
        context: format!("NDArray.array: {len} elements for shape {shape:?}"),
        key: None,
        expected: shape.to_vec(),
        got: vec![len],
    }
}

/// A new Java primitive array with the elements of array `h`: copied once, straight
/// from the array, when the dtype is the Java element type's; converted otherwise.
fn to_java<'l, T: Element + TypeArray>(env: &mut Env<'l>, h: i64) -> JResult<JPrimitiveArray<'l, T>> {
    let a = ARRAYS.get(h)?;
    if a.size() > i32::MAX as usize {
        return Err(
            Error::invalid_argument(format!("an array of {} elements does not fit a Java array", a.size())).into()
        );
    }
    let out = JPrimitiveArray::<T>::new(env, a.size())?;
    if a.dtype() == T::DTYPE {
        a.with_data(|s: &[T]| out.set_region(env, 0, s))??;
    } else {
        out.set_region(env, 0, &a.to_vec::<T>()?)?;
    }
    Ok(out)
}

fn operand_op(op: jint) -> JResult<fn(&NDArray, Operand<'_>) -> kvstore::Result<NDArray>> {
    Ok(match op {
        0 => |a, b| a.add(b),
        1 => |a, b| a.sub(b),
        2 => |a, b| a.mul(b),
        3 => |a, b| a.div(b),
        _ => return Err(Error::invalid_argument(format!("unknown operation code {op}")).into()),
    })
}

fn assign_op(op: jint) -> JResult<fn(&NDArray, Operand<'_>) -> kvstore::Result<()>> {
    Ok(match op {
        0 => |a, b| a.add_assign(b),
        1 => |a, b| a.sub_assign(b),
        2 => |a, b| a.mul_assign(b),
        3 => |a, b| a.div_assign(b),
        _ => return Err(Error::invalid_argument(format!("unknown operation code {op}")).into()),
    })
}

/// `{dtype, devType, devId, ndim, dims...}`.
fn info(h: i64) -> kvstore::Result<Vec<i64>> {
    let a = ARRAYS.get(h)?;
    let ctx = a.context();
    let mut v = vec![dtype_code(a.dtype()), device_code(ctx), i64::from(ctx.device_id()), a.shape().len() as i64];
    v.extend(a.shape().iter().map(|&d| d as i64));
    Ok(v)
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nNew<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    dims: JLongArray<'l>,
    dt: jint,
    dev_type: jint,
    dev_id: jint,
    fill: jdouble,
) -> jlong {
    env.with_env(|env| -> JResult<jlong> {
        Ok(new_array(&shape(env, &dims)?, dtype(dt)?, context(dev_type, dev_id)?, fill)?)
    })
    .resolve::<ThrowKvStore>()
}

macro_rules! from_java_native {
    ($name:ident, $jarray:ty) => {
        #[unsafe(no_mangle)]
        pub extern "system" fn $name<'l>(
            mut env: EnvUnowned<'l>,
            _c: JClass<'l>,
            data: $jarray,
            dims: JLongArray<'l>,
            dt: jint,
            dev_type: jint,
            dev_id: jint,
        ) -> jlong {
            env.with_env(|env| -> JResult<jlong> {
                from_java(env, &data, &shape(env, &dims)?, dtype(dt)?, context(dev_type, dev_id)?)
            })
            .resolve::<ThrowKvStore>()
        }
    };
}

from_java_native!(Java_io_github_kvstore_NDArray_nFromFloats, JFloatArray<'l>);
from_java_native!(Java_io_github_kvstore_NDArray_nFromDoubles, JDoubleArray<'l>);
from_java_native!(Java_io_github_kvstore_NDArray_nFromInts, JIntArray<'l>);
from_java_native!(Java_io_github_kvstore_NDArray_nFromLongs, JLongArray<'l>);

/// An array over a direct buffer's bytes, in place (see [`crate::buffer`]).
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nWrap<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    buffer: JByteBuffer<'l>,
    position: jint,
    remaining: jint,
    writable: jboolean,
    dims: JLongArray<'l>,
    dt: jint,
) -> jlong {
    env.with_env(|env| -> JResult<jlong> {
        let a = crate::buffer::wrap(env, &buffer, position, remaining, writable, &shape(env, &dims)?, dtype(dt)?)?;
        Ok(ARRAYS.insert(a))
    })
    .resolve::<ThrowKvStore>()
}

macro_rules! to_java_native {
    ($name:ident, $jarray:ident, $t:ty) => {
        #[unsafe(no_mangle)]
        pub extern "system" fn $name<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) -> $jarray<'l> {
            env.with_env(|env| -> JResult<$jarray<'l>> { to_java::<$t>(env, h) }).resolve::<ThrowKvStore>()
        }
    };
}

to_java_native!(Java_io_github_kvstore_NDArray_nToFloats, JFloatArray, f32);
to_java_native!(Java_io_github_kvstore_NDArray_nToDoubles, JDoubleArray, f64);
to_java_native!(Java_io_github_kvstore_NDArray_nToInts, JIntArray, i32);
to_java_native!(Java_io_github_kvstore_NDArray_nToLongs, JLongArray, i64);

/// Copies a `float[]` into the existing array `h` (converting for other dtypes): one
/// copy, no allocation for a float32 array.
fn copy_from_floats(env: &Env<'_>, h: i64, data: &JFloatArray<'_>) -> JResult<()> {
    let a = ARRAYS.get(h)?;
    let len = data.len(env)?;
    if len != a.size() {
        return Err(size_mismatch(a.shape(), len).into());
    }
    if a.dtype() == DType::F32 {
        a.with_data_mut(|buf: &mut [f32]| data.get_region(env, 0, buf))??;
    } else {
        let mut buf = vec![0f32; len];
        data.get_region(env, 0, &mut buf)?;
        a.copy_from(&NDArray::from_slice_in(a.shape(), &buf, a.context())?)?;
    }
    Ok(())
}

/// Copies array `h` into an existing `float[]` of its size: one copy for float32.
fn copy_to_floats(env: &Env<'_>, h: i64, dst: &JFloatArray<'_>) -> JResult<()> {
    let a = ARRAYS.get(h)?;
    let len = dst.len(env)?;
    if len != a.size() {
        return Err(Error::ShapeMismatch {
            context: format!("NDArray.toFloatArray: a float[{len}] for {} elements", a.size()),
            key: None,
            expected: vec![a.size()],
            got: vec![len],
        }
        .into());
    }
    if a.dtype() == DType::F32 {
        a.with_data(|s: &[f32]| dst.set_region(env, 0, s))??;
    } else {
        dst.set_region(env, 0, &a.to_vec::<f32>()?)?;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nCopyFromFloats<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    data: JFloatArray<'l>,
) {
    env.with_env(|env| copy_from_floats(env, h, &data)).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nCopyToFloats<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    dst: JFloatArray<'l>,
) {
    env.with_env(|env| copy_to_floats(env, h, &dst)).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nInfo<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JLongArray<'l> {
    env.with_env(|env| -> JResult<JLongArray<'l>> {
        let v = info(h)?;
        let out = JLongArray::new(env, v.len())?;
        out.set_region(env, 0, &v)?;
        Ok(out)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nBinary<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    op: jint,
    other: jlong,
) -> jlong {
    env.with_env(|_| -> JResult<jlong> {
        let (a, b) = (ARRAYS.get(h)?, ARRAYS.get(other)?);
        Ok(ARRAYS.insert(operand_op(op)?(&a, Operand::Array(&b))?))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nBinaryScalar<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    op: jint,
    value: jdouble,
) -> jlong {
    env.with_env(|_| -> JResult<jlong> {
        let a = ARRAYS.get(h)?;
        Ok(ARRAYS.insert(operand_op(op)?(&a, Operand::Scalar(value))?))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nAssign<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    op: jint,
    other: jlong,
) {
    env.with_env(|_| -> JResult<()> {
        let (a, b) = (ARRAYS.get(h)?, ARRAYS.get(other)?);
        Ok(assign_op(op)?(&a, Operand::Array(&b))?)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nAssignScalar<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    op: jint,
    value: jdouble,
) {
    env.with_env(|_| -> JResult<()> { Ok(assign_op(op)?(&ARRAYS.get(h)?, Operand::Scalar(value))?) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nCopyTo<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    dev_type: jint,
    dev_id: jint,
) -> jlong {
    env.with_env(|_| -> JResult<jlong> { Ok(ARRAYS.insert(ARRAYS.get(h)?.copy_to(context(dev_type, dev_id)?)?)) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nAsType<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    dt: jint,
) -> jlong {
    env.with_env(|_| -> JResult<jlong> { Ok(ARRAYS.insert(ARRAYS.get(h)?.as_type(dtype(dt)?)?)) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nCopyFrom<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    src: jlong,
) {
    env.with_env(|_| -> JResult<()> { Ok(ARRAYS.get(h)?.copy_from(&ARRAYS.get(src)?)?) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nSameStorage<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    a: jlong,
    b: jlong,
) -> jboolean {
    env.with_env(|_| -> JResult<jboolean> { Ok(ARRAYS.get(a)?.shares_memory(&ARRAYS.get(b)?)) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nToString<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JString<'l> {
    env.with_env(|env| -> JResult<JString<'l>> { Ok(env.new_string(ARRAYS.get(h)?.to_string())?) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_NDArray_nFree<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) {
    env.with_env(|_| -> JResult<()> {
        ARRAYS.remove(h);
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvstore::{Context, ErrorKind};

    #[test]
    fn info_describes_dtype_context_and_shape() {
        let h = new_array(&[2, 3], DType::I64, Context::cpu(2), 7.0).unwrap();
        assert_eq!(info(h).unwrap(), vec![5, 1, 2, 2, 2, 3]);
        assert!(ARRAYS.remove(h));
        assert_eq!(info(h).unwrap_err().kind(), ErrorKind::Disposed);
    }

    #[test]
    fn data_lengths_are_checked_against_the_shape_before_any_allocation() {
        assert!(check_len(&[2, 3], 6).is_ok());
        assert!(check_len(&[], 1).is_ok());
        assert!(check_len(&[0, 5], 0).is_ok());
        assert_eq!(check_len(&[2, 3], 5).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        // 2^63 elements: a size that fits usize but no memory; checked, not allocated.
        assert_eq!(check_len(&[1 << 31, 1 << 31, 2], 1).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        assert_eq!(check_len(&[usize::MAX, 2], 1).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn unknown_operation_codes_are_invalid_arguments() {
        assert!(operand_op(4).is_err());
        assert!(assign_op(-1).is_err());
        let a = NDArray::full(&[2], 3.0).unwrap();
        assert_eq!(
            operand_op(2).ok().unwrap()(&a, Operand::Scalar(2.0)).unwrap().to_vec::<f32>().unwrap(),
            vec![6.0; 2]
        );
    }
}
