//! Row-sparse keys: `tests/golden/mxnet_row_sparse.json` (recorded by
//! `tests/golden/generate_row_sparse.py` from MXNet 1.9.1) replayed on a `local`
//! store, every pulled value compared bit for bit; then the rules MXNet's records do
//! not show (errors, ordering with non-blocking calls, custom updaters).

use kvstore_core::{DType, ErrorKind, KVStore, NDArray, Optimizer, RowSparse, StorageType};
use serde_json::Value;

const GOLDEN: &str = include_str!("../golden/mxnet_row_sparse.json");

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().expect("numbers").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array().expect("ints").iter().map(|x| x.as_i64().expect("int")).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn rsp(rows: &[i64], data: Vec<f32>, shape: &[usize]) -> RowSparse {
    let d = NDArray::from_vec(&[rows.len(), shape[1]], data).expect("data");
    RowSparse::new(d, rows.to_vec(), shape).expect("row-sparse value")
}

fn optimizer(spec: &Value) -> Optimizer {
    let mut b = Optimizer::builder(spec[0].as_str().expect("name"));
    for (k, v) in spec[1].as_object().expect("params") {
        let v = v.as_f64().or_else(|| v.as_bool().map(|b| if b { 1.0 } else { 0.0 })).expect("param");
        b = b.param(k, v);
    }
    b.build().expect("optimizer")
}

#[test]
fn every_row_sparse_case_recorded_from_mxnet_replays_bit_for_bit() {
    let golden: Value = serde_json::from_str(GOLDEN).expect("golden JSON");
    assert_eq!(golden["mxnet_version"], "1.9.1");
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 12);
    let mut failed = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let replayed = std::panic::catch_unwind(|| replay(case));
        if replayed.is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "cases that do not replay: {failed:?}");
}

/// Replays one recorded case, asserting every pulled value.
fn replay(case: &Value) {
    {
        let name = case["name"].as_str().expect("name");
        assert!(case.get("crashed").is_none(), "{name}: MXNet crashed while recording: replay its pushes by hand");
        let shape: Vec<usize> =
            case["shape"].as_array().expect("shape").iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let kv = KVStore::create("local").expect("store");
        let init = NDArray::from_vec(&shape, f32s(&case["init"])).expect("init");
        kv.init_row_sparse("w", &RowSparse::from_dense(&init).expect("from_dense")).expect("init");
        assert_eq!(kv.stype("w").expect("stype"), StorageType::RowSparse);
        if !case["optimizer"].is_null() {
            kv.set_optimizer(optimizer(&case["optimizer"])).expect("set_optimizer");
        }
        for (s, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let values: Vec<RowSparse> = step["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| rsp(&ints(&v["rows"]), f32s(&v["data"]), &shape))
                .collect();
            kv.push_row_sparse("w", &values, 0).expect("push_row_sparse");
            let dense = kv.pull_new("w", 0).expect("pull").to_vec::<f32>().expect("values");
            assert_eq!(
                bits(&dense),
                bits(&f32s(&step["dense"])),
                "{name}, step {s}: dense pull\n{dense:?}\n{:?}",
                f32s(&step["dense"])
            );
            let got = kv.row_sparse_pull("w", &ints(&step["row_ids"]), 0).expect("row_sparse_pull");
            assert_eq!(got.indices(), ints(&step["pulled_indices"]).as_slice(), "{name}, step {s}");
            let data = got.data().to_vec::<f32>().expect("rows");
            assert_eq!(bits(&data), bits(&f32s(&step["pulled_data"])), "{name}, step {s}: row_sparse_pull");
        }
    }
}

#[test]
fn mxnet_s_errors_are_the_store_s() {
    let golden: Value = serde_json::from_str(GOLDEN).expect("golden JSON");
    let kv = KVStore::create("local").unwrap();
    kv.init("dense", &NDArray::ones(&[4, 2]).unwrap()).unwrap();
    let errors = golden["errors"].as_array().expect("errors");
    assert!(errors[0]["error"].as_str().unwrap().contains("PullRowSparse expects row_sparse src NDArray"));
    let e = kv.row_sparse_pull("dense", &[0], 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("not row-sparse"), "{e}");
}

#[test]
fn bad_row_sparse_calls_are_clear_errors_and_change_nothing() {
    let kv = KVStore::create("local").unwrap();
    kv.init_row_sparse("w", &RowSparse::from_dense(&NDArray::ones(&[4, 2]).unwrap()).unwrap()).unwrap();
    let before = kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap();
    let wide = RowSparse::new(NDArray::ones(&[1, 3]).unwrap(), vec![0], &[4, 3]).unwrap();
    assert_eq!(kv.push_row_sparse("w", &[wide], 0).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    let f64s = RowSparse::new(NDArray::zeros_with(&[1, 2], DType::F64, Default::default()).unwrap(), vec![0], &[4, 2])
        .unwrap();
    let ok = rsp(&[1], vec![5.0, 5.0], &[4, 2]);
    // One bad value of several: the whole push is refused.
    assert_eq!(kv.push_row_sparse("w", &[ok.clone(), f64s], 0).unwrap_err().kind(), ErrorKind::DTypeMismatch);
    assert_eq!(kv.push_row_sparse("w", &[], 0).unwrap_err().kind(), ErrorKind::LengthMismatch);
    assert_eq!(
        kv.push_row_sparse("nope", std::slice::from_ref(&ok), 0).unwrap_err().kind(),
        ErrorKind::KeyNotInitialized
    );
    assert_eq!(kv.row_sparse_pull("nope", &[0], 0).unwrap_err().kind(), ErrorKind::KeyNotInitialized);
    let e = kv.row_sparse_pull("w", &[4], 0).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    let e = kv.row_sparse_pull("w", &[-1], 0).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), before, "no failed call changed the key");
    // A custom updater's error leaves the key as it was too.
    kv.set_updater(|_: &kvstore_core::Key, _: usize, _: &NDArray, stored: &NDArray| {
        stored.add_assign(100.0)?;
        Err(kvstore_core::Error::invalid_argument("refused"))
    })
    .unwrap();
    assert!(kv.push_row_sparse("w", &[ok], 0).is_err());
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), before);
}

