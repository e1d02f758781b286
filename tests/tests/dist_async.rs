//! `dist_async` semantics with workers as threads of one process
//! (`kvstore_tests::ThreadHub`), running the shared cases of
//! `kvstore_tests::async_cases` (kvstore-mpi runs the same ones across processes).

use kvstore_core::{ErrorKind, KVStore};
use kvstore_tests::{async_cases, run_async_workers};

#[test]
fn every_push_of_every_worker_is_applied_once() {
    for w in [1, 2, 3, 4] {
        let bits = run_async_workers(w, |rank, kv| async_cases::every_push_is_applied_once(rank, &kv));
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers: the pulled values differ");
    }
}

#[test]
fn one_workers_pushes_to_a_key_apply_in_its_order() {
    for w in [1, 2, 4] {
        run_async_workers(w, |rank, kv| async_cases::one_workers_pushes_apply_in_order(rank, &kv));
    }
}

#[test]
fn an_optimizer_runs_on_the_owners() {
    for w in [1, 3] {
        run_async_workers(w, |rank, kv| async_cases::an_optimizer_runs_on_the_owners(rank, &kv));
    }
}

#[test]
fn errors_reach_the_caller_only() {
    for w in [1, 2] {
        run_async_workers(w, |rank, kv| async_cases::errors_reach_the_caller_only(rank, &kv));
    }
}

#[test]
fn dist_async_needs_a_transport() {
    for kind in ["dist_async", "dist_async_device", "DIST_ASYNC"] {
        let e = KVStore::create(kind).expect_err("no transport");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("kvstore-mpi"), "{e}");
    }
}

#[test]
fn random_schedules_lose_no_push() {
    for w in [2, 3, 4] {
        for seed in 0..4 {
            run_async_workers(w, move |rank, kv| async_cases::random_schedules_lose_no_push(rank, &kv, seed));
        }
    }
}

#[test]
fn a_checkpoint_holds_the_owners_values_and_states_and_resumes_anywhere() {
    let dir = kvstore_tests::TempDir::new("async-ckpt");
    let path = dir.path("async.ckpt");
    let p = path.clone();
    let trained = run_async_workers(2, move |rank, kv| async_cases::train_and_checkpoint(rank, &kv, &p));
    let (saved, after) = trained[0].clone();
    assert!(trained.iter().all(|t| t == &trained[0]), "the workers' values differ");
    // One local store: the values saved, and (the Adam state was saved) the same step.
    let local = KVStore::create("local").unwrap();
    local.load_checkpoint(&path).unwrap();
    assert_eq!(async_cases::checkpoint_bits(&local), saved);
    assert_eq!(async_cases::next_push(0, &local), after, "a local store resumed");
    // A dist_async job of another size.
    for w in [1, 3] {
        let p = path.clone();
        let resumed = run_async_workers(w, move |rank, kv| {
            kv.load_checkpoint(&p).expect("load_checkpoint");
            assert_eq!(kv.optimizer_name(), Some("adam"));
            (async_cases::checkpoint_bits(&kv), async_cases::next_push(rank, &kv))
        });
        for (values, next) in resumed {
            assert_eq!(values, saved, "{w} workers: the values loaded");
            assert_eq!(next, after, "{w} workers: the step after the resume");
        }
    }
    // A dist_sync job of 2 loads it too.
    let p = path.clone();
    let synced = kvstore_tests::run_workers(2, move |_, kv| {
        kv.load_checkpoint(&p).expect("load_checkpoint");
        async_cases::checkpoint_bits(&kv)
    });
    assert!(synced.iter().all(|b| b == &saved));
}

/// A checkpoint saved with a custom updater keeps the store's updater when loaded (as in
/// every store kind): the owners' shares go on applying pushes with it, not assigning.
#[test]
fn a_checkpoint_of_a_custom_updater_keeps_the_owners_updater() {
    let dir = kvstore_tests::TempDir::new("async-custom");
    let path = dir.path("custom.ckpt");
    let sums = run_async_workers(2, move |rank, kv| {
        kv.set_updater(
            |_: &kvstore_core::Key, _: usize, merged: &kvstore_core::NDArray, stored: &kvstore_core::NDArray| {
                stored.add_assign(merged)
            },
        )
        .expect("updater");
        kv.init("u", &kvstore_core::NDArray::full(&[4], 1.0).expect("value")).expect("init");
        kv.save_checkpoint(&path).expect("save_checkpoint");
        kv.load_checkpoint(&path).expect("load_checkpoint");
        if rank == 0 {
            kv.push("u", &kvstore_core::NDArray::full(&[4], 2.0).expect("g"), 0).expect("push");
        }
        kv.barrier().expect("barrier");
        kv.pull_new("u", 0).expect("pull").to_vec::<f32>().expect("values")
    });
    assert!(sums.iter().all(|s| s == &vec![3.0f32; 4]), "1 + 2 by the updater, not 2 assigned: {sums:?}");
}

