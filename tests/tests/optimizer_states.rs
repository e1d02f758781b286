//! Optimizer-state files: `save_optimizer_states` then `load_optimizer_states` continue
//! training exactly where it was; a bad file (truncated, corrupted, another optimizer,
//! other keys or shapes) is a clear error and leaves the store's state as it was.

use std::path::PathBuf;

use kvstore_core::{ErrorKind, KVStore, LrScheduler, NDArray, Optimizer};
use kvstore_tests::TempDir;

fn sgd() -> Optimizer {
    Optimizer::builder("sgd")
        .param("learning_rate", 0.1)
        .param("momentum", 0.9)
        .param("wd", 0.01)
        .lr_scheduler(LrScheduler::factor(2, 0.5).expect("scheduler"))
        .build()
        .expect("sgd")
}

fn store(keys: &[(&str, &[usize])]) -> KVStore {
    let kv = KVStore::create("local").expect("create");
    for (k, shape) in keys {
        let n: usize = shape.iter().product();
        kv.init(*k, &NDArray::from_vec(shape, (0..n).map(|i| 1.0 + i as f32 * 0.25).collect()).expect("w"))
            .expect("init");
    }
    kv.set_optimizer(sgd()).expect("set_optimizer");
    kv
}

const KEYS: &[(&str, &[usize])] = &[("w0", &[2, 3]), ("b", &[4])];

fn grad(shape: &[usize], step: usize) -> NDArray {
    let n: usize = shape.iter().product();
    NDArray::from_vec(shape, (0..n).map(|i| ((i + step) % 5) as f32 * 0.5 - 1.0).collect()).expect("g")
}

fn train(kv: &KVStore, steps: std::ops::Range<usize>) {
    for s in steps {
        for (k, shape) in KEYS {
            kv.push(*k, &grad(shape, s), 0).expect("push");
        }
    }
}

fn weights(kv: &KVStore) -> Vec<Vec<f32>> {
    KEYS.iter()
        .map(|(k, shape)| {
            let out = NDArray::zeros(shape).expect("out");
            kv.pull(*k, &out, 0).expect("pull");
            out.to_vec::<f32>().expect("read")
        })
        .collect()
}

/// A state file's path in a folder that is removed with the returned guard.
fn temp(name: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(&format!("states-{name}"));
    let path = dir.path("states.safetensors");
    (dir, path)
}

#[test]
fn saved_states_continue_training_exactly_where_it_was() {
    let (_dir, path) = temp("roundtrip");
    let a = store(KEYS);
    train(&a, 0..3);
    a.save_optimizer_states(&path).expect("save");
    let at_save = weights(&a);
    let fresh = |load: bool| {
        let kv = KVStore::create("local").expect("create");
        for ((k, shape), w) in KEYS.iter().zip(&at_save) {
            kv.init(*k, &NDArray::from_vec(shape, w.clone()).expect("w")).expect("init");
        }
        kv.set_optimizer(sgd()).expect("set_optimizer");
        if load {
            kv.load_optimizer_states(&path).expect("load");
        }
        kv
    };
    let (b, c) = (fresh(true), fresh(false));
    train(&a, 3..6);
    train(&b, 3..6);
    train(&c, 3..6);
    // With the loaded states the new store follows the old one exactly ...
    assert_eq!(weights(&a), weights(&b));
    // ... and without them (momentum, counters, schedule) it does not.
    assert_ne!(weights(&a), weights(&c));
}

#[test]
fn the_file_is_safetensors_with_the_optimizer_in_its_metadata() {
    let (_dir, path) = temp("format");
    let kv = store(KEYS);
    train(&kv, 0..2);
    kv.save_optimizer_states(&path).expect("save");
    let bytes = std::fs::read(&path).expect("read");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).expect("utf-8 header");
    for needle in
        ["kvstore-optimizer-states", "\"optimizer\":\"sgd\"", "k0.momentum", "k1.momentum", "num_update", "w0"]
    {
        assert!(header.contains(needle), "{needle} missing from {header}");
    }
}

/// Runs `bad` (a failed load) on one store and nothing on its twin; both must then
/// train identically.
fn failed_load_changes_nothing(bad: impl Fn(&KVStore) -> kvstore_core::Result<()>, kind: ErrorKind) {
    let a = store(KEYS);
    let b = store(KEYS);
    train(&a, 0..2);
    train(&b, 0..2);
    let e = bad(&a).expect_err("the load must fail");
    assert_eq!(e.kind(), kind, "{e}");
    train(&a, 2..5);
    train(&b, 2..5);
    assert_eq!(weights(&a), weights(&b), "after {e}");
}