#[test]
fn empty_row_ids_and_empty_values_give_empty_and_zero_results() {
    let kv = KVStore::create("local").unwrap();
    kv.init_row_sparse("w", &RowSparse::from_dense(&NDArray::ones(&[3, 2]).unwrap()).unwrap()).unwrap();
    let got = kv.row_sparse_pull("w", &[], 0).unwrap();
    assert_eq!((got.indices().len(), got.data().shape()), (0, &[0, 2][..]));
    // No rows pushed: with no updater the value becomes all zeros (assign).
    kv.push_row_sparse("w", &[RowSparse::zeros(&[3, 2], DType::F32).unwrap()], 0).unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
    // With a lazy optimizer nothing changes.
    kv.set_optimizer(Optimizer::builder("sgd").param("wd", 0.5).build().unwrap()).unwrap();
    kv.push_row_sparse("w", &[rsp(&[0], vec![1.0, 1.0], &[3, 2])], 0).unwrap();
    let after = kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap();
    kv.push_row_sparse("w", &[RowSparse::zeros(&[3, 2], DType::F32).unwrap()], 0).unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), after);
}

#[test]
fn a_row_sparse_push_onto_a_dense_key_makes_it_row_sparse_as_in_mxnet() {
    let kv = KVStore::create("local").unwrap();
    kv.init("d", &NDArray::ones(&[4, 2]).unwrap()).unwrap();
    assert_eq!(kv.stype("d").unwrap(), StorageType::Default);
    kv.push_row_sparse("d", &[rsp(&[0], vec![1.0, 1.0], &[4, 2])], 0).unwrap();
    assert_eq!(kv.stype("d").unwrap(), StorageType::RowSparse);
    let got = kv.row_sparse_pull("d", &[0], 0).unwrap();
    assert_eq!(got.data().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    assert_eq!(kv.pull_new("d", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn a_custom_updater_gets_the_sum_as_a_dense_gradient() {
    let kv = KVStore::create("local").unwrap();
    kv.init_row_sparse("w", &RowSparse::from_dense(&NDArray::ones(&[3, 2]).unwrap()).unwrap()).unwrap();
    kv.set_updater(|_: &kvstore_core::Key, _: usize, recv: &NDArray, stored: &NDArray| {
        stored.add_assign(&recv.mul(2.0)?)
    })
    .unwrap();
    kv.push_row_sparse("w", &[rsp(&[1], vec![1.0, 2.0], &[3, 2]), rsp(&[1, 2], vec![1.0, 1.0, 3.0, 3.0], &[3, 2])], 0)
        .unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0, 5.0, 7.0, 7.0, 7.0]);
}

#[test]
fn row_sparse_calls_come_after_the_non_blocking_calls_made_before_them() {
    let kv = KVStore::create("local").unwrap();
    kv.init_row_sparse("w", &RowSparse::from_dense(&NDArray::ones(&[64, 16]).unwrap()).unwrap()).unwrap();
    let dense = NDArray::full(&[64, 16], 3.0).unwrap();
    for _ in 0..50 {
        let pending = kv.push_async("w", &dense, 0);
        // Queued behind the dense push: it sees it.
        kv.push_row_sparse("w", &[rsp(&[5], vec![7.0; 16], &[64, 16])], 0).unwrap();
        pending.wait().unwrap();
        let got = kv.row_sparse_pull("w", &[5, 6], 0).unwrap().data().to_vec::<f32>().unwrap();
        assert_eq!(got, [vec![7.0; 16], vec![0.0; 16]].concat());
    }
}

#[test]
fn a_row_sparse_push_of_several_keys_updates_them_in_index_order_as_a_dense_push() {
    // Its plan's order, the order of locking and of updates, whatever the call's: a
    // custom updater is called for the keys in the order they were initialised.
    let kv = KVStore::create("local").unwrap();
    let zeros = |rows| RowSparse::zeros(&[rows, 2], DType::F32).unwrap();
    kv.init_row_sparse_many(&["a".into(), "b".into(), "c".into()], &[zeros(3), zeros(2), zeros(2)]).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    kv.set_updater(move |key: &kvstore_core::Key, _: usize, recv: &NDArray, stored: &NDArray| {
        log.lock().unwrap().push(key.to_string());
        stored.add_assign(recv)
    })
    .unwrap();
    let one = |r: i64, rows: usize| rsp(&[r], vec![1.0, 1.0], &[rows, 2]);
    let pushes = [("c".into(), vec![one(0, 2)]), ("a".into(), vec![one(2, 3)]), ("b".into(), vec![one(1, 2)])];
    kv.push_row_sparse_many(&pushes, 0).unwrap();
    assert_eq!(*seen.lock().unwrap(), ["a", "b", "c"]);
    let dense: Vec<NDArray> = ["a", "b", "c"].iter().map(|k| kv.pull_new(*k, 0).unwrap()).collect();
    let pushed = [(0, 3, 2), (1, 2, 1), (2, 2, 0)];
    for (k, rows, row) in pushed {
        let mut want = vec![0.0f32; rows * 2];
        want[row * 2..row * 2 + 2].copy_from_slice(&[1.0, 1.0]);
        assert_eq!(dense[k].to_vec::<f32>().unwrap(), want, "key {k}");
    }
}

#[test]
fn row_sparse_pushes_under_dist_sync_sum_every_workers_rows_alike() {
    for w in [1, 2, 3, 4] {
        let bits = kvstore_tests::run_workers(w, |rank, kv| {
            kvstore_tests::dist_cases::row_sparse_pushes_sum_every_workers_rows(rank, &kv)
        });
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers: the workers' values differ");
    }
}

#[test]
fn several_keys_are_initialised_and_pushed_in_one_call_all_or_nothing() {
    let kv = KVStore::create("local").unwrap();
    let (a, b) = (RowSparse::zeros(&[3, 2], DType::F32).unwrap(), RowSparse::zeros(&[2, 2], DType::F32).unwrap());
    kv.init_row_sparse_many(&["a".into(), "b".into()], &[a.clone(), b.clone()]).unwrap();
    assert_eq!(kv.stype("b").unwrap(), StorageType::RowSparse);
    // A key already there, or counts that differ: no key is made.
    let e = kv.init_row_sparse_many(&["c".into(), "a".into()], &[a.clone(), a.clone()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyInitialized);
    assert_eq!(kv.init_row_sparse_many(&["c".into()], &[]).unwrap_err().kind(), ErrorKind::LengthMismatch);
    assert!(kv.key_index("c").is_none(), "a failed init made no key");
    // A key given twice has its values summed, as a dense push's repeated keys.
    let one = |r: i64, v: f32, rows: usize| rsp(&[r], vec![v, v], &[rows, 2]);
    kv.push_row_sparse_many(
        &[
            ("a".into(), vec![one(0, 1.0, 3)]),
            ("b".into(), vec![one(1, 2.0, 2)]),
            ("a".into(), vec![one(2, 3.0, 3), one(0, 4.0, 3)]),
        ],
        0,
    )
    .unwrap();
    assert_eq!(kv.pull_new("a", 0).unwrap().to_vec::<f32>().unwrap(), vec![5.0, 5.0, 0.0, 0.0, 3.0, 3.0]);
    assert_eq!(kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.0, 2.0, 2.0]);
    // Every key is checked before any changes: a bad shape, a missing key, no values.
    let before =
        (kv.pull_new("a", 0).unwrap().to_vec::<f32>().unwrap(), kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap());
    for (bad, kind) in [
        (("b".into(), vec![one(0, 1.0, 3)]), ErrorKind::ShapeMismatch),
        (("nope".into(), vec![one(0, 1.0, 2)]), ErrorKind::KeyNotInitialized),
        (("b".into(), vec![]), ErrorKind::LengthMismatch),
    ] {
        let e = kv.push_row_sparse_many(&[("a".into(), vec![one(1, 9.0, 3)]), bad], 0).unwrap_err();
        assert_eq!(e.kind(), kind);
        let now = (
            kv.pull_new("a", 0).unwrap().to_vec::<f32>().unwrap(),
            kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap(),
        );
        assert_eq!(now, before, "a refused push changed no key");
    }
}

#[test]
fn checkpoints_and_optimizer_state_files_keep_row_sparse_keys() {
    let dir = kvstore_tests::TempDir::new("rsp-ckpt");
    let adam = || Optimizer::builder("adam").param("learning_rate", 0.1).param("wd", 0.01).build().unwrap();
    let init =
        RowSparse::from_dense(&NDArray::from_vec(&[4, 2], (1..=8).map(|x| x as f32).collect()).unwrap()).unwrap();
    let a = KVStore::create("local").unwrap();
    a.init_row_sparse("emb", &init).unwrap();
    a.init("dense", &NDArray::ones(&[2]).unwrap()).unwrap();
    a.set_optimizer(adam()).unwrap();
    let g1 = rsp(&[1, 3], vec![0.5, -0.25, 1.0, 2.0], &[4, 2]);
    let g2 = rsp(&[0, 1], vec![-1.0, 0.75, 0.125, 3.0], &[4, 2]);
    a.push_row_sparse("emb", std::slice::from_ref(&g1), 0).unwrap();
    let (ckpt, states) = (dir.path("a.ckpt"), dir.path("a.states"));
    a.save_checkpoint(&ckpt).unwrap();
    a.save_optimizer_states(&states).unwrap();
    // A store resumed from the checkpoint: the key is row-sparse, and the next lazy
    // update is the same, bit for bit.
    let b = KVStore::create("local").unwrap();
    b.load_checkpoint(&ckpt).unwrap();
    assert_eq!(b.stype("emb").unwrap(), StorageType::RowSparse);
    assert_eq!(b.stype("dense").unwrap(), StorageType::Default);
    // A store given the same value and the optimizer state file: the same too.
    let c = KVStore::create("local").unwrap();
    c.init_row_sparse("emb", &RowSparse::from_dense(&a.pull_new("emb", 0).unwrap()).unwrap()).unwrap();
    c.init("dense", &NDArray::ones(&[2]).unwrap()).unwrap();
    c.set_optimizer(adam()).unwrap();
    c.load_optimizer_states(&states).unwrap();
    for kv in [&a, &b, &c] {
        kv.push_row_sparse("emb", std::slice::from_ref(&g2), 0).unwrap();
    }
    let want = bits(&a.pull_new("emb", 0).unwrap().to_vec::<f32>().unwrap());
    for (name, kv) in [("checkpoint", &b), ("optimizer states", &c)] {
        assert_eq!(bits(&kv.pull_new("emb", 0).unwrap().to_vec::<f32>().unwrap()), want, "{name}");
        let rows = kv.row_sparse_pull("emb", &[3, 1], 0).unwrap();
        assert_eq!(rows.indices(), &[1, 3], "{name}");
    }
    // Row 2 was never pushed: a lazy update left it (and its state) alone.
    assert_eq!(a.pull_new("emb", 0).unwrap().to_vec::<f32>().unwrap()[4..6], [5.0, 6.0]);
}

#[test]
fn row_sparse_pull_sorts_few_and_many_ids_alike() {
    // Few ids for many rows (sorted), a batch (radix-sorted), many ids (marked in a
    // bitmap, and copied over the pool from 4096 rows on): the same rows in order,
    // each row its own values.
    let kv = KVStore::create("local").unwrap();
    let rows = 20_000usize;
    let table = NDArray::from_vec(&[rows, 2], (0..rows * 2).map(|i| i as f32).collect()).unwrap();
    kv.init_row_sparse("t", &RowSparse::from_dense(&table.add(1.0).unwrap()).unwrap()).unwrap();
    let want =
        |ids: &[i64]| -> Vec<f32> { ids.iter().flat_map(|&r| [2.0 * r as f32 + 1.0, 2.0 * r as f32 + 2.0]).collect() };
    let few = kv.row_sparse_pull("t", &[15_000, 3, 3, 7], 0).unwrap();
    assert_eq!(few.indices(), &[3, 7, 15_000]);
    assert_eq!(few.data().to_vec::<f32>().unwrap(), want(&[3, 7, 15_000]));
    let many: Vec<i64> = (0..rows as i64).rev().step_by(3).chain([0, 1, 0]).collect();
    let mut sorted = many.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert!(sorted.len() > 4096);
    let got = kv.row_sparse_pull("t", &many, 0).unwrap();
    assert_eq!(got.indices(), sorted.as_slice());
    assert_eq!(got.data().to_vec::<f32>().unwrap(), want(&sorted));
    let e = kv.row_sparse_pull("t", &[5, rows as i64], 0).unwrap_err();
    assert!(e.to_string().contains(&format!("row {rows} is out of range for {rows} rows")), "{e}");
    // The first bad id in the caller's order is named, whether it fits in 32 bits, is
    // past them, or is negative.
    let r = rows as i64;
    for (ids, bad) in [
        (vec![r + 7, 3, r + 1], r + 7),
        (vec![2, 1 << 33, r], 1 << 33),
        (vec![2, -3, 1 << 40], -3),
        (vec![i64::MAX, i64::MIN], i64::MAX),
    ] {
        let e = kv.row_sparse_pull("t", &ids, 0).unwrap_err();
        assert!(e.to_string().contains(&format!("row {bad} is out of range for {rows} rows")), "{ids:?}: {e}");
    }
    // Ids already strictly increasing are taken as they are.
    let increasing: Vec<i64> = (0..r).step_by(2).collect();
    let got = kv.row_sparse_pull("t", &increasing, 0).unwrap();
    assert_eq!(got.indices(), increasing.as_slice());
    assert_eq!(got.data().to_vec::<f32>().unwrap(), want(&increasing));
    // A batch's ids, one in 16 rows or fewer (radix-sorted): shuffled, repeated, and
    // reaching both ends of the table.
    let mut state = 12345u64;
    let mut batch: Vec<i64> = (0..1200)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as i64 % rows as i64
        })
        .chain([0, rows as i64 - 1, 17, 17])
        .collect();
    batch.swap(0, 1203);
    let mut sorted = batch.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert!(batch.len() >= 512 && batch.len() <= rows / 16);
    let got = kv.row_sparse_pull("t", &batch, 0).unwrap();
    assert_eq!(got.indices(), sorted.as_slice());
    assert_eq!(got.data().to_vec::<f32>().unwrap(), want(&sorted));
}

