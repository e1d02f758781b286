//! [`CommCpu`], the host `Comm`: mirrors `CommCPU` in MXNet's `src/kvstore/comm.h`.
//! It sums on the host (plain loops over a rayon pool), and a `local` store's values
//! pushed from devices are first copied into page-locked host buffers it keeps per key
//! (a value initialised from a device is kept in page-locked memory too).
//!
//! Summation is deterministic: for every element the values are added left to right in
//! the order given, f16/bf16 accumulate in f32 and round once, integers wrap. Large
//! arrays are cut into chunks over the store's own rayon pool; the per-element order
//! does not depend on the chunking, so results are bit-identical for any thread count.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;
use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use smallvec::SmallVec;

use super::{BroadcastJob, CLAIM_KEYS, Claims, Comm, PushKey, ReduceJob, share};
use crate::device::{self, DeviceBuffer};
use crate::dtype::{Element, with_dtype};
use crate::error::{Error, Result};
use crate::ndarray::{HostBuf, HostRead, NDArray, copy_storage, overlapping_uses, used_twice};

/// Arrays with at least this many bytes are split into chunks over the pool
/// (MXNet: `MXNET_KVSTORE_BIGARRAY_BOUND`, 1e6 elements); smaller ones are one task.
const BIG_BYTES: usize = 1 << 20;
/// The chunk length, in bytes, for splitting big arrays (a multiple of 64).
const CHUNK_BYTES: usize = 1 << 18;
/// Below this many bytes in total, a batch of jobs runs on the calling thread: waking
/// the pool costs more than the work.
const PARALLEL_BYTES: usize = 1 << 16;
/// Bytes of small jobs a thread takes at a time when they are shared out: enough that
/// threads rarely meet at the counter, few enough that they finish together.
const CLAIM_BYTES: usize = 1 << 16;
/// Elements summed per block while the accumulator stays in L1.
const ACC_BLOCK: usize = 1024;

/// The host `Comm`: plain loops over a rayon pool, shared by every store that does not
/// ask for its own.
pub struct CommCpu {
    pool: Arc<ThreadPool>,
    /// Whether device values are kept and summed in page-locked host memory (`local`
    /// stores); a `dist_sync` store sums them where they are.
    host_staging: bool,
}

/// A key's page-locked host buffers: one per position of its pushed values, made at
/// the first push of a device value there and reused.
struct Staging(Vec<Option<NDArray>>);

/// The pool of stores that ask for no pool of their own: one thread per core for the
/// whole process, however many stores there are.
static SHARED: Mutex<Option<Arc<ThreadPool>>> = Mutex::new(None);

fn start_pool(threads: usize) -> Result<ThreadPool> {
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("kvstore-cpu-{i}"))
        .start_handler(|_| crate::ndarray::mark_pool_thread())
        .build()
        .map_err(|e| Error::ResourceExhausted {
            what: format!(
                "starting {} reduction threads",
                if threads == 0 { "the".to_string() } else { threads.to_string() }
            ),
            detail: format!(
                "{e} (the process may be at its limit of threads: close unused stores, or raise the limit)"
            ),
        })
}

impl CommCpu {
    /// A `CommCpu` on the process's shared pool (`threads` 0: one thread per core,
    /// started by the first store that needs it), or on a pool of its own of `threads`
    /// threads.
    ///
    /// The shared pool's size can be set with MXNet's `MXNET_KVSTORE_REDUCTION_NTHREADS`
    /// (read when the pool starts).
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] if the operating system refuses to start the threads;
    /// [`Error::InvalidArgument`] if `MXNET_KVSTORE_REDUCTION_NTHREADS` is not a number
    /// of threads from 1 to 1024.
    pub fn new(threads: usize) -> Result<Self> {
        if threads > 0 {
            return Ok(CommCpu { pool: Arc::new(start_pool(threads)?), host_staging: true });
        }
        let mut shared = SHARED.lock();
        let pool = match &*shared {
            Some(p) => Arc::clone(p),
            None => {
                let threads = crate::settings::reduction_threads()?;
                Arc::clone(shared.insert(Arc::new(start_pool(threads)?)))
            }
        };
        Ok(CommCpu { pool, host_staging: true })
    }

    /// This comm with device values summed where they are instead of staged through
    /// page-locked host buffers (what `dist_sync` stores do).
    pub fn without_host_staging(mut self) -> Self {
        self.host_staging = false;
        self
    }

    /// The number of threads of the pool.
    pub fn num_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Whether this comm and `other` run on the same pool.
    pub fn shares_pool_with(&self, other: &CommCpu) -> bool {
        Arc::ptr_eq(&self.pool, &other.pool)
    }
}

