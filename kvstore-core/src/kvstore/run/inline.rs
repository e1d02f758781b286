//! The ordinary runner: a plan's keys locked in index order (the merger first, when it
//! pushes), then its sums, update and copies on the calling thread (sharing the sums'
//! work with the comm's pool), every key held for the whole call. It runs every call the
//! other runners do not take, and looks nothing up and checks nothing: under
//! `dist_sync` it hands the plan's refusal to the step the workers compare.

use std::sync::Arc;

use crate::comm::BroadcastJob;
use crate::error::Result;
use crate::kvstore::data::{Entry, Found, Store};
use crate::kvstore::locks::Held;
use crate::kvstore::plan::Plan;
use crate::kvstore::stats::Phase;

/// How a call reaching [`Store::push_pull`] was offered to the spread runner before (a
/// call is offered once).
pub(in crate::kvstore) enum Offered {
    /// Not yet: its plan is offered (a queued call, or one run at once behind others).
    Not,
    /// Already: it was no call for that runner, or its first round handed it back,
    /// with the result of the checks it made when it made them (see `run/pieces.rs`).
    Already(Option<Result<()>>),
}

impl Store {
    /// The push algorithm (`KVStoreLocal::PushImpl`) followed by an optional pull, with
    /// every key of the call locked (written when it pushes), in index order, for the
    /// whole call: the plan of `push` and `pull` (see `plan.rs`), then its runner.
    /// `offered`: whether the call was offered to the spread runner already.
    pub(in crate::kvstore) fn push_pull<'a>(
        &self,
        op: &'static str,
        push: Found<'a>,
        pull: Found<'a>,
        offered: Offered,
    ) -> Result<()> {
        if push.is_empty() && pull.is_empty() {
            return Ok(());
        }
        let (spread, checked) = match offered {
            Offered::Not => (true, None),
            Offered::Already(checked) => (false, checked),
        };
        let plan = Plan::new(self, op, push, pull, checked);
        if plan.checked.is_ok() {
            self.counters.bytes(plan.bytes());
        }
        if spread
            && plan.checked.is_ok()
            && let Some(r) = self.spread(&plan)
        {
            return r;
        }
        // Lock in index order, so that concurrent multi-key calls cannot deadlock.
        let entries = plan.entries();
        let held = Held::new(op, self, &entries)?;
        // A push's refusal under dist_sync is this worker's step (the workers compare
        // their pushes before the data moves); any other refusal ends the call before
        // any lock (a pull has no step: each worker refuses its own outs).
        if self.collective.is_none() || plan.push.is_empty() {
            plan.checked.clone()?;
        }
        if plan.push.is_empty() {
            return self.pull_planned(&plan, &held, &entries);
        }
        // The merger is held for the whole call: the updater or optimizer it starts with
        // stays installed (and alive) until it ends.
        let merger = held.merger_read(op, &self.merger)?;
        let mut guards = held.write(op, &entries)?;
        if self.collective.is_some() {
            let checked = plan.checked.clone();
            self.check_push_step(op, &plan.step_keys(), checked, plan.compression, merger.identity())?;
        }
        let (push, pull) = (&plan.push, &plan.pull);
        self.apply(push, pull, &plan.push_slots, &plan.pull_slots, &mut guards, &merger, plan.compression, None)
    }

    /// The runner of a pull (a plan that pushes nothing), its keys `entries`.
    fn pull_planned(&self, plan: &Plan<'_>, held: &Held, entries: &[&Arc<Entry>]) -> Result<()> {
        let op = plan.op;
        if let Some(remote) = &self.remote {
            // dist_async: the values come from their owners (into this worker's copies).
            let mut guards = held.write(op, entries)?;
            return self.apply_remote(&**remote, &[], &plan.pull, &[], &plan.pull_slots, &mut guards);
        }
        let guards = held.read(op, entries)?;
        let jobs: Vec<BroadcastJob<'_>> = plan
            .pull
            .iter()
            .zip(&guards)
            .map(|(g, stored)| BroadcastJob { src: &stored.value, outs: &g.arrays })
            .collect();
        let _copy = self.counters.phase(Phase::Copy);
        self.comm.broadcast(&jobs)
    }
}
