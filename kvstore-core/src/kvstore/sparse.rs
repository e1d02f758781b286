//! Row-sparse keys (MXNet's `row_sparse` storage type): `init_row_sparse`,
//! `push_row_sparse`, `row_sparse_pull` and `stype`.
//!
//! A row-sparse key holds its whole value, `[rows, ...]`, as a dense array (the rows
//! no push wrote are zero), and remembers that it is row-sparse. So a dense `pull`
//! of it is the ordinary one, `row_sparse_pull` copies the rows asked for, and a lazy
//! optimizer update touches the pushed rows of the weight and its states in place
//! (what MXNet does too: its optimizers require a row-sparse weight to hold every row).

use std::sync::Arc;

use rayon::prelude::*;

use super::locks::{self, Held};
use super::merge::Merger;
use super::{Entry, KVStore, Store};
use crate::context::Context;
use crate::dtype::{DType, with_dtype};
use crate::engine::{Var, Vars};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::{NDArray, RowSparse, row_len};
use crate::waits;

/// A `row_sparse_pull` of at least this many rows copies them over the comm's thread
/// pool, in pieces of `PIECE_ROWS` rows.
const SPLIT_ROWS: usize = 4096;
const PIECE_ROWS: usize = 1024;

/// A key's storage type (MXNet's `stype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageType {
    /// A dense array (MXNet's `default`).
    Default,
    /// Row-sparse (MXNet's `row_sparse`).
    RowSparse,
}

impl StorageType {
    /// MXNet's name: `default` or `row_sparse`.
    pub fn name(self) -> &'static str {
        match self {
            StorageType::Default => "default",
            StorageType::RowSparse => "row_sparse",
        }
    }
}

impl KVStore {
    /// Initialises `key` with a row-sparse value: the key holds `value`'s rows, zero
    /// elsewhere, and is row-sparse ([`KVStore::row_sparse_pull`] reads it).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, RowSparse, StorageType};
    /// let kv = KVStore::create("local")?;
    /// let w = RowSparse::new(NDArray::from_vec(&[1, 2], vec![1.0f32, 2.0])?, vec![2], &[3, 2])?;
    /// kv.init_row_sparse("emb", &w)?;
    /// assert_eq!(kv.stype("emb")?, StorageType::RowSparse);
    /// assert_eq!(kv.pull_new("emb", 0)?.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`KVStore::init`]; [`Error::Unsupported`] on a `dist_*` store.
    pub fn init_row_sparse(&self, key: impl Into<Key>, value: &RowSparse) -> Result<()> {
        self.init_row_sparse_many(&[key.into()], std::slice::from_ref(value))
    }

