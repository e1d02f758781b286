//! Merging a push into the stored values: the mergers (assign, a custom updater, an
//! optimizer) and [`Store::apply`], which sums a call's pushed values and hands the sums
//! to the store's merger, then copies the results to the call's outs.

use std::sync::Arc;

use parking_lot::RwLockWriteGuard;

use super::agree;
use super::compression::{Compression, Half, TwoBit};
use super::data::{Entry, Group, Merger, Slot, Store};
use super::locks::Held;
use super::stats::{self, Phase};
use crate::collective::Collective;
use std::ops::Range;

use crate::comm::{BroadcastJob, PushKey, ReduceJob};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;
use crate::optimizer::Runtime;
use crate::timeline::Arg;

impl Merger {
    /// What merges a push's sums, as the workers of a `dist_sync` job compare it (part
    /// of each push's fingerprint: workers that merge alike end with the same values).
    pub(super) fn identity(&self) -> &str {
        match self {
            Merger::Assign => "",
            Merger::Custom(_) => ", with an updater",
            Merger::Optimizer(rt) => rt.identity(),
        }
    }
}

/// A key of a push as summed: its entry, and its values as given or their staged copies.
struct Pushed<'x> {
    entry: &'x Arc<Entry>,
    arrays: &'x [&'x NDArray],
}

/// The keys of a push as the comm sees them: each group with its slot's value and
/// comm buffers (`slots[j]` is the position of `push[j]`'s key in `guards`, ascending).
fn push_keys<'k, 'a>(
    push: &'k [Group<'a>],
    slots: &[usize],
    guards: &'k mut [RwLockWriteGuard<'_, Slot>],
) -> Vec<PushKey<'k, 'a>> {
    let mut wanted = slots.iter().zip(push).peekable();
    let mut keys = Vec::with_capacity(push.len());
    for (i, guard) in guards.iter_mut().enumerate() {
        if let Some(&(&slot, group)) = wanted.peek()
            && slot == i
        {
            let Slot { value, buffers, .. } = &mut **guard;
            keys.push(PushKey { values: &group.arrays, value, buffers });
            wanted.next();
        }
    }
    keys
}

impl Store {
    pub(super) fn replace_merger(&self, op: &'static str, new: Merger) -> Result<()> {
        let held = Held::new(op, self, &[])?;
        let mut merger = held.merger_write(op, &self.merger)?;
        let old = std::mem::replace(&mut *merger, new);
        drop(merger);
        // The old updater is dropped outside the lock (a binding's drop may call back).
        drop(old);
        Ok(())
    }

