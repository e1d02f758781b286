//! The deliberate differences from MXNet 1.9.1 (DESIGN §3, docs/mxnet-differences.md),
//! one test each.

use kvstore_core::{Context, DType, ErrorKind, KVStore, Key, NDArray, Result};
use kvstore_tests::{full, pulled};

const SHAPE: [usize; 2] = [2, 3];

fn store_with(value: f64) -> KVStore {
    let kv = KVStore::create("local").expect("create");
    kv.init("w", &full(&SHAPE, value, Context::cpu(0))).expect("init");
    kv
}

#[test]
fn push_copies_so_a_later_change_to_the_pushed_array_is_not_seen() {
    let kv = store_with(0.0);
    let g = NDArray::ones(&SHAPE).expect("alloc");
    kv.push("w", &g, 0).expect("push");
    g.mul_assign(42.0).expect("change the pushed array");
    assert_eq!(pulled(&kv, "w", &SHAPE), vec![1.0; 6]);
}

#[test]
fn a_single_value_push_of_another_shape_or_dtype_is_an_error_not_a_replacement() {
    let kv = store_with(2.0);
    let e = kv.push("w", &NDArray::ones(&[3, 3]).expect("alloc"), 0).expect_err("shape");
    assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
    assert!(
        e.to_string().contains("\"w\"") && e.to_string().contains("[2, 3]") && e.to_string().contains("[3, 3]"),
        "{e}"
    );
    let f64_value = NDArray::ones_with(&SHAPE, DType::F64, Context::cpu(0)).expect("alloc");
    let e = kv.push("w", &f64_value, 0).expect_err("dtype");
    assert_eq!(e.kind(), ErrorKind::DTypeMismatch);
    assert!(e.to_string().contains("float32") && e.to_string().contains("float64"), "{e}");
    assert_eq!(pulled(&kv, "w", &SHAPE), vec![2.0; 6]);
}

#[test]
fn pull_checks_dtype_instead_of_converting() {
    let kv = store_with(1.7);
    let out = NDArray::zeros_with(&SHAPE, DType::I32, Context::cpu(0)).expect("alloc");
    assert_eq!(kv.pull("w", &out, 0).expect_err("dtype").kind(), ErrorKind::DTypeMismatch);
    assert_eq!(out.to_vec::<i32>().expect("read"), vec![0; 6]);
    // The explicit conversion gives MXNet's cast.
    let f = NDArray::zeros(&SHAPE).expect("alloc");
    kv.pull("w", &f, 0).expect("pull");
    assert_eq!(f.as_type(DType::I32).expect("cast").to_vec::<i32>().expect("read"), vec![1; 6]);
}

#[test]
fn more_values_than_the_first_multi_value_push_are_summed() {
    let kv = store_with(0.0);
    let vals = |n: u32| (0..n).map(|i| full(&SHAPE, 1.0, Context::cpu(i))).collect::<Vec<_>>();
    kv.push("w", &vals(2), 0).expect("push 2");
    assert_eq!(pulled(&kv, "w", &SHAPE), vec![2.0; 6]);
    kv.push("w", &vals(4), 0).expect("push 4");
    assert_eq!(pulled(&kv, "w", &SHAPE), vec![4.0; 6]);
    kv.push("w", &vals(7), 0).expect("push 7");
    assert_eq!(pulled(&kv, "w", &SHAPE), vec![7.0; 6]);
}

#[test]
fn an_updater_error_fails_the_push_and_keeps_every_key_as_it_was() {
    let kv = KVStore::create("local").expect("create");
    kv.init(&["a", "b"], &[full(&SHAPE, 1.0, Context::cpu(0)), full(&SHAPE, 2.0, Context::cpu(0))]).expect("init");
    kv.set_updater(|key: &Key, _index: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        // Change the stored value first, then fail on "b": neither change may stick.
        stored.add_assign(merged)?;
        if key.as_str() == "b" {
            return Err(kvstore_core::Error::invalid_argument("the updater refused key b"));
        }
        Ok(())
    })
    .expect("install the updater");
    let e = kv.push(&["a", "b"], &[full(&SHAPE, 10.0, Context::cpu(0)), full(&SHAPE, 10.0, Context::cpu(0))], 0);
    let e = e.expect_err("updater error");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("refused key b"), "{e}");
    assert_eq!(pulled(&kv, "a", &SHAPE), vec![1.0; 6]);
    assert_eq!(pulled(&kv, "b", &SHAPE), vec![2.0; 6]);
    // A push of "a" alone goes through.
    kv.push("a", &full(&SHAPE, 10.0, Context::cpu(0)), 0).expect("push a");
    assert_eq!(pulled(&kv, "a", &SHAPE), vec![11.0; 6]);
}

