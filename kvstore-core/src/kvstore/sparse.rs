//! Row-sparse keys (MXNet's `row_sparse` storage type): `init_row_sparse`,
//! `push_row_sparse`, `row_sparse_pull` and `stype`.
//!
//! A row-sparse key holds its whole value, `[rows, ...]`, as a dense array (the rows
//! no push wrote are zero), and remembers that it is row-sparse. So a dense `pull`
//! of it is the ordinary one, `row_sparse_pull` copies the rows asked for, and a lazy
//! optimizer update touches the pushed rows of the weight and its states in place
//! (what MXNet does too: its optimizers require a row-sparse weight to hold every row).

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use super::data::{Entry, Merger, Store};
use super::locks::Held;
use super::plan::RowsPlan;
use crate::context::Context;
use crate::dtype::{DType, with_dtype};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::{NDArray, RowSparse, row_len};

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

/// A `row_sparse_pull`'s row ids as the call hands them to the key's queue, read once
/// where the caller gave them: ids in `0..2^32` as 32-bit rows (half the bytes, and the
/// radix sort's keys), with the largest and whether they are strictly increasing
/// already; any other ids as given (a negative one, or tables past 2^32 rows).
pub(crate) enum RowIds {
    Rows { rows: Vec<u32>, max: u32, increasing: bool },
    Other(Vec<i64>),
}

impl RowIds {
    pub(super) fn new(ids: &[i64]) -> Self {
        let (max, increasing, _) =
            ids.iter().fold((0u64, true, -1i64), |(max, up, last), &r| (max.max(r as u64), up && r > last, r));
        match u32::try_from(max) {
            Ok(max) => RowIds::Rows { rows: ids.iter().map(|&r| r as u32).collect(), max, increasing },
            // (A negative id reads as past 2^32 here.)
            Err(_) => RowIds::Other(ids.to_vec()),
        }
    }
}

/// `ids` sorted and de-duplicated, each checked to be a row of `rows` (`what` names
/// them in the error). Ids that are many for the rows (more than one in 16) are marked
/// in a bitmap of the rows and read back in order; fewer (a batch's rows of a big
/// table) are radix-sorted as 32-bit rows, in time linear in the ids (10,000 ids of
/// 1 M rows, cold: 44 us, against 72 for the bitmap and 115 for a comparison sort);
/// under 512 ids they are sorted in place.
pub(super) fn sorted_rows(ids: RowIds, rows: usize, what: &dyn Fn() -> String) -> Result<Vec<i64>> {
    let out_of_range =
        |bad: i64| Error::invalid_argument(format!("{}: row {bad} is out of range for {rows} rows", what()));
    let (mut ids, max, increasing) = match ids {
        RowIds::Rows { rows, max, increasing } => (rows, max, increasing),
        RowIds::Other(mut ids) => {
            if let Some(&bad) = ids.iter().find(|&&r| r < 0 || r as u64 >= rows as u64) {
                return Err(out_of_range(bad));
            }
            // Rows past 2^32: few ids of a table that big.
            ids.sort_unstable();
            ids.dedup();
            return Ok(ids);
        }
    };
    if u64::from(max) >= rows as u64 {
        let bad = ids.iter().find(|&&r| u64::from(r) >= rows as u64).map_or(0, |&r| i64::from(r));
        return Err(out_of_range(bad));
    }
    // (`rows` >= 1 here: every id is below it; and the ids' rows fit in 32 bits.)
    let sparse = ids.len() <= rows / 16;
    if !increasing {
        if sparse && ids.len() >= 512 {
            ids = radix_sorted(ids, rows.min(1 << 32));
        } else if sparse {
            ids.sort_unstable();
            ids.dedup();
        } else {
            return Ok(bitmap_sorted(&ids, rows));
        }
    }
    Ok(ids.into_iter().map(i64::from).collect())
}

/// `ids` (rows of `rows`) sorted and de-duplicated through a bitmap of the rows.
fn bitmap_sorted(ids: &[u32], rows: usize) -> Vec<i64> {
    let mut marks = vec![0u64; rows.div_ceil(64)];
    for &r in ids {
        marks[r as usize / 64] |= 1 << (r % 64);
    }
    let mut sorted = Vec::with_capacity(ids.len());
    for (w, &word) in marks.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            sorted.push((w * 64) as i64 + i64::from(bits.trailing_zeros()));
            bits &= bits - 1;
        }
    }
    sorted
}

