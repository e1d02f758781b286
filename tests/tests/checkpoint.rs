//! Whole-store checkpoints: exact resumes (on 1, 2 and 4 workers), loading into another
//! store kind and another number of workers, all-or-nothing loads, damaged files, and
//! workers that disagree about the file.

use std::sync::Arc;

use kvstore_core::{Context, DType, ErrorKind, KVStore, Key, NDArray, Optimizer};
use kvstore_tests::dist_cases::{self, checkpoint_keys, checkpoint_optimizers, train};
use kvstore_tests::{TempDir, dist_store, run_members};

#[test]
fn a_checkpoint_resumes_exactly_on_one_store() {
    let dir = TempDir::new("ckpt-resume-local");
    let kv = KVStore::create("local").expect("local");
    dist_cases::a_checkpoint_resumes_exactly(0, &kv, &|| KVStore::create("local").expect("local"), dir.dir());
}

#[test]
fn a_checkpoint_resumes_exactly_on_two_and_four_workers() {
    for w in [2, 4] {
        let dir = TempDir::new(&format!("ckpt-resume-{w}"));
        let path = dir.dir().to_path_buf();
        let bits = run_members(w, move |rank, member| {
            let kv = dist_store(&member);
            dist_cases::a_checkpoint_resumes_exactly(rank, &kv, &|| dist_store(&member), &path)
        });
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers: the workers' weights differ");
    }
}

/// Gradients that are multiples of 1/64 below 1 in size: every sum of a few of them is
/// exact in f32 and f16 alike, so sums in any order (one process or many) agree.
fn exact_grad(n: usize, dtype: DType, step: u64, key: usize, worker: usize) -> NDArray {
    let data: Vec<f64> =
        (0..n).map(|i| ((i * 7 + key * 3 + worker * 5 + step as usize * 11) % 61) as f64 / 64.0 - 0.5).collect();
    NDArray::from_vec(&[n], data).and_then(|a| a.as_type(dtype)).expect("grad")
}

/// Saved by 4 workers of `dist_sync`, a checkpoint loads into a `local` store, a
/// `device` store and 2 workers, and each trains on to the same bits as the 4 workers
/// (the summed gradients are the same, and exact).
#[test]
fn a_checkpoint_of_four_workers_resumes_on_one_process_and_on_two_workers() {
    let dir = TempDir::new("ckpt-worlds");
    let path = dir.path("four.ckpt");
    for (name, _) in checkpoint_optimizers() {
        let keys = checkpoint_keys(name);
        let grad_of = |keys: Vec<(String, usize, DType)>, workers: Vec<usize>| {
            move |step: u64, key: usize, local: u64| {
                let (_, n, d) = &keys[key];
                exact_grad(*n, *d, step, key, workers[local as usize])
            }
        };
        // 4 workers: worker r's two local values are the gradients of 2r and 2r + 1,
        // so that every step sums the gradients of 8 "devices".
        let (p, k) = (path.clone(), keys.clone());
        let four = run_members(4, move |rank, member| {
            let kv = dist_store(&member);
            for (key, n, d) in &k {
                kv.init(key.as_str(), &kvstore_tests::device_checks::values(*n, 5, *d, Context::cpu(0))).expect("init");
            }
            let opt = checkpoint_optimizers().into_iter().find(|(o, _)| *o == name).expect("opt").1;
            kv.set_optimizer(opt).expect("set");
            let grad = grad_of(k.clone(), vec![2 * rank, 2 * rank + 1]);
            train(&kv, &k, 0..3, &grad);
            kv.save_checkpoint(&p).expect("save");
            train(&kv, &k, 3..5, &grad)
        });
        assert!(four.windows(2).all(|b| b[0] == b[1]), "{name}: the 4 workers differ");
        // One process: the 8 gradients pushed as 8 values of a key (its sum is exact).
        for kind in ["local", "device"] {
            let kv = KVStore::create(kind).expect("store");
            kv.load_checkpoint(&path).expect("load");
            let outs: Vec<NDArray> =
                keys.iter().map(|(_, n, d)| NDArray::zeros_with(&[*n], *d, Context::cpu(0)).expect("o")).collect();
            for step in 3..5 {
                for (i, (k, n, d)) in keys.iter().enumerate().rev() {
                    let grads: Vec<NDArray> = (0..8).map(|w| exact_grad(*n, *d, step, i, w)).collect();
                    kv.pushpull(k.as_str(), grads.as_slice(), &outs[i], 0).expect("pushpull");
                }
            }
            let bits: Vec<u8> = outs.iter().flat_map(kvstore_tests::device_checks::bits).collect();
            assert!(bits == four[0], "{name}: {kind} resumed to other weights than the 4 workers");
        }
        // 2 workers: worker r's two local values sum the gradients of 4r..4r + 3.
        let (p, k) = (path.clone(), keys.clone());
        let two = run_members(2, move |rank, member| {
            let kv = dist_store(&member);
            kv.load_checkpoint(&p).expect("load");
            let grad = |step: u64, key: usize, local: u64| {
                let (_, n, d) = &k[key];
                let base = 4 * rank + 2 * local as usize;
                let a = exact_grad(*n, *d, step, key, base);
                a.add_assign(&exact_grad(*n, *d, step, key, base + 1)).expect("add");
                a
            };
            train(&kv, &k, 3..5, &grad)
        });
        assert!(two.iter().all(|b| *b == four[0]), "{name}: 2 workers resumed to other weights than 4");
    }
}

