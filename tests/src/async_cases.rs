//! The `dist_async` cases, written once as functions of one worker's rank and store;
//! they assert what that worker must see for the store's number of workers W. The
//! thread runner (`tests/tests/dist_async.rs`) and the MPI runner
//! (`kvstore-mpi/tests/mpi_async.rs`) call the same functions.
//!
//! Values are small integers (or their halves), so every order of applying the pushes
//! gives the same numbers: the models are plain sums, whatever the timing.

use kvstore_core::{Context, DType, ErrorKind, KVStore, Key, NDArray, Optimizer, Result};

use crate::device_checks::bits;
use crate::{full, pulled};

/// The elements of a key split across the owners (above MXNet's default bound).
pub const BIG: usize = 1_000_003;

fn summing_updater(kv: &KVStore) {
    kv.set_updater(|_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> { stored.add_assign(merged) })
        .expect("set_updater");
}

/// Worker `w`'s value for key `k` at step `s`, as a multiple of the key's ones.
fn step_value(w: usize, s: usize, k: usize) -> f64 {
    ((w * 7 + s * 3 + k * 5) % 11) as f64 - 5.0
}

/// Every push of every worker is applied once, whatever the interleaving: with a
/// summing updater, the value after a barrier is the initial value (rank 0's) plus
/// every push (blocking, non-blocking, list and repeated-key pushes, pushpulls), on
/// small keys and on a key split across the owners. Returns the pulled bits (equal on
/// every worker).
pub fn every_push_is_applied_once(rank: usize, kv: &KVStore) -> Vec<u8> {
    let workers = kv.num_workers();
    assert_eq!(kv.rank(), rank);
    let shapes: [&[usize]; 3] = [&[5], &[3, 4], &[BIG]];
    let keys = ["a", "b", "big"];
    // Rank 0's values are the ones the owners keep.
    let inits: Vec<NDArray> = shapes.iter().map(|s| full(s, 1.0 + rank as f64 * 100.0, Context::cpu(0))).collect();
    kv.init(&keys[..], &inits[..]).expect("init");
    summing_updater(kv);
    let steps = 6;
    for s in 0..steps {
        let vals: Vec<NDArray> = (0..3).map(|k| full(shapes[k], step_value(rank, s, k), Context::cpu(0))).collect();
        match s % 3 {
            // A list push, key "a" twice (its values summed).
            0 => {
                let zero = full(shapes[0], 0.0, Context::cpu(0));
                let list = [vals[0].clone(), vals[1].clone(), vals[2].clone(), zero];
                kv.push(&["a", "b", "big", "a"][..], &list[..], 0).expect("push")
            }
            // Non-blocking pushes, waited for together.
            1 => {
                let pending: Vec<_> = keys.iter().zip(&vals).map(|(k, v)| kv.push_async(*k, v, 0)).collect();
                for p in pending {
                    p.wait().expect("push_async");
                }
            }
            // Pushpulls (the pulled value is whatever the owner holds then).
            _ => {
                for (k, v) in keys.iter().zip(&vals) {
                    let out = NDArray::zeros_with(v.shape(), DType::F32, Context::cpu(0)).expect("out");
                    kv.pushpull(*k, v, &out, 0).expect("pushpull");
                }
            }
        }
    }
    kv.barrier().expect("barrier");
    let mut got = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        let want = 1.0 + (0..workers).flat_map(|w| (0..steps).map(move |s| step_value(w, s, k))).sum::<f64>();
        let value = pulled(kv, *key, shapes[k]);
        assert!(value.iter().all(|&x| x == want), "rank {rank}, key {key}: {:?}... want {want}", &value[..3]);
        got.extend(bits(&NDArray::from_vec(&[value.len()], value).expect("bits")));
    }
    kv.barrier().expect("barrier");
    got
}

