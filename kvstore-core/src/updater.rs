//! Updaters: what a push does with the sum of the pushed values. Mirrors MXNet's
//! `KVStore::Updater` (`_set_updater` in Python, `MXKVStoreUpdater` in Scala).

use crate::error::Result;
use crate::key::Key;
use crate::ndarray::NDArray;

/// Merges the sum of a push into the stored value, in place.
///
/// Called once per distinct key per push, with the **sum** of that key's values, in
/// the order the keys were first initialised. `index` is the key's internal number
/// (0, 1, 2, ... in order of first `init`), which is what MXNet's Scala and Clojure
/// updaters received. An error fails the push, and the store keeps the values it had
/// before the push (MXNet printed the error and went on).
///
/// `merged` and `stored` are the key's own buffers (its merge buffer, and a working
/// copy of its value that becomes the value when every key of the push succeeded),
/// reused from push to push as MXNet reuses its merge buffers: an updater that keeps
/// them after the call sees them change at later pushes.
///
/// Closures `Fn(&Key, usize, &NDArray, &NDArray) -> Result<()>` are updaters:
///
/// ```
/// use kvstore_core::{KVStore, NDArray};
/// let kv = KVStore::create("local")?;
/// kv.init(3, &NDArray::ones(&[2, 3])?)?;
/// kv.set_updater(|_key: &_, _index, merged: &NDArray, stored: &NDArray| {
///     stored.add_assign(&merged.mul(2.0)?)
/// })?;
/// kv.push(3, &NDArray::ones(&[2, 3])?, 0)?;
/// let out = NDArray::zeros(&[2, 3])?;
/// kv.pull(3, &out, 0)?;
/// assert_eq!(out.to_vec::<f32>()?, vec![3.0; 6]);
/// # Ok::<(), kvstore_core::Error>(())
/// ```
pub trait Updater: Send + Sync {
    /// Updates `stored` with `merged`.
    ///
    /// # Errors
    /// Any error fails the push that called it.
    fn update(&self, key: &Key, index: usize, merged: &NDArray, stored: &NDArray) -> Result<()>;
}

impl<F> Updater for F
where
    F: Fn(&Key, usize, &NDArray, &NDArray) -> Result<()> + Send + Sync,
{
    fn update(&self, key: &Key, index: usize, merged: &NDArray, stored: &NDArray) -> Result<()> {
        self(key, index, merged, stored)
    }
}
