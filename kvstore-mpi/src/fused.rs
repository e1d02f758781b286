//! Small arrays fused into buckets: packed one after another ([`plan`], [`pack`]),
//! summed through the machine's shared window (`shm.rs`) or staged in a reused send
//! buffer and summed by [`swap`] (2 ranks) or [`tree_sum`], each piece's sum then
//! written into its destination ([`store_sums`]).

use std::sync::atomic::Ordering;

use kvstore_core::backend::in_background;
use kvstore_core::{Element, NDArray, Result};
use mpi::datatype::Equivalence;

use crate::group::MpiGroup;
use crate::tree::{add_into, swap, tree_into, tree_sum};
use crate::watchdog;
use crate::wire::{read_wire, store_piece};

/// The most bytes of small arrays packed into one fused allreduce, whatever the bucket
/// size: packing copies every array into the send buffer, and the sums are read from
/// the send and receive buffers, and with both buffers in a core's cache (1 MiB of L2
/// here) those copies cost far less. A list push of 1,000 keys of 4 KiB over shared memory (2 ranks, `make
/// bench`'s MPI rows, 31-run medians in two rounds, each size in turn): packed in
/// 4 MiB, 2.3 and 3.1 ms (1.18 and 1.26 times the same push unfused); in 512 KiB,
/// 1.96 and 1.76 ms (0.93 and 0.87 times it); 256 KiB and 1 MiB alike. The same on
/// every rank, so every rank makes the same allreduces.
pub(crate) const PACKED_BYTES: usize = 512 << 10;
thread_local! {
    /// Send and receive buffers reused across calls (u64 words, so that every element
    /// type is aligned): fresh multi-megabyte buffers would page-fault on every push.
    static BUFFERS: std::cell::RefCell<(Vec<u64>, Vec<u64>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on send and receive buffers of `n` elements of `W`.
fn with_buffers<W: Element, T>(n: usize, f: impl FnOnce(&mut [W], &mut [W]) -> T) -> T {
    BUFFERS.with(|b| {
        let (send, recv) = &mut *b.borrow_mut();
        let words = (n * std::mem::size_of::<W>()).div_ceil(8);
        if send.len() < words {
            send.resize(words, 0);
            recv.resize(words, 0);
        }
        let send = &mut bytemuck::cast_slice_mut::<u64, W>(&mut send[..words])[..n];
        let recv = &mut bytemuck::cast_slice_mut::<u64, W>(&mut recv[..words])[..n];
        f(send, recv)
    })
}

/// A piece of a fused bucket: (pair, first element, elements).
type Piece = (usize, usize, usize);

/// The pieces of `pairs`' sources in buckets of at most `bucket` elements, in order: an
/// array that does not fit in what is left of a bucket continues in the next.
fn plan(pairs: &[(&NDArray, &NDArray)], bucket: usize) -> Vec<Vec<Piece>> {
    let mut buckets = vec![Vec::new()];
    let mut filled = 0;
    for (p, (src, _)) in pairs.iter().enumerate() {
        let len = src.size();
        let mut off = 0;
        while off < len {
            if filled == bucket {
                buckets.push(Vec::new());
                filled = 0;
            }
            let take = (len - off).min(bucket - filled);
            buckets.last_mut().expect("a bucket").push((p, off, take));
            off += take;
            filled += take;
        }
    }
    buckets.retain(|b| !b.is_empty());
    buckets
}

/// Copies `pieces` of the sources into `slot`, one after another, as `W`. A source of
/// another dtype (f16, bf16) is converted whole once (`converted` keeps the last one,
/// for its pieces in the next bucket).
fn pack<W: Element>(
    pairs: &[(&NDArray, &NDArray)],
    pieces: &[Piece],
    slot: &mut [W],
    converted: &mut Option<(usize, Vec<W>)>,
) -> Result<()> {
    let mut at = 0;
    for &(p, off, len) in pieces {
        let src = pairs[p].0;
        let to = &mut slot[at..at + len];
        if src.dtype() == W::DTYPE {
            src.with_data(|s: &[W]| to.copy_from_slice(&s[off..off + len]))?;
        } else {
            if converted.as_ref().is_none_or(|(q, _)| *q != p) {
                *converted = Some((p, read_wire::<W>(src)?));
            }
            let (_, data) = converted.as_ref().expect("converted above");
            to.copy_from_slice(&data[off..off + len]);
        }
        at += len;
    }
    Ok(())
}

/// Writes each piece's sum over the ranks' `slots` (by rank) into its destination:
/// summed as [`tree_sum`] sums, so a key gets the same bits whichever path it took.
fn store_sums<W: Element>(pairs: &[(&NDArray, &NDArray)], pieces: &[Piece], slots: &[&[W]]) -> Result<()> {
    let mut at = 0;
    let mut parts = Vec::with_capacity(slots.len());
    for &(p, off, len) in pieces {
        parts.clear();
        parts.extend(slots.iter().map(|s| &s[at..at + len]));
        store_piece::<W>(pairs[p].1, off, len, |out| tree_into(&parts, out))?;
        at += len;
    }
    Ok(())
}

impl MpiGroup {
    /// Small arrays of one wire type `W`, fused into buckets of `bucket` elements:
    /// through the machine's shared window where it is open ([`NodeWindow`](crate::shm::NodeWindow)), else
    /// staged in the reused send buffer.
    pub(crate) fn allreduce_fused<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        bucket: usize,
    ) -> Result<()> {
        let total: usize = pairs.iter().map(|(s, _)| s.size()).sum();
        let bucket = bucket.min(total.max(1));
        let buckets = plan(pairs, bucket);
        let background = in_background();
        let through_window = self.with_mpi(|mpi| -> Result<bool> {
            // Opened at the first fused bucket, every rank agreeing; then used while this
            // rank wants it (every rank must say the same: `set_shared_memory`).
            let wanted = self.shared_memory.load(Ordering::Relaxed);
            let window = match mpi.window(bucket * size_of::<W>(), wanted) {
                Some(w) if wanted => w,
                _ => {
                    self.used_shared_memory.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
            };
            self.used_shared_memory.store(true, Ordering::Relaxed);
            let mut converted = None;
            for pieces in &buckets {
                // Each bucket is one wait for the other ranks, timed on its own.
                watchdog::Watched::restart();
                let len = pieces.iter().map(|p| p.2).sum();
                pack::<W>(pairs, pieces, window.my_slot::<W>(len), &mut converted)?;
                window.publish::<W, _>(len, background, |slots| store_sums(pairs, pieces, slots))?;
            }
            Ok(true)
        })??;
        if through_window {
            return Ok(());
        }
        with_buffers::<W, _>(bucket, |send, recv| -> Result<()> {
            let mut converted = None;
            for pieces in &buckets {
                let len = pieces.iter().map(|p| p.2).sum();
                pack::<W>(pairs, pieces, &mut send[..len], &mut converted)?;
                self.flush_bucket(pairs, &send[..len], &mut recv[..len], pieces)?;
            }
            Ok(())
        })
    }

    /// Sums one staged bucket across the ranks and writes each summed piece into its
    /// destination. On 2 ranks the ranks swap their buckets and each sums
    /// `rank 0's + rank 1's` straight into the destinations: one round of messages and
    /// no copy out of a receive buffer, where MPI's allreduce takes two rounds (reduce-
    /// scatter, allgather) and copies the send buffer first. The sum is the one MPI's
    /// makes on 2 ranks, a0 + a1, so a key gets the same bits fused as alone or big.
    fn flush_bucket<W: Element + Equivalence>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        send: &[W],
        recv: &mut [W],
        pending: &[Piece],
    ) -> Result<()> {
        if self.size == 2 {
            let peer = 1 - self.rank as i32;
            self.with_world(|w| swap(w, peer, send, &mut *recv))?;
            let (lo, hi) = if self.rank == 0 { (send, &*recv) } else { (&*recv, send) };
            let mut at = 0;
            for &(p, off, len) in pending {
                let (a, b) = (&lo[at..at + len], &hi[at..at + len]);
                store_piece::<W>(pairs[p].1, off, len, |out| add_into(a, b, out))?;
                at += len;
            }
            return Ok(());
        }
        self.with_world(|w| tree_sum(w, send, &mut *recv))?;
        let mut at = 0;
        for &(p, off, len) in pending {
            store_piece::<W>(pairs[p].1, off, len, |out| out.copy_from_slice(&recv[at..at + len]))?;
            at += len;
        }
        Ok(())
    }
}