/// The pushes of one worker to one key are applied in the order it made them: an
/// updater that is not commutative (`stored = stored / 2 + merged`) gives the value of
/// applying them one by one. Rank 0 pushes (blocking and non-blocking), the others
/// pull meanwhile.
pub fn one_workers_pushes_apply_in_order(rank: usize, kv: &KVStore) {
    kv.init("o", &full(&[4], 0.0, Context::cpu(0))).expect("init");
    kv.set_updater(|_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        stored.mul_assign(0.5)?;
        stored.add_assign(merged)
    })
    .expect("set_updater");
    let n = 12;
    if rank == 0 {
        let vals: Vec<NDArray> = (0..n).map(|i| full(&[4], (i % 5) as f64 * 8.0, Context::cpu(0))).collect();
        let pending: Vec<_> = vals
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match i % 2 {
                0 => Some(kv.push_async("o", v, 0)),
                _ => {
                    kv.push("o", v, 0).expect("push");
                    None
                }
            })
            .collect();
        for p in pending {
            p.wait().expect("push_async");
        }
    } else {
        for _ in 0..n {
            pulled(kv, "o", &[4]);
        }
    }
    kv.barrier().expect("barrier");
    let want = (0..n).fold(0.0f64, |acc, i| acc / 2.0 + (i % 5) as f64 * 8.0);
    assert_eq!(pulled(kv, "o", &[4]), vec![want; 4], "rank {rank}");
    kv.barrier().expect("barrier");
}

/// `set_optimizer` installs the optimizer on every owner: SGD (learning rate 0.5)
/// applies every worker's gradients to the weights, `w = -0.5 * (every gradient)`.
pub fn an_optimizer_runs_on_the_owners(rank: usize, kv: &KVStore) {
    let workers = kv.num_workers();
    kv.init(&["w1", "w2"][..], &[full(&[8], 0.0, Context::cpu(0)), full(&[2, 2], 0.0, Context::cpu(0))][..])
        .expect("init");
    kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 0.5).build().expect("sgd")).expect("set");
    assert_eq!(kv.optimizer_name(), Some("sgd"));
    for s in 0..4 {
        kv.push("w1", &full(&[8], step_value(rank, s, 0), Context::cpu(0)), 0).expect("push");
        kv.push("w2", &full(&[2, 2], step_value(rank, s, 1), Context::cpu(0)), 0).expect("push");
    }
    kv.barrier().expect("barrier");
    for (k, (key, shape)) in [("w1", &[8][..]), ("w2", &[2, 2][..])].into_iter().enumerate() {
        let want = -0.5 * (0..workers).flat_map(|w| (0..4).map(move |s| step_value(w, s, k))).sum::<f64>();
        assert!(pulled(kv, key, shape).iter().all(|&x| x == want), "rank {rank}, key {key}");
    }
    kv.barrier().expect("barrier");
}

/// Errors reach the worker that made the call, and nothing changes: a value of
/// another shape, a key never initialised. The calls that the store does not have for
/// dist_async yet say so.
pub fn errors_reach_the_caller_only(rank: usize, kv: &KVStore) {
    kv.init("e", &full(&[3], 2.0, Context::cpu(0))).expect("init");
    if rank + 1 == kv.num_workers() {
        let e = kv.push("e", &full(&[4], 1.0, Context::cpu(0)), 0).expect_err("another shape");
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch, "{e}");
        let e = kv.push("never", &full(&[3], 1.0, Context::cpu(0)), 0).expect_err("no such key");
        assert_eq!(e.kind(), ErrorKind::KeyNotInitialized, "{e}");
    }
    let e = kv.save_optimizer_states(std::env::temp_dir().join("never-written.states")).expect_err("not yet");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    kv.barrier().expect("barrier");
    assert_eq!(pulled(kv, "e", &[3]), vec![2.0; 3], "rank {rank}");
    kv.barrier().expect("barrier");
}

/// A worker's pseudo-random numbers (xorshift), from a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Worker `w`'s schedule for `seed`: its pushes as (key, value, non-blocking, pause in
/// microseconds before it).
fn schedule(seed: u64, w: usize, keys: usize) -> Vec<(usize, i32, bool, u64)> {
    let mut rng = Rng::new(seed * 1000 + w as u64 + 1);
    let n = 10 + rng.below(30) as usize;
    (0..n)
        .map(|_| (rng.below(keys as u64) as usize, rng.below(9) as i32 - 4, rng.below(3) == 0, rng.below(4) * 150))
        .collect()
}