#[test]
fn a_load_sets_values_optimizer_and_new_keys_and_leaves_other_keys() {
    let dir = TempDir::new("ckpt-contents");
    let path = dir.path("c.ckpt");
    let kv = KVStore::create("local").expect("local");
    kv.init(
        &["w", "n"],
        &[NDArray::full(&[2], 1.0).expect("a"), NDArray::full_with(&[3], 7.0, DType::I32, Context::cpu(0)).expect("b")],
    )
    .expect("init");
    kv.save_checkpoint(&path).expect("save with no optimizer");
    let other = KVStore::create("local").expect("local");
    other.init("w", &NDArray::full(&[2], 5.0).expect("w")).expect("init");
    other.init("extra", &NDArray::full(&[1], 9.0).expect("x")).expect("init");
    other.set_optimizer(Optimizer::builder("sgd").build().expect("sgd")).expect("set");
    other.load_checkpoint(&path).expect("load");
    assert_eq!(other.pull_new("w", 0).expect("w").to_vec::<f32>().expect("r"), vec![1.0; 2]);
    assert_eq!(other.pull_new("n", 0).expect("n").to_vec::<i32>().expect("r"), vec![7; 3], "a new key");
    assert_eq!(other.pull_new("extra", 0).expect("x").to_vec::<f32>().expect("r"), vec![9.0], "not in the file");
    assert_eq!(other.optimizer_name(), None, "saved with no updater: pushes assign again");
    other.push("w", &NDArray::full(&[2], 3.0).expect("g"), 0).expect("push");
    assert_eq!(other.pull_new("w", 0).expect("w").to_vec::<f32>().expect("r"), vec![3.0; 2]);
    // A custom updater is code: the file says one was installed, and a load keeps the
    // store's own.
    kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| stored.add_assign(merged)).expect("updater");
    kv.save_checkpoint(&path).expect("save with an updater");
    other
        .set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| stored.add_assign(&merged.mul(10.0)?))
        .expect("updater");
    other.load_checkpoint(&path).expect("load");
    other.push("w", &NDArray::full(&[2], 1.0).expect("g"), 0).expect("push");
    assert_eq!(other.pull_new("w", 0).expect("w").to_vec::<f32>().expect("r"), vec![11.0; 2], "the store's updater");
}

/// A load that fails changes nothing: the store's values, optimizer and its states stay.
#[test]
fn a_failed_load_changes_nothing() {
    let dir = TempDir::new("ckpt-fail");
    let path = dir.path("c.ckpt");
    let saved = KVStore::create("local").expect("local");
    saved
        .init(&["a", "w"], &[NDArray::full(&[2], 1.0).expect("a"), NDArray::full(&[4], 2.0).expect("w")])
        .expect("init");
    saved.set_optimizer(Optimizer::builder("adam").build().expect("adam")).expect("set");
    saved.push("w", &NDArray::ones(&[4]).expect("g"), 0).expect("push");
    saved.save_checkpoint(&path).expect("save");

    let kv = KVStore::create("local").expect("local");
    kv.init(&["a", "w"], &[NDArray::full(&[2], 5.0).expect("a"), NDArray::full(&[3], 6.0).expect("w")]).expect("init");
    let sgd = Optimizer::builder("sgd").param("learning_rate", 1.0).param("momentum", 0.5).build().expect("sgd");
    kv.set_optimizer(sgd).expect("set");
    kv.push("a", &NDArray::ones(&[2]).expect("g"), 0).expect("push"); // a = 4, momentum -1
    let e = kv.load_checkpoint(&path).expect_err("w has another shape");
    assert_eq!(e.kind(), ErrorKind::ShapeMismatch, "{e}");
    assert!(e.to_string().contains("key \"w\""), "{e}");
    assert_eq!(kv.pull_new("a", 0).expect("a").to_vec::<f32>().expect("r"), vec![4.0; 2], "a was loaded");
    assert_eq!(kv.optimizer_name(), Some("sgd"));
    kv.push("a", &NDArray::ones(&[2]).expect("g"), 0).expect("push"); // momentum 0.5 * -1 - 1
    assert_eq!(kv.pull_new("a", 0).expect("a").to_vec::<f32>().expect("r"), vec![2.5; 2], "the momentum was lost");
}