/// Whether a job's arrays have as many elements of one dtype, so that its loops stay in
/// bounds. Their shapes were checked against the key's by the caller; this reads only
/// what taking the arrays' locks reads too.
fn job_check(out: &NDArray, other: &NDArray) -> Result<()> {
    if out.size() != other.size() || out.dtype() != other.dtype() {
        return Err(Error::Internal(format!(
            "comm: arrays disagree: {:?} {} vs {:?} {}",
            out.shape(),
            out.dtype(),
            other.shape(),
            other.dtype()
        )));
    }
    Ok(())
}

/// `out = inputs[0] + inputs[1] + ...` for one block of `out`, accumulating in
/// `T::Acc`; `offset` is where `out` starts in every input.
#[inline]
fn sum_block<T: Element>(inputs: &[&[T]], offset: usize, out: &mut [T]) {
    let r = offset..offset + out.len();
    // Two to four inputs (values from that many devices): one fused pass, the same
    // operations per element in the same order as the blocked loop below.
    let add = |a: T::Acc, x: &T| T::acc_add(a, x.to_acc());
    match inputs {
        // One value: its elements as they are (a round trip through `T::Acc` is exact).
        [a] => {
            out.copy_from_slice(&a[r]);
            return;
        }
        [a, b] => {
            for ((o, a), b) in out.iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
                *o = T::from_acc(add(a.to_acc(), b));
            }
            return;
        }
        [a, b, c] => {
            for (((o, a), b), c) in out.iter_mut().zip(&a[r.clone()]).zip(&b[r.clone()]).zip(&c[r]) {
                *o = T::from_acc(add(add(a.to_acc(), b), c));
            }
            return;
        }
        [a, b, c, d] => {
            let (a, b, c, d) = (&a[r.clone()], &b[r.clone()], &c[r.clone()], &d[r]);
            for ((((o, a), b), c), d) in out.iter_mut().zip(a).zip(b).zip(c).zip(d) {
                *o = T::from_acc(add(add(add(a.to_acc(), b), c), d));
            }
            return;
        }
        _ => {}
    }
    let mut acc = [T::Acc::default(); ACC_BLOCK];
    for (b, out) in out.chunks_mut(ACC_BLOCK).enumerate() {
        let start = offset + b * ACC_BLOCK;
        let end = start + out.len();
        let acc = &mut acc[..out.len()];
        let mut srcs = inputs.iter().map(|s| &s[start..end]);
        if let Some(first) = srcs.next() {
            for (a, &x) in acc.iter_mut().zip(first) {
                *a = x.to_acc();
            }
        }
        for src in srcs {
            for (a, &x) in acc.iter_mut().zip(src) {
                *a = T::acc_add(*a, x.to_acc());
            }
        }
        for (o, &a) in out.iter_mut().zip(acc.iter()) {
            *o = T::from_acc(a);
        }
    }
}

/// A job's inputs (or what is made of them): a few, so on the stack. A call with many
/// small keys reduces each key on its own, and a heap allocation per key and step costs
/// more than the sum itself.
type Few<T> = SmallVec<[T; 4]>;

