//! Row-sparse tables whose rows live on their owners (`dist_sync` with owners,
//! `Owner::holds_rows`): a table under the big-array bound lives whole on one rank, a
//! bigger one in MXNet's contiguous parts of its rows, one per rank; a rank's slot holds
//! its rows only (`[its rows, ...]`, and their optimizer state), as MXNet's servers held
//! them. `init_row_sparse` sends rank 0's rows to their owners; a row-sparse push sends
//! each worker's summed rows to their owners, which sum them in rank order (the bits of
//! every other layout) and update them; `row_sparse_pull` asks the owners for the rows;
//! a dense pull gathers the whole table from them.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::agree::{Said, ranks};
use super::data::{Entry, Slot, Store, Table};
use super::layout::Owner;
use super::locks::Held;
use super::sparse::{RowIds, decode_rows, encode_rows_in, sorted_rows};
use crate::backend::Collective;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::{NDArray, RowSparse, row_len};

impl Store {
    /// Each rank's rows of `entry`, a table whose rows live on their owners; `None` for
    /// any other key (its value whole on every rank).
    pub(super) fn rows_of(&self, entry: &Entry) -> Option<Vec<Range<usize>>> {
        let group = self.collective.as_ref().filter(|_| entry.owner.holds_rows())?;
        Some(entry.owner.rows(entry.shape()[0], group.size()))
    }

    /// Whether a table of `shape` may keep its rows on their owners: the store's
    /// layout says so, and a row holds 1 to 2^32 - 1 elements.
    fn may_hold_rows(&self, shape: &[usize]) -> bool {
        self.rows_on_owners
            && self.collective.is_some()
            && !shape.is_empty()
            && u32::try_from(row_len(shape)).is_ok_and(|n| n > 0)
    }

    /// `init_row_sparse` of tables whose rows live on their owners, in call order: the
    /// workers compare the call, rank 0 sends each owner its rows of each table, and each
    /// worker adds the keys, holding its rows only. `None` when one of the tables cannot
    /// (its rows empty), for the replicated way; every worker decides alike (shapes).
    pub(super) fn init_rows(&self, keys: &[Key], values: &[RowSparse]) -> Option<Result<()>> {
        if !values.iter().all(|v| self.may_hold_rows(v.shape())) {
            return None;
        }
        Some(self.init_rows_now(keys, values))
    }

    fn init_rows_now(&self, keys: &[Key], values: &[RowSparse]) -> Result<()> {
        const OP: &str = "init";
        let group = self.rows_group(OP)?;
        let _span = self.counters.span(OP, keys.len(), keys.first());
        let _held = Held::new(OP, self, &[])?;
        let pairs: Vec<(Key, &NDArray)> = keys.iter().cloned().zip(values.iter().map(RowSparse::data)).collect();
        let checked = self.check_init(OP, &pairs);
        let step: Vec<super::steps::StepKey<'_>> =
            keys.iter().zip(values).map(|(k, v)| (k, v.shape(), v.dtype())).collect();
        self.check_step(OP, &step, checked)?;
        // Where each table goes, as every worker computes it.
        let balance_before = self.table.read().balance.clone();
        let mut balance = balance_before.clone();
        let size = group.size();
        let owners: Vec<_> = values
            .iter()
            .map(|v| {
                let (rows, each) = (v.shape()[0], row_len(v.shape()) as u32);
                balance.place_rows(rows, each, v.dtype().size(), size, self.bound)
            })
            .collect();
        // Rank 0's rows to their owners.
        let mut sends = vec![Vec::new(); size];
        if group.rank() == 0 {
            for (v, owner) in values.iter().zip(&owners) {
                for (d, rows) in owner.rows(v.shape()[0], size).into_iter().enumerate() {
                    encode_rows_in(v, rows, &mut sends[d])?;
                }
            }
        }
        let got = group.all_to_all("init: rank 0's rows to their owners", &sends)?;
        let mut from_first: &[u8] = &got[0];
        let mut slots = Vec::with_capacity(values.len());
        for (v, owner) in values.iter().zip(&owners) {
            let mine = owner.rows(v.shape()[0], size)[group.rank()].clone();
            let local = [&[mine.len()][..], &v.shape()[1..]].concat();
            let value = NDArray::zeros_with(&local, v.dtype(), Context::default())?;
            decode_rows(&mut from_first, &local, v.dtype(), mine.start as i64)?.assign_to(&value)?;
            slots.push(value);
        }
        let mut table = self.table.write();
        if let Some(k) = keys.iter().find(|k| table.contains_key(k)) {
            return Err(Self::already(OP, k));
        }
        if table.balance != balance_before {
            return Err(Error::Internal("init: the keys' owners changed during the call".into()));
        }
        for ((key, value), v) in keys.iter().zip(slots).zip(values) {
            let order = table.take_order();
            let mut slot = Slot::new(value, order);
            slot.row_sparse = true;
            self.add_table(&mut table, key.clone(), slot, v.shape())?;
        }
        drop(table);
        group.barrier()
    }

