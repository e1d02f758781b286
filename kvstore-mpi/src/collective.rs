//! [`MpiGroup`] as the store's [`Collective`]: which sum each array takes (big arrays
//! alone, runs of small ones of one wire type fused), desync detection's exchange,
//! allgather, broadcast and barrier.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kvstore_core::backend::{Collective, in_background};
use kvstore_core::{DType, Element, Error, NDArray, Result};
use mpi::request::Request;
use mpi::traits::*;

use crate::fused::PACKED_BYTES;
use crate::group::MpiGroup;
use crate::runtime::wait;
use crate::watchdog;
use crate::wire::{read_wire, with_wire, write_wire};

/// Elements per MPI call, within MPI's `int` counts.
const MAX_COUNT: usize = i32::MAX as usize;

impl Collective for MpiGroup {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<()> {
        self.with_world(|w| w.barrier())
    }

    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> Result<()> {
        if self.size == 1 {
            for (src, dst) in pairs {
                dst.copy_from(src)?;
            }
            return Ok(());
        }
        let bytes = self.bucket_bytes.load(Ordering::Relaxed);
        let wire = |d: DType| with_wire!(d, W => W::DTYPE);
        // Whether a pair goes straight through MPI (an array of at least a bucket whose
        // dtype MPI sums natively) depends only on shapes and dtypes, so every rank
        // makes the same MPI calls, whatever its local values were.
        let big = |a: &NDArray| a.size() * a.dtype().size() >= bytes && wire(a.dtype()) == a.dtype();
        let mut start = 0;
        // Each bucket (or big array) is an event of the timeline when it records.
        let record_bucket = |at: u64, pairs: &[(&NDArray, &NDArray)], n: u64| {
            use kvstore_core::timeline::{self, Arg};
            let bytes = pairs.iter().map(|(_, d)| (d.size() * d.dtype().size()) as u64).sum();
            let args = vec![("bucket", Arg::U(n)), ("keys", Arg::U(pairs.len() as u64)), ("bytes", Arg::U(bytes))];
            timeline::complete("bucket", "wire", at, timeline::now(), args);
        };
        let recording = kvstore_core::timeline::recording();
        let mut n = 0;
        while start < pairs.len() {
            let (src, dst) = pairs[start];
            let at = if recording { kvstore_core::timeline::now() } else { 0 };
            if big(dst) {
                with_wire!(dst.dtype(), W => self.allreduce_big::<W>(src, dst)?);
                if recording {
                    record_bucket(at, &pairs[start..=start], n);
                }
                (start, n) = (start + 1, n + 1);
                continue;
            }
            // A run of small arrays of one wire type shares buckets.
            let t = wire(dst.dtype());
            let end =
                (start..pairs.len()).find(|&i| big(pairs[i].1) || wire(pairs[i].1.dtype()) != t).unwrap_or(pairs.len());
            with_wire!(dst.dtype(), W => {
                let bucket = (bytes.min(PACKED_BYTES) / std::mem::size_of::<W>()).max(1);
                self.allreduce_fused::<W>(&pairs[start..end], bucket)?
            });
            if recording {
                record_bucket(at, &pairs[start..end], n);
            }
            (start, n) = (end, n + 1);
        }
        Ok(())
    }

    /// Each rank's ranges travel to it alone ([`MpiGroup::reduce_scatter_parts`]).
    fn reduce_scatter_sum(&self, pairs: &[(&NDArray, &NDArray)], parts: &[Vec<std::ops::Range<usize>>]) -> Result<()> {
        self.reduce_scatter_parts(pairs, parts)
    }

    /// Each owner's ranges travel from its memory straight into the others'
    /// ([`MpiGroup::gather_parts`]).
    fn all_gather_parts(&self, step: &str, arrays: &[&NDArray], parts: &[Vec<std::ops::Range<usize>>]) -> Result<()> {
        self.gather_parts(step, arrays, parts)
    }