/// `row_sparse_pull` of a table whose rows are `width` elements of `T`, the element at
/// flat index `i` being `value(i)`: a few ids (copied on the caller's thread) and many
/// (4096 or more: over the pool), each result row compared with its table row.
fn pull_rows_of<T: kvstore_core::Element>(width: usize, value: impl Fn(usize) -> T) {
    let rows = 5000usize;
    let kv = KVStore::create("local").unwrap();
    let table = NDArray::from_vec(&[rows, width], (0..rows * width).map(&value).collect()).unwrap();
    kv.init_row_sparse("t", &RowSparse::from_dense(&table).unwrap()).unwrap();
    let few = [4999, 3, 0, 3, 17];
    let many: Vec<i64> = (0..rows as i64).rev().chain([7, 7]).collect();
    for ids in [&few[..], &many[..]] {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let got = kv.row_sparse_pull("t", ids, 0).unwrap();
        assert_eq!(got.indices(), sorted.as_slice(), "{} x {width}", T::DTYPE);
        assert_eq!(got.data().shape(), &[sorted.len(), width], "{} x {width}", T::DTYPE);
        let value = &value;
        let want: Vec<T> =
            sorted.iter().flat_map(|&r| (0..width).map(move |j| value(r as usize * width + j))).collect();
        assert!(got.data().to_vec::<T>().unwrap() == want, "{} x {width}: wrong rows", T::DTYPE);
    }
}

