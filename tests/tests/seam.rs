//! The seam a durability layer works through (`kvstore_core::backend::{Durable, Seam,
//! Peers, Snapshot}`), driven as a layer of one's own would drive it: bad input is an
//! error on every worker, never a panic, a desync or a hang.

use std::sync::Arc;

use kvstore_core::backend::{Durable, Seam};
use kvstore_core::{ErrorKind, KVStore, NDArray, Restored, Result};
use kvstore_tests::{ThreadMember, run_members};
use parking_lot::Mutex;

/// A durability whose commit runs `probe` on the seam (and keeps nothing).
struct Probe<F>(F);

impl<F: Fn(Seam<'_>) -> Result<()> + Send + Sync> Durable for Probe<F> {
    fn commit(&self, store: Seam<'_>, _step: u64, _extra: &[u8], before: Result<()>) -> Result<()> {
        store.check_step("commit")?;
        before?;
        (self.0)(store)
    }

    fn restore(&self, _store: Seam<'_>) -> Result<Option<Restored>> {
        Ok(None)
    }
}

/// A `dist_sync` store of `member` whose commits run `probe`.
fn probed(member: &Arc<ThreadMember>, probe: impl Fn(Seam<'_>) -> Result<()> + Send + Sync + 'static) -> KVStore {
    let group: Arc<dyn kvstore_core::backend::Collective> = Arc::clone(member) as _;
    KVStore::builder("dist_sync").num_threads(1).collective(group).durability(Box::new(Probe(probe))).build().unwrap()
}

#[test]
fn records_of_different_lengths_reach_every_worker_and_the_group_stays_in_step() {
    let said = run_members(3, |rank, member| {
        let got = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&got);
        let kv = probed(&member, move |s| {
            let peers = s.peers().expect("a group");
            // Rank 0's record is empty, the others' of different lengths.
            *kept.lock() = peers.exchange("probe", &vec![rank as u8 + 1; 4 * rank])?;
            Ok(())
        });
        kv.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
        kv.commit(1, b"").expect("a commit");
        // The group's next call meets the same call on every worker.
        kv.push("w", &NDArray::full(&[2], 1.0).unwrap(), 0).expect("a push after the commit");
        let w = kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap();
        let got = got.lock().clone();
        (got, w)
    });
    for (got, w) in said {
        let want: Vec<Vec<u8>> = (0..3).map(|r| vec![r as u8 + 1; 4 * r]).collect();
        assert_eq!(got, want);
        assert_eq!(w, [3.0, 3.0]);
    }
}

#[test]
fn a_record_too_long_or_a_root_that_is_no_rank_is_an_error_on_every_worker() {
    let said = run_members(2, |rank, member| {
        let kv = probed(&member, move |s| {
            let peers = s.peers().expect("a group");
            // Too long on rank 1 only: every worker fails alike.
            let long = peers.exchange("long", &vec![0; if rank == 1 { 4096 } else { 8 }]).map(|_| ());
            let broadcast = peers.broadcast("far", vec![1, 2], 5).map(|_| ());
            match (long, broadcast) {
                (Err(a), Err(b)) => Err(kvstore_core::Error::invalid_argument(format!("{a} | {b}"))),
                other => panic!("not refused: {other:?}"),
            }
        });
        let e = kv.commit(1, b"").expect_err("refused");
        (e.kind(), e.to_string())
    });
    for (kind, message) in said {
        assert_eq!(kind, ErrorKind::InvalidArgument, "{message}");
        assert!(message.contains("a record of 4096 bytes"), "{message}");
        assert!(message.contains("a broadcast from rank 5 of a job of 2 ranks"), "{message}");
    }
}

#[test]
fn an_empty_record_is_every_workers_empty_record() {
    let said = run_members(2, |_, member| {
        let group: Arc<dyn kvstore_core::backend::Collective> = member;
        group.exchange("empty", &[]).expect("an exchange")
    });
    for records in said {
        assert_eq!(records, vec![Vec::<u8>::new(); 2]);
    }
}

#[test]
fn a_header_asked_with_too_few_checksums_is_an_error_not_a_panic() -> Result<()> {
    let kv = KVStore::builder("local")
        .durability(Box::new(Probe(|s: Seam<'_>| {
            s.whole_snapshot("commit", true, &Mutex::new(None), &mut |snap| snap.header(&[]).map(|_| ()))
        })))
        .build()?;
    kv.init("w", &NDArray::ones(&[3])?)?;
    let e = kv.commit(1, b"").expect_err("too few checksums");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("0 checksums for 1 tensors"), "{e}");
    assert_eq!(kv.pull_new("w", 0)?.to_vec::<f32>()?, [1.0; 3]);
    Ok(())
}
