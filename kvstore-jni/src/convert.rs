//! Java arguments to Rust values: keys, handles, shapes, dtype and context codes (see
//! NATIVES.md for the codes).

use jni::Env;
use jni::objects::{JLongArray, JObjectArray, JString};
use kvstore_core::{Context, DType, Error, Key, NDArray};

use crate::error::JResult;
use crate::handles::ARRAYS;

/// A `String[]` of keys.
pub fn keys(env: &mut Env<'_>, array: &JObjectArray<'_, JString<'_>>) -> JResult<Vec<Key>> {
    let n = array.len(env)?;
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let s = array.get_element(env, i)?;
        keys.push(Key::from(s.try_to_string(env)?));
        env.delete_local_ref(s);
    }
    Ok(keys)
}

/// A `long[]`, copied.
pub fn longs(env: &Env<'_>, array: &JLongArray<'_>) -> JResult<Vec<i64>> {
    let mut out = vec![0i64; array.len(env)?];
    array.get_region(env, 0, &mut out)?;
    Ok(out)
}

/// The arrays of a `long[]` of handles.
pub fn arrays(env: &Env<'_>, handles: &JLongArray<'_>) -> JResult<Vec<NDArray>> {
    Ok(ARRAYS.get_all(&longs(env, handles)?)?)
}

/// A shape from `long[]` dimensions.
pub fn shape(env: &Env<'_>, dims: &JLongArray<'_>) -> JResult<Vec<usize>> {
    Ok(shape_of(&longs(env, dims)?)?)
}

/// Checks dimensions: none may be negative.
pub fn shape_of(dims: &[i64]) -> Result<Vec<usize>, Error> {
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| Error::invalid_argument(format!("shape {dims:?}: a dimension is negative")))
        })
        .collect()
}

/// The dtype of a code (the index in `DType::ALL`).
pub fn dtype(code: i32) -> Result<DType, Error> {
    usize::try_from(code)
        .ok()
        .and_then(|i| DType::ALL.get(i).copied())
        .ok_or_else(|| Error::invalid_argument(format!("unknown dtype code {code}")))
}

/// The code of a dtype.
pub fn dtype_code(d: DType) -> i64 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as i64
}

/// The context of a device type (1 cpu, 2 gpu) and id.
pub fn context(dev_type: i32, dev_id: i32) -> Result<Context, Error> {
    let id = u32::try_from(dev_id).map_err(|_| Error::invalid_argument(format!("device id {dev_id} is negative")))?;
    match dev_type {
        1 => Ok(Context::cpu(id)),
        2 => Ok(Context::gpu(id)),
        _ => Err(Error::invalid_argument(format!("unknown device type {dev_type}: 1 is cpu, 2 is gpu"))),
    }
}

/// The device type code of a context.
pub fn device_code(ctx: Context) -> i64 {
    if ctx.is_cpu() { 1 } else { 2 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvstore_core::ErrorKind;

    #[test]
    fn codes_round_trip_and_bad_codes_are_invalid_arguments() {
        for d in DType::ALL {
            assert_eq!(dtype(dtype_code(d) as i32).unwrap(), d);
        }
        assert_eq!(dtype(8).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(dtype(-1).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(context(2, 3).unwrap(), Context::gpu(3));
        assert_eq!(device_code(context(1, 0).unwrap()), 1);
        assert_eq!(context(1, -1).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(context(7, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(shape_of(&[2, -3]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(shape_of(&[2, 3]).unwrap(), vec![2, 3]);
    }
}