#[test]
fn row_sparse_pull_gives_each_row_for_every_row_size_and_dtype() {
    // Rows of 64 B, 128 B, ... 4 KiB are moved whole into new memory; other sizes are
    // copied into a zeroed buffer: both give every row its own elements.
    for width in [16, 32, 64, 128, 256, 512, 1024] {
        pull_rows_of(width, |i| i as f32);
    }
    for width in [1, 3, 100, 2048] {
        pull_rows_of(width, |i| i as f32);
    }
    for width in [8, 512] {
        pull_rows_of(width, |i| i as f64 * 0.5);
    }
    for width in [32, 33] {
        pull_rows_of(width, |i| kvstore_core::f16::from_f32((i % 2000) as f32));
    }
    for width in [64, 4096, 8192, 65] {
        pull_rows_of(width, |i| (i % 251) as u8);
    }
}

/// f16 and bf16 weights are updated lazily too, as MXNet does (its SGD gives rows 0 and
/// 3 of this case untouched, and 0.89013671875 in row 1): only the pushed rows and their
/// states change, each row computed in f32 and rounded once, as the dense update does
/// the whole weight. Under `multi_precision` MXNet falls back to the dense update, and so
/// does the store (weight decay reaches every row).
#[test]
fn f16_and_bf16_weights_are_updated_lazily_unless_multi_precision() {
    let shape = [4, 2];
    let lazy_sgd = || Optimizer::builder("sgd").param("learning_rate", 0.1).param("momentum", 0.9).param("wd", 0.1);
    let one_row = |row: i64, dtype: DType| {
        let d = NDArray::from_vec(&[1, 2], vec![1.0f32; 2]).and_then(|a| a.as_type(dtype)).expect("row");
        RowSparse::new(d, vec![row], &shape).expect("row-sparse value")
    };
    for dtype in [DType::F16, DType::BF16] {
        for (name, b) in [("sgd", lazy_sgd()), ("adam", Optimizer::builder("adam").param("learning_rate", 0.1))] {
            let kv = KVStore::create("local").expect("store");
            let ones = NDArray::from_vec(&shape, vec![1.0f32; 8]).and_then(|a| a.as_type(dtype)).expect("ones");
            kv.init_row_sparse("w", &RowSparse::from_dense(&ones).expect("rsp")).expect("init");
            kv.set_optimizer(b.build().expect("optimizer")).expect("set_optimizer");
            kv.push_row_sparse("w", &[one_row(1, dtype)], 0).expect("push");
            let after_one = kv.pull_new("w", 0).expect("pull").to_vec::<f32>().expect("read");
            // The same first step on an f32 weight, rounded to the dtype once.
            let f32_kv = KVStore::create("local").expect("store");
            f32_kv
                .init_row_sparse("w", &RowSparse::from_dense(&ones.as_type(DType::F32).expect("f32")).expect("rsp"))
                .expect("init");
            let b = if name == "sgd" { lazy_sgd() } else { Optimizer::builder("adam").param("learning_rate", 0.1) };
            f32_kv.set_optimizer(b.build().expect("optimizer")).expect("set_optimizer");
            f32_kv.push_row_sparse("w", &[one_row(1, DType::F32)], 0).expect("push");
            let want =
                f32_kv.pull_new("w", 0).expect("pull").as_type(dtype).and_then(|a| a.to_vec::<f32>()).expect("read");
            assert_eq!(after_one, want, "{dtype} {name}: one lazy step");
            kv.push_row_sparse("w", &[one_row(2, dtype)], 0).expect("push");
            let after_two = kv.pull_new("w", 0).expect("pull").to_vec::<f32>().expect("read");
            assert_eq!(
                (&after_two[..2], &after_two[6..]),
                (&[1.0f32; 2][..], &[1.0f32; 2][..]),
                "{dtype} {name}: rows 0 and 3"
            );
            assert_eq!(after_two[2..4], after_one[2..4], "{dtype} {name}: row 1 is not pushed again");
            assert!(after_two[4] < 1.0, "{dtype} {name}: row 2 is updated");
        }
        // multi_precision: dense, as MXNet's fallback (row 0 decays with wd).
        let kv = KVStore::create("local").expect("store");
        let ones = NDArray::from_vec(&shape, vec![1.0f32; 8]).and_then(|a| a.as_type(dtype)).expect("ones");
        kv.init_row_sparse("w", &RowSparse::from_dense(&ones).expect("rsp")).expect("init");
        kv.set_optimizer(lazy_sgd().param("multi_precision", 1.0).build().expect("sgd")).expect("set_optimizer");
        kv.push_row_sparse("w", &[one_row(1, dtype)], 0).expect("push");
        let got = kv.pull_new("w", 0).expect("pull").to_vec::<f32>().expect("read");
        assert!(got[0] < 1.0, "{dtype}: multi_precision updates every row, as MXNet's dense fallback");
    }
    // MXNet 1.9.1's numbers for the SGD case (f16, lr 0.1, momentum 0.9, wd 0.1).
    let kv = KVStore::create("local").expect("store");
    let ones = NDArray::from_vec(&shape, vec![1.0f32; 8]).and_then(|a| a.as_type(DType::F16)).expect("ones");
    kv.init_row_sparse("w", &RowSparse::from_dense(&ones).expect("rsp")).expect("init");
    kv.set_optimizer(lazy_sgd().build().expect("sgd")).expect("set_optimizer");
    kv.push_row_sparse("w", &[one_row(1, DType::F16)], 0).expect("push");
    kv.push_row_sparse("w", &[one_row(2, DType::F16)], 0).expect("push");
    let got = kv.pull_new("w", 0).expect("pull").to_vec::<f32>().expect("read");
    assert_eq!(got, vec![1.0, 1.0, 0.890_136_7, 0.890_136_7, 0.890_136_7, 0.890_136_7, 1.0, 1.0]);
}