    /// Initialises several keys with row-sparse values, one per key, as one `init`:
    /// when one key cannot be initialised (already initialised, repeated), none is.
    ///
    /// # Errors
    /// As [`KVStore::init`] ([`Error::LengthMismatch`] when the counts differ);
    /// [`Error::Unsupported`] on a `dist_*` store.
    pub fn init_row_sparse_many(&self, keys: &[Key], values: &[RowSparse]) -> Result<()> {
        self.local_only("init_row_sparse")?;
        if keys.len() != values.len() {
            return Err(Error::LengthMismatch {
                context: "init_row_sparse".into(),
                what: "values",
                expected: keys.len(),
                got: values.len(),
            });
        }
        let dense = values.iter().map(RowSparse::to_dense).collect::<Result<Vec<_>>>()?;
        self.init(keys.to_vec(), &dense[..])?;
        for key in keys {
            let entry = self.entry("init", key)?;
            self.on_key("init", &entry, move |store, entry| {
                let held = Held::new("init", store, &[entry])?;
                held.write("init", &[entry])?[0].row_sparse = true;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// The storage type of `key`: row-sparse once initialised with, or assigned, a
    /// row-sparse value.
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`].
    pub fn stype(&self, key: impl Into<Key>) -> Result<StorageType> {
        let key = key.into();
        let entry = self.entry("stype", &key)?;
        let held = Held::new("stype", &self.store, &[&entry])?;
        Ok(match held.read("stype", &[&entry])?[0].row_sparse {
            true => StorageType::RowSparse,
            false => StorageType::Default,
        })
    }

    /// Pushes row-sparse values into `key`: they are summed row by row over the union
    /// of their rows (left to right, as dense sums), then merged as a dense push is:
    /// with no updater the sum replaces the whole value (rows it lacks become zero,
    /// MXNet's assign) and the key becomes row-sparse; an optimizer that MXNet updates
    /// lazily (SGD and Adam with `lazy_update`, the default; AdaGrad; Ftrl) changes the
    /// pushed rows only, of the weight and of its states; any other optimizer, and a
    /// custom updater, gets the sum as a dense gradient (zero in the other rows).
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer, RowSparse};
    /// let kv = KVStore::create("local")?;
    /// kv.init("emb", &NDArray::ones(&[3, 2])?)?;
    /// kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 1.0).param("wd", 0.1).build()?)?;
    /// let g = RowSparse::new(NDArray::full(&[1, 2], 0.5)?, vec![1], &[3, 2])?;
    /// kv.push_row_sparse("emb", &[g], 0)?;
    /// // Only row 1 changes, weight decay included: (1 - 1 * 0.1) * 1 - 1 * 0.5.
    /// let r = 0.9f32 - 0.5;
    /// assert_eq!(kv.pull_new("emb", 0)?.to_vec::<f32>()?, vec![1.0, 1.0, r, r, 1.0, 1.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`], [`Error::ShapeMismatch`], [`Error::DTypeMismatch`],
    /// [`Error::LengthMismatch`] for no value, [`Error::Unsupported`] on a `dist_*`
    /// store, or the updater's error. On error the key keeps its value.
    pub fn push_row_sparse(&self, key: impl Into<Key>, values: &[RowSparse], priority: i32) -> Result<()> {
        self.push_row_sparse_many(&[(key.into(), values.to_vec())], priority)
    }

    /// Pushes row-sparse values into several keys: `pushes` pairs each key with its
    /// values (a key given twice has its values summed, in the order given, as a dense
    /// push's repeated keys). Every key, shape and dtype is checked before any key
    /// changes; then each key is pushed as [`KVStore::push_row_sparse`] does.
    ///
    /// # Errors
    /// As [`KVStore::push_row_sparse`]; a check that fails changes no key. An updater's
    /// error stops the call at its key (the keys before it keep their update).
    pub fn push_row_sparse_many(&self, pushes: &[(Key, Vec<RowSparse>)], priority: i32) -> Result<()> {
        let _ = priority;
        self.local_only("push_row_sparse")?;
        let mut merged: Vec<(Arc<Entry>, Vec<RowSparse>)> = Vec::with_capacity(pushes.len());
        let mut at: std::collections::HashMap<usize, usize> = std::collections::HashMap::with_capacity(pushes.len());
        for (key, values) in pushes {
            let entry = self.entry("push", key)?;
            match at.get(&entry.index) {
                Some(&i) => merged[i].1.extend(values.iter().cloned()),
                None => {
                    at.insert(entry.index, merged.len());
                    merged.push((entry, values.clone()));
                }
            }
        }
        for (entry, values) in &merged {
            let key = &entry.key;
            if values.is_empty() {
                return Err(Error::LengthMismatch {
                    context: format!("push_row_sparse of key \"{key}\""),
                    what: "values",
                    expected: 1,
                    got: 0,
                });
            }
            let (shape, dtype) = {
                let held = Held::new("push", &self.store, &[entry])?;
                let slot = &held.read("push", &[entry])?[0];
                (slot.value.shape().to_vec(), slot.value.dtype())
            };
            check_like(key, values, &shape, dtype)?;
        }
        for (entry, values) in merged {
            self.on_key("push", &entry, move |store, entry| store.push_rows(entry, &values))?;
        }
        Ok(())
    }

    /// The rows `row_ids` of row-sparse `key` (any order, repeats allowed: sorted and
    /// de-duplicated, as MXNet does), as a row-sparse array whose indices are exactly
    /// those rows (a row the key holds as zeros comes back as zeros). Copies only those
    /// rows.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, RowSparse};
    /// let kv = KVStore::create("local")?;
    /// kv.init_row_sparse("emb", &RowSparse::from_dense(&NDArray::ones(&[3, 2])?)?)?;
    /// let got = kv.row_sparse_pull("emb", &[2, 0, 2], 0)?;
    /// assert_eq!(got.indices(), &[0, 2]);
    /// assert_eq!(got.data().to_vec::<f32>()?, vec![1.0; 4]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotInitialized`]; [`Error::InvalidArgument`] for a key that is not
    /// row-sparse (MXNet: "PullRowSparse expects row_sparse src NDArray") or a row id
    /// out of range (MXNet returns a zero row for it); [`Error::Unsupported`] on a
    /// `dist_*` store.
    pub fn row_sparse_pull(&self, key: impl Into<Key>, row_ids: &[i64], priority: i32) -> Result<RowSparse> {
        let _ = priority;
        let key = key.into();
        self.local_only("row_sparse_pull")?;
        let entry = self.entry("row_sparse_pull", &key)?;
        let row_ids = row_ids.to_vec();
        self.on_key("row_sparse_pull", &entry, move |store, entry| {
            let held = Held::new("row_sparse_pull", store, &[entry])?;
            let guards = held.read("row_sparse_pull", &[entry])?;
            let slot = &guards[0];
            if !slot.row_sparse {
                return Err(Error::invalid_argument(format!(
                    "row_sparse_pull of key \"{}\": the key is dense, not row-sparse (pull it)",
                    entry.key
                )));
            }
            let shape = slot.value.shape().to_vec();
            let what = || format!("row_sparse_pull of key \"{}\": the row ids", entry.key);
            let ids = sorted_rows(row_ids, shape[0], &what)?;
            let rl = row_len(&shape);
            let data_shape = [&[ids.len()][..], &shape[1..]].concat();
            // The rows, copied once, straight into the result's buffer.
            let data = NDArray::zeros_with(&data_shape, slot.value.dtype(), Context::default())?;
            if rl > 0 {
                with_dtype!(slot.value.dtype(), T => slot.value.with_data(|v: &[T]| {
                    data.with_data_mut(|d: &mut [T]| {
                        let gather = |d: &mut [T], ids: &[i64]| {
                            for (o, &r) in d.chunks_exact_mut(rl).zip(ids) {
                                o.copy_from_slice(&v[r as usize * rl..(r as usize + 1) * rl]);
                            }
                        };
                        // Many rows: in pieces over the comm's pool. Each row of a big
                        // table is a cache and TLB miss, and more threads wait on more
                        // of them at once (10,000 rows of 256 B from a 256 MB table,
                        // cold: 770 us on one thread of a 2-core machine, 460 on two).
                        match store.comm.pool() {
                            Some(pool) if ids.len() >= SPLIT_ROWS => pool.install(|| {
                                d.par_chunks_mut(rl * PIECE_ROWS)
                                    .zip(ids.par_chunks(PIECE_ROWS))
                                    .for_each(|(d, ids)| gather(d, ids));
                            }),
                            _ => gather(d, &ids),
                        }
                    })
                })??);
            }
            RowSparse::new(data, ids, &shape)
        })
    }

    /// The entry of `key`, for `op`.
    fn entry(&self, op: &'static str, key: &Key) -> Result<Arc<Entry>> {
        let entry = self.store.table.read().entries.get(key).cloned();
        entry.ok_or_else(|| Error::KeyNotInitialized { op, key: key.clone() })
    }

    /// Refuses `op` on a store whose workers exchange values (not yet row by row).
    fn local_only(&self, op: &str) -> Result<()> {
        match self.store.collective {
            Some(_) => Err(Error::Unsupported {
                what: format!("{op} on a {} store", self.kind()),
                hint: "row-sparse keys are not yet exchanged between workers: use a local or device store".into(),
            }),
            None => Ok(()),
        }
    }

    /// Runs `f` on `entry` after the store's earlier calls on it: at once when none is
    /// queued, else queued behind them (and waited for).
    fn on_key<T: Send + 'static>(
        &self,
        op: &'static str,
        entry: &Arc<Entry>,
        f: impl FnOnce(&Store, &Arc<Entry>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        locks::check_reentry(op, &self.store)?;
        let vars: Vars = [Var::Key(entry.index)].into_iter().collect();
        if self.engine.may_run_now(vars.iter().copied()) {
            return f(&self.store, entry);
        }
        if locks::inside_updater() {
            return Err(locks::busy_store(op));
        }
        let _waiting = waits::wait_for(self.engine.id(), || format!("a blocking {op} that must queue"))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (store, entry) = (Arc::clone(&self.store), Arc::clone(entry));
        self.engine.submit(vars, 0, move || {
            let _ = tx.send(f(&store, &entry));
        });
        rx.recv().map_err(|_| Error::Internal(format!("{op}: the queued call ended without a result")))?
    }
}

/// `ids` sorted and de-duplicated, each checked to be a row of `rows` (`what` names
/// them in the error). Ids that are many for the rows (more than one in 256) are
/// marked in a bitmap of the rows and read back in order, in time linear in both;
/// fewer are sorted.
fn sorted_rows(mut ids: Vec<i64>, rows: usize, what: &dyn Fn() -> String) -> Result<Vec<i64>> {
    if let Some(&bad) = ids.iter().find(|&&r| r < 0 || r as u64 >= rows as u64) {
        return Err(Error::invalid_argument(format!("{}: row {bad} is out of range for {rows} rows", what())));
    }
    if ids.is_sorted_by(|a, b| a < b) {
        return Ok(ids);
    }
    if rows / 256 > ids.len() {
        ids.sort_unstable();
        ids.dedup();
        return Ok(ids);
    }
    let mut marks = vec![0u64; rows.div_ceil(64)];
    for &r in &ids {
        marks[r as usize / 64] |= 1 << (r % 64);
    }
    ids.clear();
    for (w, &word) in marks.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            ids.push((w * 64) as i64 + i64::from(bits.trailing_zeros()));
            bits &= bits - 1;
        }
    }
    Ok(ids)
}

/// Checks that every value pushed to `key` has the key's shape and dtype.
fn check_like(key: &Key, values: &[RowSparse], shape: &[usize], dtype: DType) -> Result<()> {
    for v in values {
        if v.shape() != shape {
            return Err(Error::ShapeMismatch {
                context: format!("push_row_sparse of key \"{key}\""),
                key: Some(key.clone()),
                expected: shape.to_vec(),
                got: v.shape().to_vec(),
            });
        }
        if v.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                context: format!("push_row_sparse of key \"{key}\""),
                key: Some(key.clone()),
                expected: dtype,
                got: v.dtype(),
            });
        }
    }
    Ok(())
}

