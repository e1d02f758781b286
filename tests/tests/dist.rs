//! `dist_sync` semantics (reference §9 and case 23) with workers as threads of one
//! process (`kvstore_tests::ThreadGroup`), running the shared cases of
//! `kvstore_tests::dist_cases` (kvstore-mpi runs the same ones across processes).

use kvstore_core::{ErrorKind, KVStore};
use kvstore_tests::{dist_cases, replicated_dist_store, run_members, run_workers};

#[test]
fn case_23_dist_sync_with_two_and_four_workers() {
    for w in [2, 4] {
        run_workers(w, |rank, kv| dist_cases::case_23_init_push_and_test_optimizer(rank, &kv));
    }
}

#[test]
fn each_round_every_worker_pushes_rank_plus_one() {
    for w in [2, 4] {
        run_workers(w, |rank, kv| dist_cases::each_round_every_worker_pushes_rank_plus_one(rank, &kv));
    }
}

#[test]
fn an_optimizer_runs_identically_on_every_worker() {
    let bits = run_workers(4, |rank, kv| dist_cases::an_optimizer_runs_identically_on_every_worker(rank, &kv));
    assert!(bits.windows(2).all(|w| w[0] == w[1]), "replicas differ after Adam steps");
}

#[test]
fn a_key_sums_alike_alone_and_fused() {
    for w in [2, 3, 4] {
        let bits = run_workers(w, |rank, kv| dist_cases::a_key_sums_alike_alone_and_fused(rank, &kv));
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "workers differ");
    }
}

#[test]
fn a_big_key_sums_alike_as_small_fused_keys() {
    for w in [2, 3, 4] {
        let bits = run_workers(w, |rank, kv| dist_cases::a_big_key_sums_alike_as_small_fused_keys(rank, &kv));
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "workers differ");
    }
}

#[test]
fn bf16_sums_across_workers_round_once() {
    for workers in [2, 3] {
        run_workers(workers, |rank, kv| dist_cases::bf16_sums_across_workers_round_once(rank, &kv));
    }
}

#[test]
fn every_dtype_sums_local_then_across_workers() {
    run_workers(3, |rank, kv| dist_cases::every_dtype_sums_local_then_across_workers(rank, &kv));
}

#[test]
fn workers_whose_calls_differ_all_fail() {
    for w in [1, 2, 3] {
        run_workers(w, |rank, kv| dist_cases::workers_whose_calls_differ_all_fail(rank, &kv));
    }
}

#[test]
fn a_call_a_binding_refuses_fails_on_every_worker() {
    for w in [1, 2, 3] {
        run_workers(w, |rank, kv| dist_cases::a_call_a_binding_refuses_fails_on_every_worker(rank, &kv));
    }
}

#[test]
fn barrier_and_rank_come_from_the_group() {
    let ranks = run_workers(4, |rank, kv| {
        kv.barrier().expect("barrier");
        assert_eq!(kv.num_workers(), 4);
        (rank, kv.rank())
    });
    assert!(ranks.iter().all(|(r, k)| r == k));
}

#[test]
fn dist_kinds_without_a_group_or_a_transport_are_unsupported() {
    for kind in ["dist_sync", "dist", "dist_device_sync"] {
        let e = KVStore::create(kind).expect_err("no group");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{kind}");
        assert!(e.to_string().contains("kvstore-mpi"), "{e}");
    }
    for kind in ["dist_async", "dist_async_device"] {
        let e = KVStore::create(kind).expect_err("async");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().contains("without a transport") && e.to_string().contains("kvstore-mpi"), "{e}");
    }
    let group = kvstore_tests::ThreadGroup::new(1);
    let e = KVStore::builder("local").collective(group.member(0)).build().expect_err("local with a group");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn nonblocking_training_matches_blocking_on_one_two_and_four_workers() {
    for w in [1, 2, 4] {
        let bits = run_workers(w, |rank, kv| dist_cases::nonblocking_training_matches_blocking(rank, &kv));
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers: the workers' weights differ");
    }
}

#[test]
fn an_updater_failing_on_one_worker_fails_the_push_everywhere() {
    for (w, compression) in [(2, false), (3, false), (2, true), (3, true)] {
        // Replicated: the updater runs on every worker (with owners, on the key's owner
        // alone: tests/tests/owners.rs).
        let bits = run_members(w, move |rank, member| {
            let kv = replicated_dist_store(&member);
            dist_cases::an_updater_failing_on_one_worker_fails_the_push_everywhere(rank, &kv, compression)
        });
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers (2-bit: {compression}): replicas differ");
    }
}

#[test]
fn a_call_refused_before_its_step_fails_on_every_worker() {
    for w in [2, 3] {
        run_workers(w, |rank, kv| dist_cases::a_call_refused_before_its_step_fails_on_every_worker(rank, &kv));
    }
}

#[test]
fn a_pull_refuses_bad_outs_before_writing_any() {
    for w in [1, 2, 3] {
        run_workers(w, |rank, kv| dist_cases::a_pull_refuses_bad_outs_before_writing_any(rank, &kv));
    }
}

#[test]
fn an_updater_panicking_on_one_worker_fails_the_push_everywhere() {
    for w in [2, 3] {
        let bits = run_members(w, |rank, member| {
            let kv = replicated_dist_store(&member);
            dist_cases::an_updater_panicking_on_one_worker_fails_the_push_everywhere(rank, &kv)
        });
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers: replicas differ");
    }
}

#[test]
fn workers_with_other_optimizers_fail_their_pushes() {
    for w in [2, 3] {
        let bits = run_workers(w, |rank, kv| dist_cases::workers_with_other_optimizers_fail_their_pushes(rank, &kv));
        assert!(bits.windows(2).all(|b| b[0] == b[1]), "{w} workers: replicas differ");
    }
}
