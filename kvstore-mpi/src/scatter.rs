//! Big arrays summed at the bound of the bytes a rank must move ([`scatter_sum`]): each
//! rank owns a segment, sums it from every rank's pieces in the tree's order, and sends
//! the sums back; every piece in flight at once, under way as a [`Summing`] (posted,
//! polled, finished), so that several overlap (the steps of `hosts.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

use kvstore_core::Element;
use kvstore_core::backend::in_background;
use mpi::datatype::Equivalence;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::runtime::wait;
use crate::tree::tree_into;

/// The tags of [`scatter_sum`]'s messages: a rank's pieces of another rank's segment,
/// and a segment's sums.
const SCATTER_TAG: i32 = 10;
pub(crate) const GATHER_TAG: i32 = 11;
/// The bytes of a piece of [`scatter_sum`]: every piece is in flight at once, and each
/// is summed as soon as it has arrived from every rank, while the others travel.
const PIECE_BYTES: usize = 1 << 20;

/// A buffer of this thread's, reused across calls (u64 words: every element type is
/// aligned): fresh multi-megabyte buffers would page-fault on every call.
pub(crate) type Scratch = std::thread::LocalKey<std::cell::RefCell<Vec<u64>>>;

thread_local! {
    /// [`scatter_sum`]'s receive buffer.
    static SCATTERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most bytes any thread's [`Scratch`] buffer has held in this process
/// (`MpiGroup::largest_scratch_bytes`).
pub(crate) static LARGEST_SCRATCH: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on `n` elements of `W` of the buffer `scratch`.
pub(crate) fn with_scratch<W: bytemuck::Pod, T>(
    scratch: &'static Scratch,
    n: usize,
    f: impl FnOnce(&mut [W]) -> T,
) -> T {
    scratch.with(|b| {
        let mut words = b.borrow_mut();
        let need = (n * std::mem::size_of::<W>()).div_ceil(8);
        if words.len() < need {
            words.resize(need, 0);
            LARGEST_SCRATCH.fetch_max(need * 8, Ordering::Relaxed);
        }
        f(&mut bytemuck::cast_slice_mut::<u64, W>(&mut words[..need])[..n])
    })
}

/// Rank `r`'s segment of `len` elements on `size` ranks.
pub(crate) fn segment(len: usize, size: usize, r: usize) -> std::ops::Range<usize> {
    len * r / size..len * (r + 1) / size
}

/// `recv = sum(send)` across the ranks, every element in [`tree_sum`](crate::tree::tree_sum)'s order, at the
/// bound of the bytes a rank must move: rank r owns segment r of the array (1/n of
/// it). Every rank sends each other rank its pieces of that rank's segment, all at once;
/// the owner sums each piece over the ranks, in the tree's order ([`tree_into`]), as
/// soon as every rank's has arrived (while the others travel), and sends the sum to
/// every other rank, which receives it in place. Each rank sends and receives
/// 2(n - 1)/n of the array, as a ring does; but a ring sums each part of the array in
/// another order, where here every element gets the same sum whatever its place in the
/// array, the array's size or the ranks' hosts. `send` and `recv` do not overlap.
pub(crate) fn scatter_sum<W: Element + Equivalence + bytemuck::Pod>(
    w: &SimpleCommunicator,
    send: &[W],
    recv: &mut [W],
) {
    sum_segments(w, send, recv, true);
}

/// [`scatter_sum`] (`whole`: `out` is the whole array, and every segment's sums travel
/// back to every rank) or its first half (`out` is this rank's segment only: the sums of
/// its segment, which no other rank receives).
fn sum_segments<W: Element + Equivalence + bytemuck::Pod>(
    w: &SimpleCommunicator,
    send: &[W],
    out: &mut [W],
    whole: bool,
) {
    let (me, n) = (w.rank() as usize, w.size() as usize);
    let theirs = segment(send.len(), n, me).len() * (n - 1);
    with_scratch(&SCATTERED, theirs, |theirs: &mut [W]| {
        mpi::request::scope(|scope| {
            Summing::post(scope, w, send, out, theirs, whole).finish();
        });
    });
}

/// Messages of elements `W` under way in a request scope.
type Requests<'a, W, S> = Vec<Request<'a, [W], S>>;

/// A sum of segments under way ([`sum_segments`]: the whole array's, or this rank's
/// segment's only), in a request
/// scope: every message posted by [`Summing::post`]; [`Summing::poll`] sums this rank's
/// next pieces whose parts have all arrived (and sends the sums on, for the whole
/// array); [`Summing::finish`] sums the rest and waits for every message. Several can be
/// under way at once, each summed as its pieces arrive: the steps of a sum host by host
/// ([`crate::hosts`]) overlap that way.
pub(crate) struct Summing<'a, W: Equivalence, S: Scope<'a>> {
    w: &'a SimpleCommunicator,
    scope: S,
    send: &'a [W],
    /// This rank's segment of the array.
    mine: std::ops::Range<usize>,
    piece: usize,
    /// Every other rank's pieces of this rank's segment, in rank order, piece by piece.
    arriving: Vec<std::collections::VecDeque<Request<'a, [W], S>>>,
    /// The parts of the next piece that have arrived (by other rank).
    got: Vec<Option<&'a [W]>>,
    /// The next piece to sum.
    next: usize,
    /// This rank's segment's sums: its pieces not yet summed (`whole`), or all of it.
    own: &'a mut [W],
    /// Its summed pieces (`whole`: each sent to every other rank as it is summed).
    summed: Vec<&'a [W]>,
    /// The other ranks' segments' sums on their way here, by rank (`whole`).
    sums: Vec<(usize, Requests<'a, W, S>)>,
    /// Sends, waited for at the end.
    sends: Requests<'a, W, S>,
    whole: bool,
}

impl<'a, W: Element + Equivalence + bytemuck::Pod, S: Scope<'a> + Copy> Summing<'a, W, S> {
    /// Posts every message of [`sum_segments`] over `w`: this rank's pieces of the other
    /// ranks' segments of `send`, the receives of theirs of this rank's segment into
    /// `theirs` ((n - 1) times this rank's segment), and, for the `whole` array, the
    /// receives of the other segments' sums into `out` (the array; else `out` is this
    /// rank's segment).
    pub(crate) fn post(
        scope: S,
        w: &'a SimpleCommunicator,
        send: &'a [W],
        out: &'a mut [W],
        theirs: &'a mut [W],
        whole: bool,
    ) -> Self {
        let (me, n) = (w.rank() as usize, w.size() as usize);
        let len = send.len();
        let piece = (PIECE_BYTES / std::mem::size_of::<W>()).max(1);
        let mine = segment(len, n, me);
        let others: Vec<usize> = (0..n).filter(|&r| r != me).collect();
        // out: the other ranks' segments (their sums arrive there) and this rank's.
        let (mut lower, own, mut upper) = if whole {
            let (before, rest) = out.split_at_mut(mine.start);
            let (own, after) = rest.split_at_mut(mine.len());
            (before, own, after)
        } else {
            (&mut [][..], out, &mut [][..])
        };
        let mut sends = Vec::new();
        let mut sums = Vec::new();
        for &r in &others {
            let seg = segment(len, n, r);
            let p = w.process_at_rank(r as i32);
            for part in send[seg.clone()].chunks(piece) {
                sends.push(p.immediate_send_with_tag(scope, part, SCATTER_TAG));
            }
            if whole {
                let into = next_segment(&mut lower, &mut upper, r < me, seg.len()).chunks_mut(piece);
                sums.push((r, into.map(|part| p.immediate_receive_into_with_tag(scope, part, GATHER_TAG)).collect()));
            }
        }
        let theirs = &mut theirs[..mine.len() * others.len()];
        let arriving = theirs
            .chunks_mut(mine.len().max(1))
            .zip(&others)
            .map(|(chunk, &r)| {
                let p = w.process_at_rank(r as i32);
                chunk
                    .chunks_mut(piece)
                    .map(|part| p.immediate_receive_into_with_tag(scope, part, SCATTER_TAG))
                    .collect()
            })
            .collect();
        Summing {
            w,
            scope,
            send,
            mine,
            piece,
            arriving,
            got: vec![None; others.len()],
            next: 0,
            own,
            summed: Vec::new(),
            sums,
            sends,
            whole,
        }
    }

    /// Sums every next piece whose parts have all arrived, without waiting: whether
    /// every piece is summed.
    pub(crate) fn poll(&mut self) -> bool {
        let (me, n) = (self.w.rank() as usize, self.w.size() as usize);
        let pieces = self.mine.len().div_ceil(self.piece);
        while self.next < pieces {
            // (Every rank sends as many pieces of this segment as this rank receives.)
            for (from, got) in self.arriving.iter_mut().zip(self.got.iter_mut()) {
                if got.is_none() {
                    match from.pop_front().expect("a rank's piece").test_with_data() {
                        Ok((_, data)) => *got = Some(data),
                        Err(pending) => from.push_front(pending),
                    }
                }
            }
            if self.got.iter().any(Option::is_none) {
                return false;
            }
            let at = self.next * self.piece;
            let len = self.piece.min(self.mine.len() - at);
            let mut got = self.got.iter_mut().map(|g| g.take().expect("arrived"));
            let from = self.mine.start + at;
            let parts: Vec<&[W]> = (0..n)
                .map(|r| if r == me { &self.send[from..from + len] } else { got.next().expect("a part") })
                .collect();
            if self.whole {
                let (out, rest) = std::mem::take(&mut self.own).split_at_mut(len);
                self.own = rest;
                tree_into(&parts, out);
                let out: &'a [W] = out;
                for r in (0..n).filter(|&r| r != me) {
                    let p = self.w.process_at_rank(r as i32);
                    self.sends.push(p.immediate_send_with_tag(self.scope, out, GATHER_TAG));
                }
                self.summed.push(out);
            } else {
                tree_into(&parts, &mut self.own[at..at + len]);
            }
            self.next += 1;
        }
        true
    }

    /// Sums the rest (yielding the core while pieces travel) and waits for every
    /// message. The sums, in pieces in the array's order: for the whole array, every
    /// segment's in the pieces it travelled in ([`sum_pieces`]); else this rank's
    /// segment whole.
    pub(crate) fn finish(mut self) -> Vec<&'a [W]> {
        while !self.poll() {
            std::thread::yield_now();
        }
        for r in self.sends {
            wait(r);
        }
        if !self.whole {
            return vec![self.own];
        }
        let me = self.w.rank() as usize;
        let mut pieces = Vec::new();
        let mut sums = self.sums.into_iter().peekable();
        while sums.peek().is_some_and(|(r, _)| *r < me) {
            pieces.extend(sums.next().expect("a lower rank's").1.into_iter().map(wait_data));
        }
        pieces.extend(self.summed);
        pieces.extend(sums.flat_map(|(_, s)| s).map(wait_data));
        pieces
    }
}