    /// The owner of a key a checkpoint brings, `value` its whole value (row-sparse in
    /// the file or not), counted in `balance` (a copy of the table's): a row-sparse one
    /// is a table on owners where the store keeps them.
    pub(super) fn place_loaded(
        &self,
        balance: &mut super::layout::Balance,
        value: &NDArray,
        row_sparse: bool,
    ) -> Owner {
        match (row_sparse && self.may_hold_rows(value.shape()), &self.collective) {
            (true, Some(group)) => {
                let (rows, each) = (value.shape()[0], row_len(value.shape()) as u32);
                balance.place_rows(rows, each, value.dtype().size(), group.size(), self.bound)
            }
            _ => self.place(balance, value),
        }
    }

    /// `value`, a key's whole value, as its slot holds it: a table on owners' rows of
    /// this worker (`[its rows, ...]`), any other key's whole.
    pub(super) fn own_rows(&self, owner: Owner, value: NDArray) -> Result<NDArray> {
        let Some(group) = self.collective.as_ref().filter(|_| owner.holds_rows()) else { return Ok(value) };
        let shape = value.shape().to_vec();
        let mine = owner.rows(shape[0], group.size())[group.rank()].clone();
        let each = row_len(&shape) * value.dtype().size();
        let local = NDArray::zeros_with(&[&[mine.len()][..], &shape[1..]].concat(), value.dtype(), value.context())?;
        local.write()?.bytes_mut().copy_from_slice(&value.read()?.bytes()[mine.start * each..mine.end * each]);
        Ok(local)
    }

    /// Adds key `key`, a table on owners of `shape` whose slot holds this worker's rows,
    /// under the table's write lock, placed where every worker places it.
    pub(super) fn add_table(&self, table: &mut Table, key: Key, slot: Slot, shape: &[usize]) -> Result<()> {
        let group = self.rows_group("a table on owners")?;
        let (rows, each) = (shape[0], row_len(shape) as u32);
        let owner = table.balance.place_rows(rows, each, slot.value.dtype().size(), group.size(), self.bound);
        let entry = Entry::of_shape(key, table.entries.len(), slot, owner, shape);
        self.insert_entry(table, entry);
        self.holds_rows.store(true, Ordering::Release);
        Ok(())
    }

    /// The store's worker group, for `op` on a table whose rows live on their owners.
    fn rows_group(&self, op: &str) -> Result<Arc<dyn Collective>> {
        self.collective.clone().ok_or_else(|| Error::Internal(format!("{op}: rows on owners without workers")))
    }