fn sum_with_threads(threads: usize, values: &[NDArray]) -> Vec<u32> {
    let kv = KVStore::builder("local").num_threads(threads).build().expect("create");
    let z = NDArray::zeros_with(values[0].shape(), values[0].dtype(), Context::cpu(0)).expect("alloc");
    kv.init(0, &z).expect("init");
    kv.push(0, values, 0).expect("push");
    kv.pull(0, &z, 0).expect("pull");
    z.to_vec::<f32>().expect("read").iter().map(|x| x.to_bits()).collect()
}

#[test]
fn sums_are_bit_identical_for_one_two_and_four_threads() {
    // Non-integer values over 3 Mi elements: big enough to be split over threads, and
    // rounding-sensitive, so a different order of additions would show.
    let n = 3 << 20;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let values: Vec<NDArray> = (0..5)
            .map(|k| {
                let data: Vec<f32> =
                    (0..n).map(|i| ((i * 2654435761usize + k * 97) % 10007) as f32 * 0.37 - 1851.3).collect();
                NDArray::from_vec(&[n], data).expect("alloc").as_type(dtype).expect("cast")
            })
            .collect();
        let one = sum_with_threads(1, &values);
        assert_eq!(one, sum_with_threads(2, &values), "{dtype}: 1 vs 2 threads");
        assert_eq!(one, sum_with_threads(4, &values), "{dtype}: 1 vs 4 threads");
        // And equal to a plain left-to-right sum (in f32 for the half types).
        let inputs: Vec<Vec<f32>> = values.iter().map(|v| v.to_vec::<f32>().expect("read")).collect();
        let serial: Vec<u32> = (0..n)
            .step_by(4099)
            .map(|i| {
                let s = inputs[1..].iter().fold(inputs[0][i], |acc, v| acc + v[i]);
                NDArray::from_vec(&[1], vec![s])
                    .expect("one")
                    .as_type(dtype)
                    .expect("round")
                    .to_vec::<f32>()
                    .expect("r")[0]
                    .to_bits()
            })
            .collect();
        let sampled: Vec<u32> = one.iter().copied().step_by(4099).collect();
        assert_eq!(sampled, serial, "{dtype}: store sum vs left-to-right sum");
    }
}

#[test]
fn integer_sums_wrap() {
    let kv = KVStore::create("local").expect("create");
    let v = |x: f64| NDArray::full_with(&[2], x, DType::U8, Context::cpu(0)).expect("alloc");
    kv.init("u", &v(0.0)).expect("init");
    kv.push("u", &[v(200.0), v(100.0)], 0).expect("push");
    let out = v(0.0);
    kv.pull("u", &out, 0).expect("pull");
    assert_eq!(out.to_vec::<u8>().expect("read"), vec![44, 44]);
}

#[test]
fn unknown_store_kinds_are_rejected_and_barrier_works() {
    for name in ["foo", "horovod", "byteps", ""] {
        let e = KVStore::create(name).expect_err("unknown kind");
        assert_eq!(e.kind(), ErrorKind::UnknownStoreKind, "{name}");
        assert!(e.to_string().contains("local, device"), "{e}");
    }
    let e = KVStore::create("dist_nccl").expect_err("unsupported");
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains("the supported kinds are local, device, dist_sync, dist_async"), "{e}");
    assert!(KVStore::create("local").expect("create").barrier().is_ok());
}

#[test]
fn the_integer_key_3_and_the_string_key_3_are_one_key() {
    let kv = KVStore::create("local").expect("create");
    kv.init(3, &full(&SHAPE, 1.0, Context::cpu(0))).expect("init");
    kv.push("3", &full(&SHAPE, 5.0, Context::cpu(0)), 0).expect("push by string");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![5.0; 6]);
    assert_eq!(
        kv.init("3", &full(&SHAPE, 1.0, Context::cpu(0))).expect_err("same key").kind(),
        ErrorKind::AlreadyInitialized
    );
}

