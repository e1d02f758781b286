//! The ordinary runner: a plan's keys locked in index order (the merger first, when it
//! pushes), then its sums, update and copies on the calling thread (sharing the sums'
//! work with the comm's pool), every key held for the whole call. It runs every call the
//! other runners do not take, and looks nothing up and checks nothing: under
//! `dist_sync` it hands the plan's refusal to the step the workers compare.

use std::sync::Arc;

use crate::comm::BroadcastJob;
use crate::error::Result;
use crate::kvstore::data::{Entry, Store};
use crate::kvstore::locks::Held;
use crate::kvstore::plan::Plan;
use crate::kvstore::stats::Phase;

impl Store {
    /// The ordinary runner of `plan`: the push algorithm (`KVStoreLocal::PushImpl`)
    /// followed by an optional pull, with every key of the call locked (written when it
    /// pushes), in index order, for the whole call.
    pub(in crate::kvstore) fn run_inline(&self, plan: &Plan<'_>) -> Result<()> {
        let op = plan.op;
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
            return self.pull_planned(plan, &held, &entries);
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
