//! kvstore-core's settings: every environment variable the core reads, with its
//! default and how a value is checked, in one place (a value that is not one of the
//! setting's is an [`Error::InvalidArgument`] naming the variable). The table of
//! `docs/configuration.md` lists them, and which ranks must agree on each. A value
//! given in code (the builder's) wins over the environment's; each is read when the
//! thing it sets starts. (The job's commits are a layer over the core, with settings
//! of their own: `kvstore-commit/src/settings.rs`.)

use std::ffi::OsString;

use crate::error::{Error, Result};
use crate::key::shorten;

/// MXNet's variable for the size (in elements) from which a `dist_async` key is split
/// across owners.
pub(crate) const BIGARRAY_BOUND_VAR: &str = "MXNET_KVSTORE_BIGARRAY_BOUND";
/// [`BIGARRAY_BOUND_VAR`]'s default, MXNet's.
pub(crate) const DEFAULT_BIGARRAY_BOUND: usize = 1_000_000;

/// MXNet's variable for the number of reduction threads: here, the size of the shared
/// pool when it starts (unset: one thread per core).
pub(crate) const REDUCTION_THREADS_VAR: &str = "MXNET_KVSTORE_REDUCTION_NTHREADS";

/// The bytes up to which small non-blocking `dist_sync` calls fuse.
pub(crate) const FUSE_BYTES_VAR: &str = "KVSTORE_FUSE_BYTES";
/// The calls a store queues before the next waits.
pub(crate) const MAX_QUEUED_CALLS_VAR: &str = "KVSTORE_MAX_QUEUED_CALLS";
/// The bytes of copies held for queued calls before the next waits.
pub(crate) const MAX_COPIED_BYTES_VAR: &str = "KVSTORE_MAX_COPIED_BYTES";

/// Where a `dist_sync` store's optimizer state lives: `owners` or `replicated`.
pub(crate) const LAYOUT_VAR: &str = "KVSTORE_LAYOUT";

/// The environment variable that turns the timeline on: the path of its file.
pub const TIMELINE_VAR: &str = "KVSTORE_TIMELINE";
/// The environment variable that bounds the timeline's file, in bytes.
pub const TIMELINE_MAX_BYTES_VAR: &str = "KVSTORE_TIMELINE_MAX_BYTES";
/// [`TIMELINE_MAX_BYTES_VAR`]'s default: 1 GiB.
pub const DEFAULT_TIMELINE_MAX_BYTES: u64 = 1 << 30;

/// `var`'s value, `None` when it is unset.
fn read(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// The size from which a `dist_async` key is split ([`BIGARRAY_BOUND_VAR`]; unset or
/// empty: MXNet's default).
pub(crate) fn bigarray_bound() -> Result<usize> {
    match read(BIGARRAY_BOUND_VAR) {
        Some(v) if !v.trim().is_empty() => v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::invalid_argument(format!("{BIGARRAY_BOUND_VAR}={v:?}: expected a number of elements above 0"))
        }),
        _ => Ok(DEFAULT_BIGARRAY_BOUND),
    }
}

/// The shared pool's threads ([`REDUCTION_THREADS_VAR`]; 0: one per core).
pub(crate) fn reduction_threads() -> Result<usize> {
    reduction_threads_of(read(REDUCTION_THREADS_VAR).as_deref())
}

/// The shared pool's threads for the value of [`REDUCTION_THREADS_VAR`] (0: one per
/// core, for an unset or empty variable).
fn reduction_threads_of(value: Option<&str>) -> Result<usize> {
    match value.map(str::trim) {
        None | Some("") => Ok(0),
        Some(v) => v.parse::<usize>().ok().filter(|n| (1..=1024).contains(n)).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{REDUCTION_THREADS_VAR} must be a number of threads from 1 to 1024, not \"{}\"",
                shorten(v)
            ))
        }),
    }
}

/// A number from the builder (`given`), else from the environment variable `var`,
/// else `default`: [`FUSE_BYTES_VAR`], [`MAX_QUEUED_CALLS_VAR`],
/// [`MAX_COPIED_BYTES_VAR`].
pub(crate) fn number(given: Option<usize>, var: &str, default: usize) -> Result<usize> {
    match (given, read(var)) {
        (Some(n), _) => Ok(n),
        (None, Some(v)) => {
            v.trim().parse().map_err(|_| Error::invalid_argument(format!("{var}: \"{}\" is not a number", shorten(&v))))
        }
        (None, None) => Ok(default),
    }
}

/// A `dist_sync` store's layout: `given` (the builder's), else [`LAYOUT_VAR`]'s, else
/// the default.
pub(crate) fn layout(given: Option<crate::Layout>) -> Result<crate::Layout> {
    match (given, read(LAYOUT_VAR)) {
        (Some(l), _) => Ok(l),
        (None, Some(v)) if !v.trim().is_empty() => {
            crate::Layout::parse(&v).map_err(|e| Error::invalid_argument(format!("{LAYOUT_VAR}: {e}")))
        }
        _ => Ok(crate::Layout::default()),
    }
}

/// The timeline's file ([`TIMELINE_VAR`]), when it names one.
pub(crate) fn timeline_path() -> Option<OsString> {
    std::env::var_os(TIMELINE_VAR).filter(|p| !p.is_empty())
}

/// Whether [`TIMELINE_VAR`] is set at all (even empty): the job's slowest rank is then
/// said when its timelines are merged.
pub(crate) fn timeline_set() -> bool {
    std::env::var_os(TIMELINE_VAR).is_some()
}

/// The bound of the timeline's file ([`TIMELINE_MAX_BYTES_VAR`], or the default).
pub(crate) fn timeline_max_bytes() -> Result<u64> {
    let var = TIMELINE_MAX_BYTES_VAR;
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::invalid_argument(format!("{var} must be a whole number of bytes, not {v:?}"))),
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_TIMELINE_MAX_BYTES),
        Err(e) => Err(Error::invalid_argument(format!("{var}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mxnets_reduction_threads_variable_sizes_the_shared_pool() {
        assert_eq!(reduction_threads_of(None).unwrap(), 0);
        assert_eq!(reduction_threads_of(Some("")).unwrap(), 0);
        assert_eq!(reduction_threads_of(Some(" 3 ")).unwrap(), 3);
        for bad in ["0", "-1", "two", "1.5", "100000"] {
            let e = reduction_threads_of(Some(bad)).expect_err(bad);
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("MXNET_KVSTORE_REDUCTION_NTHREADS"), "{e}");
        }
    }
}
