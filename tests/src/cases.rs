//! The conformance cases of the reference (`mxnet-kvstore-semantics.md` §10), written
//! once as functions of a [`Backend`]: [`backend_tests!`](crate::backend_tests) makes a
//! test of each for every backend (its `cases` list names them all: a test of the
//! crate checks that it does).

use kvstore_core::{DType, ErrorKind, KVStore, NDArray, Result};

use crate::{Backend, assert_all, full, install_add_twice, install_logging_assign, pulled};

const SHAPE: [usize; 2] = [2, 3];

fn devices(b: &dyn Backend, n: u32, value: f64) -> Vec<NDArray> {
    (0..n).map(|i| full(&SHAPE, value, b.ctx(i))).collect()
}

/// Cases 1–4 build on one another, as in the Python tutorial: this runs 1–3 and
/// returns the store holding 4.
fn tutorial_store(b: &dyn Backend) -> KVStore {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    kv.push(3, &full(&SHAPE, 8.0, b.ctx(0)), 0).expect("push");
    kv.push(3, &devices(b, 4, 1.0), 0).expect("push from 4 devices");
    kv
}

/// Case 1: `init(3, ones*2)`, then `pull(3)` gives all 2.
pub fn case_01_init_then_pull(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    let a = NDArray::zeros_with(&SHAPE, DType::F32, b.ctx(0)).expect("alloc");
    kv.pull(3, &a, 0).expect("pull");
    assert_all(&a, 2.0);
}

/// Case 2: a push replaces the value (ASSIGN).
pub fn case_02_push_assigns(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    kv.push(3, &full(&SHAPE, 8.0, b.ctx(0)), 0).expect("push");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![8.0; 6]);
}

/// Case 3: values from four devices are summed; a pull broadcasts to four outs.
pub fn case_03_push_from_devices_sums_and_pull_broadcasts(b: &dyn Backend) {
    let kv = tutorial_store(b);
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![4.0; 6]);
    let outs = devices(b, 4, 0.0);
    kv.pull(3, &outs, 0).expect("pull into 4");
    outs.iter().for_each(|o| assert_all(o, 4.0));
}

/// Case 4: an updater installed later changes only later pushes, and sees key "3".
pub fn case_04_updater_merges_later_pushes(b: &dyn Backend) {
    let kv = tutorial_store(b);
    let log = install_add_twice(&kv);
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![4.0; 6]);
    kv.push(3, &full(&SHAPE, 1.0, b.ctx(0)), 0).expect("push");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![6.0; 6]);
    assert_eq!(*log.lock().expect("log"), vec![("3".to_string(), 0, 1.0)]);
}

/// Case 5: list push with the updater: one call per key in key order; then a nested
/// push from four devices per key.
pub fn case_05_list_push_with_updater(b: &dyn Backend) {
    let kv = tutorial_store(b);
    let log = install_add_twice(&kv);
    let keys = [5, 7, 9];
    kv.init(&keys, &devices(b, 3, 1.0)).expect("init list");
    kv.push(&keys, &devices(b, 3, 1.0), 0).expect("list push");
    for k in keys {
        assert_eq!(pulled(&kv, k, &SHAPE), vec![3.0; 6]);
    }
    let order: Vec<String> = log.lock().expect("log").iter().map(|c| c.0.clone()).collect();
    assert_eq!(order, ["5", "7", "9"]);
    let nested: Vec<Vec<NDArray>> = keys.iter().map(|_| devices(b, 4, 1.0)).collect();
    kv.push(&keys, &nested, 0).expect("nested push");
    let outs: Vec<Vec<NDArray>> = keys.iter().map(|_| devices(b, 4, 0.0)).collect();
    kv.pull(&keys, &outs, 0).expect("nested pull");
    outs.iter().flatten().for_each(|o| assert_all(o, 11.0));
    assert_eq!(log.lock().expect("log").len(), 6);
}