/// The optimizers that update row-sparse gradients lazily, each with its states.
const LAZY: [&str; 4] = ["adam", "sgd", "adagrad", "ftrl"];

fn lazy_optimizer(name: &str) -> Optimizer {
    let b = Optimizer::builder(name).param("learning_rate", 0.1).param("wd", 0.01);
    match name {
        "sgd" => b.param("momentum", 0.9),
        _ => b,
    }
    .build()
    .unwrap()
}

/// A row-sparse key ("emb", 6 rows) and a dense one, with `opt`.
fn embedding_store(kv: &KVStore, opt: Optimizer) {
    let table = NDArray::from_vec(&[6, 2], (1..=12).map(|x| x as f32 / 4.0).collect()).unwrap();
    kv.init_row_sparse("emb", &RowSparse::from_dense(&table).unwrap()).unwrap();
    kv.init("dense", &NDArray::ones(&[3]).unwrap()).unwrap();
    kv.set_optimizer(opt).unwrap();
}

/// One step: `copies` values of each gradient per worker (the same sums on one worker
/// with two copies as on two workers with one each).
fn embedding_step(kv: &KVStore, step: usize, copies: usize) {
    let g = match step {
        0 => rsp(&[1, 4], vec![0.5, -0.25, 1.0, 2.0], &[6, 2]),
        _ => rsp(&[0, 1, 5], vec![-1.0, 0.75, 0.125, 3.0, 0.25, -0.5], &[6, 2]),
    };
    kv.push_row_sparse("emb", &vec![g; copies], 0).unwrap();
    let d = NDArray::from_vec(&[3], vec![0.5f32, -0.25, step as f32]).unwrap();
    kv.push("dense", &vec![d; copies][..], 0).unwrap();
}