/// `keys` (rows of `rows`, at most 2^32 of them) sorted and de-duplicated by a radix
/// sort, least significant digit first, in as few passes of up to 11 bits as the rows'
/// bits need.
fn radix_sorted(mut keys: Vec<u32>, rows: usize) -> Vec<u32> {
    let bits = usize::BITS - (rows.max(2) - 1).leading_zeros();
    let passes = bits.div_ceil(11);
    let width = bits.div_ceil(passes);
    let mask = (1usize << width) - 1;
    let mut spare = vec![0u32; keys.len()];
    let mut starts = vec![0usize; mask + 1];
    for pass in 0..passes {
        let shift = pass * width;
        let digit = |k: u32| (k >> shift) as usize & mask;
        starts.fill(0);
        for &k in &keys {
            starts[digit(k)] += 1;
        }
        let mut sum = 0;
        for s in &mut starts {
            (*s, sum) = (sum, sum + *s);
        }
        for &k in &keys {
            let d = digit(k);
            spare[starts[d]] = k;
            starts[d] += 1;
        }
        std::mem::swap(&mut keys, &mut spare);
    }
    keys.dedup();
    keys
}

/// Appends `rsp`'s rows among `rows` to `out` as they cross between workers: the number
/// of rows, the indices, then the rows' bytes. Returns the number of rows.
pub(super) fn encode_rows_in(rsp: &RowSparse, rows: Range<usize>, out: &mut Vec<u8>) -> Result<usize> {
    let ids = rsp.indices();
    let (from, to) = (ids.partition_point(|&i| i < rows.start as i64), ids.partition_point(|&i| i < rows.end as i64));
    out.extend_from_slice(&((to - from) as u64).to_le_bytes());
    for &i in &ids[from..to] {
        out.extend_from_slice(&i.to_le_bytes());
    }
    let each = rsp.row_len() * rsp.dtype().size();
    out.extend_from_slice(&rsp.data().read()?.bytes()[from * each..to * each]);
    Ok(to - from)
}

/// The next row-sparse array of `shape` and `dtype` of a worker's bytes (see
/// [`encode_rows_in`]), which `bytes` moves past, its rows numbered from `base` (each
/// index less `base`).
pub(super) fn decode_rows(bytes: &mut &[u8], shape: &[usize], dtype: DType, base: i64) -> Result<RowSparse> {
    let bad = || Error::Internal("a row-sparse push: a worker's rows are cut short".into());
    let mut take = |n: usize| -> Result<&[u8]> {
        if bytes.len() < n {
            return Err(bad());
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    };
    let n = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad())?) as usize;
    let indices: Vec<i64> = take(n.checked_mul(8).ok_or_else(bad)?)?
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()) - base)
        .collect();
    let data_shape = [&[n][..], &shape[1..]].concat();
    let data = NDArray::zeros_with(&data_shape, dtype, Context::default())?;
    let len = data.size() * dtype.size();
    data.write()?.bytes_mut().copy_from_slice(take(len)?);
    RowSparse::new(data, indices, shape)
}

/// The step name of a row-sparse push under `dist_sync` (desync detection).
const PUSH_ROWS: &str = "push_row_sparse";

impl Store {
    /// Marks key `entry` row-sparse (its value is dense either way).
    pub(super) fn mark_row_sparse(&self, entry: &Arc<Entry>) -> Result<()> {
        let held = Held::new("init", self, &[entry])?;
        held.write("init", &[entry])?[0].row_sparse = true;
        Ok(())
    }

    /// Key `entry`'s storage type.
    pub(super) fn stype_of(&self, entry: &Arc<Entry>) -> Result<StorageType> {
        let held = Held::new("stype", self, &[entry])?;
        Ok(match held.read("stype", &[entry])?[0].row_sparse {
            true => StorageType::RowSparse,
            false => StorageType::Default,
        })
    }

