//! The error contract (reference §3): every situation gives a typed error whose message
//! names the key and what was expected, and a failed call leaves the store exactly as
//! it was.

use kvstore_core::{Context, DType, Error, ErrorKind, KVStore, Key, NDArray, Result};
use kvstore_tests::{full, pulled};

const SHAPE: [usize; 2] = [2, 3];

fn store() -> KVStore {
    let kv = KVStore::create("local").expect("create");
    kv.init(&[Key::from(3), Key::from("s")], &[full(&SHAPE, 2.0, Context::cpu(0)), full(&SHAPE, 5.0, Context::cpu(0))])
        .expect("init");
    kv
}

/// Runs `op` on a fresh store, checks the error kind and that the message mentions
/// every one of `mentions`, then checks both keys still hold their values.
fn rejected(op: impl Fn(&KVStore) -> Result<()>, kind: ErrorKind, mentions: &[&str]) -> Error {
    let kv = store();
    let e = op(&kv).expect_err("the call must fail");
    assert_eq!(e.kind(), kind, "{e}");
    for m in mentions {
        assert!(e.to_string().contains(m), "message {e:?} should mention {m}");
    }
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![2.0; 6], "after {e}");
    assert_eq!(pulled(&kv, "s", &SHAPE), vec![5.0; 6], "after {e}");
    e
}

fn ones() -> NDArray {
    NDArray::ones(&SHAPE).expect("alloc")
}

#[test]
fn pull_and_pushpull_of_an_uninitialized_key_are_key_not_initialized() {
    rejected(|kv| kv.pull(100, &ones(), 0), ErrorKind::KeyNotInitialized, &["pull", "\"100\"", "call init first"]);
    rejected(|kv| kv.pushpull(100, &ones(), &ones(), 0), ErrorKind::KeyNotInitialized, &["pushpull", "\"100\""]);
    rejected(|kv| kv.pushpull_in_place("zz", &ones(), 0), ErrorKind::KeyNotInitialized, &["\"zz\""]);
}

#[test]
fn push_to_an_uninitialized_key_is_key_not_initialized_with_or_without_an_updater() {
    rejected(|kv| kv.push(50, &ones(), 0), ErrorKind::KeyNotInitialized, &["push", "\"50\""]);
    rejected(
        |kv| {
            kv.set_updater(|_: &Key, _: usize, m: &NDArray, s: &NDArray| s.copy_from(m)).expect("install the updater");
            kv.push("zz", &[ones(), ones()], 0)
        },
        ErrorKind::KeyNotInitialized,
        &["\"zz\""],
    );
}

#[test]
fn re_init_and_a_second_broadcast_are_already_initialized() {
    rejected(|kv| kv.init(3, &ones()), ErrorKind::AlreadyInitialized, &["duplicate init of key \"3\""]);
    rejected(|kv| kv.init("s", &ones()), ErrorKind::AlreadyInitialized, &["\"s\""]);
    rejected(|kv| kv.broadcast("s", &ones(), &ones(), 0), ErrorKind::AlreadyInitialized, &["broadcast", "\"s\""]);
}

#[test]
fn a_duplicate_key_inside_one_init_list_inits_nothing() {
    let kv = store();
    let e = kv.init(&["n", "m", "n"], &[ones(), ones(), ones()]).expect_err("duplicate");
    assert_eq!(e.kind(), ErrorKind::AlreadyInitialized);
    assert!(e.to_string().contains("appears twice"), "{e}");
    assert_eq!(kv.pull("n", &ones(), 0).expect_err("not added").kind(), ErrorKind::KeyNotInitialized);
    assert_eq!(kv.pull("m", &ones(), 0).expect_err("not added").kind(), ErrorKind::KeyNotInitialized);
}

