//! Agreement across the ranks where they must all take one path (the settings that
//! shape their messages, the shared window, the sum host by host): MPI reductions over
//! a communicator, made by every rank at the same point, before the group's own
//! comparison of calls (`Collective::exchange`, core's `kvstore/agree.rs`) exists or
//! where it does not apply.

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Whether every rank of `comm` says `ok`.
pub(crate) fn all_agree(comm: &SimpleCommunicator, ok: bool) -> bool {
    let mut all = 0i32;
    comm.all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
    all == 1
}

/// The least and the greatest of the ranks' `mine` over `comm`, element by element.
pub(crate) fn range_of<T: Equivalence + Copy + Default, const N: usize>(
    comm: &SimpleCommunicator,
    mine: [T; N],
) -> ([T; N], [T; N]) {
    let (mut least, mut most) = ([T::default(); N], [T::default(); N]);
    comm.all_reduce_into(&mine[..], &mut least[..], SystemOperation::min());
    comm.all_reduce_into(&mine[..], &mut most[..], SystemOperation::max());
    (least, most)
}