/// Case 6: the Clojure tutorial, string keys.
pub fn case_06_clojure_tutorial_string_keys(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&["3"], &[full(&SHAPE, 2.0, b.ctx(0))]).expect("init");
    assert_eq!(pulled(&kv, "3", &SHAPE), vec![2.0; 6]);
    kv.push(&["3"], &[full(&SHAPE, 8.0, b.ctx(0))], 0).expect("push");
    assert_eq!(pulled(&kv, "3", &SHAPE), vec![8.0; 6]);
    kv.push(&["3", "3", "3"], &devices(b, 3, 1.0), 0).expect("push repeated key");
    assert_eq!(pulled(&kv, "3", &SHAPE), vec![3.0; 6]);
    let outs = devices(b, 2, 1.0);
    kv.pull(&["3", "3"], &outs, 0).expect("pull into two");
    outs.iter().for_each(|o| assert_all(o, 3.0));
    let ks = ["5", "7", "9"];
    kv.init(&ks, &devices(b, 3, 1.0)).expect("init list");
    kv.push(&ks, &devices(b, 3, 1.0), 0).expect("push list");
    let outs = devices(b, 3, 0.0);
    kv.pull(&ks, &outs, 0).expect("pull list");
    outs.iter().for_each(|o| assert_all(o, 1.0));
}

/// Case 7: clojure-mxnet's `test-aggregate`, shape (4, 4).
pub fn case_07_aggregate_four_devices(b: &dyn Backend) {
    let shape = [4, 4];
    let kv = b.store("local");
    kv.init("a", &full(&shape, 0.0, b.ctx(0))).expect("init");
    let ones: Vec<NDArray> = (0..4).map(|i| full(&shape, 1.0, b.ctx(i))).collect();
    kv.push("a", &ones, 0).expect("push");
    assert_eq!(pulled(&kv, "a", &shape), vec![4.0; 16]);
    let ks = ["b", "c", "d"];
    kv.init(&ks, &[full(&shape, 0.0, b.ctx(0)), full(&shape, 0.0, b.ctx(0)), full(&shape, 0.0, b.ctx(0))])
        .expect("init list");
    let twos: Vec<Vec<NDArray>> = ks.iter().map(|_| (0..4).map(|i| full(&shape, 2.0, b.ctx(i))).collect()).collect();
    kv.push(&ks, &twos, 0).expect("push");
    for k in ks {
        assert_eq!(pulled(&kv, k, &shape), vec![8.0; 16]);
    }
}

/// Case 8: repeated keys in a list push are grouped and summed; a list pull with
/// repeats copies each key's value.
pub fn case_08_repeated_keys_group_and_sum(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&[5, 7], &devices(b, 2, 0.0)).expect("init");
    let vals = [full(&SHAPE, 1.0, b.ctx(0)), full(&SHAPE, 2.0, b.ctx(1)), full(&SHAPE, 10.0, b.ctx(2))];
    kv.push(&[5, 5, 7], &vals, 0).expect("push");
    let outs = devices(b, 3, 0.0);
    kv.pull(&[5, 7, 5], &outs, 0).expect("pull");
    let got: Vec<f64> = outs.iter().map(|o| o.to_f64_vec().expect("read")[0]).collect();
    assert_eq!(got, [3.0, 10.0, 3.0]);
}

/// Case 9: the updater runs once per distinct key with the sum, in key order.
pub fn case_09_updater_call_log(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&[1, 2], &devices(b, 2, 0.0)).expect("init");
    let log = install_logging_assign(&kv);
    let vals: Vec<NDArray> = (1..=5).map(|v| full(&SHAPE, v as f64, b.ctx(0))).collect();
    kv.push(&[2, 1, 2, 1, 1], &vals, 0).expect("push");
    assert_eq!(*log.lock().expect("log"), vec![("1".to_string(), 0, 11.0), ("2".to_string(), 1, 4.0)]);

    let kv = b.store("local");
    kv.init(&["b", "a"], &devices(b, 2, 0.0)).expect("init");
    let log = install_logging_assign(&kv);
    let vals: Vec<NDArray> = (1..=3).map(|v| full(&SHAPE, v as f64, b.ctx(0))).collect();
    kv.push(&["a", "b", "a"], &vals, 0).expect("push");
    assert_eq!(*log.lock().expect("log"), vec![("b".to_string(), 0, 2.0), ("a".to_string(), 1, 4.0)]);
}