/// What a store resumed from a checkpoint of the first step holds after the second.
#[derive(Debug, PartialEq)]
struct Resumed {
    /// The bits of "emb" and of "dense".
    emb: Vec<u32>,
    dense: Vec<u32>,
    /// Their storage types, as loaded.
    stypes: Vec<StorageType>,
    /// What `row_sparse_pull` of rows 5, 2 and 5 gives: its rows and their values.
    rows: Vec<i64>,
    data: Vec<f32>,
}

fn resumed_step(kv: &KVStore, copies: usize) -> Resumed {
    let stypes = vec![kv.stype("emb").unwrap(), kv.stype("dense").unwrap()];
    embedding_step(kv, 1, copies);
    let rows = kv.row_sparse_pull("emb", &[5, 2, 5], 0).unwrap();
    Resumed {
        emb: bits(&kv.pull_new("emb", 0).unwrap().to_vec::<f32>().unwrap()),
        dense: bits(&kv.pull_new("dense", 0).unwrap().to_vec::<f32>().unwrap()),
        stypes,
        rows: rows.indices().to_vec(),
        data: rows.data().to_vec::<f32>().unwrap(),
    }
}

/// Checkpoints of row-sparse keys saved by `local`, `device` and 2 `dist_sync` workers
/// load into `local`, `device`, 2 `dist_sync` workers and a store that holds the key
/// dense: every lazy optimizer's states come back, the key is row-sparse again
/// (`stype`, `row_sparse_pull`), and the next lazy step gives the bits of a run that
/// never stopped (row 2, never pushed, unchanged with its state).
#[test]
fn row_sparse_checkpoints_resume_exactly_in_every_store_kind() {
    use kvstore_tests::run_workers;
    let dir = kvstore_tests::TempDir::new("rsp-ckpt-kinds");
    for name in LAZY {
        let reference = KVStore::create("local").unwrap();
        embedding_store(&reference, lazy_optimizer(name));
        embedding_step(&reference, 0, 2);
        let want = resumed_step(&reference, 2);
        assert_eq!(want.stypes, [StorageType::RowSparse, StorageType::Default]);
        // Row 2 was never pushed: its value is its first.
        assert_eq!((&want.rows[..], &want.data[..2]), (&[2, 5][..], &[1.25f32, 1.5][..]), "{name}");
        let mut files = Vec::new();
        for kind in ["local", "device"] {
            let kv = KVStore::create(kind).unwrap();
            embedding_store(&kv, lazy_optimizer(name));
            embedding_step(&kv, 0, 2);
            let path = dir.path(&format!("{name}-{kind}.ckpt"));
            kv.save_checkpoint(&path).unwrap();
            files.push((kind, path));
        }
        let path = dir.path(&format!("{name}-dist.ckpt"));
        let p = path.clone();
        run_workers(2, move |_, kv| {
            embedding_store(&kv, lazy_optimizer(name));
            embedding_step(&kv, 0, 1);
            kv.save_checkpoint(&p).unwrap();
        });
        files.push(("dist_sync", path));
        for (saver, path) in &files {
            for kind in ["local", "device"] {
                let kv = KVStore::create(kind).unwrap();
                kv.load_checkpoint(path).unwrap();
                assert_eq!(resumed_step(&kv, 2), want, "{name}: saved by {saver}, loaded into {kind}");
            }
            // A store that holds the key dense takes the file's storage type.
            let kv = KVStore::create("local").unwrap();
            kv.init("emb", &NDArray::zeros(&[6, 2]).unwrap()).unwrap();
            assert_eq!(kv.stype("emb").unwrap(), StorageType::Default);
            kv.load_checkpoint(path).unwrap();
            assert_eq!(resumed_step(&kv, 2), want, "{name}: saved by {saver}, loaded over a dense key");
            let p = path.clone();
            let got = run_workers(2, move |_, kv| {
                kv.load_checkpoint(&p).unwrap();
                resumed_step(&kv, 1)
            });
            for g in got {
                assert_eq!(g, want, "{name}: saved by {saver}, loaded into 2 dist_sync workers");
            }
        }
    }
}

