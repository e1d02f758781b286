//! Errors across the boundary: every native returns normally or throws
//! `io.github.kvstore.KVStoreException(code, message)`, whose code is the Rust
//! [`kvstore::ErrorKind::code`], with the error's data ([`Detail`]: the key, the
//! shapes, dtypes or lengths expected and got) as fields of the exception. Panics are caught by jni's `with_env` and thrown as
//! `INTERNAL`. A Java exception from an updater rides inside the store's error
//! ([`Error::Raised`], a global reference) and becomes the cause of the `BACKEND`
//! exception that fails the push, on whatever thread the updater ran.

use std::any::Any;
use std::fmt;

use jni::Env;
use jni::errors::ErrorPolicy;
use jni::objects::{Global, JObject, JThrowable, JValue};
use jni::objects::{JLongArray, JString};
use kvstore::{DType, Error, ErrorKind};

use crate::classes::classes;

/// The error of a native call: the store's, or one of jni's own.
#[derive(Debug)]
pub enum JniError {
    /// An error of the store or of an array.
    Store(Error),
    /// A JNI failure (null argument, pending Java exception, ...).
    Jni(jni::errors::Error),
}

impl From<Error> for JniError {
    fn from(e: Error) -> Self {
        JniError::Store(e)
    }
}

impl From<jni::errors::Error> for JniError {
    fn from(e: jni::errors::Error) -> Self {
        JniError::Jni(e)
    }
}

impl fmt::Display for JniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JniError::Store(e) => e.fmt(f),
            JniError::Jni(e) => write!(f, "jni: {e}"),
        }
    }
}

impl std::error::Error for JniError {}

/// `Result` of a native call.
pub type JResult<T> = std::result::Result<T, JniError>;

impl JniError {
    /// The code and message thrown to Java.
    fn code_and_message(&self) -> (&'static str, String) {
        match self {
            JniError::Store(e) => (e.kind().code(), e.to_string()),
            JniError::Jni(jni::errors::Error::NullPtr(what)) => {
                (ErrorKind::InvalidArgument.code(), format!("a null argument was passed ({what})"))
            }
            JniError::Jni(e) => (ErrorKind::Internal.code(), format!("internal error: jni: {e}")),
        }
    }

    /// What user code raised for this error (an updater's Java exception), the
    /// exception's cause.
    fn cause(&self) -> Option<&Global<JThrowable<'static>>> {
        match self {
            JniError::Store(Error::Raised { cause, .. }) => cause.downcast_ref(),
            _ => None,
        }
    }

    /// The data the exception carries besides its code and message.
    fn detail(&self) -> Detail<'_> {
        let JniError::Store(e) = self else { return Detail::default() };
        let key = e.key().map(|k| k.as_str());
        match e {
            Error::ShapeMismatch { expected, got, .. } => {
                Detail { key, shapes: Some((expected, got)), ..Detail::default() }
            }
            Error::DTypeMismatch { expected, got, .. } => {
                Detail { key, dtypes: Some((*expected, *got)), ..Detail::default() }
            }
            Error::LengthMismatch { expected, got, .. } => {
                Detail { key, lengths: Some((*expected, *got)), ..Detail::default() }
            }
            _ => Detail { key, ..Detail::default() },
        }
    }

    /// As a store error, for code that must return `kvstore::Result`.
    pub fn into_store_error(self) -> Error {
        match self {
            JniError::Store(e) => e,
            JniError::Jni(e) => Error::Backend { backend: "jni", message: e.to_string() },
        }
    }
}

/// The data of an error that `KVStoreException` carries as fields besides its code and
/// message (`key()`, `expectedShape()`, ... in Java).
#[derive(Debug, Default, PartialEq)]
pub struct Detail<'e> {
    /// The key concerned.
    pub key: Option<&'e str>,
    /// The shapes expected and got, of a shape mismatch.
    pub shapes: Option<(&'e [usize], &'e [usize])>,
    /// The dtypes expected and got, of a dtype mismatch.
    pub dtypes: Option<(DType, DType)>,
    /// The lengths expected and got, of a length mismatch.
    pub lengths: Option<(usize, usize)>,
}

