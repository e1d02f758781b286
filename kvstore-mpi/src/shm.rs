//! Fused sums through memory that the ranks of one machine share: an MPI-3 shared
//! window (`MPI_Win_allocate_shared`) with two slots per rank.
//!
//! Over MPI's own path a fused bucket is packed into a send buffer, copied by the
//! kernel into the peer's receive buffer (Open MPI's single-copy CMA), and summed from
//! the two buffers. Through the window each rank packs its bucket into its own slot,
//! the ranks meet at a barrier, and each sums every rank's slot straight into its
//! destinations: the kernel's copy, its page pinning and the receive buffer are gone.
//!
//! The slots alternate bucket by bucket, so one barrier per bucket is enough: a rank
//! packs slot `s` again two buckets later, after the barrier of the bucket between,
//! which no rank passes before it has finished summing from slot `s`. Every rank makes
//! the same buckets in the same order (the calls are the same on every rank), so every
//! rank's next slot is the same, across calls too.
//!
//! It is used only where every rank of the job runs on one machine, unless the user
//! turns it off ([`SHARED_MEMORY_VAR`](crate::SHARED_MEMORY_VAR)) or confines Open MPI to transports other than
//! shared memory (`--mca btl self,tcp`): a run that asks for TCP gets TCP.

use std::ffi::c_void;
use std::ptr;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::agree::all_agree;

/// The shared window of the ranks of the job, all on one machine.
pub(crate) struct NodeWindow {
    /// The job's ranks, numbered as in the world.
    comm: SimpleCommunicator,
    win: ffi::MPI_Win,
    /// Every rank's two slots, `slot_bytes` each, by rank.
    bases: Vec<*mut u8>,
    slot_bytes: usize,
    /// The slot the next bucket is packed into (0 or 1).
    next: usize,
}

impl NodeWindow {
    /// Opens the window, collectively over `world` (every rank must call it, with the
    /// same `slot_bytes`): `None`, on every rank alike, unless every rank runs on this
    /// machine and `wanted` it.
    pub(crate) fn open(world: &SimpleCommunicator, slot_bytes: usize, wanted: bool) -> Option<NodeWindow> {
        let size = world.size();
        let comm = world.split_shared(world.rank());
        if !all_agree(world, wanted && size > 1 && comm.size() == size && comm.rank() == world.rank()) {
            return None;
        }
        let bytes = isize::try_from(2 * slot_bytes).ok()?;
        let mut base: *mut u8 = ptr::null_mut();
        // SAFETY: `MPI_WIN_NULL` is a valid initial value for the handle.
        let mut win: ffi::MPI_Win = unsafe { ffi::RSMPI_WIN_NULL };
        // SAFETY: a collective call on `comm`, which every rank makes (this function is
        // called by every rank at the same point of the same call); `base` and `win` are
        // valid places for the outputs. MPI's default error handler ends the job on an
        // error, so a return means success.
        unsafe {
            ffi::MPI_Win_allocate_shared(
                bytes,
                1,
                ffi::RSMPI_INFO_NULL,
                comm.as_raw(),
                (&raw mut base).cast::<c_void>(),
                &mut win,
            );
        }
        let mut bases = Vec::with_capacity(size as usize);
        for r in 0..size {
            let (mut len, mut unit, mut at): (ffi::MPI_Aint, i32, *mut u8) = (0, 0, ptr::null_mut());
            // SAFETY: `win` is the window just made; `r` is a rank of its communicator;
            // the outputs point to live locals.
            unsafe { ffi::MPI_Win_shared_query(win, r, &mut len, &mut unit, (&raw mut at).cast::<c_void>()) };
            bases.push(if len == bytes { at } else { ptr::null_mut() });
        }
        // Slots hold any element type: 8-byte alignment at least (MPI gives pages).
        let aligned = bases.iter().all(|b| !b.is_null() && (*b as usize).is_multiple_of(8));
        // SAFETY: the window is valid; a passive-target epoch on every rank, which lets
        // `MPI_Win_sync` order this rank's stores and loads on the window.
        unsafe { ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as i32, win) };
        let window = NodeWindow { comm, win, bases, slot_bytes, next: 0 };
        if all_agree(world, aligned) {
            Some(window)
        } else {
            window.free();
            None
        }
    }

    /// The bytes of one slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// This rank's next slot, as `len` elements of `W`, to pack a bucket into.
    pub(crate) fn my_slot<W: bytemuck::Pod>(&mut self, len: usize) -> &mut [W] {
        assert!(len * size_of::<W>() <= self.slot_bytes, "a bucket larger than a slot");
        let rank = self.comm.rank() as usize;
        // SAFETY: the slot lies in this rank's segment of the window (2 × `slot_bytes`
        // bytes, 8-aligned, alive until `free`); no other rank writes it, and no rank
        // reads it until the barrier of `publish` (see the module docs for why no rank
        // still reads it from two buckets ago). The returned borrow holds `self`
        // mutably, so no other slice of it is alive in this process.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(rank).cast::<W>(), len) }
    }

    fn slot_ptr(&self, rank: usize) -> *mut u8 {
        // SAFETY: `next` is 0 or 1, so the offset stays inside the rank's segment.
        unsafe { self.bases[rank].add(self.next * self.slot_bytes) }
    }

    /// After this rank packed `len` elements into its slot: waits until every rank
    /// did (a barrier; tested with a yield between tests when `background`), then
    /// hands `f` every rank's slot, by rank, and moves on to the other slot.
    pub(crate) fn publish<W: bytemuck::Pod, T>(
        &mut self,
        len: usize,
        background: bool,
        f: impl FnOnce(&[&[W]]) -> T,
    ) -> T {
        // SAFETY: `win` is valid and in the epoch opened in `open`.
        unsafe { ffi::MPI_Win_sync(self.win) };
        if background {
            crate::runtime::wait(self.comm.immediate_barrier());
        } else {
            self.comm.barrier();
        }
        // SAFETY: as above; orders the loads below after the other ranks' stores.
        unsafe { ffi::MPI_Win_sync(self.win) };
        let slots: Vec<&[W]> = (0..self.bases.len())
            // SAFETY: every rank's slot `next` holds its packed bucket (the barrier
            // above), and no rank writes it again before the barrier of the next
            // bucket, which this rank reaches only after `f` returned.
            .map(|r| unsafe { std::slice::from_raw_parts(self.slot_ptr(r).cast::<W>(), len) })
            .collect();
        let out = f(&slots);
        self.next = 1 - self.next;
        out
    }

    /// Frees the window (collective: every rank, before MPI is finalised).
    pub(crate) fn free(mut self) {
        // SAFETY: the epoch of `open` ends, then the window is freed; every rank
        // calls this from `finalize`, after its last store call.
        unsafe {
            ffi::MPI_Win_unlock_all(self.win);
            ffi::MPI_Win_free(&mut self.win);
        }
    }
}