/// A checkpoint of row-sparse keys that passes through a `dist_async` job (which has no
/// row-sparse calls: it loads the file, trains its dense keys, saves) keeps the keys'
/// storage type: a store of another kind that loads the new file has them row-sparse,
/// with their values.
#[test]
fn a_row_sparse_checkpoint_through_dist_async_keeps_the_keys_row_sparse() {
    let dir = kvstore_tests::TempDir::new("rsp-ckpt-async");
    let (first, second) = (dir.path("local.ckpt"), dir.path("async.ckpt"));
    let kv = KVStore::create("local").unwrap();
    embedding_store(&kv, lazy_optimizer("adam"));
    embedding_step(&kv, 0, 1);
    kv.save_checkpoint(&first).unwrap();
    let emb = kv.pull_new("emb", 0).unwrap().to_vec::<f32>().unwrap();
    let (f, s) = (first.clone(), second.clone());
    let stypes = kvstore_tests::run_async_workers(2, move |_, kv| {
        kv.load_checkpoint(&f).unwrap();
        let stype = kv.stype("emb").unwrap();
        kv.push("dense", &NDArray::ones(&[3]).unwrap(), 0).unwrap();
        kv.barrier().unwrap();
        kv.save_checkpoint(&s).unwrap();
        stype
    });
    assert_eq!(stypes, [StorageType::RowSparse; 2], "dist_async reports the loaded key's storage type");
    let back = KVStore::create("device").unwrap();
    back.load_checkpoint(&second).unwrap();
    assert_eq!(back.stype("emb").unwrap(), StorageType::RowSparse);
    assert_eq!(back.stype("dense").unwrap(), StorageType::Default);
    assert_eq!(back.pull_new("emb", 0).unwrap().to_vec::<f32>().unwrap(), emb);
    assert_eq!(back.row_sparse_pull("emb", &[4], 0).unwrap().data().to_vec::<f32>().unwrap(), emb[8..10]);
}