    /// The records travel as messages, one to every other worker, on a communicator of
    /// their own; the wait tests them (yielding under a non-blocking store call), so it
    /// knows which workers have arrived. After the timeout it prints which ranks never
    /// arrived at `step` and ends the job.
    fn exchange(&self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = mine.len();
        if self.size == 1 || n == 0 {
            return Ok(vec![mine.to_vec(); self.size]);
        }
        watchdog::set_step(step);
        let mut all = vec![0u8; n * self.size];
        all[self.rank * n..(self.rank + 1) * n].copy_from_slice(mine);
        // Records of one length share a tag: a worker a round ahead cannot be taken for
        // one of this round.
        let tag = (n % 30_000) as i32 + 1;
        let timeout = self.timeout();
        let background = in_background();
        self.with_mpi(|mpi| {
            let _own_deadline = watchdog::Exchanging::start();
            let start = std::time::Instant::now();
            mpi::request::scope(|scope| {
                let mut receives: Vec<(usize, Request<'_, [u8], _>)> = all
                    .chunks_mut(n)
                    .enumerate()
                    .filter(|(r, _)| *r != self.rank)
                    .map(|(r, buf)| {
                        (r, mpi.steps.process_at_rank(r as i32).immediate_receive_into_with_tag(scope, buf, tag))
                    })
                    .collect();
                let mut sends: Vec<Request<'_, [u8], _>> = (0..self.size)
                    .filter(|&r| r != self.rank)
                    .map(|r| mpi.steps.process_at_rank(r as i32).immediate_send_with_tag(scope, mine, tag))
                    .collect();
                while !(receives.is_empty() && sends.is_empty()) {
                    receives = receives.into_iter().filter_map(|(r, q)| q.test().err().map(|q| (r, q))).collect();
                    sends = sends.into_iter().filter_map(|q| q.test().err()).collect();
                    if start.elapsed() >= timeout && !receives.is_empty() {
                        let missing: Vec<usize> = receives.iter().map(|(r, _)| *r).collect();
                        watchdog::never_arrived(self.rank, self.size, step, timeout, &missing);
                    }
                    if background {
                        std::thread::yield_now();
                    }
                }
            });
        })?;
        Ok(all.chunks(n).map(<[u8]>::to_vec).collect())
    }

    /// MPI's allgather (non-blocking and waited for as `wait` does under a
    /// non-blocking store call), under the watchdog.
    fn all_gather(&self, step: &str, mine: &[u8]) -> Result<Vec<u8>> {
        let n = mine.len();
        if self.size == 1 || n == 0 {
            return Ok(mine.to_vec());
        }
        if n > MAX_COUNT {
            return Err(Error::invalid_argument(format!(
                "{step}: {n} bytes per worker in one allgather; MPI counts up to {MAX_COUNT}"
            )));
        }
        watchdog::set_step(step);
        let mut all = vec![0u8; n * self.size];
        self.with_world(|w| {
            if in_background() {
                mpi::request::scope(|scope| wait(w.immediate_all_gather_into(scope, mine, &mut all[..])));
            } else {
                w.all_gather_into(mine, &mut all[..]);
            }
        })?;
        Ok(all)
    }

    /// MPI's alltoallv: each worker's bytes travel to their destination alone, in
    /// rounds within MPI's `int` counts ([`MpiGroup::all_to_all_in_rounds`]).
    fn all_to_all(&self, step: &str, sends: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        self.all_to_all_in_rounds(step, sends, MAX_COUNT / self.size)
    }

    fn set_timeout(&self, timeout: Duration) {
        MpiGroup::set_timeout(self, timeout);
    }

    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let root = i32::try_from(root).map_err(|_| Error::invalid_argument(format!("broadcast root {root}")))?;
        for a in arrays {
            with_wire!(a.dtype(), W => {
                let mut data = read_wire::<W>(a)?;
                self.with_world(|w| w.process_at_rank(root).broadcast_into(&mut data[..]))?;
                write_wire(a, &data)?;
            });
        }
        Ok(())
    }
}

impl MpiGroup {
    /// [`Collective::all_to_all`] in rounds of at most `round` bytes of each message
    /// (every worker first learns every worker's lengths, so all make the same rounds):
    /// MPI's alltoallv takes `int` counts, so `all_to_all` sends at most [`MAX_COUNT`]
    /// bytes in all per worker and round. Public for the tests, which make rounds small.
    ///
    /// # Errors
    /// As [`Collective::all_to_all`].
    #[doc(hidden)]
    pub fn all_to_all_in_rounds(&self, step: &str, sends: &[Vec<u8>], round: usize) -> Result<Vec<Vec<u8>>> {
        let (size, rank) = (self.size, self.rank);
        if sends.len() != size {
            return Err(Error::Internal(format!("{step}: {} sends for {size} workers", sends.len())));
        }
        if size == 1 {
            return Ok(sends.to_vec());
        }
        let lens: Vec<u8> = sends.iter().flat_map(|s| (s.len() as u64).to_le_bytes()).collect();
        let all = self.all_gather(step, &lens)?;
        let len = |from: usize, to: usize| kvstore_core::backend::word(&all, (from * size + to) * 8) as usize;
        let round = round.clamp(1, MAX_COUNT / size);
        let longest = (0..size * size).map(|i| len(i / size, i % size)).max().unwrap_or(0);
        let mut got: Vec<Vec<u8>> = (0..size).map(|r| Vec::with_capacity(len(r, rank))).collect();
        for k in 0..longest.div_ceil(round) {
            // This round's bytes of a message of `n`.
            let piece = |n: usize| n.saturating_sub(k * round).min(round);
            let counts = |n: &dyn Fn(usize) -> usize| -> (Vec<i32>, Vec<i32>) {
                let counts: Vec<i32> = (0..size).map(|r| piece(n(r)) as i32).collect();
                let displs = counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
                (counts, displs)
            };
            let (send_counts, send_displs) = counts(&|d| sends[d].len());
            let (recv_counts, recv_displs) = counts(&|r| len(r, rank));
            // (Buffers of at least a byte: two empty ones would share a dangling address,
            // which MPI refuses as a send buffer that is the receive buffer.)
            let mut out = Vec::with_capacity((send_counts.iter().sum::<i32>() as usize).max(1));
            for s in sends {
                out.extend_from_slice(&s[(k * round).min(s.len())..][..piece(s.len())]);
            }
            let mut back = vec![0u8; (recv_counts.iter().sum::<i32>() as usize).max(1)];
            watchdog::set_step(step);
            self.with_world(|w| {
                let send = mpi::datatype::Partition::new(&out[..], &send_counts[..], &send_displs[..]);
                let mut recv = mpi::datatype::PartitionMut::new(&mut back[..], &recv_counts[..], &recv_displs[..]);
                if in_background() {
                    mpi::request::scope(|scope| wait(w.immediate_all_to_all_varcount_into(scope, &send, &mut recv)));
                } else {
                    w.all_to_all_varcount_into(&send, &mut recv);
                }
            })?;
            for (r, got) in got.iter_mut().enumerate() {
                let at = recv_displs[r] as usize;
                got.extend_from_slice(&back[at..at + recv_counts[r] as usize]);
            }
        }
        Ok(got)
    }
}