#[test]
fn wrong_shapes_in_push_pull_and_broadcast_are_shape_mismatch() {
    let wrong = || NDArray::zeros(&[3, 3]).expect("alloc");
    rejected(|kv| kv.push(3, &wrong(), 0), ErrorKind::ShapeMismatch, &["push of key \"3\"", "[2, 3]", "[3, 3]"]);
    rejected(|kv| kv.push(3, &[ones(), wrong()], 0), ErrorKind::ShapeMismatch, &["value 2 of 2"]);
    rejected(|kv| kv.push(3, &[wrong(), ones()], 0), ErrorKind::ShapeMismatch, &["value 1 of 2"]);
    rejected(|kv| kv.pull(3, &NDArray::zeros(&[4, 4]).expect("alloc"), 0), ErrorKind::ShapeMismatch, &["[4, 4]"]);
    rejected(|kv| kv.pushpull(3, &ones(), &wrong(), 0), ErrorKind::ShapeMismatch, &["pushpull", "out"]);
    rejected(|kv| kv.broadcast("new", &ones(), &wrong(), 0), ErrorKind::ShapeMismatch, &["broadcast", "\"new\""]);
    // The failed broadcast did not init the key either.
    let kv = store();
    assert!(kv.broadcast("new", &ones(), &wrong(), 0).is_err());
    assert_eq!(kv.key_index("new"), None);
}

#[test]
fn wrong_dtypes_in_push_and_pull_are_dtype_mismatch() {
    let f64s = || NDArray::ones_with(&SHAPE, DType::F64, Context::cpu(0)).expect("alloc");
    rejected(|kv| kv.push(3, &[f64s(), ones()], 0), ErrorKind::DTypeMismatch, &["\"3\"", "float32", "float64"]);
    rejected(|kv| kv.push(3, &[ones(), f64s()], 0), ErrorKind::DTypeMismatch, &["value 2 of 2"]);
    rejected(|kv| kv.pull("s", &f64s(), 0), ErrorKind::DTypeMismatch, &["pull of key \"s\""]);
}

#[test]
fn mismatches_carry_the_key_and_what_was_expected_and_got_as_fields() {
    let wrong = || NDArray::zeros(&[3, 3]).expect("alloc");
    let e = rejected(|kv| kv.push(3, &wrong(), 0), ErrorKind::ShapeMismatch, &[]);
    assert_eq!(e.key(), Some(&Key::from("3")));
    match &e {
        Error::ShapeMismatch { key, expected, got, .. } => {
            assert_eq!(key.as_ref().map(Key::as_str), Some("3"));
            assert_eq!(expected, &SHAPE.to_vec());
            assert_eq!(got, &vec![3, 3]);
        }
        other => panic!("not a shape mismatch: {other:?}"),
    }
    let f64s = || NDArray::ones_with(&SHAPE, DType::F64, Context::cpu(0)).expect("alloc");
    let e = rejected(|kv| kv.push("s", &[ones(), f64s()], 0), ErrorKind::DTypeMismatch, &[]);
    assert_eq!(e.key(), Some(&Key::from("s")));
    match &e {
        Error::DTypeMismatch { key, expected, got, .. } => {
            assert_eq!(key.as_ref().map(Key::as_str), Some("s"));
            assert_eq!((*expected, *got), (DType::F32, DType::F64));
        }
        other => panic!("not a dtype mismatch: {other:?}"),
    }
    let e = rejected(|kv| kv.pull(100, &ones(), 0), ErrorKind::KeyNotInitialized, &[]);
    assert_eq!(e.key().map(Key::as_str), Some("100"));
    let e = rejected(|kv| kv.init("s", &ones()), ErrorKind::AlreadyInitialized, &[]);
    assert_eq!(e.key().map(Key::as_str), Some("s"));
    // Array arithmetic concerns no key.
    let e = ones().add_assign(&wrong()).expect_err("shapes differ");
    assert!(matches!(&e, Error::ShapeMismatch { key: None, .. }), "{e:?}");
    assert_eq!(e.key(), None);
}

#[test]
fn lists_of_different_lengths_are_length_mismatch() {
    rejected(|kv| kv.init(&[8, 9], &[ones()]), ErrorKind::LengthMismatch, &["init", "2"]);
    rejected(|kv| kv.push(&[3, 9], &[ones()], 0), ErrorKind::LengthMismatch, &["push"]);
    rejected(|kv| kv.pull(&["s"], &[ones(), ones()], 0), ErrorKind::LengthMismatch, &["pull", "outs"]);
    rejected(|kv| kv.push(&[3, 9], &[vec![ones()]], 0), ErrorKind::LengthMismatch, &["push"]);
    rejected(|kv| kv.push(3, &[vec![ones()]], 0), ErrorKind::InvalidArgument, &["list of lists"]);
}