    pub(super) fn pull_rows(&self, entry: &Arc<Entry>, row_ids: RowIds) -> Result<RowSparse> {
        let store = self;
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
        // Many rows: over the comm's pool. Each row of a big table is a cache and
        // TLB miss, and more threads wait on more of them at once (10,000 rows of
        // 256 B from a 256 MB table, cold: 770 us on one thread of a 2-core
        // machine, 460 on two).
        let pool = store.comm.pool().filter(|_| ids.len() >= SPLIT_ROWS);
        // The rows, copied once, into new memory (rows of 64 B to 4 KiB) or into a
        // zeroed buffer.
        let gathered = match pool {
            Some(pool) => pool.install(|| slot.value.gathered_rows(&ids, rl, &data_shape, Some(PIECE_ROWS)))?,
            None => slot.value.gathered_rows(&ids, rl, &data_shape, None)?,
        };
        if let Some(data) = gathered {
            return RowSparse::of_checked_rows(data, ids, &shape);
        }
        let data = NDArray::zeros_with(&data_shape, slot.value.dtype(), Context::default())?;
        if rl > 0 {
            with_dtype!(slot.value.dtype(), T => slot.value.with_data(|v: &[T]| {
                data.with_data_mut(|d: &mut [T]| {
                    let gather = |d: &mut [T], ids: &[i64]| {
                        for (o, &r) in d.chunks_exact_mut(rl).zip(ids) {
                            o.copy_from_slice(&v[r as usize * rl..(r as usize + 1) * rl]);
                        }
                    };
                    match pool {
                        Some(pool) => pool.install(|| {
                            d.par_chunks_mut(rl * PIECE_ROWS)
                                .zip(ids.par_chunks(PIECE_ROWS))
                                .for_each(|(d, ids)| gather(d, ids));
                        }),
                        _ => gather(d, &ids),
                    }
                })
            })??);
        }
        RowSparse::of_checked_rows(data, ids, &shape)
    }
}

impl Store {
    /// A row-sparse push under `dist_sync`, in call order: the workers compare their
    /// calls (desync detection), each sums its own values per key, the sums cross as
    /// their rows and indices (every worker's reaching every worker), and each worker
    /// sums them in rank order, row by row, and merges that sum as a local row-sparse
    /// push does. Every worker gets the same bits.
    pub(super) fn push_rows_across(&self, pushes: &[(Key, Vec<RowSparse>)]) -> Result<()> {
        if self.collective.is_none() {
            return Err(Error::Internal("push_rows_across on a store of one worker".into()));
        }
        // What the call gives per key, for the comparison: the first value's shape.
        let mut firsts: Vec<(&Key, &[usize], DType)> = Vec::new();
        for (key, values) in pushes {
            if !firsts.iter().any(|(k, ..)| *k == key) {
                let (shape, dtype) = values.first().map_or((&[][..], DType::F32), |v| (v.shape(), v.dtype()));
                firsts.push((key, shape, dtype));
            }
        }
        let (local, plan) = match RowsPlan::new(self, pushes) {
            Ok(plan) => (plan.checked.clone(), plan),
            Err(e) => (Err(e), RowsPlan { keys: Vec::new(), checked: Ok(()) }),
        };
        self.check_step(PUSH_ROWS, &firsts, local)?;
        let sums = plan
            .keys
            .iter()
            .map(|(_, values)| RowSparse::sum(&values.iter().collect::<Vec<_>>()))
            .collect::<Result<Vec<_>>>()?;
        let keys: Vec<&Arc<Entry>> = plan.keys.iter().map(|(e, _)| e).collect();
        let all = self.send_rows(&keys, &sums)?;
        let mut readers: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        let mut totals = Vec::with_capacity(sums.len());
        for entry in keys {
            let parts = self.received_rows(entry, &mut readers)?;
            totals.push((Arc::clone(entry), vec![RowSparse::sum(&parts.iter().collect::<Vec<_>>())?]));
        }
        self.push_rows(&RowsPlan { keys: totals, checked: Ok(()) })
    }

