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
//! Only memory whose object keeps it alive is shared ([`ForeignMemory::shared`]): an
//! array over memory each call keeps alive instead (a binding's cache of wrappers)
//! is never handed to another wrapper; its binding asks for a live twin before each
//! call instead ([`NDArray::shared_twin`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use super::{Inner, NDArray};
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

/// The number of entries of `LIVE`: a lookup with none reads this only.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The live array over what `inner` wraps, if there is one; else `inner`'s, now listed.
/// `inner` must be a shared foreign array no handle has yet. The array not used is
/// dropped after the list is unlocked (dropping foreign memory may run a binding's
/// code, which may wrap memory again).
pub(super) fn one_for(inner: Inner) -> NDArray {
    let key = Key::of(&inner);
    let mut live = LIVE.lock();
    if let Some(twin) = live.get(&key).and_then(Weak::upgrade) {
        drop(live);
        drop(inner);
        return NDArray { inner: twin };
    }
    let inner = Arc::new(inner);
    live.insert(key, Arc::downgrade(&inner));
    COUNT.store(live.len(), Ordering::Relaxed);
    NDArray { inner }
}

/// Unlists `inner`, a listed array being dropped, unless another array has its place.
pub(super) fn unlist(inner: &Inner) {
    let key = Key::of(inner);
    let mut live = LIVE.lock();
    if live.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), inner)) {
        live.remove(&key);
        COUNT.store(live.len(), Ordering::Relaxed);
    }
}

impl NDArray {
    /// The live array that [`NDArray::from_foreign`] made over the same bytes as this
    /// array, with the same shape, dtype and writability, if it is another array than
    /// this one: what a binding that keeps its own wrappers of memory
    /// ([`crate::ForeignMemory::shared`] false) uses instead of its wrapper, so that
    /// its calls are ordered with every other wrapper's. `None` for every array that is
    /// not over foreign memory.
    pub fn shared_twin(&self) -> Option<NDArray> {
        if !self.inner.foreign || self.inner.registered || COUNT.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let live = LIVE.lock();
        let twin = live.get(&Key::of(&self.inner)).and_then(Weak::upgrade);
        drop(live);
        twin.map(|inner| NDArray { inner })
    }
}
