//! A big array (a bucket or more, of a dtype MPI sums natively) summed straight from its
//! memory, in groups of a bounded size: flat by [`scatter_sum`], or host by host
//! (`hosts.rs`).

use std::sync::atomic::Ordering;

use kvstore_core::{Element, NDArray, Result};
use mpi::datatype::Equivalence;

use crate::group::MpiGroup;
use crate::hosts;
use crate::scatter::{LARGEST_SCRATCH, scatter_sum, segment, with_scratch};

thread_local! {
    /// The copy of an array summed in place ([`MpiGroup::allreduce_big`]).
    static COPY: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The chunks of a sum host by host ([`hosts::GROUP_CHUNKS`]'s 4 groups) in a group of
/// a big array's flat sum ([`MpiGroup::group_bytes`]): each group's messages are all in
/// flight at once, and the next group's start after the last sums of this one arrived.
/// On the 2-core machine of `make bench`, 2 ranks: a 256 MiB push in groups of 64 MiB
/// took 101 and 111 ms against 88 and 90 ms in one; a 512 MiB push in groups of 256
/// MiB, 201 and 232 ms against 196 and 204 ms in one.
const SUM_GROUP_CHUNKS: usize = 4 * hosts::GROUP_CHUNKS;

impl MpiGroup {
    /// A big array whose dtype MPI sums natively: `dst = sum(src)` by [`scatter_sum`]
    /// (or host by host, `Hosts::sum`), straight from the source's memory into the
    /// destination's (no copy), or, in place, from a copy of the source. It goes in
    /// groups, one after the other: host by host, the sum's own ([`hosts::groups`], 64
    /// MiB by default); flat, of at most [`MpiGroup::group_bytes`] (256 MiB by default).
    /// So the buffers the sum keeps (this thread's, reused: the flat sum's receive
    /// buffer, the copy, the hosts' parts) hold a group's worth of the array, however big
    /// it is. The groups are the same on every rank, whether it sums in place or not
    /// (which another rank may do otherwise), and the bits are the same whatever the
    /// groups (each element's sum is the same tree over the ranks wherever it is).
    pub(crate) fn allreduce_big<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        src: &NDArray,
        dst: &NDArray,
    ) -> Result<()> {
        let in_place = src.same_storage(dst);
        let sum = |s: Option<&[W]>, d: &mut [W]| {
            self.with_mpi(|mpi| {
                // (Found at the first big sum; then the world and the hosts are both read.)
                let by_hosts = mpi.hosts(self.host_ranks).is_some();
                let (world, hosts) = (&mpi.world, mpi.hosts.found());
                // Each group's range, with its chunks host by host.
                let groups = match hosts {
                    Some(_) => hosts::groups(d.len(), std::mem::size_of::<W>(), self.host_chunk_bytes),
                    None => {
                        let n = std::mem::size_of_val(d).div_ceil(self.group_bytes()).max(1);
                        (0..n).map(|g| (segment(d.len(), n, g), 0)).collect()
                    }
                };
                for (part, chunks) in groups {
                    let d = &mut d[part.clone()];
                    let sum_part = |s: &[W], d: &mut [W]| match hosts {
                        Some(hosts) => hosts.sum(s, d, chunks),
                        None => scatter_sum(world, s, d),
                    };
                    match s {
                        Some(s) => sum_part(&s[part], d),
                        None => with_scratch::<W, _>(&COPY, d.len(), |send| {
                            send.copy_from_slice(d);
                            sum_part(&send[..], d)
                        }),
                    }
                }
                self.used_hosts.store(by_hosts, Ordering::Relaxed);
            })
        };
        if in_place {
            dst.with_data_mut(|d: &mut [W]| sum(None, d))??;
        } else {
            src.with_data(|s: &[W]| dst.with_data_mut(|d: &mut [W]| sum(Some(s), d)))???;
        }
        Ok(())
    }

    /// The most bytes of a big array the flat sum sums at once
    /// ([`MpiGroup::allreduce_big`]): [`SUM_GROUP_CHUNKS`] chunks of
    /// `KVSTORE_MPI_HOST_CHUNK_BYTES` (256 MiB by default).
    fn group_bytes(&self) -> usize {
        self.host_chunk_bytes.saturating_mul(SUM_GROUP_CHUNKS)
    }
}

impl MpiGroup {
    /// The most bytes that any thread's buffer for big sums (kept from one sum to the
    /// next) has held in this process: a group's worth of an array at most, 64 chunks
    /// of `KVSTORE_MPI_HOST_CHUNK_BYTES` (256 MiB by default; 16 chunks host by host),
    /// whatever the arrays' sizes.
    pub fn largest_scratch_bytes(&self) -> usize {
        LARGEST_SCRATCH.load(Ordering::Relaxed)
    }
}
