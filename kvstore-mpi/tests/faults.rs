//! MPI jobs in which a worker dies, is stuck or stops: each must end within seconds
//! (MPI's fail-stop, or the watchdog's `KVSTORE_TIMEOUT`), never hang, and say what
//! happened. Every test runs `mpirun` over one of the fixture programs
//! (`tests/fixtures/`, this crate's binaries with the `mpi` feature) and checks its
//! exit status, how long it took and what its ranks printed.
//!
//! Run by `scripts/test-mpi.sh` under cargo-nextest, one job at a time (the `mpi-jobs`
//! test group of `.config/nextest.toml`: the jobs oversubscribe the machine's cores).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[path = "support/jobs.rs"]
mod jobs;

use jobs::Job;

/// The exit status of a job that the watchdog ended (`KVSTORE_TIMEOUT`).
const WATCHDOG: i32 = 86;

/// Checks that `job` ended with `code`, within 30 s, having printed `said` and not
/// `not_said`; the failure shows the job's output.
fn ended(job: &Job, code: impl Fn(i32) -> bool, said: &str, not_said: &str) {
    assert!(job.code.is_some_and(code), "the job ended otherwise (None: it hung): {}", job.shown());
    assert!(job.elapsed < Duration::from_secs(30), "the job took too long: {}", job.shown());
    assert!(job.output.contains(said), "the job did not say \"{said}\": {}", job.shown());
    assert!(!job.output.contains(not_said), "the job said \"{not_said}\": {}", job.shown());
}

/// Runs `exe args` on `np` ranks, with `env` set on every rank, for at most 100 s, in
/// a folder of its own (where a rank that ends the job writes its last events).
fn mpirun(np: usize, exe: &str, args: &[&str], env: &[(&str, &str)]) -> Job {
    mpirun_in(&folder(), np, exe, args, env)
}

/// A new empty folder for a job.
fn folder() -> PathBuf {
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    let n = JOBS.fetch_add(1, Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the job");
    dir
}

/// [`mpirun`] in the folder `dir`.
fn mpirun_in(dir: &Path, np: usize, exe: &str, args: &[&str], env: &[(&str, &str)]) -> Job {
    let mut cmd = jobs::mpirun(np, env);
    cmd.arg(exe).args(args).current_dir(dir);
    jobs::run(cmd, Duration::from_secs(100))
}

/// Checks that ranks `ranks` wrote their last events (the flight recorder's) in `dir`,
/// each a trace with the push or init the job made, and named the file.
fn last_events_written(job: &Job, dir: &Path, ranks: &[usize]) {
    for r in ranks {
        let file = dir.join(format!("kvstore-flight-{r}.json"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}; {}", job.shown()));
        assert!(text.contains("\"flight_recorder\":true") && text.contains("\"name\":\"init\""), "{text}");
        let said = format!("rank {r}: ");
        let line = job.output.lines().find(|l| l.contains(&said) && l.contains("this rank's last events: "));
        assert!(
            line.is_some_and(|l| l.contains(&file.display().to_string())),
            "rank {r} names {file:?}: {}",
            job.shown()
        );
    }
}

#[test]
fn a_worker_stuck_before_a_push_ends_the_job_naming_it() {
    let env = [("KVSTORE_STALL_AT", "push"), ("KVSTORE_TIMEOUT", "3")];
    let dir = folder();
    let job = mpirun_in(&dir, 3, env!("CARGO_BIN_EXE_fixture_stall"), &[], &env);
    ended(&job, |c| c == WATCHDOG, "push #2 has waited 3 s for rank 2, which never arrived", "returned although");
    // The waiting ranks' last events (rank 2 is stuck in its own code, not in a call).
    last_events_written(&job, &dir, &[0, 1]);
}

#[test]
fn a_worker_stuck_before_finalize_ends_the_job_naming_it() {
    let env = [("KVSTORE_STALL_AT", "finalize"), ("KVSTORE_TIMEOUT", "3")];
    let job = mpirun(3, env!("CARGO_BIN_EXE_fixture_stall"), &[], &env);
    ended(&job, |c| c == WATCHDOG, "finalize has waited 3 s for rank 2, which never arrived", "returned although");
}

#[test]
fn a_dist_async_rank_that_stopped_ends_the_job_naming_it() {
    let job = mpirun(3, env!("CARGO_BIN_EXE_fixture_async_stall"), &[], &[("KVSTORE_TIMEOUT", "3")]);
    ended(&job, |c| c == WATCHDOG, "waited 3 s for rank 2 to answer a dist_async request", "returned although");
}

/// A rank inside a blocking `dist_sync` call answers no `dist_async` request
/// (documented): the job ends after the timeout, and the messages say why.
#[test]
fn a_dist_async_request_to_a_rank_inside_dist_sync_ends_the_job_saying_why() {
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_async_stall"), &["dist_sync"], &[("KVSTORE_TIMEOUT", "3")]);
    let said = "a rank inside a blocking dist_sync call answers no dist_async request";
    ended(&job, |c| c == WATCHDOG, said, "went on although");
}

/// A `dist_async` rank that finalizes right after its last call goes on answering the
/// pulls of a rank that is still working, until that one finalizes too.
#[test]
fn a_dist_async_rank_that_finished_early_keeps_answering() {
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_async_early_finish"), &[], &[]);
    ended(&job, |c| c == 0, "every one saw its push", "panicked");
}

/// A worker that dies while the other waits in a blocking push: the job ends, failed.
#[test]
fn a_worker_that_died_during_a_blocking_push_ends_the_job() {
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_early_exit"), &[], &[]);
    ended(&job, |c| c != 0, "rank 1: exiting without pushing", "push returned");
}

/// A worker that dies while the other has non-blocking pushes queued: the job ends,
/// failed.
#[test]
fn a_worker_that_died_during_non_blocking_pushes_ends_the_job() {
    let env = [("KVSTORE_EARLY_EXIT_NONBLOCKING", "1")];
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_early_exit"), &[], &env);
    ended(&job, |c| c != 0, "rank 1: exiting without pushing", "push returned");
}