    /// `push_row_sparse`'s work, its keys' earlier calls done, its plan checked: the
    /// plan's keys locked together, in index order, then each key's values summed and
    /// merged in turn (an updater's error stops the call at its key: the keys before
    /// it keep their update). A table whose rows live on their owners (`rows.rs`) comes
    /// with this worker's rows only, numbered from its first, and is updated here alone;
    /// every worker stops at a table whose update failed on any owner.
    pub(super) fn push_rows(&self, plan: &RowsPlan) -> Result<()> {
        const OP: &str = "push";
        let entries = plan.entries();
        let held = Held::new(OP, self, &entries)?;
        let merger = held.merger_read(OP, &self.merger)?;
        let mut guards = held.write(OP, &entries)?;
        let on_owners: Vec<bool> = plan.keys.iter().map(|(e, _)| e.owner.holds_rows()).collect();
        let with_tables = on_owners.contains(&true);
        // Under dist_sync with owners, each key's ranges (every worker's elements): this
        // worker updates its own, then the owners' new values reach every worker.
        let ranges = match &*merger {
            Merger::Optimizer(runtime) => {
                self.owned_ranges(runtime, plan.keys.iter().map(|(e, _)| (e.owner, e.shape().iter().product())))
            }
            _ => None,
        };
        // Every key's weight can take the optimizer before any key changes; a table
        // split across its owners takes a built-in rule that updates parts alike.
        for ((entry, _), slot) in plan.keys.iter().zip(guards.iter()) {
            let Merger::Optimizer(runtime) = &*merger else { continue };
            runtime.check_weight(&entry.key, &slot.value)?;
            runtime.check_count(&entry.key, slot.opt.as_ref())?;
            if entry.owner.holds_rows() && entry.owner.split && !runtime.updates_in_parts() {
                return Err(Error::Unsupported {
                    what: format!("push_row_sparse of key \"{}\" with optimizer {}", entry.key, runtime.name()),
                    hint: "its trust ratios need the whole table, whose rows are split across the ranks' owners: \
                           use another optimizer (sgd, adam, ...), or make the store with layout replicated"
                        .to_string(),
                });
            }
        }
        // A key that fails stops the call there (the keys before it keep their update);
        // with owners, the parts updated still reach every worker.
        let mut failed = None;
        for (j, ((entry, values), slot)) in plan.keys.iter().zip(guards.iter_mut()).enumerate() {
            let slot = &mut **slot;
            let key = &entry.key;
            // (Every value was checked against the key by its plan: a key's shape and
            // dtype never change.)
            let refs: Vec<&RowSparse> = values.iter().collect();
            let merged = RowSparse::sum(&refs).and_then(|sum| match &*merger {
                Merger::Assign => {
                    sum.assign_to(&slot.value)?;
                    slot.row_sparse = true;
                    Ok(())
                }
                Merger::Optimizer(runtime) => {
                    let part = match (&ranges, on_owners[j]) {
                        (Some(r), false) => r[j][self.rank()].clone(),
                        _ => 0..slot.value.size(),
                    };
                    match runtime.lazy_for(&slot.value) {
                        true => runtime.update_rows_part(key, &slot.value, &sum, &mut slot.opt, part),
                        false => runtime.update_part(key, &slot.value, &sum.to_dense()?, &mut slot.opt, part),
                    }
                }
                // A table on owners: each owner runs the updater on its rows (MXNet's
                // servers did on theirs), a worker holding none does not.
                Merger::Custom(_) if on_owners[j] && slot.value.shape()[0] == 0 => Ok(()),
                Merger::Custom(updater) => {
                    // On a copy, swapped in when the updater succeeded (as dense pushes do).
                    let work = slot.value.deep_copy()?;
                    let grad = sum.to_dense()?;
                    crate::ndarray::as_user_code(|| updater.update(key, entry.index, &grad, &work))?;
                    slot.value = work;
                    Ok(())
                }
            });
            // A table's update ran on its owners alone: in a call with a table, every
            // worker hears whether each key's update went through, and all stop at a key
            // that failed anywhere (so all make the same exchanges).
            let merged = match with_tables {
                true => self.agree_on_rows(key, merged),
                false => merged,
            };
            if let Err(e) = merged {
                failed = Some(e);
                break;
            }
        }
        if let (Some(ranges), Some(group)) = (&ranges, &self.collective) {
            let (values, ranges): (Vec<&NDArray>, Vec<_>) = guards
                .iter()
                .zip(ranges)
                .zip(&on_owners)
                .filter(|(_, on_owners)| !**on_owners)
                .map(|((g, r), _)| (&g.value, r.clone()))
                .unzip();
            group.all_gather_parts("a row-sparse push: the owners' values", &values, &ranges)?;
        }
        failed.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::radix_sorted;

    #[test]
    fn radix_sorted_ids_are_the_sorted_distinct_ids_for_every_table_size() {
        // One, two and three passes of digits; digits that split unevenly.
        let mut state = 7u64;
        for rows in [1usize, 2, 3, 1000, 2048, 2049, 1 << 20, (1 << 22) + 5, 1 << 31, 1 << 32] {
            for n in [0usize, 1, 600, 5000] {
                let ids: Vec<i64> = (0..n)
                    .map(|i| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        match i % 7 {
                            0 => 0,
                            1 => rows as i64 - 1,
                            _ => ((state >> 20) % rows as u64) as i64,
                        }
                    })
                    .collect();
                let mut want = ids.clone();
                want.sort_unstable();
                want.dedup();
                let keys = ids.iter().map(|&r| r as u32).collect();
                let got: Vec<i64> = radix_sorted(keys, rows).into_iter().map(i64::from).collect();
                assert_eq!(got, want, "{n} ids of {rows} rows");
            }
        }
    }
}
