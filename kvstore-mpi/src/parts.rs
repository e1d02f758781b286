//! The two halves of a `dist_sync` push with owners. [`MpiGroup::reduce_scatter_parts`]:
//! each rank sends every other rank that rank's ranges of the arrays, all at once, and
//! sums its own ranges over the ranks in the tree's order ([`tree_into`]): the bits of
//! the allreduce, with half its bytes (each rank receives its ranges only).
//! [`MpiGroup::gather_parts`]: each owner's ranges sent to every other rank, straight
//! into their arrays.
//!
//! Arrays of [`DIRECT_BYTES`] or more travel straight from the sources' memory (and, for
//! the all-gather, into the values'), in pieces, every piece in flight at once, each
//! piece summed as soon as every rank's has arrived; smaller ones are packed into one
//! buffer per rank (one message per rank instead of one per array). Which way an array
//! goes depends on its size and dtype only, the same on every rank.

use std::collections::VecDeque;
use std::ops::Range;

use kvstore_core::backend::{
    gather_parts_through_bytes, with_all_bytes as with_all, with_all_bytes_mut as with_all_mut,
};
use kvstore_core::{DType, Element, Error, NDArray, Result, bf16, f16};
use mpi::datatype::Equivalence;
use mpi::traits::*;

use crate::group::MpiGroup;
use crate::runtime::wait;
use crate::scatter::{wait_data, with_scratch};
use crate::tree::tree_into;
use crate::watchdog;
use crate::wire::{store_piece, with_wire};

/// The tags of the reduce-scatter's and the all-gather's messages.
const PARTS_TAG: i32 = 12;
const GATHER_PARTS_TAG: i32 = 13;
/// The bytes of one message: an array's ranges travel in pieces of this size, all in
/// flight at once (MPI counts elements in an `int`).
const PIECE_BYTES: usize = 1 << 20;
/// The bytes from which an array travels straight from its own memory. Below, arrays are
/// packed: a message per array would cost more than the copy.
const DIRECT_BYTES: usize = 64 << 10;

