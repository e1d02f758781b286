//! The store's side of `dist_sync` owners (`layout.rs`): where a new key goes, this
//! worker's part of a key's state, and every key's whole state gathered from its owners
//! for a checkpoint or a state file; and what the store holds on this worker
//! (`Stats::held`).

use std::ops::Range;
use std::sync::Arc;

use super::data::{Entry, Slot, Store};
use super::layout::{Balance, Layout, Owner};
use super::stats::HeldBytes;
use crate::collective::Collective;
use crate::context::Context;
use crate::error::Result;
use crate::ndarray::NDArray;
use crate::optimizer::{KeyState, Runtime};

impl Store {
    /// The worker group of a store whose optimizer state lives on owners.
    fn owners_group(&self) -> Option<&Arc<dyn Collective>> {
        self.collective.as_ref().filter(|_| self.layout == Layout::Owners)
    }

    /// Under owners, each of a call's keys' ranges (every worker's elements of it, from
    /// its owner and number of elements), split in parts where `runtime`'s rule updates
    /// parts alike (not LAMB and LARS, whose trust ratios need the whole key's norms);
    /// `None` for a store without owners.
    pub(super) fn owned_ranges(
        &self,
        runtime: &Runtime,
        keys: impl Iterator<Item = (Owner, usize)>,
    ) -> Option<Vec<Vec<Range<usize>>>> {
        self.ranges_of(keys, runtime.updates_in_parts())
    }

    /// [`Store::owned_ranges`] of keys each updated whole by its whole owner (a custom
    /// updater's keys).
    pub(super) fn whole_owned_ranges(
        &self,
        keys: impl Iterator<Item = (Owner, usize)>,
    ) -> Option<Vec<Vec<Range<usize>>>> {
        self.ranges_of(keys, false)
    }

    fn ranges_of(&self, keys: impl Iterator<Item = (Owner, usize)>, in_parts: bool) -> Option<Vec<Vec<Range<usize>>>> {
        let group = self.owners_group()?;
        Some(keys.map(|(owner, n)| owner.ranges(n, group.size(), in_parts)).collect())
    }

    /// The owner of a key made now with `value`, its bytes counted in `balance` (the
    /// table's, or a copy of it to foresee where keys will go).
    pub(super) fn place(&self, balance: &mut Balance, value: &NDArray) -> Owner {
        match self.owners_group() {
            Some(group) => balance.place(value.size(), value.dtype().size(), group.size(), self.bound),
            None => Owner::NONE,
        }
    }

    /// This worker's elements (flat) of a key of `n` elements owned by `owner`, under
    /// owners with `runtime`'s rule; `None` for a store without owners.
    pub(super) fn own_range(&self, owner: Owner, n: usize, runtime: &Runtime) -> Option<Range<usize>> {
        let group = self.owners_group()?;
        Some(owner.ranges(n, group.size(), runtime.updates_in_parts())[group.rank()].clone())
    }

    /// `state`, the whole state of a key of `n` elements owned by `owner` (loaded from
    /// a file), cut to this worker's part under owners (as it is without).
    pub(super) fn own_part(&self, owner: Owner, n: usize, runtime: &Runtime, state: KeyState) -> Result<KeyState> {
        let Some(part) = self.own_range(owner, n, runtime) else { return Ok(state) };
        // (A state that does not fit the key is left whole, for the caller's checks to
        // refuse.)
        if part == (0..n) || state.states.iter().chain(&state.master).any(|a| a.size() != n) {
            return Ok(state);
        }
        let cut = |a: &NDArray| a.flat_part(part.clone());
        Ok(KeyState {
            count: state.count,
            states: state.states.iter().map(cut).collect::<Result<_>>()?,
            master: state.master.as_ref().map(cut).transpose()?,
        })
    }

    /// Under owners, the whole state of each of `keys` that has one, every worker's
    /// part gathered from it (on every worker: each calls it at the same point, with
    /// the same keys); `None` for a store without owners, whose slots hold whole
    /// states. What a checkpoint and a saved state file hold.
    ///
    /// # Errors
    /// The group's, or an allocation's.
    pub(super) fn whole_states(
        &self,
        runtime: &Runtime,
        keys: &[(&Entry, &Slot)],
    ) -> Result<Option<Vec<Option<KeyState>>>> {
        let Some(group) = self.owners_group() else { return Ok(None) };
        let (size, rank, in_parts) = (group.size(), group.rank(), runtime.updates_in_parts());
        let mut whole = Vec::with_capacity(keys.len());
        let mut ranges = Vec::new();
        for (entry, slot) in keys {
            let Some(st) = &slot.opt else {
                whole.push(None);
                continue;
            };
            let each = entry.owner.ranges(entry.size(), size, in_parts);
            let mine = each[rank].clone();
            // Each array of the state at its whole size, this worker's part in place.
            let widen = |part: &NDArray| -> Result<NDArray> {
                let w = NDArray::zeros_with(entry.shape(), part.dtype(), Context::default())?;
                let b = part.dtype().size();
                w.write()?.bytes_mut()[mine.start * b..mine.end * b].copy_from_slice(part.read()?.bytes());
                Ok(w)
            };
            let state = KeyState {
                count: st.count,
                states: st.states.iter().map(widen).collect::<Result<_>>()?,
                master: st.master.as_ref().map(widen).transpose()?,
            };
            ranges.extend(std::iter::repeat_n(each, state.states.len() + usize::from(state.master.is_some())));
            whole.push(Some(state));
        }
        let arrays: Vec<&NDArray> = whole.iter().flatten().flat_map(|st| st.states.iter().chain(&st.master)).collect();
        group.all_gather_parts("the owners' optimizer states", &arrays, &ranges)?;
        Ok(Some(whole))
    }
}

impl Store {
    /// The bytes this store holds on this worker ([`HeldBytes`]), with those of a
    /// `dist_async` worker's share. A key a call holds is waited for, unless this
    /// thread holds keys itself (an updater asking): such a key is then left out.
    pub(super) fn held_bytes(&self) -> HeldBytes {
        let bytes = |a: &NDArray| (a.size() * a.dtype().size()) as u64;
        let floats = |v: &[Vec<f32>]| v.iter().map(|r| (r.len() * 4) as u64).sum::<u64>();
        let may_wait = !super::locks::holds_any_keys();
        // A slot's spare is a custom updater's copy of the value, else (with owners) the
        // whole local sum of a key pushed with several values.
        let spare_is_value = match self.merger.try_read() {
            Some(m) => matches!(&*m, super::data::Merger::Custom(_)),
            None => false,
        };
        let mut held = HeldBytes::default();
        for entry in self.entries() {
            let slot = match may_wait {
                true => entry.value.read(),
                false => match entry.value.try_read() {
                    Some(slot) => slot,
                    None => continue,
                },
            };
            let spare = slot.spare.as_ref().map_or(0, bytes);
            let (spare_value, spare_buffer) = if spare_is_value { (spare, 0) } else { (0, spare) };
            held.values += bytes(&slot.value) + spare_value;
            held.state += slot.opt.as_ref().map_or(0, |st| st.states.iter().chain(&st.master).map(bytes).sum());
            held.buffers += slot.merge.as_ref().map_or(0, bytes)
                + spare_buffer
                + floats(&slot.residuals)
                + floats(&slot.residual_spares);
        }
        if let Some(remote) = &self.remote {
            let share = remote.share().held_bytes();
            held.values += share.values;
            held.state += share.state;
            held.buffers += share.buffers;
        }
        held
    }
}
