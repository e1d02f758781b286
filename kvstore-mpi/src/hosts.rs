//! Big sums host by host, for a job whose ranks sit on several machines with several
//! ranks each: the ranks of a host sum their array through the host's shared memory
//! (MPI's own transport between them), the hosts sum those partial sums over the
//! network, and the host's ranks share the result through shared memory again. Each
//! host's link then carries 2(m - 1)/m of the array each way (m hosts); a flat
//! [`scatter_sum`] over 2 hosts of 2 ranks carries twice that, since each rank sends
//! its pieces to both ranks of the other host and gets their sums back.
//!
//! Same bits: [`scatter_sum`] sums every element up [`tree_into`]'s fixed tree of the
//! ranks (the largest power of two of ranks on the left). Where every host holds the
//! same power of two `k` of consecutive ranks, starting at a multiple of `k`, each host
//! is a subtree of that tree, and the tree over the hosts' sums is the rest of it: the
//! sum host by host is the same sum, bit for bit. Any other placement (3 ranks on a
//! host, ranks dealt to hosts in turn by `--map-by node`, hosts of unequal size) sums
//! flat, which is correct everywhere.
//!
//! [`tree_into`]: crate::group::tree_into
//! [`scatter_sum`]: crate::group::scatter_sum

use kvstore_core::{Element, Error, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use crate::group::{all_gather_segments, reduce_scatter, scatter_sum, segment, with_scratch};
use crate::shm::all_agree;

/// The environment variable that makes blocks of that many consecutive ranks count as
/// one host, instead of the ranks that share a machine: for tests and experiments of
/// the sum host by host on one machine. Read when MPI starts.
pub const HOST_RANKS_VAR: &str = "KVSTORE_MPI_HOST_RANKS";

/// The ranks per host that [`HOST_RANKS_VAR`] asks for (unset or empty: `None`, the
/// machines' own).
///
/// # Errors
/// [`Error::InvalidArgument`] for a value that is not a whole number of at least 1.
pub(crate) fn host_ranks_from_env() -> Result<Option<usize>> {
    match std::env::var(HOST_RANKS_VAR) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(k) if k >= 1 => Ok(Some(k)),
            _ => Err(Error::invalid_argument(format!(
                "{HOST_RANKS_VAR}={v:?}: expected a whole number of ranks (at least 1) to count as one host"
            ))),
        },
        _ => Ok(None),
    }
}

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
}

/// `(min, max)` of `x` over the ranks of `comm`.
fn range_of(comm: &SimpleCommunicator, x: i64) -> (i64, i64) {
    let (mut lo, mut hi) = (0i64, 0i64);
    comm.all_reduce_into(&x, &mut lo, SystemOperation::min());
    comm.all_reduce_into(&x, &mut hi, SystemOperation::max());
    (lo, hi)
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
        let (fewest_asked, most_asked) = range_of(world, asked);
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
        let (first, last) = range_of(&node, i64::from(rank / k.max(1)));
        let (fewest, most) = range_of(world, i64::from(k));
        let placed = first == last && node.rank() == rank % k;
        let fits = fewest == most && k >= 2 && k < size && (k as u32).is_power_of_two();
        if !all_agree(world, placed && fits) {
            return None;
        }
        let across =
            world.split_by_color_with_key(Color::with_value(node.rank()), rank).expect("every rank has a color");
        Some(Hosts { node, across })
    }

    /// `recv = sum(send)` over the world, host by host, with [`scatter_sum`]'s bits
    /// (see the module's docs): this host's ranks sum a segment each
    /// ([`reduce_scatter`], through the host's memory), each sums its segment with the
    /// ranks in its place on the other hosts ([`scatter_sum`], over the network), then
    /// the host's ranks gather their segments ([`all_gather_segments`]). `send` and
    /// `recv` do not overlap.
    ///
    /// The steps run one after the other. Overlapping them piece by piece, every
    /// message posted as its piece was ready, was slower on the cluster in a box of
    /// `make bench` (2 hosts of 2 ranks over 10 Gbit/s, a 64 MB push: 148 to 216 ms
    /// against 119 to 136 ms, four runs in turn): a message sent late waits for MPI's
    /// handshake through link queues full of the pieces before it, where the steps'
    /// messages are all posted at once.
    ///
    /// Each step is an event of the timeline when it records: `host sum` (the host's
    /// ranks sum their segments), `across hosts` and `host gather`, each with the bytes
    /// this rank sent in `args`.
    pub(crate) fn sum<W: Element + Equivalence + bytemuck::Pod>(&self, send: &[W], recv: &mut [W]) {
        let (k, m) = (self.node.size() as usize, self.across.size() as usize);
        let mine = segment(send.len(), k, self.node.rank() as usize);
        // The bytes this rank sends in each step: the rest of the array to the host's
        // other ranks; its segment's pieces to the other hosts and its own piece's sums
        // back to each; its segment to each of the host's other ranks.
        let own = segment(mine.len(), m, self.across.rank() as usize).len();
        let bytes = |elements: usize| (elements * std::mem::size_of::<W>()) as u64;
        let within = bytes(send.len() - mine.len());
        let across = bytes(mine.len() - own + own * (m - 1));
        let gather = bytes(mine.len() * (k - 1));
        let mut step = Steps::start();
        with_scratch(&PARTIAL, mine.len(), |partial: &mut [W]| {
            reduce_scatter(&self.node, send, partial);
            step.next("host sum", within);
            scatter_sum(&self.across, partial, &mut recv[mine]);
            step.next("across hosts", across);
        });
        all_gather_segments(&self.node, recv);
        step.next("host gather", gather);
    }
}

/// The steps of a sum host by host, each a `wire` event of the timeline when it records.
struct Steps(Option<u64>);

impl Steps {
    fn start() -> Steps {
        Steps(kvstore_core::timeline::recording().then(kvstore_core::timeline::now))
    }

    /// Records the step that ends now, and starts the next.
    fn next(&mut self, name: &'static str, bytes: u64) {
        use kvstore_core::timeline::{Arg, complete, now};
        if let Some(at) = self.0 {
            let end = now();
            complete(name, "wire", at, end, vec![("bytes", Arg::U(bytes))]);
            self.0 = Some(end);
        }
    }
}