    pub(super) fn runtime<'m>(op: &str, merger: &'m Merger) -> Result<&'m Arc<Runtime>> {
        match merger {
            Merger::Optimizer(r) => Ok(r),
            _ => Err(Error::invalid_argument(format!("{op}: no optimizer is set: call set_optimizer first"))),
        }
    }

    /// Sums each job's inputs into its out, left to right, then (dist_sync) across the
    /// workers in place: the one way every merger gets a push's sums. Under dist_sync a
    /// single value goes straight into the across-workers sum, with no local copy.
    /// With gradient compression (`across`, one job per pushed key, in order), each
    /// worker's sums cross as 2-bit codes instead ([`Across::sum`]).
    fn sum(&self, jobs: &[ReduceJob<'_>], across: Option<(&mut Across, Vec<&[f32]>)>) -> Result<()> {
        let Some(group) = &self.collective else {
            let _sum = self.counters.phase(Phase::Sum);
            return self.comm.reduce(jobs);
        };
        let sources = self.sum_here(jobs)?;
        let pairs: Vec<(&NDArray, &NDArray)> = sources.into_iter().zip(jobs).map(|(s, j)| (s, j.out)).collect();
        // An allreduce of S bytes over n workers moves 2(n-1)/n S each way (a ring's
        // share, whatever path it takes); a compressed push, each worker's codes to
        // every other (counted by `Across::sum`).
        let bytes = stats::bytes_of(pairs.iter().map(|(_, out)| *out));
        let n = group.size() as u64;
        let _wire = self
            .counters
            .phase(Phase::Wire)
            .with(|| vec![("keys", Arg::U(pairs.len() as u64)), ("bytes", Arg::U(bytes))]);
        match across {
            Some((across, residuals)) => {
                let sent = across.sum(&**group, &pairs, &residuals, self.comm.pool())?;
                self.counters.wire(sent * (n - 1), sent * (n - 1));
                Ok(())
            }
            None => {
                group.allreduce_sum(&pairs)?;
                let moved = 2 * (n - 1) * bytes / n.max(1);
                self.counters.wire(moved, moved);
                Ok(())
            }
        }
    }

    /// The first half of a `dist_sync` push's sums: the jobs with several inputs summed
    /// here into their `out`; what each job sends across the workers (its one input as
    /// it is, with no local copy, or its `out`).
    fn sum_here<'j>(&self, jobs: &'j [ReduceJob<'j>]) -> Result<Vec<&'j NDArray>> {
        let direct = |j: &ReduceJob<'_>| j.inputs.len() == 1;
        let local: Vec<ReduceJob<'_>> =
            jobs.iter().filter(|j| !direct(j)).map(|j| ReduceJob { inputs: j.inputs, out: j.out }).collect();
        if !local.is_empty() {
            let _sum = self.counters.phase(Phase::Sum);
            self.comm.reduce(&local)?;
        }
        Ok(jobs.iter().map(|j| if direct(j) { j.inputs[0] } else { j.out }).collect())
    }

    /// [`Store::sum`] under `dist_sync` with owners: each job's inputs summed here (into
    /// its `out`, when it has several), then across the workers into `dests[j]`, which
    /// holds this worker's range of job `j` only (`parts[j]`, every worker's): a
    /// reduce-scatter, half an allreduce's bytes.
    fn sum_to_owners(&self, jobs: &[ReduceJob<'_>], dests: &[&NDArray], parts: &[Vec<Range<usize>>]) -> Result<()> {
        let Some(group) = &self.collective else {
            return Err(Error::Internal("a push to the owners without a worker group".into()));
        };
        let sources = self.sum_here(jobs)?;
        let pairs: Vec<(&NDArray, &NDArray)> = sources.into_iter().zip(dests).map(|(s, d)| (s, *d)).collect();
        let bytes = stats::bytes_of(pairs.iter().map(|(src, _)| *src));
        let n = group.size() as u64;
        let _wire = self.counters.phase(Phase::Wire).with(|| {
            vec![
                ("collective", Arg::S("reduce-scatter".into())),
                ("keys", Arg::U(pairs.len() as u64)),
                ("bytes", Arg::U(bytes)),
            ]
        });
        group.reduce_scatter_sum(&pairs, parts)?;
        let moved = (n - 1) * bytes / n.max(1);
        self.counters.wire(moved, moved);
        Ok(())
    }

    /// The rest of a push (the sums and the update) and of its pull (the copies), once
    /// every key of the call is locked (`guards`, in index order; `push_slots[j]` is
    /// the position of `push[j]`'s key there) and checked. For the calls of a fused
    /// batch, `calls` says whose each group is: a custom updater's failure then fails
    /// its own call only (any other error fails them all).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &self,
        push: &[Group<'_>],
        pull: &[Group<'_>],
        push_slots: &[usize],
        pull_slots: &[usize],
        guards: &mut [RwLockWriteGuard<'_, Slot>],
        merger: &Merger,
        compression: Option<Compression>,
        mut calls: Option<&mut Calls<'_>>,
    ) -> Result<()> {
        if let Some(remote) = &self.remote {
            return self.apply_remote(&**remote, push, pull, push_slots, pull_slots, guards);
        }
        // The comm's policy, before the sums: where each key lives (`CommDevice` gives
        // a key pushed from devices its device), then what to sum (`CommCpu` sums
        // page-locked host copies of values on devices).
        // Both are about values on devices: a push of host values skips them (and their
        // allocations), as the `Comm` contract allows.
        let from_devices = push.iter().any(|g| g.arrays.iter().any(|a| a.on_device()));
        let staged: Vec<Option<Vec<NDArray>>> = if from_devices {
            let homes = self.comm.place(&mut push_keys(push, push_slots, guards))?;
            for (&i, home) in push_slots.iter().zip(homes) {
                if let Some(home) = home {
                    guards[i].move_to(home)?;
                }
            }
            push_keys(push, push_slots, guards).iter_mut().map(|k| self.comm.stage(k)).collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let staged: Vec<Option<Vec<&NDArray>>> =
            staged.iter().map(|s| s.as_ref().map(|a| a.iter().collect())).collect();
        let push: Vec<Pushed<'_>> = push
            .iter()
            .enumerate()
            .map(|(j, g)| Pushed {
                entry: &g.entry,
                arrays: staged.get(j).and_then(Option::as_deref).unwrap_or(&g.arrays),
            })
            .collect();
        // Gradient compression: the merger sums each value quantised with its key's
        // residual for its position; the new residuals are kept once the call succeeded.
        // Under dist_sync each worker's sum of a key is quantised instead (with one
        // residual per key), and crosses to the others as 2-bit codes (`Across`).
        let mut across = match (compression, &self.collective) {
            (Some(c), Some(_)) => Some(Across::new(c, &push, push_slots, guards)?),
            _ => None,
        };
        let mut quantised: Vec<Option<Quantised>> = match compression.filter(|_| self.collective.is_none()) {
            Some(Compression::TwoBit(c)) => push
                .iter()
                .zip(push_slots)
                .map(|(g, &i)| {
                    let Slot { residuals, residual_spares, .. } = &mut *guards[i];
                    quantise(c, g.arrays, residuals, residual_spares).map(Some)
                })
                .collect::<Result<_>>()?,
            // (A device store takes no other compression.)
            _ => Vec::new(),
        };
        let quantised_refs: Vec<Option<Vec<&NDArray>>> =
            quantised.iter().map(|q| q.as_ref().map(|q| q.values.iter().collect())).collect();
        let push: Vec<Pushed<'_>> = push
            .into_iter()
            .enumerate()
            .map(|(j, g)| match quantised_refs.get(j).and_then(Option::as_deref) {
                Some(arrays) => Pushed { entry: g.entry, arrays },
                None => g,
            })
            .collect();
        match merger {
            Merger::Assign => {
                let jobs: Vec<ReduceJob<'_>> = push
                    .iter()
                    .zip(push_slots)
                    .map(|(g, &i)| ReduceJob { inputs: g.arrays, out: &guards[i].value })
                    .collect();
                self.sum(&jobs, across.as_mut().map(|a| (a, residuals_of(guards, push_slots))))?;
                crate::ndarray::values_read();
            }
            Merger::Optimizer(runtime) => {
                for (g, &i) in push.iter().zip(push_slots) {
                    runtime.check_weight(&g.entry.key, &guards[i].value)?;
                    runtime.check_count(&g.entry.key, guards[i].opt.as_ref())?;
                }
                // With owners, each key's ranges: every worker's elements of it, and
                // this worker updates its own only (`kvstore/layout.rs`).
                let parts = self.owned_ranges(
                    runtime,
                    push.iter().zip(push_slots).map(|(g, &i)| (g.entry.owner, guards[i].value.size())),
                );
                let mine = |j: usize| parts.as_ref().map(|p| p[j][self.rank()].clone());
                // Their sums reach the owners alone, unless compressed (every worker then
                // adds up every worker's codes).
                let scatter = parts.is_some() && across.is_none();
                // Several values of a key are summed into the key's merge buffer first;
                // a single value is read where it is (no copy: the store keeps nothing
                // of it).
                // dist_sync sums across the workers in the merge buffers, so every key
                // uses one: with owners, of this worker's part only, the values summed
                // here first into the key's spare (whole).
                let merged = |g: &Pushed<'_>| g.arrays.len() > 1 || self.collective.is_some();
                for (j, (g, &i)) in push.iter().zip(push_slots).enumerate() {
                    let slot = &mut *guards[i];
                    let v = &slot.value;
                    let size = mine(j).filter(|_| scatter).map_or(v.size(), |p| p.len());
                    if merged(g) && slot.merge.as_ref().is_none_or(|m| m.size() != size) {
                        slot.merge = Some(match size == v.size() {
                            true => NDArray::zeros_with(v.shape(), v.dtype(), v.context())?,
                            false => NDArray::zeros_with(&[size], v.dtype(), v.context())?,
                        });
                    }
                    if scatter && g.arrays.len() > 1 && slot.spare.is_none() {
                        slot.spare = Some(NDArray::zeros_with(v.shape(), v.dtype(), v.context())?);
                    }
                }
                // Every key's state exists before any key is updated: a state that
                // cannot be made (out of memory) fails the call with no key changed.
                // Updates go in the keys' order (that of the run a checkpoint resumed,
                // else of `init`): a schedule and NAdam's momentum depend on it. Keys are
                // locked in index order, which is the same unless a load reordered them.
                // The calls of a fused batch update their keys call after call, as
                // they would one by one.
                let call_of = |j: usize| calls.as_ref().map_or(0, |c| c.push[j]);
                let place = |j: usize| (call_of(j), guards[push_slots[j]].order);
                let mut updates: Vec<usize> = (0..push.len()).collect();
                if updates.windows(2).any(|w| place(w[0]) > place(w[1])) {
                    updates.sort_by_key(|&j| place(j));
                }
                let mut created = Vec::new();
                for (j, &i) in push_slots.iter().enumerate() {
                    let slot = &mut *guards[i];
                    if slot.opt.is_none() {
                        let part = mine(j).unwrap_or(0..slot.value.size());
                        match runtime.new_state_part(&slot.value, part) {
                            Ok(st) => {
                                slot.opt = Some(st);
                                created.push(i);
                            }
                            Err(e) => {
                                for &j in &created {
                                    guards[j].opt = None;
                                }
                                return Err(e);
                            }
                        }
                    }
                }
                match (&parts, scatter) {
                    (Some(parts), true) => {
                        let jobs: Vec<ReduceJob<'_>> = push
                            .iter()
                            .zip(push_slots)
                            .map(|(g, &i)| {
                                let slot = &guards[i];
                                let out = slot.spare.as_ref().filter(|_| g.arrays.len() > 1).or(slot.merge.as_ref());
                                out.map(|out| ReduceJob { inputs: g.arrays, out })
                            })
                            .collect::<Option<_>>()
                            .ok_or_else(|| Error::Internal("push: no merge buffer".into()))?;
                        let dests: Vec<&NDArray> = push_slots
                            .iter()
                            .map(|&i| guards[i].merge.as_ref())
                            .collect::<Option<_>>()
                            .ok_or_else(|| Error::Internal("push: no merge buffer".into()))?;
                        self.sum_to_owners(&jobs, &dests, parts)?;
                    }
                    _ => {
                        let jobs: Vec<ReduceJob<'_>> = push
                            .iter()
                            .zip(push_slots)
                            .filter(|(g, _)| merged(g))
                            .filter_map(|(g, &i)| Some(ReduceJob { inputs: g.arrays, out: guards[i].merge.as_ref()? }))
                            .collect();
                        self.sum(&jobs, across.as_mut().map(|a| (a, residuals_of(guards, push_slots))))?;
                    }
                }
                let update = self.counters.phase(Phase::Update);
                // An update that fails stops the call there (the keys before it keep
                // theirs); with owners, the parts updated still reach every worker, so
                // that the workers' values never part.
                let mut failed = None;
                for (j, g, &i) in updates.iter().map(|&j| (j, &push[j], &push_slots[j])) {
                    let Slot { value, opt, merge, .. } = &mut *guards[i];
                    let grad = match (g.arrays, merge.as_ref()) {
                        (_, Some(m)) if merged(g) => m,
                        ([one], _) => *one,
                        _ => Err(Error::Internal("push: no merge buffer".into()))?,
                    };
                    let updated = match mine(j) {
                        Some(part) => runtime.update_part(&g.entry.key, value, grad, opt, part),
                        None => runtime.update(&g.entry.key, value, grad, opt),
                    };
                    if let Err(e) = updated {
                        failed = Some(e);
                        break;
                    }
                }
                drop(update);
                crate::ndarray::values_read();
                if let (Some(parts), Some(group)) = (&parts, &self.collective) {
                    // The owners' new values reach every worker.
                    let values: Vec<&NDArray> = push_slots.iter().map(|&i| &guards[i].value).collect();
                    let theirs: u64 = values
                        .iter()
                        .zip(parts.iter())
                        .map(|(v, p)| (v.size() - p[self.rank()].len()) as u64 * v.dtype().size() as u64)
                        .sum();
                    let mine: u64 = values
                        .iter()
                        .zip(parts.iter())
                        .map(|(v, p)| p[self.rank()].len() as u64 * v.dtype().size() as u64)
                        .sum();
                    let _gather = self.counters.phase(Phase::Wire).with(|| {
                        vec![
                            ("collective", Arg::S("all-gather".into())),
                            ("keys", Arg::U(values.len() as u64)),
                            ("bytes", Arg::U(theirs)),
                        ]
                    });
                    group.all_gather_parts("push: the owners' values", &values, parts)?;
                    self.counters.wire(mine * (group.size() as u64 - 1), theirs);
                }
                if let Some(e) = failed {
                    return Err(e);
                }
            }
            Merger::Custom(updater) => {
                // With owners, a key's updater runs once, on the key's whole owner, which
                // alone receives the key's sum (unless compressed); the others receive the
                // new value once every worker agreed on the outcome.
                let owners = self.whole_owned_ranges(
                    push.iter().zip(push_slots).map(|(g, &i)| (g.entry.owner, guards[i].value.size())),
                );
                let rank = self.rank();
                let runs_here = |j: usize| owners.is_none() || push[j].entry.owner.whole as usize == rank;
                let scatter = owners.is_some() && across.is_none();
                // The updater works on each key's spare copy of its value, brought up
                // to date here and swapped in only when every key's update succeeded:
                // a failing updater leaves the store as it was. The spares and the
                // merge buffers are kept per key and reused (as MXNet's merge buffers).
                // (A worker that does not run a key's updater sums several values of
                // it into its spare.)
                for (j, (g, &i)) in push.iter().zip(push_slots).enumerate() {
                    let slot = &mut *guards[i];
                    let v = &slot.value;
                    let size = if scatter && !runs_here(j) { 0 } else { v.size() };
                    if slot.merge.as_ref().is_none_or(|m| m.size() != size) {
                        slot.merge = Some(match size == v.size() {
                            true => NDArray::zeros_with(v.shape(), v.dtype(), v.context())?,
                            false => NDArray::zeros_with(&[size], v.dtype(), v.context())?,
                        });
                    }
                    if !runs_here(j) {
                        if scatter && g.arrays.len() > 1 && slot.spare.is_none() {
                            slot.spare = Some(NDArray::zeros_with(v.shape(), v.dtype(), v.context())?);
                        }
                        continue;
                    }
                    // A spare that a value of this call shares storage with (an updater
                    // kept its handle and pushed it) is not overwritten: a new one is made.
                    match &slot.spare {
                        Some(spare) if !g.arrays.iter().any(|a| a.same_storage(spare)) => spare.copy_from(v)?,
                        _ => slot.spare = Some(v.deep_copy()?),
                    }
                }
                let jobs: Vec<ReduceJob<'_>> = push
                    .iter()
                    .zip(push_slots)
                    .enumerate()
                    .filter_map(|(j, (g, &i))| {
                        let slot = &guards[i];
                        let local = slot.spare.as_ref().filter(|_| scatter && !runs_here(j) && g.arrays.len() > 1);
                        Some(ReduceJob { inputs: g.arrays, out: local.or(slot.merge.as_ref())? })
                    })
                    .collect();
                if jobs.len() != push.len() {
                    return Err(Error::Internal("push: no merge buffer".into()));
                }
                match (&owners, scatter) {
                    (Some(owners), true) => {
                        let dests: Vec<&NDArray> = push_slots
                            .iter()
                            .map(|&i| guards[i].merge.as_ref())
                            .collect::<Option<_>>()
                            .ok_or_else(|| Error::Internal("push: no merge buffer".into()))?;
                        self.sum_to_owners(&jobs, &dests, owners)?;
                    }
                    _ => self.sum(&jobs, across.as_mut().map(|a| (a, residuals_of(guards, push_slots))))?,
                }
                // The updater works on the sums: the values are free.
                crate::ndarray::values_read();
                // A failed update stops the call here (a fused call's stops its own call);
                // under dist_sync the workers then agree on the outcome before any of them
                // commits: an updater may fail on one worker only.
                let mut failed = None;
                let update = self.counters.phase(Phase::Update);
                for (j, (g, &i)) in push.iter().zip(push_slots).enumerate() {
                    if calls.as_ref().is_some_and(|c| c.failed_push(j)) || !runs_here(j) {
                        continue;
                    }
                    let (Some(m), Some(w)) = (&guards[i].merge, &guards[i].spare) else {
                        return Err(Error::Internal("push: no merge buffer or spare".into()));
                    };
                    // A panicking updater fails its push like one that returns an error, so
                    // that under dist_sync the workers still agree on the outcome.
                    let updated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        crate::ndarray::as_user_code(|| updater.update(&g.entry.key, g.entry.index, m, w))
                    }))
                    .unwrap_or_else(|_| {
                        Err(Error::Backend {
                            backend: "updater",
                            message: format!("key \"{}\": the updater panicked", g.entry.key),
                        })
                    });
                    match (updated, calls.as_mut()) {
                        (Err(e), Some(c)) => c.fail_push(j, e),
                        (Err(e), None) => {
                            failed = Some(e);
                            break;
                        }
                        (Ok(()), _) => {}
                    }
                }
                drop(update);
                if let Some(group) = &self.collective {
                    self.agree_on_updates(group.as_ref(), calls.as_deref_mut(), &mut failed)?;
                }
                if let Some(e) = failed {
                    return Err(e);
                }
                for (j, &i) in push_slots.iter().enumerate() {
                    let slot = &mut *guards[i];
                    if calls.as_ref().is_some_and(|c| c.failed_push(j)) || !runs_here(j) {
                        continue;
                    }
                    if let Some(updated) = slot.spare.take() {
                        slot.spare = Some(std::mem::replace(&mut slot.value, updated));
                    }
                }
                if let (Some(owners), Some(group)) = (&owners, &self.collective) {
                    // The owners' new values reach every worker (not those of a fused
                    // call that failed: no worker changed them).
                    let values: Vec<&NDArray> = push_slots.iter().map(|&i| &guards[i].value).collect();
                    let ranges: Vec<Vec<Range<usize>>> = owners
                        .iter()
                        .enumerate()
                        .map(|(j, r)| match calls.as_ref().is_some_and(|c| c.failed_push(j)) {
                            true => vec![0..0; r.len()],
                            false => r.clone(),
                        })
                        .collect();
                    group.all_gather_parts("push: the updater's values", &values, &ranges)?;
                }
            }
        }
        // The new residuals become the keys' residuals, the old ones their spares.
        let news = across.map(|a| a.spares.into_iter().map(|r| vec![r]).collect::<Vec<_>>()).unwrap_or_else(|| {
            quantised
                .iter_mut()
                .map(|q| q.as_mut().map(|q| std::mem::take(&mut q.residuals)).unwrap_or_default())
                .collect()
        });
        for (j, new) in news.into_iter().enumerate() {
            if new.is_empty() || calls.as_ref().is_some_and(|c| c.failed_push(j)) {
                continue;
            }
            let Slot { residuals, residual_spares, .. } = &mut *guards[push_slots[j]];
            residuals.resize(residuals.len().max(new.len()), Vec::new());
            residual_spares.resize(residuals.len(), Vec::new());
            for (p, new) in new.into_iter().enumerate() {
                residual_spares[p] = std::mem::replace(&mut residuals[p], new);
            }
        }
        let jobs: Vec<BroadcastJob<'_>> = pull
            .iter()
            .zip(pull_slots)
            .enumerate()
            .filter(|(j, _)| !calls.as_ref().is_some_and(|c| c.failed_pull(*j)))
            .map(|(_, (g, &i))| BroadcastJob { src: &guards[i].value, outs: &g.arrays })
            .collect();
        let _copy = (!jobs.is_empty()).then(|| self.counters.phase(Phase::Copy));
        self.comm.broadcast(&jobs)
    }
}

impl Store {
    /// This worker's rank (0 without a worker group).
    pub(super) fn rank(&self) -> usize {
        self.collective.as_ref().map_or(0, |g| g.rank())
    }
}

/// What [`Store::agree_on_updates`] exchanges: whether the updater failed here, which
/// calls of a fused batch it failed (a bit each; a batch holds at most 64 calls), and
/// the start of the first failure's message.
const FAILED_MESSAGE: usize = 240;

impl Store {
    /// Under dist_sync, once every worker ran the updater on its sums and before any
    /// commits: the workers exchange the outcome, so that a push whose updater failed on
    /// some worker fails on every worker and none changes anything for it (values,
    /// residuals), and the replicas never part. `failed`: this worker's failure of an
    /// unfused call (which it returns as it is); `calls`: a fused batch's calls, where
    /// each call one worker failed fails everywhere.
    ///
    /// # Errors
    /// The group's error if it is broken.
    fn agree_on_updates(
        &self,
        group: &dyn crate::backend::Collective,
        mut calls: Option<&mut Calls<'_>>,
        failed: &mut Option<Error>,
    ) -> Result<()> {
        let failed_calls = match &calls {
            Some(c) => (0..c.results.len().min(64)).filter(|&i| c.results[i].is_err()).fold(0u64, |m, i| m | 1 << i),
            None => u64::from(failed.is_some()),
        };
        let first = failed.as_ref().map(Error::to_string).or_else(|| {
            calls.as_ref().and_then(|c| c.results.iter().find_map(|r| r.as_ref().err().map(Error::to_string)))
        });
        let mut mine = failed_calls.to_le_bytes().to_vec();
        mine.extend(agree::padded(&first.unwrap_or_default(), FAILED_MESSAGE));
        let step = self.steps.load(std::sync::atomic::Ordering::Relaxed);
        let said = agree::Said::exchange(group, &format!("the updater's outcome of push #{step}"), &mine)?;
        // Each rank's failed calls (a bit each), then its first failure's message.
        let failed_on = |bit: u64| -> Vec<(usize, String)> {
            said.with_bit(0, bit).into_iter().map(|r| (r, said.text(r, 8))).collect()
        };
        let error = |on: &[(usize, String)], what: &str| {
            let ranks: Vec<String> = on.iter().map(|(r, _)| format!("rank {r}")).collect();
            Error::Backend {
                backend: "updater",
                message: format!(
                    "push #{step}: the updater failed on {} ({}){what}; every worker fails the push and none \
                     changed anything for it",
                    ranks.join(", "),
                    on[0].1
                ),
            }
        };
        match calls.as_mut() {
            None => {
                let on = failed_on(1);
                if failed.is_none() && !on.is_empty() {
                    *failed = Some(error(&on, ""));
                }
            }
            Some(c) => {
                for i in 0..c.results.len().min(64) {
                    let on = failed_on(1 << i);
                    if c.results[i].is_ok() && !on.is_empty() {
                        let n = c.results.len();
                        c.results[i] = Err(error(&on, &format!(" in call {} of {n} fused calls", i + 1)));
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Store::apply`] for a `dist_async` store: each pushed key's values are summed
    /// here (into its merge buffer; a single value is sent where it is) and the sum goes
    /// to the key's owners, which merge it; each pulled key's value comes from its
    /// owners into this worker's copy, and from there to the call's outs.
    pub(super) fn apply_remote(
        &self,
        remote: &dyn super::data::Owners,
        push: &[Group<'_>],
        pull: &[Group<'_>],
        push_slots: &[usize],
        pull_slots: &[usize],
        guards: &mut [RwLockWriteGuard<'_, Slot>],
    ) -> Result<()> {
        for (j, (g, &i)) in push.iter().zip(push_slots).enumerate() {
            let slot = &mut *guards[i];
            if g.arrays.len() > 1 && slot.merge.is_none() {
                let v = &slot.value;
                slot.merge = Some(NDArray::zeros_with(v.shape(), v.dtype(), v.context())?);
            }
            let sum = match (&g.arrays[..], slot.merge.as_ref()) {
                ([one], _) => *one,
                (arrays, Some(m)) => {
                    self.comm.reduce(&[ReduceJob { inputs: arrays, out: m }])?;
                    m
                }
                _ => return Err(Error::Internal("push: no merge buffer".into())),
            };
            // Each key is applied on its owners as it goes (as MXNet's dist_async applies
            // each key on its server): a failure names the keys applied before it.
            if let Err(e) = remote.push(&g.entry.key, sum) {
                let applied: Vec<&Key> = push[..j].iter().map(|g| &g.entry.key).collect();
                return Err(applied_before(e, &applied));
            }
        }
        crate::ndarray::values_read();
        // Each key's value comes straight into its first host out (this worker's copy
        // of a key serves for the checks of its calls: its shape and dtype), else into
        // the copy; from there to the other outs.
        let mut jobs = Vec::with_capacity(pull.len());
        for (g, &i) in pull.iter().zip(pull_slots) {
            let (src, outs) = match g.arrays.split_first() {
                Some((first, rest)) if !first.on_device() => (*first, rest),
                _ => (&guards[i].value, &g.arrays[..]),
            };
            remote.pull(&g.entry.key, src)?;
            jobs.push(BroadcastJob { src, outs });
        }
        self.comm.broadcast(&jobs)
    }
}

/// `e`, the failure of a `dist_async` push's key, saying which of the call's keys were
/// applied on their owners before it (none: the message is left as it is).
fn applied_before(e: Error, applied: &[&Key]) -> Error {
    if applied.is_empty() {
        return e;
    }
    let keys: Vec<String> = applied.iter().map(|k| format!("\"{k}\"")).collect();
    let note = format!(
        "; the keys pushed before it in this call were applied on their owners: {} (a dist_async push applies \
         each key as it goes, as MXNet's does)",
        keys.join(", ")
    );
    match e {
        Error::Backend { backend, message } => Error::Backend { backend, message: message + &note },
        Error::Raised { backend, message, cause } => Error::Raised { backend, message: message + &note, cause },
        Error::Internal(m) => Error::Internal(m + &note),
        e => Error::Backend { backend: "dist_async", message: format!("{e}{note}") },
    }
}

/// A key's pushed values quantised by gradient compression, and the residuals that
/// quantising them left (kept if the call succeeds).
struct Quantised {
    values: Vec<NDArray>,
    residuals: Vec<Vec<f32>>,
}

/// Each pushed key's residual under dist_sync (its first; empty before its first
/// compressed push, which reads zeros), for [`Across::sum`].
fn residuals_of<'g>(guards: &'g [RwLockWriteGuard<'_, Slot>], push_slots: &[usize]) -> Vec<&'g [f32]> {
    let of = |s: &'g Slot| s.residuals.first().filter(|r| r.len() == s.value.size()).map_or(&[][..], Vec::as_slice);
    push_slots.iter().map(|&i| of(&guards[i])).collect()
}

/// A buffer of `len` for new residuals: the slot's spare at `position` if it has one
/// (every element is written), else a new one.
fn spare(spares: &mut [Vec<f32>], position: usize, len: usize) -> Vec<f32> {
    let mut r = spares.get_mut(position).map(std::mem::take).unwrap_or_default();
    r.resize(len, 0.0);
    r
}

/// A dist_sync push under gradient compression: for 2-bit, the buffers each pushed
/// key's new residual is written into (in the call's order, that of the sums' jobs),
/// taken from the keys' spares.
struct Across {
    compression: Compression,
    spares: Vec<Vec<f32>>,
}

impl Across {
    fn new(
        compression: Compression,
        push: &[Pushed<'_>],
        push_slots: &[usize],
        guards: &mut [RwLockWriteGuard<'_, Slot>],
    ) -> Result<Self> {
        let mut spares = Vec::with_capacity(push.len());
        for (g, &i) in push.iter().zip(push_slots) {
            let slot = &mut *guards[i];
            if let Some(d) = g.arrays.iter().map(|a| a.dtype()).chain([slot.value.dtype()]).find(|d| *d != DType::F32) {
                return Err(not_float32(d));
            }
            if let Compression::TwoBit(_) = compression {
                spares.push(spare(&mut slot.residual_spares, 0, slot.value.size()));
            }
        }
        Ok(Across { compression, spares })
    }

    /// `dst = sum over the workers of Q(src)` for each pair (one per pushed key, with
    /// its residual in `residuals`): each worker quantises its sums into 2-bit codes,
    /// the codes of every worker reach every worker ([`Collective::all_gather`]), and
    /// each worker adds their values up in rank order, so every worker gets the same
    /// bits. Returns the bytes this worker gave.
    fn sum(
        &mut self,
        group: &dyn Collective,
        pairs: &[(&NDArray, &NDArray)],
        residuals: &[&[f32]],
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<u64> {
        let c = match self.compression {
            Compression::TwoBit(c) => c,
            Compression::Half(h) => return sum_halves(h, group, pairs),
        };
        let mut mine = Vec::new();
        for (((src, _), old), new) in pairs.iter().zip(residuals).zip(&mut self.spares) {
            src.with_data(|g: &[f32]| c.quantize_packed(g, old, new, &mut mine, pool))?;
        }
        let all = group.all_gather("a compressed push", &mine)?;
        if mine.is_empty() {
            // Empty keys only: nothing to sum.
            return Ok(0);
        }
        let mut at = 0;
        for (_, dst) in pairs {
            let len = dst.size().div_ceil(16) * 4;
            let theirs: Vec<&[u8]> = all.chunks(mine.len()).map(|w| &w[at..at + len]).collect();
            dst.with_data_mut(|d: &mut [f32]| c.sum_codes(&theirs, d, pool))?;
            at += len;
        }
        Ok(mine.len() as u64)
    }
}

/// `dst = sum over the workers of src rounded to h` for each pair: each worker's sums
/// cross as 16-bit floats (half the bytes) and every worker adds them up in f32, in
/// rank order. Returns the bytes this worker gave.
fn sum_halves(h: Half, group: &dyn Collective, pairs: &[(&NDArray, &NDArray)]) -> Result<u64> {
    let mut mine = Vec::with_capacity(pairs.iter().map(|(s, _)| 2 * s.size()).sum());
    for (src, _) in pairs {
        src.with_data(|g: &[f32]| mine.extend(g.iter().flat_map(|&x| h.round(x).to_le_bytes())))?;
    }
    let all = group.all_gather("a compressed push", &mine)?;
    if mine.is_empty() {
        return Ok(0);
    }
    let mut at = 0;
    for (_, dst) in pairs {
        let len = 2 * dst.size();
        dst.with_data_mut(|d: &mut [f32]| {
            for (r, theirs) in all.chunks(mine.len()).enumerate() {
                let values = theirs[at..at + len].chunks_exact(2).map(|b| h.widen(u16::from_le_bytes([b[0], b[1]])));
                for (o, v) in d.iter_mut().zip(values) {
                    *o = if r == 0 { v } else { *o + v };
                }
            }
        })?;
        at += len;
    }
    Ok(mine.len() as u64)
}

/// Under gradient compression, whether a call's pushed values may be compressed: every
/// value (and so every stored value) float32. One of each call's own checks, so that a
/// call of a fused batch that fails it fails alone.
pub(super) fn compressible(compression: Option<Compression>, push: &[Group<'_>]) -> Result<()> {
    if compression.is_none() {
        return Ok(());
    }
    match push.iter().flat_map(|g| g.arrays.iter()).map(|a| a.dtype()).find(|d| *d != DType::F32) {
        Some(d) => Err(not_float32(d)),
        None => Ok(()),
    }
}

fn not_float32(got: DType) -> Error {
    Error::invalid_argument(format!("gradient compression takes float32 values (as MXNet's 2bit): got {got}"))
}

/// `values` quantised with `residuals` (by position; zeros where there is none yet),
/// each in its own value's context; the new residuals are written into buffers taken
/// from `spares`.
fn quantise(c: TwoBit, values: &[&NDArray], residuals: &[Vec<f32>], spares: &mut [Vec<f32>]) -> Result<Quantised> {
    let mut q = Quantised { values: Vec::with_capacity(values.len()), residuals: Vec::with_capacity(values.len()) };
    for (p, v) in values.iter().enumerate() {
        if v.dtype() != DType::F32 {
            return Err(not_float32(v.dtype()));
        }
        let old = residuals.get(p).filter(|r| r.len() == v.size()).map_or(&[][..], Vec::as_slice);
        let mut new = spare(spares, p, v.size());
        // Quantised straight into the array the merger sums, in the value's context.
        let out = NDArray::zeros_with(v.shape(), DType::F32, v.context())?;
        v.with_data(|g: &[f32]| out.with_data_mut(|o: &mut [f32]| c.quantize(g, old, &mut new, o)))??;
        q.values.push(out);
        q.residuals.push(new);
    }
    Ok(q)
}

/// The calls of a fused batch as [`Store::apply`] sees them: which call each push and
/// pull group belongs to, and each call's result so far.
pub(super) struct Calls<'r> {
    pub(super) push: Vec<usize>,
    pub(super) pull: Vec<usize>,
    pub(super) results: &'r mut [Result<()>],
}

impl Calls<'_> {
    fn failed_push(&self, group: usize) -> bool {
        self.results[self.push[group]].is_err()
    }

    fn failed_pull(&self, group: usize) -> bool {
        self.results[self.pull[group]].is_err()
    }

    fn fail_push(&mut self, group: usize, e: Error) {
        self.results[self.push[group]] = Err(e);
    }
}