#[test]
fn truncated_corrupted_and_missing_files_are_io_errors_that_change_nothing() {
    let (_dir, path) = temp("bad");
    let src = store(KEYS);
    train(&src, 0..4);
    src.save_optimizer_states(&path).expect("save");
    let good = std::fs::read(&path).expect("read");
    let truncated = path.with_file_name("truncated.safetensors");
    std::fs::write(&truncated, &good[..good.len() - 7]).expect("write");
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(&truncated), ErrorKind::Io);
    let corrupted = path.with_file_name("corrupted.safetensors");
    let mut bytes = good.clone();
    bytes[12] ^= 0x5a;
    std::fs::write(&corrupted, &bytes).expect("write");
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(&corrupted), ErrorKind::Io);
    let garbage = path.with_file_name("garbage.safetensors");
    std::fs::write(&garbage, b"not a state file at all").expect("write");
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(&garbage), ErrorKind::Io);
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(path.with_file_name("absent")), ErrorKind::Io);
}

#[test]
fn files_of_other_keys_shapes_or_optimizers_are_clear_errors_that_change_nothing() {
    let (_dir, path) = temp("mismatch");
    let other = KVStore::create("local").expect("create");
    other.init("w0", &NDArray::zeros(&[2, 3]).expect("w")).expect("init");
    other.init("extra", &NDArray::zeros(&[4]).expect("w")).expect("init");
    other.set_optimizer(sgd()).expect("set");
    other.push("w0", &NDArray::ones(&[2, 3]).expect("g"), 0).expect("push");
    other.push("extra", &NDArray::ones(&[4]).expect("g"), 0).expect("push");
    other.save_optimizer_states(&path).expect("save");
    // "extra" is not a key of these stores.
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(&path), ErrorKind::KeyNotInitialized);
    let only_w0 = path.with_file_name("only_w0.safetensors");
    let w0 = KVStore::create("local").expect("create");
    w0.init("w0", &NDArray::zeros(&[3, 2]).expect("w")).expect("init");
    w0.set_optimizer(sgd()).expect("set");
    w0.push("w0", &NDArray::ones(&[3, 2]).expect("g"), 0).expect("push");
    w0.save_optimizer_states(&only_w0).expect("save");
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(&only_w0), ErrorKind::ShapeMismatch);
    // A file of plain SGD (no momentum state) into a momentum SGD store.
    let plain = path.with_file_name("plain.safetensors");
    let p = KVStore::create("local").expect("create");
    p.init("w0", &NDArray::zeros(&[2, 3]).expect("w")).expect("init");
    p.set_optimizer(Optimizer::builder("sgd").build().expect("sgd")).expect("set");
    p.push("w0", &NDArray::ones(&[2, 3]).expect("g"), 0).expect("push");
    p.save_optimizer_states(&plain).expect("save");
    failed_load_changes_nothing(|kv| kv.load_optimizer_states(&plain), ErrorKind::InvalidArgument);
}

#[test]
fn saving_or_loading_without_an_optimizer_is_an_error() {
    let kv = KVStore::create("local").expect("create");
    kv.init("w", &NDArray::zeros(&[2]).expect("w")).expect("init");
    let (_dir, path) = temp("none");
    assert_eq!(kv.save_optimizer_states(&path).expect_err("no optimizer").kind(), ErrorKind::InvalidArgument);
    assert_eq!(kv.load_optimizer_states(&path).expect_err("no optimizer").kind(), ErrorKind::InvalidArgument);
    assert!(!path.exists(), "a failed save writes no file");
}

#[test]
fn loading_never_installs_a_schedule_the_optimizer_does_not_have() {
    let (_dir, path) = temp("schedule");
    let scheduled = store(KEYS); // factor(2, 0.5): after 3 updates its rate is 0.05
    train(&scheduled, 0..3);
    scheduled.save_optimizer_states(&path).expect("save");
    // Two schedule-free stores (rate 0.1, no weight decay) load the same states; pushing
    // g = 1 to one and g = 2 to the other, their weights differ by exactly rate * 1.
    let plain = || {
        let kv = KVStore::create("local").expect("create");
        for (k, shape) in KEYS {
            kv.init(*k, &NDArray::zeros(shape).expect("w")).expect("init");
        }
        let sgd = Optimizer::builder("sgd").param("learning_rate", 0.1).param("momentum", 0.9).build().expect("sgd");
        kv.set_optimizer(sgd).expect("set");
        kv.load_optimizer_states(&path).expect("load");
        kv
    };
    let (one, two) = (plain(), plain());
    one.push("b", &NDArray::full(&[4], 1.0).expect("g"), 0).expect("push");
    two.push("b", &NDArray::full(&[4], 2.0).expect("g"), 0).expect("push");
    let pull = |kv: &KVStore| {
        let out = NDArray::zeros(&[4]).expect("out");
        kv.pull("b", &out, 0).expect("pull");
        out.to_vec::<f32>().expect("read")
    };
    for (a, b) in pull(&one).iter().zip(pull(&two)) {
        assert!((a - b - 0.1).abs() < 1e-6, "the rate after the load is {}, not 0.1", a - b);
    }
}
