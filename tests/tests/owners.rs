//! `dist_sync` owners (`kvstore/layout.rs`): every optimizer, run with each key's state
//! on its owners, ends every step with the bits of the replicated layout, on every
//! worker; the layouts' pushes differ in their fingerprints.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvstore_core::backend::Collective;
use kvstore_core::{Context, DType, ErrorKind, KVStore, Layout, LrScheduler, NDArray, Optimizer, optimizer_names};
use kvstore_tests::{ThreadMember, bits, pseudo, run_members};

/// The keys of the differential run: small keys owned whole by one worker each, keys
/// split across the workers at the bound below (at odd places: 1001 on 3 is 334, 333,
/// 334), an f16 key and an f64 key.
const KEYS: [(&str, &[usize], DType); 6] = [
    ("a", &[7], DType::F32),
    ("b", &[3, 5], DType::F32),
    ("big", &[1001], DType::F32),
    ("c", &[40], DType::F32),
    ("h", &[1200], DType::F16),
    ("d", &[9], DType::F64),
];
const BOUND: usize = 1000;

fn store(member: &Arc<ThreadMember>, layout: Layout) -> KVStore {
    builder(member, layout).build().expect("dist_sync")
}

/// The builder of a `dist_sync` store of `member` with `layout`, split at [`BOUND`].
fn builder(member: &Arc<ThreadMember>, layout: Layout) -> kvstore_core::KVStoreBuilder {
    let group: Arc<dyn Collective> = Arc::clone(member) as _;
    KVStore::builder("dist_sync").num_threads(1).collective(group).layout(layout).bigarray_bound(BOUND)
}

/// The optimizer `name` as the run sets it: weight decay, a clip, multi-precision for
/// every other one, and a schedule for some.
fn optimizer(name: &str, i: usize) -> Optimizer {
    let mut b = Optimizer::builder(name).param("learning_rate", 0.05).param("wd", 0.001).param("clip_gradient", 5.0);
    if i.is_multiple_of(2) {
        b = b.param("multi_precision", 1.0);
    }
    if i.is_multiple_of(3) {
        b = b.lr_scheduler(LrScheduler::factor(7, 0.9).expect("a schedule"));
    }
    if name == "sgd" || name == "nag" {
        b = b.param("momentum", 0.9);
    }
    b.build().expect("an optimizer")
}

