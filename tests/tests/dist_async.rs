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
    assert!(said[1].1.is_empty() && said[1].2.is_none(), "rank 1 sent nothing too big: {:?}", said[1]);
}

#[test]
fn a_failed_push_names_the_keys_it_applied() {
    for w in [1, 2, 3] {
        run_async_workers(w, |rank, kv| async_cases::a_failed_push_names_the_keys_it_applied(rank, &kv));
    }
}