/// A property over random schedules: whatever the pushes, their order and their timing
/// (each worker's drawn from `seed`, so every worker knows every schedule), no push is
/// lost or applied twice: with a summing updater, after a barrier each key holds its
/// initial value plus every worker's pushes to it. Non-blocking pushes are waited for
/// at the end.
pub fn random_schedules_lose_no_push(rank: usize, kv: &KVStore, seed: u64) {
    let workers = kv.num_workers();
    let keys: Vec<String> = (0..3).map(|k| format!("r{seed}-{k}")).collect();
    let inits: Vec<NDArray> = (0..3).map(|k| full(&[6], k as f64, Context::cpu(0))).collect();
    kv.init(keys.as_slice(), inits.as_slice()).expect("init");
    summing_updater(kv);
    let mut pending = Vec::new();
    for (k, v, nonblocking, pause) in schedule(seed, rank, keys.len()) {
        if pause > 0 {
            std::thread::sleep(std::time::Duration::from_micros(pause));
        }
        let value = full(&[6], f64::from(v), Context::cpu(0));
        match nonblocking {
            true => pending.push(kv.push_async(keys[k].as_str(), &value, 0)),
            false => kv.push(keys[k].as_str(), &value, 0).expect("push"),
        }
    }
    for p in pending {
        p.wait().expect("push_async");
    }
    kv.barrier().expect("barrier");
    for (k, key) in keys.iter().enumerate() {
        let pushed: i32 =
            (0..workers).flat_map(|w| schedule(seed, w, 3)).filter(|(kk, ..)| *kk == k).map(|(_, v, ..)| v).sum();
        let want = k as f64 + f64::from(pushed);
        assert_eq!(pulled(kv, key.as_str(), &[6]), vec![want; 6], "seed {seed}, rank {rank}, key {key}");
    }
    kv.barrier().expect("barrier");
}

/// The keys of the checkpoint cases: a small one and one split across the owners.
const CKPT_KEYS: [(&str, usize); 2] = [("c-small", 7), ("c-big", BIG)];

/// Every checkpoint key's bits, pulled.
pub fn checkpoint_bits(kv: &KVStore) -> Vec<u8> {
    CKPT_KEYS
        .iter()
        .flat_map(|(k, n)| {
            let out = NDArray::zeros(&[*n]).expect("out");
            kv.pull(*k, &out, 0).expect("pull");
            bits(&out)
        })
        .collect()
}

/// The push after a resume: rank 0 pushes one gradient to every checkpoint key (the
/// others wait), then every worker pulls: the bits (of every key).
pub fn next_push(rank: usize, kv: &KVStore) -> Vec<u8> {
    kv.barrier().expect("barrier");
    if rank == 0 {
        for (k, n) in CKPT_KEYS {
            let g = NDArray::from_vec(&[n], (0..n).map(|i| ((i % 13) as f32 - 6.0) * 0.125).collect()).expect("g");
            kv.push(k, &g, 0).expect("push");
        }
    }
    kv.barrier().expect("barrier");
    checkpoint_bits(kv)
}

/// Trains the checkpoint keys with Adam from every worker (a few pushes each), saves a
/// checkpoint to `path` (every worker calls it), then makes [`next_push`]: returns the
/// bits saved and the bits after it.
pub fn train_and_checkpoint(rank: usize, kv: &KVStore, path: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let inits: Vec<NDArray> = CKPT_KEYS.iter().map(|(_, n)| full(&[*n], 0.5, Context::cpu(0))).collect();
    let keys: Vec<&str> = CKPT_KEYS.iter().map(|(k, _)| *k).collect();
    kv.init(keys.as_slice(), inits.as_slice()).expect("init");
    kv.set_optimizer(Optimizer::builder("adam").param("learning_rate", 0.01).build().expect("adam")).expect("set");
    for s in 0..3 {
        for (k, n) in CKPT_KEYS {
            kv.push(k, &full(&[n], step_value(rank, s, 0) * 0.25, Context::cpu(0)), 0).expect("push");
        }
    }
    kv.barrier().expect("barrier");
    let saved = checkpoint_bits(kv);
    kv.save_checkpoint(path).expect("save_checkpoint");
    (saved, next_push(rank, kv))
}

