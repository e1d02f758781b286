//! The runners of a planned call (`plan.rs`), none of which looks anything up or checks
//! anything:
//! - `inline`: the ordinary runner, on the calling thread (or the engine thread that runs
//!   a queued call), every key locked for the whole call;
//! - `pieces`: many small host keys spread over the comm's threads, each taking whole
//!   keys (a blocking call on an idle engine comes here as given, and its first round is
//!   the plan's parallel builder: it looks the keys up, groups and checks them);
//! - `fused`: the non-blocking `dist_sync` calls an ordered engine held back, run as one
//!   (and how they are held).
//!
//! `dist_async` pushes and pulls go to their keys' owners from `inline`
//! (`Store::apply_remote`, `merge.rs`); row-sparse calls have their own path
//! (`sparse.rs`).

pub(super) mod fused;
pub(super) mod inline;
pub(super) mod pieces;