/// The lengths of the pieces a segment of `len` elements travels in once summed by
/// [`scatter_sum`] over `n` ranks: each rank's part of it, in rank order, in pieces of
/// [`PIECE_BYTES`].
pub(crate) fn sum_pieces<W>(len: usize, n: usize) -> impl Iterator<Item = usize> {
    let piece = (PIECE_BYTES / std::mem::size_of::<W>()).max(1);
    (0..n).flat_map(move |r| {
        let part = segment(len, n, r).len();
        (0..part.div_ceil(piece)).map(move |i| piece.min(part - i * piece))
    })
}

/// The next other rank's segment of an array split around this rank's: the first `len`
/// elements of what is left `lower` (a lower rank's) or `upper` (a higher rank's).
pub(crate) fn next_segment<'a, W>(
    lower: &mut &'a mut [W],
    upper: &mut &'a mut [W],
    below: bool,
    len: usize,
) -> &'a mut [W] {
    let side = if below { lower } else { upper };
    let (x, rest) = std::mem::take(side).split_at_mut(len);
    *side = rest;
    x
}

/// The data of a receive, once it arrived (waited for as [`wait`] does).
pub(crate) fn wait_data<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>) -> &'a D {
    loop {
        match request.test_with_data() {
            Ok((_, data)) => return data,
            Err(pending) => {
                request = pending;
                if in_background() {
                    std::thread::yield_now();
                }
            }
        }
    }
}
