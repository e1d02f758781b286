//! The calls an ordered engine holds back to run later as one job (fusion across calls,
//! `kvstore/run/fused.rs`): the batch held now, its number, and the releases that queue its
//! job (before any later call is queued, when a read of an array it writes must wait
//! for it, or when the caller asks).

use std::sync::Arc;

use super::{Engine, Job, ORDERED, Vars};

/// Calls an ordered engine holds back, as `kvstore/run/fused.rs` keeps them.
pub(crate) trait HeldBatch: Send {
    /// The batch as its own type, for a call that joins it.
    fn as_any(&mut self) -> &mut dyn std::any::Any;
    /// The job that runs the batch's calls.
    fn into_job(self: Box<Self>) -> Arc<dyn Job>;
}

/// Calls an ordered engine holds back, to run later as one job (`kvstore/run/fused.rs`
/// decides which calls join and what the job does; the engine keeps them and submits
/// the job before anything else is submitted, so the held calls keep their place in
/// submission order).
pub(crate) struct HeldCalls {
    /// The batch's number: numbers grow, so a handle can tell whether its batch is
    /// still held.
    pub(crate) id: u64,
    /// Every var of every held call.
    pub(crate) vars: Vars,
    /// The arrays the held calls write (their buffers' addresses): a read of one of them
    /// must release the batch before it waits for it.
    pub(crate) outs: Vec<usize>,
    /// The calls themselves.
    pub(crate) calls: Box<dyn HeldBatch>,
}

/// An ordered engine's held calls and the next batch number.
#[derive(Default)]
pub(crate) struct HeldBatches {
    next: u64,
    open: Option<HeldCalls>,
}

/// The locked held calls of an engine ([`Engine::held`]).
pub(crate) struct HeldGuard<'e> {
    engine: &'e Engine,
    held: parking_lot::MutexGuard<'e, HeldBatches>,
}

impl HeldGuard<'_> {
    /// The batch held now, if any.
    pub(crate) fn open(&mut self) -> Option<&mut HeldCalls> {
        self.held.open.as_mut()
    }

    /// Holds a new batch (after releasing any batch held before); returns its number.
    pub(crate) fn start(&mut self, mut calls: HeldCalls) -> u64 {
        self.release();
        self.held.next += 1;
        calls.id = self.held.next;
        self.held.open = Some(calls);
        self.held.next
    }

    /// Submits the held batch's job, if a batch is held.
    pub(crate) fn release(&mut self) {
        if let Some(b) = self.held.open.take() {
            self.engine.enqueue(b.vars, 0, b.calls.into_job());
        }
    }
}

/// Releases the held batch of any ordered engine whose calls write the array with
/// buffer address `buffer` (a read of it is about to wait for them).
pub(crate) fn release_writers_of(buffer: usize) {
    let engines: Vec<Arc<Engine>> = ORDERED.lock().iter().filter_map(|(_, e)| e.upgrade()).collect();
    for engine in engines {
        let mut held = engine.held();
        if held.open().is_some_and(|b| b.outs.contains(&buffer)) {
            held.release();
        }
    }
}

impl Engine {
    /// The calls this engine holds, locked (only an ordered engine holds calls).
    pub(crate) fn held(&self) -> HeldGuard<'_> {
        HeldGuard { engine: self, held: self.held.lock() }
    }

    /// Releases the held batch numbered `id` (any held batch for `None`): its job is
    /// queued behind every call made before it.
    pub(crate) fn release_held(&self, id: Option<u64>) {
        if !self.shared.ordered {
            return;
        }
        let mut held = self.held();
        if id.is_none_or(|id| held.open().is_some_and(|b| b.id == id)) {
            held.release();
        }
    }
}