/// A new `long[]` of `dims`, or null for `None`.
fn long_array<'l>(env: &mut Env<'l>, dims: Option<&[usize]>) -> jni::errors::Result<JObject<'l>> {
    let Some(dims) = dims else { return Ok(JObject::null()) };
    let dims: Vec<i64> = dims.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect();
    let out = JLongArray::new(env, dims.len())?;
    out.set_region(env, 0, &dims)?;
    Ok(out.into())
}

/// The Java code of a dtype (`DType.code()`), or -1 for `None`.
fn dtype_code(d: Option<DType>) -> i32 {
    d.map_or(-1, |d| i32::try_from(crate::convert::dtype_code(d)).unwrap_or(-1))
}

/// A length for Java, or -1 for `None`.
fn length(n: Option<usize>) -> i64 {
    n.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
}

/// Throws `KVStoreException(code, message)` carrying `detail`, with `cause` (an
/// updater's exception) as its cause.
///
/// It makes no class or method lookup (the class and constructor come from
/// [`crate::classes`]) and calls no Java method but the constructor (the strings and
/// `long[]`s of `detail` are made with JNI functions), so it cannot start jni-rs's
/// class-lookup recursion on a thread that is short of stack; if the constructor itself
/// fails there, its `StackOverflowError` is what Java sees.
fn throw(
    env: &mut Env<'_>,
    code: &str,
    message: &str,
    detail: &Detail<'_>,
    cause: Option<&Global<JThrowable<'static>>>,
) -> jni::errors::Result<()> {
    let classes = classes()?;
    let jcode = env.new_string(code)?;
    let jmsg = env.new_string(message)?;
    let null = JObject::null();
    let cause: &JObject<'_> = cause.as_ref().map_or(&null, |c| c.as_ref());
    let jkey: JObject<'_> = match detail.key {
        Some(k) => JString::into(env.new_string(k)?),
        None => JObject::null(),
    };
    let expected_shape = long_array(env, detail.shapes.map(|s| s.0))?;
    let got_shape = long_array(env, detail.shapes.map(|s| s.1))?;
    let args = [
        JValue::Object(&jcode).as_jni(),
        JValue::Object(&jmsg).as_jni(),
        JValue::Object(cause).as_jni(),
        JValue::Object(&jkey).as_jni(),
        JValue::Object(&expected_shape).as_jni(),
        JValue::Object(&got_shape).as_jni(),
        JValue::Int(dtype_code(detail.dtypes.map(|d| d.0))).as_jni(),
        JValue::Int(dtype_code(detail.dtypes.map(|d| d.1))).as_jni(),
        JValue::Long(length(detail.lengths.map(|l| l.0))).as_jni(),
        JValue::Long(length(detail.lengths.map(|l| l.1))).as_jni(),
    ];
    // SAFETY: `kvstore_exception_new` is the `(String, String, Throwable, String, long[],
    // long[], int, int, long, long)` constructor of `kvstore_exception` (see
    // `crate::classes::Classes`), and `args` are of those types: each reference a local
    // of the right class, or null.
    let ex = unsafe { env.new_object_unchecked(&classes.kvstore_exception, classes.kvstore_exception_new, &args)? };
    // SAFETY: `ex` was just built by a constructor of KVStoreException, a Throwable; the
    // raw reference moves from `ex` to the new wrapper, so it is owned once.
    let ex = unsafe { JThrowable::from_raw(env, ex.into_raw()) };
    // `throw` answers Err(JavaException) once the exception is pending: that is success.
    let _ = env.throw(ex);
    Ok(())
}

/// The environment variable that brings back Rust's own report of a panic on stderr.
pub const DEBUG_VAR: &str = "KVSTORE_DEBUG";

