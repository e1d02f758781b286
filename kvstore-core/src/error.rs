//! The error type of the crate, mirroring the error classes of MXNet's KVStore
//! (reference §3) as typed variants, plus a stable, `Copy` [`ErrorKind`] that is the
//! contract with the Java and Clojure bindings.

use std::fmt;

use crate::dtype::DType;
use crate::key::Key;

/// Shorthand for `Result<T, kvstore_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a store or array operation.
///
/// Messages are lowercase, name the operation and the key, and say what to do when
/// there is something to do. Match on [`Error::kind`] rather than on message text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ----- keys -----
    /// The key was never passed to `init` (or `broadcast`).
    #[error("{op}: key \"{key}\" is not initialized: call init first")]
    KeyNotInitialized {
        /// The operation that was refused (`push`, `pull`, ...).
        op: &'static str,
        /// The key.
        key: Key,
    },
    /// `init` or `broadcast` of a key the store already holds, or twice in one call.
    #[error("{op}: duplicate init of key \"{key}\": {detail}")]
    AlreadyInitialized {
        /// The operation that was refused (`init` or `broadcast`).
        op: &'static str,
        /// The key.
        key: Key,
        /// Where the earlier init came from.
        detail: &'static str,
    },

    // ----- values -----
    /// An array has a different shape than the one it must match.
    #[error("{context}: shape mismatch: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The operation and key or operand concerned, for the message.
        context: String,
        /// The key concerned; `None` where no key is (array arithmetic, building an
        /// array from data).
        key: Option<Key>,
        /// The shape that was required.
        expected: Vec<usize>,
        /// The shape that was given.
        got: Vec<usize>,
    },
    /// An array has a different element type than the one it must match.
    #[error("{context}: dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        /// The operation and key or operand concerned, for the message.
        context: String,
        /// The key concerned; `None` where no key is (array arithmetic, a typed read).
        key: Option<Key>,
        /// The dtype that was required.
        expected: DType,
        /// The dtype that was given.
        got: DType,
    },
    /// Parallel lists of different lengths (keys and values, keys and outs).
    #[error("{context}: length mismatch: {expected} {what} expected, got {got}")]
    LengthMismatch {
        /// The operation concerned.
        context: String,
        /// What is being counted ("values", "outs").
        what: &'static str,
        /// The length that was required.
        expected: usize,
        /// The length that was given.
        got: usize,
    },

    // ----- stores and devices -----
    /// `create` was given a kind that no build of the library knows.
    #[error("unknown store kind \"{kind}\": known kinds are {}", known.join(", "))]
    UnknownStoreKind {
        /// The name as given.
        kind: String,
        /// The kinds that exist.
        known: Vec<&'static str>,
    },
    /// A device context was used but no backend can serve it.
    #[error("device {context} is unavailable: {reason}")]
    DeviceUnavailable {
        /// The context, for example `gpu(0)`.
        context: String,
        /// Why, and what to do about it.
        reason: String,
    },
    /// A feature this build or this store kind does not provide.
    #[error("{what} is not supported: {hint}")]
    Unsupported {
        /// The feature.
        what: String,
        /// What is supported instead.
        hint: String,
    },
    /// An argument that is invalid on its own (not a mismatch with stored state).
    #[error("{0}")]
    InvalidArgument(String),
    /// An object that was closed or disposed was used.
    #[error("{what} was used after it was disposed")]
    Disposed {
        /// The kind of object.
        what: &'static str,
    },
    /// A file could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// The operation and path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A device or transport backend reported a failure.
    #[error("{backend} backend: {message}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// Its message.
        message: String,
    },
    /// User code that a store ran for its caller (an updater) failed: what it raised, in
    /// the language it was written in, rides in `cause`, so that a binding gives it back
    /// as the cause of the exception its caller sees, whatever thread ran the code. Its
    /// kind is [`ErrorKind::Backend`].
    #[error("{backend} backend: {message}")]
    Raised {
        /// The user code's kind (`python updater`, `java updater`).
        backend: &'static str,
        /// What failed, for the message.
        message: String,
        /// What the code raised.
        cause: Cause,
    },
    /// The machine refused a resource: memory for an array, or threads for a pool.
    /// Nothing of the call changed; it may succeed once resources are freed.
    #[error("{what}: out of resources: {detail}")]
    ResourceExhausted {
        /// What was being done (`allocating 4096 bytes for an array`, ...).
        what: String,
        /// What the system said, and what to do.
        detail: String,
    },
    /// A bug in the library; please report it.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What user code raised, as its binding holds it (a Java exception's global reference,