impl Store {
    /// `push_row_sparse`'s work, its key's earlier calls done.
    fn push_rows(&self, entry: &Arc<Entry>, values: &[RowSparse]) -> Result<()> {
        const OP: &str = "push";
        let held = Held::new(OP, self, &[entry])?;
        let merger = held.merger_read(OP, &self.merger)?;
        let mut guards = held.write(OP, &[entry])?;
        let slot = &mut *guards[0];
        let key = &entry.key;
        check_like(key, values, slot.value.shape(), slot.value.dtype())?;
        let refs: Vec<&RowSparse> = values.iter().collect();
        let sum = RowSparse::sum(&refs)?;
        match &*merger {
            Merger::Assign => {
                sum.assign_to(&slot.value)?;
                slot.row_sparse = true;
            }
            Merger::Optimizer(runtime) => {
                runtime.check_weight(key, &slot.value)?;
                match runtime.lazy() && matches!(slot.value.dtype(), DType::F32 | DType::F64) {
                    true => runtime.update_rows(key, &slot.value, &sum, &mut slot.opt)?,
                    false => runtime.update(key, &slot.value, &sum.to_dense()?, &mut slot.opt)?,
                }
            }
            Merger::Custom(updater) => {
                // On a copy, swapped in when the updater succeeded (as dense pushes do).
                let work = slot.value.deep_copy()?;
                let grad = sum.to_dense()?;
                crate::ndarray::as_user_code(|| updater.update(key, entry.index, &grad, &work))?;
                slot.value = work;
            }
        }
        Ok(())
    }
}
