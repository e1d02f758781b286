//! Big sums host by host, for a job whose ranks sit on several machines with several
//! ranks each: the ranks of a host sum their array through the host's shared memory
//! (MPI's own transport between them), the hosts sum those partial sums over the
//! network, and the host's ranks share the result through shared memory again. Each
//! host's link then carries 2(m - 1)/m of the array each way (m hosts); a flat
//! [`scatter_sum`] over 2 hosts of 2 ranks carries twice that, since each rank sends
//! its pieces to both ranks of the other host and gets their sums back. The steps
//! overlap chunk by chunk ([`Hosts::sum`]).
//!
//! Same bits: [`scatter_sum`] sums every element up [`tree_into`]'s fixed tree of the
//! ranks (the largest power of two of ranks on the left). Where every host holds the
//! same power of two `k` of consecutive ranks, starting at a multiple of `k`, each host
//! is a subtree of that tree, and the tree over the hosts' sums is the rest of it: the
//! sum host by host is the same sum, bit for bit. Any other placement (3 ranks on a
//! host, ranks dealt to hosts in turn by `--map-by node`, hosts of unequal size) sums
//! flat, which is correct everywhere.
//!
//! [`tree_into`]: crate::tree::tree_into
//! [`scatter_sum`]: crate::scatter::scatter_sum

use kvstore_core::Element;
use mpi::datatype::Equivalence;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use crate::agree::{all_agree, range_of};
use crate::runtime::wait;
use crate::scatter::{GATHER_TAG, Summing, next_segment, segment, sum_pieces, with_scratch};

/// The job's hosts, where it sums host by host.
pub(crate) struct Hosts {
    /// This host's ranks, in the world's order.
    node: SimpleCommunicator,
    /// One rank of every host, in the hosts' order: those with this rank's place on
    /// its host.
    across: SimpleCommunicator,
}