/// Every built-in optimizer (16), 200 steps on 3 workers: the store with owners and the
/// replicated one, side by side on each worker, get the same pushes (blocking and
/// non-blocking, fused, pushpull) and pull the same bits after every step.
#[test]
fn every_optimizer_with_owners_has_the_bits_of_the_replicated_layout() {
    const WORKERS: usize = 3;
    const STEPS: u64 = 200;
    let names: Vec<&'static str> = optimizer_names();
    assert_eq!(names.len(), 16, "{names:?}");
    let outcomes = run_members(WORKERS, move |rank, member| {
        let ctx = Context::cpu(0);
        for (i, name) in names.iter().enumerate() {
            let kvs = [store(&member, Layout::Replicated), store(&member, Layout::Owners)];
            for kv in &kvs {
                for (k, shape, dtype) in KEYS {
                    kv.init(k, &pseudo(shape, dtype, 1 + i as u64)).expect("init");
                }
                kv.set_optimizer(optimizer(name, i)).expect("set_optimizer");
            }
            let outs: Vec<Vec<NDArray>> = (0..2)
                .map(|_| KEYS.iter().map(|(_, s, d)| NDArray::zeros_with(s, *d, ctx).expect("out")).collect())
                .collect();
            let keys: Vec<&str> = KEYS.iter().map(|k| k.0).collect();
            for step in 0..STEPS {
                let grads: Vec<NDArray> = KEYS
                    .iter()
                    .enumerate()
                    .map(|(j, (_, s, d))| pseudo(s, *d, (step << 16) ^ ((rank as u64) << 8) ^ j as u64 ^ 0x5eed))
                    .collect();
                for (kv, outs) in kvs.iter().zip(&outs) {
                    match step % 3 {
                        0 => kv.pushpull(&keys[..], &grads[..], &outs[..], 0).expect("pushpull"),
                        1 => {
                            // Non-blocking, one key at a time: fused on every worker.
                            let pending: Vec<_> =
                                keys.iter().zip(&grads).map(|(k, g)| kv.push_async(*k, g, 0)).collect();
                            for p in pending {
                                p.wait().expect("push");
                            }
                            kv.pull(&keys[..], &outs[..], 0).expect("pull");
                        }
                        _ => {
                            kv.push(&keys[..], &grads[..], 0).expect("push");
                            kv.pull(&keys[..], &outs[..], 0).expect("pull");
                        }
                    }
                }
                for (j, (k, ..)) in KEYS.iter().enumerate() {
                    let (r, o) = (bits(&outs[0][j]), bits(&outs[1][j]));
                    if let Some(at) = r.iter().zip(&o).position(|(a, b)| a != b) {
                        return Err(format!(
                            "{name}: key {k} after step {step} differs at element {at} on rank {rank}"
                        ));
                    }
                }
            }
        }
        Ok(())
    });
    for outcome in outcomes {
        outcome.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Workers that lay the state out differently would move other data: their pushes fail
/// on every worker, saying so, and the values stay as they were.
#[test]
fn workers_with_other_layouts_fail_their_pushes() {
    let outcomes = run_members(2, |rank, member| {
        let layout = if rank == 0 { Layout::Owners } else { Layout::Replicated };
        let kv = store(&member, layout);
        kv.init("w", &NDArray::ones(&[4]).expect("v")).expect("init");
        kv.set_optimizer(Optimizer::builder("sgd").build().expect("sgd")).expect("set");
        let e = kv.push("w", &NDArray::ones(&[4]).expect("g"), 0).expect_err("layouts differ");
        let out = NDArray::zeros(&[4]).expect("o");
        kv.pull("w", &out, 0).expect("pull");
        (e.kind(), e.to_string(), out.to_vec::<f32>().expect("r"))
    });
    for (kind, message, value) in outcomes {
        assert_eq!(kind, ErrorKind::InvalidArgument, "{message}");
        assert!(message.contains("state replicated"), "{message}");
        assert_eq!(value, vec![1.0; 4]);
    }
}

/// Trains `kv` (keys of [`KEYS`] made with `seed`) for `steps` Adam steps from step
/// `from`, with worker `rank`'s pushes.
fn train(kv: &KVStore, rank: usize, from: u64, steps: u64) {
    let keys: Vec<&str> = KEYS.iter().map(|k| k.0).collect();
    for step in from..from + steps {
        let grads: Vec<NDArray> = KEYS
            .iter()
            .enumerate()
            .map(|(j, (_, s, d))| pseudo(s, *d, (step << 16) ^ ((rank as u64) << 8) ^ j as u64))
            .collect();
        kv.push(&keys[..], &grads[..], 0).expect("push");
    }
}

fn adam() -> Optimizer {
    Optimizer::builder("adam").param("learning_rate", 0.01).param("multi_precision", 1.0).build().expect("adam")
}

/// Every key's value, as bits, pulled from `kv`.
fn values(kv: &KVStore) -> Vec<Vec<u64>> {
    KEYS.iter().map(|(k, ..)| bits(&kv.pull_new(*k, 0).expect("pull"))).collect()
}

/// Whether two safetensors files hold the same: their headers (whose metadata's
/// entries come in any order) and their tensors' bytes.
pub(super) fn same_file(a: &[u8], b: &[u8]) -> bool {
    let split = |f: &[u8]| {
        let n = u64::from_le_bytes(f[..8].try_into().expect("a length")) as usize;
        let header: serde_json::Value = serde_json::from_slice(&f[8..8 + n]).expect("a header");
        let metadata = header["__metadata__"].as_object().expect("metadata").clone();
        // Each metadata entry is JSON text of its own.
        let parsed: Vec<(String, serde_json::Value)> = metadata
            .into_iter()
            .map(|(k, v)| (k, serde_json::from_str(v.as_str().expect("text")).unwrap_or(v)))
            .collect();
        let mut parsed = parsed;
        parsed.sort_by(|x, y| x.0.cmp(&y.0));
        let mut tensors = header.as_object().expect("a header").clone();
        tensors.remove("__metadata__");
        (parsed, tensors, f[8 + n..].to_vec())
    };
    split(a) == split(b)
}

/// A checkpoint and a state file saved with owners hold the states gathered whole: the
/// same bytes as the replicated layout's. Loaded at another number of workers, with
/// owners or replicated, training goes on with the bits of the replicated run that never
/// stopped.
#[test]
fn checkpoints_with_owners_are_the_replicated_ones_and_restore_at_any_size() {
    let dir = Arc::new(kvstore_tests::TempDir::new("owners-checkpoints"));
    let path = {
        let dir = Arc::clone(&dir);
        move |what: &str| dir.dir().join(what)
    };
    // 3 workers: 20 steps, saved by each layout, then 10 more on the replicated one.
    let p = path.clone();
    let uninterrupted = run_members(3, move |rank, member| {
        let mut after = Vec::new();
        for layout in [Layout::Replicated, Layout::Owners] {
            let kv = store(&member, layout);
            for (k, shape, dtype) in KEYS {
                kv.init(k, &pseudo(shape, dtype, 9)).expect("init");
            }
            kv.set_optimizer(adam()).expect("set");
            train(&kv, rank, 0, 20);
            kv.save_checkpoint(p(&format!("{}.ckpt", layout.name()))).expect("save_checkpoint");
            kv.save_optimizer_states(p(&format!("{}-{rank}.states", layout.name()))).expect("save states");
            // The shapes of worker 0 of 2 (continued below) on 3 workers: the rest.
            train(&kv, rank % 2, 20, 10);
            after.push(values(&kv));
        }
        after
    });
    let read = |name: &str| std::fs::read(path(name)).expect("a file");
    assert!(same_file(&read("owners.ckpt"), &read("replicated.ckpt")), "the checkpoints differ");
    for rank in 0..3 {
        let (o, r) = (read(&format!("owners-{rank}.states")), read(&format!("replicated-{rank}.states")));
        assert!(same_file(&o, &r), "rank {rank}'s state files differ");
    }
    // Restored at 2 workers with either layout, from either file: the same pushes give
    // the bits the 3 workers' run did (workers 0 and 2 there pushed as worker 0 here,
    // worker 1 as worker 1, and a sum over ranks is in rank order: so only where the
    // sums agree; compare the two restored layouts with each other instead).
    let p = path.clone();
    let restored = run_members(2, move |rank, member| {
        let mut got = Vec::new();
        for (layout, file) in
            [(Layout::Owners, "replicated.ckpt"), (Layout::Replicated, "owners.ckpt"), (Layout::Owners, "owners.ckpt")]
        {
            let kv = store(&member, layout);
            kv.load_checkpoint(p(file)).expect("load_checkpoint");
            train(&kv, rank, 20, 10);
            got.push(values(&kv));
        }
        // A state file into a store with owners: its part of every key.
        let kv = store(&member, Layout::Owners);
        for (k, shape, dtype) in KEYS {
            kv.init(k, &pseudo(shape, dtype, 9)).expect("init");
        }
        kv.set_optimizer(adam()).expect("set");
        kv.load_optimizer_states(p(&format!("replicated-{rank}.states"))).expect("load states");
        let twin = store(&member, Layout::Replicated);
        for (k, shape, dtype) in KEYS {
            twin.init(k, &pseudo(shape, dtype, 9)).expect("init");
        }
        twin.set_optimizer(adam()).expect("set");
        twin.load_optimizer_states(p(&format!("replicated-{rank}.states"))).expect("load states");
        train(&kv, rank, 20, 10);
        train(&twin, rank, 20, 10);
        (got, values(&kv), values(&twin))
    });
    for (rank, (got, states_owned, states_replicated)) in restored.iter().enumerate() {
        assert!(got.iter().all(|g| g == &got[0]), "rank {rank}: the restored layouts part");
        assert_eq!(got[0], restored[0].0[0], "the workers part");
        assert!(states_owned == states_replicated, "rank {rank}: the state files' loads part");
    }
    drop(uninterrupted);
}

/// A worker that counts the bytes its collectives sum (every gather and exchange goes
/// through its allreduce), and, with `other_inode` on worker 1, is told another inode
/// than the one worker 0 said of its file.
struct Moving {
    member: Arc<ThreadMember>,
    bytes: AtomicUsize,
    other_inode: bool,
}

impl Collective for Moving {
    fn name(&self) -> &'static str {
        "threads counting their bytes"
    }
    fn rank(&self) -> usize {
        self.member.rank()
    }
    fn size(&self) -> usize {
        self.member.size()
    }
    fn barrier(&self) -> kvstore_core::Result<()> {
        self.member.barrier()
    }
    fn allreduce_sum(&self, pairs: &[(&NDArray, &NDArray)]) -> kvstore_core::Result<()> {
        let bytes: usize = pairs.iter().map(|(a, _)| a.size() * a.dtype().size()).sum();
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        self.member.allreduce_sum(pairs)
    }
    fn broadcast(&self, arrays: &[&NDArray], root: usize) -> kvstore_core::Result<()> {
        self.member.broadcast(arrays, root)?;
        // A record of bytes saying a file (made, device, inode, path): another inode.
        if self.other_inode && self.member.rank() == 1 {
            for a in arrays.iter().filter(|a| a.dtype() == DType::U8 && a.size() > 17) {
                a.with_data_mut(|b: &mut [u8]| b[9] ^= 1)?;
            }
        }
        Ok(())
    }
}

/// With owners, a checkpoint saved where every worker can open worker 0's file is
/// written in parts: each worker writes its own parts of the state, and the workers'
/// collectives move a few records, not the state; the file is the one the replicated
/// layout saves. Where a worker cannot open that file (here: it is told another inode),
/// every worker saves the whole way, the state gathered: the same file again.
#[test]
fn a_checkpoint_with_owners_is_saved_in_parts_where_every_worker_opens_its_file() {
    const WIDE: usize = 100_000;
    let dir = Arc::new(kvstore_tests::TempDir::new("owners-saved-in-parts"));
    let d = Arc::clone(&dir);
    let moved = run_members(3, move |rank, member| {
        let mut moved = Vec::new();
        for (name, layout, other_inode) in [
            ("replicated", Layout::Replicated, false),
            ("parts", Layout::Owners, false),
            ("gathered", Layout::Owners, true),
        ] {
            let moving = Arc::new(Moving { member: Arc::clone(&member), bytes: AtomicUsize::new(0), other_inode });
            let group: Arc<dyn Collective> = Arc::clone(&moving) as _;
            let kv =
                KVStore::builder("dist_sync").num_threads(1).collective(group).layout(layout).bigarray_bound(BOUND);
            let kv = kv.build().expect("dist_sync");
            for (k, shape, dtype) in KEYS {
                kv.init(k, &pseudo(shape, dtype, 9)).expect("init");
            }
            kv.init("wide", &pseudo(&[WIDE], DType::F32, 9)).expect("init");
            kv.set_optimizer(adam()).expect("set");
            train(&kv, rank, 0, 3);
            for step in 0..3 {
                kv.push("wide", &pseudo(&[WIDE], DType::F32, step * 10 + rank as u64), 0).expect("push");
            }
            let before = moving.bytes.load(Ordering::SeqCst);
            kv.save_checkpoint(d.dir().join(format!("{name}.ckpt"))).expect("save_checkpoint");
            moved.push(moving.bytes.load(Ordering::SeqCst) - before);
        }
        moved
    });
    let read = |name: &str| std::fs::read(dir.dir().join(format!("{name}.ckpt"))).expect("a file");
    assert!(same_file(&read("parts"), &read("replicated")), "the file saved in parts differs");
    assert!(same_file(&read("gathered"), &read("replicated")), "the file saved gathered differs");
    // "wide"'s state alone: Adam's mean and variance, 800 KB.
    for (rank, moved) in moved.iter().enumerate() {
        assert!(moved[1] < 100_000, "worker {rank} moved {} bytes saving in parts", moved[1]);
        assert!(moved[2] > 2 * WIDE * 4, "worker {rank} moved {} bytes saving gathered", moved[2]);
    }
}

/// A commit kept in memory, per worker: its checkpoint's bytes.
struct InMemory(Kept);

impl kvstore_core::backend::Durable for InMemory {
    fn commit(
        &self,
        store: kvstore_core::backend::Seam<'_>,
        step: u64,
        _extra: &[u8],
        before: kvstore_core::Result<()>,
    ) -> kvstore_core::Result<()> {
        store.check_step("commit")?;
        let mut kept = None;
        // Every worker snapshots: with owners, the state is gathered from every worker.
        store.whole_snapshot("commit", true, &parking_lot::Mutex::new(None), &mut |snap| {
            kept = Some((step, snap.to_bytes()?));
            Ok(())
        })?;
        before?;
        *self.0.lock() = kept;
        Ok(())
    }

    fn restore(&self, store: kvstore_core::backend::Seam<'_>) -> kvstore_core::Result<Option<kvstore_core::Restored>> {
        let Some((step, bytes)) = self.0.lock().clone() else { return Ok(None) };
        store.install("restore", Ok(&bytes))?;
        Ok(Some(kvstore_core::Restored { step, extra: Vec::new() }))
    }
}

type Kept = Arc<parking_lot::Mutex<Option<(u64, Vec<u8>)>>>;

fn durable(member: &Arc<ThreadMember>, layout: Layout, kept: &Kept) -> KVStore {
    builder(member, layout).durability(Box::new(InMemory(Arc::clone(kept)))).build().expect("dist_sync")
}

/// A commit with owners holds every key's whole state; a job restored from it with
/// owners, at the same or another number of workers, or replicated, goes on with the
/// bits of the job that never stopped.
#[test]
fn commits_with_owners_restore_at_any_size_and_layout() {
    let kept: Vec<Kept> = (0..3).map(|_| Arc::default()).collect();
    let job = kept.clone();
    let first = run_members(3, move |rank, member| {
        let kv = durable(&member, Layout::Owners, &job[rank]);
        for (k, shape, dtype) in KEYS {
            kv.init(k, &pseudo(shape, dtype, 4)).expect("init");
        }
        kv.set_optimizer(adam()).expect("set");
        train(&kv, rank, 0, 10);
        kv.commit(10, b"").expect("commit");
        train(&kv, rank, 10, 5);
        values(&kv)
    });
    let job = kept.clone();
    let again = run_members(3, move |rank, member| {
        let kv = durable(&member, Layout::Owners, &job[rank]);
        assert_eq!(kv.restored().map(|r| r.step), Some(10));
        kv.set_optimizer(adam()).expect("set again, as at the start");
        train(&kv, rank, 10, 5);
        values(&kv)
    });
    assert_eq!(first, again, "restored at 3 workers with owners");
    let job = kept.clone();
    let smaller = run_members(2, move |rank, member| {
        [Layout::Owners, Layout::Replicated].map(|layout| {
            let kv = durable(&member, layout, &job[rank]);
            kv.set_optimizer(adam()).expect("set again");
            train(&kv, rank, 10, 5);
            values(&kv)
        })
    });
    for (rank, [owned, replicated]) in smaller.iter().enumerate() {
        assert_eq!(owned, replicated, "rank {rank} at 2 workers");
        assert_eq!(owned, &smaller[0][0], "the workers part");
    }
}

/// What one worker's snapshot in parts held: each piece it would write, at its place in
/// the file's data (its parts of the state; every whole tensor, on worker 0 only), and
/// the whole snapshot's data taken at the same step.
type Pieces = Arc<parking_lot::Mutex<Option<(Vec<(usize, Vec<u8>)>, Vec<u8>)>>>;

/// A commit that only looks: it keeps [`Pieces`].
struct InParts(Pieces);

impl kvstore_core::backend::Durable for InParts {
    fn commit(
        &self,
        store: kvstore_core::backend::Seam<'_>,
        _step: u64,
        _extra: &[u8],
        before: kvstore_core::Result<()>,
    ) -> kvstore_core::Result<()> {
        store.check_step("commit")?;
        let rank = store.peers().map_or(0, |p| p.rank());
        let mut whole = Vec::new();
        store.whole_snapshot("commit", false, &parking_lot::Mutex::new(None), &mut |snap| {
            let bytes = snap.to_bytes()?;
            let header = 8 + u64::from_le_bytes(bytes[..8].try_into().expect("a length")) as usize;
            whole = bytes[header..].to_vec();
            Ok(())
        })?;
        let mut pieces = Vec::new();
        store.snapshot_in_parts("commit", &mut |snap| {
            assert!(snap.to_bytes().is_err(), "a snapshot in parts is no whole file");
            let offsets = snap.offsets();
            for (i, offset) in offsets.iter().enumerate() {
                let range = match snap.parts(i) {
                    Some(parts) => parts[rank].clone(),
                    None if rank == 0 => 0..snap.len(i),
                    None => continue,
                };
                assert_eq!(snap.bytes(i).len(), range.len(), "tensor {i}: this worker's bytes are its range");
                pieces.push((offset + range.start, snap.bytes(i).to_vec()));
            }
            Ok(())
        })?;
        before?;
        *self.0.lock() = Some((pieces, whole));
        Ok(())
    }

    fn restore(&self, _store: kvstore_core::backend::Seam<'_>) -> kvstore_core::Result<Option<kvstore_core::Restored>> {
        Ok(None)
    }
}

/// A snapshot in parts (what a commit on one host writes): each worker holds its own
/// parts of the optimizer state and nothing of the others', and the parts of every
/// worker, with the whole tensors, make the data of the whole snapshot byte for byte,
/// each byte once.
#[test]
fn a_snapshot_in_parts_is_each_workers_own_of_the_whole() {
    let seen: Vec<Pieces> = (0..3).map(|_| Arc::default()).collect();
    let job = seen.clone();
    run_members(3, move |rank, member| {
        let kv = builder(&member, Layout::Owners).durability(Box::new(InParts(Arc::clone(&job[rank])))).build();
        let kv = kv.expect("dist_sync");
        for (k, shape, dtype) in KEYS {
            kv.init(k, &pseudo(shape, dtype, 4)).expect("init");
        }
        kv.set_optimizer(adam()).expect("set");
        train(&kv, rank, 0, 3);
        kv.commit(3, b"").expect("commit");
    });
    let taken: Vec<_> = seen.iter().map(|s| s.lock().take().expect("every worker committed")).collect();
    let whole = &taken[0].1;
    assert!(taken.iter().all(|t| &t.1 == whole), "the workers' whole snapshots differ");
    let mut data = vec![0u8; whole.len()];
    let mut written = vec![0u8; whole.len()];
    for (at, bytes) in taken.iter().flat_map(|t| &t.0) {
        data[*at..at + bytes.len()].copy_from_slice(bytes);
        written[*at..at + bytes.len()].iter_mut().for_each(|w| *w += 1);
    }
    assert!(written.iter().all(|&w| w == 1), "some bytes are held by no worker or by two");
    assert!(&data == whole, "the parts do not make the whole snapshot");
    // Worker 1 holds the values (worker 0 writes those) of no tensor: only its parts,
    // about a third of the state (Adam's mean and variance, and the f16 key's master copy).
    let state = whole.len() - KEYS.iter().map(|(_, s, d)| s.iter().product::<usize>() * d.size()).sum::<usize>();
    let held: usize = taken[1].0.iter().map(|(_, b)| b.len()).sum();
    assert!(held * 2 < state && held > 0, "worker 1 holds {held} bytes of a state of {state}");
}

/// Row-sparse pushes (lazy updates, row by row, and the dense updates of the others)
/// and 2-bit compressed dense pushes, with owners and replicated: the same bits on every
/// worker after every step, rows split between owners included (a table of 60 rows of
/// 17 splits at elements 340 and 680, inside rows).
#[test]
fn row_sparse_and_compressed_pushes_with_owners_have_the_replicated_bits() {
    let outcomes = run_members(3, |rank, member| {
        for (i, name) in ["sgd", "adam", "adagrad", "ftrl", "rmsprop"].iter().enumerate() {
            let kvs = [store(&member, Layout::Replicated), store(&member, Layout::Owners)];
            for kv in &kvs {
                let table = kvstore_core::RowSparse::from_dense(&pseudo(&[60, 17], DType::F32, 3)).expect("rows");
                kv.init_row_sparse("emb", &table).expect("init");
                kv.init("dense", &pseudo(&[1500], DType::F32, 5)).expect("init");
                kv.set_optimizer(optimizer(name, i + 1)).expect("set");
                if i % 2 == 1 {
                    kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.5")]).expect("compression");
                }
            }
            for step in 0..40u64 {
                let seed = (step << 8) ^ rank as u64;
                // Rows touched this step: some, none at times.
                let mut rows: Vec<i64> =
                    (0..(step % 5) as i64 * 3).map(|r| (r * 7 + step as i64 * 11 + rank as i64) % 60).collect();
                rows.sort_unstable();
                rows.dedup();
                let data = pseudo(&[rows.len(), 17], DType::F32, seed);
                let grad = kvstore_core::RowSparse::new(data, rows, &[60, 17]).expect("a row-sparse gradient");
                let dense = pseudo(&[1500], DType::F32, seed ^ 0xd);
                let mut got = Vec::new();
                for kv in &kvs {
                    kv.push_row_sparse("emb", std::slice::from_ref(&grad), 0).expect("push rows");
                    kv.push("dense", &dense, 0).expect("push");
                    got.push((
                        bits(&kv.pull_new("emb", 0).expect("pull")),
                        bits(&kv.pull_new("dense", 0).expect("pull")),
                    ));
                }
                if got[0] != got[1] {
                    return Err(format!("{name}: step {step} differs on rank {rank}"));
                }
            }
        }
        Ok(())
    });
    for outcome in outcomes {
        outcome.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `stats().held`: what a rank holds. With owners, a rank holds its parts of the
/// optimizer state only (Adam: twice its parts) and of the push buffers, where the
/// replicated layout holds twice the model and the model on every rank; the values
/// stay whole on every rank.
#[test]
fn with_owners_a_rank_holds_its_parts_of_the_state() {
    let held = run_members(3, |rank, member| {
        [Layout::Replicated, Layout::Owners].map(|layout| {
            let kv = store(&member, layout);
            // Small keys go to ranks 0, 1, 2 in turn; the big one is split 1000 each.
            let keys = ["s100", "s200", "s300", "big"];
            let sizes = [100, 200, 300, 3000];
            for (k, n) in keys.iter().zip(sizes) {
                kv.init(*k, &NDArray::zeros(&[n]).expect("zeros")).expect("init");
            }
            kv.set_optimizer(adam()).expect("set");
            let grads: Vec<NDArray> = sizes.iter().map(|&n| pseudo(&[n], DType::F32, rank as u64)).collect();
            kv.push(&keys[..], &grads[..], 0).expect("push");
            kv.stats().held
        })
    });
    let model = 3600 * 4;
    for (rank, [replicated, owned]) in held.iter().enumerate() {
        // Replicated: every key's whole sum in its buffer; with owners, this rank's parts'.
        let (values, state, buffers) = (replicated.values, replicated.state, replicated.buffers);
        assert_eq!((values, state, buffers), (model, 2 * model, model), "rank {rank}");
        let mine = 1000 * 4 + [100, 200, 300][rank] * 4;
        assert_eq!((owned.values, owned.state, owned.buffers), (model, 2 * mine, mine), "rank {rank}");
    }
}

/// A push refused for one of its keys changes nothing on any worker, with owners as
/// without: a row-sparse push whose second key cannot take the optimizer (an integer
/// weight), and a dense push whose second key's update count is spent (found by the red
/// team: with owners, the first key's part changed on its owner only).
#[test]
fn a_push_refused_for_one_key_changes_no_key_on_any_worker() {
    let out = run_members(2, |rank, member| {
        [Layout::Replicated, Layout::Owners].map(|layout| {
            let kv = store(&member, layout);
            let table = |dtype| kvstore_core::RowSparse::from_dense(&pseudo(&[4, 3], dtype, 1)).expect("rows");
            kv.init_row_sparse("a", &table(DType::F32)).expect("init");
            kv.init_row_sparse("z", &table(DType::I32)).expect("init");
            kv.init(&["b", "c"][..], &[pseudo(&[4], DType::F32, 2), pseudo(&[4], DType::F32, 3)][..]).expect("init");
            let last = ((1u64 << 53) - 2) as f64;
            let sgd = Optimizer::builder("sgd").param("learning_rate", 0.1).param("begin_num_update", last);
            kv.set_optimizer(sgd.build().expect("sgd")).expect("set");
            let rows = |dtype| {
                kvstore_core::RowSparse::new(pseudo(&[1, 3], dtype, 7 + rank as u64), vec![1], &[4, 3]).expect("rows")
            };
            let pushes: Vec<(kvstore_core::Key, Vec<kvstore_core::RowSparse>)> =
                vec![("a".into(), vec![rows(DType::F32)]), ("z".into(), vec![rows(DType::I32)])];
            let rows_refused = kv.push_row_sparse_many(&pushes, 0).expect_err("an integer weight");
            let g = pseudo(&[4], DType::F32, 4 + rank as u64);
            // "c" counts to 2^53 - 1, then 2^53: its next update is refused.
            kv.push("c", &g, 0).expect("push");
            kv.push("c", &g, 0).expect("push");
            let c = bits(&kv.pull_new("c", 0).expect("pull"));
            let count_refused = kv.push(&["b", "c"][..], &[g.clone(), g][..], 0).expect_err("a spent count");
            let values =
                [("a", bits(&kv.pull_new("a", 0).expect("pull"))), ("b", bits(&kv.pull_new("b", 0).expect("pull")))];
            (
                rows_refused.to_string(),
                count_refused.to_string(),
                values,
                c == bits(&kv.pull_new("c", 0).expect("pull")),
            )
        })
    });
    let initial = [("a", bits(&pseudo(&[4, 3], DType::F32, 1))), ("b", bits(&pseudo(&[4], DType::F32, 2)))];
    for (rank, layouts) in out.iter().enumerate() {
        for (rows, count, values, c_kept) in layouts {
            assert!(rows.contains("weights must be float"), "rank {rank}: {rows}");
            assert!(count.contains("update count reached 2^53"), "rank {rank}: {count}");
            assert_eq!(values, &initial, "rank {rank}: a refused push changed a key");
            assert!(c_kept, "rank {rank}: the refused push changed c");
        }
    }
}

/// Workers that split keys at other bounds would own other elements: their pushes fail
/// on every worker before any data moves, naming the bound, and nothing changes (found
/// by the red team: the ranks' values parted, or a push moved one key's sums into
/// another's).
#[test]
fn workers_that_split_keys_at_other_bounds_fail_their_pushes() {
    let out = run_members(2, |rank, member| {
        let group: Arc<dyn Collective> = Arc::clone(&member) as _;
        let kv = KVStore::builder("dist_sync")
            .num_threads(1)
            .collective(group)
            .layout(Layout::Owners)
            .bigarray_bound(if rank == 0 { 1000 } else { 10 })
            .build()
            .expect("a store");
        kv.init(&["A", "B"][..], &[pseudo(&[100], DType::F32, 1), pseudo(&[100], DType::F32, 2)][..]).expect("init");
        kv.set_optimizer(Optimizer::builder("sgd").build().expect("sgd")).expect("set");
        let g = [pseudo(&[100], DType::F32, 5 + rank as u64), pseudo(&[100], DType::F32, 9 + rank as u64)];
        let e = kv.push(&["A", "B"][..], &g[..], 0).expect_err("bounds differ");
        (e.to_string(), bits(&kv.pull_new("A", 0).expect("pull")), bits(&kv.pull_new("B", 0).expect("pull")))
    });
    for (message, a, b) in out {
        assert!(message.contains("keys split from 1000 elements") && message.contains("from 10 elements"), "{message}");
        assert_eq!((a, b), (bits(&pseudo(&[100], DType::F32, 1)), bits(&pseudo(&[100], DType::F32, 2))));
    }
}

/// A custom updater with owners runs once per push of a key, on the key's whole owner
/// (a big key too), and every worker gets its result: the values of the replicated
/// layout, where it runs on every worker. Its failure fails the push on every worker,
/// naming the owner where it failed, and changes nothing; in a fused batch it fails its
/// own call only.
#[test]
fn a_custom_updater_runs_once_on_the_owner() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let out = run_members(3, |rank, member| {
        [Layout::Replicated, Layout::Owners].map(|layout| {
            let kv = store(&member, layout);
            let keys = ["u1", "u2", "u3", "ubig"];
            let sizes = [5, 6, 7, 2000];
            for (k, n) in keys.iter().zip(sizes) {
                kv.init(*k, &pseudo(&[n], DType::F32, 3)).expect("init");
            }
            let runs = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&runs);
            kv.set_updater(move |key: &kvstore_core::Key, _: usize, merged: &NDArray, stored: &NDArray| {
                counted.fetch_add(1, Ordering::SeqCst);
                if key.as_str() == "u2" && merged.to_vec::<f32>()?[0] > 100.0 {
                    return Err(kvstore_core::Error::invalid_argument("u2 too big"));
                }
                stored.add_assign(&merged.mul(0.5)?)
            })
            .expect("set_updater");
            for step in 0..4u64 {
                let grads: Vec<NDArray> =
                    sizes.iter().map(|&n| pseudo(&[n], DType::F32, step * 10 + rank as u64)).collect();
                kv.push(&keys[..], &grads[..], 0).expect("push");
            }
            // Several values of a key at once, summed here first.
            let two = [pseudo(&[2000], DType::F32, 70), pseudo(&[2000], DType::F32, 71 + rank as u64)];
            kv.push("ubig", &two[..], 0).expect("push of two values");
            let before: Vec<Vec<u64>> = keys.iter().map(|k| bits(&kv.pull_new(*k, 0).expect("pull"))).collect();
            let e = kv.push("u2", &NDArray::full(&[6], 1000.0).expect("big"), 0).expect_err("the updater fails");
            // Fused: the failing call fails alone.
            let fine = kv.push_async("u1", &NDArray::ones(&[5]).expect("ones"), 0);
            let bad = kv.push_async("u2", &NDArray::full(&[6], 1000.0).expect("big"), 0);
            let (fine, bad) = (fine.wait(), bad.wait().expect_err("fails"));
            fine.expect("the other call");
            let after: Vec<Vec<u64>> = keys.iter().map(|k| bits(&kv.pull_new(*k, 0).expect("pull"))).collect();
            (before, after, e.to_string(), bad.to_string(), runs.load(Ordering::SeqCst))
        })
    });
    for (rank, [replicated, owned]) in out.iter().enumerate() {
        assert_eq!(replicated.0, owned.0, "rank {rank}: the values before the failures");
        assert_eq!(replicated.1, owned.1, "rank {rank}: the values after them");
        assert_eq!(owned.0[1], owned.1[1], "rank {rank}: a failed push changed u2");
        assert_eq!(owned.0, out[0][1].0, "rank {rank}: the workers part");
        for message in [&owned.2, &owned.3] {
            // u2 is owned by rank 1 (u1, u2, u3 go to ranks 0, 1, 2): its own error there,
            // one naming it on the others.
            assert!(message.contains("u2 too big"), "rank {rank}: {message}");
            assert_eq!(message.contains("failed on rank 1"), rank != 1, "rank {rank}: {message}");
        }
        // Replicated: 4 keys x 4 pushes, the push of two values, the failing push and
        // the fused pair, on every worker.
        assert_eq!(replicated.4, 16 + 1 + 1 + 2, "rank {rank}");
    }
    // With owners, as often in all: once per push of a key, on its owner.
    let total: usize = out.iter().map(|[_, owned]| owned.4).sum();
    assert_eq!(total, 16 + 1 + 1 + 2);
}

/// The `dist_sync` cases whose outcome does not depend on where the optimizer state
/// lives, with owners: among them the message of workers whose calls differ, whose form
/// once held a parenthesis of the owners' and came out cut ("(blocking, state on
/// owners;"), found by running the MPI suite with owners.
#[test]
fn the_dist_sync_cases_hold_with_owners() {
    use kvstore_tests::dist_cases as cases;
    for workers in [2, 3] {
        run_members(workers, |rank, member| {
            let kv = || store(&member, Layout::Owners);
            cases::case_23_init_push_and_test_optimizer(rank, &kv());
            cases::each_round_every_worker_pushes_rank_plus_one(rank, &kv());
            cases::an_optimizer_runs_identically_on_every_worker(rank, &kv());
            cases::nonblocking_training_matches_blocking(rank, &kv());
            cases::workers_whose_calls_differ_all_fail(rank, &kv());
            cases::a_call_refused_before_its_step_fails_on_every_worker(rank, &kv());
            cases::workers_with_other_optimizers_fail_their_pushes(rank, &kv());
            cases::row_sparse_pushes_sum_every_workers_rows(rank, &kv());
            cases::compressed_pushes_sum_every_workers_quantised_values(rank, &kv());
        });
    }
}