/// Flips one byte of the file at `at` (from the end when negative).
fn damage(path: &std::path::Path, at: i64) {
    let mut bytes = std::fs::read(path).expect("read");
    let i = if at < 0 { (bytes.len() as i64 + at) as usize } else { at as usize };
    bytes[i] ^= 0x40;
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn damaged_truncated_and_special_files_are_refused() {
    let dir = TempDir::new("ckpt-damaged");
    let path = dir.path("c.ckpt");
    let kv = KVStore::create("local").expect("local");
    kv.init(&["a", "b"], &[NDArray::full(&[2], 1.0).expect("a"), NDArray::full(&[64], 2.0).expect("b")]).expect("init");
    kv.set_optimizer(Optimizer::builder("adam").build().expect("adam")).expect("set");
    kv.push(&["a", "b"], &[NDArray::ones(&[2]).expect("g"), NDArray::ones(&[64]).expect("g")], 0).expect("push");
    let fresh = || KVStore::create("local").expect("local");
    // The last bytes are the last tensor's data: the message names the tensor.
    kv.save_checkpoint(&path).expect("save");
    damage(&path, -3);
    let e = fresh().load_checkpoint(&path).expect_err("damaged data");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("is damaged: its CRC-32 does not match"), "{e}");
    // A byte of the metadata (its keys' shapes, here): the file's checksum catches it.
    kv.save_checkpoint(&path).expect("save");
    let text = std::fs::read(&path).expect("read");
    let at = text.windows(9).position(|w| w == b"\\\"count\\\"").expect("a count in the metadata");
    let mut bytes = text.clone();
    let digit = at + 10;
    assert!(bytes[digit].is_ascii_digit(), "{}", bytes[digit] as char);
    bytes[digit] = if bytes[digit] == b'7' { b'8' } else { b'7' };
    std::fs::write(&path, &bytes).expect("write");
    let e = fresh().load_checkpoint(&path).expect_err("damaged metadata");
    assert!(e.to_string().contains("the checksum does not match"), "{e}");
    // Truncated, missing, a directory, an optimizer-state file.
    kv.save_checkpoint(&path).expect("save");
    let whole = std::fs::read(&path).expect("read");
    std::fs::write(&path, &whole[..whole.len() - 10]).expect("truncate");
    assert_eq!(fresh().load_checkpoint(&path).expect_err("truncated").kind(), ErrorKind::Io);
    assert_eq!(fresh().load_checkpoint(dir.path("none")).expect_err("missing").kind(), ErrorKind::Io);
    assert_eq!(fresh().load_checkpoint(dir.dir()).expect_err("a directory").kind(), ErrorKind::InvalidArgument);
    assert_eq!(kv.save_checkpoint(dir.dir()).expect_err("a directory").kind(), ErrorKind::InvalidArgument);
    kv.save_optimizer_states(&path).expect("states");
    let e = fresh().load_checkpoint(&path).expect_err("not a checkpoint");
    assert!(e.to_string().contains("not a valid checkpoint"), "{e}");
    // Nothing was loaded by any of them.
    let store = fresh();
    assert!(store.load_checkpoint(dir.path("none")).is_err());
    assert!(store.keys().is_empty());
}

