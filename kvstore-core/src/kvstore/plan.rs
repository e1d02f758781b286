//! A call put together before any of its keys is locked: the second stage of every
//! push, pull and pushpull (after `forms.rs` turned the caller's forms into runs and
//! `Store::lookup` found their keys), and what the runners take.
//!
//! A [`Plan`] holds the call's keys grouped (one group per key, a repeated key's arrays
//! in call order, in index order: the order of updates and of locking), the keys to
//! lock with where each group's key is among them, the compression the call's sums use
//! (read once), and the result of every check of the call's arrays: shape and dtype
//! against the key's (kept on its entry and never changed, so read without a lock),
//! context, writable outs, float32 values under compression. The first error is the
//! first value's in key order, else the first out's, else compression's, by
//! construction. A runner takes the plan as it is: it looks nothing up and checks
//! nothing (under `dist_sync` it hands [`Plan::checked`] to the step the workers
//! compare, so that a call refused on one worker fails on all).

use std::sync::Arc;

use super::compression::Compression;
use super::steps::StepKey;
use super::{Entry, Found, Group, Store, check_group, merge};
use crate::error::Result;

/// A call's keys, grouped and checked, with its lock set (see the module docs).
pub(super) struct Plan<'a> {
    pub(super) op: &'static str,
    /// The pushed keys: one group per key, in index order.
    pub(super) push: Vec<Group<'a>>,
    /// The pulled keys (outs): one group per key, in index order.
    pub(super) pull: Vec<Group<'a>>,
    /// The keys to lock, each once, in index order: `i` is `push[i]`'s key for `i` below
    /// `push.len()`, else `pull[i - push.len()]`'s.
    locks: Vec<usize>,
    /// Where each of `push`'s keys is among the locked ones.
    pub(super) push_slots: Vec<usize>,
    /// Where each of `pull`'s keys is among the locked ones.
    pub(super) pull_slots: Vec<usize>,
    /// The gradient compression of the call's sums, read once: what the workers compare
    /// is what the sums do.
    pub(super) compression: Option<Compression>,
    /// Every check of the call: its first error.
    pub(super) checked: Result<()>,
}

impl<'a> Plan<'a> {
    /// The plan of a call that pushes `push` and pulls `pull` (looked up, in call order).
    pub(super) fn new(store: &Store, op: &'static str, push: Found<'a>, pull: Found<'a>) -> Self {
        let compression = match push.is_empty() {
            true => None,
            false => *store.compression.read(),
        };
        Self::with(op, push, pull, compression)
    }

    /// [`Plan::new`] with the store's compression as read once for several calls (a
    /// fused batch's).
    pub(super) fn with(op: &'static str, push: Found<'a>, pull: Found<'a>, compression: Option<Compression>) -> Self {
        let (push, pull) = (Store::group(push), Store::group(pull));
        let (locks, push_slots, pull_slots) = lock_set(&push, &pull);
        let checked = push
            .iter()
            .try_for_each(|g| check_group(op, "value", g))
            .and_then(|()| pull.iter().try_for_each(|g| check_group(op, "out", g)))
            .and_then(|()| merge::compressible(compression, &push));
        Plan { op, push, pull, locks, push_slots, pull_slots, compression, checked }
    }

    /// The keys to lock, in index order.
    pub(super) fn entries(&self) -> Vec<&Arc<Entry>> {
        let n = self.push.len();
        self.locks.iter().map(|&i| if i < n { &self.push[i].entry } else { &self.pull[i - n].entry }).collect()
    }

    /// What the workers of a `dist_sync` store compare of a push: each pushed key with
    /// the shape and dtype of its first value.
    pub(super) fn step_keys(&self) -> Vec<StepKey<'_>> {
        self.push.iter().map(|g| (&g.entry.key, g.arrays[0].shape(), g.arrays[0].dtype())).collect()
    }
}

/// The union of `push`'s and `pull`'s keys (each in index order, each key once) in
/// index order, as positions in `push` then `pull`; and where each group's key is there.
fn lock_set(push: &[Group<'_>], pull: &[Group<'_>]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let n = push.len();
    let mut locks = Vec::with_capacity(n.max(pull.len()));
    let (mut push_slots, mut pull_slots) = (Vec::with_capacity(n), Vec::with_capacity(pull.len()));
    let (mut i, mut j) = (0, 0);
    loop {
        let take_push = match (push.get(i), pull.get(j)) {
            (None, None) => break,
            (Some(p), Some(q)) if p.entry.index == q.entry.index => {
                push_slots.push(locks.len());
                pull_slots.push(locks.len());
                locks.push(i);
                i += 1;
                j += 1;
                continue;
            }
            (Some(p), Some(q)) => p.entry.index < q.entry.index,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if take_push {
            push_slots.push(locks.len());
            locks.push(i);
            i += 1;
        } else {
            pull_slots.push(locks.len());
            locks.push(n + j);
            j += 1;
        }
    }
    (locks, push_slots, pull_slots)
}