/// A push of 8 keys whose updater fails on "k5" (on its owner): each key is applied on
/// its owner as the push goes, so the error names exactly the keys applied before it
/// (k0–k4), and those, only those, changed on every worker.
pub fn a_failed_push_names_the_keys_it_applied(rank: usize, kv: &KVStore) {
    // (The updater of worker `rank` runs on that worker's parts: "big" fails on rank 1's.)
    kv.set_updater(move |key: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> kvstore_core::Result<()> {
        if key.as_str() == "k5" || (key.as_str() == "big" && rank == 1) || (key.as_str() == "big2" && rank <= 1) {
            return Err(kvstore_core::Error::invalid_argument(format!("a deliberate failure for {key:?}")));
        }
        stored.add_assign(merged)
    })
    .expect("updater");
    let keys: Vec<String> = (0..8).map(|k| format!("k{k}")).collect();
    let zeros: Vec<NDArray> = keys.iter().map(|_| full(&[4], 0.0, Context::cpu(0))).collect();
    kv.init(keys.as_slice(), zeros.as_slice()).expect("init");
    kv.barrier().expect("barrier");
    if rank == 0 {
        let ones: Vec<NDArray> = keys.iter().map(|_| full(&[4], 1.0, Context::cpu(0))).collect();
        let e = kv.push(keys.as_slice(), ones.as_slice(), 0).expect_err("k5's updater fails");
        let text = e.to_string();
        assert!(text.contains("deliberate failure for \"k5\""), "{text}");
        let applied = text.split("were applied").nth(1).unwrap_or_default();
        for k in 0..5 {
            assert!(applied.contains(&format!("\"k{k}\"")), "k{k} not named as applied: {text}");
        }
        for k in 5..8 {
            assert!(!applied.contains(&format!("\"k{k}\"")), "k{k} named as applied: {text}");
        }
    }
    kv.barrier().expect("barrier");
    for (k, key) in keys.iter().enumerate() {
        let want = if k < 5 { 1.0 } else { 0.0 };
        assert_eq!(pulled(kv, key.as_str(), &[4]), vec![want; 4], "rank {rank}, {key}");
    }
    kv.barrier().expect("barrier");
    // A key split across its owners (MXNET_KVSTORE_BIGARRAY_BOUND, 1,000,000 elements):
    // the error names the owners that applied their parts.
    let workers = kv.num_workers();
    if workers > 1 {
        const BIG: usize = 1_000_000;
        kv.init("big", &full(&[BIG], 0.0, Context::cpu(0))).expect("init");
        kv.barrier().expect("barrier");
        if rank == 0 {
            let e = kv.push("big", &full(&[BIG], 1.0, Context::cpu(0)), 0).expect_err("rank 1's part fails");
            let text = e.to_string();
            assert!(text.contains("rank 1, the owner of key \"big\""), "{text}");
            for r in (0..workers).filter(|&r| r != 1) {
                assert!(text.contains(&format!("on rank {r} was served")), "rank {r}'s part not named: {text}");
            }
        }
        kv.barrier().expect("barrier");
        // Every part applied but rank 1's (part p starts at element BIG * p / W).
        let got = kv.pull_new("big", 0).expect("pull").to_vec::<f32>().expect("f32");
        let firsts: Vec<f32> = (0..workers).map(|p| got[BIG * p / workers]).collect();
        assert_eq!(firsts.iter().filter(|&&x| x == 0.0).count(), 1, "rank {rank}: parts {firsts:?}");
        assert_eq!(firsts.iter().filter(|&&x| x == 1.0).count(), workers - 1, "rank {rank}: parts {firsts:?}");
        kv.barrier().expect("barrier");
        // Refused by this worker's own part and another's: the part served is named too.
        if workers == 3 {
            kv.init("big2", &full(&[BIG], 0.0, Context::cpu(0))).expect("init");
            kv.barrier().expect("barrier");
            if rank == 0 {
                let e = kv.push("big2", &full(&[BIG], 1.0, Context::cpu(0)), 0).expect_err("two parts fail");
                assert!(e.to_string().contains("on rank 2 was served"), "rank 2's part not named: {e}");
            }
            kv.barrier().expect("barrier");
        }
        kv.barrier().expect("barrier");
    }
}