/// A float16 row-sparse key in a checkpoint: updated lazily (SGD with momentum, Adam),
/// or densely with its float32 master copy (`multi_precision`), a `device` store that
/// loads the file takes the next two steps to the bits of the `local` store that saved
/// it, and keeps the key row-sparse.
#[test]
fn a_float16_row_sparse_key_resumes_lazily_and_with_its_master_copy() {
    let dir = kvstore_tests::TempDir::new("rsp-ckpt-f16");
    let f16 = |shape: &[usize], data: Vec<f32>| NDArray::from_vec(shape, data).unwrap().as_type(DType::F16).unwrap();
    let table = f16(&[6, 2], (1..=12).map(|x| x as f32 / 4.0).collect());
    let grad = |s: usize| {
        let data = f16(&[2, 2], vec![0.5 + s as f32, -0.25, 1.0, 2.0]);
        RowSparse::new(data, vec![1, 4 - s as i64], &[6, 2]).unwrap()
    };
    let f32s = |kv: &KVStore| bits(&kv.pull_new("e", 0).unwrap().as_type(DType::F32).unwrap().to_vec::<f32>().unwrap());
    for multi_precision in [0.0, 1.0] {
        for name in ["sgd", "adam"] {
            let b = Optimizer::builder(name).param("learning_rate", 0.1).param("multi_precision", multi_precision);
            let opt = if name == "sgd" { b.param("momentum", 0.9) } else { b }.build().unwrap();
            let a = KVStore::create("local").unwrap();
            a.init_row_sparse("e", &RowSparse::from_dense(&table).unwrap()).unwrap();
            a.set_optimizer(opt).unwrap();
            a.push_row_sparse("e", &[grad(0)], 0).unwrap();
            let path = dir.path(&format!("{name}-{multi_precision}.ckpt"));
            a.save_checkpoint(&path).unwrap();
            let b = KVStore::create("device").unwrap();
            b.load_checkpoint(&path).unwrap();
            assert_eq!(b.stype("e").unwrap(), StorageType::RowSparse);
            for kv in [&a, &b] {
                kv.push_row_sparse("e", &[grad(1)], 0).unwrap();
                kv.push_row_sparse("e", &[grad(2)], 0).unwrap();
            }
            assert_eq!(f32s(&b), f32s(&a), "{name}, multi_precision {multi_precision}");
            // Row 5 was never pushed: unchanged, lazily or not (no momentum built up).
            assert_eq!(f32s(&b)[10..], bits(&[2.75, 3.0]), "{name}, multi_precision {multi_precision}");
        }
    }
}
