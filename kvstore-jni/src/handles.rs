//! The handle tables: Java holds `long` handles, never pointers. A handle is a key into
//! a table of `Arc`s, so a closed, stale, forged or foreign handle is an
//! [`Error::Disposed`], never a crash, and closing a store while another thread uses it
//! only drops the table's reference: the call in flight keeps its own.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};

use kvstore::{Error, KVStore, NDArray, Result};
use parking_lot::RwLock;
use std::sync::Arc;

/// One counter for every table, so a handle of one kind is never valid in another.
/// 0 is never issued: it is what a closed Java object holds.
static NEXT: AtomicI64 = AtomicI64::new(1);

/// Objects of one kind, by handle.
pub struct Table<T> {
    what: &'static str,
    map: RwLock<HashMap<i64, T>>,
}

impl<T: Clone> Table<T> {
    fn new(what: &'static str) -> Self {
        Table { what, map: RwLock::new(HashMap::new()) }
    }

    /// Stores `value` and returns its new handle.
    pub fn insert(&self, value: T) -> i64 {
        let h = NEXT.fetch_add(1, Ordering::Relaxed);
        self.map.write().insert(h, value);
        h
    }

    /// The object of handle `h`.
    ///
    /// # Errors
    /// [`Error::Disposed`] if `h` is not a live handle of this table.
    pub fn get(&self, h: i64) -> Result<T> {
        self.map.read().get(&h).cloned().ok_or(Error::Disposed { what: self.what })
    }

    /// The objects of `handles`, in order.
    ///
    /// # Errors
    /// As [`Table::get`].
    pub fn get_all(&self, handles: &[i64]) -> Result<Vec<T>> {
        let map = self.map.read();
        handles.iter().map(|h| map.get(h).cloned().ok_or(Error::Disposed { what: self.what })).collect()
    }

    /// Forgets handle `h`; returns whether it was live. Freeing twice is harmless.
    pub fn remove(&self, h: i64) -> bool {
        self.map.write().remove(&h).is_some()
    }

    /// The number of live handles.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// Whether no handle is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Live stores.
pub static STORES: LazyLock<Table<Arc<KVStore>>> = LazyLock::new(|| Table::new("KVStore"));
/// Live arrays (an `NDArray` is itself a shared handle to its buffer).
pub static ARRAYS: LazyLock<Table<NDArray>> = LazyLock::new(|| Table::new("NDArray"));

#[cfg(test)]
mod tests {
    use super::*;
    use kvstore::ErrorKind;

    #[test]
    fn stale_foreign_and_zero_handles_are_disposed_errors() {
        let a = ARRAYS.insert(NDArray::zeros(&[1]).unwrap());
        let s = STORES.insert(Arc::new(KVStore::create("local").unwrap()));
        assert!(ARRAYS.get(a).is_ok());
        assert_eq!(ARRAYS.get(s).unwrap_err().kind(), ErrorKind::Disposed);
        assert_eq!(STORES.get(a).unwrap_err().kind(), ErrorKind::Disposed);
        assert_eq!(ARRAYS.get(0).unwrap_err().kind(), ErrorKind::Disposed);
        assert!(ARRAYS.remove(a));
        assert!(!ARRAYS.remove(a));
        assert_eq!(ARRAYS.get(a).unwrap_err().to_string(), "NDArray was used after it was disposed");
        assert!(STORES.remove(s));
    }

    #[test]
    fn a_store_closed_during_a_call_lives_until_the_call_ends() {
        let h = STORES.insert(Arc::new(KVStore::create("local").unwrap()));
        let in_flight = STORES.get(h).unwrap();
        assert!(STORES.remove(h));
        assert_eq!(in_flight.kind(), "local");
        assert_eq!(STORES.get(h).unwrap_err().kind(), ErrorKind::Disposed);
    }
}