/// a Python exception), carried by [`Error::Raised`]; the error's copies share it.
///
/// ```
/// use kvstore_core::{Cause, Error, ErrorKind};
/// let e = Error::Raised { backend: "my updater", message: "it failed".into(), cause: Cause::new(42u32) };
/// assert_eq!(e.kind(), ErrorKind::Backend);
/// let Error::Raised { cause, .. } = e.clone() else { unreachable!() };
/// assert_eq!(cause.downcast_ref::<u32>(), Some(&42));
/// assert_eq!(cause.downcast_ref::<String>(), None);
/// ```
#[derive(Clone)]
pub struct Cause(std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl Cause {
    /// `value` as a cause.
    pub fn new<T: std::any::Any + Send + Sync>(value: T) -> Self {
        Cause(std::sync::Arc::new(value))
    }

    /// The value, if it is a `T`.
    pub fn downcast_ref<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cause(..)")
    }
}

/// A copy: the same variant with the same fields; an I/O error's copy keeps its kind
/// and message (what several calls that failed together each report).
impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::KeyNotInitialized { op, key } => Error::KeyNotInitialized { op, key: key.clone() },
            Error::AlreadyInitialized { op, key, detail } => Error::AlreadyInitialized { op, key: key.clone(), detail },
            Error::ShapeMismatch { context, key, expected, got } => Error::ShapeMismatch {
                context: context.clone(),
                key: key.clone(),
                expected: expected.clone(),
                got: got.clone(),
            },
            Error::DTypeMismatch { context, key, expected, got } => {
                Error::DTypeMismatch { context: context.clone(), key: key.clone(), expected: *expected, got: *got }
            }
            Error::LengthMismatch { context, what, expected, got } => {
                Error::LengthMismatch { context: context.clone(), what, expected: *expected, got: *got }
            }
            Error::UnknownStoreKind { kind, known } => {
                Error::UnknownStoreKind { kind: kind.clone(), known: known.clone() }
            }
            Error::DeviceUnavailable { context, reason } => {
                Error::DeviceUnavailable { context: context.clone(), reason: reason.clone() }
            }
            Error::Unsupported { what, hint } => Error::Unsupported { what: what.clone(), hint: hint.clone() },
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::Disposed { what } => Error::Disposed { what },
            Error::Io { context, source } => {
                Error::Io { context: context.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
            Error::Backend { backend, message } => Error::Backend { backend, message: message.clone() },
            Error::Raised { backend, message, cause } => {
                Error::Raised { backend, message: message.clone(), cause: cause.clone() }
            }
            Error::ResourceExhausted { what, detail } => {
                Error::ResourceExhausted { what: what.clone(), detail: detail.clone() }
            }
            Error::Internal(m) => Error::Internal(m.clone()),
        }
    }
}