/// A checkpoint holds a push that another thread makes meanwhile whole or not at all:
/// the worker's keys are held through the gather (a push holds them while the owners
/// apply it). A second thread pushes keys `a` and `b` together, with the values 1, 2,
/// 3, ..., while the first saves checkpoints; each file holds `a` == `b`.
#[test]
fn a_checkpoint_holds_a_push_of_another_thread_whole_or_not_at_all() {
    use kvstore_core::NDArray;
    const N: usize = 1 << 18;
    let dir = kvstore_tests::TempDir::new("async-concurrent");
    let folder = dir.path("");
    let saved = run_async_workers(1, move |_, kv| {
        kv.init(&["a", "b"][..], &[NDArray::zeros(&[N]).unwrap(), NDArray::zeros(&[N]).unwrap()]).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut k = 1.0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let v = [NDArray::full(&[N], k).unwrap(), NDArray::full(&[N], k).unwrap()];
                    kv.push(&["a", "b"][..], &v, 0).unwrap();
                    k += 1.0;
                }
            });
            let files: Vec<std::path::PathBuf> = (0..12)
                .map(|i| {
                    let path = folder.join(format!("c{i}.ckpt"));
                    kv.save_checkpoint(&path).expect("save_checkpoint");
                    path
                })
                .collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            files
        })
    });
    for path in &saved[0] {
        let local = KVStore::create("local").unwrap();
        local.load_checkpoint(path).unwrap();
        let (a, b) = (local.pull_new("a", 0).unwrap(), local.pull_new("b", 0).unwrap());
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "{}", path.display());
    }
}

/// A checkpoint whose optimizer replaces the store's and that lacks a key the store
/// has: that key keeps its value, and its optimizer state starts afresh (as in every
/// store kind), not from the state the store's own optimizer left it.
#[test]
fn a_loaded_optimizer_starts_afresh_for_the_keys_the_file_lacks() {
    use kvstore_core::{NDArray, Optimizer};
    let dir = kvstore_tests::TempDir::new("async-afresh");
    let path = dir.path("only-a.ckpt");
    let adam = || Optimizer::builder("adam").param("learning_rate", 0.1).build().expect("adam");
    let g = || NDArray::from_vec(&[4], vec![0.5f32, -1.0, 2.0, 0.25]).expect("g");
    let file = KVStore::create("local").unwrap();
    file.init("a", &NDArray::zeros(&[4]).unwrap()).unwrap();
    file.set_optimizer(adam()).unwrap();
    file.save_checkpoint(&path).unwrap();
    let p = path.clone();
    let got = run_async_workers(1, move |_, kv| {
        kv.init(&["a", "b"][..], &[NDArray::zeros(&[4]).unwrap(), NDArray::zeros(&[4]).unwrap()]).unwrap();
        kv.set_optimizer(Optimizer::builder("sgd").param("learning_rate", 0.1).param("momentum", 0.9).build().unwrap())
            .unwrap();
        kv.push("b", &g(), 0).unwrap();
        kv.push("b", &g(), 0).unwrap();
        let before = kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap();
        kv.load_checkpoint(&p).expect("load_checkpoint");
        kv.push("b", &g(), 0).unwrap();
        (before, kv.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap())
    });
    let (before, after) = &got[0];
    // The same push from `before` with the file's optimizer and no state.
    let fresh = KVStore::create("local").unwrap();
    fresh.init("b", &NDArray::from_vec(&[4], before.clone()).unwrap()).unwrap();
    fresh.set_optimizer(adam()).unwrap();
    fresh.push("b", &g(), 0).unwrap();
    assert_eq!(after, &fresh.pull_new("b", 0).unwrap().to_vec::<f32>().unwrap());
}

/// A message bigger than the transport carries (here 4 KiB) is an `Unsupported` error
/// that names the bound, at either end, and nothing waits for it: a request (rank 0's
/// init of a key that another worker owns), or a reply (an owner's part with its Adam
/// state, gathered for a checkpoint). Calls that fit go on.
#[test]
fn a_message_bigger_than_the_transport_carries_is_a_clear_error() {
    let hub = kvstore_tests::ThreadHub::new(2);
    hub.set_max_message(4096);
    let dir = kvstore_tests::TempDir::new("async-limit");
    let path = dir.path("limit.ckpt");
    let said = kvstore_tests::run_async_workers_on("dist_async", hub, move |rank, kv| {
        let zeros = |n: usize| kvstore_core::NDArray::zeros(&[n]).expect("zeros");
        let inits: Vec<String> = (0..4)
            .filter_map(|k| kv.init(format!("big{k}"), &zeros(1100)).err())
            .map(|e| format!("{:?}: {e}", e.kind()))
            .collect();
        for k in 0..4 {
            kv.init(format!("v{k}"), &zeros(900)).expect("900 values fit");
        }
        kv.set_optimizer(kvstore_core::Optimizer::builder("adam").build().expect("adam")).expect("adam");
        for k in 0..4 {
            kv.push(format!("v{k}"), &kvstore_core::NDArray::full(&[900], 0.5).expect("g"), 0).expect("push");
        }
        let saved = kv.save_checkpoint(&path).err().map(|e| e.to_string());
        kv.pull_new("v0", 0).expect("a pull that fits");
        kv.barrier().expect("barrier");
        (rank, inits, saved)
    });
    let (_, inits, saved) = &said[0];
    assert!(!inits.is_empty(), "a key of 4,400 bytes that rank 1 owns");
    for e in inits {
        assert!(e.starts_with("Unsupported") && e.contains("at most 4096 bytes"), "{e}");
    }
    let saved = saved.as_deref().expect("a part with its state is more than 4 KiB");
    assert!(saved.contains("at most 4096 bytes"), "{saved}");
    // Rank 1 heard of rank 0's failed inits, and added none of those keys either.
    assert_eq!(said[1].1.len(), inits.len(), "{:?}", said[1]);
    assert!(said[1].1.iter().all(|e| e.contains("rank 0 could not send the values")), "{:?}", said[1]);
    assert!(said[1].2.is_none(), "rank 1 sent nothing too big: {:?}", said[1]);
}

#[test]
fn a_failed_push_names_the_keys_it_applied() {
    for w in [1, 2, 3] {
        run_async_workers(w, |rank, kv| async_cases::a_failed_push_names_the_keys_it_applied(rank, &kv));
    }
}