/// Under `dist_sync` a rank that cannot read the file, or reads another one, fails the
/// load on every rank, and no rank changes.
#[test]
fn ranks_that_read_different_files_all_fail() {
    let dir = TempDir::new("ckpt-ranks");
    let (one, two) = (dir.path("one.ckpt"), dir.path("two.ckpt"));
    for (path, v) in [(&one, 1.0), (&two, 2.0)] {
        let kv = KVStore::create("local").expect("local");
        kv.init("w", &NDArray::full(&[2], v).expect("w")).expect("init");
        kv.save_checkpoint(path).expect("save");
    }
    let missing = dir.path("missing.ckpt");
    for (case, paths) in [("different", [&one, &one, &two]), ("missing", [&one, &missing, &one])] {
        let paths: Vec<std::path::PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
        let errors = run_members(3, move |rank, member| {
            let kv = dist_store(&member);
            kv.init("w", &NDArray::full(&[2], 9.0).expect("w")).expect("init");
            let e = kv.load_checkpoint(&paths[rank]).expect_err("the ranks disagree");
            assert_eq!(kv.pull_new("w", 0).expect("w").to_vec::<f32>().expect("r"), vec![9.0; 2], "rank {rank} loaded");
            (e.kind(), e.to_string())
        });
        for (rank, (kind, message)) in errors.iter().enumerate() {
            match case {
                "different" => {
                    assert_eq!(*kind, ErrorKind::InvalidArgument, "{message}");
                    assert!(message.contains("the ranks read different files: ranks 0, 1 read"), "{message}");
                    assert!(message.contains("; rank 2 read"), "{message}");
                }
                _ if rank == 1 => assert!(message.contains("missing.ckpt"), "{message}"),
                _ => assert!(message.contains("rank 1 could not read or check the file"), "{message}"),
            }
        }
    }
}

/// Under `dist_sync` rank 0 writes the file; when it cannot, every rank fails.
#[test]
fn a_save_that_rank_0_cannot_write_fails_on_every_rank() {
    let dir = TempDir::new("ckpt-save-fail");
    let target = Arc::new(dir.dir().to_path_buf());
    let errors = run_members(2, move |_, member| {
        let kv = dist_store(&member);
        kv.init("w", &NDArray::zeros(&[2]).expect("w")).expect("init");
        kv.save_checkpoint(&*target).expect_err("a directory").to_string()
    });
    assert!(errors[0].contains("not a regular file"), "{}", errors[0]);
    assert!(errors[1].contains("rank 0 could not write the file"), "{}", errors[1]);
    // Written by rank 0 only, once, and loadable.
    let path = dir.path("ok.ckpt");
    let p = path.clone();
    run_members(2, move |_, member| {
        let kv = dist_store(&member);
        kv.init("w", &NDArray::full(&[2], 3.0).expect("w")).expect("init");
        kv.save_checkpoint(&p).expect("save");
        assert!(p.exists(), "every rank returns once the file is there");
    });
    let kv = KVStore::create("local").expect("local");
    kv.load_checkpoint(&path).expect("load");
    assert_eq!(kv.pull_new("w", 0).expect("w").to_vec::<f32>().expect("r"), vec![3.0; 2]);
    assert_eq!(std::fs::read_dir(dir.dir()).expect("dir").count(), 1, "no temporary files are left");
}

/// Keys the optimizer cannot update (integers) may live beside it, and load with it.
#[test]
fn keys_of_any_dtype_load_beside_an_optimizer() {
    let dir = TempDir::new("ckpt-dtypes");
    let path = dir.path("c.ckpt");
    let kv = KVStore::create("local").expect("local");
    for (i, d) in DType::ALL.iter().enumerate() {
        kv.init(format!("k{i}"), &kvstore_tests::device_checks::values(5, i as u64, *d, Context::cpu(0)))
            .expect("init");
    }
    kv.set_optimizer(Optimizer::builder("sgd").build().expect("sgd")).expect("set");
    kv.save_checkpoint(&path).expect("save");
    let resumed = KVStore::create("local").expect("local");
    resumed.load_checkpoint(&path).expect("load");
    for i in 0..DType::ALL.len() {
        let (a, b) = (kv.pull_new(format!("k{i}"), 0).expect("a"), resumed.pull_new(format!("k{i}"), 0).expect("b"));
        assert_eq!(a.dtype(), b.dtype());
        assert!(kvstore_tests::device_checks::bits(&a) == kvstore_tests::device_checks::bits(&b), "{}", a.dtype());
    }
}

/// Trains keys "a" and "b" for `steps`: "b" alone at odd steps, then both in one list
/// push (so their update counts differ, and the order the store updates them in within
/// the list push matters to a schedule); their values' bits.
fn train_two(kv: &KVStore, steps: std::ops::Range<u64>) -> Vec<Vec<u32>> {
    for step in steps {
        let g = |k: u64| NDArray::full(&[2], 1.0 + (step * 2 + k) as f64).expect("g");
        if step % 2 == 1 {
            kv.push("b", &g(1), 0).expect("push");
        }
        kv.push(&["a", "b"], &[g(0), g(1)], 0).expect("push");
    }
    let bits =
        |k: &str| kv.pull_new(k, 0).expect("pull").to_vec::<f32>().expect("r").iter().map(|x| x.to_bits()).collect();
    vec![bits("a"), bits("b")]
}

