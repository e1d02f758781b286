//! The fixed tree sum: every element summed over the ranks in one order, whatever its
//! place in a buffer ([`tree_into`]: the largest power of two of ranks on the left), by
//! messages up a binary tree ([`tree_sum`], fused buckets on 3 ranks or more), and the
//! swap of 2 ranks' buckets ([`swap`]), whose one sum `a0 + a1` is that tree's.

use kvstore_core::Element;
use kvstore_core::backend::in_background;
use mpi::datatype::Equivalence;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::runtime::wait;

/// The tag of [`tree_sum`]'s messages.
const TREE_TAG: i32 = 7;
/// The tag of [`swap`]'s messages (the world carries no other point-to-point ones).
const SWAP_TAG: i32 = 8;

/// Sends `send` to `peer` and receives the peer's buffer of the same length into
/// `recv`: blocking for a blocking store call, waited for as [`wait`] does for a
/// non-blocking one.
pub(crate) fn swap<W: Equivalence>(w: &SimpleCommunicator, peer: i32, send: &[W], recv: &mut [W]) {
    let p = w.process_at_rank(peer);
    if in_background() {
        mpi::request::scope(|scope| {
            let received = p.immediate_receive_into_with_tag(scope, recv, SWAP_TAG);
            let sent = p.immediate_send_with_tag(scope, send, SWAP_TAG);
            wait(received);
            wait(sent);
        });
    } else {
        mpi::point_to_point::send_receive_into_with_tags(send, &p, SWAP_TAG, recv, &p, SWAP_TAG);
    }
}

/// `recv = sum(send)` across the ranks with every element summed alike, wherever it sits
/// in the buffer: pairs of partial sums up a fixed binary tree, the lower ranks' on the
/// left (((a0 + a1) + (a2 + a3)) on 4 ranks), then rank 0's result to every rank. MPI's
/// own allreduce picks its algorithm by message size, and some (a ring) sum each part
/// of the buffer in a different order: on 3 or more ranks, a key fused with other
/// keys (a list call, or non-blocking calls fused across calls) could then get other
/// bits than the same key summed alone. On 2 ranks every algorithm makes the one sum
/// a0 + a1: fused buckets use [`swap`] there. Big arrays use [`scatter_sum`](crate::scatter::scatter_sum), which sums
/// in this order too.
pub(crate) fn tree_sum<W: Element + Equivalence>(w: &SimpleCommunicator, send: &[W], recv: &mut [W]) {
    let (rank, size) = (w.rank(), w.size());
    recv.copy_from_slice(send);
    let mut theirs: Vec<W> = Vec::new();
    let mut step = 1;
    while step < size {
        if rank % (2 * step) == step {
            let to = w.process_at_rank(rank - step);
            if in_background() {
                mpi::request::scope(|scope| wait(to.immediate_send_with_tag(scope, &recv[..], TREE_TAG)));
            } else {
                to.send_with_tag(&recv[..], TREE_TAG);
            }
            break;
        }
        if rank + step < size {
            theirs.resize(recv.len(), W::default());
            let from = w.process_at_rank(rank + step);
            if in_background() {
                mpi::request::scope(|scope| {
                    wait(from.immediate_receive_into_with_tag(scope, &mut theirs[..], TREE_TAG))
                });
            } else {
                from.receive_into_with_tag(&mut theirs[..], TREE_TAG);
            }
            add_to(recv, &theirs);
        }
        step *= 2;
    }
    let root = w.process_at_rank(0);
    if in_background() {
        mpi::request::scope(|scope| wait(root.immediate_broadcast_into(scope, recv)));
    } else {
        root.broadcast_into(recv);
    }
}

/// Writes the sums of `parts` (by rank) into `out`, in [`tree_sum`]'s order: the
/// largest power of two of ranks below their number on the left, the rest on the right,
/// each summed alike ((a0 + a1) + a2 on 3 ranks, ((a0 + a1) + (a2 + a3)) + a4 on 5).
/// [`TREE_CHUNK`] elements at a time, each level's right-hand sums in a buffer on the
/// stack (no allocation, and the partial sums stay in the cache).
pub(crate) fn tree_into<W: Element>(parts: &[&[W]], out: &mut [W]) {
    for (i, chunk) in out.chunks_mut(TREE_CHUNK).enumerate() {
        tree_chunk(parts, i * TREE_CHUNK, chunk);
    }
}

/// The elements [`tree_into`] sums at a time.
const TREE_CHUNK: usize = 1024;

/// [`tree_into`] of the elements `at..at + out.len()` of `parts` (at most
/// [`TREE_CHUNK`]).
fn tree_chunk<W: Element>(parts: &[&[W]], at: usize, out: &mut [W]) {
    let range = at..at + out.len();
    match parts {
        [one] => out.copy_from_slice(&one[range]),
        [a, b] => add_into(&a[range.clone()], &b[range], out),
        _ => {
            let left = parts.len().next_power_of_two() / 2;
            tree_chunk(&parts[..left], at, out);
            let mut right = [W::default(); TREE_CHUNK];
            let right = &mut right[..out.len()];
            tree_chunk(&parts[left..], at, right);
            add_to(out, right);
        }
    }
}

/// `out += b`, element by element, rounded once.
fn add_to<W: Element>(out: &mut [W], b: &[W]) {
    for (o, &y) in out.iter_mut().zip(b) {
        *o = W::from_acc(W::acc_add(o.to_acc(), y.to_acc()));
    }
}

/// `out = a + b`, element by element, rounded once.
pub(crate) fn add_into<W: Element>(a: &[W], b: &[W], out: &mut [W]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = W::from_acc(W::acc_add(x.to_acc(), y.to_acc()));
    }
}

#[cfg(test)]
mod tests {
    use super::{TREE_CHUNK, tree_into};

    /// The tree's definition, one level at a time, each level's sums in a vector of
    /// their own (what `tree_into` computes without allocating).
    fn tree_by_levels(parts: &[Vec<f32>]) -> Vec<f32> {
        if let [one] = parts {
            return one.clone();
        }
        let left = parts.len().next_power_of_two() / 2;
        let (l, r) = (tree_by_levels(&parts[..left]), tree_by_levels(&parts[left..]));
        l.iter().zip(&r).map(|(x, y)| x + y).collect()
    }

    #[test]
    fn a_tree_sum_of_any_number_of_ranks_and_length_has_the_bits_of_its_tree() {
        // Values of mixed magnitudes, so that another order of the sum has other bits.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut value = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let m = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 10f32.powi(((seed >> 20) % 9) as i32 - 4)
        };
        let mut differs_from_left_to_right = false;
        for ranks in 1..=9 {
            for len in [0, 1, 7, TREE_CHUNK - 1, TREE_CHUNK, 2 * TREE_CHUNK + 3] {
                let parts: Vec<Vec<f32>> = (0..ranks).map(|_| (0..len).map(|_| value()).collect()).collect();
                let slices: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
                let mut out = vec![f32::NAN; len];
                tree_into(&slices, &mut out);
                let want = tree_by_levels(&parts);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "{ranks} ranks, {len} elements");
                let in_order: Vec<f32> = (0..len).map(|i| parts.iter().map(|p| p[i]).fold(0.0, |a, b| a + b)).collect();
                differs_from_left_to_right |= bits(&in_order) != bits(&want);
            }
        }
        assert!(differs_from_left_to_right, "the values should make the order of the sum matter");
    }
}
