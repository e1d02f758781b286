//! The timeline's clock across the job: each rank's offset to rank 0's clock, found
//! once when MPI starts ([`sync_clock`]).

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// The tag of [`sync_clock`]'s messages.
const CLOCK_TAG: i32 = 9;
/// How many round trips [`sync_clock`] times per rank.
const CLOCK_ROUNDS: usize = 8;

/// This rank's clock's offset to rank 0's (the timeline's clock, ns: this clock less
/// rank 0's) and the estimate's error: each rank asks rank 0 for its time
/// [`CLOCK_ROUNDS`] times, and keeps the answer of the shortest round trip, taken as
/// read at its middle (error: half that round trip). Rank 0 answers the ranks in turn,
/// then tells each when its clock started: the origin of the job's timeline.
pub(crate) fn sync_clock(w: &SimpleCommunicator, rank: usize, size: usize) -> (i64, u64, u64) {
    use kvstore_core::timeline::{local_origin, now};
    if size < 2 {
        return (0, 0, local_origin());
    }
    if rank == 0 {
        for r in 1..size {
            let p = w.process_at_rank(r as i32);
            for _ in 0..CLOCK_ROUNDS {
                let (_asked, _) = p.receive_with_tag::<u64>(CLOCK_TAG);
                p.send_with_tag(&now(), CLOCK_TAG);
            }
            p.send_with_tag(&local_origin(), CLOCK_TAG);
        }
        return (0, 0, local_origin());
    }
    let root = w.process_at_rank(0);
    let mut best = (u64::MAX, 0i64);
    for _ in 0..CLOCK_ROUNDS {
        let sent = now();
        root.send_with_tag(&sent, CLOCK_TAG);
        let (theirs, _) = root.receive_with_tag::<u64>(CLOCK_TAG);
        let back = now();
        let trip = back.saturating_sub(sent);
        if trip < best.0 {
            let middle = sent + trip / 2;
            best = (trip, middle as i64 - theirs as i64);
        }
    }
    let (origin, _) = root.receive_with_tag::<u64>(CLOCK_TAG);
    (best.1, best.0 / 2, origin)
}