    /// The rows `row_ids` of `entry`, a table whose rows live on their owners, in call
    /// order: the workers compare the call, each asks each owner for its rows among
    /// those it wants, and each owner answers with them. Only the rows asked for and
    /// their ids cross.
    pub(super) fn pull_rows_across(&self, entry: &Arc<Entry>, row_ids: RowIds) -> Result<RowSparse> {
        const OP: &str = "row_sparse_pull";
        let group = self.rows_group(OP)?;
        let (shape, dtype) = (entry.shape().to_vec(), entry.dtype);
        let what = || format!("row_sparse_pull of key \"{}\": the row ids", entry.key);
        let ids = sorted_rows(row_ids, shape[0], &what);
        let local = ids.as_ref().map(|_| ()).map_err(Clone::clone);
        let failed = self.failed_here(self.check_step(OP, &[(&entry.key, &shape, dtype)], local))?;
        // (A worker that failed here asks for no row.)
        let ids = ids.ok().filter(|_| failed.is_none()).unwrap_or_default();
        let rows = self.rows_of(entry).ok_or_else(|| Error::Internal(format!("{OP}: not a table on owners")))?;
        // The ids each owner holds: a run of the sorted ids.
        let asks: Vec<Vec<u8>> = rows
            .iter()
            .map(|r| {
                let (from, to) =
                    (ids.partition_point(|&i| i < r.start as i64), ids.partition_point(|&i| i < r.end as i64));
                ids[from..to].iter().flat_map(|i| i.to_le_bytes()).collect()
            })
            .collect();
        let at = crate::timeline::now();
        let asked = group.all_to_all("row_sparse_pull: the rows asked for", &asks)?;
        let rl = row_len(&shape);
        let each = rl * dtype.size();
        let mine = rows[group.rank()].start;
        let answers = {
            let held = Held::new(OP, self, &[entry])?;
            let guards = held.read(OP, &[entry])?;
            let value = guards[0].value.read()?;
            let bytes = value.bytes();
            asked
                .iter()
                .map(|ids| {
                    let mut out = Vec::with_capacity(ids.len() / 8 * each);
                    for id in ids.chunks_exact(8) {
                        let r = i64::from_le_bytes(id.try_into().unwrap_or_default()) as usize;
                        let at = r.checked_sub(mine).map(|r| r * each).filter(|&at| at + each <= bytes.len());
                        let at =
                            at.ok_or_else(|| Error::Internal(format!("{OP}: asked for row {r}, not held here")))?;
                        out.extend_from_slice(&bytes[at..at + each]);
                    }
                    Ok(out)
                })
                .collect::<Result<Vec<_>>>()?
        };
        let back = group.all_to_all("row_sparse_pull: the rows", &answers)?;
        let rank = group.rank();
        let rows_sent = asked.iter().enumerate().filter(|(r, _)| *r != rank).map(|(_, a)| a.len() / 8).sum();
        let sent = others(rank, &asks) + others(rank, &answers);
        self.moved("rows from owners", at, rows_sent, sent, others(rank, &asked) + others(rank, &back));
        let data_shape = [&[ids.len()][..], &shape[1..]].concat();
        let data = NDArray::zeros_with(&data_shape, dtype, Context::default())?;
        {
            let mut w = data.write()?;
            let out = w.bytes_mut();
            let mut at = 0;
            for rows in &back {
                out.get_mut(at..at + rows.len())
                    .ok_or_else(|| Error::Internal(format!("{OP}: more rows came back than asked for")))?
                    .copy_from_slice(rows);
                at += rows.len();
            }
            if at != out.len() {
                return Err(Error::Internal(format!("{OP}: fewer rows came back than asked for")));
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        RowSparse::of_checked_rows(data, ids, &shape)
    }

    /// A dense pull of tables whose rows live on their owners, each into its outs, in
    /// call order, after the call's other keys were pulled (`rest`, their outcome): the
    /// workers compare the call, and each table is gathered whole from its owners (every
    /// worker takes the same step: a pull of such a table is a call of them all).
    pub(super) fn pull_tables(
        &self,
        op: &'static str,
        pulls: &[(Arc<Entry>, Vec<NDArray>)],
        rest: Result<()>,
    ) -> Result<()> {
        let group = self.rows_group(op)?;
        let step: Vec<super::steps::StepKey<'_>> = pulls.iter().map(|(e, _)| (&e.key, e.shape(), e.dtype)).collect();
        let checked = rest.and_then(|()| {
            pulls.iter().try_for_each(|(e, outs)| {
                outs.iter().try_for_each(|o| {
                    let context = || format!("{op} of key \"{}\"", e.key);
                    super::plan::check_like(context, &e.key, e.like(), (o.shape(), o.dtype()))?;
                    super::plan::check_context(op, &e.key, o)
                })
            })
        });
        let failed = self.failed_here(self.check_step(op, &step, checked))?;
        for (entry, outs) in pulls {
            let whole = NDArray::zeros_with(entry.shape(), entry.dtype, Context::default()).map_err(|e| {
                Error::ResourceExhausted {
                    what: format!("{op} of key \"{}\": the whole table of {} bytes", entry.key, entry.bytes()),
                    detail: format!(
                        "its rows live on their owners, and a dense pull gathers all of them ({e}); \
                         pull the rows you need with row_sparse_pull"
                    ),
                }
            });
            // Every worker takes the gather, or none does.
            let said = Said::exchange(&*group, "a dense pull of a table on owners", &[u8::from(whole.is_ok())])?;
            let short = said.ranks_where(|r| r.first() != Some(&1));
            let whole = whole?;
            if !short.is_empty() {
                return Err(Error::ResourceExhausted {
                    what: format!("{op} of key \"{}\"", entry.key),
                    detail: format!("{} could not hold the whole table", ranks(&short)),
                });
            }
            let parts = {
                let held = Held::new(op, self, &[entry])?;
                let guards = held.read(op, &[entry])?;
                own_rows_in(entry, &*group, &guards[0].value, &whole)?
            };
            group.all_gather_parts("a dense pull of a table on owners", &[&whole], &[parts])?;
            for out in outs.iter().filter(|_| failed.is_none()) {
                out.copy_from(&whole)?;
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The outcome of a step of a call on tables (`stepped`): where the workers compare
    /// their calls, a failure is every worker's (`Err`: the call ends); where they do
    /// not (`compare_calls(false)`), it is this worker's own, which still takes part in
    /// the call's exchanges, so that no worker waits for it (`Ok(Some)`: fail after).
    fn failed_here(&self, stepped: Result<()>) -> Result<Option<Error>> {
        match (stepped, self.compare_calls) {
            (Ok(()), _) => Ok(None),
            (Err(e), true) => Err(e),
            (Err(e), false) => Ok(Some(e)),
        }
    }
}

impl Store {
    /// The whole value of each of `keys` that is a table on owners, gathered from its
    /// owners (on every worker: each calls it at the same point, with the same keys);
    /// `None` where none is. What a checkpoint or a commit not in parts holds.
    ///
    /// # Errors
    /// The group's, or an allocation's.
    pub(super) fn whole_values(&self, keys: &[(&Entry, &Slot)]) -> Result<Option<Vec<Option<NDArray>>>> {
        let Some(group) = self.collective.as_ref().filter(|_| keys.iter().any(|(e, _)| e.owner.holds_rows())) else {
            return Ok(None);
        };
        let mut whole = Vec::with_capacity(keys.len());
        let mut ranges = Vec::new();
        for (entry, slot) in keys {
            if !entry.owner.holds_rows() {
                whole.push(None);
                continue;
            }
            let w = NDArray::zeros_with(entry.shape(), entry.dtype, Context::default())?;
            ranges.push(own_rows_in(entry, &**group, &slot.value, &w)?);
            whole.push(Some(w));
        }
        let arrays: Vec<&NDArray> = whole.iter().flatten().collect();
        group.all_gather_parts("the owners' rows of the tables", &arrays, &ranges)?;
        Ok(Some(whole))
    }

    /// Each worker's sums of a row-sparse push, `sums[j]` of key `keys[j]`, sent to the
    /// workers that need them: a table's rows to their owners alone, every other key's
    /// rows to every worker; what each worker received, in rank order.
    pub(super) fn send_rows(&self, keys: &[&Arc<Entry>], sums: &[RowSparse]) -> Result<Vec<Vec<u8>>> {
        let group = self.rows_group("a row-sparse push")?;
        let (size, at) = (group.size(), crate::timeline::now());
        let mut sends = vec![Vec::new(); size];
        let mut rows_sent = 0;
        for (entry, sum) in keys.iter().zip(sums) {
            match self.rows_of(entry) {
                Some(rows) => {
                    for (d, rows) in rows.into_iter().enumerate() {
                        let n = encode_rows_in(sum, rows, &mut sends[d])?;
                        rows_sent += if d == group.rank() { 0 } else { n };
                    }
                }
                None => {
                    for (d, send) in sends.iter_mut().enumerate() {
                        let n = encode_rows_in(sum, 0..sum.shape()[0], send)?;
                        rows_sent += if d == group.rank() { 0 } else { n };
                    }
                }
            }
        }
        let got = group.all_to_all("a row-sparse push", &sends)?;
        let rank = group.rank();
        self.moved("rows to owners", at, rows_sent, others(rank, &sends), others(rank, &got));
        Ok(got)
    }

    /// The next key's rows from every worker's bytes of [`Store::send_rows`] (which
    /// `readers` move past): for a table on owners, this worker's rows, numbered from
    /// its first (`[its rows, ...]`, as its slot holds them); else the key's rows.
    pub(super) fn received_rows(&self, entry: &Entry, readers: &mut [&[u8]]) -> Result<Vec<RowSparse>> {
        let (shape, base) = match (self.rows_of(entry), &self.collective) {
            (Some(rows), Some(group)) => {
                let mine = rows[group.rank()].clone();
                ([&[mine.len()][..], &entry.shape()[1..]].concat(), mine.start as i64)
            }
            _ => (entry.shape().to_vec(), 0),
        };
        readers.iter_mut().map(|r| decode_rows(r, &shape, entry.dtype, base)).collect()
    }

    /// After the update of `key` in a row-sparse push with a table (`merged`, this
    /// worker's outcome: an owner's update may fail where the others' did not, for its
    /// memory or its updater): every worker hears whether it went through everywhere,
    /// and fails where it did not, naming the ranks where it failed.
    pub(super) fn agree_on_rows(&self, key: &Key, merged: Result<()>) -> Result<()> {
        let group = self.rows_group("a row-sparse push")?;
        let said = Said::exchange(&*group, "a row-sparse push: the owners' update", &[u8::from(merged.is_err())])?;
        merged?;
        let failed = said.ranks_where(|r| r.first() == Some(&1));
        match failed.is_empty() {
            true => Ok(()),
            false => Err(Error::Backend {
                backend: "dist_sync",
                message: format!(
                    "a row-sparse push of key \"{key}\" failed on {} (the error there says why); the keys \
                     before it in the call keep their update, as without owners",
                    ranks(&failed)
                ),
            }),
        }
    }
}

impl Store {
    /// Rows that crossed between the workers since `at`: the bytes this worker sent the
    /// others (rows, ids and counts; its own rows never cross) and received from them,
    /// counted in its stats, and the timeline's event `name` (in `wire`) with them and
    /// the rows it sent.
    fn moved(&self, name: &'static str, at: u64, rows: usize, sent: u64, received: u64) {
        use crate::timeline::{self, Arg};
        self.counters.wire(sent, received);
        if timeline::recording() {
            let args =
                vec![("rows", Arg::U(rows as u64)), ("bytes", Arg::U(sent)), ("received_bytes", Arg::U(received))];
            timeline::complete(name, "wire", at, timeline::now(), args);
        }
    }
}

/// `whole`, an array of table `entry`'s whole shape, with this worker's rows (`rows`,
/// as its slot holds them) in place: returns every worker's elements of it, for the
/// gather of the others'.
fn own_rows_in(entry: &Entry, group: &dyn Collective, rows: &NDArray, whole: &NDArray) -> Result<Vec<Range<usize>>> {
    let each = entry.owner.ranges(entry.size(), group.size(), true);
    let (mine, b) = (&each[group.rank()], entry.dtype.size());
    whole.write()?.bytes_mut()[mine.start * b..mine.end * b].copy_from_slice(rows.read()?.bytes());
    Ok(each)
}

/// The bytes of `all` (one message per worker) but worker `rank`'s.
fn others(rank: usize, all: &[Vec<u8>]) -> u64 {
    all.iter().enumerate().filter(|(r, _)| *r != rank).map(|(_, b)| b.len() as u64).sum()
}
