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
