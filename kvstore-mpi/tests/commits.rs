//! Commits across processes (`KVStore::commit`, `kvstore/commit.rs`): a `dist_sync`
//! job (`fixture_commit_job`) whose rank dies after a commit resumes from it when run
//! again, with the same bits as a job that never died (on as many ranks), and with the
//! same bits on every rank (on more or fewer).
//!
//! Run by `scripts/test-mpi.sh` under cargo-nextest, one job at a time (the `mpi-jobs`
//! test group of `.config/nextest.toml`).

use std::path::PathBuf;
use std::time::Duration;

#[path = "support/jobs.rs"]
mod jobs;

/// A commits' folder of the test's own (`KVSTORE_COMMIT_DIR`).
fn folder(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("commits-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    dir
}

/// Runs the job `job` on `np` ranks with its commits in `dir`.
fn run(dir: &std::path::Path, job: &str, np: usize, args: &[&str]) -> jobs::Job {
    let dir = dir.to_string_lossy().into_owned();
    let mut cmd = jobs::mpirun(np, &[("KVSTORE_JOB", job), ("KVSTORE_COMMIT_DIR", &dir)]);
    cmd.arg(env!("CARGO_BIN_EXE_fixture_commit_job")).args(args);
    jobs::run(cmd, Duration::from_secs(120))
}

/// Each rank's `w bits ...` line, in rank order.
fn bits(job: &jobs::Job, np: usize) -> Vec<String> {
    (0..np)
        .map(|r| {
            let prefix = format!("rank {r}: w bits ");
            let line = job.output.lines().find_map(|l| l.find(&prefix).map(|at| l[at + prefix.len()..].to_string()));
            line.unwrap_or_else(|| panic!("rank {r}'s values: {}", job.shown()))
        })
        .collect()
}

#[test]
fn a_job_whose_rank_died_resumes_from_its_last_commit_with_the_same_bits() {
    let dir = folder("resume");
    let whole = run(&dir, "never-died", 2, &["6"]);
    assert_eq!(whole.code, Some(0), "{}", whole.shown());
    let died = run(&dir, "died", 2, &["6", "die", "1", "2"]);
    assert_ne!(died.code, Some(0), "rank 1 died: {}", died.shown());
    let resumed = run(&dir, "died", 2, &["6"]);
    assert_eq!(resumed.code, Some(0), "{}", resumed.shown());
    assert_eq!(resumed.output.matches("restored 2 loader at 2").count(), 2, "every rank: {}", resumed.shown());
    assert_eq!(bits(&resumed, 2), bits(&whole, 2), "the bits of the job that never died");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_resumes_on_more_or_fewer_ranks_with_the_same_bits_on_every_rank() {
    let dir = folder("reshard");
    let died = run(&dir, "job", 2, &["4", "die", "0", "1"]);
    assert_ne!(died.code, Some(0), "rank 0 died: {}", died.shown());
    let more = run(&dir, "job", 3, &["3"]);
    assert_eq!(more.code, Some(0), "{}", more.shown());
    assert_eq!(more.output.matches("restored 1 loader at 1").count(), 3, "{}", more.shown());
    let b = bits(&more, 3);
    assert!(b.iter().all(|x| *x == b[0]), "{b:?}");
    // And on fewer: from the 3-rank job's last commit (step 2).
    let fewer = run(&dir, "job", 1, &["4"]);
    assert_eq!(fewer.code, Some(0), "{}", fewer.shown());
    assert!(fewer.output.contains("restored 2 loader at 2"), "{}", fewer.shown());
    let _ = std::fs::remove_dir_all(&dir);
}