#[test]
fn a_failed_list_call_changes_nothing() {
    let kv = store_with(1.0);
    // init list with one existing key: no key of the list is added.
    let e = kv.init(&["x", "w"], &[full(&SHAPE, 0.0, Context::cpu(0)), full(&SHAPE, 0.0, Context::cpu(0))]);
    assert_eq!(e.expect_err("w exists").kind(), ErrorKind::AlreadyInitialized);
    assert_eq!(kv.keys(), vec![Key::from("w")]);
    // duplicate key inside one init list: nothing added either.
    let e = kv.init(&["y", "y"], &[full(&SHAPE, 0.0, Context::cpu(0)), full(&SHAPE, 0.0, Context::cpu(0))]);
    assert_eq!(e.expect_err("twice").kind(), ErrorKind::AlreadyInitialized);
    assert_eq!(kv.keys(), vec![Key::from("w")]);
    // push list with one unknown key: the known key is not pushed.
    let e = kv.push(&["w", "nope"], &[full(&SHAPE, 9.0, Context::cpu(0)), full(&SHAPE, 9.0, Context::cpu(0))], 0);
    assert_eq!(e.expect_err("unknown").kind(), ErrorKind::KeyNotInitialized);
    // push list whose second value has the wrong shape: the first is not pushed.
    let e = kv.push(&["w", "w"], &[full(&SHAPE, 9.0, Context::cpu(0)), full(&[3], 9.0, Context::cpu(0))], 0);
    assert_eq!(e.expect_err("shape").kind(), ErrorKind::ShapeMismatch);
    assert_eq!(pulled(&kv, "w", &SHAPE), vec![1.0; 6]);
}

/// A custom updater's working copies and merge buffers are kept per key and reused
/// from push to push (as MXNet's merge buffers): the all-or-nothing rule holds with
/// reused buffers too, and an array an updater kept and pushes later is summed with
/// what it holds then (the store never overwrites an array the call pushes).
#[test]
fn reused_updater_buffers_keep_pushes_all_or_nothing_and_kept_arrays_intact() {
    use std::sync::{Arc, Mutex};
    let kv = KVStore::create("local").expect("create");
    kv.init(&["a", "b"], &[full(&SHAPE, 1.0, Context::cpu(0)), full(&SHAPE, 10.0, Context::cpu(0))]).expect("init");
    let kept: Arc<Mutex<Vec<NDArray>>> = Arc::new(Mutex::new(Vec::new()));
    let fail_on = Arc::new(Mutex::new(None::<String>));
    let (k, f) = (Arc::clone(&kept), Arc::clone(&fail_on));
    kv.set_updater(move |key: &Key, _index: usize, merged: &NDArray, stored: &NDArray| {
        if f.lock().expect("lock").as_deref() == Some(key.as_str()) {
            return Err(kvstore_core::Error::invalid_argument("refused"));
        }
        k.lock().expect("lock").push(stored.clone());
        stored.add_assign(merged)
    })
    .expect("set_updater");
    let two = [full(&SHAPE, 2.0, Context::cpu(0)), full(&SHAPE, 2.0, Context::cpu(0))];
    kv.push(&["a", "b"], &two, 0).expect("push 1"); // a 3, b 12
    kv.push(&["a", "b"], &two, 0).expect("push 2"); // a 5, b 14: the buffers are reused now
    *fail_on.lock().expect("lock") = Some("b".to_string());
    assert!(kv.push(&["a", "b"], &two, 0).is_err(), "b's update fails");
    assert_eq!(pulled(&kv, "a", &SHAPE), vec![5.0; 6], "a is not updated when b fails");
    assert_eq!(pulled(&kv, "b", &SHAPE), vec![14.0; 6]);
    *fail_on.lock().expect("lock") = None;
    // The array a's updater was given at push 1 is one of a's reused buffers: pushing
    // it adds what it holds now, and the push does not overwrite it first.
    let first = kept.lock().expect("lock")[0].clone();
    let held = first.to_vec::<f32>().expect("read")[0];
    kv.push("a", &first, 0).expect("push the kept array");
    assert_eq!(pulled(&kv, "a", &SHAPE), vec![5.0 + f64::from(held); 6]);
    kv.push("a", &two[0], 0).expect("push after");
    assert_eq!(pulled(&kv, "a", &SHAPE), vec![7.0 + f64::from(held); 6]);
}