thread_local! {
    /// This host's sum of this rank's segment, before it crosses the network.
    static PARTIAL: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The host's other ranks' parts of this rank's segment.
    static WITHIN: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The other hosts' parts of this rank's piece of its segment.
    static ACROSS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Hosts {
    /// Finds the hosts, collectively over `world` (every rank calls it at the same
    /// point): the ranks sharing a machine, or blocks of `host_ranks` consecutive ranks.
    /// `Some` on every rank alike where there are 2 hosts or more of the same power of
    /// two ranks (2 or more) each, every host's ranks consecutive from a multiple of
    /// that number: the placement where the sum host by host has the flat sum's bits.
    /// `None` (flat) too where the ranks were not all started with the same
    /// `host_ranks`.
    pub(crate) fn find(world: &SimpleCommunicator, host_ranks: Option<usize>) -> Option<Hosts> {
        let (rank, size) = (world.rank(), world.size());
        // Every rank must make the same split: where ranks were started with other
        // settings (some with blocks of ranks, some without), the sum is flat.
        let asked = host_ranks.map_or(-1, |k| i64::try_from(k).unwrap_or(i64::MAX));
        let ([fewest_asked], [most_asked]) = range_of(world, [asked]);
        if fewest_asked != most_asked {
            return None;
        }
        let node = match host_ranks {
            Some(k) => world
                .split_by_color_with_key(Color::with_value(rank / i32::try_from(k).unwrap_or(i32::MAX)), rank)
                .expect("every rank has a color"),
            None => world.split_shared(rank),
        };
        let k = node.size();
        // Each rank's host: the block its rank falls in, the same for the whole host.
        let ([first], [last]) = range_of(&node, [i64::from(rank / k.max(1))]);
        let ([fewest], [most]) = range_of(world, [i64::from(k)]);
        let placed = first == last && node.rank() == rank % k;
        let fits = fewest == most && k >= 2 && k < size && (k as u32).is_power_of_two();
        if !all_agree(world, placed && fits) {
            return None;
        }
        let across =
            world.split_by_color_with_key(Color::with_value(node.rank()), rank).expect("every rank has a color");
        Some(Hosts { node, across })
    }

    /// `recv = sum(send)` over the world, host by host, with the flat sum's bits (see
    /// the module's docs), in `chunks` chunks whose steps overlap (one group of
    /// [`groups`]: the caller sums an array group after group, so that the buffers a sum
    /// keeps are those of one group, whatever the array's size): this host's ranks sum
    /// a segment each of a chunk (a [`Summing`] of this rank's segment only, through the
    /// host's memory); each sums its segment with the ranks in its place on the other
    /// hosts (a [`Summing`] of the whole segment, over the network) while the host's
    /// ranks sum the next chunk; then it sends its sums to the host's other ranks while
    /// the next chunk crosses. The network is then busy from the end of the first
    /// chunk's sum within the host to the last chunk's sums, and the sums and gathers
    /// within the host run meanwhile. `send` and `recv` do not overlap.
    ///
    /// The group's steps are events of the timeline when it records, with the bytes
    /// this rank sent in `args`: `host sum` (the group's first chunk's sum within the
    /// host, before anything crosses: `bytes`), `across hosts` (every chunk's sum across
    /// the hosts, `bytes`, while the host sums the group's other chunks, `host_bytes`,
    /// and gathers them; its `chunks`) and `host gather` (until the group's last sums
    /// are shared within the host; every chunk's gather's `bytes`).
    pub(crate) fn sum<W: Element + Equivalence + bytemuck::Pod>(&self, send: &[W], recv: &mut [W], chunks: usize) {
        let (k, m) = (self.node.size() as usize, self.across.size() as usize);
        let (me, host) = (self.node.rank() as usize, self.across.rank() as usize);
        let len = send.len();
        let chunk = |c: usize| segment(len, chunks, c);
        // Host rank j's segment of chunk c, in the array.
        let seg = |c: usize, j: usize| {
            let (ch, s) = (chunk(c), segment(chunk(c).len(), k, j));
            ch.start + s.start..ch.start + s.end
        };
        let mine: Vec<usize> = (0..chunks).map(|c| seg(c, me).len()).collect();
        let own: Vec<usize> = mine.iter().map(|&l| segment(l, m, host).len()).collect();
        // The bytes this rank sends: the rest of each chunk to the host's other ranks;
        // each chunk's segment's pieces to the other hosts and its own piece's sums
        // back to each; each segment to each of the host's other ranks.
        let bytes = |elements: usize| (elements * std::mem::size_of::<W>()) as u64;
        let within = |c: usize| bytes(chunk(c).len() - mine[c]);
        let across = bytes((0..chunks).map(|c| mine[c] - own[c] + own[c] * (m - 1)).sum());
        let gather = bytes(mine.iter().sum::<usize>() * (k - 1));
        let total: usize = mine.iter().sum();
        let crossing: usize = own.iter().map(|o| o * (m - 1)).sum();
        with_scratch(&PARTIAL, total, |partial: &mut [W]| {
            with_scratch(&WITHIN, total * (k - 1), |within_parts: &mut [W]| {
                with_scratch(&ACROSS, crossing, |across_parts: &mut [W]| {
                    let mut partials = split(partial, mine.iter().copied()).into_iter();
                    let mut within_parts = split(within_parts, mine.iter().map(|l| l * (k - 1))).into_iter();
                    let mut across_parts = split(across_parts, own.iter().map(|o| o * (m - 1))).into_iter();
                    // Each chunk of `recv`: the host's lower ranks' segments, this rank's,
                    // the higher ranks'.
                    let mut outs = Vec::with_capacity(chunks);
                    for (c, ch) in split(recv, (0..chunks).map(|c| chunk(c).len())).into_iter().enumerate() {
                        let at = seg(c, me).start - chunk(c).start;
                        let (lower, rest) = ch.split_at_mut(at);
                        let (mine, upper) = rest.split_at_mut(mine[c]);
                        outs.push((lower, mine, upper));
                    }
                    let mut outs = outs.into_iter();
                    let node = &self.node;
                    mpi::request::scope(|scope| {
                        let mut step = Steps::start();
                        let mut within_host = |c: usize| {
                            let (partial, theirs) =
                                (partials.next().expect("a part"), within_parts.next().expect("parts"));
                            Summing::post(scope, node, &send[chunk(c)], partial, theirs, false)
                        };
                        let mut partial = within_host(0).finish()[0];
                        step.next("host sum", vec![("bytes", within(0))]);
                        let mut gathers = Vec::new();
                        for c in 0..chunks {
                            let (mut lower, out, mut upper) = outs.next().expect("a chunk");
                            let theirs = across_parts.next().expect("parts");
                            let mut crossing = Summing::post(scope, &self.across, partial, out, theirs, true);
                            let mut next = (c + 1 < chunks).then(|| within_host(c + 1));
                            while !(crossing.poll() & next.as_mut().is_none_or(Summing::poll)) {
                                std::thread::yield_now();
                            }
                            let sums = crossing.finish();
                            // This chunk's sums to the host's other ranks, and theirs here,
                            // in the pieces they crossed in.
                            for j in (0..k).filter(|&j| j != me) {
                                let p = node.process_at_rank(j as i32);
                                gathers.extend(sums.iter().map(|s| p.immediate_send_with_tag(scope, *s, GATHER_TAG)));
                                let into = next_segment(&mut lower, &mut upper, j < me, seg(c, j).len());
                                for part in split(into, sum_pieces::<W>(seg(c, j).len(), m)) {
                                    gathers.push(p.immediate_receive_into_with_tag(scope, part, GATHER_TAG));
                                }
                            }
                            if let Some(next) = next {
                                partial = next.finish()[0];
                            }
                        }
                        let host_bytes = (1..chunks).map(within).sum();
                        step.next(
                            "across hosts",
                            vec![("bytes", across), ("host_bytes", host_bytes), ("chunks", chunks as u64)],
                        );
                        for r in gathers {
                            wait(r);
                        }
                        step.next("host gather", vec![("bytes", gather)]);
                    });
                });
            });
        });
    }
}

/// The most bytes of the array a chunk of [`Hosts::sum`] holds. On the cluster in a box
/// of `make bench` (2 hosts of 2 ranks, a 64 MB push, 5 runs each) over 2 Gbit/s links,
/// where the link bounds the push at 268 ms: one chunk (the steps one after the other)
/// 346 and 376 ms; chunks of 16 MiB 324 ms, 8 MiB 288 to 299 ms, 4 MiB 282 ms. Over 10
/// Gbit/s, where the 4 ranks' work on the machine's 2 cores bounds it, one chunk and
/// chunks of 4 to 8 MiB read alike (130 to 158 ms).
pub(crate) const CHUNK_BYTES: usize = 4 << 20;

/// The most chunks of a group of [`Hosts::sum`]: its buffers hold a group's worth of the
/// array (64 MiB in chunks of 4 MiB), however big the array.
pub(crate) const GROUP_CHUNKS: usize = 16;

/// The groups that an array of `len` elements of `size` bytes is summed in host by host
/// ([`Hosts::sum`], one after the other), in chunks of at most `chunk_bytes`: each
/// group's range of the array and its number of chunks, at most [`GROUP_CHUNKS`].
pub(crate) fn groups(len: usize, size: usize, chunk_bytes: usize) -> Vec<(std::ops::Range<usize>, usize)> {
    let chunks = (len * size).div_ceil(chunk_bytes.max(1)).max(1);
    let groups = chunks.div_ceil(GROUP_CHUNKS);
    (0..groups).map(|g| (segment(len, groups, g), segment(chunks, groups, g).len())).collect()
}

/// `buf` split into consecutive parts of `lens` (which sum to at most its length).
fn split<W>(mut buf: &mut [W], lens: impl Iterator<Item = usize>) -> Vec<&mut [W]> {
    lens.map(|l| {
        let (part, rest) = std::mem::take(&mut buf).split_at_mut(l);
        buf = rest;
        part
    })
    .collect()
}

/// The steps of a sum host by host, each a `wire` event of the timeline when it records.
struct Steps(Option<u64>);

impl Steps {
    fn start() -> Steps {
        Steps(kvstore_core::timeline::recording().then(kvstore_core::timeline::now))
    }

    /// Records the step that ends now, with `args`, and starts the next.
    fn next(&mut self, name: &'static str, args: Vec<(&'static str, u64)>) {
        use kvstore_core::timeline::{Arg, complete, now};
        if let Some(at) = self.0 {
            let end = now();
            complete(name, "wire", at, end, args.into_iter().map(|(k, v)| (k, Arg::U(v))).collect());
            self.0 = Some(end);
        }
    }
}