/// Case 10: the index an updater receives is the key's number in first-init order
/// (what MXNet's Scala/Clojure int-only updater got for string keys).
pub fn case_10_updater_index_is_first_init_order(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(&["3", "5", "7"], &devices(b, 3, 0.0)).expect("init");
    kv.init("1", &full(&SHAPE, 0.0, b.ctx(0))).expect("init");
    let log = install_logging_assign(&kv);
    kv.push(&["7", "3", "1"], &devices(b, 3, 1.0), 0).expect("push");
    let indices: Vec<usize> = log.lock().expect("log").iter().map(|c| c.1).collect();
    assert_eq!(indices, [0, 2, 3]);
    assert_eq!(kv.key_index("7"), Some(2));
}

/// Case 11: the error classes of the reference, with the store unchanged after each.
pub fn case_11_errors(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 2.0, b.ctx(0))).expect("init");
    let kind = |r: Result<()>| r.expect_err("must fail").kind();
    assert_eq!(kind(kv.init(3, &full(&SHAPE, 1.0, b.ctx(0)))), ErrorKind::AlreadyInitialized);
    assert_eq!(kind(kv.init("3", &full(&SHAPE, 1.0, b.ctx(0)))), ErrorKind::AlreadyInitialized);
    let out = NDArray::zeros(&SHAPE).expect("alloc");
    assert_eq!(kind(kv.pull(100, &out, 0)), ErrorKind::KeyNotInitialized);
    assert_eq!(kind(kv.push(100, &out, 0)), ErrorKind::KeyNotInitialized);
    assert_eq!(kind(kv.pull("zz", &out, 0)), ErrorKind::KeyNotInitialized);
    let wrong = NDArray::zeros(&[4, 4]).expect("alloc");
    assert_eq!(kind(kv.pull(3, &wrong, 0)), ErrorKind::ShapeMismatch);
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![2.0; 6]);
}

/// Case 14: `pushpull` with no outs writes the result into the pushed arrays.
pub fn case_14_pushpull_in_place(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init("w", &full(&SHAPE, 0.0, b.ctx(0))).expect("init");
    let w = full(&SHAPE, 3.0, b.ctx(0));
    kv.pushpull_in_place("w", &w, 0).expect("pushpull");
    assert_all(&w, 3.0);
    let kv = b.store("local");
    kv.init(&[1, 2], &devices(b, 2, 0.0)).expect("init");
    let vals = vec![vec![full(&SHAPE, 1.0, b.ctx(0)), full(&SHAPE, 2.0, b.ctx(1))], vec![full(&SHAPE, 3.0, b.ctx(0))]];
    kv.pushpull_in_place(&[1, 2], &vals, 0).expect("pushpull nested");
    vals.iter().flatten().for_each(|v| assert_all(v, 3.0));
    let outs = devices(b, 2, 0.0);
    kv.pushpull(1, &devices(b, 2, 2.5), &outs, 0).expect("pushpull with outs");
    outs.iter().for_each(|o| assert_all(o, 5.0));
}

/// Case 15: `broadcast` is init then pull; a second broadcast of a key is an error.
pub fn case_15_broadcast(b: &dyn Backend) {
    let kv = b.store("local");
    let a = NDArray::zeros(&SHAPE).expect("alloc");
    kv.broadcast("b", &full(&SHAPE, 2.0, b.ctx(0)), &a, 0).expect("broadcast");
    assert_all(&a, 2.0);
    let e = kv.broadcast("b", &full(&SHAPE, 3.0, b.ctx(0)), &a, 0).expect_err("second broadcast");
    assert_eq!(e.kind(), ErrorKind::AlreadyInitialized);
    assert!(e.to_string().contains("duplicate init of key \"b\""), "{e}");
    assert_all(&a, 2.0);
    let xy = devices(b, 2, 0.0);
    kv.broadcast("c", &full(&SHAPE, 5.0, b.ctx(0)), &xy, 0).expect("broadcast to two");
    xy.iter().for_each(|o| assert_all(o, 5.0));
}