#[test]
fn gradient_compression_on_a_local_store_is_unsupported() {
    rejected(|kv| kv.set_gradient_compression(&[("type", "2bit")]), ErrorKind::Unsupported, &["gradient compression"]);
}

#[test]
fn gpu_contexts_are_device_unavailable_without_a_backend() {
    for kind in ["local", "device"] {
        let kv = KVStore::create(kind).expect("create");
        let e = NDArray::zeros_with(&SHAPE, DType::F32, Context::gpu(0)).expect_err("no gpu backend");
        assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
        assert!(e.to_string().contains("gpu(0)"), "{e}");
        assert!(ones().copy_to(Context::gpu(1)).is_err());
        assert_eq!(kv.kind(), kind);
    }
}

#[test]
fn empty_lists_do_nothing_but_their_keys_must_be_initialized() {
    let kv = store();
    let none: [NDArray; 0] = [];
    let no_keys: [&str; 0] = [];
    kv.push(&no_keys, &none, 0).expect("empty push");
    kv.pull(&no_keys, &none, 0).expect("empty pull");
    kv.push(3, &none, 0).expect("one key, no values");
    kv.pull(3, &none, 0).expect("one key, no outs");
    let no_lists: [Vec<NDArray>; 0] = [];
    kv.push(&no_keys, &no_lists[..], 0).expect("empty list of lists");
    kv.pushpull(&no_keys, &no_lists[..], &none, 0).expect("empty pushpull");
    // The first key's list is empty, the second's is not: key "3" gets one push.
    kv.push(&["3", "3"], &[vec![], vec![ones()]][..], 0).expect("nested, first empty");
    // MXNet let an unknown key through when it came with no array; here it is the
    // same error as any other call on that key.
    for e in [
        kv.push(5, &none, 0).expect_err("unknown key, no values"),
        kv.pull(5, &none, 0).expect_err("unknown key, no outs"),
        kv.pushpull(5, &none, &none, 0).expect_err("unknown key, pushpull"),
        kv.pull(&["3", "5"], &[vec![ones()], vec![]][..], 0).expect_err("nested, one empty"),
    ] {
        assert_eq!(e.kind(), ErrorKind::KeyNotInitialized, "{e}");
        assert!(e.to_string().contains("\"5\""), "{e}");
    }
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![1.0; 6]);
}

#[test]
fn every_error_kind_has_a_distinct_ffi_code() {
    let codes: std::collections::HashSet<&str> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
    assert_eq!(codes.len(), ErrorKind::ALL.len());
    assert!(codes.contains("INTERNAL") && codes.contains("SHAPE_MISMATCH"));
}

#[test]
fn an_updater_calling_its_own_store_gets_an_error_instead_of_a_deadlock() {
    let kv = std::sync::Arc::new(store());
    let other = std::sync::Arc::new(store());
    let (inner, other_inner) = (std::sync::Arc::downgrade(&kv), std::sync::Arc::clone(&other));
    kv.set_updater(move |key: &Key, _index: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        let kv = inner.upgrade().expect("store alive");
        // Any call on the store that runs the updater is refused, for any key: the push
        // holds its keys, and another thread may wait for them while holding others.
        for k in [key.clone(), Key::from("s")] {
            let e = kv.pull(k, &NDArray::zeros(&SHAPE)?, 0).expect_err("own store");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("inside an updater"), "{e}");
        }
        assert_eq!(kv.push(key.clone(), merged, 0).expect_err("own store").kind(), ErrorKind::InvalidArgument);
        // Another store works (its keys are free here).
        other_inner.pull("s", &NDArray::zeros(&SHAPE)?, 0)?;
        stored.copy_from(merged)
    })
    .expect("install the updater");
    kv.push(3, &full(&SHAPE, 7.0, Context::cpu(0)), 0).expect("push");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![7.0; 6]);
    // After the push, the store is free again on this thread.
    kv.clear_updater().expect("install the updater");
    kv.push(3, &full(&SHAPE, 8.0, Context::cpu(0)), 0).expect("push");
    assert_eq!(pulled(&kv, 3, &SHAPE), vec![8.0; 6]);
}

