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

/// Runs the job under `kvstore-run` on `np` ranks with its commits in `dir`.
fn launch(dir: &std::path::Path, np: usize, args: &[&str]) -> jobs::Job {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvstore-run"));
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").env("KVSTORE_COMMIT_DIR", dir);
    cmd.args(["--max-restarts", "2", "--job", "launched", "-x", "KVSTORE_COMMIT_DIR", "--oversubscribe", "--bind-to"]);
    cmd.args(["none", "-np", &np.to_string(), env!("CARGO_BIN_EXE_fixture_commit_job")]).args(args);
    jobs::run(cmd, Duration::from_secs(180))
}

#[test]
fn kvstore_run_restarts_a_job_whose_rank_was_killed_and_it_ends_with_the_same_bits() {
    let dir = folder("launched");
    let whole = run(&dir, "never-killed", 2, &["6"]);
    assert_eq!(whole.code, Some(0), "{}", whole.shown());
    let job = launch(&dir, 2, &["6", "kill", "1", "3"]);
    assert_eq!(job.code, Some(0), "{}", job.shown());
    assert!(job.output.contains("kvstore-run: rank 1 died (signal 9)"), "{}", job.shown());
    assert_eq!(job.output.matches("restored 3 loader at 3").count(), 2, "{}", job.shown());
    assert_eq!(bits(&job, 2), bits(&whole, 2), "the bits of the job never killed");
    // A job that ended well leaves no commits behind.
    let owner = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&dir).expect("the folder").uid()
    };
    assert!(!dir.join(format!("kvstore-{owner}-launched")).exists(), "its commits are removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kvstore_run_does_not_run_again_a_job_that_failed_by_itself() {
    let dir = folder("failed");
    let job = launch(&dir, 2, &["3", "fail"]);
    assert_ne!(job.code, Some(0), "{}", job.shown());
    assert!(job.output.contains("the job failed by itself"), "{}", job.shown());
    assert_eq!(job.output.matches("restored").count(), 0, "not run again: {}", job.shown());
    let _ = std::fs::remove_dir_all(&dir);
}