/// The stable category of an [`Error`], shared with the Java (`KVStoreException.code()`)
/// and Clojure (`:kvstore/error`) bindings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`Error::KeyNotInitialized`].
    KeyNotInitialized,
    /// See [`Error::AlreadyInitialized`].
    AlreadyInitialized,
    /// See [`Error::ShapeMismatch`].
    ShapeMismatch,
    /// See [`Error::DTypeMismatch`].
    DTypeMismatch,
    /// See [`Error::LengthMismatch`].
    LengthMismatch,
    /// See [`Error::UnknownStoreKind`].
    UnknownStoreKind,
    /// See [`Error::DeviceUnavailable`].
    DeviceUnavailable,
    /// See [`Error::Unsupported`].
    Unsupported,
    /// See [`Error::InvalidArgument`].
    InvalidArgument,
    /// See [`Error::Disposed`].
    Disposed,
    /// See [`Error::Io`].
    Io,
    /// See [`Error::Backend`].
    Backend,
    /// See [`Error::ResourceExhausted`].
    ResourceExhausted,
    /// See [`Error::Internal`].
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 14] = [
        ErrorKind::KeyNotInitialized,
        ErrorKind::AlreadyInitialized,
        ErrorKind::ShapeMismatch,
        ErrorKind::DTypeMismatch,
        ErrorKind::LengthMismatch,
        ErrorKind::UnknownStoreKind,
        ErrorKind::DeviceUnavailable,
        ErrorKind::Unsupported,
        ErrorKind::InvalidArgument,
        ErrorKind::Disposed,
        ErrorKind::Io,
        ErrorKind::Backend,
        ErrorKind::ResourceExhausted,
        ErrorKind::Internal,
    ];

    /// The name used across FFI: `"SHAPE_MISMATCH"` for [`ErrorKind::ShapeMismatch`].
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::KeyNotInitialized => "KEY_NOT_INITIALIZED",
            ErrorKind::AlreadyInitialized => "ALREADY_INITIALIZED",
            ErrorKind::ShapeMismatch => "SHAPE_MISMATCH",
            ErrorKind::DTypeMismatch => "DTYPE_MISMATCH",
            ErrorKind::LengthMismatch => "LENGTH_MISMATCH",
            ErrorKind::UnknownStoreKind => "UNKNOWN_STORE_KIND",
            ErrorKind::DeviceUnavailable => "DEVICE_UNAVAILABLE",
            ErrorKind::Unsupported => "UNSUPPORTED",
            ErrorKind::InvalidArgument => "INVALID_ARGUMENT",
            ErrorKind::Disposed => "DISPOSED",
            ErrorKind::Io => "IO",
            ErrorKind::Backend => "BACKEND",
            ErrorKind::ResourceExhausted => "RESOURCE_EXHAUSTED",
            ErrorKind::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Error {
    /// The stable category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::KeyNotInitialized { .. } => ErrorKind::KeyNotInitialized,
            Error::AlreadyInitialized { .. } => ErrorKind::AlreadyInitialized,
            Error::ShapeMismatch { .. } => ErrorKind::ShapeMismatch,
            Error::DTypeMismatch { .. } => ErrorKind::DTypeMismatch,
            Error::LengthMismatch { .. } => ErrorKind::LengthMismatch,
            Error::UnknownStoreKind { .. } => ErrorKind::UnknownStoreKind,
            Error::DeviceUnavailable { .. } => ErrorKind::DeviceUnavailable,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Disposed { .. } => ErrorKind::Disposed,
            Error::Io { .. } => ErrorKind::Io,
            Error::Backend { .. } | Error::Raised { .. } => ErrorKind::Backend,
            Error::ResourceExhausted { .. } => ErrorKind::ResourceExhausted,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The key this error concerns, if any: the key of [`Error::KeyNotInitialized`] and
    /// [`Error::AlreadyInitialized`], and of an [`Error::ShapeMismatch`] or
    /// [`Error::DTypeMismatch`] of a store operation (`None` for one of array
    /// arithmetic). Other errors carry no key.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, KVStore, Key, NDArray};
    ///
    /// let kv = KVStore::create("local")?;
    /// kv.init("w", &NDArray::zeros(&[2, 3])?)?;
    /// let e = kv.push("w", &NDArray::zeros(&[3, 3])?, 0).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
    /// assert_eq!(e.key(), Some(&Key::from("w")));
    /// let e = kv.pull("b", &NDArray::zeros(&[2, 3])?, 0).unwrap_err();
    /// assert_eq!(e.key().map(Key::as_str), Some("b"));
    /// let e = NDArray::zeros(&[2])?.add_assign(&NDArray::zeros(&[3])?).unwrap_err();
    /// assert_eq!((e.kind(), e.key()), (ErrorKind::ShapeMismatch, None));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn key(&self) -> Option<&Key> {
        match self {
            Error::KeyNotInitialized { key, .. } | Error::AlreadyInitialized { key, .. } => Some(key),
            Error::ShapeMismatch { key, .. } | Error::DTypeMismatch { key, .. } => key.as_ref(),
            _ => None,
        }
    }

    /// An [`Error::InvalidArgument`] with the given message.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }
}