/// Whether [`DEBUG_VAR`] asks for panic reports: set to anything but empty or `0`.
fn debug_requested(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// Installs, once per process, a panic hook that prints nothing unless [`DEBUG_VAR`]
/// is set (read at each panic), and then hands the panic to the hook it replaced.
///
/// Why: every panic of a native call is caught by jni's `with_env` and reaches Java as
/// an `INTERNAL` exception carrying the panic's message; Rust's default hook would also
/// print "thread ... panicked at ..." (and a backtrace under `RUST_BACKTRACE`) on the
/// application's stderr for an error the caller already got and may handle. The hook
/// belongs to this library's copy of the Rust runtime only (a cdylib links its own), so
/// no other Rust code in the process is affected. It also does no formatting, so a
/// panic on a thread short of stack cannot overflow it.
pub fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if debug_requested(std::env::var_os(DEBUG_VAR).as_deref()) {
                previous(info);
            }
        }));
    });
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with no message".to_string()
    }
}

/// The error policy of every native: throws `KVStoreException`.
pub struct ThrowKvStore;

impl<T: Default> ErrorPolicy<T, JniError> for ThrowKvStore {
    type Captures<'unowned_env_local: 'native_method, 'native_method> = ();

    fn on_error<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _cap: &mut Self::Captures<'unowned_env_local, 'native_method>,
        err: JniError,
    ) -> jni::errors::Result<T> {
        if env.exception_check() {
            return Ok(T::default());
        }
        let (code, message) = err.code_and_message();
        throw(env, code, &message, &err.detail(), err.cause())?;
        Ok(T::default())
    }

    fn on_panic<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _cap: &mut Self::Captures<'unowned_env_local, 'native_method>,
        payload: Box<dyn Any + Send + 'static>,
    ) -> jni::errors::Result<T> {
        let message = format!("internal error: panic in kvstore-jni: {}", panic_message(payload.as_ref()));
        if !env.exception_check() {
            throw(env, ErrorKind::Internal.code(), &message, &Detail::default(), None)?;
        }
        Ok(T::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_keep_their_code_and_null_arguments_are_invalid() {
        let e = JniError::from(Error::Disposed { what: "KVStore" });
        assert_eq!(e.code_and_message(), ("DISPOSED", "KVStore was used after it was disposed".to_string()));
        let (code, msg) = JniError::from(jni::errors::Error::NullPtr("keys")).code_and_message();
        assert_eq!(code, "INVALID_ARGUMENT");
        assert!(msg.contains("null"), "{msg}");
        assert_eq!(panic_message(&"boom"), "boom");
        assert_eq!(panic_message(&String::from("bang")), "bang");
    }

    #[test]
    fn the_detail_carries_the_key_and_what_was_expected_and_got() {
        let e = JniError::from(Error::ShapeMismatch {
            context: "push of key \"w\" (value)".into(),
            key: Some("w".into()),
            expected: vec![2, 3],
            got: vec![3],
        });
        assert_eq!(e.detail(), Detail { key: Some("w"), shapes: Some((&[2, 3][..], &[3][..])), ..Detail::default() });
        let e = JniError::from(Error::DTypeMismatch {
            context: "ndarray add".into(),
            key: None,
            expected: DType::F32,
            got: DType::F64,
        });
        assert_eq!(e.detail(), Detail { dtypes: Some((DType::F32, DType::F64)), ..Detail::default() });
        assert_eq!((dtype_code(Some(DType::F64)), dtype_code(None)), (1, -1));
        let e = JniError::from(Error::LengthMismatch { context: "push".into(), what: "values", expected: 2, got: 1 });
        assert_eq!(e.detail(), Detail { lengths: Some((2, 1)), ..Detail::default() });
        assert_eq!((length(Some(2)), length(None)), (2, -1));
        let e = JniError::from(Error::KeyNotInitialized { op: "pull", key: "b".into() });
        assert_eq!(e.detail(), Detail { key: Some("b"), ..Detail::default() });
        assert_eq!(JniError::from(jni::errors::Error::NullPtr("keys")).detail(), Detail::default());
    }

    #[test]
    fn kvstore_debug_asks_for_reports_unless_empty_or_zero() {
        use std::ffi::OsStr;
        assert!(!debug_requested(None));
        assert!(!debug_requested(Some(OsStr::new(""))));
        assert!(!debug_requested(Some(OsStr::new("0"))));
        assert!(debug_requested(Some(OsStr::new("1"))));
        assert!(debug_requested(Some(OsStr::new("full"))));
    }
}
