//! The sums of a `dist_sync` push with owners ([`MpiGroup::reduce_scatter_parts`]): each
//! rank sends every other rank that rank's ranges of the arrays, all at once, and sums
//! its own ranges over the ranks in the tree's order ([`tree_into`]): the bits of the
//! allreduce, with half its bytes (each rank receives its ranges only).

use std::ops::Range;

use kvstore_core::{DType, Element, Error, NDArray, Result, bf16, f16};
use mpi::datatype::Equivalence;
use mpi::traits::*;

use crate::group::MpiGroup;
use crate::runtime::wait;
use crate::tree::tree_into;
use crate::wire::{store_piece, with_wire};

/// The tag of [`MpiGroup::reduce_scatter_parts`]'s messages.
const PARTS_TAG: i32 = 12;
/// The bytes of one of its messages: a rank's ranges travel in pieces of this size, all
/// in flight at once (MPI counts elements in an `int`).
const PIECE_BYTES: usize = 1 << 20;

impl MpiGroup {
    /// [`kvstore_core::backend::Collective::reduce_scatter_sum`]: for each run of pairs
    /// of one wire type (f16 and bf16 travel as f32, and round once), every rank's
    /// elements of rank `r`'s ranges go to rank `r`, which sums them in the tree's order
    /// into its ranges of the destinations.
    pub(crate) fn reduce_scatter_parts(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        parts: &[Vec<Range<usize>>],
    ) -> Result<()> {
        kvstore_core::backend::check_parts("mpi: a reduce-scatter", pairs.iter().map(|(s, _)| *s), parts, self.size)?;
        if pairs.iter().zip(parts).any(|((_, d), p)| d.size() != p[self.rank].len()) {
            return Err(Error::Internal("mpi: a reduce-scatter's destination is not this rank's range".into()));
        }
        let wire = |d: DType| with_wire!(d, W => W::DTYPE);
        let mut start = 0;
        while start < pairs.len() {
            let t = wire(pairs[start].1.dtype());
            let end = (start..pairs.len()).find(|&i| wire(pairs[i].1.dtype()) != t).unwrap_or(pairs.len());
            with_wire!(pairs[start].1.dtype(), W => self.scatter_run::<W>(&pairs[start..end], &parts[start..end])?);
            start = end;
        }
        Ok(())
    }

    /// [`MpiGroup::reduce_scatter_parts`] of pairs of one wire type `W`.
    fn scatter_run<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        parts: &[Vec<Range<usize>>],
    ) -> Result<()> {
        let (me, n) = (self.rank, self.size);
        let counts: Vec<usize> = (0..n).map(|r| parts.iter().map(|p| p[r].len()).sum()).collect();
        // Every rank's ranges of the sources, rank after rank.
        let mut send: Vec<W> = Vec::with_capacity(counts.iter().sum());
        for r in 0..n {
            for ((src, _), p) in pairs.iter().zip(parts) {
                append_wire(src, p[r].clone(), &mut send)?;
            }
        }
        let starts: Vec<usize> = counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
        let mine = counts[me];
        let mut theirs: Vec<W> = vec![W::default(); mine * (n - 1)];
        if n > 1 {
            let piece = (PIECE_BYTES / std::mem::size_of::<W>()).max(1);
            self.with_world(|w| {
                mpi::request::scope(|scope| {
                    let mut requests = Vec::new();
                    let others = (0..n).filter(|&r| r != me);
                    for (r, into) in others.clone().zip(theirs.chunks_mut(mine.max(1))) {
                        let p = w.process_at_rank(r as i32);
                        for part in into.chunks_mut(piece) {
                            requests.push(p.immediate_receive_into_with_tag(scope, part, PARTS_TAG));
                        }
                    }
                    for r in others {
                        let p = w.process_at_rank(r as i32);
                        for part in send[starts[r]..starts[r] + counts[r]].chunks(piece) {
                            requests.push(p.immediate_send_with_tag(scope, part, PARTS_TAG));
                        }
                    }
                    for q in requests {
                        wait(q);
                    }
                });
            })?;
        }
        // This rank's ranges, summed over the ranks in the tree's order.
        let mut others = theirs.chunks(mine.max(1));
        let all: Vec<&[W]> = (0..n)
            .map(|r| match r == me {
                true => &send[starts[me]..starts[me] + mine],
                false => others.next().unwrap_or(&[]),
            })
            .collect();
        let mut sums = vec![W::default(); mine];
        tree_into(&all, &mut sums);
        let mut at = 0;
        for ((_, dst), p) in pairs.iter().zip(parts) {
            let len = p[me].len();
            store_piece::<W>(dst, 0, len, |d| d.copy_from_slice(&sums[at..at + len]))?;
            at += len;
        }
        Ok(())
    }
}

/// Appends the elements `range` of `src` as wire elements `W` (f16 and bf16 widened).
fn append_wire<W: Element>(src: &NDArray, range: Range<usize>, out: &mut Vec<W>) -> Result<()> {
    fn widen<T: Element, W: Element>(src: &NDArray, range: Range<usize>, out: &mut Vec<W>) -> Result<()> {
        src.with_data(|s: &[T]| out.extend(s[range].iter().map(|x| W::from_f64(x.to_f64()))))
    }
    match src.dtype() {
        d if d == W::DTYPE => src.with_data(|s: &[W]| out.extend_from_slice(&s[range])),
        DType::F16 => widen::<f16, W>(src, range, out),
        DType::BF16 => widen::<bf16, W>(src, range, out),
        d => Err(Error::Internal(format!("mpi: {d} does not travel as {}", W::DTYPE))),
    }
}