/// SGD whose learning rate halves at every update, or NAdam (whose momentum schedule
/// is one product over every update).
fn order_sensitive(name: &str) -> Optimizer {
    match name {
        "sgd" => {
            let halving = kvstore_core::LrScheduler::factor(1, 0.5).expect("factor");
            Optimizer::builder("sgd").param("learning_rate", 1.0).lr_scheduler(halving).build().expect("sgd")
        }
        _ => Optimizer::builder("nadam").build().expect("nadam"),
    }
}

fn store_of(keys: &[&str], value: f64) -> KVStore {
    let kv = KVStore::create("local").expect("local");
    let values: Vec<NDArray> = keys.iter().map(|_| NDArray::full(&[2], value).expect("v")).collect();
    kv.init(keys, values.as_slice()).expect("init");
    kv
}

/// A load resumes the file's run exactly, whatever keys the store has and in whatever
/// order they were initialised: the keys are updated in the file's order (the order
/// of the run that saved it), which a schedule and NAdam's momentum depend on.
#[test]
fn a_load_updates_keys_in_the_files_order_whatever_the_store_had() {
    let dir = TempDir::new("ckpt-order");
    let (path, again_path) = (dir.path("c.ckpt"), dir.path("again.ckpt"));
    for name in ["sgd", "nadam"] {
        let opt = || order_sensitive(name);
        let saved = store_of(&["a", "b"], 0.0);
        saved.set_optimizer(opt()).expect("set");
        train_two(&saved, 0..3);
        saved.save_checkpoint(&path).expect("save");
        let expected = train_two(&saved, 3..6);
        // The order matters: trained from the start in the other order, the run ends
        // elsewhere.
        let other = store_of(&["b", "a"], 0.0);
        other.set_optimizer(opt()).expect("set");
        train_two(&other, 0..3);
        assert_ne!(train_two(&other, 3..6), expected, "{name}: the order does not matter here");
        // Fresh, initialised in the other order, with only "b", with a key of its own
        // first, and one that already trained in the other order.
        let trained = store_of(&["b", "a"], 1.0);
        trained.set_optimizer(opt()).expect("set");
        train_two(&trained, 0..2);
        for (what, kv) in [
            ("fresh", KVStore::create("local").expect("local")),
            ("reversed", store_of(&["b", "a"], 1.0)),
            ("only b", store_of(&["b"], 1.0)),
            ("another key first", store_of(&["c", "b", "a"], 1.0)),
            ("trained", trained),
        ] {
            kv.load_checkpoint(&path).expect("load");
            assert_eq!(train_two(&kv, 3..6), expected, "{name}: {what}");
            // Saved again, the file keeps the run's order.
            kv.save_checkpoint(&again_path).expect("save");
            let again = store_of(&["b", "a"], 1.0);
            again.load_checkpoint(&again_path).expect("load");
            assert_eq!(train_two(&again, 6..8), train_two(&kv, 6..8), "{name}: {what}, saved again");
        }
    }
}

#[test]
fn every_tensor_of_a_checkpoint_lies_aligned_to_its_element() {
    // An f16 key of odd length before f32 and f64 ones, with Adam's f32 state: written in
    // key order, an f32 tensor would follow 6 bytes of f16.
    let dir = TempDir::new("aligned");
    let kv = KVStore::create("local").expect("store");
    kv.init("a", &NDArray::zeros_with(&[3], DType::F16, Context::default()).expect("f16")).expect("init");
    kv.init("b", &NDArray::zeros(&[5]).expect("f32")).expect("init");
    kv.init("c", &NDArray::zeros_with(&[7], DType::F64, Context::default()).expect("f64")).expect("init");
    kv.set_optimizer(Optimizer::builder("adam").build().expect("adam")).expect("optimizer");
    // A push makes each key's optimizer state.
    for (key, n, dtype) in [("a", 3, DType::F16), ("b", 5, DType::F32), ("c", 7, DType::F64)] {
        kv.push(key, &NDArray::full_with(&[n], 0.5, dtype, Context::default()).expect("grad"), 0).expect("push");
    }
    let path = dir.path("c.safetensors");
    kv.save_checkpoint(&path).expect("saved");
    let bytes = std::fs::read(&path).expect("the file");
    let (header, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("safetensors");
    let tensors = meta.tensors();
    assert!(tensors.len() >= 6, "{:?}", tensors.keys());
    for (name, info) in tensors {
        let at = 8 + header + info.data_offsets.0;
        assert_eq!(at % (info.dtype.bitsize() / 8), 0, "{name} ({:?}) at byte {at}", info.dtype);
    }
    // And it loads back.
    let back = KVStore::create("local").expect("store");
    back.load_checkpoint(&path).expect("loaded");
}
