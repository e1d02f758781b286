//! Java arguments to Rust values: keys, handles, shapes, dtype and context codes (see
//! NATIVES.md for the codes).

use jni::Env;
use jni::objects::{JLongArray, JObjectArray, JString};
use kvstore::{Context, DType, Error, Key, NDArray};

use crate::error::JResult;
use crate::handles::ARRAYS;

/// A Java string as a Rust one. `what` names it in the error ("key", "path", ...).
///
/// Java strings are UTF-16 and may hold unpaired surrogates, which no Rust string can;
/// a lossy conversion would turn `"\uD800"` and `"\uDC00"` into the same key. They are
/// rejected instead.
///
/// # Errors
/// [`Error::InvalidArgument`] for a string that is not valid UTF-16; a JNI error for a
/// null one.
pub fn string(env: &Env<'_>, s: &JString<'_>, what: &str) -> JResult<String> {
    let chars = s.mutf8_chars(env)?;
    Ok(from_modified_utf8(chars.to_bytes(), what)?)
}

/// Decodes the modified UTF-8 that JNI hands out, strictly.
///
/// Modified UTF-8 differs from UTF-8 in two ways only: U+0000 is `C0 80`, and every
/// UTF-16 code unit above U+FFFF is encoded on its own (a surrogate pair is two 3-byte
/// sequences). Standard UTF-8 validation rejects both, so a string that passes it is
/// the same in both encodings (the common case, with no copy but the final one);
/// anything else is decoded to UTF-16 code units and checked as UTF-16.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unpaired surrogate (or bytes that are not modified
/// UTF-8, which a JVM does not produce).
pub fn from_modified_utf8(bytes: &[u8], what: &str) -> Result<String, Error> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return Ok(s.to_owned());
    }
    let bad = |detail: String| Error::invalid_argument(format!("{what} is not valid UTF-16: {detail}"));
    let mut units = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let cont = |k: usize| bytes.get(i + k).filter(|&&c| c & 0xC0 == 0x80).map(|&c| u16::from(c & 0x3F));
        let (unit, len) = match b {
            0x00..=0x7F => (Some(u16::from(b)), 1),
            0xC0..=0xDF => (cont(1).map(|c1| (u16::from(b & 0x1F) << 6) | c1), 2),
            0xE0..=0xEF => (cont(1).zip(cont(2)).map(|(c1, c2)| (u16::from(b & 0x0F) << 12) | (c1 << 6) | c2), 3),
            _ => (None, 1),
        };
        units.push(unit.ok_or_else(|| bad(format!("malformed modified UTF-8 at byte {i}")))?);
        i += len;
    }
    let mut out = String::with_capacity(units.len());
    let mut at = 0;
    for c in char::decode_utf16(units.iter().copied()) {
        let c = c.map_err(|e| bad(format!("an unpaired surrogate \\u{:04X} at index {at}", e.unpaired_surrogate())))?;
        out.push(c);
        at += c.len_utf16();
    }
    Ok(out)
}

/// A `String[]` of keys; `what` names one element in errors ("a key").
///
/// # Errors
/// As [`string`], for any element.
pub fn keys(env: &mut Env<'_>, array: &JObjectArray<'_, JString<'_>>, what: &str) -> JResult<Vec<Key>> {
    let n = array.len(env)?;
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let s = array.get_element(env, i)?;
        keys.push(Key::from(string(env, &s, what)?));
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

/// The arrays of a `long[]` of handles, or the reason one is no array: a closed one
/// (which Java passes as 0) or a stale one. A store call takes either as its arrays
/// (`Values::from`): refused, the call fails as the store's own refusals do, under
/// `dist_sync` on every worker, in call order.
pub fn arrays(env: &Env<'_>, handles: &JLongArray<'_>) -> JResult<Result<Vec<NDArray>, Error>> {
    Ok(ARRAYS.get_all(&longs(env, handles)?))
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
        2 => kvstore::gpu(id),
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
    use kvstore::ErrorKind;

    #[test]
    fn codes_round_trip_and_bad_codes_are_invalid_arguments() {
        for d in DType::ALL {
            assert_eq!(dtype(dtype_code(d) as i32).unwrap(), d);
        }
        assert_eq!(dtype(8).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(dtype(-1).unwrap_err().kind(), ErrorKind::InvalidArgument);
        match context(2, 0) {
            Ok(ctx) => assert_eq!(ctx, Context::gpu(0)),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
                assert!(e.to_string().contains("gpu(0)"), "{e}");
            }
        }
        assert_eq!(device_code(context(1, 0).unwrap()), 1);
        assert_eq!(context(1, -1).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(context(7, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(shape_of(&[2, -3]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(shape_of(&[2, 3]).unwrap(), vec![2, 3]);
    }

    #[test]
    fn strings_decode_strictly_from_modified_utf8() {
        assert_eq!(from_modified_utf8(b"w", "a key").unwrap(), "w");
        // U+0000 is C0 80; U+1F600 is a surrogate pair, each half in 3 bytes.
        assert_eq!(from_modified_utf8(&[0x61, 0xC0, 0x80], "a key").unwrap(), "a\0");
        assert_eq!(from_modified_utf8(&[0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80], "a key").unwrap(), "\u{1F600}");
        // Unpaired surrogates (U+D800, U+DC00) are errors, never a shared replacement key.
        let e = from_modified_utf8(&[0x6B, 0xED, 0xA0, 0x80], "a key").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("a key is not valid UTF-16: an unpaired surrogate \\uD800 at index 1"), "{e}");
        assert!(from_modified_utf8(&[0xED, 0xB0, 0x80], "a key").is_err());
        assert!(from_modified_utf8(&[0xED, 0xB8, 0x80, 0xED, 0xA0, 0xBD], "a key").is_err(), "a reversed pair");
        assert!(from_modified_utf8(&[0xFF], "a key").is_err());
        assert!(from_modified_utf8(&[0xE0, 0x80], "a key").is_err(), "a truncated sequence");
    }
}
