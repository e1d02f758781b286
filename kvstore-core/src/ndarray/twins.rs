//! One array for every live wrapper of the same foreign memory. A binding wraps its
//! language's array anew each time a call is given it (a numpy view, a Java buffer
//! view, a torch tensor), but a store orders its calls on an array by the array's
//! buffer (`Inner`: its pending writes, its loans, its engine var, its lock). So
//! [`NDArray::from_foreign`] looks up the arrays it made before over exactly the same
//! bytes, shape, dtype and writability that are still alive, and returns that array
//! instead of a new one: a call on a wrapper is then ordered after every earlier call
//! on the same memory, through whichever wrapper it was made (without it, a blocking
//! pull into an array after a non-blocking pull into the same memory could be
//! overwritten by the earlier pull, and two threads' calls through two views could
//! tear each other's values).
//!
//! A handle to a live array given for a wrapper keeps that wrapper's memory object
//! alive: the array's own object may not keep the memory alive (a binding that keeps
//! its wrappers between calls has the handles keep the owners,
//! [`NDArray::kept_alive_by`]). Memory no other wrapper can name is not looked up
//! ([`crate::ForeignMemory::shared`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use super::{HostBuf, Inner, NDArray, Storage};
use crate::context::Context;
use crate::dtype::DType;

/// What makes two wrappers one array: the same bytes seen the same way.
#[derive(Hash, PartialEq, Eq)]
struct Key {
    span: (usize, usize),
    dtype: DType,
    read_only: bool,
    shape: smallvec::SmallVec<[usize; 4]>,
}

impl Key {
    fn of(inner: &Inner) -> Self {
        Key { span: inner.span, dtype: inner.dtype, read_only: inner.read_only, shape: inner.shape.clone() }
    }
}

/// The live shared foreign arrays, by what they wrap.
static LIVE: LazyLock<Mutex<HashMap<Key, Weak<Inner>, foldhash::fast::RandomState>>> = LazyLock::new(Default::default);

/// The live array over `buf`'s bytes (`span`) in `shape` (`size` elements of `dtype`,
/// `read_only` or not), if there is one, as a handle that keeps `buf`'s memory object
/// alive (its owner may be the only one keeping the memory alive: see
/// [`NDArray::kept_alive_by`]); else a new array over `buf`, listed.
pub(super) fn one_for(
    buf: HostBuf,
    span: (usize, usize),
    shape: &[usize],
    size: usize,
    dtype: DType,
    read_only: bool,
) -> NDArray {
    let key = Key { span, dtype, read_only, shape: smallvec::SmallVec::from_slice(shape) };
    let mut live = LIVE.lock();
    if let Some(twin) = live.get(&key).and_then(Weak::upgrade) {
        // Unlocked first: dropping a memory object may run a binding's code.
        drop(live);
        let array = NDArray { inner: twin, keep: None };
        return match buf.into_foreign() {
            Some(mem) => array.kept_alive_by(Box::new(mem)),
            None => array,
        };
    }
    let mut inner = NDArray::inner_over(Storage::Host(buf), shape, size, dtype, Context::cpu(0), read_only);
    inner.registered = true;
    let inner = Arc::new(inner);
    // (A dead entry it replaces is its array's, being dropped: `unlist` leaves this one.)
    live.insert(key, Arc::downgrade(&inner));
    NDArray { inner, keep: None }
}

/// Unlists `inner`, a listed array being dropped, unless another array has its place.
pub(super) fn unlist(inner: &Inner) {
    let key = Key::of(inner);
    let mut live = LIVE.lock();
    if live.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), inner)) {
        live.remove(&key);
    }
}