fn reduce_typed<T: Element>(pool: Option<&ThreadPool>, inputs: &[HostRead<'_>], out: &mut HostBuf) {
    let srcs: Few<&[T]> = inputs.iter().map(|b| b.typed::<T>()).collect();
    let out = out.typed_mut::<T>();
    match pool {
        Some(pool) => {
            let chunk = CHUNK_BYTES / std::mem::size_of::<T>();
            pool.install(|| {
                out.par_chunks_mut(chunk).enumerate().for_each(|(i, o)| sum_block(&srcs, i * chunk, o));
            });
        }
        None => sum_block(&srcs, 0, out),
    }
}

impl CommCpu {
    /// One reduction; `split` cuts it into chunks over the pool.
    fn reduce_one(&self, job: &ReduceJob<'_>, split: bool) -> Result<()> {
        let out = job.out;
        for input in job.inputs {
            job_check(out, input)?;
        }
        if !job.inputs.iter().any(|a| a.same_storage(out)) {
            return self.reduce_into(job.inputs, out, split);
        }
        // An input that is `out` itself (an updater kept a handle to the stored value
        // and pushed it) is copied first: `out` cannot be read and written at once.
        let copies: Vec<NDArray> =
            job.inputs.iter().filter(|a| a.same_storage(out)).map(|a| a.deep_copy()).collect::<Result<_>>()?;
        let mut copies = copies.iter();
        let inputs: Few<&NDArray> =
            job.inputs.iter().map(|&a| if a.same_storage(out) { copies.next().unwrap_or(a) } else { a }).collect();
        self.reduce_into(&inputs, out, split)
    }

    /// `out = inputs[0] + inputs[1] + ...`, where no input is `out`. Run once per key
    /// and step of a call with many small keys, so it keeps to a few locks and moves.
    fn reduce_into(&self, inputs: &[&NDArray], out: &NDArray, split: bool) -> Result<()> {
        if out.on_device() && inputs.iter().all(|a| a.on_device()) && Self::reduce_on_device(inputs, out)? {
            return Ok(());
        }
        let mut guards: Few<HostRead<'_>> = Few::new();
        for a in inputs {
            guards.push(a.read()?);
        }
        // The sum overwrites every element of `out`: a device `out` is not downloaded.
        let mut dst = out.overwrite()?;
        let pool = (split && dst.bytes().len() >= BIG_BYTES).then_some(&*self.pool);
        with_dtype!(out.dtype(), T => reduce_typed::<T>(pool, &guards, &mut dst));
        drop(guards);
        dst.finish()
    }

    /// The backend's reduction kernel, when every array is on a device: `Ok(false)`
    /// when the backend has none (the caller then stages through the host).
    fn reduce_on_device(inputs: &[&NDArray], out: &NDArray) -> Result<bool> {
        let Some(backend) = device::backend() else { return Ok(false) };
        let guards: Vec<_> = inputs.iter().map(|a| a.storage()).collect::<Result<_>>()?;
        let bufs: Vec<&dyn DeviceBuffer> = guards.iter().filter_map(|g| g.device()).collect();
        let mut dst = out.storage_mut()?;
        match dst.device_mut() {
            Some(d) if bufs.len() == inputs.len() => backend.reduce(out.dtype(), &bufs, d),
            _ => Ok(false),
        }
    }

    fn broadcast_one(&self, job: &BroadcastJob<'_>, split: bool) -> Result<()> {
        for out in job.outs {
            job_check(job.src, out)?;
        }
        let src = job.src.storage()?;
        for out in job.outs.iter().filter(|o| !o.same_storage(job.src)) {
            let mut dst = out.storage_mut()?;
            match (src.host(), dst.host_mut()) {
                // A big host-to-host copy is split over the pool.
                (Some(s), Some(d)) if split && s.bytes().len() >= BIG_BYTES => {
                    self.pool.install(|| {
                        d.bytes_mut()
                            .par_chunks_mut(CHUNK_BYTES)
                            .zip(s.bytes().par_chunks(CHUNK_BYTES))
                            .for_each(|(d, s)| d.copy_from_slice(s));
                    });
                }
                // Anything else: a copy, an upload, a download or a device copy.
                _ => copy_storage(&src, &mut dst)?,
            }
        }
        Ok(())
    }

    /// Runs `one` over the jobs: big jobs one after another, each split over the pool;
    /// small jobs whose arrays are all on devices one after another on this thread (a
    /// backend only queues their work, and threads queueing on one device contend for
    /// it: on an H100, 1,000 small keys took 1.7 times as long from the pool); other
    /// small jobs shared out between this thread and the pool's ([`share::share_jobs`]),
    /// when there is enough work to share.
    fn run_jobs<J: Sync>(
        &self,
        jobs: &[J],
        bytes: impl Fn(&J) -> usize,
        on_devices: impl Fn(&J) -> bool,
        one: impl Fn(&J, bool) -> Result<()> + Sync,
    ) -> Result<()> {
        // Small host jobs with too little work to share, as a piece of a shared call
        // has: one after another here, with nothing to sort out first.
        let mut total = 0;
        let plain = jobs.iter().all(|j| {
            let b = bytes(j);
            total += b;
            b < BIG_BYTES && !on_devices(j)
        });
        if plain && (jobs.len() < 2 || total < PARALLEL_BYTES || self.num_threads() < 2) {
            return jobs.iter().try_for_each(|j| one(j, false));
        }
        let (big, small): (Vec<&J>, Vec<&J>) = jobs.iter().partition(|j| bytes(j) >= BIG_BYTES);
        for job in big {
            one(job, true)?;
        }
        let (queued, small): (Vec<&J>, Vec<&J>) = small.into_iter().partition(|j| on_devices(j));
        for job in queued {
            one(job, false)?;
        }
        let small_bytes: usize = small.iter().map(|j| bytes(j)).sum();
        if small.len() > 1 && small_bytes >= PARALLEL_BYTES && self.num_threads() > 1 {
            let per_claim = (CLAIM_BYTES * small.len() / small_bytes).clamp(1, small.len());
            share::share_jobs(&self.pool, &small, per_claim, |j| one(j, false))
        } else {
            small.iter().try_for_each(|j| one(j, false))
        }
    }
}

impl Comm for CommCpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn pool(&self) -> Option<&ThreadPool> {
        Some(&self.pool)
    }

    fn reduce(&self, jobs: &[ReduceJob<'_>]) -> Result<()> {
        self.run_jobs(
            jobs,
            |j| j.out.size() * j.out.dtype().size() * (j.inputs.len() + 1),
            |j| j.out.on_device() && j.inputs.iter().all(|a| a.on_device()),
            |j, split| self.reduce_one(j, split),
        )
    }

    fn broadcast(&self, jobs: &[BroadcastJob<'_>]) -> Result<()> {
        // An out given for several keys (or outs over the same memory) is written in the
        // order of the jobs, as one thread would: such a call is not shared out.
        if jobs.len() > 1 {
            let outs = || jobs.iter().flat_map(|j| j.outs.iter().copied());
            let written = jobs.iter().map(|j| (std::iter::empty(), j.outs.iter().copied()));
            if used_twice(written) || overlapping_uses(std::iter::empty(), outs()) {
                return jobs.iter().try_for_each(|j| self.broadcast_one(j, true));
            }
        }
        self.run_jobs(
            jobs,
            |j| j.src.size() * j.src.dtype().size() * (j.outs.len() + 1),
            |j| j.src.on_device() && j.outs.iter().all(|a| a.on_device()),
            |j, split| self.broadcast_one(j, split),
        )
    }

    fn wake(&self, bytes: usize) {
        if bytes >= PARALLEL_BYTES && self.num_threads() > 1 {
            self.pool.spawn(|| ());
        }
    }

    /// Pieces of fewer than `CLAIM_BYTES` (or of one key), under `PARALLEL_BYTES`, so
    /// the `reduce` and `broadcast` of a piece run where they are called.
    fn share_keys(
        &self,
        sizes: &[usize],
        rounds: usize,
        work: &(dyn Fn(&dyn Claims) -> Result<()> + Sync),
    ) -> Option<Result<()>> {
        if self.num_threads() < 2
            || sizes.iter().sum::<usize>() < PARALLEL_BYTES
            || sizes.iter().any(|&b| b >= BIG_BYTES)
        {
            return None;
        }
        let mut pieces: Vec<Range<usize>> = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, &b) in sizes.iter().enumerate() {
            if i > start && (bytes + b >= CLAIM_BYTES || i - start >= CLAIM_KEYS) {
                pieces.push(start..i);
                (start, bytes) = (i, 0);
            }
            bytes += b;
        }
        pieces.push(start..sizes.len());
        if pieces.len() < 2 {
            return None;
        }
        share::share_pieces(&self.pool, pieces, rounds, work)
    }

    /// A value from a device is kept on the host in page-locked memory (MXNet's
    /// `CommCPU` keeps its merge buffers in pinned memory), others as a copy.
    fn init_value(&self, value: &NDArray) -> Result<NDArray> {
        if self.host_staging && value.on_device() {
            let copy = NDArray::pinned_zeros(value.shape(), value.dtype())?;
            copy.copy_from(value)?;
            Ok(copy)
        } else {
            value.deep_copy()
        }
    }

    /// Copies the key's device values into its page-locked staging buffers and returns
    /// what to sum: the host values themselves and the staged copies, in order.
    fn stage(&self, key: &mut PushKey<'_, '_>) -> Result<Option<Vec<NDArray>>> {
        if !self.host_staging || !key.values.iter().any(|a| a.on_device()) {
            return Ok(None);
        }
        let staging = &mut key.buffers.get_or_insert_with(|| Staging(Vec::new())).0;
        let mut out = Vec::with_capacity(key.values.len());
        for (j, &a) in key.values.iter().enumerate() {
            if !a.on_device() {
                out.push(a.clone());
                continue;
            }
            if staging.len() <= j {
                staging.resize(j + 1, None);
            }
            let buf = match &staging[j] {
                Some(b) => b.clone(),
                None => staging[j].insert(NDArray::pinned_zeros(a.shape(), a.dtype())?).clone(),
            };
            buf.copy_from(a)?;
            out.push(buf);
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{Context, DType};
    use half::{bf16, f16};

    fn reduce(comm: &CommCpu, inputs: &[NDArray]) -> NDArray {
        let out = NDArray::zeros_with(inputs[0].shape(), inputs[0].dtype(), Context::cpu(0)).unwrap();
        let inputs: Vec<&NDArray> = inputs.iter().collect();
        comm.reduce(&[ReduceJob { inputs: &inputs, out: &out }]).unwrap();
        out
    }

    #[test]
    fn half_precision_sums_accumulate_in_f32() {
        let comm = CommCpu::new(1).unwrap();
        let vals = |v: &[f32], d| {
            v.iter().map(|&x| NDArray::full_with(&[1], x as f64, d, Context::cpu(0)).unwrap()).collect::<Vec<_>>()
        };
        let sum = reduce(&comm, &vals(&[1.0, 2048.0, 1.0], DType::F16));
        assert_eq!(sum.to_vec::<f16>().unwrap()[0].to_f32(), 2050.0);
        let sum = reduce(&comm, &vals(&[60000.0, 60000.0], DType::F16));
        assert!(sum.to_vec::<f16>().unwrap()[0].to_f32().is_infinite());
        let sum = reduce(&comm, &vals(&[256.0, 1.0, 1.0], DType::BF16));
        assert_eq!(sum.to_vec::<bf16>().unwrap()[0].to_f32(), 258.0);
    }

    #[test]
    fn f32_sums_run_left_to_right() {
        let comm = CommCpu::new(2).unwrap();
        let vals: Vec<NDArray> = [4.0, 4.0, 1e8].iter().map(|&x| NDArray::full(&[3], x).unwrap()).collect();
        assert_eq!(reduce(&comm, &vals).to_vec::<f32>().unwrap(), vec![100000008.0; 3]);
    }

    #[test]
    fn integer_sums_wrap() {
        let comm = CommCpu::new(1).unwrap();
        let vals: Vec<NDArray> =
            [100.0, 100.0].iter().map(|&x| NDArray::full_with(&[2], x, DType::I8, Context::cpu(0)).unwrap()).collect();
        assert_eq!(reduce(&comm, &vals).to_vec::<i8>().unwrap(), vec![-56, -56]);
    }

    #[test]
    fn big_arrays_split_over_the_pool_give_the_serial_result() {
        let n = 3 * (BIG_BYTES / 4) + 7;
        let vals: Vec<NDArray> = (0..5)
            .map(|k| NDArray::from_vec(&[n], (0..n).map(|i| ((i * 7 + k * 13) % 1000) as f32 * 0.1).collect()).unwrap())
            .collect();
        let serial: Vec<f32> = (0..n)
            .map(|i| {
                vals.iter()
                    .map(|v| v.read().unwrap().typed::<f32>()[i])
                    .fold(None, |a: Option<f32>, x| Some(a.map_or(x, |a| a + x)))
                    .unwrap()
            })
            .collect();
        for threads in [1, 2, 4] {
            let got = reduce(&CommCpu::new(threads).unwrap(), &vals).to_vec::<f32>().unwrap();
            assert!(got.iter().zip(&serial).all(|(a, b)| a.to_bits() == b.to_bits()), "threads {threads}");
        }
    }

    /// Runs `work` through `share_keys` over 300 keys of 20 KiB (pieces of three keys),
    /// in two rounds, counting each key's visits per round.
    fn two_rounds(
        comm: &CommCpu,
        work: impl Fn(&dyn Claims, usize, Range<usize>) -> Result<()> + Sync,
    ) -> (Option<Result<()>>, [Vec<usize>; 2]) {
        let sizes = vec![20 << 10; 300];
        let visits: [Vec<AtomicUsize>; 2] =
            std::array::from_fn(|_| sizes.iter().map(|_| AtomicUsize::new(0)).collect());
        let r = comm.share_keys(&sizes, 2, &|claims: &dyn Claims| {
            for (round, visits) in visits.iter().enumerate() {
                if round == 1 && !claims.all_done() {
                    return Ok(());
                }
                while let Some((_, keys)) = claims.next() {
                    keys.clone().for_each(|k| _ = visits[k].fetch_add(1, Ordering::SeqCst));
                    work(claims, round, keys)?;
                }
            }
            Ok(())
        });
        (r, visits.map(|v| v.into_iter().map(AtomicUsize::into_inner).collect()))
    }

    #[test]
    fn shared_keys_go_round_by_round_and_a_failing_thread_stops_the_others() {
        let comm = CommCpu::new(3).unwrap();
        // Every piece once per round, and no piece of the second round before every
        // piece of the first is done (some first-round pieces are slow).
        let first_done = AtomicUsize::new(0);
        let (r, visits) = two_rounds(&comm, |claims, round, keys| {
            assert_eq!(claims.pieces(), 100);
            match round {
                0 => {
                    if keys.start % 30 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    first_done.fetch_add(keys.len(), Ordering::SeqCst);
                }
                _ => assert_eq!(first_done.load(Ordering::SeqCst), 300, "a second round began early"),
            }
            Ok(())
        });
        r.expect("shared").unwrap();
        assert!(visits.iter().all(|v| v.iter().all(|&n| n == 1)), "{visits:?}");
        // A failing piece of the first round: its error is returned, and no thread
        // starts the second round.
        let (r, visits) = two_rounds(&comm, |_, round, keys| match (round, keys.contains(&150)) {
            (0, true) => Err(Error::Internal("key 150".into())),
            _ => Ok(()),
        });
        assert_eq!(r.expect("shared").unwrap_err().to_string(), Error::Internal("key 150".into()).to_string());
        assert!(visits[1].iter().all(|&n| n == 0));
        // A thread that panics in the first round: the panic reaches the caller, and the
        // threads waiting for its piece stop instead of waiting for ever.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            two_rounds(&comm, |_, round, keys| {
                assert!(round == 1 || !keys.contains(&10), "a piece panicked");
                Ok(())
            })
        }));
        assert!(panicked.is_err());
        // A thread at the end of a round before it took every piece it could: the round
        // cannot end, so it fails at once for every thread, with no hang.
        let sizes = vec![20 << 10; 300];
        let second = AtomicUsize::new(0);
        let r = comm.share_keys(&sizes, 2, &|claims: &dyn Claims| {
            if claims.next().is_some() && claims.all_done() {
                second.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        });
        r.expect("shared").unwrap();
        assert_eq!(second.load(Ordering::SeqCst), 0);
        // Too little work to share: nothing runs.
        assert!(comm.share_keys(&[64; 10], 2, &|_: &dyn Claims| unreachable!()).is_none());
    }

    #[test]
    fn a_mismatched_job_is_an_internal_error_not_a_panic() {
        let comm = CommCpu::new(1).unwrap();
        let out = NDArray::zeros(&[2]).unwrap();
        let bad = NDArray::zeros(&[3]).unwrap();
        let e = comm.reduce(&[ReduceJob { inputs: &[&bad], out: &out }]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Internal);
        let e = comm.broadcast(&[BroadcastJob { src: &out, outs: &[&bad] }]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Internal);
    }
}