fn push_f16(b: &dyn Backend, kind: &str, values: &[f32]) -> f32 {
    let kv = b.store(kind);
    let z = NDArray::zeros_with(&[1], DType::F16, b.ctx(0)).expect("alloc");
    kv.init(0, &z).expect("init");
    let vals: Vec<NDArray> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| NDArray::full_with(&[1], v as f64, DType::F16, b.ctx(i as u32)).expect("alloc"))
        .collect();
    kv.push(0, &vals, 0).expect("push");
    kv.pull(0, &z, 0).expect("pull");
    z.to_vec::<f32>().expect("read")[0]
}

/// Case 16, with the deliberate difference: f16 sums accumulate in f32 and round
/// once, so every order of [1, 2048, 1] gives 2050 on every store kind (MXNet's
/// `local` gave 2048 for [1, 2048, 1] and [1, 1, 2048]). Overflow still gives inf.
pub fn case_16_f16_sums_accumulate_in_f32(b: &dyn Backend) {
    for kind in ["local", "device"] {
        assert_eq!(push_f16(b, kind, &[1.0, 2048.0, 1.0]), 2050.0);
        assert_eq!(push_f16(b, kind, &[2048.0, 1.0, 1.0]), 2050.0);
        assert_eq!(push_f16(b, kind, &[1.0, 1.0, 2048.0]), 2050.0);
        assert_eq!(push_f16(b, kind, &[60000.0, 60000.0]), f32::INFINITY);
    }
}

/// Case 17, with the deliberate difference: f32 sums run left to right on every
/// kind, so [4, 4, 1e8] gives 100000008 (MXNet's `device` result; `local` gave 1e8).
pub fn case_17_f32_sums_run_left_to_right(b: &dyn Backend) {
    for kind in ["local", "device"] {
        let kv = b.store(kind);
        kv.init(0, &full(&[1], 0.0, b.ctx(0))).expect("init");
        let vals = [full(&[1], 4.0, b.ctx(0)), full(&[1], 4.0, b.ctx(1)), full(&[1], 1e8, b.ctx(2))];
        kv.push(0, &vals, 0).expect("push");
        assert_eq!(pulled(&kv, 0, &[1]), vec![100000008.0]);
    }
}

/// Case 18, with the deliberate difference: push copies, so changing the pushed
/// array afterwards does not change the store (MXNet aliased a single pushed value).
pub fn case_18_push_copies(b: &dyn Backend) {
    let kv = b.store("local");
    kv.init(3, &full(&SHAPE, 0.0, b.ctx(0))).expect("init");
    let g = full(&SHAPE, 1.0, b.ctx(0));
    kv.push(3, &g, 0).expect("push");
    g.copy_from(&full(&SHAPE, 42.0, b.ctx(0))).expect("overwrite");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![1.0; 6]);
}

/// Case 22: metadata; unknown kinds are errors (MXNet made them local stores).
pub fn case_22_metadata(b: &dyn Backend) {
    let kv = b.store("local");
    assert_eq!((kv.kind(), kv.rank(), kv.num_workers()), (b.store_kind("local"), 0, 1));
    assert_eq!(b.store("LOCAL").kind(), "local");
    assert_eq!(b.store("device").kind(), "device");
    assert!(kv.barrier().is_ok());
    assert_eq!(kv.num_dead_node(4), 0);
    kv.set_barrier_before_exit(false);
    assert!(kv.send_command_to_servers(0, "").is_ok());
    assert!(kv.is_capable("OPTIMIZER").expect("known capability"));
    assert_eq!(kv.is_capable("teleport").expect_err("unknown capability").kind(), ErrorKind::InvalidArgument);
    assert_eq!(KVStore::create("horovod").expect_err("unknown").kind(), ErrorKind::UnknownStoreKind);
    assert_eq!(KVStore::create("dist_sync").expect_err("no mpi").kind(), ErrorKind::Unsupported);
    assert_eq!(KVStore::create("nccl").expect_err("no nccl").kind(), ErrorKind::Unsupported);
}