#[test]
fn two_stores_whose_updaters_call_each_other_do_not_deadlock() {
    use std::sync::{Arc, mpsc};
    let a = Arc::new(store());
    let b = Arc::new(store());
    // a's updater pulls from b and b's from a; pushes to both from two threads at once.
    for (this, that) in [(&a, &b), (&b, &a)] {
        let that = Arc::downgrade(that);
        this.set_updater(move |_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
            if let Some(that) = that.upgrade() {
                // Either the key is free (Ok) or busy (an error): never a wait.
                let _ = that.pull(3, &NDArray::zeros(&SHAPE)?, 0);
            }
            stored.copy_from(merged)
        })
        .expect("install the updater");
    }
    let (tx, rx) = mpsc::channel();
    for (kv, n) in [(Arc::clone(&a), 0), (Arc::clone(&b), 1)] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for i in 0..2000 {
                kv.push(3, &full(&SHAPE, f64::from(i), Context::cpu(0)), 0).expect("push");
            }
            tx.send(n).expect("send");
        });
    }
    for _ in 0..2 {
        rx.recv_timeout(std::time::Duration::from_secs(60)).expect("a deadlock: the pushes did not finish");
    }
    assert_eq!(pulled(&a, 3, &SHAPE), vec![1999.0; 6]);
}

#[test]
fn a_broadcast_whose_out_names_another_key_inits_nothing() {
    let kv = store();
    let e = kv
        .broadcast_pairs(
            &[Key::from("new")],
            &[NDArray::ones(&SHAPE).expect("v")],
            &[Key::from("s")],
            &[NDArray::zeros(&SHAPE).expect("o")],
            0,
        )
        .expect_err("out key not broadcast");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(kv.key_index("new"), None);
}

/// Bytes lent to an array as foreign memory (read-only here).
struct Bytes(Vec<u8>);

impl kvstore_core::ForeignMemory for Bytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// A broadcast refused for its out (read-only, or of another shape or dtype) initialises
/// nothing: the key is not in `keys()` and a retry with a good out succeeds. The
/// read-only out was found only by the pull, after the key was initialised, so a retry
/// got ALREADY_INITIALIZED.
#[test]
fn a_broadcast_refused_for_its_out_initialises_no_key() {
    for kind in ["local", "device"] {
        for blocking in [true, false] {
            let kv = KVStore::create(kind).expect("create");
            let value = NDArray::full_with(&[4], 7.0, DType::U8, Context::cpu(0)).expect("value");
            let read_only = NDArray::from_foreign(&[4], DType::U8, Box::new(Bytes(vec![0; 4])), false).expect("out");
            let wrong_shape = NDArray::zeros_with(&[5], DType::U8, Context::cpu(0)).expect("out");
            let wrong_dtype = NDArray::zeros(&[4]).expect("out");
            for (bad, says) in [(&read_only, "read-only"), (&wrong_shape, "shape"), (&wrong_dtype, "dtype")] {
                let r = match blocking {
                    true => kv.broadcast("b1", &value, bad, 0),
                    false => kv.broadcast_async("b1", &value, bad, 0).wait(),
                };
                let e = r.expect_err("a bad out");
                assert!(e.to_string().to_lowercase().contains(says), "{kind}: {e}");
                assert!(kv.keys().is_empty(), "{kind} (blocking: {blocking}): {e} left keys {:?}", kv.keys());
            }
            let out = NDArray::zeros_with(&[4], DType::U8, Context::cpu(0)).expect("out");
            kv.broadcast("b1", &value, &out, 0).expect("a retry with a good out");
            assert_eq!(out.to_vec::<u8>().expect("convert"), vec![7; 4]);
        }
    }
}
