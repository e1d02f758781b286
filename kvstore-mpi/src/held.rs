//! Many arrays' memory held at once ([`with_all`], [`with_all_mut`]): messages of
//! several arrays in flight together, sent from and received into the arrays themselves
//! (`parts.rs`), with no packing copy.

use kvstore_core::backend::{with_bytes, with_bytes_mut};
use kvstore_core::{NDArray, Result};

/// Runs `f` on the bytes of every array of `arrays`, each read-locked meanwhile (an
/// array's read lock is recursive: one that appears twice is locked twice).
pub(crate) fn with_all<R>(arrays: &[&NDArray], f: impl FnOnce(Vec<&[u8]>) -> R) -> Result<R> {
    hold(arrays, Vec::new(), Box::new(f))
}

/// Read-locks `arrays` one after another, appending their bytes to `held`, then runs `f`.
#[allow(clippy::type_complexity)]
fn hold<'h, R>(
    arrays: &[&NDArray],
    held: Vec<&'h [u8]>,
    f: Box<dyn for<'x> FnOnce(Vec<&'x [u8]>) -> R + '_>,
) -> Result<R> {
    match arrays.split_first() {
        None => Ok(f(held)),
        Some((a, rest)) => with_bytes(a, move |bytes| {
            let mut held: Vec<&[u8]> = held;
            held.push(bytes);
            hold(rest, held, f)
        })?,
    }
}

/// Runs `f` on the bytes of every array of `arrays`, each write-locked meanwhile; the
/// arrays must be distinct storages (the caller checks: one locked twice would wait for
/// itself).
pub(crate) fn with_all_mut<R>(arrays: &[&NDArray], f: impl FnOnce(Vec<&mut [u8]>) -> R) -> Result<R> {
    hold_mut(arrays, Vec::new(), Box::new(f))
}

/// Write-locks `arrays` one after another, appending their bytes to `held`, then runs `f`.
#[allow(clippy::type_complexity)]
fn hold_mut<'h, R>(
    arrays: &[&NDArray],
    held: Vec<&'h mut [u8]>,
    f: Box<dyn for<'x> FnOnce(Vec<&'x mut [u8]>) -> R + '_>,
) -> Result<R> {
    match arrays.split_first() {
        None => Ok(f(held)),
        Some((a, rest)) => with_bytes_mut(a, move |bytes| {
            let mut held: Vec<&mut [u8]> = held;
            held.push(bytes);
            hold_mut(rest, held, f)
        })?,
    }
}