thread_local! {
    /// The other ranks' pieces of this rank's ranges (reused: fresh buffers of the
    /// model's size would page-fault on every push).
    static THEIRS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The packed ranges of small arrays, every rank's.
    static PACKED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `range` in pieces of at most `piece` elements.
fn pieces(range: Range<usize>, piece: usize) -> impl Iterator<Item = Range<usize>> {
    range.clone().step_by(piece.max(1)).map(move |s| s..(s + piece).min(range.end))
}

/// The indices of `items` that `keep` keeps, and those items.
fn select<T: Copy>(items: &[T], keep: impl Fn(usize) -> bool) -> (Vec<usize>, Vec<T>) {
    (0..items.len()).filter(|&i| keep(i)).map(|i| (i, items[i])).unzip()
}

/// Whether `a` shares memory with any other array of `all` (the array at `me` itself
/// excepted).
fn aliased(a: &NDArray, me: usize, all: &[&NDArray]) -> bool {
    all.iter().enumerate().any(|(i, b)| i != me && a.shares_memory(b))
}

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

    /// [`MpiGroup::reduce_scatter_parts`] of pairs of one wire type `W`: the arrays of
    /// `W` itself of [`DIRECT_BYTES`] or more straight from their memory, the rest
    /// packed.
    fn scatter_run<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        parts: &[Vec<Range<usize>>],
    ) -> Result<()> {
        let direct = |(s, _): &(&NDArray, &NDArray)| {
            s.dtype() == W::DTYPE && s.size() * std::mem::size_of::<W>() >= DIRECT_BYTES
        };
        let (small, packed) = select(pairs, |i| !direct(&pairs[i]));
        let (big, straight) = select(pairs, |i| direct(&pairs[i]));
        // The messages are the same whatever the arrays' memory; where it overlaps, the
        // direct sums use private copies, made before anything is written (as the
        // default reads every source before it writes a destination): a destination
        // over another array of the direct sums is summed into a copy, then copied in;
        // a source under a small pair's destination (written first) is read from a copy.
        let all: Vec<&NDArray> = straight.iter().flat_map(|(s, d)| [*s, *d]).collect();
        let small_dests: Vec<&NDArray> = packed.iter().map(|(_, d)| *d).collect();
        let mut copies: Vec<(Option<NDArray>, Option<NDArray>)> = Vec::with_capacity(straight.len());
        for (j, (s, d)) in straight.iter().enumerate() {
            let src = match small_dests.iter().any(|x| x.shares_memory(s)) {
                true => Some(s.deep_copy()?),
                false => None,
            };
            let dst = match aliased(d, 2 * j + 1, &all) {
                true => Some(NDArray::zeros_with(d.shape(), d.dtype(), d.context())?),
                false => None,
            };
            copies.push((src, dst));
        }
        if !packed.is_empty() {
            let small_parts: Vec<Vec<Range<usize>>> = small.iter().map(|&i| parts[i].clone()).collect();
            self.scatter_packed::<W>(&packed, &small_parts)?;
        }
        if straight.is_empty() {
            return Ok(());
        }
        let big_parts: Vec<Vec<Range<usize>>> = big.iter().map(|&i| parts[i].clone()).collect();
        let used: Vec<(&NDArray, &NDArray)> = straight
            .iter()
            .zip(&copies)
            .map(|((s, d), (cs, cd))| (cs.as_ref().unwrap_or(s), cd.as_ref().unwrap_or(d)))
            .collect();
        self.scatter_direct::<W>(&used, &big_parts)?;
        for ((_, d), (_, sums)) in straight.iter().zip(&copies) {
            if let Some(sums) = sums {
                d.copy_from(sums)?;
            }
        }
        Ok(())
    }

    /// Pairs of `W` summed straight from the sources' memory into the destinations'
    /// (which share none with any source): each other rank's pieces of this rank's
    /// ranges received into [`THEIRS`], each piece summed as soon as every rank's has
    /// arrived, while the rest travel.
    fn scatter_direct<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        parts: &[Vec<Range<usize>>],
    ) -> Result<()> {
        let (me, n) = (self.rank, self.size);
        let piece = (PIECE_BYTES / std::mem::size_of::<W>()).max(1);
        // This rank's pieces, array after array: (array, its elements).
        let own: Vec<(usize, Range<usize>)> =
            parts.iter().enumerate().flat_map(|(j, p)| pieces(p[me].clone(), piece).map(move |r| (j, r))).collect();
        let mine: usize = parts.iter().map(|p| p[me].len()).sum();
        let sources: Vec<&NDArray> = pairs.iter().map(|(s, _)| *s).collect();
        let dests: Vec<&NDArray> = pairs.iter().map(|(_, d)| *d).collect();
        with_all(&sources, |srcs| {
            let srcs: Vec<&[W]> = srcs.into_iter().map(bytemuck::cast_slice).collect();
            with_all_mut(&dests, |dsts| {
                let mut dsts: Vec<&mut [W]> = dsts.into_iter().map(bytemuck::cast_slice_mut).collect();
                with_scratch(&THEIRS, mine * (n - 1), |theirs: &mut [W]| {
                    self.with_world(|w| {
                        mpi::request::scope(|scope| {
                            let others: Vec<usize> = (0..n).filter(|&r| r != me).collect();
                            let mut rest = theirs;
                            let mut arriving: Vec<VecDeque<_>> = Vec::with_capacity(others.len());
                            for &r in &others {
                                let p = w.process_at_rank(r as i32);
                                let mut from = VecDeque::with_capacity(own.len());
                                for (_, range) in &own {
                                    let (into, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
                                    rest = tail;
                                    from.push_back(p.immediate_receive_into_with_tag(scope, into, PARTS_TAG));
                                }
                                arriving.push(from);
                            }
                            let mut sends = Vec::new();
                            for &r in &others {
                                let p = w.process_at_rank(r as i32);
                                for (src, part) in srcs.iter().zip(parts) {
                                    for range in pieces(part[r].clone(), piece) {
                                        sends.push(p.immediate_send_with_tag(scope, &src[range], PARTS_TAG));
                                    }
                                }
                            }
                            for (j, range) in &own {
                                let mut got = arriving
                                    .iter_mut()
                                    .map(|from| wait_data(from.pop_front().expect("a rank's piece")));
                                let all: Vec<&[W]> = (0..n)
                                    .map(|r| match r == me {
                                        true => &srcs[*j][range.clone()],
                                        false => got.next().expect("a part"),
                                    })
                                    .collect();
                                let at = range.start - parts[*j][me].start;
                                tree_into(&all, &mut dsts[*j][at..at + range.len()]);
                            }
                            for s in sends {
                                wait(s);
                            }
                        })
                    })
                })
            })
        })???;
        Ok(())
    }

    /// Pairs of small arrays (or of f16/bf16, which travel widened to `W`): every rank's
    /// ranges packed into [`PACKED`], rank after rank, each rank's sent to it in
    /// pieces; this rank's summed from them into its destinations.
    fn scatter_packed<W: Element + Equivalence + bytemuck::Pod>(
        &self,
        pairs: &[(&NDArray, &NDArray)],
        parts: &[Vec<Range<usize>>],
    ) -> Result<()> {
        let (me, n) = (self.rank, self.size);
        let counts: Vec<usize> = (0..n).map(|r| parts.iter().map(|p| p[r].len()).sum()).collect();
        let starts: Vec<usize> = counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
        let (total, mine) = (counts.iter().sum::<usize>(), counts[me]);
        with_scratch(&PACKED, total, |send: &mut [W]| {
            // Every rank's ranges of the sources, rank after rank.
            let mut at = 0;
            for r in 0..n {
                for ((src, _), p) in pairs.iter().zip(parts) {
                    fill_wire(src, p[r].clone(), &mut send[at..at + p[r].len()])?;
                    at += p[r].len();
                }
            }
            with_scratch(&THEIRS, mine * (n - 1), |theirs: &mut [W]| {
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
                // This rank's ranges, summed over the ranks in the tree's order, straight
                // into the destinations.
                let mut at = 0;
                for ((_, dst), p) in pairs.iter().zip(parts) {
                    let len = p[me].len();
                    let mut others = theirs.chunks(mine.max(1));
                    let all: Vec<&[W]> = (0..n)
                        .map(|r| match r == me {
                            true => &send[starts[me] + at..starts[me] + at + len],
                            false => &others.next().unwrap_or(&[])[at..at + len],
                        })
                        .collect();
                    store_piece::<W>(dst, 0, len, |d| tree_into(&all, d))?;
                    at += len;
                }
                Ok(())
            })
        })
    }

    /// [`kvstore_core::backend::Collective::all_gather_parts`]: arrays of
    /// [`DIRECT_BYTES`] or more from each owner's memory straight into every other
    /// rank's, in pieces, all in flight at once; smaller ones packed, through MPI's
    /// allgather ([`gather_parts_through_bytes`]).
    pub(crate) fn gather_parts(&self, step: &str, arrays: &[&NDArray], parts: &[Vec<Range<usize>>]) -> Result<()> {
        kvstore_core::backend::check_parts(step, arrays.iter().copied(), parts, self.size)?;
        if self.size == 1 {
            return Ok(());
        }
        // Each array's owners by where their ranges start: the ranges must not overlap
        // (refused before anything moves, on every rank alike: the parts are the same).
        let order: Vec<Vec<usize>> = parts
            .iter()
            .map(|p| {
                let mut owners: Vec<usize> = (0..self.size).filter(|&r| !p[r].is_empty()).collect();
                owners.sort_by_key(|&r| p[r].start);
                owners
            })
            .collect();
        if order.iter().zip(parts).any(|(o, p)| o.windows(2).any(|w| p[w[0]].end > p[w[1]].start)) {
            return Err(Error::Internal(format!("{step}: ranks' parts that overlap")));
        }
        let direct = |a: &NDArray| a.size() * a.dtype().size() >= DIRECT_BYTES;
        let (small, packed) = select(arrays, |i| !direct(arrays[i]));
        if !packed.is_empty() {
            let small_parts: Vec<Vec<Range<usize>>> = small.iter().map(|&i| parts[i].clone()).collect();
            gather_parts_through_bytes(self, step, &packed, &small_parts)?;
        }
        let (big, straight) = select(arrays, |i| direct(arrays[i]));
        if straight.is_empty() {
            return Ok(());
        }
        let big_parts: Vec<Vec<Range<usize>>> = big.iter().map(|&i| parts[i].clone()).collect();
        let order: Vec<&Vec<usize>> = big.iter().map(|&i| &order[i]).collect();
        // An array over another's memory is gathered into a copy, then the ranges it
        // received written back (an array given twice keeps what each time received).
        let copies: Vec<Option<NDArray>> = straight
            .iter()
            .enumerate()
            .map(|(j, a)| if aliased(a, j, &straight) { a.deep_copy().map(Some) } else { Ok(None) })
            .collect::<Result<_>>()?;
        let used: Vec<&NDArray> = straight.iter().zip(&copies).map(|(a, c)| c.as_ref().unwrap_or(a)).collect();
        watchdog::set_step(step);
        let (me, n) = (self.rank, self.size);
        with_all_mut(&used, |mut values| {
            self.with_world(|w| {
                mpi::request::scope(|scope| {
                    let mut requests = Vec::new();
                    for (((v, p), owners), a) in values.iter_mut().zip(&big_parts).zip(order.iter().copied()).zip(&used)
                    {
                        let each = a.dtype().size();
                        let (mut rest, mut at) = (std::mem::take(v), 0);
                        for &r in owners {
                            let (_, tail) = rest.split_at_mut(p[r].start * each - at);
                            let (seg, tail) = tail.split_at_mut(p[r].len() * each);
                            (rest, at) = (tail, p[r].end * each);
                            if r == me {
                                let seg: &[u8] = seg;
                                for o in (0..n).filter(|&o| o != me) {
                                    let to = w.process_at_rank(o as i32);
                                    for c in seg.chunks(PIECE_BYTES) {
                                        requests.push(to.immediate_send_with_tag(scope, c, GATHER_PARTS_TAG));
                                    }
                                }
                            } else {
                                let from = w.process_at_rank(r as i32);
                                for c in seg.chunks_mut(PIECE_BYTES) {
                                    requests.push(from.immediate_receive_into_with_tag(scope, c, GATHER_PARTS_TAG));
                                }
                            }
                        }
                    }
                    for q in requests {
                        wait(q);
                    }
                })
            })
        })??;
        for ((a, c), p) in straight.iter().zip(&copies).zip(&big_parts) {
            if let Some(c) = c {
                let each = a.dtype().size();
                with_all(&[c], |from| {
                    with_all_mut(&[*a], |mut into| {
                        for r in (0..n).filter(|&r| r != me) {
                            let bytes = p[r].start * each..p[r].end * each;
                            into[0][bytes.clone()].copy_from_slice(&from[0][bytes]);
                        }
                    })
                })??;
            }
        }
        Ok(())
    }
}

/// Writes the elements `range` of `src` into `out` as wire elements `W` (f16 and bf16
/// widened).
fn fill_wire<W: Element>(src: &NDArray, range: Range<usize>, out: &mut [W]) -> Result<()> {
    fn widen<T: Element, W: Element>(src: &NDArray, range: Range<usize>, out: &mut [W]) -> Result<()> {
        src.with_data(|s: &[T]| {
            for (o, x) in out.iter_mut().zip(&s[range]) {
                *o = W::from_f64(x.to_f64());
            }
        })
    }
    match src.dtype() {
        d if d == W::DTYPE => src.with_data(|s: &[W]| out.copy_from_slice(&s[range])),
        DType::F16 => widen::<f16, W>(src, range, out),
        DType::BF16 => widen::<bf16, W>(src, range, out),
        d => Err(Error::Internal(format!("mpi: {d} does not travel as {}", W::DTYPE))),
    }
}
