//! `kvstore-jni`: the native library (`libkvstore_jni.so`) behind the Java API in
//! package `io.github.kvstore` and the Clojure namespaces `org.apache.clojure-mxnet.*`.
//!
//! It is the only crate of the workspace with `extern "system"` functions. Each one is a
//! thin shim: it converts its arguments, calls a plain-Rust function that returns a
//! `Result`, and maps the error. The contract with Java (native signatures, codes,
//! handles, errors) is `NATIVES.md` beside this crate's `Cargo.toml`; the Java sources
//! are beside it too, in `java/` (`src/`, `test/`, `examples/`, `bench/`). From Java:
//!
//! ```java
//! try (KVStore kv = KVStore.create("local"); NDArray a = NDArray.ones(2, 3)) {
//!     kv.init("3", a.mul(2));
//!     kv.pull("3", a);            // a == 2
//! }
//! ```
//!
//! # Safety against the caller
//! Java holds `long` handles into tables of `Arc`s ([`handles`]), never pointers: a
//! closed, stale or forged handle is a `KVStoreException` with code `DISPOSED`. Every
//! error is thrown as `KVStoreException(code, message)` with the Rust
//! [`kvstore::ErrorKind`] code; a panic is caught by jni's `with_env` and thrown
//! as `INTERNAL` with the panic's message, and nothing is printed on stderr unless the
//! environment variable `KVSTORE_DEBUG` is set (then Rust's own report comes too, with a
//! backtrace under `RUST_BACKTRACE`; see [`error::install_panic_hook`]). Nothing a
//! caller passes can crash the JVM: `JNI_OnLoad` ([`classes`]) caches every class the
//! error and updater paths need while the stack is healthy, so that they work, or fail
//! with a Java exception, on a thread that is nearly out of stack.
//!
//! # Features
//! - `cuda` (on by default): GPU arrays through kvstore-cuda. CUDA is loaded at run time,
//!   so the library builds and loads without it and answers `DEVICE_UNAVAILABLE`, with
//!   the reason, on machines that lack it.
//! - `mpi`: `dist_sync` over MPI (kvstore-mpi's `mpi` feature); the library then links
//!   Open MPI's `libmpi`. Without it, `create("dist_sync")` answers `UNSUPPORTED`.

pub mod buffer;
pub mod classes;
pub mod convert;
pub mod error;
pub mod handles;
pub mod native;
pub mod ndarray;
pub mod optimizer;
pub mod pending;
pub mod sparse;
pub mod store;
pub mod updater;
